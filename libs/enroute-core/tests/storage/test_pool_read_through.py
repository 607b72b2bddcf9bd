"""One-pass reads through the buffer pool: ``BufferPool.read_through``.

Seed 004, "Pages and memory" (Design 2: "Scans (full clones, compaction)
insert pages cold"): a full clone reads each byte of a layer once, so its
reads keep no page at all. These tests check that a span nobody else holds is
one loader call per region and takes no page, that resident pages are copied
as hits, that a failed read fails only that read, and that temp files are read
through their written pages. Randomised tests print their seed and replay with
``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from enroute_core.base.errors import NotLocal
from enroute_core.storage.localfile import LocalFile
from enroute_core.storage.pool import (
    DATA_PAGE_BYTES,
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
    """A loader over a real file; counts calls and can fail."""

    def __init__(self, lf: LocalFile) -> None:
        self.lf = lf
        self.loads: list[tuple[int, int]] = []
        self.bad: tuple[int, int] | None = None  # reads touching [start, end) raise NotLocal

    def load(self, offset: int, length: int, intent: Intent) -> bytes:
        self.loads.append((offset, length))
        if self.bad is not None and offset < self.bad[1] and self.bad[0] < offset + length:
            raise NotLocal(f"bytes at {offset} are not local")
        return self.lf.read_exact(offset, length)


def _file(
    pool: BufferPool,
    tmp_path: Path,
    size: int,
    *,
    regions: list[Region] | None = None,
    name: str = "f",
) -> tuple[PoolFile, bytes, RunReader]:
    data = random.Random(SEED).randbytes(size)
    (tmp_path / name).write_bytes(data)
    rr = RunReader(LocalFile.open_read(tmp_path / name))
    f = pool.open_file(name, size, rr.load, regions)
    return f, data, rr


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
