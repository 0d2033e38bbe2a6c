"""The send path on real processes: concurrent sends of one producer spread over every queue of
a topic yet share one entry; a deduplicated retry answers with the stored original's message id;
another message under a taken unique key is stored, not answered as one; a group that turned
read-only for a topic is left for another; batches over the broker's maximum
are refused, not split, and the maximum and the auto-created queue count are broker options
(also from the TOML config); fields that are not strings are refused, not coerced."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import (
    Message,
    MessageTooLargeError,
    Producer,
)
from client.types import MessageQueue, SendResult
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from protocol.envelope import BadRequestError, RemoteError
from protocol.topics import MAX_QUEUES
from tests.broker.test_broker_e2e import _wait_route
from tests.broker.test_broker_processes import BROKER, _start_namesrv, _wait_leader
from tests.clusters import namesrv_group
from tests.clusters import routed as _routed

pytestmark = pytest.mark.slow
MiB = 1 << 20


def group(tmp_path: Path, ns: str, name: str, *args: str) -> LocalCluster:
    return LocalCluster(str(tmp_path / name), size=3, tick_ms=50, group=name,
                        program=(*BROKER, *args, "--namesrv", ns, "--register-interval-s", "1"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalCluster]]:
    """A NameServer and one broker group with the default options."""
    with namesrv_group(tmp_path_factory.mktemp("send")) as (ns, c):
        yield ns, c


async def pull_all(lc: LogClient, c: LocalCluster, topic: str, queue_id: int) -> list[Any]:
    """Every message of a queue, from the group's leader (which has applied every message it
    acknowledged): [offset, body, tags, keys, unique key, properties, born, stored,
    offset_msg_id] each. (A route to a new topic may still be on its way to the NameServer.)"""
    leader = await _wait_leader(lc, c)
    out: list[Any] = []
    for _ in range(100):
        res = await lc.call(leader, bp.PULL, topic, queue_id, len(out), 256, 8 << 20, 0, [])
        if not res[4]:
            return out
        out.extend(res[4])
    return out


def test_concurrent_sends_spread_over_every_queue_of_the_group_in_one_entry(
        cluster: tuple[str, LocalCluster]) -> None:
    ns, c = cluster

    async def run() -> None:
        async with Producer(ns) as p, LogClient(c.client_addresses, timeout_s=5) as lc:
            results: list[SendResult] = await asyncio.gather(
                *(p.send(Message("spread", b"m%d" % i)) for i in range(100)))
            per_queue: dict[MessageQueue, list[tuple[int, bytes, str]]] = {}
            for i, r in enumerate(results):
                per_queue.setdefault(r.queue, []).append((r.queue_offset, b"m%d" % i,
                                                          r.offset_msg_id))
            assert sorted(q.queue_id for q in per_queue) == [0, 1, 2, 3]  # every queue
            assert sorted(len(v) for v in per_queue.values()) == [25, 25, 25, 25]
            # group commit still holds: one request, one log entry (one commitlog position)
            assert len({r.offset_msg_id.rsplit("-", 1)[0] for r in results}) == 1
            for mq, sent in per_queue.items():  # dense offsets per queue, in call order
                assert [o for o, _, _ in sent] == list(range(len(sent)))
                stored = await pull_all(lc, c, "spread", mq.queue_id)
                assert [(m[0], m[1], m[8]) for m in stored] == sent

    asyncio.run(run())


def test_a_deduplicated_retry_answers_with_the_original_message_id(
        cluster: tuple[str, LocalCluster]) -> None:
    _, c = cluster

    async def run() -> None:
        async with LogClient(c.client_addresses, timeout_s=5) as lc:
            await _wait_leader(lc, c)
            first_msg = [b"original", "", [], "RETRY-KEY-1", [], 0]
            _, first = await lc.call_leader(bp.SEND, "dedup", 1, [[b"other", "", [], "K0", [], 0],
                                                                  first_msg])
            _, again = await lc.call_leader(bp.SEND, "dedup", 2, [first_msg])  # a retry elsewhere
            assert again[4] == [True] and (again[5][0], again[2][0]) == (1, first[2][1])
            assert again[3][0] == first[3][1]  # the same offset_msg_id: the original's
            original = (await pull_all(lc, c, "dedup", 1))[first[2][1]]
            assert (original[8], original[1], original[4]) == (again[3][0], b"original",
                                                               "RETRY-KEY-1")
            _, runs = await lc.call_leader(bp.SEND_RUNS, [["dedup", 3, [first_msg]]])
            assert runs[0][4] == [True] and runs[0][3][0] == first[3][1]

    asyncio.run(run())


def test_another_message_under_a_taken_unique_key_is_stored_not_taken_for_a_retry(
        cluster: tuple[str, LocalCluster]) -> None:
    """Unique keys are no secret (consumers see them; clients draw them in sequence): a sender
    that stores a message under another's next key first must not make that one a "duplicate"
    of its own, acknowledged and never stored. Each message is stored, a retry of each is
    answered with its own original, and consumers see the key as sent."""
    _, c = cluster

    async def run() -> None:
        async with LogClient(c.client_addresses, timeout_s=5) as lc:
            await _wait_leader(lc, c)
            key = "TAKEN-KEY-1"
            first = [b"sent first, by another", "", [], key, [], 0]
            victims = [[b"the victim's", "", [], key, [], 0],  # each differs from ``first``
                       [b"sent first, by another", "TagA", [], key, [], 0],  # in one field
                       [b"sent first, by another", "", ["k"], key, [], 0],
                       [b"sent first, by another", "", [], key, [["p", "v"]], 0]]
            for n, victim in enumerate(victims):
                topic = f"taken-{n}"  # (the dedup table's keys are a topic's)
                _, a = await lc.call_leader(bp.SEND, topic, 0, [first])
                _, b = await lc.call_leader(bp.SEND, topic, 1, [victim])
                assert (a[4], b[0], b[4]) == ([False], "SEND_OK", [False]), (n, b)
                assert b[3][0] != a[3][0]
                _, again = await lc.call_leader(bp.SEND, topic, 2, [[*victim[:5], 99]])
                assert again[4] == [True] and again[3] == b[3]  # a retry (born time aside)
                stored = await pull_all(lc, c, topic, 1)
                assert [(r[1], r[2], r[4]) for r in stored] == [(victim[0], victim[1], key)]
                _, again = await lc.call_leader(bp.SEND, topic, 2, [first])
                assert again[4] == [True] and again[3] == a[3]

    asyncio.run(run())


def test_fields_that_are_not_strings_are_refused_by_name_not_coerced(
        cluster: tuple[str, LocalCluster]) -> None:
    _, c = cluster

    async def run() -> None:
        async with LogClient(c.client_addresses, timeout_s=5) as lc:
            await _wait_leader(lc, c)
            bad = [b"x", "", [], "K-int", [["count", 5]], 0]
            with pytest.raises(BadRequestError, match="property 'count' must be a string"):
                await lc.call_leader(bp.SEND, "strict", 0, [bad])  # the wire code BAD_REQUEST
            _, answers = await lc.call_leader(bp.SEND_RUNS, [
                ["strict", 0, [[b"y", 7, [], "K-tag", [], 0]]],  # tags not a string
                ["strict", 1, [[b"ok", "", [], "K-ok", [], 0]]]])
            assert answers[0][0] == "BAD_REQUEST" and "tags" in answers[0][1]
            assert answers[1][0] == "SEND_OK"  # the other run is stored
            _, res = await lc.call_leader(bp.PULL, "strict", 0, 0, 32, 1 << 20, 0, [])
            assert res[4] == []  # nothing of the refused messages was stored

    asyncio.run(run())


def test_a_queue_id_past_any_topics_is_refused_alone_not_with_the_runs_it_travels_with(
        cluster: tuple[str, LocalCluster]) -> None:
    """A queue id no topic can have (at least MAX_QUEUES) to a topic the send would create is
    refused as QUEUE_NOT_FOUND by the leader; it must not reach the log, where no replica
    decodes it and the entry's other runs, other clients' sends, would be refused with it."""
    _, c = cluster

    async def run() -> None:
        async with LogClient(c.client_addresses, timeout_s=5) as lc:
            await _wait_leader(lc, c)
            qids = (MAX_QUEUES, 2**64, 10**5000, -1)  # (the third: a 5,001-digit bignum)
            for k, qid in enumerate(qids):
                _, answers = await lc.call_leader(bp.SEND_RUNS, [
                    [f"huge-qid-{k}", qid, [[b"bad", "", [], f"K-huge-{k}", [], 0]]],
                    ["huge-qid-ok", 0, [[b"ok", "", [], f"K-ok-{k}", [], 0]]]])
                assert answers[0][0] == "QUEUE_NOT_FOUND", answers
                assert answers[1][0] == "SEND_OK", answers  # the other run is stored
                with pytest.raises(RemoteError, match="QUEUE_NOT_FOUND"):
                    await lc.call_leader(bp.SEND, f"huge-qid-alone-{k}", qid,
                                         [[b"bad", "", [], f"K-alone-{k}", [], 0]])
            _, res = await lc.call_leader(bp.PULL, "huge-qid-ok", 0, 0, 32, 1 << 20, 0, [])
            assert [m[1] for m in res[4]] == [b"ok"] * len(qids)

    asyncio.run(run())


def test_a_batch_over_the_maximum_is_refused_not_split(cluster: tuple[str, LocalCluster]) -> None:
    ns, c = cluster
    batch = [Message("big", b"x" * MiB) for _ in range(5)]  # 5 MiB: over the default 4 MiB

    async def run() -> None:
        async with Producer(ns, send_timeout_s=10) as p, \
                LogClient(c.client_addresses, timeout_s=5) as lc:
            with pytest.raises(MessageTooLargeError):
                await p.send_batch(batch)
            with pytest.raises(MessageTooLargeError):  # over any broker's: refused unsent
                await p.send_batch(batch * 2)
            from client import message_bytes, split_batch  # the explicit splitting instead
            parts = split_batch(batch)
            assert [len(x) for x in parts] == [3, 2]
            assert all(sum(map(message_bytes, x)) <= bp.MAX_MESSAGE_BYTES for x in parts)
            stored = [await p.send_batch(x) for x in parts]
            # nothing of the refused batches was stored: the parts start their queues at 0
            assert [r[0].queue_offset for r in stored] == [0, 0]
            assert [len(await pull_all(lc, c, "big", r[0].queue.queue_id)) for r in stored] == [3, 2]

    asyncio.run(run())


def test_a_group_read_only_for_a_topic_is_left_for_another_within_the_deadline(
        tmp_path: Path) -> None:
    ns_proc, ns = _start_namesrv(tmp_path)

    async def run(a: LocalCluster) -> None:
        async with Producer(ns) as p:
            warm = [await p.send(Message("maint", b"w%d" % i)) for i in range(8)]
            assert {r.queue.group for r in warm} == {"a", "b"}
            async with LogClient(a.client_addresses, timeout_s=5) as lc:  # maintenance on a
                _, status = await lc.call_leader(bp.TOPIC_PUT, "maint", 4, 4, 4)
                assert status == "OK"
            assert p._routes is not None  # the producer's cached route still says writable
            cached = p._routes._routes["maint"]
            assert {g.group: g.perm for g in cached.groups} == {"a": 6, "b": 6}
            later = [await p.send(Message("maint", b"x%d" % i)) for i in range(8)]
            assert {r.queue.group for r in later} == {"b"}

    try:
        with group(tmp_path, ns, "a") as a, group(tmp_path, ns, "b") as b:
            asyncio.run(_wait_route(ns, "maint", a, b))
            asyncio.run(run(a))
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


def test_default_queues_and_max_message_bytes_are_broker_options_also_in_toml(
        tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f"default-queues = 8\nmax-message-bytes = {6 * MiB}\n")
    ns_proc, ns = _start_namesrv(tmp_path)

    async def run(c: LocalCluster) -> None:
        await _routed(ns)
        async with Producer(ns, send_timeout_s=10) as p, \
                LogClient(c.client_addresses, timeout_s=5) as lc:
            leader = await _wait_leader(lc, c)
            status = await lc.call(leader, bp.BROKER_STATUS)
            assert status["topics"]["warmup"]["write_queues"] == 8  # auto-created with 8
            five = [Message("large", b"y" * MiB) for _ in range(5)]
            assert len(await p.send_batch(five)) == 5  # 5 MiB: this broker takes it
            single = await p.send(Message("large", b"z" * (5 * MiB)))  # the client lets it go
            assert single.status == "SEND_OK"
            with pytest.raises(MessageTooLargeError):
                await p.send_batch(five + five[:2])  # 7 MiB: over this broker's 6 MiB

    try:
        with group(tmp_path, ns, "c", "--config", str(config)) as c:
            asyncio.run(run(c))
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)
