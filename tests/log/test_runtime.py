"""The node runtime in one process: three Nodes on loopback with real files and sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from dledger.localcluster import free_ports
from dledger.node.runtime import (
    BUSY_POLL_PENDING_MAX,
    BUSY_POLL_PROPOSED_BYTES_MAX,
    MAX_BUSY_POLL_US,
    Node,
    NodeConfig,
)
from protocol.errors import NodeStoppedError, NotLeaderError, ProposalTimeoutError, StorageError


async def wait_for(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def configs(tmp_path: Path, **kw) -> list[NodeConfig]:
    ports = free_ports(3)
    peers = {f"n{i}": ("127.0.0.1", p) for i, p in enumerate(ports)}
    kw.setdefault("tick_interval_s", 0.02)
    return [NodeConfig(group="g", node_id=n, peers=peers, data_dir=str(tmp_path / n), **kw)
            for n in peers]


async def start_all(cfgs: list[NodeConfig]) -> list[Node]:
    nodes = [Node(c) for c in cfgs]
    for n in nodes:
        await n.start()
    await wait_for(lambda: any(n.is_leader for n in nodes), 10, "a leader")
    return nodes


@contextlib.asynccontextmanager
async def running(cfgs: list[NodeConfig]) -> AsyncIterator[list[Node]]:
    """A started group with a leader; every node in the list is stopped on the way out (nodes
    a test adds to the list too)."""
    nodes = await start_all(cfgs)
    try:
        yield nodes
    finally:
        for n in nodes:
            await n.stop()


def leader_of(nodes: list[Node]) -> Node:
    return next(n for n in nodes if n.is_leader)


def test_propose_commits_and_followers_serve_committed_reads(tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path)) as nodes:
            leader = leader_of(nodes)
            follower = next(n for n in nodes if n is not leader)
            seen: list[int] = []
            follower.add_apply_listener(lambda batch: seen.extend(e.index for e in batch))
            done = [await leader.propose(f"e{k}".encode()) for k in range(20)]
            assert [d.index for d in done] == sorted(d.index for d in done)
            positions = [d.position for d in done]
            assert positions == sorted(positions) and len(set(positions)) == 20
            await wait_for(lambda: follower.status().raft.commit_index >= done[-1].index, 5,
                           "the follower to learn the commit index")
            await follower.wait_applied(done[-1].index, 5)
            assert seen == list(range(seen[0], done[-1].index + 1))  # every index, in order
            assert set(d.index for d in done) <= set(seen)
            got = follower.read_committed(done[0].index, max_entries=100)
            assert [e.data for e in got[:20]] == [f"e{k}".encode() for k in range(20)]
            assert [e.position for e in got[:20]] == positions  # same position on every replica
            with pytest.raises(NotLeaderError) as err:
                await follower.propose(b"not here")
            assert err.value.leader_hint == leader.config.node_id

    asyncio.run(run())


def test_propose_times_out_with_outcome_unknown_when_the_quorum_is_gone(tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path, election_ticks=50)) as nodes:
            leader = leader_of(nodes)
            await leader.propose(b"ok")
            for n in nodes:
                if n is not leader:
                    await n.stop()
            with pytest.raises(ProposalTimeoutError):
                await leader.propose(b"no quorum", timeout_s=0.3)
            # outcome unknown indeed: with a follower back, the entry may still commit, and the
            # late commit of a proposal that timed out disturbs nothing
            back = Node(next(n.config for n in nodes if n is not leader))
            nodes.append(back)
            await back.start()
            await wait_for(lambda: leader.is_leader or back.is_leader, 10, "a leader again")
            now = leader if leader.is_leader else back
            after = await now.propose(b"after", timeout_s=5)
            logged = [e.data for e in now.read_committed(1, max_entries=100)]
            assert logged.index(b"no quorum") < logged.index(b"after") == after.index - 1

    asyncio.run(run())


def test_retention_deletes_old_segments_but_keeps_what_a_stopped_follower_needs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        cfgs = configs(tmp_path, segment_bytes_max=4096, retention_entries=20)
        async with running(cfgs) as nodes:
            leader = leader_of(nodes)
            lagger = next(n for n in nodes if n is not leader)
            for _k in range(150):
                await leader.propose(b"y" * 100)
            await wait_for(lambda: lagger.status().raft.commit_index >= 150, 5, "replication")
            await lagger.stop()
            held = lagger.status().raft.last_index
            for _k in range(300):
                await leader.propose(b"x" * 100)
            store = leader.store
            assert store is not None
            # retention ran (every few ticks) but stopped at what the stopped follower needs
            await wait_for(lambda: store.first_index() > 1, 5, "retention on the leader")
            assert store.first_index() <= held + 1
            restarted = Node(lagger.config)
            nodes[nodes.index(lagger)] = restarted
            await restarted.start()
            target = leader.status().raft.commit_index
            await wait_for(lambda: restarted.status().raft.commit_index >= target, 10,
                           "the restarted follower to catch up")
            await wait_for(lambda: store.first_index() > held + 1, 5,
                           "retention to move on once the follower caught up")

    with caplog.at_level(logging.INFO, logger="dledger.node"):
        asyncio.run(run())
    deleted = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("retention deleted log entries 1..")]
    assert deleted and "; the log starts at " in deleted[0]  # (the leader's first deletion)


def test_a_storage_error_while_handling_a_message_stops_that_node_with_its_cause(
        tmp_path: Path) -> None:
    # A follower's append fails inside the callback that read the AppendRequest (the loop was
    # parked): the node stops as it would in its loop, failure names the cause, the group goes on.
    async def run() -> None:
        async with running(configs(tmp_path, election_ticks=50)) as nodes:
            leader = leader_of(nodes)
            await leader.propose(b"before")
            broken = next(n for n in nodes if n is not leader)

            def fail(entries: object) -> None:
                raise StorageError("disk gone")

            broken.store.append = fail  # type: ignore[method-assign, union-attr]
            done = await leader.propose(b"after", timeout_s=5)  # the other follower suffices
            await asyncio.wait_for(broken.join(), 5)
            assert isinstance(broken.failure, StorageError)
            with pytest.raises(NodeStoppedError):
                broken.submit(b"x")
            assert done.index == leader.status().raft.commit_index

    asyncio.run(run())


def test_proposals_submitted_together_are_taken_in_one_turn(tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path)) as nodes:
            leader = leader_of(nodes)
            await leader.propose(b"warm")
            await wait_for(lambda: leader._parked, 5, "the leader's loop to park")
            last = leader.status().raft.last_index
            futs = [leader.submit(f"b{k}".encode()) for k in range(50)]
            # None was handled inside submit: they wait for one turn after this callback.
            assert leader.status().raft.last_index == last
            done = await asyncio.gather(*futs)
            assert [d.index for d in done] == list(range(last + 1, last + 51))

    asyncio.run(run())


def count_polls(node: Node) -> list[float]:
    """The times of the node's busy-poll callbacks from now on (appended as they run)."""
    polls: list[float] = []
    poll_again = node._poll_again

    def counted() -> None:
        polls.append(time.perf_counter())
        poll_again()

    node._poll_again = counted  # type: ignore[method-assign]
    return polls


def test_a_leader_busy_polls_while_proposals_await_commit_and_stops_when_none_do(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path, busy_poll_us=1000, election_ticks=50)) as nodes:
            leader = leader_of(nodes)
            polls = count_polls(leader)
            for k in range(20):
                await leader.propose(f"p{k}".encode())
            assert polls, "the leader slept while its proposals awaited commit"
            await wait_for(lambda: leader._poll_until == 0.0, 5, "polling to stop")
            seen, tick = len(polls), leader._core().tick_count
            await wait_for(lambda: leader._core().tick_count >= tick + 5, 5, "five ticks")
            assert len(polls) == seen, "the leader polled with nothing awaiting commit"

            # A proposal that cannot commit: the leader polls after each turn, each time for a
            # bounded while, not for as long as the proposal waits.
            for n in nodes:
                if n is not leader:
                    await n.stop()
            stuck = leader.submit(b"no quorum")
            await wait_for(lambda: len(polls) > seen, 5, "polling for the waiting proposal")
            await wait_for(lambda: leader._poll_until == 0.0 and not stuck.done(), 5,
                           "a pause in polling while the proposal still waits")
            stuck.cancel()

    asyncio.run(run())


def test_a_follower_busy_polls_after_acknowledging_entries_and_not_for_heartbeats(
        tmp_path: Path) -> None:
    async def run() -> None:
        # The widest window: each next append comes well within it, even on a loaded machine
        # (a follower polls only for appends that come that soon after its answer); and
        # heartbeats every 4 ms, within it too, so that only the kind of message decides.
        async with running(configs(tmp_path, busy_poll_us=MAX_BUSY_POLL_US, election_ticks=100,
                                   tick_interval_s=0.004)) as nodes:
            follower = next(n for n in nodes if not n.is_leader)
            polls = count_polls(follower)
            for k in range(200):  # (until one next append came within the window: under a
                await leader_of(nodes).propose(f"p{k}".encode())  # CI run's load, 20 in a row
                if polls:  # once came too late for every one)
                    break
            assert polls, "the follower slept after acknowledging entries"
            await wait_for(lambda: follower._poll_until == 0.0, 5, "polling to stop")
            seen, tick = len(polls), follower._core().tick_count
            await wait_for(lambda: follower._core().tick_count >= tick + 5, 5, "five ticks")
            assert len(polls) == seen, "the follower polled after heartbeats alone"

    asyncio.run(run())


def test_a_follower_whose_appends_come_further_apart_than_the_window_does_not_poll(
        tmp_path: Path) -> None:
    async def run() -> None:
        # A 1 µs window: no append can follow an answer that quickly, so polling would only
        # burn CPU (as under load, when the leader gathers the next batch for a while).
        async with running(configs(tmp_path, busy_poll_us=1, election_ticks=50)) as nodes:
            followers = [n for n in nodes if not n.is_leader]
            polls = [count_polls(f) for f in followers]
            for k in range(20):
                await leader_of(nodes).propose(f"p{k}".encode())
            assert all(f._acked_at > 0 for f in followers), "the followers answered no append"
            assert polls == [[], []], "a follower polled for an append it could not expect"

    asyncio.run(run())


def test_a_leader_polls_only_for_a_few_pending_proposals_whatever_it_acknowledged_before(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path, busy_poll_us=300)) as nodes:
            leader = leader_of(nodes)
            loop = asyncio.get_running_loop()
            # A flag left from its days as a follower must not make a loaded leader poll.
            leader._acked_entries = True
            real, leader._pending = leader._pending, {}
            try:
                for n, expected in ((1, True), (BUSY_POLL_PENDING_MAX, True),
                                    (BUSY_POLL_PENDING_MAX + 1, False), (64, False)):
                    leader._pending = {(0, -k): loop.create_future() for k in range(n)}
                    assert leader._expects_message() is expected, n
            finally:
                leader._pending = real

    asyncio.run(run())


def test_a_leader_polls_only_after_proposing_a_small_batch(tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path, busy_poll_us=300)) as nodes:
            leader = leader_of(nodes)
            await leader.propose(b"x" * 100, 10)
            assert leader._proposed_bytes == 100
            real, leader._pending = leader._pending, {(0, -1): asyncio.get_running_loop().create_future()}
            try:
                for size, expected in ((100, True), (BUSY_POLL_PROPOSED_BYTES_MAX, True),
                                       (BUSY_POLL_PROPOSED_BYTES_MAX + 1, False)):
                    leader._proposed_bytes = size
                    assert leader._expects_message() is expected, size
            finally:
                leader._pending = real
            # a batch of proposals taken in one turn counts as a whole
            await asyncio.gather(*(leader.propose(b"y" * 3000, 10) for _ in range(2)))
            assert leader._proposed_bytes == 6000

    asyncio.run(run())


def test_busy_poll_is_bounded() -> None:
    peers = {"n0": ("127.0.0.1", 1)}
    for bad in (-1, MAX_BUSY_POLL_US + 1):
        with pytest.raises(ValueError, match="busy_poll_us"):
            NodeConfig(group="g", node_id="n0", peers=peers, data_dir="d", busy_poll_us=bad)
