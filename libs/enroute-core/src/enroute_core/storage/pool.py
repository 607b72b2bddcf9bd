"""The buffer pool: one byte budget, CLOCK eviction, pin guards.

Seed 004, "Pages and memory" is the contract; the numbered points of its
"Design" list are cited as Design 1-4.

- One budget (``node.page_cache``, default 256 MiB) covers every resident page
  and every byte charged by the object and entry caches (Design 3: "charged
  to the same budget"). The pool exceeds it only by pinned pages, and says so
  in :meth:`BufferPool.stats`.
- Pages are 4 KiB for the object table, oid index and external oids and
  64 KiB for the data region (Design 2); a file registers its page class per
  region. Each open file has a page table, a list with one slot per page, so
  a hit is a list index and a pin count, nothing shared beyond that page.
- One CLOCK ring over all resident pages (Design 2): a reference bit per page,
  a hand that skips pinned pages, closed files pruned lazily when the hand (or
  a short prune cursor run on every load) meets their pages.
- Point reads set the reference bit; scans insert pages cold at the hand, so
  they are the first to go ("Scans (full clones, compaction) insert pages
  cold"). A one-pass reader (a full clone's data windows) takes no page at
  all: :meth:`BufferPool.read_through` copies resident pages and reads each
  run of missing ones with one loader call, kept by no page.
- Loads are synchronous preads of local disk by a per-file :class:`Loader`
  (Design 1); remote bytes never arrive here (seed 004, "Never waiting on the
  object store"). A loader error (``OSError``, ``NotLocal``) fails that read
  and leaves nothing half-inserted (Design 2: "An I/O error fails the read
  and does not stop the process").
- Temp tables and spooled packs are writable pages, written back to their
  scratch file when evicted (Design 3, "like the temporary buffers of
  DuckDB").
- Nothing is memory-mapped (Design 4).

Locking rule: one lock guards the ring, the page tables and the counters. It
is held for bookkeeping only, never across a loader, a writer or a cache's
shrink callback. A miss installs a loading marker in the page's slot, drops
the lock, preads, then takes the lock to swap the marker for the page.
Another reader of the same page finds the marker and waits for it (one pread
per page, never two); if the load fails, the marker is removed and a waiter
retries with its own load.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import tempfile
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, Generic, Protocol, TypeVar

from enroute_core.base.errors import CorruptData, Timeout
from enroute_core.base.limits import KiB, MiB

log = logging.getLogger(__name__)

META_PAGE_BYTES = 4 * KiB
DATA_PAGE_BYTES = 64 * KiB
DEFAULT_PAGE_CACHE_BYTES = 256 * MiB  # node.page_cache
WAIT_S_DEFAULT = 30.0  # a local pread or write-back that takes longer is a fault

_ACQUIRE_ROUNDS_MAX = 64
_WRITEBACK_ROUNDS_MAX = 4
_PRUNE_STEPS_PER_LOAD = 8
_RING_COMPACT_HOLES_MIN = 64


class Intent(enum.Enum):
    """What a read is for (seed 004, "Storage service", "Read": "Each read says
    whether it is a point read or a scan. That hint goes down to pool pages and
    disk chunks.")"""

    POINT = "point"
    SCAN = "scan"


SCAN_OBJECTS_MIN = 256
"""Work over at least this many objects reads as a scan (``Intent.SCAN``): a pack of as
many entries, a tree walk of as many trees. Below it, reads are points and keep pages."""


class PageClass(enum.Enum):
    """Page sizes by region (seed 004, "Layers", "Lookup reads one page")."""

    META = "meta"  # object table, oid index, external oids: 4 KiB
    DATA = "data"  # data region: 64 KiB

    @property
    def page_bytes(self) -> int:
        return META_PAGE_BYTES if self is PageClass.META else DATA_PAGE_BYTES


def split_node_cache(cache_bytes: int) -> tuple[int, int]:
    """``node.cache`` split: object cache 3/4, entry cache 1/4 (seed 004, "Why a pool")."""
    assert cache_bytes >= 0, cache_bytes
    object_bytes = cache_bytes * 3 // 4
    return object_bytes, cache_bytes - object_bytes


# -- the CLOCK ring ---------------------------------------------------------------------------


class _RingItem(Protocol):
    ring_pos: int
    ref: bool


_T = TypeVar("_T", bound=_RingItem)


class ClockRing(Generic[_T]):
    """Slots swept by a hand; shared by the pool (pages) and the disk budget (chunks).

    A removed item leaves a hole. The next insert fills the hole under the
    hand if there is one, else the most recent hole, else appends. A cold
    insert stays under the hand, so the next sweep meets it first; a hot one
    moves the hand past it, so it is met last. Holes are compacted away once
    they outnumber the items.
    """

    __slots__ = ("_free", "_hand", "_live", "_slots")

    def __init__(self) -> None:
        self._slots: list[_T | None] = []
        self._free: list[int] = []
        self._hand = 0
        self._live = 0

    def __len__(self) -> int:
        return self._live

    @property
    def capacity(self) -> int:
        return len(self._slots)

    def at(self, pos: int) -> _T | None:
        return self._slots[pos]

    def current(self) -> _T | None:
        return self._slots[self._hand] if self._slots else None

    def advance(self) -> None:
        if self._slots:
            self._hand = (self._hand + 1) % len(self._slots)

    def insert(self, item: _T, *, cold: bool) -> None:
        slots = self._slots
        if slots and slots[self._hand] is None:
            pos = self._hand
        else:
            pos = -1
            while self._free:  # stale entries (filled via the hand) are skipped once
                cand = self._free.pop()
                if cand < len(slots) and slots[cand] is None:
                    pos = cand
                    break
        if pos < 0:
            pos = len(slots)
            slots.append(item)
        else:
            slots[pos] = item
        item.ring_pos = pos
        self._live += 1
        if not cold and pos == self._hand:
            self.advance()

    def remove(self, item: _T) -> None:
        pos = item.ring_pos
        assert self._slots[pos] is item, (pos, item)
        self._slots[pos] = None
        item.ring_pos = -1
        self._live -= 1
        self._free.append(pos)
        holes = len(self._slots) - self._live
        if holes > _RING_COMPACT_HOLES_MIN and (holes > self._live or len(self._free) > 2 * holes):
            self._compact()

    def _compact(self) -> None:
        kept: list[_T | None] = []
        hand = 0
        for pos, item in enumerate(self._slots):
            if pos == self._hand:
                hand = len(kept)
            if item is not None:
                item.ring_pos = len(kept)
                kept.append(item)
        self._slots = kept
        self._hand = hand if hand < len(kept) else 0
        self._free = []


# -- files and pages --------------------------------------------------------------------------


class Loader(Protocol):
    def __call__(self, offset: int, length: int, intent: Intent) -> bytes:
        """Exactly ``length`` bytes at ``offset`` from LOCAL disk, or raise.

        ``intent`` is passed on so that a miss of a point read marks its disk
        chunks referenced (seed 004, "Disk budget", "Intent steers eviction").
        Raises ``OSError`` or ``NotLocal``; never waits on a remote tier.
        """
        ...


Writer = Callable[[int, bytes], None]


@dataclass(frozen=True, slots=True)
class Region:
    """``[start, end)`` of a file paged in ``page_class`` pages, aligned to ``start``."""

    start: int
    end: int
    page_class: PageClass

    @property
    def page_count(self) -> int:
        pb = self.page_class.page_bytes
        return (self.end - self.start + pb - 1) // pb


class _Loading:
    """A page table slot whose page one thread is loading; others wait on it."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event: threading.Event | None = None

    def waiter(self) -> threading.Event:
        if self.event is None:
            self.event = threading.Event()
        return self.event

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()


class _Page:
    __slots__ = (
        "data",
        "dirty",
        "file",
        "nbytes",
        "page_class",
        "page_no",
        "pins",
        "ref",
        "ring_pos",
        "version",
        "wb_version",
    )

    def __init__(
        self, file: PoolFile, page_no: int, data: bytes | bytearray, page_class: PageClass
    ) -> None:
        self.file = file
        self.page_no = page_no
        self.data = data
        self.nbytes = len(data)
        self.page_class = page_class
        self.pins = 0
        self.ref = False
        self.ring_pos = -1
        self.dirty = False
        self.version = 0
        self.wb_version = 0


class PoolFile:
    """An open file's page table; made by :meth:`BufferPool.open_file` / ``open_temp``.

    The fields belong to the pool and change only under its lock.
    """

    __slots__ = (
        "closed",
        "failed",
        "loader",
        "name",
        "region_first",
        "regions",
        "resident_bytes",
        "size",
        "slots",
        "writer",
    )

    def __init__(
        self,
        name: str,
        size: int,
        regions: list[Region],
        loader: Loader,
        writer: Writer | None,
    ) -> None:
        self.name = name
        self.size = size
        self.regions = regions
        self.loader = loader
        self.writer = writer
        self.region_first: list[int] = []
        count = 0
        for r in regions:
            self.region_first.append(count)
            count += r.page_count
        self.slots: list[_Page | _Loading | None] = [None] * count
        self.closed = False
        self.failed: OSError | None = None
        self.resident_bytes = 0

    @property
    def writable(self) -> bool:
        return self.writer is not None

    @property
    def page_count(self) -> int:
        return len(self.slots)

    def page_span(self, page_no: int) -> tuple[int, int, PageClass]:
        """``(offset, length, page_class)`` of a page; the last page of a region may be short."""
        i = bisect_right(self.region_first, page_no) - 1
        r = self.regions[i]
        pb = r.page_class.page_bytes
        offset = r.start + (page_no - self.region_first[i]) * pb
        length = pb if self.writer is not None else min(pb, r.end - offset)
        return offset, length, r.page_class

    def page_at(self, offset: int) -> int:
        """The page holding byte ``offset``; ``ValueError`` in a gap between regions."""
        i = bisect_right(self.regions, offset, key=lambda r: r.start) - 1
        if i < 0 or offset >= self.regions[i].end:
            raise ValueError(f"{self.name}: offset {offset} is in no paged region")
        r = self.regions[i]
        return self.region_first[i] + (offset - r.start) // r.page_class.page_bytes


class PageGuard:
    """A pinned page: ``with pool.pin(file, n) as page:``; the page is never evicted inside.

    ``page`` is a memoryview, read-only unless the guard came from
    :meth:`BufferPool.pin_mut`. Release exactly once (``with`` does it).
    """

    __slots__ = ("_page", "_pool", "_view", "_writable")

    def __init__(self, pool: BufferPool, page: _Page, writable: bool) -> None:
        self._pool = pool
        self._page: _Page | None = page
        self._writable = writable
        view = memoryview(page.data)
        self._view = view if writable or isinstance(page.data, bytes) else view.toreadonly()

    @property
    def page(self) -> memoryview:
        return self._view

    def release(self) -> None:
        page, self._page = self._page, None
        if page is not None:
            self._pool._unpin(page, dirtied=self._writable)

    def __enter__(self) -> memoryview:
        return self._view

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class ChargeOwner:
    """Bytes outside pages charged to the pool (object and entry caches, Design 3).

    ``shrink(nbytes) -> freed`` lets the owner give memory back when pinned
    pages push the pool over its budget; it is called without the pool lock
    and must call :meth:`release` for what it frees.
    """

    __slots__ = ("_pool", "charged_bytes", "name", "shrink")

    def __init__(self, pool: BufferPool, name: str, shrink: Callable[[int], int] | None) -> None:
        self._pool = pool
        self.name = name
        self.shrink = shrink
        self.charged_bytes = 0

    def charge(self, nbytes: int) -> bool:
        return self._pool.charge(self, nbytes)

    def release(self, nbytes: int) -> None:
        self._pool.release(self, nbytes)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """The pool in ``/status``; ``over_budget_bytes`` is what pinned pages add past the budget."""

    budget_bytes: int
    used_bytes: int
    page_bytes: int
    charged_bytes: int
    pinned_bytes: int
    over_budget_bytes: int
    pages: dict[str, int] = field(default_factory=dict)
    bytes_by_class: dict[str, int] = field(default_factory=dict)
    dirty_pages: int = 0
    closed_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    writebacks: int = 0
    load_errors: int = 0
    refused_charges: int = 0
    read_through_bytes: int = 0  # one-pass reads answered without keeping pages

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# -- the pool ---------------------------------------------------------------------------------


class BufferPool:
    """The buffer manager of seed 004, "Pages and memory"; see the module docstring."""

    def __init__(
        self, budget_bytes: int = DEFAULT_PAGE_CACHE_BYTES, *, wait_s: float = WAIT_S_DEFAULT
    ) -> None:
        assert budget_bytes > 0, budget_bytes
        self._budget = budget_bytes
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._ring: ClockRing[_Page] = ClockRing()
        self._prune_pos = 0
        self._used = 0  # pages + charges
        self._charged = 0
        self._pinned = 0
        self._pinned_pages = 0
        self._resident_pages = 0
        self._closed_bytes = 0
        self._dirty_pages = 0
        self._pages = dict.fromkeys(PageClass, 0)
        self._class_bytes = dict.fromkeys(PageClass, 0)
        self._owners: list[ChargeOwner] = []
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._writebacks = 0
        self._load_errors = 0
        self._refused = 0
        self._read_through_bytes = 0

    @property
    def budget_bytes(self) -> int:
        return self._budget

    # -- files --------------------------------------------------------------------------------

    def open_file(
        self,
        name: str,
        size: int,
        loader: Loader,
        regions: Sequence[Region] | None = None,
    ) -> PoolFile:
        """Register an immutable file: ``regions`` sorted and disjoint; default all DATA pages."""
        regs = list(regions) if regions is not None else [Region(0, size, PageClass.DATA)]
        prev_end = 0
        for r in regs:
            assert prev_end <= r.start < r.end <= size, (name, r, size)
            prev_end = r.end
        return PoolFile(name, size, regs, loader, None)

    def open_temp(
        self,
        name: str,
        loader: Loader,
        writer: Writer,
        *,
        page_class: PageClass = PageClass.DATA,
        size: int = 0,
    ) -> PoolFile:
        """Register a writable scratch file (temp table, spooled pack); it grows by :meth:`grow`.

        ``loader`` reads back what ``writer`` wrote and zeros past it.
        """
        return PoolFile(name, size, [Region(0, max(size, 1), page_class)], loader, writer)

    def grow(self, file: PoolFile, size: int) -> None:
        assert file.writable, f"{file.name} is not a temp file"
        with self._lock:
            if size <= file.size:
                return
            r = file.regions[0]
            file.regions[0] = Region(0, size, r.page_class)
            file.size = size
            more = file.regions[0].page_count - len(file.slots)
            file.slots.extend([None] * more)

    def close_file(self, file: PoolFile) -> None:
        """Mark closed; its pages go when the hand or the prune cursor meets them (Design 2)."""
        with self._lock:
            if not file.closed:
                file.closed = True
                self._closed_bytes += file.resident_bytes

    # -- pins ---------------------------------------------------------------------------------

    def pin(self, file: PoolFile, page_no: int, intent: Intent = Intent.POINT) -> PageGuard:
        """Pin a page, loading it on a miss; raises what the loader raised."""
        return PageGuard(self, self._acquire(file, page_no, intent), writable=False)

    def pin_mut(self, file: PoolFile, page_no: int, intent: Intent = Intent.POINT) -> PageGuard:
        """Pin a temp page for writing; releasing the guard marks it dirty."""
        assert file.writable, f"{file.name} is not a temp file"
        return PageGuard(self, self._acquire(file, page_no, intent), writable=True)

    def read(self, file: PoolFile, offset: int, length: int, intent: Intent) -> bytes:
        """Bytes ``[offset, offset + length)`` through the pages; all inside paged regions."""
        parts: list[bytes] = []
        end = offset + length
        pos = offset
        while pos < end:  # one page per round, so at most length / 4 KiB + 1 rounds
            page_no = file.page_at(pos)
            page_off, page_len, _ = file.page_span(page_no)
            take = min(end, page_off + page_len) - pos
            with self.pin(file, page_no, intent) as page:
                parts.append(bytes(page[pos - page_off : pos - page_off + take]))
            pos += take
        return b"".join(parts)

    def read_page(
        self, file: PoolFile, page_no: int, start: int, end: int, intent: Intent
    ) -> bytes:
        """A copy of bytes ``[start, end)`` of one page: the short path of point reads.

        A hit copies under the one lock, so it needs no pin and no guard
        object (the copy is at most one page, and nothing can evict the page
        while the lock is held); a miss loads through :meth:`pin`.
        """
        with self._lock:
            slot = file.slots[page_no]
            if isinstance(slot, _Page) and not file.closed and file.failed is None:
                if intent is Intent.POINT:
                    slot.ref = True
                self._hits += 1
                data = slot.data
                return data[start:end] if type(data) is bytes else bytes(data[start:end])
        with self.pin(file, page_no, intent) as page:
            return page[start:end].tobytes()

    def read_through(self, file: PoolFile, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of an immutable file for a one-pass reader.

        A full clone reads each byte of a layer once (issue 25): pages kept for it
        would fill the pool with what nobody reads again (a 267 MiB clone took the
        compute's pool, and its resident set, up by as much). Resident pages are
        copied under the lock as :meth:`read_page` copies a hit; each run of
        missing pages within a region is one loader call whose bytes are returned
        as they came, kept by no page. So a span nobody else holds costs one pread
        and no copy here, and the pool is left as it was. The kernel's page cache
        is what a second clone reads from. Temp files (pages written but maybe not
        yet written back) go through :meth:`read`.
        """
        if file.writable:
            return self.read(file, offset, length, Intent.SCAN)
        parts: list[bytes] = []
        end = offset + length
        pos = offset
        while pos < end:
            page_no = file.page_at(pos)
            ri = bisect_right(file.region_first, page_no) - 1
            region = file.regions[ri]
            pb = region.page_class.page_bytes
            stop = page_no
            with self._lock:  # a hit is copied here; a miss extends the run to load
                assert not file.closed, f"{file.name} is closed"
                slots = file.slots
                slot = slots[page_no]
                if isinstance(slot, _Page):
                    page_off = region.start + (page_no - file.region_first[ri]) * pb
                    upto = min(end, page_off + slot.nbytes)
                    parts.append(bytes(slot.data[pos - page_off : upto - page_off]))
                    self._hits += 1
                    pos = upto
                    continue
                last = min(file.region_first[ri] + region.page_count, file.page_at(end - 1) + 1)
                while stop < last and not isinstance(slots[stop], _Page):
                    stop += 1
            upto = min(end, region.end, region.start + (stop - file.region_first[ri]) * pb)
            data = file.loader(pos, upto - pos, Intent.SCAN)
            if len(data) != upto - pos:
                raise CorruptData(
                    f"{file.name}: {len(data)} bytes read at {pos}, wanted {upto - pos}",
                    section="local file",
                    offset=pos,
                )
            parts.append(data)
            with self._lock:
                self._read_through_bytes += len(data)
            pos = upto
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def write(self, file: PoolFile, offset: int, data: bytes) -> None:
        """Write into a temp file's pages, growing it as needed."""
        self.grow(file, offset + len(data))
        pos = 0
        while pos < len(data):
            page_no = file.page_at(offset + pos)
            page_off, page_len, _ = file.page_span(page_no)
            skip = offset + pos - page_off
            take = min(len(data) - pos, page_len - skip)
            with self.pin_mut(file, page_no) as page:
                page[skip : skip + take] = data[pos : pos + take]
            pos += take

    def _acquire(self, file: PoolFile, page_no: int, intent: Intent) -> _Page:
        if not 0 <= page_no < len(file.slots):
            raise ValueError(f"{file.name}: no page {page_no}")
        for _ in range(_ACQUIRE_ROUNDS_MAX):
            with self._lock:
                assert not file.closed, f"{file.name} is closed"
                if file.failed is not None:
                    err = file.failed
                    raise OSError(err.errno, f"{file.name}: an earlier write-back failed: {err}")
                slot = file.slots[page_no]
                if isinstance(slot, _Page):  # the hit path: a list index and a pin count
                    if slot.pins == 0:
                        self._pinned += slot.nbytes
                        self._pinned_pages += 1
                    slot.pins += 1
                    if intent is Intent.POINT:
                        slot.ref = True
                    self._hits += 1
                    return slot
                if slot is None:
                    marker = _Loading()
                    file.slots[page_no] = marker
                    self._misses += 1
                else:
                    event = slot.waiter()
            if slot is None:
                return self._load(file, page_no, marker, intent)
            if not event.wait(self._wait_s):
                raise Timeout(f"{file.name}: page {page_no} took over {self._wait_s}s to load")
        raise Timeout(
            f"{file.name}: page {page_no} failed to settle in {_ACQUIRE_ROUNDS_MAX} waits"
        )

    def _load(self, file: PoolFile, page_no: int, marker: _Loading, intent: Intent) -> _Page:
        offset, length, page_class = file.page_span(page_no)
        try:
            data = file.loader(offset, length, intent)
            if len(data) != length:
                raise CorruptData(
                    f"{file.name}: page at {offset} loaded {len(data)} bytes, wanted {length}",
                    section="local file",
                    offset=offset,
                )
        except BaseException:
            with self._lock:
                if file.slots[page_no] is marker:
                    file.slots[page_no] = None
                self._load_errors += 1
                marker.wake()
            raise
        page = _Page(file, page_no, bytearray(data) if file.writable else bytes(data), page_class)
        with self._lock:
            assert file.slots[page_no] is marker
            if self._closed_bytes:
                self._prune_locked(_PRUNE_STEPS_PER_LOAD)
            # Room first, then insert: the hand rests on the last victim's hole,
            # so a cold page lands under it and is the next one met.
            work = self._evict_locked(page.nbytes)
            file.slots[page_no] = page
            self._pin_locked(page)
            page.ref = intent is Intent.POINT
            self._ring.insert(page, cold=intent is Intent.SCAN)
            self._account_locked(page, +1)
            marker.wake()
        self._finish(work)
        return page

    def _unpin(self, page: _Page, *, dirtied: bool) -> None:
        with self._lock:
            if dirtied:
                page.version += 1
                if not page.dirty:
                    page.dirty = True
                    self._dirty_pages += 1
            self._unpin_locked(page)
            if self._used <= self._budget:
                return
            work = self._evict_locked(0)
        self._finish(work)

    # -- charges ------------------------------------------------------------------------------

    def register_owner(self, name: str, shrink: Callable[[int], int] | None = None) -> ChargeOwner:
        owner = ChargeOwner(self, name, shrink)
        with self._lock:
            self._owners.append(owner)
        return owner

    def charge(self, owner: ChargeOwner, nbytes: int) -> bool:
        """Charge ``nbytes``, evicting pages for room; False (nothing charged) if none is left.

        A charge never takes the pool past its budget: only pins may do that.
        """
        assert nbytes >= 0, nbytes
        for _ in range(_WRITEBACK_ROUNDS_MAX + 1):
            with self._lock:
                work = self._evict_locked(nbytes)
                if not work:
                    if self._used + nbytes <= self._budget:
                        owner.charged_bytes += nbytes
                        self._charged += nbytes
                        self._used += nbytes
                        return True
                    self._refused += 1
                    return False
            self._finish(work, shrink_owners=False)
        with self._lock:
            self._refused += 1
        return False

    def release(self, owner: ChargeOwner, nbytes: int) -> None:
        with self._lock:
            assert 0 <= nbytes <= owner.charged_bytes, (owner.name, nbytes, owner.charged_bytes)
            owner.charged_bytes -= nbytes
            self._charged -= nbytes
            self._used -= nbytes

    # -- eviction (caller holds the lock unless named otherwise) ------------------------------

    def _pin_locked(self, page: _Page) -> None:
        if page.pins == 0:
            self._pinned += page.nbytes
            self._pinned_pages += 1
        page.pins += 1

    def _unpin_locked(self, page: _Page) -> None:
        assert page.pins > 0, (page.file.name, page.page_no)
        page.pins -= 1
        if page.pins == 0:
            self._pinned -= page.nbytes
            self._pinned_pages -= 1

    def _account_locked(self, page: _Page, sign: int) -> None:
        n = sign * page.nbytes
        self._used += n
        self._resident_pages += sign
        self._pages[page.page_class] += sign
        self._class_bytes[page.page_class] += n
        page.file.resident_bytes += n
        if page.file.closed:
            self._closed_bytes += n

    def _drop_locked(self, page: _Page) -> None:
        assert page.pins == 0
        self._ring.remove(page)
        page.file.slots[page.page_no] = None
        self._account_locked(page, -1)
        if page.dirty:
            page.dirty = False
            self._dirty_pages -= 1
        self._evictions += 1

    def _evict_locked(self, need: int) -> list[_Page]:
        """CLOCK until ``need`` more bytes fit; dirty victims come back pinned for write-back.

        The sweep is bounded: three turns of the ring cover clearing every
        reference bit and then taking every unpinned page.
        """
        ring = self._ring
        writebacks: list[_Page] = []
        pending = 0
        steps = 3 * ring.capacity + 1
        while (
            self._used - pending + need > self._budget
            and self._resident_pages > self._pinned_pages
            and steps > 0
        ):
            steps -= 1
            page = ring.current()
            if page is None or page.pins:
                ring.advance()
            elif page.file.closed or page.file.failed is not None:
                self._drop_locked(page)
            elif page.ref:
                page.ref = False
                ring.advance()
            elif page.dirty:
                self._pin_locked(page)
                page.wb_version = page.version
                writebacks.append(page)
                pending += page.nbytes
                ring.advance()
            else:
                self._drop_locked(page)
        return writebacks

    def _prune_locked(self, steps: int) -> int:
        """Drop unpinned pages of closed files met by a cursor separate from the hand."""
        freed = 0
        for _ in range(min(steps, self._ring.capacity)):
            cap = self._ring.capacity
            if cap == 0:
                break
            pos = self._prune_pos % cap
            self._prune_pos = pos + 1
            page = self._ring.at(pos)
            if page is not None and page.pins == 0 and page.file.closed:
                freed += page.nbytes
                self._drop_locked(page)
        return freed

    def prune_closed(self) -> int:
        """One full turn of the prune cursor; bytes freed."""
        with self._lock:
            return self._prune_locked(self._ring.capacity)

    def _finish(self, work: list[_Page], *, shrink_owners: bool = True) -> None:
        """Outside the lock: write back pinned dirty victims, evict again, then ask owners.

        A write-back error poisons the temp file: its pages are dropped
        unwritten and later pins raise, so the operation using it fails and
        the pool stays bounded.
        """
        rounds = 0
        while work:
            rounds += 1
            results: list[OSError | None] = []
            try:
                for page in work:
                    results.append(self._write_back(page))
            except BaseException:
                with self._lock:  # a writer bug: never leak the write-back pins
                    for page in work:
                        self._unpin_locked(page)
                raise
            with self._lock:
                for page, err in zip(work, results, strict=True):
                    self._unpin_locked(page)
                    if err is not None:
                        if page.file.failed is None and not page.file.closed:
                            page.file.failed = err
                    elif page.version == page.wb_version and page.dirty and not page.file.closed:
                        page.dirty = False
                        self._dirty_pages -= 1
                        self._writebacks += 1
                        # It was chosen as a victim: drop it now, or the hand,
                        # already past it, may leave the pool over budget.
                        if page.pins == 0 and self._used > self._budget:
                            self._drop_locked(page)
                over = self._used > self._budget
                work = self._evict_locked(0) if over and rounds < _WRITEBACK_ROUNDS_MAX else []
        # An unlocked read is only a hint; _shrink_owners checks again under the lock.
        if shrink_owners and self._charged and self._used > self._budget:
            self._shrink_owners()

    @staticmethod
    def _write_back(page: _Page) -> OSError | None:
        writer = page.file.writer
        assert writer is not None
        if page.file.closed:
            return None
        offset, _, _ = page.file.page_span(page.page_no)
        try:
            writer(offset, bytes(page.data))
        except OSError as err:
            return err
        return None

    def _shrink_owners(self) -> None:
        """Pinned pages crowd out charges: ask each owner to give back the excess."""
        with self._lock:
            excess = self._used - self._budget
            if excess <= 0 or self._charged == 0:
                return
            owners = [o for o in self._owners if o.shrink is not None and o.charged_bytes]
        for owner in owners:
            if excess <= 0:
                break
            assert owner.shrink is not None
            excess -= owner.shrink(min(excess, owner.charged_bytes))

    # -- status -------------------------------------------------------------------------------

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                budget_bytes=self._budget,
                used_bytes=self._used,
                page_bytes=self._used - self._charged,
                charged_bytes=self._charged,
                pinned_bytes=self._pinned,
                over_budget_bytes=max(0, self._used - self._budget),
                pages={c.value: n for c, n in self._pages.items()},
                bytes_by_class={c.value: n for c, n in self._class_bytes.items()},
                dirty_pages=self._dirty_pages,
                closed_bytes=self._closed_bytes,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                writebacks=self._writebacks,
                load_errors=self._load_errors,
                refused_charges=self._refused,
                read_through_bytes=self._read_through_bytes,
            )

    def resident(self, file: PoolFile, page_no: int) -> bool:
        """Whether a page is in memory now (for tests and ``/status``)."""
        with self._lock:
            return isinstance(file.slots[page_no], _Page)


# -- byte caches charged to the pool ----------------------------------------------------------

_K = TypeVar("_K", bound=Hashable)


class ByteCache(Generic[_K]):
    """An LRU of byte strings under its own cap, every byte charged to the pool.

    Design 3: object payloads stay in the object and entry caches, "but they
    are charged to the same budget". ``put`` refuses (returns False) when
    the pool cannot make room, so the pool never exceeds its budget for a
    cache. The pool asks it to shrink when pinned pages need the room.
    Lock order: cache lock, then pool lock; the pool never calls back while
    holding its own.
    """

    __slots__ = ("_cap", "_entries", "_hits", "_lock", "_misses", "_owner", "_refused", "_used")

    def __init__(self, pool: BufferPool, name: str, cap_bytes: int) -> None:
        assert cap_bytes >= 0, cap_bytes
        self._cap = cap_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[_K, bytes] = OrderedDict()
        self._used = 0
        self._hits = 0
        self._misses = 0
        self._refused = 0
        self._owner = pool.register_owner(name, self._shrink)

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def cap_bytes(self) -> int:
        return self._cap

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: _K) -> bytes | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return value

    def put(self, key: _K, value: bytes) -> bool:
        n = len(value)
        if n > self._cap:
            with self._lock:
                self._refused += 1
            return False
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return True
            freed = self._evict_locked(self._cap - n)
        self._owner.release(freed)
        if not self._owner.charge(n):
            with self._lock:
                self._refused += 1
            return False
        with self._lock:
            if key in self._entries:
                freed = n
            else:
                freed = self._evict_locked(self._cap - n)
                self._entries[key] = value
                self._used += n
        self._owner.release(freed)
        return True

    def discard(self, key: _K) -> None:
        with self._lock:
            value = self._entries.pop(key, None)
            n = len(value) if value is not None else 0
            self._used -= n
        self._owner.release(n)

    def clear(self) -> None:
        with self._lock:
            freed = self._evict_locked(0)
        self._owner.release(freed)

    def _evict_locked(self, keep_bytes: int) -> int:
        freed = 0
        while self._used > keep_bytes and self._entries:
            _, value = self._entries.popitem(last=False)
            self._used -= len(value)
            freed += len(value)
        return freed

    def _shrink(self, nbytes: int) -> int:
        with self._lock:
            freed = self._evict_locked(max(0, self._used - nbytes))
        self._owner.release(freed)
        return freed

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "cap_bytes": self._cap,
                "used_bytes": self._used,
                "entries": len(self._entries),
                "hits": self._hits,
                "misses": self._misses,
                "refused": self._refused,
            }


SPILL_ENTRY_BYTES_MIN = 16 * KiB
"""Each entry :class:`EntrySpill` keeps counts as at least this against its cap, so its
index (about 200 bytes an entry in memory) stays under 1/80 of the cap on disk: 12 MiB
for 1 GiB of small entries. A depth-1 clone of the `large` profile averages 15.6 KB an
entry."""


class EntrySpill:
    """Full pack entries a large fetch rewrote, kept in one file on the node's disk.

    A depth-1 clone of the `large` profile rewrites 9,949 stored deltas whose bases it
    does not send, 155 MB of entries: more than the entry cache holds, so an LRU under
    that scan gave a repeated clone no hit, and it deflated all of them again, most of
    its CPU (issue 25, docs/serving.md, "Rewritten deltas"). Here they stay on disk
    (the kernel's page cache, not the process's memory) for the next fetch of the same
    tips. The file is append-only and unlinked at creation (``TemporaryFile``: nothing
    is left behind by a crash); when an entry would take it past ``cap_bytes`` it is
    started afresh, empty. Keys are those of :class:`NodeCaches`. A reader holds the
    file it looked the entry up in, so a restart under it reads the old file's bytes.
    """

    __slots__ = (
        "_cap",
        "_charged",
        "_dir",
        "_end",
        "_file",
        "_hits",
        "_index",
        "_lock",
        "_min",
        "_misses",
        "_resets",
    )

    def __init__(
        self, directory: str, cap_bytes: int, entry_bytes_min: int = SPILL_ENTRY_BYTES_MIN
    ) -> None:
        assert cap_bytes >= 0 and entry_bytes_min > 0, (cap_bytes, entry_bytes_min)
        self._dir = directory
        self._cap = cap_bytes
        self._min = entry_bytes_min
        self._charged = 0
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._index: dict[tuple[int, int], tuple[int, int]] = {}
        self._end = 0
        self._hits = 0
        self._misses = 0
        self._resets = 0

    def get(self, key: tuple[int, int]) -> bytes | None:
        with self._lock:
            where = self._index.get(key)
            held = self._file
            if where is None or held is None:
                self._misses += 1
                return None
            self._hits += 1
        offset, length = where
        return os.pread(held.fileno(), length, offset)

    def put(self, key: tuple[int, int], entry: bytes) -> bool:
        """Keep ``entry`` (False when it is not kept: larger than the cap, or no disk)."""
        n = len(entry)
        if n > self._cap:
            return False
        with self._lock:
            if key in self._index:
                return True
            charge = max(n, self._min)
            if self._file is None or self._charged + charge > self._cap:
                try:
                    os.makedirs(self._dir, exist_ok=True)
                    fresh = tempfile.TemporaryFile(dir=self._dir)  # noqa: SIM115 (held)
                except OSError:
                    return False  # no room for a file: the memo goes, never the fetch
                if self._file is not None:
                    self._resets += 1
                    log.info(
                        "rewritten-entry spill full (%d entries, %d bytes, cap %d): started "
                        "afresh (limits.serve_entry_spill_bytes_max)",
                        len(self._index),
                        self._end,
                        self._cap,
                    )
                self._file = fresh
                self._index.clear()
                self._end = self._charged = 0
            held, offset = self._file, self._end
            self._end += n
            self._charged += charge
        try:
            written = 0
            while written < n:
                written += os.pwrite(held.fileno(), memoryview(entry)[written:], offset + written)
        except OSError:
            return False  # a full disk costs the memo, never the fetch
        with self._lock:
            if self._file is not held:
                return False
            self._index[key] = (offset, n)
        return True

    def discard(self, key: tuple[int, int]) -> None:
        """Forget ``key`` (its lineage is gone); its bytes stay until the file restarts."""
        with self._lock:
            self._index.pop(key, None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "cap_bytes": self._cap,
                "used_bytes": self._end,
                "entries": len(self._index),
                "hits": self._hits,
                "misses": self._misses,
                "resets": self._resets,
            }


class NodeCaches:
    """The node's object cache (3/4 of ``node.cache``) and entry cache (1/4), one of each.

    Seed 004, "Why a pool": the object and entry caches are budgets of their own,
    and Design 3 charges their bytes to the pool. Views take them from the host
    (``RepositoryHost.caches``) instead of owning private ones. Keys are
    ``(scope, object id)``: a scope is one view lineage (a view built whole and
    every view derived from it by pushes, flushes and compactions), whose ids are
    stable (seed 004, "Stable object numbering"), so a compaction keeps every
    cached body and nothing is cached twice; a view built whole again takes a new
    scope, and the old scope's entries age out of the LRU.
    """

    __slots__ = ("_scopes", "entries", "objects", "spill")

    def __init__(self, pool: BufferPool, cache_bytes: int, spill: EntrySpill | None = None) -> None:
        object_bytes, entry_bytes = split_node_cache(cache_bytes)
        self.objects: ByteCache[tuple[int, int]] = ByteCache(pool, "objects", object_bytes)
        """Inflated bodies (delta chains applied) by (scope, object id)."""
        self.entries: ByteCache[tuple[int, int]] = ByteCache(pool, "entries", entry_bytes)
        """Full pack entries (header and zlib stream) of stored deltas, by (scope, object id)."""
        self.spill = spill
        """Full entries a large fetch rewrote, on disk (:class:`EntrySpill`), if any."""
        self._scopes = itertools.count(1)

    def new_scope(self) -> int:
        """A key prefix for one view lineage (``next`` on a count is atomic in CPython)."""
        return next(self._scopes)

    @property
    def used_bytes(self) -> int:
        return self.objects.used_bytes + self.entries.used_bytes

    def stats(self) -> dict[str, dict[str, int]]:
        """``/status`` ``caches``: each cache's cap, bytes, entries, hits, misses, refusals."""
        out = {"objects": self.objects.stats(), "entries": self.entries.stats()}
        if self.spill is not None:
            out["spill"] = self.spill.stats()
        return out
