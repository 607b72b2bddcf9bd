"""Loads: missing chunks of a local copy fetched from the object store, checked, written.

Seed 004, "Never waiting on the object store", Residency:

- adjacent missing chunks are coalesced into ranged GETs of up to 16 MiB;
- at most 8 GETs run at once (one semaphore for the node);
- each chunk is fetched once however many readers ask (a future per chunk);
- "Layers", chunk hashes: every fetched chunk is checked against its SHA-256
  from the index region before it is written; a failing range is fetched once
  more, then ``CorruptData``. A chunk recorded by a previous run is checked on
  disk first and, if it fails, dropped and fetched again;
- bytes are written with pwrite in a worker thread, then the bitmap and the
  catalog are updated.

Reads never come here: a read of bytes that are not local raises ``NotLocal``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from enroute_core.base.errors import CorruptData
from enroute_core.base.limits import MiB
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.localcopy import LocalCopy
from enroute_core.storage.objectstore.base import ObjectStore

RANGE_BYTES_MAX = 16 * MiB
LOADS_IN_FLIGHT_MAX = 8


@dataclass(slots=True)
class LoadStats:
    """Counters for /status (seed 004, "Files and tiers", "Linked local copies")."""

    gets: int = 0
    bytes_fetched: int = 0
    chunks_fetched: int = 0
    chunks_rechecked: int = 0
    chunks_dropped: int = 0
    hash_retries: int = 0
    loads_in_flight: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "gets": self.gets,
            "bytes_fetched": self.bytes_fetched,
            "chunks_fetched": self.chunks_fetched,
            "chunks_rechecked": self.chunks_rechecked,
            "chunks_dropped": self.chunks_dropped,
            "hash_retries": self.hash_retries,
            "loads_in_flight": self.loads_in_flight,
        }


class LoadGate:
    """What all loads of a node share: the in-flight bound and the counters."""

    def __init__(
        self, *, in_flight_max: int = LOADS_IN_FLIGHT_MAX, range_bytes_max: int = RANGE_BYTES_MAX
    ) -> None:
        assert in_flight_max >= 1 and range_bytes_max >= CHUNK_BYTES
        self.semaphore = asyncio.Semaphore(in_flight_max)
        self.range_chunks_max = range_bytes_max // CHUNK_BYTES
        self.stats = LoadStats()


def coalesce(chunks: Iterable[int], run_chunks_max: int) -> list[range]:
    """Sorted chunk numbers as runs of adjacent chunks, each at most ``run_chunks_max`` long."""
    runs: list[range] = []
    start = prev = -2
    for c in sorted(set(chunks)):
        if c == prev + 1 and c - start < run_chunks_max:
            prev = c
            continue
        if start >= 0:
            runs.append(range(start, prev + 1))
        start = prev = c
    if start >= 0:
        runs.append(range(start, prev + 1))
    return runs


class ChunkLoader:
    """Loads into one copy. ``chunk_hash(i)`` is the index-region hash of chunk ``i``.

    ``on_written`` runs after chunks become present (the catalog update).
    Must be used from one event loop.
    """

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        copy: LocalCopy,
        *,
        chunk_hash: Callable[[int], bytes],
        hashed_chunks: int,
        gate: LoadGate,
        on_written: Callable[[], None],
    ) -> None:
        self._store = store
        self._key = key
        self._copy = copy
        self._hash = chunk_hash
        self._hashed = hashed_chunks
        self._gate = gate
        self._on_written = on_written
        self._inflight: dict[int, asyncio.Future[None]] = {}

    def _check(self, chunk: int, data: bytes | memoryview) -> bool:
        if chunk >= self._hashed:
            return True  # index region and footer: checked by crc32 at open, always local
        return hashlib.sha256(data).digest() == self._hash(chunk)

    async def load(self, chunks: Iterable[int]) -> None:
        """Make ``chunks`` present; returns once all are, or raises for the first failure."""
        wanted = sorted(set(chunks))
        assert all(0 <= c < self._copy.chunk_count for c in wanted), wanted
        await self._recheck([c for c in wanted if self._copy.is_unchecked(c)])
        waits: list[asyncio.Future[None]] = []
        mine: list[int] = []
        loop = asyncio.get_running_loop()
        for c in self._copy.missing(wanted):
            fut = self._inflight.get(c)
            if fut is None:
                fut = loop.create_future()
                self._inflight[c] = fut
                mine.append(c)
            waits.append(fut)
        tasks = [
            asyncio.create_task(self._fetch_run(run))
            for run in coalesce(mine, self._gate.range_chunks_max)
        ]
        try:
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            results = await asyncio.gather(*waits, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _recheck(self, chunks: list[int]) -> None:
        """Check chunks a previous run recorded; keep the good, drop the bad (refetched)."""
        if not chunks:
            return
        copy = self._copy

        def check_all() -> tuple[list[int], list[int]]:
            good: list[int] = []
            bad: list[int] = []
            for c in chunks:
                off = c * CHUNK_BYTES
                data = copy.read_raw(off, min(CHUNK_BYTES, copy.size - off))
                (good if self._check(c, data) else bad).append(c)
            return good, bad

        good, bad = await asyncio.to_thread(check_all)
        copy.mark_present(good)
        for c in bad:
            copy.drop(c)
        self._gate.stats.chunks_rechecked += len(chunks)
        self._gate.stats.chunks_dropped += len(bad)
        if bad:
            self._on_written()

    async def _fetch_run(self, run: range) -> None:
        futures = [self._inflight[c] for c in run]
        try:
            await self._fetch_run_once(run)
        except BaseException as e:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(e)
            raise
        finally:
            for c in run:
                self._inflight.pop(c, None)
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)

    async def _fetch_run_once(self, run: range) -> None:
        start = run.start * CHUNK_BYTES
        end = min(run.stop * CHUNK_BYTES, self._copy.size)
        stats = self._gate.stats
        for attempt in range(2):
            async with self._gate.semaphore:
                stats.loads_in_flight += 1
                try:
                    data = await self._store.get(self._key, start=start, end=end)
                finally:
                    stats.loads_in_flight -= 1
            stats.gets += 1
            stats.bytes_fetched += len(data)
            bad = self._bad_chunks(run, start, data)
            if not bad:
                await asyncio.to_thread(self._copy.write_chunks, start, data)
                self._copy.mark_present(run)
                stats.chunks_fetched += len(run)
                self._on_written()
                return
            if attempt == 0:
                stats.hash_retries += 1
        raise CorruptData(
            f"{self._key}: chunks {bad} fail their SHA-256 after a refetch",
            section="chunk",
            key=self._key,
            chunks=bad,
        )

    def _bad_chunks(self, run: range, start: int, data: bytes) -> list[int]:
        if len(data) != min(run.stop * CHUNK_BYTES, self._copy.size) - start:
            return list(run)
        view = memoryview(data)
        bad = []
        for c in run:
            off = c * CHUNK_BYTES - start
            if not self._check(c, view[off : off + CHUNK_BYTES]):
                bad.append(c)
        return bad
