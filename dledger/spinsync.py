"""An fdatasync that the calling thread waits for without letting its CPU go idle.

Owns one Linux AIO context and one eventfd. ``SpinSync.fdatasync(fd)`` submits an
``IOCB_CMD_FDSYNC`` request (the kernel runs the same ``vfs_fsync(file, datasync=1)`` as
``os.fdatasync``, in a kernel worker on this CPU) and then polls the eventfd that the completion
bumps, yielding the CPU between polls, for at most ``spin_s``; after that it sleeps on the eventfd
as a plain fdatasync would. The result, an error included, is the kernel's fsync result.

Why: on virtual machines whose idle vCPUs halt at once (no guest halt polling), a thread that
blocks in fdatasync lets its vCPU halt, and the disk's completion must then wake it through the
hypervisor. Measured on the 2-core box, keeping the vCPU running took a lone ``sync`` proposal's
commit from about 0.34 to 0.29 ms (README, ``--busy-poll-us``). The price is the CPU of the wait: it is
used only where the node was told to trade CPU for latency (``--busy-poll-us``), for the group
commits the loop thread runs inline.

A Python thread cannot do this job: a thread blocked in fdatasync must take the GIL back from the
polling loop, which may keep it for a switch interval (5 ms). The kernel worker needs no GIL.

Must not: be used from two threads at once or with two requests in flight (one iocb, one event).
Linux on x86_64 or aarch64 only; ``open_spin_sync`` returns None elsewhere, or where the kernel
refuses an AIO context, and the caller uses ``os.fdatasync``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import sys
import time

__all__ = ["SpinSync", "open_spin_sync"]

# System call numbers (io_setup, io_destroy, io_submit, io_getevents) per machine.
_SYSCALLS = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4)}
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1


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


class SpinSync:
    """One AIO context and eventfd; see the module docstring. Build with ``open_spin_sync``."""

    def __init__(self, libc: ctypes.CDLL, numbers: tuple[int, int, int, int], spin_s: float) -> None:
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._setup, self._destroy, self._submit, self._getevents = numbers
        self.spin_s = spin_s
        self.completed = 0  # requests that completed through the AIO context
        self.fallbacks = 0  # requests the kernel would not take, done by os.fdatasync instead
        self._ctx = ctypes.c_ulong(0)
        if self._syscall(self._setup, ctypes.c_long(1), ctypes.byref(self._ctx)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_setup: {os.strerror(err)}")
        try:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            self._syscall(self._destroy, self._ctx)
            raise
        self._iocb = _Iocb(aio_lio_opcode=_IOCB_CMD_FDSYNC, aio_flags=_IOCB_FLAG_RESFD,
                           aio_resfd=self._efd)
        self._iocbs = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(self._iocb))
        self._event = (_IoEvent * 1)()
        self._poller = select.poll()
        self._poller.register(self._efd, select.POLLIN)
        self._closed = False

    def fdatasync(self, fd: int) -> None:
        """``os.fdatasync(fd)``, waited for by polling for up to ``spin_s`` (then sleeping)."""
        if self._closed:
            raise ValueError("SpinSync is closed")
        self._iocb.aio_fildes = fd
        if self._syscall(self._submit, self._ctx, ctypes.c_long(1), self._iocbs) != 1:
            # Refused at submission (e.g. EINVAL for a file without fsync, EAGAIN): nothing is in
            # flight, so the plain call does the same work and raises the same errors.
            self.fallbacks += 1
            os.fdatasync(fd)
            return
        self._wait()
        os.eventfd_read(self._efd)
        if self._syscall(self._getevents, self._ctx, ctypes.c_long(1), ctypes.c_long(1), self._event,
                         None) != 1:
            err = ctypes.get_errno()
            raise OSError(err, f"io_getevents: {os.strerror(err)}")
        self.completed += 1
        res = self._event[0].res
        if res < 0:
            raise OSError(-res, os.strerror(-res))

    def _wait(self) -> None:
        poll, yield_cpu = self._poller.poll, os.sched_yield
        deadline = time.perf_counter() + self.spin_s
        while not poll(0):
            if time.perf_counter() >= deadline:
                while not poll(None):  # a slow disk: sleep like fdatasync (EINTR is retried)
                    pass
                return
            yield_cpu()  # the kernel worker that runs the fsync may need this very CPU

    def close(self) -> None:
        """Release the context and the eventfd (nothing may be in flight: ``fdatasync`` waits)."""
        if self._closed:
            return
        self._closed = True
        self._syscall(self._destroy, self._ctx)
        os.close(self._efd)


def open_spin_sync(spin_s: float, machine: str | None = None) -> SpinSync | None:
    """A SpinSync for this machine, or None where it is not available (then use os.fdatasync)."""
    if spin_s < 0:
        raise ValueError(f"spin_s must be >= 0, not {spin_s}")
    numbers = _SYSCALLS.get(machine if machine is not None else platform.machine())
    if not sys.platform.startswith("linux") or numbers is None or sys.byteorder != "little":
        return None
    try:
        return SpinSync(ctypes.CDLL(None, use_errno=True), numbers, spin_s)
    except (OSError, AttributeError):  # no AIO in this kernel or sandbox, or no eventfd
        return None
