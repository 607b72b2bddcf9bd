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
make it worth it (0: never). One trim per burst is enough: sampled every half
second on `enroute dev` afterwards, the idle voter's resident set stayed within
256 KiB of what the trim left. Python's own small objects live in pymalloc's arenas,
which it returns itself once empty; this is the rest (its free pools in arenas still
in use stay resident: about a MiB either way from one burst to the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from enroute_core.storage.heap import resident_bytes

from .multiraft import MultiRaft

log = logging.getLogger("enroute.ledger.heap")

POLL_S = 1.0
"""How often the voter looks: a trim follows the end of a burst within a second."""


class HeapTrimmer:
    def __init__(
        self,
        mr: MultiRaft,
        *,
        after_groups: int,
        trim: Callable[[], object] | None,
        poll_s: float = POLL_S,
    ) -> None:
        self.mr = mr
        self.after_groups = after_groups
        self.poll_s = poll_s
        self._trim = trim
        self._seen = mr.stats.hibernated
        self.trims = 0
        self.released_bytes = 0
        self._stopping = asyncio.Event()

    def due(self) -> int:
        """Groups hibernated since the last trim when a trim is due now, else 0."""
        freed = self.mr.stats.hibernated - self._seen
        if freed < self.after_groups or self.mr.hibernated_count() < self.mr.group_count():
            return 0
        return freed

    async def trim_now(self, freed: int) -> None:
        assert self._trim is not None
        self._seen = self.mr.stats.hibernated
        before = resident_bytes()
        await asyncio.to_thread(self._trim)
        released = max(0, before - resident_bytes())
        self.trims += 1
        self.released_bytes += released
        log.info(
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
            freed = self.due()
            if freed and not self._stopping.is_set():
                await self.trim_now(freed)

    def stop(self) -> None:
        self._stopping.set()
