"""A local copy whose chunks live under the node's disk budget, and the pins of a load.

Seed 004, "Disk budget": every non-linked local copy of an object-store file
is registered with the one :class:`DiskBudget` of the node, which becomes the
only record of which chunks are present (an eviction clears the bit, so the
copy must not keep a second bitmap that could still say "present").

- "Pins": the metadata chunks are pinned from the moment the copy is
  registered until it closes ("layer metadata while the layer is open");
  a load pins what it loads and hands the pins to the reader
  (:class:`LoadPins`), which releases them once it has read.
- Loads reserve room before they write (:meth:`BudgetedCopy.write_chunks`)
  and insert their chunks cold; a point read marks them referenced.
- "Races": every read is :meth:`DiskBudget.read_checked`, so a read racing
  an eviction raises ``NotLocal`` and never returns a punched hole.
- "Files and tiers": chunks recorded by a previous run stay *unchecked* here
  and enter the budget only once a load has checked them against their hash.
"""

from __future__ import annotations

import os
from types import TracebackType

from enroute_core.storage.diskbudget import ChunkPins, DiskBudget, bitmap_from_chunks
from enroute_core.storage.localcopy import LocalCopy
from enroute_core.storage.localfile import LocalFile
from enroute_core.storage.pool import Intent


class LoadPins:
    """The pins of one load (seed 004, "Disk budget", "Pins"); release once read.

    Without a budget it holds nothing. :meth:`transfer` moves the pins to a
    new guard, so a driver can hand them to a machine and keep no claim.
    """

    __slots__ = ("_pins",)

    def __init__(self, pins: list[ChunkPins] | None = None) -> None:
        self._pins = pins or []

    @classmethod
    def join(cls, guards: list[LoadPins]) -> LoadPins:
        """One guard owning the pins of ``guards`` (which then hold nothing)."""
        return cls([p.transfer() for g in guards for p in g._take()])

    def _take(self) -> list[ChunkPins]:
        pins, self._pins = self._pins, []
        return pins

    @property
    def held(self) -> bool:
        return any(p.held for p in self._pins)

    def chunks(self) -> list[int]:
        return sorted({c for p in self._pins if p.held for c in p.chunks})

    def transfer(self) -> LoadPins:
        pins, self._pins = self._pins, []
        return LoadPins([p.transfer() for p in pins])

    def release(self) -> None:
        pins, self._pins = self._pins, []
        for p in pins:
            p.release()

    def __enter__(self) -> LoadPins:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class BudgetedCopy(LocalCopy):
    """A non-linked copy registered with ``budget`` under ``file_id``; ``meta`` stays pinned."""

    def __init__(
        self, file: LocalFile, size: int, budget: DiskBudget, file_id: str, meta: range
    ) -> None:
        super().__init__(file, size, linked=False)
        self.budget = budget
        self.file_id = file_id
        budget.register(file_id, file.path, size, None)
        self.meta_pins = budget.pin_chunks(file_id, meta)
        self._meta = meta

    @classmethod
    def create_budgeted(
        cls, budget: DiskBudget, file_id: str, path: str, size: int, meta: range
    ) -> BudgetedCopy:
        """A new sparse copy with no chunks."""
        f = LocalFile.open_rw(path)
        os.ftruncate(f.fd, 0)
        os.ftruncate(f.fd, size)
        return cls(f, size, budget, file_id, meta)

    @classmethod
    def open_budgeted(
        cls,
        budget: DiskBudget,
        file_id: str,
        path: str,
        size: int,
        meta: range,
        *,
        present: list[int],
        checked: bool,
    ) -> BudgetedCopy:
        """A copy on disk: checked chunks enter the budget (metadata first, so it is pinned
        before anything can evict it); unchecked ones wait for a load to check them."""
        f = LocalFile.open_rw(path, create=False)
        if f.size != size:
            os.ftruncate(f.fd, size)
        copy = cls(f, size, budget, file_id, meta)
        if checked:
            copy.mark_present(sorted(present, key=lambda c: c not in meta))
        else:
            with copy._lock:
                for c in present:
                    copy._unchecked[c] = 1
        return copy

    # -- the bitmap is the budget's ----------------------------------------------------------

    def is_present(self, chunk: int) -> bool:
        return self.budget.is_present(self.file_id, chunk)

    def missing(self, chunks: range | list[int]) -> list[int]:
        if isinstance(chunks, range) and chunks.step == 1:
            return self.budget.missing(self.file_id, chunks)
        return [c for c in chunks if not self.budget.is_present(self.file_id, c)]

    def complete(self) -> bool:
        return not self.budget.missing(self.file_id, range(self.chunk_count))

    def mark_present(self, chunks: range | list[int]) -> None:
        """Chunks written (or checked) by a load that holds pins on them; they go in cold."""
        for c in chunks:
            with self._lock:
                self._unchecked[c] = 0
            self.budget.mark_present(self.file_id, c, Intent.SCAN)

    def drop(self, chunk: int) -> None:
        """Only unchecked chunks are dropped (a failed recheck); they are not in the budget."""
        assert not self.budget.is_present(self.file_id, chunk), (self.file_id, chunk)
        with self._lock:
            self._unchecked[chunk] = 0

    def bitmap(self) -> bytes:
        present = self.budget.bitmap(self.file_id)
        with self._lock:
            unchecked = [c for c in range(self.chunk_count) if self._unchecked[c]]
        extra = bitmap_from_chunks(unchecked, self.chunk_count)
        return bytes(a | b for a, b in zip(present, extra, strict=True))

    # -- reads and writes --------------------------------------------------------------------

    def touch(self, chunks: range, intent: Intent) -> None:
        """A point read marks its chunks referenced even when the pool answers it
        ("Intent steers eviction": a pool hit never reaches the disk)."""
        self.budget.touch(self.file_id, chunks, intent)

    def settled(self) -> bool:
        """Never: any chunk not pinned may be evicted ("Disk budget")."""
        return False

    def read_at(self, offset: int, length: int) -> bytes:
        """A scan read (no reference bit); point reads touch their chunks first."""
        return self.read_intent(offset, length, Intent.SCAN)

    def read_intent(self, offset: int, length: int, intent: Intent) -> bytes:
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        return self.budget.read_checked(self.file_id, self.fd, offset, end - offset, intent)

    def write_chunks(self, offset: int, data: bytes) -> None:
        """Reserve room, then write (worker thread); the loader's pins keep the chunks."""
        self.budget.reserve(len(data))
        super().write_chunks(offset, data)

    def close(self) -> None:
        """Release the metadata pins and leave the budget; the file stays for a restart."""
        self.meta_pins.release()
        self.budget.unregister(self.file_id)
        super().close()


__all__ = ["BudgetedCopy", "LoadPins"]
