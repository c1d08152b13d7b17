"""Handing the heap memory freed after a burst of series back to the OS (glibc's ``mallopt``, ``malloc_trim``).

The exposition reader calls :func:`release_freed_memory` when a read begins after a burst ended or a
large cache was dropped; elsewhere than on glibc nothing is done.
"""

from __future__ import annotations

import ctypes
import platform
import sys

# glibc's mallopt(3) parameters (malloc.h) and the values they are fixed at: glibc's own defaults
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MALLOC_MMAP_THRESHOLD_BYTES = 128 * 1024  # larger buffers get their own mapping, unmapped when freed
MALLOC_TRIM_THRESHOLD_BYTES = 128 * 1024  # free memory above this at the top of a heap is returned at once
_glibc: ctypes.CDLL | None = None
_glibc_looked_up = False


def release_freed_memory() -> bool:
    """Hand the heap memory freed after a burst of series back to the OS; True if that could be asked (glibc).

    glibc keeps freed memory for reuse, and once a buffer over its mmap threshold (128 KiB) is freed —
    a held exposition body is megabytes — it raises that threshold to the buffer's size and its trim
    threshold to twice that: later large buffers come from its heaps, up to that much free memory stays
    at the top of each heap (one per thread that allocates), and ``malloc_trim`` does not shrink the
    heaps of threads other than the main one. So the agent's RSS stays where a burst took it. The first
    call fixes both thresholds at glibc's defaults (``mallopt``, which also stops them rising); every call
    returns the free pages (``malloc_trim(0)``, a few milliseconds). Called when a read begins after a
    burst ended or a large cache was dropped (:class:`ExpositionReader`). Elsewhere (musl, macOS) nothing
    is done.
    """
    global _glibc, _glibc_looked_up
    if not _glibc_looked_up:
        _glibc_looked_up = True
        if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
            try:
                libc = ctypes.CDLL(None)
                libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES)
                libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES)
                _glibc = libc
            except (OSError, AttributeError):
                _glibc = None
    if _glibc is None:
        return False
    _glibc.malloc_trim(0)
    return True
