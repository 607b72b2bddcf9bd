"""An idle voter gives its free C heap back to the system (issue 19, docs/fleet.md).

A burst of work (a wave of pushes, the wake storm after a restart or a peer's
return, computes subscribing again) leaves the voter's C heap with free blocks
between live ones: the buffers of gRPC and SQLite, the bytes of entries, packs
and snapshots, the tables of dicts that grew and shrank. glibc's malloc gives a
heap's free top back to the system, not its middle: after a thousand pushes some
7 MiB stayed resident though free (measured with ``mallinfo2`` on `enroute dev`:
11 MiB free of 22 MiB of C heap), so the resident set told how large the last
burst was rather than what the voter holds, a few KiB per idle repository either
way between two fleet sizes.

When groups have hibernated since the last trim and none is awake, what they held
is free: ``malloc_trim(0)`` hands the free pages of every arena back (``madvise``),
and the amount is logged. ``ledger.trim_heap_after`` sets how many hibernations
make it worth it (0: never). Idle work (scrapes, liveness beats, timers) then takes
blocks from that free memory again, each touching a page back in: on `enroute dev`
up to 2.5 MiB came back within seconds of a trim, so while no group is awake the
voter trims again once ``DECAY_S`` passed and its resident set grew by
``DECAY_BYTES`` since the last trim (as jemalloc gives unused dirty pages back over
ten seconds). Python's own small objects live in pymalloc's arenas, which it
returns itself once empty; this is the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable

from .multiraft import MultiRaft

log = logging.getLogger("enroute.ledger.heap")

POLL_S = 1.0
"""How often the voter looks: a trim follows the end of a burst within a second."""
DECAY_S = 2.0
DECAY_BYTES = 256 << 10
"""While idle, trim again ``DECAY_S`` after the last trim once the resident set grew by
this much since: each trim walks the free blocks (about a millisecond for 20 MiB of
heap), so even one every two seconds costs an idle voter under 0.1% of a core."""


def _resident_bytes() -> int:
    """The resident set (``/proc/self/statm``), 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    def __init__(
        self,
        mr: MultiRaft,
        *,
        after_groups: int,
        trim: Callable[[], object] | None,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
        resident: Callable[[], int] = _resident_bytes,
    ) -> None:
        self.mr = mr
        self.after_groups = after_groups
        self.poll_s = poll_s
        self.clock = clock
        self.resident = resident
        self._trim = trim
        self._seen = mr.stats.hibernated
        self._at = -math.inf  # the last trim, and the resident set it left
        self._left = 0
        self.trims = 0
        self.released_bytes = 0
        self._stopping = asyncio.Event()

    def due(self) -> int:
        """Groups hibernated since the last trim when a trim is due now, else 0."""
        freed = self.mr.stats.hibernated - self._seen
        if freed < self.after_groups or self.mr.hibernated_count() < self.mr.group_count():
            return 0
        return freed

    def decay_due(self) -> bool:
        """Idle, ``DECAY_S`` after the last trim, and ``DECAY_BYTES`` more resident since."""
        return (
            self.clock() - self._at >= DECAY_S
            and self.mr.hibernated_count() == self.mr.group_count()
            and self.resident() - self._left >= DECAY_BYTES
        )

    async def trim_now(self, freed: int) -> None:
        """Trim; ``freed`` groups hibernated since the last trim (0: a decay trim, logged
        at debug level only: it recurs while the voter idles)."""
        assert self._trim is not None
        self._seen = self.mr.stats.hibernated
        before = self.resident()
        await asyncio.to_thread(self._trim)
        self._at, self._left = self.clock(), self.resident()
        released = max(0, before - self._left)
        self.trims += 1
        self.released_bytes += released
        log.log(
            logging.INFO if freed else logging.DEBUG,
            "returned %.1f MiB of free heap to the system: %d groups hibernated since the "
            "last time and none is awake (ledger.trim_heap_after %d)",
            released / (1 << 20),
            freed,
            self.after_groups,
        )

    async def run(self) -> None:
        if self.after_groups <= 0:
            return
        if self._trim is None:
            log.info("no malloc_trim in this C library: free heap stays with the process")
            return
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.poll_s)
            if self._stopping.is_set():
                return
            freed = self.due()
            if freed or self.decay_due():
                await self.trim_now(freed)

    def stop(self) -> None:
        self._stopping.set()
