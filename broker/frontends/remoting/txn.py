"""Transactional messages over the remoting protocol (a 4.x ``TransactionMQProducer``):

- a send whose sys flag says PREPARED (properties ``TRAN_MSG``, ``PGROUP``) is a half message:
  TXN_HALF of the producer group, the transaction id being the message's dedup key (its
  ``UNIQ_KEY`` and a digest of its content, ``sends.dedup_key``: a 4.x transaction is one
  message; a retried half send is stored once); the answer carries it as ``transactionId`` and
  the half queue's offset as ``queueOffset``;
- 37 END_TRANSACTION (``commitOrRollback`` 8 commit, 12 rollback, 0 not known yet: nothing to
  do) is END_TRANSACTION of the broker's, on the leader (forwarded from a follower);
- the leader's check-back asks a producer of the group that heartbeat on a remoting connection
  with 39 CHECK_TRANSACTION_STATE (oneway, as RocketMQ's broker sends it): the first half message
  as a record in the body, its ids in the header; the producer answers with an END_TRANSACTION
  ``fromTransactionCheck``.
"""

from __future__ import annotations

from typing import Any

from broker.api.api import NODE_ITSELF, acting_as
from broker.frontends.remoting.consume import our_id
from broker.frontends.remoting.fields import RemotingRefusal, boolean, integer, text
from broker.frontends.remoting.host import ClientConnection, Handler, RemotingHost
from protocol.broker_errors import MessageNotFoundError
from protocol.broker_kinds import (
    END_TRANSACTION,
    TXN_HALF,
    VIEW_MESSAGE,
    message_id,
    parse_offset_msg_id,
    unscoped,
)
from protocol.remoting import codes
from protocol.remoting.command import Command
from protocol.remoting.record import commitlog_offset, offset_msg_id_4x
from protocol.topics import HALF_TOPIC

__all__ = ["HANDLERS", "PREPARED", "check_request", "half"]

PREPARED = 4  # MessageSysFlag.TRANSACTION_PREPARED_TYPE
COMMIT_TYPE, ROLLBACK_TYPE, NOT_TYPE = 8, 12, 0
TRAN_MSG, PGROUP = "TRAN_MSG", "PGROUP"
DIGEST_MARK = "#"  # between a 4.x message's UNIQ_KEY and its content digest (``sends.dedup_key``)


async def half(server: RemotingHost, topic: str, queue_id: int, producer_group: str,
               row: list[Any]) -> list[Any]:
    """A half message stored: TXN_HALF's answer (SEND's, offsets in the half queue)."""
    unique = row[3]
    if not unique:
        raise RemotingRefusal(codes.MESSAGE_ILLEGAL, "a transactional message without UNIQ_KEY "
                              "(its transaction id)")
    props = [p for p in row[4] if p[0] not in (TRAN_MSG, PGROUP)]
    group = producer_group or next((v for k, v in row[4] if k == PGROUP), "")
    if not group:
        raise RemotingRefusal(codes.INVALID_PARAMETER, "a transactional message without its "
                              "producer group (producerGroup or PGROUP)")
    answer: list[Any] = await server.call(TXN_HALF, group, unique, topic, queue_id,
                                          [[*row[:4], props, *row[5:]]])
    return answer


async def end_transaction(server: RemotingHost, conn: ClientConnection,
                          cmd: Command) -> Command:
    ext = cmd.ext
    group = text(ext, "producerGroup")
    txn_id = ext.get("transactionId") or text(ext, "msgId")
    kind = integer(ext, "commitOrRollback", lo=0, hi=2**31 - 1)
    if kind == NOT_TYPE:
        return cmd.response(codes.SUCCESS, "not decided yet: the check-back will ask again")
    if kind not in (COMMIT_TYPE, ROLLBACK_TYPE):
        raise RemotingRefusal(codes.INVALID_PARAMETER,
                              f"commitOrRollback must be 0, 8 or 12, not {kind}")
    if DIGEST_MARK not in txn_id and "commitLogOffset" in ext:
        txn_id = await _stored_txn_id(server, txn_id, integer(ext, "commitLogOffset", lo=0))
    await server.call(END_TRANSACTION, group, txn_id,
                      "COMMIT" if kind == COMMIT_TYPE else "ROLLBACK",
                      boolean(ext, "fromTransactionCheck"), [])
    return cmd.response(codes.SUCCESS)


async def _stored_txn_id(server: RemotingHost, msg_id: str, at: int) -> str:
    """The transaction id of the half message at 4.x commitlog offset ``at`` whose id is
    ``msg_id``: a client that ends a transaction under its message id alone (the C++ client
    sends no ``transactionId``) names the half message by where it was stored, as RocketMQ's
    broker finds it; ``msg_id`` unchanged when that is not the half message of that id."""
    with acting_as(NODE_ITSELF):  # (finding the half message; the END is judged as the client)
        try:
            found = await server.call(VIEW_MESSAGE, our_id(server, at))
        except MessageNotFoundError:  # (our_id's position is any number a client sent)
            return msg_id
    unique = unscoped(str(found[8]))  # (the transaction id: the stored key less the leader's
    if found[2] == HALF_TOPIC and unique.split(DIGEST_MARK, 1)[0] == msg_id:  # scope)
        return unique
    return msg_id


def check_request(store_host: tuple[str, int], txn_id: str, row: list[Any]) -> Command:
    """CHECK_TRANSACTION_STATE about ``txn_id``, its first half message ``row`` (a pull row:
    offset in the half queue, ..., offset msg id); the record goes in the body by the caller."""
    _, position, slot = parse_offset_msg_id(row[8])
    return Command(codes.CHECK_TRANSACTION_STATE, flag=codes.FLAG_ONEWAY, ext={
        "msgId": message_id(row[4], row[5]) or txn_id, "transactionId": txn_id,
        "offsetMsgId": offset_msg_id_4x(store_host, position, slot),
        "commitLogOffset": str(commitlog_offset(position, slot)),
        "tranStateTableOffset": str(row[0])})


HANDLERS: dict[int, Handler] = {codes.END_TRANSACTION: end_transaction}
