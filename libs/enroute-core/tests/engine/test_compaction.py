"""Flush and geometric compaction planning (issue "Layer maintenance"; seed 004,
"Stable object numbering": a merge takes a consecutive run)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex
from enroute_core.engine.compaction import (
    CompactionPolicy,
    Stretch,
    plan,
    plan_compaction,
    plan_flush,
)
from enroute_core.state.model import LayerEntry, LayerKind

INLINE, STORED = LayerKind.INLINE, LayerKind.STORED


def manifest(*layers: tuple[LayerKind, int]) -> list[LayerEntry]:
    out: list[LayerEntry] = []
    first = 0
    for n, (kind, count) in enumerate(layers):
        out.append(layer(kind, first, count, n + 1))
        first += count
    return out


def layer(kind: LayerKind, first: int, count: int, n: int) -> LayerEntry:
    inline = kind is INLINE
    return LayerEntry(
        kind=kind,
        first_id=first,
        id_count=count,
        object_count=count,
        upload_gen=0 if inline else n,
        file_size=100 * count,
        meta_size=10,
        root=n.to_bytes(32, "big"),
        pin=LogIndex(n if inline else 0),
    )


def replace(m: list[LayerEntry], s: Stretch, n: int) -> list[LayerEntry]:
    """What ``replace_layers`` does to the manifest: one stored layer over the run's range."""
    run = s.of(m)
    merged = LayerEntry(
        kind=STORED,
        first_id=run[0].first_id,
        id_count=run[-1].end_id - run[0].first_id,
        object_count=sum(e.object_count for e in run),
        upload_gen=n,
        file_size=sum(e.file_size for e in run),
        meta_size=10,
        root=(10**6 + n).to_bytes(32, "big"),
        pin=LogIndex(0),
    )
    return [*m[: s.start], merged, *m[s.stop :]]


def test_flush_takes_the_newest_inline_run() -> None:
    assert plan_flush(manifest((STORED, 9), (INLINE, 1), (INLINE, 2))) == Stretch(1, 3)
    assert plan_flush(manifest((INLINE, 1), (STORED, 9), (INLINE, 2))) == Stretch(2, 3)
    assert plan_flush(manifest((INLINE, 1), (INLINE, 1), (STORED, 9))) == Stretch(0, 2)
    assert plan_flush(manifest((STORED, 9))) is None
    assert plan_flush([]) is None
    two = CompactionPolicy(flush_layers_min=2)
    assert plan_flush(manifest((STORED, 9), (INLINE, 1)), two) is None


def test_geometric_split_is_gits() -> None:
    """``git repack --geometric=2`` on packs of 64, 32, 16 objects and new ones."""
    assert plan_compaction(manifest((STORED, 64), (STORED, 32), (STORED, 16))) is None
    # 64 32 16 8 1 | 1 -> roll up 1+1; 8 >= 2*2, so the split stays.
    m = manifest((STORED, 64), (STORED, 32), (STORED, 16), (STORED, 8), (STORED, 1), (STORED, 1))
    assert plan_compaction(m) == Stretch(4, 6)
    # 64 32 16 8 3 | 2: the roll-up grows to 5, then 8 < 2*5 joins it, and so on up.
    m = manifest((STORED, 64), (STORED, 32), (STORED, 16), (STORED, 8), (STORED, 3), (STORED, 2))
    assert plan_compaction(m) == Stretch(0, 6)
    # 64 32 16 | 10 9: the roll-up (19) pulls in 16 (< 38), then 32 (< 70), then 64 (< 134).
    m = manifest((STORED, 64), (STORED, 32), (STORED, 16), (STORED, 10), (STORED, 9))
    assert plan_compaction(m) == Stretch(0, 5)
    # A big newer layer breaks the progression at once: everything after the 100 rolls up.
    m = manifest((STORED, 100), (STORED, 1), (STORED, 40))
    assert plan_compaction(m) == Stretch(1, 3)


def test_compaction_bound_cuts_to_the_newest_layers() -> None:
    m = manifest((STORED, 10), (STORED, 9), (STORED, 8), (STORED, 7))
    assert plan_compaction(m) == Stretch(0, 4)
    assert plan_compaction(m, CompactionPolicy(merge_objects_max=16)) == Stretch(2, 4)
    assert plan_compaction(m, CompactionPolicy(merge_objects_max=1)) == Stretch(2, 4)


def test_plan_prefers_one_rewrite_when_compaction_covers_the_flush() -> None:
    m = manifest((STORED, 64), (INLINE, 40), (INLINE, 1))
    assert plan(m) == Stretch(0, 3)
    m = manifest((STORED, 64), (STORED, 8), (INLINE, 1))
    assert plan(m) == Stretch(2, 3)


def test_policy_refuses_nonsense() -> None:
    with pytest.raises(InvalidArgument):
        CompactionPolicy(factor=1)
    with pytest.raises(InvalidArgument):
        CompactionPolicy(flush_layers_min=0)
    with pytest.raises(InvalidArgument):
        CompactionPolicy(merge_objects_max=-1)


def maintain(m: list[LayerEntry], policy: CompactionPolicy, n: int) -> tuple[list[LayerEntry], int]:
    """Apply the plan until it has nothing to do; return the manifest and objects rewritten."""
    rewritten = 0
    for step in range(1000):
        s = plan(m, policy)
        if s is None:
            return m, rewritten
        assert 0 <= s.start < s.stop <= len(m)
        rewritten += sum(e.object_count for e in s.of(m))
        m = replace(m, s, n * 1000 + step)
    raise AssertionError("the plan does not converge")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 20), min_size=1, max_size=300),
    st.integers(2, 4),
    st.booleans(),
)
def test_repeated_policy_keeps_log_many_layers(sizes: list[int], factor: int, batch: bool) -> None:
    """n appended layers leave O(log n) layers: the manifest is a geometric progression
    (each layer at least ``factor`` times the next newer), no inline layer is left, ranges
    stay ascending and disjoint, and each object is rewritten O(log n) times."""
    policy = CompactionPolicy(factor=factor)
    m: list[LayerEntry] = []
    first = 0
    rewritten = 0
    for n, count in enumerate(sizes):
        m.append(layer(INLINE if count < 15 else STORED, first, count, n + 1))
        first += count
        if not batch or n % 7 == 6 or n == len(sizes) - 1:
            m, done = maintain(m, policy, n)
            rewritten += done
    total = sum(sizes)
    assert all(e.kind is STORED for e in m)
    assert all(a.object_count >= factor * b.object_count for a, b in itertools.pairwise(m))
    assert len(m) <= math.floor(math.log(total, factor)) + 1
    assert [e.first_id for e in m] == sorted({e.first_id for e in m})
    assert m[-1].end_id == total and m[0].first_id == 0
    assert rewritten <= total * (math.log(total, factor) + 2) * factor


def test_thousand_single_object_pushes_leave_few_layers() -> None:
    m: list[LayerEntry] = []
    counts = []
    for n in range(1000):
        m.append(layer(INLINE, n, 1, n + 1))
        m, _ = maintain(m, CompactionPolicy(), n)
        counts.append(len(m))
    assert max(counts) <= 10  # log2(1000) + 1
    assert len(m) == bin(1000).count("1")  # the progression of a binary counter
