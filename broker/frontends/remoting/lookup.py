"""Looking messages up over the remoting protocol (what ``mqadmin queryMsgById`` /
``queryMsgByKey`` / ``queryMsgByUniqueKey`` and a 4.x client's ``viewMessage`` and
``queryMessage`` send):

- 33 VIEW_MESSAGE_BY_ID: the message at a 4.x commitlog offset (``offsetMsgId``'s second half,
  ``record.commitlog_offset``) as a record;
- 12 QUERY_MESSAGE: the messages of a topic under a key (``KEYS``) stored between two times, or,
  with ``_UNIQUE_KEY_QUERY`` true, under a message id (``UNIQ_KEY``: the id a 4.x client's
  ``SendResult.msgId`` names), newest first, as records one after another; none is
  QUERY_NOT_FOUND, as RocketMQ's broker answers; at most ``QUERY_MAX`` messages and about
  ``PULL_BYTES_MAX`` bytes of them (at least one).

Both read what this node has applied (any replica answers: the key index is every node's own).
"""

from __future__ import annotations

from typing import Any

from broker.frontends.remoting.consume import PULL_BYTES_MAX, our_id, record_of
from broker.frontends.remoting.fields import integer, text
from broker.frontends.remoting.host import ClientConnection, Handler, RemotingHost
from protocol.broker_kinds import INT_MAX, QUERY_BY_KEY, QUERY_BY_UNIQUE_KEY, VIEW_MESSAGE
from protocol.remoting import codes
from protocol.remoting.command import Command

__all__ = ["HANDLERS", "found_record"]

UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG
UNIQUE_QUERY_MAX = 32  # a unique-key query's answer (RocketMQ's defaultQueryMaxNum)
QUERY_MAX = 64  # any query's answer, whatever maxNum asks


def found_record(store_host: tuple[str, int], found: list[Any]) -> bytes:
    """A found message (``broker_kinds``' VIEW_MESSAGE answer) as RocketMQ's record."""
    oid, _, topic, qid, queue_offset, body, tags, keys, unique, props, born, stored = found[:12]
    row = [queue_offset, body, tags, keys, unique, props, born, stored, oid]
    return record_of(store_host, topic, qid, row)


async def view_message(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    found = await server.call(VIEW_MESSAGE, our_id(server, integer(cmd.ext, "offset")))
    return cmd.response(codes.SUCCESS, body=found_record(server.store_host, found))


async def query_message(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    ext = cmd.ext
    topic = text(ext, "topic", max_len=255)
    key = text(ext, "key", max_len=255)
    if ext.get(UNIQUE_KEY_QUERY) == "true":
        found = await server.call(QUERY_BY_UNIQUE_KEY, key, topic, UNIQUE_QUERY_MAX)
    else:
        limit = integer(ext, "maxNum", lo=1, hi=2**31 - 1)
        begin_ms = integer(ext, "beginTimestamp", 0, lo=0)
        end_ms = integer(ext, "endTimestamp", INT_MAX, lo=0)
        found = await server.call(QUERY_BY_KEY, topic, key, begin_ms, end_ms,
                                  min(limit, QUERY_MAX))
    if not found:
        return cmd.response(codes.QUERY_NOT_FOUND, f"no message of {topic} under {key!r} "
                            "(or not in the time range)")
    records: list[bytes] = []
    size = 0
    for m in found:  # (at least one, however large)
        if records and size + len(m[5]) > PULL_BYTES_MAX:
            break
        records.append(found_record(server.store_host, m))
        size += len(records[-1])
    newest = max(m[11] for m in found)
    return cmd.response(codes.SUCCESS, body=b"".join(records),
                        ext={"indexLastUpdateTimestamp": str(newest),
                             "indexLastUpdatePhyoffset": "0"})


HANDLERS: dict[int, Handler] = {codes.VIEW_MESSAGE_BY_ID: view_message,
                                codes.QUERY_MESSAGE: query_message}
