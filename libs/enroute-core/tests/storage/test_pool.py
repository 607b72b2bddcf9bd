"""The buffer pool: seed 004, "Pages and memory" (its "Design" list, cited as Design 1-4).

Every page comes from a real file in ``tmp_path`` through ``os.pread``. The
state machine checks the budget rule after every step: "the pool never
exceeds its budget except by pinned pages". Randomised tests print their
seed and replay with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import ast
import errno
import os
import random
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import seed as hypothesis_seed
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from enroute_core.base.errors import CorruptData, NotLocal
from enroute_core.storage.localfile import LocalFile
from enroute_core.storage.pool import (
    DATA_PAGE_BYTES,
    DEFAULT_PAGE_CACHE_BYTES,
    META_PAGE_BYTES,
    BufferPool,
    ByteCache,
    ClockRing,
    Intent,
    Loader,
    PageClass,
    PageGuard,
    PoolFile,
    Region,
    split_node_cache,
)

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
KiB = 1024
MiB = 1024 * KiB
SRC = Path(__file__).resolve().parents[2] / "src" / "enroute_core" / "storage"


def _write(path: Path, size: int, rng: random.Random) -> bytes:
    data = rng.randbytes(size)
    path.write_bytes(data)
    return data


class FileLoader:
    """A pread loader over a real file that can be told to fail, and counts its calls."""

    def __init__(self, lf: LocalFile) -> None:
        self.lf = lf
        self.calls = 0
        self.intents: list[Intent] = []
        self.fail: BaseException | None = None
        self.gate: threading.Event | None = None

    def __call__(self, offset: int, length: int, intent: Intent) -> bytes:
        self.calls += 1
        self.intents.append(intent)
        if self.gate is not None:
            assert self.gate.wait(5)
        if self.fail is not None:
            err, self.fail = self.fail, None
            raise err
        return self.lf.read_exact(offset, length)


def _open(
    pool: BufferPool,
    tmp_path: Path,
    name: str,
    size: int,
    rng: random.Random,
    *,
    regions: list[Region] | None = None,
) -> tuple[PoolFile, bytes, FileLoader]:
    data = _write(tmp_path / name, size, rng)
    loader = FileLoader(LocalFile.open_read(tmp_path / name))
    return pool.open_file(name, size, loader, regions), data, loader


def _check_budget(pool: BufferPool) -> None:
    s = pool.stats()
    assert s.used_bytes <= s.budget_bytes + s.pinned_bytes, s
    assert s.page_bytes == sum(s.bytes_by_class.values()), s
    assert s.over_budget_bytes == max(0, s.used_bytes - s.budget_bytes)


# -- pages and page tables ------------------------------------------------------------------


def test_defaults_follow_the_seed() -> None:
    """Seed 004, "Pages and memory": node.page_cache 256 MiB, 4 KiB table and 64 KiB data pages."""
    assert 256 * MiB == DEFAULT_PAGE_CACHE_BYTES
    assert BufferPool().budget_bytes == 256 * MiB
    assert (PageClass.META.page_bytes, PageClass.DATA.page_bytes) == (4 * KiB, 64 * KiB)
    assert split_node_cache(1000) == (750, 250)
    assert sum(split_node_cache(1001)) == 1001


def test_regions_page_per_class(tmp_path: Path) -> None:
    """A file registers its page size per region; the last page of a region is short."""
    rng = random.Random(SEED)
    pool = BufferPool(1 * MiB)
    regions = [Region(0, 150 * KiB, PageClass.DATA), Region(160 * KiB, 170 * KiB, PageClass.META)]
    f, data, _ = _open(pool, tmp_path, "layer", 170 * KiB, rng, regions=regions)
    assert f.page_count == 3 + 3
    assert f.page_span(2) == (128 * KiB, 22 * KiB, PageClass.DATA)
    assert f.page_span(3) == (160 * KiB, 4 * KiB, PageClass.META)
    assert f.page_span(5) == (168 * KiB, 2 * KiB, PageClass.META)
    assert f.page_at(0) == 0 and f.page_at(150 * KiB - 1) == 2 and f.page_at(169 * KiB) == 5
    with pytest.raises(ValueError):
        f.page_at(155 * KiB)  # the gap between regions is not paged
    for page_no in range(f.page_count):
        off, length, _ = f.page_span(page_no)
        with pool.pin(f, page_no) as page:
            assert bytes(page) == data[off : off + length]
            assert page.readonly
    s = pool.stats()
    assert s.pages == {"meta": 3, "data": 3}
    assert s.bytes_by_class == {"meta": 10 * KiB, "data": 150 * KiB}
    with pytest.raises(ValueError):
        pool.pin(f, f.page_count)


def test_hit_reuses_the_page_and_counts(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    pool = BufferPool(1 * MiB)
    f, data, loader = _open(pool, tmp_path, "f", 200 * KiB, rng)
    with pool.pin(f, 1) as a, pool.pin(f, 1) as b:
        assert a.obj is b.obj  # one resident copy, two pins
        assert pool.stats().pinned_bytes == DATA_PAGE_BYTES
    assert loader.calls == 1
    s = pool.stats()
    assert (s.hits, s.misses, s.pinned_bytes) == (1, 1, 0)
    assert f.size == len(data)
    for off, n in [(0, 10), (65530, 20), (100, 150_000), (len(data) - 5, 5)]:
        assert pool.read(f, off, n, Intent.POINT) == data[off : off + n]


def test_loader_errors_fail_the_read_and_leave_no_page(tmp_path: Path) -> None:
    """Design 2: "An I/O error fails the read and does not stop the process"."""
    rng = random.Random(SEED)
    pool = BufferPool(1 * MiB)
    f, data, loader = _open(pool, tmp_path, "f", 100 * KiB, rng)
    for err in (OSError(errno.EIO, "bad sector"), NotLocal("chunk 0 is not local")):
        loader.fail = err
        with pytest.raises(type(err)):
            pool.pin(f, 0)
        assert not pool.resident(f, 0)
        s = pool.stats()
        assert (s.used_bytes, s.pinned_bytes, s.pages["data"]) == (0, 0, 0)
    assert pool.stats().load_errors == 2
    with pool.pin(f, 0) as page:
        assert bytes(page) == data[: 64 * KiB]


def test_short_load_is_corrupt_data(tmp_path: Path) -> None:
    pool = BufferPool(1 * MiB)
    (tmp_path / "f").write_bytes(b"x" * 1000)

    def short(offset: int, length: int, intent: Intent) -> bytes:
        return b"x" * (length - 1)

    f = pool.open_file("f", 1000, short)
    with pytest.raises(CorruptData):
        pool.pin(f, 0)
    assert pool.stats().used_bytes == 0


def test_everything_pinned_exceeds_only_by_pins(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    pool = BufferPool(2 * META_PAGE_BYTES)
    f, data, _ = _open(
        pool, tmp_path, "f", 16 * KiB, rng, regions=[Region(0, 16 * KiB, PageClass.META)]
    )
    guards = [pool.pin(f, n) for n in range(4)]
    s = pool.stats()
    assert (s.used_bytes, s.pinned_bytes, s.over_budget_bytes) == (16 * KiB, 16 * KiB, 8 * KiB)
    _check_budget(pool)
    for n, g in enumerate(guards):
        assert bytes(g.page) == data[n * 4 * KiB : (n + 1) * 4 * KiB]
        g.release()
        _check_budget(pool)
    s = pool.stats()
    assert (s.used_bytes, s.pinned_bytes, s.over_budget_bytes) == (8 * KiB, 0, 0)


def test_concurrent_misses_share_one_pread(tmp_path: Path) -> None:
    """The other reader waits on the loading page: one pread per page, never two."""
    rng = random.Random(SEED)
    pool = BufferPool(1 * MiB)
    f, data, loader = _open(pool, tmp_path, "f", 64 * KiB, rng)
    loader.gate = threading.Event()
    seen: list[bytes] = []

    def reader() -> None:
        with pool.pin(f, 0) as page:
            seen.append(bytes(page))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    loader.gate.set()
    for t in threads:
        t.join(10)
    assert seen == [data] * 4
    assert loader.calls == 1
    s = pool.stats()
    assert (s.misses, s.hits) == (1, 3)


def test_waiters_retry_after_a_failed_load(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    pool = BufferPool(1 * MiB)
    f, data, loader = _open(pool, tmp_path, "f", 64 * KiB, rng)
    loader.gate = threading.Event()
    loader.fail = OSError(errno.EIO, "once")
    results: list[object] = []

    def reader() -> None:
        try:
            with pool.pin(f, 0) as page:
                results.append(bytes(page))
        except OSError as err:
            results.append(err)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    loader.gate.set()
    for t in threads:
        t.join(10)
    assert sum(isinstance(r, OSError) for r in results) == 1
    assert results.count(data) == 2


# -- CLOCK, intent and closed files ---------------------------------------------------------


def _working_set_survives(tmp_path: Path, scan_intent: Intent) -> tuple[int, int]:
    rng = random.Random(SEED)
    pool = BufferPool(16 * META_PAGE_BYTES)
    meta = [Region(0, 64 * KiB, PageClass.META)]
    hot, hot_data, hot_loader = _open(pool, tmp_path, "hot", 64 * KiB, rng, regions=meta)
    big = [Region(0, 1200 * KiB, PageClass.META)]
    cold, cold_data, _ = _open(pool, tmp_path, "cold", 1200 * KiB, rng, regions=big)
    working = range(0, 16, 2)  # 8 pages: half the pool
    for _ in range(2):
        for n in working:
            with pool.pin(hot, n, Intent.POINT) as page:
                assert bytes(page) == hot_data[n * 4 * KiB : (n + 1) * 4 * KiB]
    loads = hot_loader.calls
    for n in range(cold.page_count):  # a scan 18x the pool
        with pool.pin(cold, n, scan_intent) as page:
            assert bytes(page) == cold_data[n * 4 * KiB : (n + 1) * 4 * KiB]
        _check_budget(pool)
    for n in working:
        with pool.pin(hot, n, Intent.POINT):
            pass
    return hot_loader.calls - loads, pool.stats().evictions


def test_scan_resistance(tmp_path: Path) -> None:
    """Design 2: "Scans (full clones, compaction) insert pages cold"; the working set survives."""
    reloads, evictions = _working_set_survives(tmp_path, Intent.SCAN)
    assert reloads == 0
    assert evictions >= 300 - 8


def test_scan_without_cold_insert_would_evict(tmp_path: Path) -> None:
    """The same scan as point reads displaces the working set: the test above can fail."""
    reloads, _ = _working_set_survives(tmp_path, Intent.POINT)
    assert reloads == 8


def test_closed_file_pages_pruned_lazily(tmp_path: Path) -> None:
    """Design 2: "prunes closed files lazily"; closing only marks."""
    rng = random.Random(SEED)
    pool = BufferPool(1 * MiB)
    meta = [Region(0, 128 * KiB, PageClass.META)]
    a, _, _ = _open(pool, tmp_path, "a", 128 * KiB, rng, regions=meta)
    b, b_data, _ = _open(pool, tmp_path, "b", 128 * KiB, rng, regions=meta)
    for n in range(32):
        with pool.pin(a, n):
            pass
    g = pool.pin(a, 3)
    pool.close_file(a)
    s = pool.stats()
    assert s.closed_bytes == 32 * 4 * KiB and s.pages["meta"] == 32  # nothing dropped yet
    for n in range(8):  # each load runs the prune cursor a few steps
        assert pool.read(b, n * 4 * KiB, 10, Intent.POINT) == b_data[n * 4 * KiB : n * 4 * KiB + 10]
    s = pool.stats()
    assert s.closed_bytes == 4 * KiB  # only the pinned page is left
    assert bytes(g.page)  # still readable while pinned
    g.release()
    pool.prune_closed()
    assert pool.stats().closed_bytes == 0
    assert pool.stats().pages["meta"] == 8
    with pytest.raises(AssertionError):
        pool.pin(a, 0)


def test_hand_prunes_closed_before_referenced(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    pool = BufferPool(4 * META_PAGE_BYTES)
    meta = [Region(0, 32 * KiB, PageClass.META)]
    a, _, _ = _open(pool, tmp_path, "a", 32 * KiB, rng, regions=meta)
    b, _, b_loader = _open(pool, tmp_path, "b", 32 * KiB, rng, regions=meta)
    for n in range(2):
        pool.read(a, n * 4 * KiB, 1, Intent.POINT)
        pool.read(b, n * 4 * KiB, 1, Intent.POINT)
    pool.close_file(a)
    pool.read(b, 2 * 4 * KiB, 1, Intent.POINT)
    pool.read(b, 3 * 4 * KiB, 1, Intent.POINT)
    assert pool.stats().closed_bytes == 0
    calls = b_loader.calls
    pool.read(b, 0, 1, Intent.POINT)
    pool.read(b, 4 * KiB, 1, Intent.POINT)
    assert b_loader.calls == calls  # b's referenced pages outlived a's closed ones


def test_clock_ring_holes_and_compaction() -> None:
    class Item:
        def __init__(self, key: int) -> None:
            self.key = key
            self.ring_pos = -1
            self.ref = False

    rng = random.Random(SEED)
    ring: ClockRing[Item] = ClockRing()
    live: list[Item] = []
    for step in range(3000):
        if live and rng.random() < 0.45:
            item = live.pop(rng.randrange(len(live)))
            ring.remove(item)
        else:
            item = Item(step)
            ring.insert(item, cold=rng.random() < 0.5)
            live.append(item)
        if step % 97 == 0:
            ring.advance()
        assert len(ring) == len(live)
        assert ring.capacity <= 2 * len(live) + 130
    for item in live:
        assert ring.at(item.ring_pos) is item


def test_cold_insert_lands_under_the_hand() -> None:
    class Item:
        def __init__(self) -> None:
            self.ring_pos = -1
            self.ref = False

    ring: ClockRing[Item] = ClockRing()
    items = [Item() for _ in range(4)]
    for it in items:
        ring.insert(it, cold=False)
    victim = ring.current()
    assert victim is items[0]
    ring.remove(victim)
    fresh = Item()
    ring.insert(fresh, cold=True)
    assert ring.current() is fresh
    ring.remove(fresh)
    hot = Item()
    ring.insert(hot, cold=False)
    assert ring.current() is items[1]


# -- writable temp pages --------------------------------------------------------------------


def _temp(
    pool: BufferPool,
    tmp_path: Path,
    page_class: PageClass,
    writer: Callable[[int, bytes], None] | None = None,
) -> tuple[PoolFile, LocalFile]:
    scratch = LocalFile.open_rw(tmp_path / "scratch")

    def load(offset: int, length: int, intent: Intent) -> bytes:
        return scratch.read_padded(offset, length)

    f = pool.open_temp("temp", load, writer or scratch.write_at, page_class=page_class)
    return f, scratch


def test_dirty_temp_pages_survive_eviction(tmp_path: Path) -> None:
    """Design 3: temp pages are "written back to a scratch file when evicted"."""
    rng = random.Random(SEED)
    pool = BufferPool(4 * META_PAGE_BYTES)
    f, scratch = _temp(pool, tmp_path, PageClass.META)
    model = bytearray()
    for _ in range(60):
        off = rng.randrange(0, 96 * KiB)
        chunk = rng.randbytes(rng.randrange(1, 9000))
        pool.write(f, off, chunk)
        if len(model) < off + len(chunk):
            model.extend(bytes(off + len(chunk) - len(model)))
        model[off : off + len(chunk)] = chunk
        _check_budget(pool)
    s = pool.stats()
    assert s.writebacks > 0 and s.evictions > 0
    assert pool.read(f, 0, len(model), Intent.SCAN) == bytes(model)
    pool.close_file(f)
    pool.prune_closed()
    assert pool.stats().used_bytes == 0
    assert scratch.size <= len(model) + 4 * KiB
    scratch.close()


def test_pin_mut_only_for_temp_and_views(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    pool = BufferPool(1 * MiB)
    f, _, _ = _open(pool, tmp_path, "f", 4 * KiB, rng)
    with pytest.raises(AssertionError):
        pool.pin_mut(f, 0)
    t, scratch = _temp(pool, tmp_path, PageClass.META)
    with pool.pin_mut(t, 0) as page:
        assert not page.readonly
        page[:3] = b"abc"
    with pool.pin(t, 0) as page:
        assert page.readonly and bytes(page[:4]) == b"abc\0"
    assert pool.stats().dirty_pages == 1
    scratch.close()


def test_failed_write_back_poisons_only_the_temp_file(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    pool = BufferPool(4 * META_PAGE_BYTES)

    def broken(offset: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "scratch disk full")

    t, scratch = _temp(pool, tmp_path, PageClass.META, broken)
    f, data, _ = _open(
        pool, tmp_path, "f", 64 * KiB, rng, regions=[Region(0, 64 * KiB, PageClass.META)]
    )
    pool.write(t, 0, b"y" * (4 * 4 * KiB))
    for n in range(8):  # pressure forces write-backs, which fail
        assert (
            pool.read(f, n * 4 * KiB, 4 * KiB, Intent.POINT)
            == data[n * 4 * KiB : (n + 1) * 4 * KiB]
        )
        _check_budget(pool)
    with pytest.raises(OSError) as exc:
        pool.pin(t, 0)
    assert exc.value.errno == errno.ENOSPC
    assert pool.stats().used_bytes <= 4 * META_PAGE_BYTES
    scratch.close()


# -- charges ------------------------------------------------------------------------------


def test_byte_cache_charges_the_pool(tmp_path: Path) -> None:
    """Design 3: the object and entry caches are "charged to the same budget"."""
    rng = random.Random(SEED)
    pool = BufferPool(64 * KiB)
    meta = [Region(0, 64 * KiB, PageClass.META)]
    f, _, loader = _open(pool, tmp_path, "f", 64 * KiB, rng, regions=meta)
    for n in range(16):
        pool.read(f, n * 4 * KiB, 1, Intent.POINT)
    assert pool.stats().page_bytes == 64 * KiB
    cache: ByteCache[bytes] = ByteCache(pool, "objects", 40 * KiB)
    assert cache.put(b"a", b"A" * 10 * KiB)  # evicts pages to make room
    assert cache.put(b"b", b"B" * 20 * KiB)
    s = pool.stats()
    assert s.charged_bytes == 30 * KiB and s.used_bytes <= s.budget_bytes
    assert cache.get(b"a") == b"A" * 10 * KiB
    assert cache.put(b"c", b"C" * 20 * KiB)  # over its own cap: drops LRU "b"
    assert cache.get(b"b") is None and cache.get(b"a") is not None
    assert cache.used_bytes == 30 * KiB == pool.stats().charged_bytes
    assert not cache.put(b"huge", b"H" * 41 * KiB)
    # Every page pinned: the cache may not grow into pinned memory.
    cache.clear()
    assert pool.stats().charged_bytes == 0
    guards = [pool.pin(f, n) for n in range(16)]
    assert not cache.put(b"d", b"D" * KiB)
    assert cache.stats()["refused"] == 2
    _check_budget(pool)
    for g in guards:
        g.release()
    assert cache.put(b"d", b"D" * KiB)
    assert loader.calls >= 16


def test_pinned_pages_shrink_the_caches(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    pool = BufferPool(32 * KiB)
    cache: ByteCache[int] = ByteCache(pool, "entries", 32 * KiB)
    for k in range(8):
        assert cache.put(k, bytes([k]) * 4 * KiB)
    assert pool.stats().charged_bytes == 32 * KiB
    f, _, _ = _open(
        pool, tmp_path, "f", 16 * KiB, rng, regions=[Region(0, 16 * KiB, PageClass.META)]
    )
    guards = [pool.pin(f, n) for n in range(4)]
    s = pool.stats()
    assert s.charged_bytes == 16 * KiB and s.used_bytes == 32 * KiB
    assert cache.get(0) is None and cache.get(7) == bytes([7]) * 4 * KiB  # LRU went first
    for g in guards:
        g.release()
    _check_budget(pool)


def test_charge_and_release_directly() -> None:
    pool = BufferPool(10_000)
    owner = pool.register_owner("ingest")
    assert owner.charge(6000)
    assert not owner.charge(5000)
    assert pool.stats().refused_charges == 1
    owner.release(6000)
    assert owner.charge(10_000) and owner.charged_bytes == 10_000
    with pytest.raises(AssertionError):
        owner.release(10_001)


# -- the state machine ----------------------------------------------------------------------

_SIZES = (37 * KiB, 300 * KiB, 9 * KiB)
_BUDGET = 160 * KiB
_PINS_MAX = 6


def _regions(size: int, i: int) -> list[Region]:
    if i == 0:
        return [Region(0, 20 * KiB, PageClass.DATA), Region(24 * KiB, size, PageClass.META)]
    return [Region(0, size, PageClass.DATA if i == 1 else PageClass.META)]


class PoolMachine(RuleBasedStateMachine):
    """Random pin/unpin/read/close/charge/temp writes on several real files."""

    def __init__(self, root: Path, contents: list[bytes]) -> None:
        super().__init__()
        self.root = root
        self.contents = contents
        self.pool = BufferPool(_BUDGET)
        self.handles = [LocalFile.open_read(root / f"f{i}") for i in range(len(contents))]
        self.loaders = [FileLoader(h) for h in self.handles]
        self.files: list[PoolFile] = [self._open(i) for i in range(len(contents))]
        self.closed: list[PoolFile] = []
        self.guards: list[tuple[PageGuard, bytes]] = []
        self.owner = self.pool.register_owner("charges")
        self.charged = 0
        self.cache: ByteCache[int] = ByteCache(self.pool, "objects", 48 * KiB)
        # A fresh file per machine: id(self) is reused once a machine is
        # freed, and an old machine's bytes showed through a new one's holes.
        fd, scratch_path = tempfile.mkstemp(prefix="scratch-", dir=root)
        os.close(fd)
        self.scratch = LocalFile.open_rw(scratch_path)
        self.temp = self.pool.open_temp(
            "temp", self._scratch_load, self.scratch.write_at, page_class=PageClass.META
        )
        self.model = bytearray()

    def _scratch_load(self, offset: int, length: int, intent: Intent) -> bytes:
        return self.scratch.read_padded(offset, length)

    def _open(self, i: int) -> PoolFile:
        size = len(self.contents[i])
        loader: Loader = self.loaders[i]
        return self.pool.open_file(f"f{i}", size, loader, _regions(size, i))

    def _expected(self, i: int, f: PoolFile, page_no: int) -> bytes:
        off, length, _ = f.page_span(page_no)
        return self.contents[i][off : off + length]

    @rule(i=st.integers(0, 2), at=st.floats(0, 1, exclude_max=True), scan=st.booleans())
    def read(self, i: int, at: float, scan: bool) -> None:
        f = self.files[i]
        n = int(at * f.page_count)
        with self.pool.pin(f, n, Intent.SCAN if scan else Intent.POINT) as page:
            assert bytes(page) == self._expected(i, f, n)

    @rule(
        i=st.integers(0, 2),
        at=st.floats(0, 1, exclude_max=True),
        n=st.integers(1, 300 * KiB),
    )
    def read_through(self, i: int, at: float, n: int) -> None:
        """``BufferPool.read_through``: the bytes, and no page taken, pinned or dropped."""
        f = self.files[i]
        regions = f.regions
        r = regions[int(at * len(regions))]
        off = r.start + int(at * (r.end - r.start))
        n = min(n, r.end - off)
        before = self.pool.stats()
        assert self.pool.read_through(f, off, n) == self.contents[i][off : off + n]
        after = self.pool.stats()
        assert (after.page_bytes, after.pinned_bytes) == (before.page_bytes, before.pinned_bytes)
        assert after.evictions == before.evictions

    @precondition(lambda self: bool(self.model))
    @rule(at=st.floats(0, 1, exclude_max=True), n=st.integers(1, 30 * KiB))
    def temp_read_through(self, at: float, n: int) -> None:
        off = int(at * len(self.model))
        n = min(n, len(self.model) - off)
        assert self.pool.read_through(self.temp, off, n) == bytes(self.model[off : off + n])

    @precondition(lambda self: len(self.guards) < _PINS_MAX)
    @rule(i=st.integers(0, 2), at=st.floats(0, 1, exclude_max=True), scan=st.booleans())
    def pin(self, i: int, at: float, scan: bool) -> None:
        f = self.files[i]
        n = int(at * f.page_count)
        g = self.pool.pin(f, n, Intent.SCAN if scan else Intent.POINT)
        self.guards.append((g, self._expected(i, f, n)))

    @precondition(lambda self: bool(self.guards))
    @rule(k=st.integers(0, _PINS_MAX - 1))
    def unpin(self, k: int) -> None:
        g, _ = self.guards.pop(k % len(self.guards))
        g.release()

    @rule(i=st.integers(0, 2), at=st.floats(0, 1, exclude_max=True))
    def failing_read(self, i: int, at: float) -> None:
        f = self.files[i]
        n = int(at * f.page_count)
        if self.pool.resident(f, n):
            return
        self.loaders[i].fail = NotLocal("not loaded")
        with pytest.raises(NotLocal):
            self.pool.pin(f, n)
        assert not self.pool.resident(f, n)

    @rule(i=st.integers(0, 2))
    def close_and_reopen(self, i: int) -> None:
        self.pool.close_file(self.files[i])
        self.closed.append(self.files[i])
        self.files[i] = self._open(i)

    @rule(n=st.integers(1, 64 * KiB))
    def charge(self, n: int) -> None:
        if self.owner.charge(n):
            self.charged += n

    @precondition(lambda self: self.charged > 0)
    @rule(frac=st.floats(0, 1))
    def release(self, frac: float) -> None:
        n = int(self.charged * frac)
        self.owner.release(n)
        self.charged -= n

    @rule(key=st.integers(0, 20), n=st.integers(1, 20 * KiB))
    def cache_put_get(self, key: int, n: int) -> None:
        value = key.to_bytes(1, "big") * n
        stored = self.cache.put(key, value)
        got = self.cache.get(key)
        assert got is None or got[:1] == key.to_bytes(1, "big")
        if not stored:
            assert got is None or len(got) != n or got == value

    @rule(off=st.integers(0, 200 * KiB), n=st.integers(1, 12 * KiB), fill=st.integers(1, 255))
    def temp_write(self, off: int, n: int, fill: int) -> None:
        data = bytes([fill]) * n
        self.pool.write(self.temp, off, data)
        if len(self.model) < off + n:
            self.model.extend(bytes(off + n - len(self.model)))
        self.model[off : off + n] = data

    @precondition(lambda self: bool(self.model))
    @rule(at=st.floats(0, 1, exclude_max=True), n=st.integers(1, 30 * KiB))
    def temp_read(self, at: float, n: int) -> None:
        off = int(at * len(self.model))
        n = min(n, len(self.model) - off)
        assert self.pool.read(self.temp, off, n, Intent.POINT) == bytes(self.model[off : off + n])

    @invariant()
    def within_budget_but_for_pins(self) -> None:
        _check_budget(self.pool)
        s = self.pool.stats()
        assert s.charged_bytes == self.charged + self.cache.used_bytes
        assert s.charged_bytes <= s.budget_bytes

    @invariant()
    def pinned_pages_hold_the_file_bytes(self) -> None:
        for g, expected in self.guards:
            assert bytes(g.page) == expected

    def teardown(self) -> None:
        for g, _ in self.guards:
            g.release()
        if self.model:
            assert self.pool.read(self.temp, 0, len(self.model), Intent.SCAN) == self.model
        for f in [*self.files, self.temp]:
            self.pool.close_file(f)
        self.pool.prune_closed()
        s = self.pool.stats()
        assert s.closed_bytes == 0 and s.page_bytes == 0 and s.pinned_bytes == 0, s
        for h in self.handles:
            h.close()
        self.scratch.close()


def test_pool_never_exceeds_its_budget_but_by_pins(tmp_path: Path) -> None:
    print(f"ENROUTE_SEED={SEED}")
    rng = random.Random(SEED)
    contents = [_write(tmp_path / f"f{i}", size, rng) for i, size in enumerate(_SIZES)]

    def make() -> PoolMachine:
        return PoolMachine(tmp_path, contents)

    run_state_machine_as_test(
        hypothesis_seed(SEED)(make),  # type: ignore[arg-type]
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None),
    )


def test_written_back_victims_leave_the_pool_within_budget(tmp_path: Path) -> None:
    """A dirty victim written back clean is dropped at once (CI seed 95110476).

    The hand had passed the victim while it was written back, so the pool
    stayed one byte over budget with nothing pinned.
    """
    rng = random.Random(1)
    contents = [_write(tmp_path / f"f{i}", size, rng) for i, size in enumerate(_SIZES)]
    m = PoolMachine(tmp_path, contents)
    for n in (1, 45056, 65536):
        m.charge(n)
    for off, n in ((45055, 2), (4095, 4098), (81919, 8194), (16383, 8194)):
        m.temp_write(off=off, n=n, fill=1)
        m.within_budget_but_for_pins()
    m.teardown()


# -- no mmap --------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["pool.py", "diskbudget.py", "localfile.py"])
def test_no_mmap(module: str) -> None:
    """Design 4: "No mmap for layers"; nothing here imports it."""
    tree = ast.parse((SRC / module).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "mmap" not in names
