"""The disk budget: seed 004, "Disk budget" and "Never waiting on the object store".

Real sparse files in ``tmp_path``, real preads and real hole punching where
the filesystem supports it. The threaded test runs evictions against readers
and checks the "Races" rule: a read returns the file's bytes or fails with
``NotLocal``, never the zeros of a punched hole. Randomised tests print their
seed and replay with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import os
import random
import threading
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

from enroute_core.base.errors import NotLocal
from enroute_core.storage.diskbudget import (
    CHUNK_BYTES,
    ChunkPins,
    DiskBudget,
    bitmap_from_chunks,
    chunks_for,
    chunks_of_bitmap,
)
from enroute_core.storage.localfile import (
    HolePunchUnsupported,
    LocalFile,
    hole_punch_supported,
    pread_full,
    punch_hole,
)
from enroute_core.storage.pool import BufferPool, Intent, PageClass, Region

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
KiB = 1024
MiB = 1024 * KiB


def _data(rng: random.Random, size: int) -> bytes:
    """No zero bytes, so a punched hole can never pass for data."""
    return rng.randbytes(size).replace(b"\0", b"\x01")


def _sparse(path: Path, size: int) -> LocalFile:
    lf = LocalFile.open_rw(path)
    os.ftruncate(lf.fd, size)
    return lf


def _load(
    budget: DiskBudget,
    fid: str,
    lf: LocalFile,
    data: bytes,
    chunks: range,
    *,
    intent: Intent = Intent.SCAN,
) -> ChunkPins:
    """What the load driver does: pin, write, mark present, hand the pins on."""
    budget.reserve(sum(len(data[c * CHUNK_BYTES : (c + 1) * CHUNK_BYTES]) for c in chunks))
    with budget.pin_chunks(fid, chunks) as pins:
        for c in budget.missing(fid, chunks):
            lf.write_at(c * CHUNK_BYTES, data[c * CHUNK_BYTES : (c + 1) * CHUNK_BYTES])
            budget.mark_present(fid, c, intent)
        return pins.transfer()


def _check(budget: DiskBudget) -> None:
    s = budget.stats()
    if s.budget_bytes is not None:
        assert s.present_bytes <= s.budget_bytes + s.pinned_bytes, s
    assert s.pinned_bytes <= s.present_bytes, s


def _punch_works(path: Path) -> bool:
    return hole_punch_supported(path)


# -- bitmaps and residency ------------------------------------------------------------------


def test_chunk_is_one_mib_and_bitmaps_round_trip() -> None:
    """Seed 004, "Residency": 1 MiB chunks; the catalog keeps a bitmap."""
    assert MiB == CHUNK_BYTES
    rng = random.Random(SEED)
    for count in (0, 1, 7, 8, 9, 100):
        chosen = sorted(rng.sample(range(count), rng.randrange(count + 1)))
        bits = bitmap_from_chunks(chosen, count)
        assert len(bits) == (count + 7) // 8
        assert chunks_of_bitmap(bits, count) == chosen
    assert bitmap_from_chunks([0, 9], 10) == b"\x01\x02"
    assert chunks_for(0, 0) == range(0)
    assert chunks_for(MiB - 1, 2) == range(0, 2)
    assert chunks_for(3 * MiB, MiB) == range(3, 4)


def test_reads_of_absent_chunks_fail_not_local(tmp_path: Path) -> None:
    """Seed 004, "Never waiting on the object store": a read of non-local bytes fails."""
    rng = random.Random(SEED)
    size = 3 * MiB + 123
    data = _data(rng, size)
    lf = _sparse(tmp_path / "copy", size)
    budget = DiskBudget(None)
    budget.register("r/1", tmp_path / "copy", size, bitmap_from_chunks([], 4))
    assert budget.missing("r/1", range(4)) == [0, 1, 2, 3]
    with pytest.raises(NotLocal):
        budget.read_checked("r/1", lf.fd, 10, 10, Intent.POINT)
    _load(budget, "r/1", lf, data, range(1, 2)).release()
    _load(budget, "r/1", lf, data, range(3, 4)).release()
    assert (
        budget.read_checked("r/1", lf.fd, MiB + 5, 1000, Intent.POINT) == data[MiB + 5 : MiB + 1005]
    )
    assert budget.read_checked("r/1", lf.fd, 3 * MiB, 123, Intent.SCAN) == data[3 * MiB :]
    with pytest.raises(NotLocal):  # spans a present and an absent chunk
        budget.read_checked("r/1", lf.fd, 2 * MiB - 10, 20, Intent.POINT)
    with pytest.raises(ValueError):
        budget.read_checked("r/1", lf.fd, size - 1, 2, Intent.POINT)
    assert budget.bitmap("r/1") == bitmap_from_chunks([1, 3], 4)
    s = budget.stats()
    assert s.present_bytes == MiB + 123 and s.not_local_reads == 2 and s.evictions == 0
    budget.unregister("r/1")
    assert budget.stats().present_bytes == 0
    lf.close()


def test_eviction_punches_holes_and_frees_blocks(tmp_path: Path) -> None:
    """Seed 004, "Disk budget": over budget, CLOCK evicts chunks by punching holes."""
    rng = random.Random(SEED)
    size = 8 * MiB
    data = _data(rng, size)
    (tmp_path / "copy").write_bytes(data)
    os.sync()
    blocks_before = os.stat(tmp_path / "copy").st_blocks
    budget = DiskBudget(3 * MiB)
    budget.register("r/1", tmp_path / "copy", size, bitmap_from_chunks(range(8), 8))
    s = budget.stats()
    assert s.present_bytes == 3 * MiB and s.evictions == 5 and s.eviction_supported
    present = [c for c in range(8) if budget.is_present("r/1", c)]
    assert len(present) == 3
    with LocalFile.open_read(tmp_path / "copy") as lf:
        for c in range(8):
            raw = lf.read_at(c * MiB, MiB)
            if c in present:
                assert raw == data[c * MiB : (c + 1) * MiB]
                assert budget.read_checked("r/1", lf.fd, c * MiB, 64, Intent.POINT) == raw[:64]
            else:
                assert raw == bytes(MiB)  # a hole reads as zeros
                with pytest.raises(NotLocal):
                    budget.read_checked("r/1", lf.fd, c * MiB, 64, Intent.POINT)
    assert os.stat(tmp_path / "copy").st_size == size  # KEEP_SIZE
    blocks_after = os.stat(tmp_path / "copy").st_blocks
    if not _punch_works(tmp_path):
        pytest.skip("this filesystem cannot punch holes; st_blocks is not checked")
    assert blocks_after < blocks_before
    assert (blocks_before - blocks_after) * 512 >= 5 * MiB - 64 * KiB


def test_pinned_chunks_are_never_punched(tmp_path: Path) -> None:
    """Seed 004, "Disk budget", "Pins": never evicted; what is pinned may exceed the budget."""
    rng = random.Random(SEED)
    size = 6 * MiB
    data = _data(rng, size)
    lf = _sparse(tmp_path / "copy", size)
    budget = DiskBudget(2 * MiB)
    budget.register("r/1", tmp_path / "copy", size)
    pins = _load(budget, "r/1", lf, data, range(0, 4))  # a working set twice the budget
    s = budget.stats()
    assert s.present_bytes == s.pinned_bytes == 4 * MiB and s.over_budget_bytes == 2 * MiB
    assert not budget.reserve(MiB)
    assert budget.stats().evictions == 0
    for c in range(4):
        assert (
            budget.read_checked("r/1", lf.fd, c * MiB, MiB, Intent.SCAN)
            == data[c * MiB : (c + 1) * MiB]
        )
    pins.release()
    s = budget.stats()
    assert s.present_bytes == 2 * MiB and s.pinned_bytes == 0 and s.evictions == 2
    pins.release()  # a second release is a no-op
    _check(budget)
    lf.close()


def test_pins_hand_over_from_loader_to_reader(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    data = _data(rng, 2 * MiB)
    lf = _sparse(tmp_path / "copy", 2 * MiB)
    budget = DiskBudget(MiB)
    budget.register("r/1", tmp_path / "copy", 2 * MiB)
    with budget.pin_chunks("r/1", range(0, 1)) as loader_pins:
        lf.write_at(0, data[:MiB])
        budget.mark_present("r/1", 0)
        reader_pins = loader_pins.transfer()
    assert not loader_pins.held and reader_pins.held
    _load(budget, "r/1", lf, data, range(1, 2)).release()  # pressure: chunk 0 must stay
    assert budget.is_present("r/1", 0) and not budget.is_present("r/1", 1)
    assert budget.read_checked("r/1", lf.fd, 0, 10, Intent.SCAN) == data[:10]
    reader_pins.release()
    _check(budget)
    lf.close()


def _intent_steers(tmp_path: Path, scan_intent: Intent) -> int:
    rng = random.Random(SEED)
    size = 40 * MiB
    data = _data(rng, size)
    lf = _sparse(tmp_path / "copy", size)
    budget = DiskBudget(8 * MiB)
    budget.register("r/1", tmp_path / "copy", size)
    working = range(0, 4)
    for c in working:
        _load(budget, "r/1", lf, data, range(c, c + 1), intent=Intent.POINT).release()
        budget.read_checked("r/1", lf.fd, c * MiB, 100, Intent.POINT)
    for c in range(4, 40):  # a full clone streams 36 chunks through an 8-chunk budget
        with _load(budget, "r/1", lf, data, range(c, c + 1), intent=scan_intent):
            got = budget.read_checked("r/1", lf.fd, c * MiB, MiB, scan_intent)
            assert got == data[c * MiB : (c + 1) * MiB]
        _check(budget)
    lost = sum(not budget.is_present("r/1", c) for c in working)
    lf.close()
    return lost


def test_point_read_chunks_survive_scans(tmp_path: Path) -> None:
    """Seed 004, "Intent steers eviction": a full clone leaves the working set."""
    assert _intent_steers(tmp_path, Intent.SCAN) == 0


def test_the_same_stream_as_point_reads_displaces_them(tmp_path: Path) -> None:
    assert _intent_steers(tmp_path, Intent.POINT) == 4


def test_linked_copies_are_outside_the_budget(tmp_path: Path) -> None:
    """Seed 004, "Linked local copies": every chunk, outside the budget, never punched."""
    rng = random.Random(SEED)
    data = _data(rng, 3 * MiB)
    (tmp_path / "stored").write_bytes(data)
    punched: list[int] = []

    def punch(fd: int, offset: int, length: int) -> None:
        punched.append(offset)
        punch_hole(fd, offset, length)

    budget = DiskBudget(MiB, punch=punch)
    budget.register("r/linked", tmp_path / "stored", 3 * MiB, linked=True)
    assert budget.reserve(MiB)
    with LocalFile.open_read(tmp_path / "stored") as lf, budget.pin_chunks("r/linked", range(3)):
        assert budget.read_checked("r/linked", lf.fd, 0, 3 * MiB, Intent.POINT) == data
    s = budget.stats()
    assert (s.present_bytes, s.linked_bytes, s.linked_files, s.evictions) == (0, 3 * MiB, 1, 0)
    assert punched == []
    assert (tmp_path / "stored").read_bytes() == data


def test_unbounded_budget_never_evicts(tmp_path: Path) -> None:
    """``node.disk_cache`` defaults to unbounded."""
    rng = random.Random(SEED)
    data = _data(rng, 4 * MiB)
    lf = _sparse(tmp_path / "copy", 4 * MiB)
    budget = DiskBudget()
    budget.register("r/1", tmp_path / "copy", 4 * MiB)
    _load(budget, "r/1", lf, data, range(4)).release()
    s = budget.stats()
    assert s.budget_bytes is None and s.present_bytes == 4 * MiB and not s.eviction_supported
    assert s.over_budget_bytes == 0
    lf.close()


def test_unsupported_punch_turns_eviction_off(tmp_path: Path) -> None:
    """Where holes cannot be punched, the budget never evicts (documented fallback)."""
    rng = random.Random(SEED)
    data = _data(rng, 4 * MiB)
    lf = _sparse(tmp_path / "copy", 4 * MiB)

    def refuse(fd: int, offset: int, length: int) -> None:
        raise HolePunchUnsupported(95, "not here")

    budget = DiskBudget(MiB, punch=refuse)
    budget.register("r/1", tmp_path / "copy", 4 * MiB)
    _load(budget, "r/1", lf, data, range(2)).release()
    s = budget.stats()
    assert not s.eviction_supported and s.evictions == 1 and s.punched_bytes == 0
    _load(budget, "r/1", lf, data, range(2, 4)).release()
    assert budget.stats().evictions == 1  # never again
    assert lf.read_at(0, 4 * MiB) == data  # nothing was destroyed
    lf.close()


# -- the race rule --------------------------------------------------------------------------


def test_read_rechecks_the_epoch_after_its_pread(tmp_path: Path) -> None:
    """Seed 004, "Races": an eviction during the pread makes the read fail, not return zeros."""
    rng = random.Random(SEED)
    data = _data(rng, 2 * MiB)
    lf = _sparse(tmp_path / "copy", 2 * MiB)
    seen: list[bytes] = []
    budget: DiskBudget

    def racing_pread(fd: int, offset: int, length: int) -> bytes:
        if not seen:  # the first read loses the race: its chunk is punched mid-read
            assert budget.reserve(2 * MiB)
        got = pread_full(fd, offset, length)
        seen.append(got)
        return got

    budget = DiskBudget(2 * MiB, pread=racing_pread)
    budget.register("r/1", tmp_path / "copy", 2 * MiB)
    _load(budget, "r/1", lf, data, range(2)).release()
    with pytest.raises(NotLocal) as lost:
        budget.read_checked("r/1", lf.fd, 100, 4096, Intent.SCAN)
    # it names the chunk, so that the read's machine loads it and resumes (ticket_of)
    assert lost.value.details.get("chunk") == 0
    if _punch_works(tmp_path):
        assert seen[0] == bytes(4096)  # the pread did see the hole
    _load(budget, "r/1", lf, data, range(2)).release()
    assert budget.read_checked("r/1", lf.fd, 100, 4096, Intent.SCAN) == data[100:4196]
    lf.close()


def test_an_eviction_of_another_chunk_does_not_fail_a_read(tmp_path: Path) -> None:
    """Seed 004, "Races": the epoch moved during the pread, but the chunk evicted is not
    one the read covers (its own is pinned, as a loader hands it on): the bytes read are
    whole, and the read answers them. Under a small budget a clone's reads all go to the
    file while its loads evict other chunks; failing each of those reads failed clones
    ("evicted during a read", tests/interop/test_s3_budget.py)."""
    rng = random.Random(SEED)
    data = _data(rng, 2 * MiB)
    lf = _sparse(tmp_path / "copy", 2 * MiB)
    raced: list[int] = []
    budget: DiskBudget

    def racing_pread(fd: int, offset: int, length: int) -> bytes:
        if not raced:  # chunk 0 (unpinned) is evicted while chunk 1 is read
            raced.append(budget.stats().evictions)
            assert budget.reserve(MiB)
        return pread_full(fd, offset, length)

    budget = DiskBudget(2 * MiB, pread=racing_pread)
    budget.register("r/1", tmp_path / "copy", 2 * MiB)
    _load(budget, "r/1", lf, data, range(1)).release()
    held = _load(budget, "r/1", lf, data, range(1, 2))
    at = MiB + 100
    assert budget.read_checked("r/1", lf.fd, at, 4096, Intent.SCAN) == data[at : at + 4096]
    assert budget.stats().evictions == raced[0] + 1  # the race did happen
    held.release()
    lf.close()


def test_refetch_waits_for_the_punch(tmp_path: Path) -> None:
    """Seed 004, "Disk budget", "Races": an eviction claims the chunk; a refetch waits."""
    rng = random.Random(SEED)
    data = _data(rng, MiB)
    lf = _sparse(tmp_path / "copy", MiB)
    entered, proceed = threading.Event(), threading.Event()
    order: list[str] = []

    def slow_punch(fd: int, offset: int, length: int) -> None:
        entered.set()
        assert proceed.wait(5)
        punch_hole(fd, offset, length)
        order.append("punched")

    budget = DiskBudget(MiB, punch=slow_punch)
    budget.register("r/1", tmp_path / "copy", MiB)
    _load(budget, "r/1", lf, data, range(1)).release()
    evictor = threading.Thread(target=budget.reserve, args=(MiB,))
    evictor.start()
    assert entered.wait(5)
    assert not budget.is_present("r/1", 0)

    def refetch() -> None:
        _load(budget, "r/1", lf, data, range(1)).release()
        order.append("refetched")

    fetcher = threading.Thread(target=refetch)
    fetcher.start()
    fetcher.join(0.2)
    assert fetcher.is_alive()  # waiting on the claim
    proceed.set()
    evictor.join(5)
    fetcher.join(5)
    assert order == ["punched", "refetched"]
    assert budget.read_checked("r/1", lf.fd, 0, MiB, Intent.POINT) == data
    lf.close()


def test_concurrent_evictions_never_return_holes(tmp_path: Path) -> None:
    """Readers against a loader and an evictor: right bytes or ``NotLocal``, never zeros."""
    print(f"ENROUTE_SEED={SEED}")
    rng = random.Random(SEED)
    size = 6 * MiB
    data = _data(rng, size)
    lf = _sparse(tmp_path / "copy", size)
    budget = DiskBudget(3 * MiB)
    budget.register("r/1", tmp_path / "copy", size)
    errors: list[BaseException] = []
    counts = {"ok": 0, "not_local": 0}
    lock = threading.Lock()

    def reader(seed: int) -> None:
        r = random.Random(seed)
        with LocalFile.open_read(tmp_path / "copy") as own:
            for _ in range(300):
                off = r.randrange(size - 8192)
                n = r.randrange(1, 8192)
                # Load, drop the pins, then read unpinned: the evictor may strike mid-read.
                _load(budget, "r/1", lf, data, chunks_for(off, n), intent=Intent.SCAN).release()
                try:
                    got = budget.read_checked("r/1", own.fd, off, n, Intent.POINT)
                except NotLocal:
                    with lock:
                        counts["not_local"] += 1
                    continue
                if got != data[off : off + n]:
                    errors.append(AssertionError(f"wrong bytes at {off}+{n}"))
                    return
                with lock:
                    counts["ok"] += 1

    def loader(seed: int) -> None:
        r = random.Random(seed)
        for _ in range(150):
            c = r.randrange(6)
            _load(budget, "r/1", lf, data, range(c, c + 1), intent=Intent.SCAN).release()

    def evictor() -> None:
        for _ in range(150):
            budget.reserve(2 * MiB)
            _check(budget)

    def guarded(fn: object, *args: int) -> threading.Thread:
        def run() -> None:
            try:
                fn(*args)  # type: ignore[operator]
            except BaseException as err:
                errors.append(err)

        return threading.Thread(target=run)

    threads = [guarded(reader, SEED + i) for i in range(3)]
    threads += [guarded(loader, SEED + 10), guarded(evictor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert counts["ok"] > 0
    s = budget.stats()
    assert s.evictions > 0
    _check(budget)
    lf.close()


# -- the pool over a budgeted copy ----------------------------------------------------------


def test_pool_misses_go_through_read_checked(tmp_path: Path) -> None:
    """Seed 004, "Disk budget": pool misses of point reads mark chunks referenced."""
    rng = random.Random(SEED)
    size = 3 * MiB
    data = _data(rng, size)
    lf = _sparse(tmp_path / "copy", size)
    budget = DiskBudget(2 * MiB)
    budget.register("r/1", tmp_path / "copy", size)
    pool = BufferPool(MiB)
    f = pool.open_file("r/1", size, budget.loader("r/1", lf.fd), [Region(0, size, PageClass.DATA)])
    with pytest.raises(NotLocal):
        pool.pin(f, 0)
    assert pool.stats().used_bytes == 0
    _load(budget, "r/1", lf, data, range(0, 2)).release()
    assert pool.read(f, 10, 100, Intent.POINT) == data[10:110]  # chunk 0 now referenced
    assert pool.read(f, MiB + 10, 100, Intent.SCAN) == data[MiB + 10 : MiB + 110]
    _load(budget, "r/1", lf, data, range(2, 3)).release()  # evicts the unreferenced chunk 1
    assert budget.is_present("r/1", 0) and not budget.is_present("r/1", 1)
    lf.close()


# -- the state machine ----------------------------------------------------------------------

_FILE_SIZES = (4 * MiB + 100 * KiB, 3 * MiB, MiB)
_DISK_BUDGET = 4 * MiB
_HELD_MAX = 4


class BudgetMachine(RuleBasedStateMachine):
    """Random loads, pins, reads and reserves; every step checks the budget and the pins."""

    def __init__(self, root: Path, contents: list[bytes]) -> None:
        super().__init__()
        self.contents = contents
        self.budget = DiskBudget(_DISK_BUDGET)
        self.handles: list[LocalFile] = []
        for i, data in enumerate(contents):
            path = root / f"copy{i}"
            self.handles.append(_sparse(path, len(data)))
            self.budget.register(f"f{i}", path, len(data))
        self.held: list[tuple[int, ChunkPins]] = []

    def _chunk(self, i: int, at: float) -> int:
        return int(at * self.budget.chunk_count(f"f{i}"))

    @rule(i=st.integers(0, 2), at=st.floats(0, 1, exclude_max=True), span=st.integers(1, 2),
          point=st.booleans(), keep=st.booleans())  # fmt: skip
    def load(self, i: int, at: float, span: int, point: bool, keep: bool) -> None:
        if keep and len(self.held) >= _HELD_MAX:
            keep = False
        c = self._chunk(i, at)
        chunks = range(c, min(c + span, self.budget.chunk_count(f"f{i}")))
        intent = Intent.POINT if point else Intent.SCAN
        pins = _load(self.budget, f"f{i}", self.handles[i], self.contents[i], chunks, intent=intent)
        for c in chunks:
            assert self.budget.is_present(f"f{i}", c)  # a pinned chunk stays
        if keep:
            self.held.append((i, pins))
        else:
            pins.release()

    @precondition(lambda self: bool(self.held))
    @rule(k=st.integers(0, _HELD_MAX - 1))
    def unpin(self, k: int) -> None:
        _, pins = self.held.pop(k % len(self.held))
        pins.release()

    @rule(i=st.integers(0, 2), at=st.floats(0, 1, exclude_max=True),
          n=st.integers(1, 3 * MiB), point=st.booleans())  # fmt: skip
    def read(self, i: int, at: float, n: int, point: bool) -> None:
        data = self.contents[i]
        off = int(at * len(data))
        n = min(n, len(data) - off)
        local = all(self.budget.is_present(f"f{i}", c) for c in chunks_for(off, n))
        intent = Intent.POINT if point else Intent.SCAN
        try:
            got = self.budget.read_checked(f"f{i}", self.handles[i].fd, off, n, intent)
        except NotLocal:
            assert not local
            return
        assert local and got == data[off : off + n]

    @rule(n=st.integers(0, 5 * MiB))
    def reserve(self, n: int) -> None:
        ok = self.budget.reserve(n)
        s = self.budget.stats()
        assert ok == (s.present_bytes + n <= _DISK_BUDGET)

    @rule(i=st.integers(0, 2), at=st.floats(0, 1, exclude_max=True))
    def touch(self, i: int, at: float) -> None:
        c = self._chunk(i, at)
        self.budget.touch(f"f{i}", range(c, c + 1), Intent.POINT)

    @invariant()
    def present_within_budget_plus_pins(self) -> None:
        _check(self.budget)

    @invariant()
    def pinned_and_present_chunks_hold_their_bytes(self) -> None:
        for i, pins in self.held:
            data = self.contents[i]
            for c in pins.chunks:
                assert self.budget.is_present(f"f{i}", c)
                raw = self.handles[i].read_at(c * MiB, MiB)
                assert raw == data[c * MiB : (c + 1) * MiB]

    def teardown(self) -> None:
        for _, pins in self.held:
            pins.release()
        for i, h in enumerate(self.handles):
            self.budget.unregister(f"f{i}")
            h.close()
        assert self.budget.stats().present_bytes == 0


def test_disk_budget_properties(tmp_path: Path) -> None:
    print(f"ENROUTE_SEED={SEED}")
    rng = random.Random(SEED)
    contents = [_data(rng, size) for size in _FILE_SIZES]
    counter = iter(range(10**6))

    def make() -> BudgetMachine:
        root = tmp_path / f"run{next(counter)}"
        root.mkdir()
        return BudgetMachine(root, contents)

    run_state_machine_as_test(
        hypothesis_seed(SEED)(make),  # type: ignore[arg-type]
        settings=settings(max_examples=30, stateful_step_count=30, deadline=None),
    )
