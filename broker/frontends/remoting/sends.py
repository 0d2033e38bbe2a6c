"""The remoting endpoint's sends: SEND_MESSAGE (10, named header fields), SEND_MESSAGE_V2 (310,
the same fields named ``a``..``m``) and SEND_BATCH_MESSAGE (320: a V2 header, the messages
encoded in the body, ``protocol.remoting.record.decode_batch``; also a 10 or 310 whose ``batch``
field is true or 1, as the C++ client sends its batches).

A message becomes a send row of the broker's (``protocol.broker_kinds``: body, tags, keys, unique
key, properties, born time) from its property string: ``TAGS``, ``KEYS`` and ``UNIQ_KEY`` are
fields there, every other property is kept (``DELAY`` delays it, as the send path reads it). A
body the client compressed (sys flag bit 0) is stored inflated, so every client reads it the
same; one that inflates past the broker's maximum is refused. One message goes to the API with
the concurrent sends of other calls (``SendGather``); a batch as one run (all or nothing). The
answer carries the first message's ``offsetMsgId`` (``record.offset_msg_id_4x``: this node's
address and the message's place), its queue and queue offset; a batch's ids comma-separated.
A retried send carries the same ``UNIQ_KEY`` and content and is stored once (the state machine's
dedup, under ``dedup_key``: a 4.x client's id and a digest of the content). A send flagged
PREPARED is a transaction's half message (``broker.frontends.remoting.txn``). A send that creates
its topic gives it the producer's ``defaultTopicQueueNums`` queues (1..1024, else refused by
name), at most the broker's ``--default-queues``; without the field, the broker's default.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import zlib
from typing import Any

from broker.frontends.remoting import txn
from broker.frontends.remoting.fields import RemotingRefusal, code_of, integer, text
from broker.frontends.remoting.host import ClientConnection, Handler, RemotingHost
from protocol.broker_kinds import SEND, SendRefusedError, parse_offset_msg_id
from protocol.remoting import codes
from protocol.remoting.command import Command
from protocol.remoting.record import (
    SYSFLAG_COMPRESSED,
    UNIQ_KEY,
    RecordError,
    decode_batch,
    join_properties,
    offset_msg_id_4x,
    split_properties,
)
from protocol.topics import MAX_QUEUES

__all__ = ["HANDLERS", "V2_NAMES"]

SEND_OK = "SEND_OK"
# SEND_MESSAGE_V2's one-letter names for SEND_MESSAGE's header fields
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic",
            "d": "defaultTopicQueueNums", "e": "queueId", "f": "sysFlag", "g": "bornTimestamp",
            "h": "flag", "i": "properties", "j": "reconsumeTimes", "k": "unitMode",
            "l": "maxReconsumeTimes", "m": "batch"}
QUEUE_ID_MAX = 65_535
DIGEST_BYTES = 8  # of a message's content in its dedup key (``dedup_key``)
log = logging.getLogger("broker.remoting")
ACK_EARLY = "remoting_ack_early"  # broker.config.REMOTING_CANARIES
ACK_EARLY_S = 1.0  # how long after its acknowledgement the canary stores a send
_EARLY: set[asyncio.Future[None]] = set()  # the canary's sends under way


def _header(cmd: Command) -> dict[str, str]:
    if cmd.code == codes.SEND_MESSAGE:
        return cmd.ext
    return {V2_NAMES.get(k, k): v for k, v in cmd.ext.items()}


def _row(body: bytes, props: str, born_ms: int, sys_flag: int, max_bytes: int) -> list[Any]:
    if sys_flag & SYSFLAG_COMPRESSED:
        inflater = zlib.decompressobj()
        try:
            body = inflater.decompress(body, max_bytes + 1)
        except zlib.error as err:
            raise RemotingRefusal(codes.MESSAGE_ILLEGAL,
                                  f"the body is flagged compressed but does not inflate: {err}") from None
        if not inflater.eof and len(body) <= max_bytes:
            raise RemotingRefusal(codes.MESSAGE_ILLEGAL, "the compressed body is cut short")
        if len(body) > max_bytes or inflater.unconsumed_tail:
            raise RemotingRefusal(codes.MESSAGE_ILLEGAL,
                                  f"the body inflates past the broker's maximum of {max_bytes} bytes")
    tags, keys, unique, rest = split_properties(props)
    if unique:
        rest.append([UNIQ_KEY, unique])
        unique = dedup_key(unique, body, tags, keys, rest)
    return [body, tags, keys, unique, rest, born_ms]


def dedup_key(unique: str, body: bytes, tags: str, keys: list[str],
              props: list[list[str]]) -> str:
    """The unique key a 4.x client's message is stored (and deduplicated) under: its
    ``UNIQ_KEY`` and a 64-bit BLAKE2b digest of its content (body, tags, keys, properties), so
    a retry (the same message again) is stored once while another message under the same id is
    not taken for one: the C++ client gives processes started in the same second the same ids.
    The ``UNIQ_KEY`` property keeps the id consumers see (``broker_kinds.message_id``). (A leader
    scopes every key by the content again, ``sendwire.scoped_key``; this one is kept for a
    leader of an older version, which does not, and as a half message's transaction id.)"""
    digest = hashlib.blake2b(body, digest_size=DIGEST_BYTES)
    digest.update(join_properties(tags, keys, "", props).encode("utf-8", "surrogatepass"))
    return f"{unique}{txn.DIGEST_MARK}{digest.hexdigest()}"


def _answer(server: RemotingHost, cmd: Command, answer: list[Any]) -> Command:
    if answer[0] != SEND_OK:
        return cmd.response(code_of(SendRefusedError(str(answer[0]), str(answer[1]))),
                            f"{answer[0]}: {answer[1]}")
    offsets, ids = answer[2], answer[3]
    queue_id = answer[5][0] if len(answer) > 5 and answer[5] else answer[1]  # (a duplicate's:
    # the original's queue, where its offset is)
    msg_ids = []
    for oid in ids:
        _, position, slot = parse_offset_msg_id(oid)
        msg_ids.append(offset_msg_id_4x(server.store_host, position, slot))
    return cmd.response(codes.SUCCESS, ext={
        "msgId": ",".join(msg_ids), "queueId": str(queue_id),
        "queueOffset": str(offsets[0] if offsets else 0), "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "false"})


async def send_message(server: RemotingHost, conn: ClientConnection,
                       cmd: Command) -> Command:
    head = _header(cmd)
    topic = text(head, "topic", max_len=255)
    queue_id = integer(head, "queueId", lo=0, hi=QUEUE_ID_MAX)
    # the queue count a topic this send creates gets (the 4.x producer's, 4 unless set; capped
    # at the broker's default by the send path, as RocketMQ caps it at its default topic's)
    asked = integer(head, "defaultTopicQueueNums", 0, lo=1, hi=MAX_QUEUES) or None
    sys_flag = integer(head, "sysFlag", 0, lo=0, hi=2**31 - 1)
    born_ms = integer(head, "bornTimestamp", int(time.time() * 1000))
    props = text(head, "properties", "", max_len=32767)
    max_bytes = server.broker.config.max_message_bytes
    if cmd.code == codes.SEND_BATCH_MESSAGE or head.get("batch", "").lower() in ("true", "1"):
        # (the C++ client 1.x sends a batch as SEND_MESSAGE with batch "1")
        try:
            batch = decode_batch(cmd.body)
        except RecordError as err:
            raise RemotingRefusal(codes.MESSAGE_ILLEGAL, str(err)) from None
        if not batch:
            raise RemotingRefusal(codes.MESSAGE_ILLEGAL, "a batch of no messages")
        rows = [_row(m.body, m.properties, born_ms, 0, max_bytes) for m in batch]
        answer = await server.call(SEND, topic, queue_id, rows, *([asked] if asked else []))
        return _answer(server, cmd, answer)
    row = _row(cmd.body, props, born_ms, sys_flag, max_bytes)
    if sys_flag & txn.PREPARED:
        answer = await txn.half(server, topic, queue_id, head.get("producerGroup", ""), row)
        response = _answer(server, cmd, answer)
        if response.code == codes.SUCCESS:
            response.ext["transactionId"] = row[3]
        return response
    if ACK_EARLY in server.broker.config.canaries:  # a seeded bug (tests only): acknowledged
        late = asyncio.ensure_future(_store_late(server, topic, queue_id, row, asked))  # at once,
        _EARLY.add(late)  # stored a second later, whatever becomes of it meanwhile
        late.add_done_callback(_EARLY.discard)
        return cmd.response(codes.SUCCESS, ext={"msgId": "0" * 32, "queueId": str(queue_id),
                                                "queueOffset": "0"})
    return _answer(server, cmd, await server.gathered_send(topic, queue_id, row, asked))


async def _store_late(server: RemotingHost, topic: str, queue_id: int, row: list[Any],
                      asked: int | None) -> None:
    await asyncio.sleep(ACK_EARLY_S)
    try:
        await server.gathered_send(topic, queue_id, row, asked)
    except Exception as err:  # the canary's send: whatever happens is what it is there for
        log.info("remoting_ack_early: a send acknowledged before it was stored failed: %s", err)


HANDLERS: dict[int, Handler] = {codes.SEND_MESSAGE: send_message,
                                codes.SEND_MESSAGE_V2: send_message,
                                codes.SEND_BATCH_MESSAGE: send_message}
