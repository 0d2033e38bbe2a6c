"""fsync through Linux AIO (dledger.storage.aiofsync): requests complete through the kernel's AIO
context, waited for by polling (SpinSync) or by the event loop (AioFsync); the kernel's errors
arrive as OSError like the plain calls'; a refused request falls back to the plain call; both
are absent (None) where they cannot work. A node uses them for its group commits."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.raft.types import Entry, EntryKind
from dledger.storage.aiofsync import (
    _IOCB_CMD_FDSYNC,
    AioFsync,
    SpinSync,
    _Pending,
    _result,
    open_aio_fsync,
    open_spin_sync,
)
from dledger.storage.commitlog import FileLogStore
from dledger.storage.flush import Flusher
from protocol.errors import StorageError
from tests.log.test_runtime import configs, leader_of, running, wait_for

SUPPORTED = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64")
needs_aio = pytest.mark.skipif(not SUPPORTED, reason="Linux AIO on x86_64 or aarch64 only")


@pytest.fixture
def spin() -> Iterator[SpinSync]:
    s = open_spin_sync(300e-6)
    assert s is not None, "no AIO context on a supported machine"
    yield s
    s.close()


@contextlib.contextmanager
def aio_fsync() -> Iterator[AioFsync]:
    """An AioFsync on the running loop, closed on the way out."""
    aio = open_aio_fsync()
    assert aio is not None, "no AIO context on a supported machine"
    try:
        yield aio
    finally:
        aio.close()


def _written_file(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    os.pwrite(fd, b"entry", 0)
    return fd


# -- SpinSync -----------------------------------------------------------------------------------


@needs_aio
@pytest.mark.parametrize("spin_s", [0.0, 300e-6, 0.05])
def test_a_spin_waited_fdatasync_completes_through_the_aio_context(tmp_path: Path,
                                                                   spin_s: float) -> None:
    s = open_spin_sync(spin_s)
    assert s is not None
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        for k in range(20):
            os.pwrite(fd, b"entry %d" % k, 16 * k)
            s.fdatasync(fd)
        assert (s.completed, s.fallbacks) == (20, 0)
        assert os.pread(fd, 7, 16 * 19) == b"entry 1"
    finally:
        os.close(fd)
        s.close()


@needs_aio
def test_a_file_without_fsync_is_refused_as_fdatasync_refuses_it(spin: SpinSync) -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(OSError) as got:
            spin.fdatasync(r)
        with pytest.raises(OSError) as plain:
            os.fdatasync(r)
        assert got.value.errno == plain.value.errno == errno.EINVAL
        assert spin.fallbacks == 1 and spin.completed == 0
    finally:
        os.close(r)
        os.close(w)


@needs_aio
def test_a_closed_descriptor_is_a_named_os_error(tmp_path: Path, spin: SpinSync) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    with pytest.raises(OSError) as got:
        spin.fdatasync(fd)
    assert got.value.errno == errno.EBADF


@needs_aio
def test_a_spin_wait_ends_only_with_its_own_completion(tmp_path: Path, spin: SpinSync) -> None:
    """A request whose wait was interrupted (KeyboardInterrupt, say) leaves its completion in
    the context; a later fdatasync must not take it for its own."""
    fd = _written_file(tmp_path / "f")
    try:
        orphan = spin._ctx.iocb(fd, _IOCB_CMD_FDSYNC, 10**9)  # as if its waiter had gone
        assert spin._ctx.submit_one(orphan)
        calls = 0
        while spin.stale == 0 and calls < 200:
            spin.fdatasync(fd)
            calls += 1
        assert (spin.stale, spin.completed) == (1, calls)
    finally:
        os.close(fd)


def test_a_negative_completion_result_is_that_errno() -> None:
    with pytest.raises(OSError) as got:
        _result(-errno.EIO)
    assert got.value.errno == errno.EIO
    _result(0)


def test_a_pending_request_fails_with_its_first_error_and_tells_on_error_even_unwaited() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        heard: list[OSError] = []
        p = _Pending(loop.create_future(), heard.append)
        p.submitted()
        p.submitted()
        p.future.cancel()  # the waiter went away
        assert not p.completed(-errno.EIO)
        assert p.completed(-errno.ENOSPC)
        p.settle()
        assert [e.errno for e in heard] == [errno.EIO]  # the first error, heard all the same
        ok = _Pending(loop.create_future(), heard.append)
        ok.submitted()
        assert ok.completed(0)
        ok.settle()
        assert ok.future.result() is None and len(heard) == 1

    asyncio.run(run())


@needs_aio
def test_a_closed_spin_sync_refuses_work_and_closes_once() -> None:
    s = open_spin_sync(0.0)
    assert s is not None
    s.close()
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.fdatasync(0)


def test_none_where_it_cannot_work_and_a_negative_spin_is_refused() -> None:
    assert open_spin_sync(0.001, machine="sparc64") is None
    with pytest.raises(ValueError, match="spin_s"):
        open_spin_sync(-1.0)

    async def run() -> None:
        assert open_aio_fsync(machine="sparc64") is None

    asyncio.run(run())


# -- AioFsync -----------------------------------------------------------------------------------


@needs_aio
def test_the_loop_delivers_completions_of_several_files_and_a_directory(tmp_path: Path) -> None:
    async def run() -> None:
        fds = [_written_file(tmp_path / f"f{k}") for k in range(3)]
        dir_fd = os.open(tmp_path, os.O_RDONLY)
        with aio_fsync() as aio:
            first = aio.sync(fds, dir_fd)
            second = aio.sync(fds[:1])  # two requests in flight at once
            assert aio.in_flight == 2
            await asyncio.wait_for(asyncio.gather(first, second), 10)
            assert (aio.completed, aio.fallbacks, aio.in_flight) == (5, 0, 0)
        for fd in (*fds, dir_fd):
            os.close(fd)

    asyncio.run(run())


@needs_aio
def test_a_refused_request_fails_its_future_with_the_plain_calls_error(tmp_path: Path) -> None:
    async def run() -> None:
        r, w = os.pipe()
        good = _written_file(tmp_path / "f")
        with aio_fsync() as aio:
            with pytest.raises(OSError) as got:
                await asyncio.wait_for(aio.sync([good, r]), 10)  # one in flight, one refused
            assert got.value.errno == errno.EINVAL
            assert (aio.completed, aio.fallbacks, aio.in_flight) == (1, 1, 0)
        for fd in (r, w, good):
            os.close(fd)

    asyncio.run(run())


@needs_aio
def test_a_waiter_that_went_away_and_a_close_with_requests_in_flight(tmp_path: Path) -> None:
    async def run() -> None:
        fd = _written_file(tmp_path / "f")
        with aio_fsync() as aio:
            gone = aio.sync([fd])
            gone.cancel()  # its fsync still runs; the completion finds no one waiting
            await asyncio.wait_for(aio.sync([fd]), 10)
            await wait_for(lambda: aio.in_flight == 0, 10, "the cancelled request to complete")
            assert aio.completed == 2
            left = aio.sync([fd])
            aio.close()  # the kernel finishes the request; its waiter is told it is over
            assert left.cancelled() and aio.in_flight == 0
            with pytest.raises(ValueError, match="closed"):
                aio.sync([fd])
        os.close(fd)

    asyncio.run(run())


# -- in the flusher and the node ----------------------------------------------------------------


@needs_aio
@pytest.mark.parametrize("path", ["aio", "thread"])
@pytest.mark.parametrize("commit", ["background", "awaited"])
def test_a_failed_fsync_stops_the_store_on_either_path(tmp_path: Path, path: str,
                                                       commit: str) -> None:
    async def run() -> None:
        store = FileLogStore.open(tmp_path)
        failures: list[BaseException] = []
        aio = open_aio_fsync() if path == "aio" else None
        flusher = Flusher(store, lambda: None, failures.append, aio=aio)
        store.append([Entry(1, 1, EntryKind.NORMAL, b"a")])
        os.close(store.sync_begin().fds[0])  # the data file's descriptor goes bad behind it
        if commit == "background":
            flusher.sync_in_background((1, 1, 0))
            await flusher.quiesce()
            assert [type(e) for e in failures] == [StorageError]
            assert "syncing" in str(failures[0]) and flusher.take_durable() == []
        else:
            with pytest.raises(StorageError, match="syncing"):
                await flusher.sync_awaited()
        with pytest.raises(StorageError, match="reopen"):
            store.append([Entry(2, 1, EntryKind.NORMAL, b"b")])
        await flusher.close()

    asyncio.run(run())


@needs_aio
def test_a_group_syncs_through_aio_and_spins_for_inline_commits(tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path, busy_poll_us=300)) as nodes:
            leader = leader_of(nodes)
            flushers = [n._flusher() for n in nodes]
            before = [(f.spin.completed, f.aio.completed) for f in flushers]
            for k in range(10):  # one at a time: each a lone entry, synced inline, spinning
                await leader.propose(b"p%d" % k)
            for _ in range(5):  # bursts: the leader's background commits through AIO, the
                # followers' inline with a plain fdatasync (their answers wait for it anyway)
                await asyncio.gather(*(leader.propose(b"b%d" % k) for k in range(50)))
            after = [(f.spin.completed, f.aio.completed) for f in flushers]
            assert all(a[0] > b[0] for a, b in zip(after, before)), (before, after)
            for node, a, b in zip(nodes, after, before):
                assert (a[1] > b[1]) == (node is leader), (before, after)
        async with running(configs(tmp_path / "plain", aio_fsync=False)) as nodes:
            assert all(n._flusher().spin is None and n._flusher().aio is None for n in nodes)
            done = await asyncio.gather(*(leader_of(nodes).propose(b"t%d" % k) for k in range(50)))
            assert len({c.index for c in done}) == 50  # committed through the fsync thread

    asyncio.run(run())
