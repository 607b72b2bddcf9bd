"""The C heap's thresholds and arenas for the processes that stream pack bytes (issue 25).

A clone passes every byte of a pack through a compute and a gitproto in pieces of
256 to 512 KiB: a piece, its side-band frames, its gRPC message, its HTTP chunk,
each a fresh buffer freed soon after. glibc's malloc serves a block over its mmap
threshold (128 KiB at the start, raised by each mmapped block freed) with a fresh
mapping, and gives the top of a heap back (``brk``, or ``madvise`` for a thread's
arena) once more than its trim threshold is free there; the next piece faults the
same pages in again, zero-filled by the kernel. Measured on a 267 MiB clone of the
``large`` profile (docs/serving.md): page faults, ``munmap`` and ``madvise`` were
about a fifth of the pack writer thread's CPU, and fixed thresholds
(``heap_mmap_threshold_bytes``, ``heap_trim_threshold_bytes``) cut the compute's
CPU per clone by 15% and gitproto's by 22%, for about 20 MiB more kept by gitproto.

``mallopt`` is glibc's; on another C library (or when both limits are 0) nothing
changes and the caller is told so. So is ``malloc_trim``, which gives the free pages of
every heap back, not only a heap's top: a ledger voter calls it once idle after a burst
(``enroute_ledger.heaptrim``, issue 19).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

from enroute_core.base.limits import Limits

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def tune_heap(limits: Limits) -> bool:
    """Fix glibc's mmap and trim thresholds and its arena count at ``limits``' values (0
    leaves one as glibc sets it); True when all were applied. Call it once, before the
    process starts its threads (a thread keeps the arena it took); a value glibc
    refuses is logged and left as it was.

    Arenas (``heap_arenas_max``, glibc's own count by default): a thread that finds the
    arenas busy takes a new one, up to 8 per core, and every arena keeps its free pages
    and up to the trim threshold at its top around what threads leave alive (a view a
    worker built). Two arenas left the compute 92-116 MiB resident after the `large`
    profile's push where glibc's count left 136-145 MiB, but a large clone's writer and
    gRPC threads then waited on each other's arenas: the compute's CPU per clone
    0.72 -> 0.78 s and gitproto's 0.39 -> 0.41 (five clones each, issue 25,
    docs/ingest.md "Memory"). The push's peak no longer needs it."""
    wanted = [
        (M_MMAP_THRESHOLD, "heap_mmap_threshold_bytes", limits.heap_mmap_threshold_bytes),
        (M_TRIM_THRESHOLD, "heap_trim_threshold_bytes", limits.heap_trim_threshold_bytes),
        (M_ARENA_MAX, "heap_arenas_max", limits.heap_arenas_max),
    ]
    wanted = [w for w in wanted if w[2] > 0]
    if not wanted:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or None).mallopt
    except (OSError, AttributeError):
        log.info("no mallopt in this C library: the heap keeps its own thresholds")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = True
    for param, name, value in wanted:
        if mallopt(param, value) != 1:
            log.warning("mallopt refused %s = %d; the heap keeps its own threshold", name, value)
            applied = False
    return applied


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` (free pages of every arena back to the system, by
    ``madvise``), or None in a C library without it."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


_TRIM = malloc_trim()


def trim_free_heap() -> None:
    """``malloc_trim(0)`` now, unmeasured (nothing in a C library without it): for a
    step of a request, where reading the resident set twice would be work for nothing."""
    if _TRIM is not None:
        _TRIM()


def release_free_heap() -> int | None:
    """``malloc_trim(0)`` now; answers the resident bytes it gave back (``/proc/self/statm``
    before and after), or None in a C library without it. A compute calls it when
    eviction leaves no view open (``RepositoryHost``, issue 19)."""
    if _TRIM is None:
        return None
    before = resident_bytes()
    _TRIM()
    return max(0, before - resident_bytes())


def resident_bytes() -> int:
    """The resident set (``/proc/self/statm``), 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
