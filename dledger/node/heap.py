"""Giving freed heap memory back to the system.

CPython frees objects into the C allocator, and glibc's ``malloc`` keeps freed memory inside its
heap unless it is at the top: a process that has passed tens of thousands of entries of tens of
kilobytes through its buffers keeps a resident heap well above what it holds. ``malloc_trim(0)``
returns the free pages (``madvise``) wherever they are in the heap. Called now and then (after a
checkpoint), it keeps a node's RSS near what it actually holds; it is a no-op where glibc is not
the allocator.

glibc also moves its threshold for serving a block from its own mapping up (to 32 MiB at most)
each time such a block is freed, after which large buffers that grow by copies (the dedup
table's rows, 10 MB at a million keys) are served from the heap and leave holes in it that no
trim returns. ``map_large_blocks`` fixes the threshold instead: every block of ``MMAP_BLOCK_BYTES``
or more gets a mapping of its own, given back whole when freed, while the smaller buffers of
the hot path (entries, frames, a pull's answer) stay on the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["MMAP_BLOCK_BYTES", "map_large_blocks", "release_free_heap"]

MMAP_BLOCK_BYTES = 4 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


def _libc(function: str) -> object:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _libc("malloc_trim")
_MALLOPT = _libc("mallopt")


def map_large_blocks(block_bytes: int = MMAP_BLOCK_BYTES) -> bool:
    """Serve every block of ``block_bytes`` or more from a mapping of its own, for good (see the
    module docstring); whether the allocator took it (False if unsupported)."""
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(_M_MMAP_THRESHOLD, block_bytes))  # type: ignore[operator]


def release_free_heap() -> bool:
    """Return the heap's free pages to the system; whether any were (False if unsupported)."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))  # type: ignore[operator]
