"""fsync through Linux AIO: the kernel runs each request in one of its workers (the same
``vfs_fsync`` as ``os.fsync``/``os.fdatasync``, with the same durability), so the caller never
blocks in the system call and no Python thread, nor the GIL, is involved.

Owns AIO contexts and their eventfds. Two ways to wait for a request:
- ``SpinSync.fdatasync(fd)``: the calling thread polls the eventfd, yielding the CPU between
  polls, for up to ``spin_s``; then it sleeps on it as a plain fdatasync would. For the group
  commits a node runs inline when told to trade CPU for latency (``--busy-poll-us``): on virtual
  machines whose idle vCPUs halt at once, a thread blocked in fdatasync lets its vCPU halt and
  the disk's completion must wake it through the hypervisor, tens of microseconds.
- ``AioFsync.sync(fds, dir_fd)``: an asyncio future that the event loop resolves when the
  eventfd it watches says the requests completed. For the group commits that ran on the fsync
  thread. Measured on the 2-core box, per fsync of a 1,100-byte write: through a thread pool
  (``run_in_executor``) p50 178-247 us and 119-155 us of the process's CPU; through AIO with the
  loop watching, 130-195 us and 27-35 us; inline, 125-135 us and 62 us. A thread must also take
  the GIL back from a polling loop, which may keep it for a switch interval (5 ms).

A request the kernel refuses at submission (nothing is then in flight) is done by the plain
call instead, which does the same work and raises the same errors; ``fallbacks`` counts them.

Must not: share one object between threads. Linux on x86_64 or aarch64 only; the ``open_*``
functions return None elsewhere, or where the kernel refuses an AIO context, and the caller
uses the plain calls.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
import select
import sys
import time
from collections.abc import Callable, Sequence

__all__ = ["AioFsync", "SpinSync", "open_aio_fsync", "open_spin_sync"]

# System call numbers (io_setup, io_destroy, io_submit, io_getevents) per machine.
_SYSCALLS = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4)}
_IOCB_CMD_FSYNC = 2
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1
_REAP_BATCH = 16


class _Iocb(ctypes.Structure):  # struct iocb of linux/aio_abi.h, little-endian
    _fields_ = [("aio_data", ctypes.c_uint64), ("aio_key", ctypes.c_uint32),
                ("aio_rw_flags", ctypes.c_int32), ("aio_lio_opcode", ctypes.c_uint16),
                ("aio_reqprio", ctypes.c_int16), ("aio_fildes", ctypes.c_uint32),
                ("aio_buf", ctypes.c_uint64), ("aio_nbytes", ctypes.c_uint64),
                ("aio_offset", ctypes.c_int64), ("aio_reserved2", ctypes.c_uint64),
                ("aio_flags", ctypes.c_uint32), ("aio_resfd", ctypes.c_uint32)]


class _IoEvent(ctypes.Structure):  # struct io_event
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64), ("res", ctypes.c_int64),
                ("res2", ctypes.c_int64)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Context:
    """One AIO context and the eventfd its completions bump."""

    def __init__(self, numbers: tuple[int, int, int, int], nr_events: int) -> None:
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        self._syscall.restype = ctypes.c_long
        self._setup, self._destroy, self._submit, self._getevents = numbers
        self._ctx = ctypes.c_ulong(0)
        if self._syscall(self._setup, ctypes.c_long(nr_events), ctypes.byref(self._ctx)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_setup: {os.strerror(err)}")
        try:
            self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            self._syscall(self._destroy, self._ctx)
            raise
        self._events = (_IoEvent * _REAP_BATCH)()
        self._no_wait = _Timespec(0, 0)
        self.closed = False

    def iocb(self, fd: int, opcode: int, request_id: int) -> _Iocb:
        return _Iocb(aio_data=request_id, aio_lio_opcode=opcode, aio_fildes=fd,
                     aio_flags=_IOCB_FLAG_RESFD, aio_resfd=self.efd)

    def submit_one(self, iocb: _Iocb) -> bool:
        """Submit one request (the caller keeps ``iocb`` alive until it completes); False if
        the kernel refused it, and then nothing is in flight."""
        ptrs = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(iocb))
        submitted: int = self._syscall(self._submit, self._ctx, ctypes.c_long(1), ptrs)
        return submitted == 1

    def reap(self) -> list[tuple[int, int]]:
        """The completions ready now, as (request id, result), without waiting."""
        done: list[tuple[int, int]] = []
        while True:
            got = self._syscall(self._getevents, self._ctx, ctypes.c_long(0),
                                ctypes.c_long(_REAP_BATCH), self._events,
                                ctypes.byref(self._no_wait))
            if got < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"io_getevents: {os.strerror(err)}")
            done += [(self._events[i].data, self._events[i].res) for i in range(got)]
            if got < _REAP_BATCH:
                return done

    def close(self) -> None:
        """Release the context (the kernel waits for requests in flight) and the eventfd."""
        if not self.closed:
            self.closed = True
            self._syscall(self._destroy, self._ctx)
            os.close(self.efd)


def _error(res: int) -> OSError | None:
    """The error an AIO completion's result stands for (a negative errno), if any."""
    return OSError(-res, os.strerror(-res)) if res < 0 else None


def _result(res: int) -> None:
    err = _error(res)
    if err is not None:
        raise err


class _Pending:
    """One AioFsync request: how many iocbs are still in flight, the first error, who hears of
    it. (The kernel copies an iocb when it is submitted, so none needs keeping.)"""

    __slots__ = ("future", "on_error", "outstanding", "error")

    def __init__(self, future: asyncio.Future[None],
                 on_error: Callable[[OSError], object] | None) -> None:
        self.future = future
        self.on_error = on_error
        self.outstanding = 0
        self.error: OSError | None = None

    def submitted(self) -> None:
        self.outstanding += 1

    def failed(self, err: OSError) -> None:
        self.error = self.error or err

    def completed(self, res: int) -> bool:
        """One iocb completed with ``res``; True once none is outstanding."""
        self.outstanding -= 1
        err = _error(res)
        if err is not None:
            self.failed(err)
        return self.outstanding == 0

    def settle(self) -> None:
        if self.error is not None and self.on_error is not None:
            self.on_error(self.error)  # whether or not anyone still waits
        if self.future.done():
            return  # the waiter went away (cancelled); the fsync itself still ran
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(None)


class SpinSync:
    """A spin-waited fdatasync (see the module docstring). Build with ``open_spin_sync``."""

    def __init__(self, ctx: _Context, spin_s: float) -> None:
        self._ctx = ctx
        self.spin_s = spin_s
        self.completed = 0  # requests that completed through the AIO context
        self.fallbacks = 0  # requests the kernel would not take, done by os.fdatasync instead
        self.stale = 0  # completions of requests whose wait was interrupted, dropped when seen
        self._poller = select.poll()
        self._poller.register(ctx.efd, select.POLLIN)
        self._next_id = 1

    def fdatasync(self, fd: int) -> None:
        """``os.fdatasync(fd)``, waited for by polling for up to ``spin_s`` (then sleeping)."""
        if self._ctx.closed:
            raise ValueError("SpinSync is closed")
        rid, self._next_id = self._next_id, self._next_id + 1
        iocb = self._ctx.iocb(fd, _IOCB_CMD_FDSYNC, rid)
        if not self._ctx.submit_one(iocb):
            self.fallbacks += 1
            os.fdatasync(fd)
            return
        deadline = time.perf_counter() + self.spin_s
        while True:
            # A wait interrupted earlier (KeyboardInterrupt, say) leaves its completion behind:
            # only this request's own completion ends this wait.
            self._wait(deadline)
            try:
                os.eventfd_read(self._ctx.efd)
            except BlockingIOError:
                continue
            own = None
            for got_id, res in self._ctx.reap():
                if got_id == rid:
                    own = res
                else:
                    self.stale += 1
            if own is not None:
                self.completed += 1
                _result(own)
                return

    def _wait(self, deadline: float) -> None:
        poll, yield_cpu = self._poller.poll, os.sched_yield
        while not poll(0):
            if time.perf_counter() >= deadline:
                while not poll(None):  # a slow disk: sleep like fdatasync (EINTR is retried)
                    pass
                return
            yield_cpu()  # the kernel worker that runs the fsync may need this very CPU

    def close(self) -> None:
        self._ctx.close()


class AioFsync:
    """fsyncs whose completions the running event loop delivers (see the module docstring).
    Build with ``open_aio_fsync`` inside the loop; ``close`` before the loop ends."""

    def __init__(self, ctx: _Context, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self.completed = 0  # requests that completed through the AIO context
        self.fallbacks = 0  # requests the kernel would not take, done by the plain call
        self._waiting: dict[int, _Pending] = {}  # request id -> what it waits for
        self._next_id = 1
        loop.add_reader(ctx.efd, self._on_completions)

    def sync(self, fds: Sequence[int], dir_fd: int | None = None,
             on_error: Callable[[OSError], object] | None = None) -> asyncio.Future[None]:
        """fdatasync every fd of ``fds`` and fsync ``dir_fd`` (a directory), all at once; the
        future ends when all are done, with the first error if any failed (OSError).
        ``on_error`` hears that error even when no one waits for the future any more."""
        if self._ctx.closed:
            raise ValueError("AioFsync is closed")
        pending = _Pending(self._loop.create_future(), on_error)
        rid, self._next_id = self._next_id, self._next_id + 1
        work = [(fd, _IOCB_CMD_FDSYNC) for fd in fds]
        if dir_fd is not None:
            work.append((dir_fd, _IOCB_CMD_FSYNC))
        for fd, opcode in work:
            if self._ctx.submit_one(self._ctx.iocb(fd, opcode, rid)):
                pending.submitted()
                continue
            self.fallbacks += 1
            try:
                (os.fsync if opcode == _IOCB_CMD_FSYNC else os.fdatasync)(fd)
            except OSError as err:
                pending.failed(err)
        if pending.outstanding:
            self._waiting[rid] = pending
        else:
            pending.settle()
        return pending.future

    def _on_completions(self) -> None:
        try:
            os.eventfd_read(self._ctx.efd)
        except BlockingIOError:  # already reaped with an earlier wake-up
            return
        for rid, res in self._ctx.reap():
            pending = self._waiting.get(rid)
            if pending is None:
                continue
            self.completed += 1
            if pending.completed(res):
                del self._waiting[rid]
                pending.settle()

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    def close(self) -> None:
        """Stop watching and release the context; the kernel first finishes what is in flight,
        and the futures still waiting are cancelled."""
        if self._ctx.closed:
            return
        self._loop.remove_reader(self._ctx.efd)
        self._ctx.close()
        for pending in self._waiting.values():
            pending.future.cancel()
        self._waiting.clear()


def _context(machine: str | None, nr_events: int) -> _Context | None:
    numbers = _SYSCALLS.get(machine if machine is not None else platform.machine())
    if (not sys.platform.startswith("linux") or numbers is None or sys.byteorder != "little"
            or ctypes.sizeof(ctypes.c_void_p) != 8):  # (a 32-bit Python on a 64-bit kernel)
        return None
    try:
        return _Context(numbers, nr_events)
    except (OSError, AttributeError):  # no AIO in this kernel or sandbox, or no eventfd
        return None


def open_spin_sync(spin_s: float, machine: str | None = None) -> SpinSync | None:
    """A SpinSync for this machine, or None where it is not available (use os.fdatasync)."""
    if spin_s < 0:
        raise ValueError(f"spin_s must be >= 0, not {spin_s}")
    ctx = _context(machine, 1)
    return SpinSync(ctx, spin_s) if ctx is not None else None


def open_aio_fsync(machine: str | None = None, nr_events: int = 64) -> AioFsync | None:
    """An AioFsync on the running loop, or None where it is not available (use a thread)."""
    loop = asyncio.get_running_loop()
    ctx = _context(machine, nr_events)
    return AioFsync(ctx, loop) if ctx is not None else None
