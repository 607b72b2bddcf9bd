"""Chunk residency of local copies and the disk budget, evicting by hole punching.

Seed 004, "Never waiting on the object store", "Residency": a copy opened
remotely is a sparse local file plus a bitmap of its 1 MiB chunks; reading a
chunk that is not present fails (``NotLocal``), there is no fallback.

Seed 004, "Disk budget" (``node.disk_cache``, default unbounded, i.e. None):

- One CLOCK ring over the present chunks of every copy; over budget, the
  hand punches holes (``FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE``).
- "Intent steers eviction": point reads (and pool misses for them) set a
  chunk's reference bit; scans do not, and a chunk a scan loads goes in cold
  under the hand, so a full clone cycles through a few chunks without
  displacing the working set.
- "Pins": a pinned chunk is never evicted. A loader pins the chunks before
  it writes them (waiting out an eviction in flight), marks them present,
  and hands the :class:`ChunkPins` to the reader (:meth:`ChunkPins.transfer`),
  which releases them once it has read. Present bytes stay within the budget
  plus the pinned bytes.
- "Linked local copies": a linked copy has every chunk, is outside the
  budget and is never punched.
- "Races": an eviction claims the chunk (a refetch waits on the claim),
  clears its bit and bumps the file's epoch, all under the lock, and only
  then punches, outside it. :meth:`DiskBudget.read_checked` notes the epoch
  before its pread and checks it after; a changed epoch or a cleared bit
  fails the read with ``NotLocal`` rather than return a punched hole.

Where holes cannot be punched (not Linux, or a filesystem that refuses:
:class:`~enroute_core.storage.localfile.HolePunchUnsupported`), eviction is
off: the layer service probes the copies' directory at start
(:meth:`DiskBudget.stop_evicting`, with a warning), and a failed punch later
(a filesystem mounted over it since) turns it off too. The budget then never
evicts, and ``stats().eviction_supported`` says so. A chunk whose punch
failed keeps its bytes on disk, is marked absent and is refetched on its
next use.

Locking rule: one lock guards bitmaps, pins, claims, epochs, the ring and the
counters; it is never held across a pread or a punch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

from enroute_core.base.errors import CorruptData, NotLocal, Timeout
from enroute_core.base.limits import MiB
from enroute_core.storage.localfile import HolePunchUnsupported, pread_full, punch_hole
from enroute_core.storage.pool import ClockRing, Intent, Loader

CHUNK_BYTES = MiB  # the chunk of seed 004, "Residency" (and of the layer chunk hashes)
WAIT_S_DEFAULT = 30.0  # a local punch that takes longer is a fault
_PIN_ROUNDS_MAX = 64

PunchFn = Callable[[int, int, int], None]  # (fd, offset, length)
PreadFn = Callable[[int, int, int], bytes]  # (fd, offset, length)


def chunk_count_of(size: int) -> int:
    return (size + CHUNK_BYTES - 1) // CHUNK_BYTES


def chunks_for(offset: int, length: int) -> range:
    """The chunks a read of ``[offset, offset + length)`` touches."""
    assert offset >= 0 and length >= 0, (offset, length)
    if length == 0:
        return range(0)
    return range(offset // CHUNK_BYTES, (offset + length - 1) // CHUNK_BYTES + 1)


def bitmap_from_chunks(chunks: Iterable[int], count: int) -> bytes:
    """The catalog form of a chunk set: bit ``i % 8`` of byte ``i // 8`` is chunk ``i``."""
    bits = bytearray((count + 7) // 8)
    for c in chunks:
        assert 0 <= c < count, (c, count)
        bits[c >> 3] |= 1 << (c & 7)
    return bytes(bits)


def chunks_of_bitmap(bitmap: bytes, count: int) -> list[int]:
    assert len(bitmap) == (count + 7) // 8, (len(bitmap), count)
    return [c for c in range(count) if bitmap[c >> 3] >> (c & 7) & 1]


class _Chunk:
    """A present chunk of a budgeted copy: its place in the ring and its reference bit."""

    __slots__ = ("file", "index", "nbytes", "point", "ref", "ring_pos")

    def __init__(self, file: _CopyFile, index: int, nbytes: int) -> None:
        self.file = file
        self.index = index
        self.nbytes = nbytes
        self.ref = False
        self.point = False
        """Ever read by a point read: evictions are counted by intent ("Intent steers eviction")."""
        self.ring_pos = -1


class _CopyFile:
    """One local copy; the fields belong to the budget and change only under its lock."""

    __slots__ = (
        "claims",
        "count",
        "entries",
        "epoch",
        "file_id",
        "linked",
        "path",
        "pins",
        "present",
        "present_bytes",
        "registered",
        "size",
    )

    def __init__(self, file_id: str, path: str, size: int, linked: bool) -> None:
        self.file_id = file_id
        self.path = path
        self.size = size
        self.count = chunk_count_of(size)
        self.linked = linked
        self.present = bytearray(self.count)
        self.pins = [0] * self.count
        self.entries: list[_Chunk | None] = [None] * self.count
        self.claims: dict[int, threading.Event] = {}
        self.epoch = 0
        self.present_bytes = 0
        self.registered = True

    def chunk_bytes(self, chunk: int) -> int:
        return min(CHUNK_BYTES, self.size - chunk * CHUNK_BYTES)

    def check_range(self, chunks: range) -> None:
        if chunks and not (chunks.start >= 0 and chunks.stop <= self.count and chunks.step == 1):
            raise ValueError(f"{self.file_id}: chunks {chunks} outside 0..{self.count}")


class ChunkPins:
    """Pins on a run of chunks (seed 004, "Disk budget", "Pins"); release exactly once.

    A loader pins before it writes and hands the pins on with
    :meth:`transfer`, so its own ``with`` block does not drop them.
    """

    __slots__ = ("_budget", "_chunks", "_file")

    def __init__(self, budget: DiskBudget, file: _CopyFile | None, chunks: range) -> None:
        self._budget = budget
        self._file = file
        self._chunks = chunks

    @property
    def chunks(self) -> range:
        return self._chunks

    @property
    def held(self) -> bool:
        return self._file is not None

    def transfer(self) -> ChunkPins:
        """A new guard owning these pins; this one then holds nothing."""
        file, self._file = self._file, None
        return ChunkPins(self._budget, file, self._chunks)

    def release(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            self._budget._unpin(file, self._chunks)

    def __enter__(self) -> ChunkPins:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class DiskBudgetStats:
    """The disk budget in ``/status``."""

    budget_bytes: int | None
    present_bytes: int
    pinned_bytes: int
    over_budget_bytes: int
    linked_bytes: int
    files: int
    linked_files: int
    evictions: int
    evictions_point: int
    """Evicted chunks that a point read had referenced; the rest only scans read."""
    evictions_scan: int
    punched_bytes: int
    punch_errors: int
    eviction_supported: bool
    not_local_reads: int

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class DiskBudget:
    """Chunk bitmaps of every local copy, and CLOCK eviction under ``node.disk_cache``."""

    def __init__(
        self,
        budget_bytes: int | None = None,
        *,
        punch: PunchFn = punch_hole,
        pread: PreadFn = pread_full,
        wait_s: float = WAIT_S_DEFAULT,
    ) -> None:
        assert budget_bytes is None or budget_bytes >= 0, budget_bytes
        self._budget = budget_bytes
        self._punch_fn = punch
        self._pread = pread
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._files: dict[str, _CopyFile] = {}
        self._ring: ClockRing[_Chunk] = ClockRing()
        self._can_evict = budget_bytes is not None
        self._present = 0
        self._pinned = 0
        self._linked_bytes = 0
        self._evictions = 0
        self._point_evictions = 0
        self._punched = 0
        self._punch_errors = 0
        self._not_local = 0

    @property
    def budget_bytes(self) -> int | None:
        return self._budget

    def stop_evicting(self) -> None:
        """The copies' filesystem cannot punch holes (probed at start): never evict, as
        after a first failed punch, but without losing that punch's chunk."""
        with self._lock:
            self._can_evict = False

    # -- files --------------------------------------------------------------------------------

    def register(
        self,
        file_id: str,
        path: str | os.PathLike[str],
        size: int,
        chunks_present: bytes | None = None,
        *,
        linked: bool = False,
    ) -> None:
        """Track a local copy (seed 004, "Files and tiers").

        ``chunks_present`` is the catalog bitmap (:func:`bitmap_from_chunks`);
        None means no chunk. A linked copy has every chunk whatever is passed.
        """
        assert size >= 0, size
        f = _CopyFile(file_id, os.fspath(path), size, linked)
        with self._lock:
            if file_id in self._files:
                raise ValueError(f"{file_id} is registered already")
            self._files[file_id] = f
            if linked:
                f.present[:] = b"\x01" * f.count
                f.present_bytes = size
                self._linked_bytes += size
                return
            if chunks_present is not None:
                for c in chunks_of_bitmap(chunks_present, f.count):
                    self._add_locked(f, c, Intent.SCAN)
            victims = self._evict_locked(0)
        self._punch(victims)

    def unregister(self, file_id: str) -> None:
        """Forget a copy (its file is being deleted); pins on it become no-ops."""
        with self._lock:
            f = self._files.pop(file_id)
            f.registered = False
            if f.linked:
                self._linked_bytes -= f.size
                return
            for c, entry in enumerate(f.entries):
                if entry is not None:
                    self._ring.remove(entry)
                    f.entries[c] = None
                    if f.pins[c]:
                        self._pinned -= entry.nbytes
            self._present -= f.present_bytes
            f.present_bytes = 0
            f.present[:] = bytes(f.count)

    def _file(self, file_id: str) -> _CopyFile:
        f = self._files.get(file_id)
        if f is None:
            raise ValueError(f"{file_id} is not registered")
        return f

    def chunk_count(self, file_id: str) -> int:
        with self._lock:
            return self._file(file_id).count

    def is_present(self, file_id: str, chunk: int) -> bool:
        with self._lock:
            return bool(self._file(file_id).present[chunk])

    def missing(self, file_id: str, chunks: range) -> list[int]:
        """Chunks of ``chunks`` a load must fetch first ("Residency": known without reading)."""
        with self._lock:
            f = self._file(file_id)
            f.check_range(chunks)
            return [c for c in chunks if not f.present[c]]

    def bitmap(self, file_id: str) -> bytes:
        """The present chunks in catalog form."""
        with self._lock:
            f = self._file(file_id)
            return bitmap_from_chunks((c for c in range(f.count) if f.present[c]), f.count)

    # -- loads and pins -----------------------------------------------------------------------

    def reserve(self, nbytes: int) -> bool:
        """Evict so that ``nbytes`` more fit; False when pinned chunks leave no room.

        A load may go on either way: what it writes it has pinned, and pinned
        chunks may exceed the budget ("Pins").
        """
        assert nbytes >= 0, nbytes
        if self._budget is None:
            return True
        with self._lock:
            victims = self._evict_locked(nbytes)
            ok = self._present + nbytes <= self._budget
        self._punch(victims)
        return ok

    def pin_chunks(self, file_id: str, chunks: range) -> ChunkPins:
        """Pin ``chunks`` (present or about to be loaded); waits out evictions in flight.

        Pin before writing a chunk: a pinned chunk cannot be claimed, so no
        punch lands on freshly written bytes.
        """
        for _ in range(_PIN_ROUNDS_MAX):
            with self._lock:
                f = self._file(file_id)
                f.check_range(chunks)
                if f.linked:
                    return ChunkPins(self, None, chunks)
                claim = next((f.claims[c] for c in chunks if c in f.claims), None)
                if claim is None:
                    for c in chunks:
                        if f.pins[c] == 0 and f.present[c]:
                            self._pinned += f.chunk_bytes(c)
                        f.pins[c] += 1
                    return ChunkPins(self, f, chunks)
            if not claim.wait(self._wait_s):
                raise Timeout(f"{file_id}: a chunk eviction took over {self._wait_s}s")
        raise Timeout(f"{file_id}: chunks {chunks} kept being evicted")

    def _unpin(self, f: _CopyFile, chunks: range) -> None:
        with self._lock:
            if not f.registered:
                return
            for c in chunks:
                assert f.pins[c] > 0, (f.file_id, c)
                f.pins[c] -= 1
                if f.pins[c] == 0 and f.present[c]:
                    self._pinned -= f.chunk_bytes(c)
            over = self._budget is not None and self._present > self._budget
            victims = self._evict_locked(0) if over else []
        self._punch(victims)

    def mark_present(self, file_id: str, chunk: int, intent: Intent = Intent.SCAN) -> None:
        """A load wrote ``chunk`` (and checked its hash); the loader holds a pin on it."""
        with self._lock:
            f = self._file(file_id)
            f.check_range(range(chunk, chunk + 1))
            if f.linked:
                return
            if f.present[chunk]:
                entry = f.entries[chunk]
                if entry is not None and intent is Intent.POINT:
                    entry.ref = entry.point = True
                return
            assert chunk not in f.claims, f"{file_id}: chunk {chunk} written without a pin"
            # Room first, then insert, so a cold chunk lands under the hand.
            victims = self._evict_locked(f.chunk_bytes(chunk))
            self._add_locked(f, chunk, intent)
        self._punch(victims)

    def _add_locked(self, f: _CopyFile, chunk: int, intent: Intent) -> None:
        n = f.chunk_bytes(chunk)
        entry = _Chunk(f, chunk, n)
        entry.ref = entry.point = intent is Intent.POINT
        f.entries[chunk] = entry
        f.present[chunk] = 1
        f.present_bytes += n
        self._present += n
        if f.pins[chunk]:
            self._pinned += n
        self._ring.insert(entry, cold=intent is Intent.SCAN)

    def touch(self, file_id: str, chunks: range, intent: Intent) -> None:
        """A point read (or a pool miss for one) marks its chunks referenced; a scan does not."""
        if intent is not Intent.POINT:
            return
        with self._lock:
            f = self._file(file_id)
            f.check_range(chunks)
            for c in chunks:
                entry = f.entries[c]
                if entry is not None:
                    entry.ref = entry.point = True

    # -- reads --------------------------------------------------------------------------------

    def read_checked(
        self, file_id: str, fd: int, offset: int, length: int, intent: Intent
    ) -> bytes:
        """pread ``[offset, offset + length)`` of a local copy, never returning a punched hole.

        "Races": the epoch is noted under the lock with every chunk present,
        the pread runs unlocked, then the epoch and bits are checked again. An
        eviction that could have punched during the pread bumped the epoch
        before punching. A changed epoch fails the read with ``NotLocal`` only
        when one of the read's own chunks went (its entry is no longer the one
        noted): an eviction of another chunk of the file cannot have punched these
        bytes, and under a small budget, with every read of a clone going to the
        file, such evictions are the rule. The error names the chunk, so the
        read's machine loads it again and resumes (``machines.ticket_of``).
        """
        with self._lock:
            f = self._file(file_id)
            if offset < 0 or length < 0 or offset + length > f.size:
                raise ValueError(f"{file_id}: [{offset}, {offset + length}) is outside {f.size}")
            chunks = chunks_for(offset, length)
            epoch = f.epoch
            noted: list[_Chunk | None] = []
            if not f.linked:
                self._check_present_locked(f, chunks)
                noted = [f.entries[c] for c in chunks]
                if intent is Intent.POINT:
                    for entry in noted:
                        assert entry is not None
                        entry.ref = entry.point = True
        data = self._pread(fd, offset, length)
        if len(data) != length:
            raise CorruptData(
                f"{file_id}: {len(data)} bytes at {offset}, wanted {length}",
                section="local file",
                offset=offset,
            )
        if not f.linked:
            with self._lock:
                if not f.registered:
                    self._not_local += 1
                    raise NotLocal(
                        f"{file_id}: forgotten during a read at {offset}",
                        file=file_id,
                        offset=offset,
                        length=length,
                    )
                if f.epoch != epoch:
                    self._check_kept_locked(f, chunks, noted, offset)
                self._check_present_locked(f, chunks)
        return data

    def _check_kept_locked(
        self, f: _CopyFile, chunks: range, noted: list[_Chunk | None], offset: int
    ) -> None:
        """After an epoch change: each chunk a read covers still has the entry noted
        before its pread, so no eviction claimed it (a claim clears the entry first)."""
        for c, entry in zip(chunks, noted, strict=True):
            if f.entries[c] is not entry:
                self._not_local += 1
                raise NotLocal(
                    f"{f.file_id}: chunk {c} evicted during a read at {offset}",
                    file=f.file_id,
                    chunk=c,
                    offset=offset,
                )

    def _check_present_locked(self, f: _CopyFile, chunks: range) -> None:
        for c in chunks:
            if not f.present[c]:
                self._not_local += 1
                raise NotLocal(
                    f"{f.file_id}: chunk {c} is not local",
                    file=f.file_id,
                    chunk=c,
                )

    def loader(self, file_id: str, fd: int) -> Loader:
        """A buffer pool loader over this copy: pool misses become checked preads."""

        def load(offset: int, length: int, intent: Intent) -> bytes:
            return self.read_checked(file_id, fd, offset, length, intent)

        return load

    # -- eviction -----------------------------------------------------------------------------

    def _evict_locked(self, need: int) -> list[_Chunk]:
        """CLOCK until ``need`` more bytes fit; claims victims, the caller punches them.

        Three turns of the ring bound the sweep: one to clear reference bits,
        then every unpinned chunk is taken.
        """
        budget = self._budget
        if budget is None or not self._can_evict:
            return []
        ring = self._ring
        victims: list[_Chunk] = []
        steps = 3 * ring.capacity + 1
        while self._present + need > budget and self._present > self._pinned and steps > 0:
            steps -= 1
            entry = ring.current()
            if entry is None or entry.file.pins[entry.index]:
                ring.advance()
            elif entry.ref:
                entry.ref = False
                ring.advance()
            else:
                self._claim_locked(entry)
                victims.append(entry)
        return victims

    def _claim_locked(self, entry: _Chunk) -> None:
        """Claim, clear the bit, bump the epoch: all before the punch ("Races")."""
        f = entry.file
        self._ring.remove(entry)
        f.entries[entry.index] = None
        f.claims[entry.index] = threading.Event()
        f.present[entry.index] = 0
        f.present_bytes -= entry.nbytes
        self._present -= entry.nbytes
        f.epoch += 1

    def _punch(self, victims: list[_Chunk]) -> None:
        """Outside the lock: punch each claimed chunk, then end the claims."""
        if not victims:
            return
        punched = errors = 0
        unsupported = False
        by_file: dict[str, list[_Chunk]] = {}
        for v in victims:
            by_file.setdefault(v.file.path, []).append(v)
        try:
            for path, entries in by_file.items():
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # deleted meanwhile: nothing left to free
                except OSError:
                    errors += len(entries)
                    continue
                try:
                    for v in entries:
                        if unsupported:
                            break
                        try:
                            self._punch_fn(fd, v.index * CHUNK_BYTES, v.nbytes)
                            punched += v.nbytes
                        except HolePunchUnsupported:
                            unsupported = True
                        except OSError:
                            errors += 1
                finally:
                    os.close(fd)
        finally:  # claims always end, or refetches would wait forever
            with self._lock:
                for v in victims:
                    v.file.claims.pop(v.index).set()
                self._evictions += len(victims)
                self._point_evictions += sum(1 for v in victims if v.point)
                self._punched += punched
                self._punch_errors += errors
                if unsupported:
                    self._can_evict = False

    # -- status -------------------------------------------------------------------------------

    def stats(self) -> DiskBudgetStats:
        with self._lock:
            over = 0 if self._budget is None else max(0, self._present - self._budget)
            return DiskBudgetStats(
                budget_bytes=self._budget,
                present_bytes=self._present,
                pinned_bytes=self._pinned,
                over_budget_bytes=over,
                linked_bytes=self._linked_bytes,
                files=len(self._files),
                linked_files=sum(1 for f in self._files.values() if f.linked),
                evictions=self._evictions,
                evictions_point=self._point_evictions,
                evictions_scan=self._evictions - self._point_evictions,
                punched_bytes=self._punched,
                punch_errors=self._punch_errors,
                eviction_supported=self._can_evict,
                not_local_reads=self._not_local,
            )
