"""Giving freed heap memory back to the system.

CPython frees objects into the C allocator, and glibc's ``malloc`` keeps freed memory inside its
heap unless it is at the top: a process that has passed tens of thousands of entries of tens of
kilobytes through its buffers keeps a resident heap well above what it holds. ``malloc_trim(0)``
returns the free pages (``madvise``) wherever they are in the heap. Called now and then (after a
checkpoint), it keeps a node's RSS near what it actually holds; it is a no-op where glibc is not
the allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["release_free_heap"]


def _trim() -> object:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _trim()


def release_free_heap() -> bool:
    """Return the heap's free pages to the system; whether any were (False if unsupported)."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))  # type: ignore[operator]
