"""The process's allocator, tuned so freed training memory goes back to the OS.

torch's CPU tensors come from glibc malloc. By default glibc serves a block from the heap of the
allocating thread's arena unless it is above a *dynamic* mmap threshold, which rises to the size
of every mmapped block freed (up to 32 MiB). After a few frees, every tensor of a 1024-wide GPT
(4–16 MiB) lives on an arena heap: freeing it returns nothing to the OS, and memory freed in one
thread's arena (a verification worker's replay) is not reused by another's (the aggregation on the
main thread), so a node's peak RSS becomes the sum of its phases' peaks instead of their maximum.
A fixed threshold (which also turns the dynamic one off) puts every block of at least
`MMAP_THRESHOLD` in its own mapping, unmapped on free. Measured in bench.scale's per-phase peaks.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys

MMAP_THRESHOLD = 1 << 20
"""Blocks of at least 1 MiB are mapped on their own: every tensor that matters at scale."""
_M_MMAP_THRESHOLD = -3  # glibc malloc.h


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (no-op elsewhere). Returns whether it was applied. Changes where
    memory comes from, never what is computed: no effect on any hash or trajectory."""
    libc = _libc()
    if libc is None:
        return False
    with contextlib.suppress(OSError, AttributeError):
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    return False


def release() -> None:
    """After a large free (a step's optimizer, the running sum of an aggregation): collect cycles and
    give the heaps' free tops back to the OS (`malloc_trim`)."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(OSError, AttributeError):
            libc.malloc_trim(0)
