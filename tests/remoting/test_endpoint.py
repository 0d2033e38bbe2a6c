"""The remoting endpoints seen from the wire, with a bare remoting connection
(``tests.remoting.raw``): the NameServer's route answers on its one port, a broker node's codes,
a follower forwarding a send, and bad input answered by name or with a closed connection, never
a crash or a stored half message."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from client.cluster.routes import Routes
from protocol import broker_kinds as bp
from protocol.frames import encode_frame
from protocol.remoting import codes
from protocol.remoting.command import Command, encode
from protocol.remoting.record import (
    BatchMessage,
    commitlog_offset,
    decode_records,
    encode_batch,
    join_properties,
    parse_offset_msg_id_4x,
)
from tests.client.test_producer_options import created_queues
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until
from tests.remoting.raw import RawRemoting

pytestmark = pytest.mark.xdist_group("remoting-endpoint")


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("remoting"),
                       "--remoting-listen", "127.0.0.1:0") as (address, _):
        yield address


async def _cluster(ns: str) -> dict[str, Any]:
    async with RawRemoting(ns) as c:
        answer = await c.call(codes.GET_BROKER_CLUSTER_INFO)
    assert answer.code == codes.SUCCESS
    return json.loads(answer.body)


async def _addrs(ns: str) -> dict[str, str]:
    """The group's remoting addresses by broker id ("0" the leader), once all three show."""
    for _ in range(300):
        addrs = (await _cluster(ns))["brokerAddrTable"].get("a", {}).get("brokerAddrs", {})
        if len(addrs) == 3 and "0" in addrs:
            return dict(addrs)
        await asyncio.sleep(0.1)  # (polling the NameServer: bounded by the count)
    raise AssertionError(f"the group's remoting addresses did not all register: {addrs}")


def _send_ext(topic: str, queue_id: int = 0, props: str = "", sys_flag: int = 0) -> dict[str, str]:
    return {"a": "raw-producer", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id),
            "f": str(sys_flag), "g": "1700000000000", "h": "0", "i": props, "j": "0",
            "k": "false", "m": "false"}


def test_the_namesrv_answers_4x_clients_on_its_http_port(ns: str) -> None:
    async def run() -> None:
        addrs = await _addrs(ns)
        async with RawRemoting(ns) as c:
            for _ in range(300):  # (the topic shows with the leader's next registration)
                route = await c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "warmup"})
                if route.code == codes.SUCCESS:
                    break
                await asyncio.sleep(0.1)
            assert route.code == codes.SUCCESS, route.remark
            body = json.loads(route.body)
            assert body["brokerDatas"][0]["brokerName"] == "a"
            assert body["brokerDatas"][0]["brokerAddrs"] == addrs
            queue = body["queueDatas"][0]
            assert queue["brokerName"] == "a" and queue["perm"] == 6
            assert queue["readQueueNums"] >= 1 and queue["writeQueueNums"] >= 1
            auto = json.loads((await c.call(codes.GET_ROUTEINFO_BY_TOPIC,
                                            {"topic": codes.AUTO_CREATE_TOPIC})).body)
            assert auto["queueDatas"][0]["perm"] & codes.PERM_WRITE
            missing = await c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "no-such-topic"})
            assert missing.code == codes.TOPIC_NOT_EXIST
            topics = json.loads((await c.call(codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body)
            assert "warmup" in topics["topicList"]
            unknown = await c.call(4321)
            assert unknown.code == codes.REQUEST_CODE_NOT_SUPPORTED and "4321" in unknown.remark
            binary = await c.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "warmup"},
                                  serialization=codes.ROCKETMQ)
            assert binary.serialization == codes.ROCKETMQ and binary.code == codes.SUCCESS
        async with aiohttp.ClientSession() as s, s.get(f"http://{ns}/v1/cluster") as r:
            assert r.status == 200 and (await r.json())["groups"][0]["group"] == "a"
    asyncio.run(run())


def test_sends_pulls_offsets_and_lookups_on_a_broker_node(ns: str) -> None:
    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            batch = encode_batch([BatchMessage(0, f"b{i}".encode(),
                                               join_properties("T", [f"k{i}"], f"u-{i}", []))
                                  for i in range(3)])
            sent = await c.call(codes.SEND_BATCH_MESSAGE, _send_ext("raw-batch"), batch)
            assert sent.code == codes.SUCCESS, sent.remark
            ids = sent.ext["msgId"].split(",")
            assert len(ids) == 3 and sent.ext["queueOffset"] == "0"
            again = await c.call(codes.SEND_BATCH_MESSAGE, _send_ext("raw-batch"), batch)
            assert again.code == codes.SUCCESS  # a retried batch: stored once (its UNIQ_KEYs)
            top = await c.call(codes.GET_MAX_OFFSET, {"topic": "raw-batch", "queueId": "0"})
            assert top.ext["offset"] == "3"
            pulled = await c.call(codes.PULL_MESSAGE, {
                "consumerGroup": "raw-g", "topic": "raw-batch", "queueId": "0",
                "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
                "suspendTimeoutMillis": "0", "subscription": "*"})
            assert pulled.code == codes.SUCCESS and pulled.ext["nextBeginOffset"] == "3"
            records = decode_records(pulled.body)
            assert [r.body for r in records] == [b"b0", b"b1", b"b2"]
            assert [r.queue_offset for r in records] == [0, 1, 2]
            assert all(r.topic == "raw-batch" for r in records)
            host, _, _ = parse_offset_msg_id_4x(ids[1])
            assert f"{host[0]}:{host[1]}" == leader
            viewed = await c.call(codes.VIEW_MESSAGE_BY_ID,
                                  {"offset": str(records[1].commitlog_offset)})
            assert decode_records(viewed.body)[0].body == b"b1"
            new_group = await c.call(codes.QUERY_CONSUMER_OFFSET, {
                "consumerGroup": "raw-new", "topic": "raw-batch", "queueId": "0"})
            assert new_group.code == codes.SUCCESS and new_group.ext["offset"] == "0"
            commit = await c.call(codes.UPDATE_CONSUMER_OFFSET, {
                "consumerGroup": "raw-new", "topic": "raw-batch", "queueId": "0",
                "commitOffset": "2"})
            assert commit.code == codes.SUCCESS
            read = await c.call(codes.QUERY_CONSUMER_OFFSET, {
                "consumerGroup": "raw-new", "topic": "raw-batch", "queueId": "0"})
            assert read.ext["offset"] == "2"
            empty = await c.call(codes.PULL_MESSAGE, {
                "consumerGroup": "raw-g", "topic": "raw-batch", "queueId": "0",
                "queueOffset": "3", "maxMsgNums": "32", "sysFlag": "2", "commitOffset": "0",
                "suspendTimeoutMillis": "200", "subscription": "T"})
            assert empty.code == codes.PULL_NOT_FOUND
            unknown = await c.call(9999)
            assert unknown.code == codes.REQUEST_CODE_NOT_SUPPORTED
            bad = await c.call(codes.SEND_MESSAGE_V2, {"a": "p", "e": "0"}, b"x")
            assert bad.code == codes.INVALID_PARAMETER and "topic" in bad.remark
            bad_queue = await c.call(codes.SEND_MESSAGE_V2, {**_send_ext("t"), "e": "x"}, b"x")
            assert bad_queue.code == codes.INVALID_PARAMETER and "queueId" in bad_queue.remark
    asyncio.run(run())


def test_a_send_that_creates_its_topic_gives_it_the_producers_queue_count(ns: str) -> None:
    """A 4.x producer's defaultTopicQueueNums (the V2 header's ``d``): the queue count of the
    topic its send creates, capped at the broker's default (4); without it, the default; out of
    1..1024, refused by name and nothing created."""
    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            for topic, asked in (("raw-two-queues", "2"), ("raw-capped-queues", "1024")):
                sent = await c.call(codes.SEND_MESSAGE_V2, {**_send_ext(topic), "d": asked}, b"x")
                assert sent.code == codes.SUCCESS, sent.remark
            batch = encode_batch([BatchMessage(0, b"b", join_properties("", [], "u-3q", []))])
            sent = await c.call(codes.SEND_BATCH_MESSAGE, {**_send_ext("raw-three-queues"),
                                                           "d": "3"}, batch)
            assert sent.code == codes.SUCCESS, sent.remark
            plain = {k: v for k, v in _send_ext("raw-default-queues").items() if k != "d"}
            sent = await c.call(codes.SEND_MESSAGE_V2, plain, b"x")
            assert sent.code == codes.SUCCESS, sent.remark
            for bad in ("0", "-1", "1025", "four"):
                refused = await c.call(codes.SEND_MESSAGE_V2,
                                       {**_send_ext("raw-no-queues"), "d": bad}, b"x")
                assert refused.code == codes.INVALID_PARAMETER, refused.remark
                assert "defaultTopicQueueNums" in refused.remark
        routes = Routes(ns)
        await routes.start()
        try:
            for topic, count in (("raw-two-queues", 2), ("raw-capped-queues", 4),
                                 ("raw-three-queues", 3), ("raw-default-queues", 4)):
                assert await created_queues(routes, topic) == count, topic
            assert not (await routes.route("raw-no-queues", refresh=True)).exists
        finally:
            await routes.close()
    asyncio.run(run())


def test_a_follower_forwards_a_send_to_the_leader(ns: str) -> None:
    async def run() -> None:
        addrs = await _addrs(ns)
        async with RawRemoting(addrs["1"]) as follower:
            sent = await follower.call(codes.SEND_MESSAGE_V2, _send_ext(
                "raw-forward", props=join_properties("", [], "forwarded-1", [])), b"via follower")
            assert sent.code == codes.SUCCESS, sent.remark
        async with RawRemoting(addrs["0"]) as leader:
            top = await leader.call(codes.GET_MAX_OFFSET, {"topic": "raw-forward", "queueId": "0"})
            assert top.ext["offset"] == "1"
    asyncio.run(run())


def test_one_message_id_on_two_messages_stores_both_and_a_query_finds_them(ns: str) -> None:
    """Two producers' messages under one id (the C++ client gives processes started in the same
    second the same ids) are two messages; the same message again is a retry, stored once.
    Consumers and a query by that id (12 QUERY_MESSAGE, ``_UNIQUE_KEY_QUERY``) see the id the
    client gave; a query by key finds the message by its ``KEYS``."""
    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        shared = join_properties("T", ["order-7"], "C0A8000100002A9F0000000000000001", [])
        async with RawRemoting(leader) as c:
            sent = []
            for body in (b"from producer 1", b"from producer 2", b"from producer 1"):
                sent.append(await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-ids", 0, shared),
                                         body))
                assert sent[-1].code == codes.SUCCESS, sent[-1].remark
            assert [s.ext["queueOffset"] for s in sent] == ["0", "1", "0"]  # the third: a retry
            pulled = await c.call(codes.PULL_MESSAGE, {
                "consumerGroup": "g", "topic": "raw-ids", "queueId": "0", "queueOffset": "0",
                "maxMsgNums": "8", "sysFlag": "0", "suspendTimeoutMillis": "0",
                "subscription": "*"})
            records = decode_records(pulled.body)
            assert [r.body for r in records] == [b"from producer 1", b"from producer 2"]
            for r in records:
                assert r.properties.count("UNIQ_KEY") == 1
                assert "UNIQ_KEY\x01C0A8000100002A9F0000000000000001\x02" in r.properties
            by_id = await c.call(codes.QUERY_MESSAGE, {
                "topic": "raw-ids", "key": "C0A8000100002A9F0000000000000001", "maxNum": "32",
                "beginTimestamp": "0", "endTimestamp": str(2**62), "_UNIQUE_KEY_QUERY": "true"})
            assert by_id.code == codes.SUCCESS, by_id.remark
            assert sorted(r.body for r in decode_records(by_id.body)) == [b"from producer 1",
                                                                          b"from producer 2"]
            by_key = await c.call(codes.QUERY_MESSAGE, {
                "topic": "raw-ids", "key": "order-7", "maxNum": "1", "beginTimestamp": "0",
                "endTimestamp": str(2**62)})
            assert by_key.code == codes.SUCCESS and len(decode_records(by_key.body)) == 1
            none = await c.call(codes.QUERY_MESSAGE, {
                "topic": "raw-ids", "key": "no-such-key", "maxNum": "8", "beginTimestamp": "0",
                "endTimestamp": str(2**62)})
            assert none.code == codes.QUERY_NOT_FOUND
            bad = await c.call(codes.QUERY_MESSAGE, {"topic": "raw-ids", "key": "k"})
            assert bad.code == codes.INVALID_PARAMETER and "maxNum" in bad.remark
    asyncio.run(run())


def test_a_transaction_ended_under_its_message_id_alone_is_found_where_it_was_stored(
        ns: str) -> None:
    """The C++ client ends a transaction with no ``transactionId``: its message id (UNIQ_KEY)
    and the half message's commitlog offset from the send's answer. The broker finds the half
    message there and commits or rolls back that one; an END whose id is not the message's at
    that offset changes nothing. (No producer heartbeat: no check-back could decide them.)"""
    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            ends = []
            for i in range(3):
                props = join_properties("", [], f"C0A8000100002A9F00000000000000E{i}",
                                        [["TRAN_MSG", "true"], ["PGROUP", "raw-producer"]])
                half = await c.call(codes.SEND_MESSAGE_V2,
                                    _send_ext("raw-txn-end", 0, props, sys_flag=4), b"txn %d" % i)
                assert half.code == codes.SUCCESS, half.remark
                _, position, slot = parse_offset_msg_id_4x(half.ext["msgId"])
                ends.append({"producerGroup": "raw-producer", "transactionId": "",
                             "msgId": f"C0A8000100002A9F00000000000000E{i}",
                             "commitLogOffset": str(commitlog_offset(position, slot)),
                             "tranStateTableOffset": half.ext["queueOffset"],
                             "fromTransactionCheck": "false"})
            ends[1]["commitOrRollback"], ends[0]["commitOrRollback"] = "12", "8"
            ends[2]["commitOrRollback"] = "8"
            ends[2]["msgId"] = ends[0]["msgId"]  # (another message's id, that message's offset)
            ends[2]["commitLogOffset"] = ends[1]["commitLogOffset"]
            answers = [await c.call(codes.END_TRANSACTION, end) for end in ends]
            assert [a.code for a in answers[:2]] == [codes.SUCCESS] * 2, answers
            assert answers[2].code != codes.SUCCESS
            pulled = await c.call(codes.PULL_MESSAGE, {
                "consumerGroup": "g", "topic": "raw-txn-end", "queueId": "0",
                "queueOffset": "0", "maxMsgNums": "8", "sysFlag": "0",
                "suspendTimeoutMillis": "0", "subscription": "*"})
            assert [r.body for r in decode_records(pulled.body)] == [b"txn 0"]
    asyncio.run(run())


def test_a_pull_without_its_subscription_takes_the_heartbeats(ns: str) -> None:
    """RocketMQ's Java push consumer sends its subscription in heartbeats only (its pulls carry
    none unless postSubscriptionWhenPull): the pull is filtered by the heartbeat's, TAG or SQL92;
    with none known, SUBSCRIPTION_NOT_EXIST."""
    def beat(expression: str, kind: str) -> bytes:
        return json.dumps({"clientID": "java@1", "consumerDataSet": [
            {"groupName": "java-g", "messageModel": "CLUSTERING", "subscriptionDataSet": [
                {"topic": "raw-java", "subString": expression, "expressionType": kind}]}]}
            ).encode()

    def pull(group: str = "java-g") -> dict[str, str]:
        return {"consumerGroup": group, "topic": "raw-java", "queueId": "0",
                "queueOffset": "0", "maxMsgNums": "8", "sysFlag": "0",
                "suspendTimeoutMillis": "0"}

    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            for tag, a in (("TagA", "1"), ("TagB", "2"), ("TagA", "3")):
                sent = await c.call(codes.SEND_MESSAGE_V2, _send_ext(
                    "raw-java", 0, join_properties(tag, [], "", [["a", a]])), f"{tag} {a}".encode())
                assert sent.code == codes.SUCCESS, sent.remark
            unknown = await c.call(codes.PULL_MESSAGE, pull())
            assert unknown.code == codes.SUBSCRIPTION_NOT_EXIST, unknown.remark
            for expression, kind, expected in (("TagA", "TAG", [b"TagA 1", b"TagA 3"]),
                                               ("a > 1", "SQL92", [b"TagB 2", b"TagA 3"])):
                assert (await c.call(codes.HEART_BEAT, body=beat(expression, kind))).code \
                    == codes.SUCCESS
                got = await c.call(codes.PULL_MESSAGE, pull())
                assert [r.body for r in decode_records(got.body)] == expected, kind
            carried = await c.call(codes.PULL_MESSAGE, {**pull("other-g"), "subscription": "TagB"})
            assert [r.body for r in decode_records(carried.body)] == [b"TagB 2"]
    asyncio.run(run())


def test_a_client_that_pipelines_pulls_and_never_reads_is_cut_off(ns: str) -> None:
    """Answers a client leaves unread are bounded: past OUTPUT_MAX_BYTES the node closes the
    connection (counted), and serves on."""
    async def refused(routes: Routes) -> int:
        _, status = await routes.group_client((await routes.cluster_groups())[0]).call_leader(
            bp.BROKER_STATUS)
        return int(status["remoting"]["refused_frames"])

    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            for i in range(8):
                sent = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-unread"),
                                    bytes([i]) * (1 << 20))
                assert sent.code == codes.SUCCESS, sent.remark
        routes = Routes(ns)
        await routes.start()
        try:
            before = await refused(routes)
            host, _, port = leader.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            pulls = 12  # about 8 MiB each: 96 MiB asked for, never read
            writer.write(b"".join(encode_frame(encode(Command(
                codes.PULL_MESSAGE, k, ext={"consumerGroup": "g", "topic": "raw-unread",
                                            "queueId": "0", "queueOffset": "0",
                                            "maxMsgNums": "8", "sysFlag": "0",
                                            "subscription": "*"}))) for k in range(pulls)))

            async def cut_off() -> bool:
                return await refused(routes) > before
            await wait_until(cut_off, 30, "the node to close the connection that reads nothing")
            taken = 0
            try:
                while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
                    taken += len(chunk)
            except ConnectionResetError:
                pass
            writer.close()
            assert taken < pulls * 7 * (1 << 20)  # (it ended before all answers came)
        finally:
            await routes.close()
        async with RawRemoting(leader) as c:
            top = await c.call(codes.GET_MAX_OFFSET, {"topic": "raw-unread", "queueId": "0"})
            assert top.code == codes.SUCCESS and top.ext["offset"] == "8"
    asyncio.run(run())


def test_a_closed_connection_takes_its_consumer_out_unless_it_is_live_on_another(ns: str) -> None:
    """A consumer whose connection closes leaves its group at once; one that heartbeats on a
    newer connection too stays (RocketMQ removes by channel, not by client id)."""
    beat = json.dumps({"clientID": "twice@1", "consumerDataSet": [
        {"groupName": "conn-g", "messageModel": "CLUSTERING",
         "subscriptionDataSet": [{"topic": "t", "subString": "*"}]}]}).encode()

    async def members(c: RawRemoting) -> list[str]:
        answer = await c.call(codes.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "conn-g"})
        return list(json.loads(answer.body)["consumerIdList"]) if answer.body else []

    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as watcher:
            async with RawRemoting(leader) as old:
                assert (await old.call(codes.HEART_BEAT, body=beat)).code == codes.SUCCESS
                async with RawRemoting(leader) as new:
                    assert (await new.call(codes.HEART_BEAT, body=beat)).code == codes.SUCCESS
                    await old.__aexit__()
                    for _ in range(20):  # watched for a while after the close: it stays, live
                        assert await members(watcher) == ["twice@1"]  # on `new` (bounded)
                        await asyncio.sleep(0.05)
            async def left() -> bool:  # both closed now: it leaves
                return await members(watcher) == []
            await wait_until(left, 5, "the consumer to leave with its last connection")
    asyncio.run(run())


def test_a_4x_pull_never_delivers_a_message_whose_ttl_passed(ns: str) -> None:
    """Issue 35, item 5 on the remoting path: a message sent with a short ``TTL_MS`` is passed
    over by a pull once its TTL has passed (its offset consumed); one without, sent with it,
    is delivered; a bad TTL is refused by name."""
    ttl_ms = 1_000

    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            batch = encode_batch([
                BatchMessage(0, b"short", join_properties("", [], "u-short",
                                                          [["TTL_MS", str(ttl_ms)]])),
                BatchMessage(0, b"kept", join_properties("", [], "u-kept", []))])
            sent = await c.call(codes.SEND_BATCH_MESSAGE, _send_ext("raw-ttl"), batch)
            assert sent.code == codes.SUCCESS, sent.remark
            sent_s = time.time()
            await wait_until(lambda: time.time() > sent_s + ttl_ms / 1000 + 0.1, 10,
                             "the TTL to pass")
            pulled = await c.call(codes.PULL_MESSAGE, {
                "consumerGroup": "raw-ttl-g", "topic": "raw-ttl", "queueId": "0",
                "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
                "suspendTimeoutMillis": "0", "subscription": "*"})
            assert pulled.code == codes.SUCCESS and pulled.ext["nextBeginOffset"] == "2"
            assert [r.body for r in decode_records(pulled.body)] == [b"kept"]
            bad = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-ttl", props=join_properties(
                "", [], "u-bad", [["TTL_MS", "-3"]])), b"x")
            assert bad.code != codes.SUCCESS and "TTL_MS" in bad.remark
    asyncio.run(run())
