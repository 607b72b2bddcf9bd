"""The compiled commit closure against its reference (docs/native.md, ``commit_closure``).

``View.closure`` walks in one compiled call; ``closure_reference`` states the rule in
Python. They must give the same set for every start on real views (pushed in parts,
and the same parts merged as compaction merges them), on random graphs laid over
several layers, and, for graphs the routine does not answer (an id that is no
commit, a run outside its column, an id past the view), the reference's answer or
error, since the routine then hands the walk to it.
"""

from __future__ import annotations

import random
from array import array

import pytest
from enroute_native.commit_closure import closure as native_closure
from pyroaring import BitMap

from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_core.engine.view import View, _Bodies, _Layer, closure_reference, private_caches
from enroute_core.storage.layer import Kind
from enroute_core.storage.layer.commits import CommitGraph
from enroute_testing.pushed import Layers, merge, three_pushes
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo

_SPEC = RepoSpec(
    seed=31, commits=60, branches=3, merge_every=4, files=20, annotated_tags=2, lightweight_tags=2
)


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Layers:
    repo: GeneratedRepo = generate_repo(tmp_path_factory.mktemp("closure") / "r.git", _SPEC)
    return three_pushes(repo)


def _commits(view: View) -> list[int]:
    return sorted(view.kind_ids(Kind.COMMIT))


@pytest.mark.interop
@pytest.mark.parametrize("merged", [False, True], ids=["pushed", "merged"])
def test_every_start_gives_the_reference_set(pushed: Layers, merged: bool) -> None:
    layers = pushed
    if merged:  # the last two pushes in one layer, as a flush or compaction leaves them
        layers = [*pushed[:1], merge(pushed, 1, 3)[1]]
    view = View(layers)
    commits = _commits(view)
    assert len(commits) == _SPEC.commits
    starts_list = [[c] for c in commits]
    rng = random.Random(7)
    starts_list += [rng.sample(commits, k) for k in (2, 5, 17) for _ in range(10)]
    starts_list.append(commits)
    for starts in starts_list:
        # the compiled walk answers for these graphs: nothing falls back
        assert native_closure(view._graphs, array("I", starts), view.end_id) is not None
        assert view.closure(starts) == closure_reference(view._layers, starts), starts


def _graph(rows: list[tuple[int, list[int], list[int]]]) -> CommitGraph:
    g = CommitGraph.empty()
    for commit_id, parents, segment in sorted(rows):
        g.append(commit_id, tree_id=commit_id, generation=1, time=0, parents=parents,
                 segment=segment)  # fmt: skip
    return g


def _view(bounds: list[tuple[int, int]], graphs: list[CommitGraph]) -> View:
    """A view over bare graphs: only what the walks read (ranges and commit graphs)."""
    layers = []
    for (first, end), graph in zip(bounds, graphs, strict=True):
        layer = _Layer.__new__(_Layer)
        layer.first, layer.end, layer.graph = first, end, graph
        layers.append(layer)
    view = View.__new__(View)
    view._init(tuple(layers), _Bodies(private_caches(DEFAULT_LIMITS)), DEFAULT_LIMITS)
    return view


def _random_view(rng: random.Random) -> tuple[View, list[int]]:
    """Commits spread over three layers, parents always older, segments of nearby ids."""
    bounds = [(0, 300), (300, 520), (600, 900)]
    rows: list[list[tuple[int, list[int], list[int]]]] = [[], [], []]
    commits: list[int] = []
    for i, (first, end) in enumerate(bounds):
        for c in sorted(rng.sample(range(first, end), rng.randint(0, 60))):
            parents = rng.sample(commits, min(len(commits), rng.choice((0, 1, 1, 1, 2, 3))))
            segment = sorted({c, *rng.sample(range(first, end), rng.randint(0, 6))})
            rows[i].append((c, parents, segment))
            commits.append(c)
    return _view(bounds, [_graph(r) for r in rows]), commits


def test_random_graphs_over_layers_give_the_reference_set() -> None:
    rng = random.Random(11)
    for _ in range(200):
        view, commits = _random_view(rng)
        if not commits:
            continue
        starts = rng.sample(commits, rng.randint(1, min(5, len(commits))))
        assert native_closure(view._graphs, array("I", starts), view.end_id) is not None
        assert view.closure(starts) == closure_reference(view._layers, starts)


def test_a_parent_that_is_no_commit_raises_as_the_reference_does() -> None:
    for bad in (5, 150, 250, 10_000):  # no commit; in a gap; past every layer; past end
        view = _view([(0, 100), (200, 300)], [_graph([(1, [bad], [1, 2])]), _graph([])])
        with pytest.raises(KeyError):
            closure_reference(view._layers, [1])
        with pytest.raises(KeyError):
            view.closure([1])
    view = _view([(0, 100)], [_graph([(1, [], [1])])])
    with pytest.raises(KeyError):
        view.closure([2])  # a start that is no commit


def test_graphs_the_routine_does_not_answer_go_to_the_reference() -> None:
    # a member past the view's end: the reference takes it as it is
    view = _view([(0, 100)], [_graph([(1, [], [1, 400])])])
    assert native_closure(view._graphs, array("I", [1]), view.end_id) is None
    assert view.closure([1]) == BitMap([1, 400])
    # a segment run past its column: the reference's slice ends at the column's end
    g = _graph([(1, [], [1, 2])])
    g.segment_counts[0] = 5
    view = _view([(0, 100)], [g])
    assert native_closure(view._graphs, array("I", [1]), view.end_id) is None
    assert view.closure([1]) == BitMap([1, 2])


def test_columns_are_checked() -> None:
    g = _graph([(1, [], [1])])
    good = (0, 10, g.commit_ids, g.parent_starts, g.parent_counts, g.parent_ids,
            g.segment_starts, g.segment_counts, g.segment_ids)  # fmt: skip
    assert native_closure((good,), array("I", [1]), 10) == array("I", [1]).tobytes()
    wide = (*good[:2], array("q", [1]), *good[3:])
    with pytest.raises(ValueError, match="uint32"):
        native_closure((wide,), array("I", [1]), 10)
    short = (*good[:3], array("I"), *good[4:])
    with pytest.raises(ValueError, match="length"):
        native_closure((short,), array("I", [1]), 10)
    with pytest.raises(ValueError, match="overlap"):
        native_closure((good, good), array("I", [1]), 10)
    assert native_closure((), array("I"), 0) == b""
