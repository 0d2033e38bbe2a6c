"""The spin-waited fdatasync (dledger.spinsync): it completes through the kernel's AIO context,
reports the kernel's errors as OSError like os.fdatasync, falls back where the kernel refuses a
request, and is absent (None) where it cannot work. A node told to busy-poll uses it for its
inline group commits."""

from __future__ import annotations

import asyncio
import errno
import os
import platform
import sys
from pathlib import Path

import pytest

from dledger.spinsync import SpinSync, open_spin_sync
from tests.test_runtime import configs, leader_of, running

SUPPORTED = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64")
needs_aio = pytest.mark.skipif(not SUPPORTED, reason="Linux AIO on x86_64 or aarch64 only")


@pytest.fixture
def spin() -> SpinSync:
    s = open_spin_sync(300e-6)
    assert s is not None, "no AIO context on a supported machine"
    yield s
    s.close()


@needs_aio
@pytest.mark.parametrize("spin_s", [0.0, 300e-6, 0.05])
def test_an_fdatasync_completes_through_the_aio_context(tmp_path: Path, spin_s: float) -> None:
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
def test_a_closed_spin_sync_refuses_work_and_closes_once(tmp_path: Path) -> None:
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


@needs_aio
def test_a_busy_polling_group_waits_for_its_inline_group_commits_by_spinning(tmp_path: Path) -> None:
    async def run() -> None:
        async with running(configs(tmp_path, busy_poll_us=300)) as nodes:
            leader = leader_of(nodes)
            before = {n.config.node_id: n._flusher().spin.completed for n in nodes}
            for k in range(10):  # one at a time: each one a lone entry, synced inline
                await leader.propose(b"p%d" % k)
            after = {n.config.node_id: n._flusher().spin.completed for n in nodes}
            assert all(after[k] > before[k] for k in after), (before, after)
        async with running(configs(tmp_path / "plain")) as nodes:
            assert all(n._flusher().spin is None for n in nodes)

    asyncio.run(run())
