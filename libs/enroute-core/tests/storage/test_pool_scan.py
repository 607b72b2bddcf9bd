"""Scans through the buffer pool: seed 004, "Pages and memory" (Design 2: "Scans
(full clones, compaction) insert pages cold").

``BufferPool.scan`` reads runs of missing pages with one read each and recycles
the scan's own older pages. These tests check that it keeps the pool's rules:
the budget (read-ahead included), pinned and referenced pages are never taken,
one read per page for concurrent readers, a failed run fails only the page
that cannot be read, and no mmap. Randomised tests print their seed and replay
with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData, NotLocal
from enroute_core.storage.localfile import LocalFile, preadv_full
from enroute_core.storage.pool import (
    DATA_PAGE_BYTES,
    META_PAGE_BYTES,
    SCAN_RING_RUNS,
    SCAN_RUN_BYTES,
    BufferPool,
    Intent,
    PageClass,
    PoolFile,
    Region,
)

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
KiB = 1024
MiB = 1024 * KiB


class RunReader:
    """A loader and a scatter reader over a real file; counts calls and can fail or wait."""

    def __init__(self, lf: LocalFile) -> None:
        self.lf = lf
        self.loads: list[tuple[int, int]] = []
        self.runs: list[tuple[int, int]] = []
        self.bad: tuple[int, int] | None = None  # reads touching [start, end) raise NotLocal
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def _check(self, offset: int, length: int) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(5)
        if self.bad is not None and offset < self.bad[1] and self.bad[0] < offset + length:
            raise NotLocal(f"bytes at {offset} are not local")

    def load(self, offset: int, length: int, intent: Intent) -> bytes:
        self.loads.append((offset, length))
        self._check(offset, length)
        return self.lf.read_exact(offset, length)

    def read_into(self, offset: int, buffers: Sequence[bytearray], intent: Intent) -> None:
        assert intent is Intent.SCAN
        length = sum(len(b) for b in buffers)
        self.runs.append((offset, length))
        self._check(offset, length)
        self.lf.read_into(offset, buffers)


def _file(
    pool: BufferPool,
    tmp_path: Path,
    size: int,
    *,
    regions: list[Region] | None = None,
    scatter: bool = True,
    name: str = "f",
) -> tuple[PoolFile, bytes, RunReader]:
    data = random.Random(SEED).randbytes(size)
    (tmp_path / name).write_bytes(data)
    rr = RunReader(LocalFile.open_read(tmp_path / name))
    f = pool.open_file(name, size, rr.load, regions, read_into=rr.read_into if scatter else None)
    return f, data, rr


def _expected(f: PoolFile, data: bytes, page_no: int) -> bytes:
    off, length, _ = f.page_span(page_no)
    return data[off : off + length]


def _check_budget(pool: BufferPool) -> None:
    s = pool.stats()
    assert s.used_bytes <= s.budget_bytes + s.pinned_bytes, s
    assert s.page_bytes == sum(s.bytes_by_class.values()), s


@pytest.mark.parametrize("scatter", [True, False])
def test_scan_yields_every_page_across_regions(tmp_path: Path, scatter: bool) -> None:
    print(f"ENROUTE_SEED={SEED}")
    size = 3 * MiB + 123
    regions = [
        Region(0, 2 * MiB + 5, PageClass.DATA),  # short last data page
        Region(2 * MiB + 4 * KiB, size, PageClass.META),
    ]
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, size, regions=regions, scatter=scatter)
    seen = []
    with pool.scan(f) as pages:
        for page_no, view in pages:
            assert view.readonly
            assert bytes(view) == _expected(f, data, page_no)
            seen.append(page_no)
    assert seen == list(range(f.page_count))
    calls = rr.runs if scatter else rr.loads
    assert calls == (rr.runs + rr.loads)  # one path only
    # One read per run of at most 1 MiB, split at the end of a region.
    assert calls == [
        (0, MiB),
        (MiB, MiB),
        (2 * MiB, 5),
        (2 * MiB + 4 * KiB, size - 2 * MiB - 4 * KiB),
    ]
    s = pool.stats()
    assert (s.misses, s.hits, s.pinned_bytes) == (f.page_count, 0, 0)
    _check_budget(pool)


def test_scan_keeps_only_its_ring(tmp_path: Path) -> None:
    """A scan of a file larger than the pool neither floods it nor maps memory per page."""
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, 20 * MiB)
    with pool.scan(f) as pages:
        for page_no, view in pages:
            assert view[:8] == _expected(f, data, page_no)[:8]
            assert pool.stats().page_bytes <= SCAN_RING_RUNS * SCAN_RUN_BYTES
    s = pool.stats()
    assert s.page_bytes == SCAN_RING_RUNS * SCAN_RUN_BYTES
    assert s.evictions == f.page_count - s.pages["data"]
    assert len(rr.runs) == 20


@settings(max_examples=25, deadline=None)
@given(
    budget_pages=st.integers(1, 40),
    size=st.integers(1, 300 * KiB),
    meta=st.booleans(),
    first=st.floats(0, 1, exclude_max=True),
)
def test_read_ahead_stays_within_the_budget(
    tmp_path_factory: pytest.TempPathFactory,
    budget_pages: int,
    size: int,
    meta: bool,
    first: float,
) -> None:
    """Runs and the ring are at most budget / 8; the pool is over only by the pinned run."""
    tmp_path = tmp_path_factory.mktemp("ra")
    pb = META_PAGE_BYTES if meta else DATA_PAGE_BYTES
    budget = budget_pages * pb
    pool = BufferPool(budget)
    cls = PageClass.META if meta else PageClass.DATA
    f, data, rr = _file(pool, tmp_path, size, regions=[Region(0, size, cls)])
    start = int(first * f.page_count)
    with pool.scan(f, start) as pages:
        for page_no, view in pages:
            assert bytes(view) == _expected(f, data, page_no)
            s = pool.stats()
            assert s.pinned_bytes <= max(pb, budget // 8), s
            _check_budget(pool)
    for _offset, length in rr.runs:
        assert length <= max(pb, budget // 8)
    s = pool.stats()
    assert s.pinned_bytes == 0 and s.used_bytes <= budget, s


def test_pinned_and_referenced_pages_are_never_recycled(tmp_path: Path) -> None:
    pool = BufferPool(64 * MiB)
    f, data, _ = _file(pool, tmp_path, 8 * MiB)
    guard = None
    with pool.scan(f) as pages:
        for page_no, view in pages:
            if page_no == 3:  # pinned by another reader while the scan goes on
                guard = pool.pin(f, 3)
            if page_no == 5:  # a point hit: now somebody's working set
                with pool.pin(f, 5, Intent.POINT) as page:
                    assert bytes(page) == bytes(view)
    assert guard is not None
    assert bytes(guard.page) == _expected(f, data, 3)
    assert pool.resident(f, 3) and pool.resident(f, 5)
    assert not pool.resident(f, 4)  # its neighbour was recycled
    guard.release()
    with pool.pin(f, 5) as page:
        assert bytes(page) == _expected(f, data, 5)
    _check_budget(pool)


def test_resident_pages_are_hits_and_not_stolen(tmp_path: Path) -> None:
    """Pages loaded by point reads are pinned as hits; the scan recycles only its own."""
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, 4 * MiB)
    for n in (0, 1, 40):
        with pool.pin(f, n):
            pass
    with pool.scan(f) as pages:
        got = {n: bytes(v) for n, v in pages}
    assert got == {n: _expected(f, data, n) for n in range(f.page_count)}
    assert pool.stats().hits == 3
    assert all(pool.resident(f, n) for n in (0, 1, 40))
    assert rr.runs[0] == (2 * DATA_PAGE_BYTES, 16 * DATA_PAGE_BYTES)  # starts after the hits


def test_scan_working_set_survives(tmp_path: Path) -> None:
    """Through a full pool, a scan leaves the referenced working set in memory."""
    pool = BufferPool(8 * MiB)
    hot, _, _ = _file(pool, tmp_path, 6 * MiB, name="hot")
    for n in range(hot.page_count):
        with pool.pin(hot, n, Intent.POINT):
            pass
    big, _, _ = _file(pool, tmp_path, 32 * MiB, name="big")
    with pool.scan(big) as pages:
        for _ in pages:
            pass
    assert all(pool.resident(hot, n) for n in range(hot.page_count))
    _check_budget(pool)


def test_concurrent_reader_waits_for_the_run(tmp_path: Path) -> None:
    """A pin of a page the scan is loading waits on it: one read for both."""
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, 2 * MiB)
    rr.gate = threading.Event()
    seen: list[bytes] = []

    def scanner() -> None:
        with pool.scan(f) as pages:
            for n, view in pages:
                if n == 7:
                    seen.append(bytes(view))

    def pinner() -> None:
        with pool.pin(f, 7) as page:
            seen.append(bytes(page))

    t1 = threading.Thread(target=scanner)
    t1.start()
    assert rr.entered.wait(5)  # the scan holds the run's marker
    t2 = threading.Thread(target=pinner)
    t2.start()
    rr.gate.set()
    t1.join(10)
    t2.join(10)
    assert seen == [_expected(f, data, 7)] * 2
    assert rr.loads == [] and len(rr.runs) == 2
    assert pool.stats().pinned_bytes == 0


@pytest.mark.parametrize("scatter", [True, False])
def test_failed_run_fails_only_the_missing_page(tmp_path: Path, scatter: bool) -> None:
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, 2 * MiB, scatter=scatter)
    bad_page = 20
    off, length, _ = f.page_span(bad_page)
    rr.bad = (off, off + length)
    seen: list[int] = []
    with pytest.raises(NotLocal), pool.scan(f) as pages:
        for n, view in pages:
            assert bytes(view) == _expected(f, data, n)
            seen.append(n)
    assert seen == list(range(bad_page))
    assert not pool.resident(f, bad_page)
    s = pool.stats()
    assert s.pinned_bytes == 0 and s.load_errors >= 2
    rr.bad = None  # loaded later, the page reads fine
    with pool.scan(f, bad_page) as pages:
        assert [n for n, _ in pages] == list(range(bad_page, f.page_count))
    _check_budget(pool)


def test_closed_scan_releases_its_pins(tmp_path: Path) -> None:
    pool = BufferPool(64 * MiB)
    f, _, _ = _file(pool, tmp_path, 2 * MiB)
    with pool.scan(f) as pages:
        for n, _view in pages:
            if n == 3:
                break
    assert pool.stats().pinned_bytes == 0
    pool.close_file(f)
    pool.prune_closed()
    assert pool.stats().page_bytes == 0


def test_temp_files_scan_page_by_page(tmp_path: Path) -> None:
    """Dirty temp pages are never recycled: a temp scan is a sequence of pins."""
    scratch = LocalFile.open_rw(tmp_path / "scratch")

    def load(offset: int, length: int, intent: Intent) -> bytes:
        return scratch.read_padded(offset, length)

    pool = BufferPool(4 * DATA_PAGE_BYTES)
    t = pool.open_temp("t", load, scratch.write_at)
    model = random.Random(SEED).randbytes(10 * DATA_PAGE_BYTES)
    pool.write(t, 0, model)
    with pool.scan(t) as pages:
        got = b"".join(bytes(v) for _, v in pages)
    assert got == model
    assert pool.stats().writebacks > 0
    scratch.close()


def test_preadv_full_and_read_into(tmp_path: Path) -> None:
    data = random.Random(SEED).randbytes(10_000)
    (tmp_path / "f").write_bytes(data)
    with LocalFile.open_read(tmp_path / "f") as lf:
        bufs = [bytearray(3000), bytearray(4000), bytearray(5000)]
        assert preadv_full(lf.fd, 500, bufs) == 9500  # stops at end of file
        assert b"".join(bufs)[:9500] == data[500:]
        bufs = [bytearray(4096), bytearray(1)]
        lf.read_into(9, bufs)
        assert bytes(bufs[0]) + bytes(bufs[1]) == data[9:4106]
        assert preadv_full(lf.fd, 0, []) == 0
        with pytest.raises(CorruptData):
            lf.read_into(9000, [bytearray(999), bytearray(2)])
    bad = LocalFile(-5, "bad", False)
    with pytest.raises(AssertionError):
        bad.read_into(0, [bytearray(1)])
    with pytest.raises(OSError) as exc:
        preadv_full(2**20, 0, [bytearray(1)])
    assert exc.value.errno == errno.EBADF


# -- read-through: one-pass readers (issue 25: a full clone reads each byte once) -------------


def test_read_through_keeps_no_page_and_reads_each_run_once(tmp_path: Path) -> None:
    """A span nobody else holds is one loader call per region, returned as it came;
    the pool takes no page for it (a 267 MiB clone used to fill the pool by as much)."""
    print(f"ENROUTE_SEED={SEED}")
    size = 3 * MiB + 123
    regions = [
        Region(0, 2 * MiB + 5, PageClass.DATA),
        Region(2 * MiB + 4 * KiB, size, PageClass.META),
    ]
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, size, regions=regions)
    rng = random.Random(SEED)
    for _ in range(50):
        start = rng.randrange(0, 2 * MiB + 5)
        end = rng.randrange(start + 1, 2 * MiB + 6)
        rr.loads.clear()
        assert pool.read_through(f, start, end - start) == data[start:end]
        assert rr.loads == [(start, end - start)]  # one read, no page-sized pieces
    got = pool.read_through(f, 2 * MiB + 4 * KiB + 7, 10_000)
    assert got == data[2 * MiB + 4 * KiB + 7 :][:10_000]
    s = pool.stats()
    assert (s.page_bytes, s.pinned_bytes, s.misses, s.hits) == (0, 0, 0, 0), s
    assert s.read_through_bytes > 0
    assert not rr.runs  # never the pages' scatter read


def test_read_through_copies_resident_pages_and_loads_around_them(tmp_path: Path) -> None:
    """Resident pages are copied (a hit, nothing loaded for them); the runs of missing
    pages between them are one loader call each; what was resident stays, nothing else
    is added."""
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, 2 * MiB)
    for page_no in (3, 4, 9):
        with pool.pin(f, page_no):
            pass
    before = pool.stats()
    rr.loads.clear()
    start, end = 2 * DATA_PAGE_BYTES + 100, 12 * DATA_PAGE_BYTES - 7
    assert pool.read_through(f, start, end - start) == data[start:end]
    p = DATA_PAGE_BYTES
    assert rr.loads == [(start, 3 * p - start), (5 * p, 4 * p), (10 * p, end - 10 * p)]
    after = pool.stats()
    assert after.hits == before.hits + 3
    assert (after.page_bytes, after.misses) == (before.page_bytes, before.misses)
    assert all(pool.resident(f, n) for n in (3, 4, 9))


def test_read_through_a_missing_span_fails_only_that_read(tmp_path: Path) -> None:
    pool = BufferPool(64 * MiB)
    f, data, rr = _file(pool, tmp_path, 2 * MiB)
    rr.bad = (MiB, MiB + 10)
    with pytest.raises(NotLocal):
        pool.read_through(f, MiB - 5, 100)
    assert pool.read_through(f, 0, MiB) == data[:MiB]
    s = pool.stats()
    assert (s.page_bytes, s.pinned_bytes) == (0, 0)


def test_read_through_of_a_temp_file_reads_its_written_pages(tmp_path: Path) -> None:
    """A temp file's pages may be written but not yet written back: read through them."""
    scratch = LocalFile.open_rw(tmp_path / "scratch")

    def load(offset: int, length: int, intent: Intent) -> bytes:
        return scratch.read_padded(offset, length)

    pool = BufferPool(64 * MiB)
    t = pool.open_temp("t", load, scratch.write_at)
    model = random.Random(SEED).randbytes(3 * DATA_PAGE_BYTES)
    pool.write(t, 0, model)
    assert pool.read_through(t, 10, len(model) - 20) == model[10:-10]
    scratch.close()
