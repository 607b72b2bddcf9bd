"""The C heap's fixed thresholds (storage/heap.py; issue 25, docs/serving.md).

A process that allocates and frees pack pieces of a MiB or so must not fault the
same pages in again for every piece: with glibc's own thresholds a freed 8 MiB
burst goes back to the kernel (mmap per block, then the heap's top trimmed), with
the fixed ones it stays for the next burst. Each case runs in a fresh interpreter
(the thresholds are process-wide); glibc's mallopt is the real one (malloc.h,
M_MMAP_THRESHOLD / M_TRIM_THRESHOLD / M_ARENA_MAX).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from enroute_core.base.limits import Limits
from enroute_core.storage.heap import tune_heap

_BURSTS = """
import resource, sys
from enroute_core.base.limits import Limits
from enroute_core.storage.heap import tune_heap
tuned = sys.argv[1] == "tuned"
limits = Limits() if tuned else Limits(heap_mmap_threshold_bytes=0, heap_trim_threshold_bytes=0,
                                       heap_arenas_max=0)
assert tune_heap(limits) is tuned
def burst():
    held = [bytearray(1 << 20) for _ in range(8)]  # eight 1 MiB pieces, then freed
    for b in held:
        b[::4096] = b"x" * len(b[::4096])
burst()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    burst()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _BURSTS, mode], check=True, capture_output=True, text=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_fixed_thresholds_keep_freed_pieces_for_the_next_ones() -> None:
    default, tuned = _faults("default"), _faults("tuned")
    # 50 bursts of 8 MiB are 102,400 pages: faulted again each time by default.
    assert default > 50_000, default
    assert tuned < default // 20, (tuned, default)


def test_zero_leaves_glibc_its_own_thresholds() -> None:
    assert not tune_heap(
        Limits(heap_mmap_threshold_bytes=0, heap_trim_threshold_bytes=0, heap_arenas_max=0)
    )


_ARENAS = """
import ctypes, sys, threading
from enroute_core.base.limits import Limits
from enroute_core.storage.heap import tune_heap
if sys.argv[1] == "tuned":
    limits = Limits(heap_mmap_threshold_bytes=0, heap_trim_threshold_bytes=0, heap_arenas_max=2)
    assert tune_heap(limits)
started = threading.Barrier(8)
def work():
    started.wait()  # all alive at once: each takes an arena at its first allocation
    held = [bytearray(100_000) for _ in range(20)]
    started.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" paragraph per arena, on stderr
"""


def _arenas(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _ARENAS, mode], check=True, capture_output=True, text=True
    )
    return sum(line.startswith("Arena ") for line in out.stderr.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_threads_share_the_arenas_the_limit_allows() -> None:
    default, tuned = _arenas("default"), _arenas("tuned")
    assert default > 2, default  # glibc's own: a thread alive at once takes a new one
    assert tuned == 2, tuned
