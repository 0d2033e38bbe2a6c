"""Consume queues in files (``broker.core.cq_files``): they read like the in-memory queues across
file boundaries and unwritten units, a checkpoint records where they end (its thread writing the
units in memory, one file open at a time, and a stop waiting for it), a restore cuts back what
was written after it and refuses files that are short, deleted topics' files go only after a
checkpoint without them, retention deletes whole files from the front, and the open files stay
within their bound, those of a dropped queue closed."""

from __future__ import annotations

import asyncio
import os
import random
import resource
import threading
from pathlib import Path

import pytest

import broker.shell.checkpoint as checkpoint_module
from broker.config import BrokerConfig
from broker.core.consumequeue import UNIT_BYTES, ConsumeQueue, CQUnit
from broker.core.cq_files import ConsumeQueueFilesError, FileConsumeQueue, FileQueues
from broker.core.entries import TopicDelete, encode_send
from broker.machine.kinds import encode
from broker.machine.state import BrokerState
from broker.server import BrokerServer
from broker.shell.checkpoint import CHECKPOINT_FILE, QUEUES_DIR, load_checkpoint, save_checkpoint
from dledger.node.runtime import NodeConfig
from tests.log.test_runtime import wait_for


class _Log:
    """Stands for a node's open log that holds every entry the tests apply."""

    def last_index(self) -> int:
        return 1000


def _load(data: str) -> BrokerState:
    return load_checkpoint(data, store=_Log(), queue_files=True)  # type: ignore[arg-type]


def _unit(i: int) -> CQUnit:
    return CQUnit(1000 * i, i % 3, 100 + i, i * 7, 5000 + 10 * i)


def test_a_file_queue_reads_like_a_memory_queue_across_files_and_unwritten_units(
        tmp_path: Path) -> None:
    store = FileQueues(str(tmp_path), units_per_file=8)
    q = store.create(0)
    mem = ConsumeQueue()
    rng = random.Random(5)
    for i in range(61):
        for target in (q, mem):
            target.append(*(getattr(_unit(i), f) for f in CQUnit.__slots__))
        if rng.random() < 0.2:
            store.flush()  # some units written, some still in memory
        n = len(mem)
        assert len(q) == n and q[n - 1] == mem[n - 1]
        lo = rng.randrange(n)
        hi = min(n, lo + rng.randrange(1, 20))
        assert q[lo:hi] == mem[lo:hi]
    assert list(q) == list(mem) and q.crc == mem.crc
    store.flush()
    assert sorted(os.listdir(q.dir)) == [f"{b:020d}" for b in range(0, 64, 8)]  # type: ignore[attr-defined]
    assert os.path.getsize(os.path.join(q.dir, f"{56:020d}")) == 5 * UNIT_BYTES  # type: ignore[attr-defined]
    with pytest.raises(IndexError):
        q[61]


def _send(state: BrokerState, index: int, topic: str, qid: int, n: int) -> None:
    msgs = [[b"x", "", [], f"K{index}.{k}", [], 0] for k in range(n)]
    state.apply(index, index * 100, encode_send(topic, qid, 1000 + index, msgs, True, 4))


def test_a_restore_cuts_back_units_written_after_the_checkpoint_and_drops_later_queues(
        tmp_path: Path) -> None:
    data = str(tmp_path)
    state = _load(data)
    for i in range(1, 6):
        _send(state, i, "a", i % 2, 3)
    state.queue_store.flush()
    job = state.queue_store.sync_job()  # type: ignore[attr-defined]
    job()
    save_checkpoint(data, state.snapshot())
    expected = {k: list(q) for k, q in state.queues.items()}
    for i in range(6, 9):  # applied and written, never checkpointed: then a crash
        _send(state, 2 * i, "a", i % 2, 3)
        _send(state, 2 * i + 1, "b", 0, 2)  # a queue the checkpoint does not know
    state.queue_store.flush()
    assert len(os.listdir(tmp_path / QUEUES_DIR)) == 3
    again = _load(data)
    assert again.applied_index == 5 and {k: list(q) for k, q in again.queues.items()} == expected
    assert sorted(os.listdir(tmp_path / QUEUES_DIR)) == [f"{n:010d}" for n in (0, 1)]
    _send(again, 6, "a", 0, 3)  # replaying the log goes on from the checkpoint's ends
    assert len(again.queues[("a", 0)]) == 9


def test_files_shorter_than_the_checkpoint_set_it_aside(tmp_path: Path) -> None:
    data = str(tmp_path)
    state = _load(data)
    _send(state, 1, "a", 0, 4)
    state.queue_store.sync_job()()  # type: ignore[attr-defined]
    save_checkpoint(data, state.snapshot())
    path = tmp_path / QUEUES_DIR / f"{0:010d}" / f"{0:020d}"
    os.truncate(path, 2 * UNIT_BYTES)  # e.g. a disk that lost what it acknowledged
    with pytest.raises(ConsumeQueueFilesError):
        FileQueues(str(tmp_path / QUEUES_DIR)).restore(0, [4, 0])
    again = _load(data)
    assert again.applied_index == 0 and not again.queues  # the log is replayed instead
    assert os.listdir(tmp_path / QUEUES_DIR) == []
    assert (tmp_path / CHECKPOINT_FILE).exists()


def test_a_deleted_topics_files_stay_until_a_checkpoint_without_it(tmp_path: Path) -> None:
    data = str(tmp_path)
    state = _load(data)
    _send(state, 1, "gone", 0, 2)
    _send(state, 2, "kept", 0, 2)
    store = state.queue_store
    assert isinstance(store, FileQueues)
    store.sync_job()()
    save_checkpoint(data, state.snapshot())
    state.apply(3, 300, encode(TopicDelete("gone")))
    assert store.dropped == [0] and (tmp_path / QUEUES_DIR / f"{0:010d}").is_dir()
    # a crash now: the checkpoint still names the topic, and its files are there for it
    restored = _load(data)
    assert len(restored.queues[("gone", 0)]) == 2
    restored.queue_store.close()
    # a checkpoint without it: then the files go
    store.sync_job()()
    dropped = store.take_dropped()
    save_checkpoint(data, state.snapshot())
    store.remove_queues(dropped)
    assert sorted(os.listdir(tmp_path / QUEUES_DIR)) == [f"{1:010d}"]
    assert _load(data).queues.keys() == {("kept", 0)}


def test_retention_deletes_whole_files_from_the_front(tmp_path: Path) -> None:
    store = FileQueues(str(tmp_path), units_per_file=4)
    q = store.create(7)
    assert isinstance(q, FileConsumeQueue)
    for i in range(18):
        q.append(1000 * i, 0, 10, 0, i)
    store.flush()
    assert q.trim(9_000) == 2  # units 0-7 point before position 9000; 8-11 do not all
    assert q.first() == 8 and len(q) == 18 and q[8].position == 8000
    with pytest.raises(IndexError):
        q[7]
    assert q[0:10] == [CQUnit(8000, 0, 10, 0, 8), CQUnit(9000, 0, 10, 0, 9)]
    assert q.trim(10**9) == 2  # never the file being written
    assert q.first() == 16
    again = FileQueues(str(tmp_path), units_per_file=4).restore(7, [18, q.crc])
    assert again.first() == 16 and len(again) == 18 and again[17].position == 17_000
    for i in range(18, 22):  # 18, 19 fill file 16; 20, 21 wait in memory for file 20
        q.append(1000 * i, 0, 10, 0, i)
    assert q.trim(10**9) == 0 and q.first() == 16
    store.flush()
    assert q.trim(10**9) == 1 and q.first() == 20


def _open_under(root: Path) -> set[str]:
    """The files under ``root`` this process holds open."""
    fds = "/proc/self/fd"
    paths = set()
    for name in os.listdir(fds):
        try:
            target = os.readlink(os.path.join(fds, name))
        except OSError:  # (the listing's own descriptor, closed since)
            continue
        if target.startswith(str(root) + os.sep):
            paths.add(target)
    return paths


def test_open_files_stay_within_the_bound_and_a_dropped_queues_are_closed(
        tmp_path: Path) -> None:
    store = FileQueues(str(tmp_path), units_per_file=2, fds_max=4)
    queues = [store.create(no) for no in range(3)]
    for q in queues:
        for i in range(6):  # three files each
            q.append(1000 * i, 0, 10, 0, i)
    store.flush()
    for q in queues:
        assert q[0:6] == [CQUnit(1000 * i, 0, 10, 0, i) for i in range(6)]
        assert len(_open_under(tmp_path)) <= 4
    last = queues[2]
    assert isinstance(last, FileConsumeQueue)
    assert {os.path.dirname(p) for p in _open_under(tmp_path)} >= {last.dir}
    store.drop(last)
    store.take_dropped()
    held = _open_under(tmp_path)
    assert held and all(os.path.dirname(p) != last.dir for p in held)
    assert queues[0][0:6] == [CQUnit(1000 * i, 0, 10, 0, i) for i in range(6)]  # reopened
    store.close()
    assert _open_under(tmp_path) == set()


def test_a_checkpoints_writes_go_in_a_thread_and_the_units_stay_readable_until_written(
        tmp_path: Path) -> None:
    """``sync_job`` copies the units in memory; until its job has written them (and
    ``written()`` ran on the loop) they stay in memory and read as before, while appends and a
    flush on the loop go on; a job that fails leaves them there for the next."""
    store = FileQueues(str(tmp_path), units_per_file=4)
    a, b = store.create(0), store.create(1)
    mem = {0: ConsumeQueue(), 1: ConsumeQueue()}

    def add(q: object, i: int) -> None:
        unit = _unit(i)
        for target in (q, mem[q.no]):  # type: ignore[attr-defined]
            target.append(unit.position, unit.slot, unit.size, unit.tag_hash,  # type: ignore[attr-defined]
                          unit.store_ts_ms)

    for i in range(6):  # a: a file and a half; b: one unit
        add(a, i)
    add(b, 0)
    sync = store.sync_job()
    assert [(os.path.basename(p), off, len(d) // UNIT_BYTES) for p, off, d in sync.writes] == [
        (f"{0:020d}", 0, 4), (f"{4:020d}", 0, 2), (f"{0:020d}", 0, 1)]
    assert os.listdir(a.dir) == []  # type: ignore[attr-defined]  # nothing written on the loop
    for i in range(6, 9):  # the loop goes on while the job runs: more units, and a flush of b
        add(a, i)
    add(b, 1)
    b.flush()  # type: ignore[attr-defined]
    assert list(a) == list(mem[0]) and list(b) == list(mem[1])
    sync()
    sync.written()
    assert store.dirty_bytes == 3 * UNIT_BYTES and list(store.dirty) == [0]  # a's 6..8 only
    assert list(a) == list(mem[0]) and list(b) == list(mem[1]) and a.crc == mem[0].crc
    assert os.path.getsize(os.path.join(a.dir, f"{4:020d}")) == 2 * UNIT_BYTES  # type: ignore[attr-defined]
    # a job that fails (the queue's directory gone) raises, and its units wait in memory
    for i in range(9, 12):
        add(a, i)
    failing = store.sync_job()
    os.rename(a.dir, a.dir + ".away")  # type: ignore[attr-defined]
    with pytest.raises(OSError):
        failing()
    failing.failed()
    os.rename(a.dir + ".away", a.dir)  # type: ignore[attr-defined]
    assert len(a) == 12 and store.dirty_bytes == 6 * UNIT_BYTES
    assert failing.paths and store.sync_job().paths == failing.paths  # owed to the next
    store.flush()
    assert list(a) == list(mem[0]) and store.dirty_bytes == 0
    again = FileQueues(str(tmp_path), units_per_file=4).restore(0, [12, a.crc])
    assert list(again) == list(mem[0])


def test_a_checkpoints_thread_holds_one_file_open_at_a_time(tmp_path: Path) -> None:
    """Thousands of dirty queues are written within a small open-file limit (the container's
    is 1024): the thread opens, writes, fsyncs and closes one file at a time."""
    store = FileQueues(str(tmp_path), fds_max=64)
    queues = [store.create(no) for no in range(300)]
    for q in queues:
        q.append(1, 0, 10, 0, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 100, hard))  # fewer than the queues
    try:
        sync = store.sync_job()
        sync()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    sync.written()
    assert store.dirty_bytes == 0 and all(len(q) == 1 for q in queues)
    assert all(os.path.getsize(os.path.join(q.dir, f"{0:020d}")) == UNIT_BYTES  # type: ignore[attr-defined]
               for q in queues)


def test_a_stop_during_a_checkpoint_waits_for_its_thread(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint cancelled by a stop lets its thread finish before it releases what the thread
    reads, and owes its files to the next checkpoint (which the stop then writes)."""
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                      data_dir=str(tmp_path), tick_interval_s=0.02)
    server = BrokerServer(BrokerConfig(node, admin_listen=None, checkpoint_interval_s=3600))
    entered, release = threading.Event(), threading.Event()
    real_save = checkpoint_module.save_checkpoint

    def slow_save(data_dir: str, view: object) -> None:
        entered.set()
        release.wait(30)
        real_save(data_dir, view)  # type: ignore[arg-type]

    async def run() -> None:
        await server.start()
        try:
            await wait_for(lambda: server.broker.node.is_leader, 10, "the node to lead")
            await server.broker.sends.send("t", 0, [[b"m", "", [], "K1", [], 0]])
            monkeypatch.setattr(checkpoint_module, "save_checkpoint", slow_save)
            write = asyncio.create_task(server.checkpoints.write())
            await wait_for(entered.is_set, 10, "the checkpoint's thread to start saving")
            write.cancel()
            await asyncio.wait([write], timeout=0.3)
            assert not write.done()  # (it waits for the thread, which waits for release)
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await write
            queues = server.broker.state.queue_store
            # owed to the next checkpoint: the units (still in memory) and the new file's directory
            assert queues.dirty_bytes > 0 and queues.created  # type: ignore[attr-defined]
            monkeypatch.setattr(checkpoint_module, "save_checkpoint", real_save)
            await server.checkpoints.write()
            assert queues.dirty_bytes == 0  # type: ignore[attr-defined]
        finally:
            release.set()
            await server.stop()

    asyncio.run(run())
    assert (tmp_path / CHECKPOINT_FILE).exists()
