"""The remoting endpoint's consuming requests, each made of requests of the broker's kinds:

- 11 PULL_MESSAGE: PULL (TAG subscriptions: ``*`` or ``a || b``) or PULL_SQL (``expressionType``
  SQL92), the subscription the pull carries or else (a Java consumer's pulls carry none by
  default) the one its group's heartbeat gave on this connection, long-polling up to the
  client's ``suspendTimeoutMillis`` (at most MAX_SUSPEND_MS) when
  its sys flag asks. Found messages answer SUCCESS with RocketMQ's records in the body
  (``protocol.remoting.record``) and ``nextBeginOffset`` / ``minOffset`` / ``maxOffset``; an
  empty poll PULL_NOT_FOUND; an offset before the queue's first message PULL_OFFSET_MOVED to it,
  one past its end PULL_OFFSET_MOVED to the end on a caught-up leader, else (a node still
  applying) PULL_RETRY_IMMEDIATELY at the same offset.
- 14 QUERY_CONSUMER_OFFSET: the group's committed offset; for a group with none, 0 while the
  queue still holds its first message (RocketMQ's broker answers so: a new consumer reads the
  backlog, whatever its CONSUME_FROM_* says), else QUERY_NOT_FOUND (the client then starts
  where its CONSUME_FROM_* says). 15 UPDATE_CONSUMER_OFFSET: OFFSET_COMMIT (on the leader).
- 29 SEARCH_OFFSET_BY_TIMESTAMP, 30/31 GET_MAX/MIN_OFFSET, 32 GET_EARLIEST_MSG_STORETIME.
- 34 HEART_BEAT (producers: PRODUCER_HEARTBEAT with the connection, where the check-back asks;
  consumers: HEARTBEAT for each group, on this node, with RocketMQ's channel
  lifetime; the leader creates a clustering group's ``%RETRY%`` topic, as RocketMQ's broker
  does), 35 UNREGISTER_CLIENT, 38 GET_CONSUMER_LIST_BY_GROUP. A consumer that joins or leaves
  a group here has the group's other consumers on this node told at once (40
  NOTIFY_CONSUMER_IDS_CHANGED, oneway): they rebalance without waiting for their 20 s timer.
  The joining one is not told (RocketMQ's broker tells it too): it rebalances when it has
  heartbeated every node. Unless it asked this node for the group's members before it joined
  (a node restarted, a partition healed: it may have rebalanced on a list without itself and
  dropped its queues): then it is told too.
- 36 CONSUMER_SEND_MSG_BACK: the message named by its commitlog offset (VIEW_MESSAGE) is
  SEND_BACK to ``%RETRY%group`` or ``%DLQ%group`` (``broker.features.retry``).
- 41/42 LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (orderly consumers' queue locks, on the leader).
- 46 CHECK_CLIENT_CONFIG: accepted.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from broker.api.api import NODE_ITSELF, acting_as
from broker.features.retry.model import reconsume_times
from broker.frontends.remoting.fields import RemotingRefusal, integer, text
from broker.frontends.remoting.host import ClientConnection, Handler, RemotingHost
from protocol.broker_errors import BrokerError
from protocol.broker_kinds import (
    FOUND,
    HEARTBEAT,
    LOCK_BATCH,
    MAX_SUSPEND_MS,
    NO_NEW_MSG,
    OFFSET_COMMIT,
    OFFSET_QUERY,
    PRODUCER_HEARTBEAT,
    PULL,
    PULL_SQL,
    SEARCH_OFFSET,
    SEND_BACK,
    UNLOCK_BATCH,
    VIEW_MESSAGE,
    message_id,
    offset_msg_id,
    parse_offset_msg_id,
)
from protocol.errors import DLedgerError
from protocol.remoting import codes
from protocol.remoting.command import Command
from protocol.remoting.record import (
    SLOT_BITS,
    UNIQ_KEY,
    StoredRecord,
    commitlog_offset,
    encode_record,
    join_properties,
)

__all__ = ["CLIENT_TTL_MS", "HANDLERS", "PULL_BYTES_MAX", "our_id", "record_of"]

log = logging.getLogger("broker.remoting")

CLIENT_INNER_PRODUCER = "CLIENT_INNER_PRODUCER"  # every 4.x client's own, for send-back
CLIENT_TTL_MS = 120_000  # a client unheard of this long leaves its groups (RocketMQ's channel expiry)
PULL_BYTES_MAX = 8 << 20  # one pull's messages (at least one, however large)
PULL_MESSAGES_MAX = 1024
FLAG_SUSPEND = 2  # PullSysFlag: long-poll
FLAG_SUBSCRIPTION = 4  # PullSysFlag: the pull carries its subscription
DEFAULT_MAX_RECONSUME_TIMES = 16
BODY_JSON_MAX = 1 << 20
BODY_ENTRIES_MAX = 256  # producers, consumers, subscriptions or queues in one body
CONSUMERS_PER_CONNECTION_MAX = 1024  # (client id, group) pairs heard on one connection


def _ok(cmd: Command, **ext: object) -> Command:
    return cmd.response(codes.SUCCESS, ext={k: str(v) for k, v in ext.items()})


def _json_body(cmd: Command) -> Any:
    if len(cmd.body) > BODY_JSON_MAX:
        raise RemotingRefusal(codes.INVALID_PARAMETER, f"a body over {BODY_JSON_MAX} bytes")
    try:
        data = json.loads(cmd.body or b"{}")
        json.dumps(data, ensure_ascii=False).encode()  # (a lone surrogate is no UTF-8)
    except (ValueError, RecursionError) as err:  # (UnicodeEncodeError is a ValueError)
        raise RemotingRefusal(codes.INVALID_PARAMETER, f"the body is not JSON: {err}") from None
    return data


def _entries(obj: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """A list of objects in a JSON body (RemotingRefusal if it is not one, or too long)."""
    value = obj.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise RemotingRefusal(codes.INVALID_PARAMETER, f"{name} must be a list of objects")
    if len(value) > BODY_ENTRIES_MAX:
        raise RemotingRefusal(codes.INVALID_PARAMETER,
                              f"{name} has more than {BODY_ENTRIES_MAX} entries")
    return value


def _queue(cmd: Command) -> tuple[str, int]:
    return text(cmd.ext, "topic", max_len=255), integer(cmd.ext, "queueId", hi=65_535)


async def _bounds(server: RemotingHost, topic: str, qid: int) -> tuple[int, int]:
    """(min, max) offset of a queue as this node has it."""
    answer = await server.call(PULL, topic, qid, 0, 0, 0, 0, ["*"])
    return int(answer[2]), int(answer[3])


def _tags(expression: str) -> list[str]:
    tags = [t.strip() for t in expression.split("||") if t.strip()]
    return ["*"] if not tags or "*" in tags else tags


def record_of(store_host: tuple[str, int], topic: str, qid: int, row: list[Any]) -> bytes:
    """RocketMQ's record of a pull row (``protocol.broker_kinds``' PULL answer) of a queue."""
    offset, body, tags, keys, unique, props, born_ms, store_ms, oid = row[:9]
    _, position, slot = parse_offset_msg_id(oid)
    reconsume = reconsume_times(props)  # (a malformed value reads as 0)
    return encode_record(StoredRecord(
        topic, qid, offset, commitlog_offset(position, slot), body,
        join_properties(tags, keys, message_id(unique, props),
                        [p for p in props if p[0] != UNIQ_KEY]), born_ms, store_ms, store_host,
        reconsume_times=reconsume))


def _record(server: RemotingHost, topic: str, qid: int, row: list[Any]) -> bytes:
    return record_of(server.store_host, topic, qid, row)


async def pull_message(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    ext = cmd.ext
    topic, qid = _queue(cmd)
    start = integer(ext, "queueOffset")
    count = min(integer(ext, "maxMsgNums", 32), PULL_MESSAGES_MAX)
    sys_flag = integer(ext, "sysFlag", 0, hi=2**31 - 1)
    suspend_ms = min(integer(ext, "suspendTimeoutMillis", 0), MAX_SUSPEND_MS) \
        if sys_flag & FLAG_SUSPEND else 0
    if sys_flag & FLAG_SUBSCRIPTION or "subscription" in ext:
        expression = text(ext, "subscription", "*", max_len=65_536)
        kind = ext.get("expressionType", "TAG")
    else:  # RocketMQ's Java consumer sends none by default: its heartbeat's subscription
        found = conn.subscriptions.get((text(ext, "consumerGroup"), topic))
        if found is None:
            return cmd.response(codes.SUBSCRIPTION_NOT_EXIST, f"no subscription to {topic} in "
                                "the pull or a heartbeat of its group on this connection")
        expression, kind = found
    if kind.upper() == "SQL92":
        answer = await server.call(PULL_SQL, topic, qid, start, count, PULL_BYTES_MAX,
                                   suspend_ms, expression)
    else:
        answer = await server.call(PULL, topic, qid, start, count, PULL_BYTES_MAX, suspend_ms,
                                   _tags(expression))
    status, nxt, lo, hi, rows = answer
    if status == FOUND and rows:
        body = b"".join(_record(server, topic, qid, r) for r in rows)
        return cmd.response(codes.SUCCESS, ext=_pull_ext(nxt, lo, hi), body=body)
    if status == FOUND:
        code = codes.PULL_RETRY_IMMEDIATELY  # every message there was filtered out
    elif status == NO_NEW_MSG:
        code = codes.PULL_NOT_FOUND
    elif start < lo:  # retention took it: on from the first message kept
        code, nxt = codes.PULL_OFFSET_MOVED, lo
    elif server.broker.node.is_leader and server.broker.caught_up():
        code, nxt = codes.PULL_OFFSET_MOVED, hi  # past the end on the group's own data
    else:  # past what this node has applied yet: ask again (RocketMQ's slave answers so)
        code, nxt = codes.PULL_RETRY_IMMEDIATELY, start
    return cmd.response(code, str(status), ext=_pull_ext(nxt, lo, hi))


def _pull_ext(nxt: int, lo: int, hi: int) -> dict[str, str]:
    return {"suggestWhichBrokerId": "0", "nextBeginOffset": str(nxt), "minOffset": str(lo),
            "maxOffset": str(hi)}


async def query_consumer_offset(server: RemotingHost, conn: ClientConnection,
                                cmd: Command) -> Command:
    group = text(cmd.ext, "consumerGroup")
    topic, qid = _queue(cmd)
    committed = await server.call(OFFSET_QUERY, group, topic, qid)
    if committed >= 0:
        return _ok(cmd, offset=committed)
    lo, _ = await _bounds(server, topic, qid)
    if lo == 0:
        return _ok(cmd, offset=0)
    return cmd.response(codes.QUERY_NOT_FOUND, f"group {group} has no offset in {topic}:{qid}")


async def update_consumer_offset(server: RemotingHost, conn: ClientConnection,
                                 cmd: Command) -> Command:
    group = text(cmd.ext, "consumerGroup")
    topic, qid = _queue(cmd)
    committed = integer(cmd.ext, "commitOffset", lo=-1)
    if committed >= 0:  # (-1: a queue the client holds no offset for yet; ali-ons sends it)
        await server.call(OFFSET_COMMIT, group, topic, qid, committed)
    return _ok(cmd)


async def search_offset(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    topic, qid = _queue(cmd)
    found = await server.call(SEARCH_OFFSET, topic, qid, integer(cmd.ext, "timestamp"))
    return _ok(cmd, offset=found)


async def max_offset(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    return _ok(cmd, offset=(await _bounds(server, *_queue(cmd)))[1])


async def min_offset(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    return _ok(cmd, offset=(await _bounds(server, *_queue(cmd)))[0])


async def earliest_store_time(server: RemotingHost, conn: ClientConnection,
                              cmd: Command) -> Command:
    topic, qid = _queue(cmd)
    lo, _ = await _bounds(server, topic, qid)
    status, _, _, _, rows = await server.call(PULL, topic, qid, lo, 1, PULL_BYTES_MAX, 0, ["*"])
    if status != FOUND or not rows:
        return cmd.response(codes.SYSTEM_ERROR, f"{topic}:{qid} holds no message")
    return _ok(cmd, timestamp=rows[0][7])


async def heart_beat(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    data = _json_body(cmd)
    if not isinstance(data, dict):
        raise RemotingRefusal(codes.INVALID_PARAMETER, "a heartbeat's body is a JSON object")
    client_id = str(data.get("clientID", ""))[:255]
    producers = _entries(data, "producerDataSet")
    consumers = _entries(data, "consumerDataSet")
    for producer in producers:
        group = str(producer.get("groupName", ""))[:255]
        if client_id and group and group != CLIENT_INNER_PRODUCER:
            await server.call(PRODUCER_HEARTBEAT, client_id, group, CLIENT_TTL_MS,
                              connection=conn)  # (where the check-back asks it)
    for consumer in consumers:
        if not client_id:
            break
        if (client_id, str(consumer.get("groupName", ""))[:255]) not in conn.consumers \
                and len(conn.consumers) >= CONSUMERS_PER_CONNECTION_MAX:
            raise RemotingRefusal(codes.INVALID_PARAMETER, f"more than "
                                  f"{CONSUMERS_PER_CONNECTION_MAX} consumers on one connection")
        group = str(consumer.get("groupName", ""))[:255]
        model = str(consumer.get("messageModel", "CLUSTERING")).upper()
        entries = _entries(consumer, "subscriptionDataSet")
        subs = {str(s.get("topic", ""))[:255]: str(s.get("subString", "*"))[:4096]
                for s in entries}
        clustering = model not in ("BROADCASTING", "0")
        await server.call(HEARTBEAT, client_id, group,
                          "clustering" if clustering else "broadcasting", subs, CLIENT_TTL_MS,
                          connection=conn)  # (where an operator's 307 / 309 asks it)
        for key in [k for k in conn.subscriptions if k[0] == group]:
            del conn.subscriptions[key]  # (what the newest heartbeat says, only)
        for s in entries:  # for the pulls that carry none (a Java client's, by default)
            conn.subscriptions[(group, str(s.get("topic", ""))[:255])] = (
                str(s.get("subString", "*"))[:4096], str(s.get("expressionType", "TAG")))
        if (client_id, group) not in conn.consumers:
            conn.consumers.add((client_id, group))
            # the joiner itself is told only if it asked for the members before: it may have
            # rebalanced on a list without itself (at its start it asks after its heartbeats)
            asked = group in conn.listed_unjoined
            conn.listed_unjoined.discard(group)
            server.consumers_changed(group, joined=None if asked else conn)
        if clustering and server.broker.node.is_leader:
            try:  # (the consumer heartbeats the leader too; a follower leaves it to it)
                await server.broker.retries.ensure_retry_topic(group)
            except (BrokerError, DLedgerError) as err:  # leadership lost meanwhile: next beat
                log.info("the retry topic of %s is not created yet: %s", group, err)
    return _ok(cmd)


async def unregister_client(server: RemotingHost, conn: ClientConnection,
                            cmd: Command) -> Command:
    client_id = text(cmd.ext, "clientID")
    group = cmd.ext.get("consumerGroup", "")
    if group:
        await server.call(HEARTBEAT, client_id, group, "clustering", {}, 0, connection=conn)
        conn.consumers.discard((client_id, group))
        server.consumers_changed(group)
    return _ok(cmd)


async def consumer_list(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    group = text(cmd.ext, "consumerGroup")
    if len(conn.listed_unjoined) < CONSUMERS_PER_CONNECTION_MAX \
            and not any(g == group for _, g in conn.consumers):
        conn.listed_unjoined.add(group)  # it may rebalance on a list without itself
    members = server.broker.members.live(group, time.monotonic())
    if not members:
        return cmd.response(codes.SYSTEM_ERROR, f"no consumer of group {group} on this broker")
    return cmd.response(codes.SUCCESS, body=json.dumps({"consumerIdList": members}).encode())


def our_id(server: RemotingHost, at: int) -> str:
    """Our message id of the message at a 4.x commitlog offset (``record.commitlog_offset``)."""
    return offset_msg_id(server.broker.group, at >> SLOT_BITS, at & ((1 << SLOT_BITS) - 1))


async def send_back(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    ext = cmd.ext
    group = text(ext, "group")
    at = integer(ext, "offset")
    level = integer(ext, "delayLevel", 0, lo=-1, hi=1024)
    max_times = integer(ext, "maxReconsumeTimes", -1, lo=-1, hi=10_000)
    with acting_as(NODE_ITSELF):  # (finding the message: SEND_BACK is judged as the client)
        found = await server.call(VIEW_MESSAGE, our_id(server, at))
    _, _, topic, qid, queue_offset = found[:5]
    await server.call(SEND_BACK, group, topic, qid, queue_offset, level,
                      DEFAULT_MAX_RECONSUME_TIMES if max_times < 0 else max_times)
    return _ok(cmd)


def _lock_body(cmd: Command) -> tuple[str, str, list[list[Any]]]:
    data = _json_body(cmd)
    if not isinstance(data, dict):
        raise RemotingRefusal(codes.INVALID_PARAMETER, "a lock request's body is a JSON object")
    queues = []
    for q in _entries(data, "mqSet"):
        qid = q.get("queueId", 0)
        if not isinstance(qid, int) or isinstance(qid, bool):
            raise RemotingRefusal(codes.INVALID_PARAMETER, "mqSet: queueId must be an integer")
        queues.append([str(q.get("topic", ""))[:255], qid])
    return str(data.get("consumerGroup", "")), str(data.get("clientId", "")), queues


async def lock_batch(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    group, client_id, queues = _lock_body(cmd)
    granted = await server.call(LOCK_BATCH, group, client_id, queues)
    body = {"lockOKMQSet": [{"topic": t, "queueId": q, "brokerName": server.broker.group}
                            for t, q in granted]}
    return cmd.response(codes.SUCCESS, body=json.dumps(body).encode())


async def unlock_batch(server: RemotingHost, conn: ClientConnection, cmd: Command) -> Command:
    group, client_id, queues = _lock_body(cmd)
    await server.call(UNLOCK_BATCH, group, client_id, queues)
    return _ok(cmd)


async def check_client_config(server: RemotingHost, conn: ClientConnection,
                              cmd: Command) -> Command:
    return _ok(cmd)


HANDLERS: dict[int, Handler] = {
    codes.PULL_MESSAGE: pull_message,
    codes.QUERY_CONSUMER_OFFSET: query_consumer_offset,
    codes.UPDATE_CONSUMER_OFFSET: update_consumer_offset,
    codes.SEARCH_OFFSET_BY_TIMESTAMP: search_offset,
    codes.GET_MAX_OFFSET: max_offset,
    codes.GET_MIN_OFFSET: min_offset,
    codes.GET_EARLIEST_MSG_STORETIME: earliest_store_time,
    codes.HEART_BEAT: heart_beat,
    codes.UNREGISTER_CLIENT: unregister_client,
    codes.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
    codes.CONSUMER_SEND_MSG_BACK: send_back,
    codes.LOCK_BATCH_MQ: lock_batch,
    codes.UNLOCK_BATCH_MQ: unlock_batch,
    codes.CHECK_CLIENT_CONFIG: check_client_config,
}
