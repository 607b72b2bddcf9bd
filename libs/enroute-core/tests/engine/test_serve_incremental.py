"""A fetch on top of what the client has plans from the new commits, not two closures.

Issue 25: a 20-commit fetch of the `large` profile walked the closures of both the
wants and the haves (80,000 commits each) for most of its 0.65 s of compute CPU.
``View.new_commits`` walks in generation order as git's ``limit_list`` does, and
``View.incremental_closure`` answers the objects from their segments (DESIGN "Layers":
a commit's segment is what it introduces). Checked against ``git rev-list`` on a
generated repository pushed in three layers. Randomised: prints its seed, replays with
``ENROUTE_SEED=``.
"""

from __future__ import annotations

import os
import random

import pytest

from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.engine.serve import plan_fetch, ready_to_pack
from enroute_core.engine.view import View
from enroute_testing.gitcli import run_git
from enroute_testing.pushed import (
    history_cuts,
    merge,
    rev_list_objects,
    rev_parse,
    three_pushes,
)
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo

pytestmark = pytest.mark.interop

_SPEC = RepoSpec(seed=31, commits=40, branches=3, merge_every=4, files=16, file_bytes=700,
                 rename_rate=0.1, annotated_tags=2, lightweight_tags=1)  # fmt: skip
_PAIRS = 40


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("incremental") / "r.git", _SPEC)


@pytest.fixture(scope="module")
def view(repo: GeneratedRepo) -> View:
    return View(three_pushes(repo))


@pytest.fixture(scope="module")
def merged_view(repo: GeneratedRepo) -> View:
    """The same pushes with the second and third merged into one layer, as geometric
    compaction rolls up the last small pushes."""
    layers = three_pushes(repo)
    _, stored = merge(layers, 1, 3)
    return View([layers[0], stored])


@pytest.fixture(scope="module")
def unmoved(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    """A history whose commits move no path: each segment holds only what is new."""
    spec = RepoSpec(seed=37, commits=40, branches=0, files=16, file_bytes=700, rename_rate=0.0)
    return generate_repo(tmp_path_factory.mktemp("unmoved") / "r.git", spec)


@pytest.fixture
def rng() -> random.Random:
    """Drawn pairs of commits; ``ENROUTE_SEED=`` replays a failing draw."""
    seed = int(os.environ.get("ENROUTE_SEED", random.SystemRandom().randrange(2**32)))
    print(f"ENROUTE_SEED={seed}")
    return random.Random(seed)


def _commits(repo: GeneratedRepo) -> list[str]:
    return run_git(["rev-list", "--all"], cwd=repo.path).decode().split()


def _id(view: View, hex_oid: str) -> int:
    found = view.id_of_oid(oid_from_hex(hex_oid))
    assert found is not None
    return found


def _oids(view: View, ids: object) -> set[ObjectId]:
    return {view.oid_of_id(i) for i in ids}  # type: ignore[attr-defined]


def test_new_commits_are_rev_list_not(repo: GeneratedRepo, view: View, rng: random.Random) -> None:
    """``new_commits(wants, haves)`` is ``git rev-list <wants> --not <haves>``, and the have
    side's commits it met are commits the haves reach."""
    commits = _commits(repo)
    for _ in range(_PAIRS):
        wants = rng.sample(commits, rng.randint(1, 2))
        haves = rng.sample(commits, rng.randint(0, 3))
        new, met = view.new_commits([_id(view, w) for w in wants], [_id(view, h) for h in haves])
        args = [*wants, "--not", *haves] if haves else wants
        expected = run_git(["rev-list", *args], cwd=repo.path).decode().split()
        assert sorted(view.oid_of_id(c).hex() for c in new) == sorted(expected), (wants, haves)
        if haves:
            reached = set(run_git(["rev-list", *haves], cwd=repo.path).decode().split())
            assert {view.oid_of_id(c).hex() for c in met} <= reached


@pytest.mark.parametrize("layers", ["view", "merged_view"])
def test_plans_on_top_of_the_haves_are_exact(
    repo: GeneratedRepo, layers: str, request: pytest.FixtureRequest, rng: random.Random
) -> None:
    """Whichever way a plan is made (from the new commits when their objects all lie past
    the newest have's pushed range, else from both closures), its objects are ``git
    rev-list --objects <wants> --not <haves>``, and what it takes the client to have is a
    part of what the haves reach; also when pushes were merged into one layer."""
    view: View = request.getfixturevalue(layers)
    commits = _commits(repo)
    for _ in range(_PAIRS):
        wants = rng.sample(commits, rng.randint(1, 2))
        haves = rng.sample(commits, rng.randint(1, 3))
        plan = plan_fetch(view, [oid_from_hex(w) for w in wants], [oid_from_hex(h) for h in haves])
        assert _oids(view, plan.ids) == rev_list_objects(repo.path, *wants, "--not", *haves)
        assert _oids(view, plan.have_ids) <= rev_list_objects(repo.path, *haves)


@pytest.mark.parametrize("merged", [False, True], ids=["pushed", "merged"])
def test_a_fetch_past_the_haves_walks_no_closure(
    unmoved: GeneratedRepo, merged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last layer's main on top of the second layer's main, in a history that moves no
    path: no closure is walked (a walk of the whole history on the `large` profile),
    the objects are rev-list's, and the have side answered holds the old root tree, the
    base a thin pack's new root tree leans on. Also with the second and third pushes
    merged into one layer, as geometric compaction rolls up the last small pushes: the
    have's pushed range still ends where the new commits' begins (``View._source_end``);
    with the merged layer's end as the bound, every fetch on top of a push that a
    compaction had rolled up walked the closures."""
    layers = three_pushes(unmoved)
    if merged:
        layers = [layers[0], merge(layers, 1, 3)[1]]
    view = View(layers)
    old = rev_parse(unmoved.path, history_cuts(unmoved.path)[1])
    new = rev_parse(unmoved.path, "main")
    same_layer = view.layer_of(_id(view, old.hex()))[:2] == view.layer_of(_id(view, new.hex()))[:2]
    assert same_layer == merged
    expected = rev_list_objects(unmoved.path, new.hex(), "--not", old.hex())

    def no_closure(self: View, commit_ids: object) -> None:
        raise AssertionError("a closure was walked")

    monkeypatch.setattr(View, "closure", no_closure)
    plan = plan_fetch(view, [new], [old], thin=True)
    assert _oids(view, plan.ids) == expected
    root = view.commit(_id(view, old.hex()))
    assert root is not None and root.tree_id in plan.have_ids


def test_ready_is_upload_packs_ok_to_give_up(
    repo: GeneratedRepo, view: View, rng: random.Random
) -> None:
    """``ready_to_pack`` says ready exactly when every want reaches a common have or a
    parent of one (upload-pack.c ``ok_to_give_up``, ``got_oid`` marking THEY_HAVE),
    checked against ``git rev-list`` on drawn wants and haves."""
    commits = _commits(repo)
    answers = set()
    for _ in range(_PAIRS):
        wants = rng.sample(commits, rng.randint(1, 2))
        haves = rng.sample(commits, rng.randint(0, 3))
        marked = set(haves)
        for h in haves:
            marked.update(run_git(["rev-parse", f"{h}^@"], cwd=repo.path).decode().split())
        expected = bool(haves) and all(
            marked & set(run_git(["rev-list", w], cwd=repo.path).decode().split()) for w in wants
        )
        got = ready_to_pack(
            view, [oid_from_hex(w) for w in wants], [oid_from_hex(h) for h in haves]
        )
        assert got == expected, (wants, haves)
        answers.add(got)
    assert answers == {True, False}  # both answers were drawn
