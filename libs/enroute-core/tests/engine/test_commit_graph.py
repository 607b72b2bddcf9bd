"""The compiled graph of a first pushed layer against its reference (docs/native.md,
``commit_graph``).

``_pushed_graph`` maps a repository's first layer in one compiled call;
``view._first_graph`` states the rule in Python. They must give the same graph on a
real pushed layer and on random commit sections (parents earlier in rank, members in
ascending runs, local indexes in any order, ``first`` 0 or not). Where the routine
answers None (a repeated commit, a parent that is no earlier commit, a member run
that does not ascend, a run outside its array, an id past 32 bits) the reference
decides: its graph, None, or its error.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import replace

import pytest

from enroute_core.engine.view import _first_graph, _first_graph_compiled
from enroute_core.storage.layer.reader import CommitColumns
from enroute_testing.pushed import three_pushes
from enroute_testing.repogen import RepoSpec, generate_repo


def _u32(values: list[int]) -> array[int]:
    return array("I", values)


def _columns(rng: random.Random, n: int, objects: int) -> CommitColumns:
    """A commit section of ``n`` commits among ``objects`` local indexes, in rank order."""
    locals_ = rng.sample(range(objects), n)
    parents: list[int] = []
    members: list[int] = []
    p_starts, p_counts, m_starts, m_counts = [], [], [], []
    for rank in range(n):
        chosen = rng.sample(locals_[:rank], min(rank, rng.choice([0, 1, 1, 1, 2, 3])))
        p_starts.append(len(parents))
        p_counts.append(len(chosen))
        parents += chosen
        segment = sorted(rng.sample(range(objects), rng.randrange(0, min(8, objects) + 1)))
        m_starts.append(len(members))
        m_counts.append(len(segment))
        members += segment
    return CommitColumns(
        local_indexes=_u32(locals_),
        tree_refs=_u32([rng.randrange(objects) for _ in range(n)]),
        times=array("q", [rng.randrange(-(2**40), 2**40) for _ in range(n)]),
        parent_starts=_u32(p_starts),
        parent_counts=_u32(p_counts),
        member_starts=_u32(m_starts),
        member_counts=_u32(m_counts),
        parent_refs=_u32(parents),
        member_refs=_u32(members),
    )


def _same(first: int, c: CommitColumns) -> None:
    """The compiled answer is the reference's graph; where it gives None, the reference
    must be able to decide otherwise (None, or an error)."""
    try:
        expected = _first_graph(first, c)
    except Exception as exc:  # the reference's own error: the routine must not answer
        assert _first_graph_compiled(first, c) is None, exc
        return
    got = _first_graph_compiled(first, c)
    if got is not None:
        assert got == expected
    else:
        assert expected is None or _needs_reference(c), "None for a graph the reference built"


def _needs_reference(c: CommitColumns) -> bool:
    """A run outside its array: the reference slices it short, the routine declines."""
    return any(
        s + n > len(refs)
        for starts, counts, refs in (
            (c.parent_starts, c.parent_counts, c.parent_refs),
            (c.member_starts, c.member_counts, c.member_refs),
        )
        for s, n in zip(starts, counts, strict=True)
    )


@pytest.mark.parametrize("seed", range(40))
def test_random_sections_give_the_reference_graph(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([0, 1, 2, 5, 40, 300])
    c = _columns(rng, n, objects=max(1, n * rng.choice([1, 3, 10])))
    for first in (0, 65, rng.randrange(1, 2**31)):
        _same(first, c)
    assert n == 0 or _first_graph_compiled(65, c) is not None


def _mutations(rng: random.Random, c: CommitColumns) -> list[CommitColumns]:
    n = len(c)
    out = []
    locals_ = c.local_indexes
    out.append(replace(c, local_indexes=_u32([*locals_[:-1], locals_[0]])))  # a repeat
    parents = list(c.parent_refs)
    if parents:  # a parent that is the commit itself or a later one
        later = list(parents)
        later[rng.randrange(len(later))] = locals_[-1]
        out.append(replace(c, parent_refs=_u32(later)))
    members = list(c.member_refs)
    counts = list(c.member_counts)
    runs = [r for r in range(n) if counts[r] >= 2]
    if runs:  # a member run that does not ascend
        r = rng.choice(runs)
        s = c.member_starts[r]
        members[s], members[s + 1] = members[s + 1], members[s]
        out.append(replace(c, member_refs=_u32(members)))
    counts[-1] += 5  # the last run past its array
    out.append(replace(c, member_counts=_u32(counts)))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_what_the_routine_leaves_the_reference_decides(seed: int) -> None:
    rng = random.Random(1000 + seed)
    c = _columns(rng, rng.choice([3, 20, 100]), objects=400)
    for bad in _mutations(rng, c):
        _same(65, bad)
    _same(2**32 - 10, c)  # ids past 32 bits: the reference's OverflowError


@pytest.mark.interop
def test_a_pushed_layer_gives_the_reference_graph(tmp_path_factory: pytest.TempPathFactory) -> None:
    spec = RepoSpec(seed=7, commits=80, branches=3, merge_every=5, files=30, annotated_tags=2)
    repo = generate_repo(tmp_path_factory.mktemp("graph") / "r.git", spec)
    (entry, reader), *_ = three_pushes(repo)
    c = reader.commit_columns()
    assert c is not None and len(c) > 0
    got = _first_graph_compiled(entry.first_id, c)
    assert got is not None and got == _first_graph(entry.first_id, c)
