"""Filters leave what the client names: tags on blobs and trees, refs at blobs and trees.

git's list-objects-filter.c (``list_objects_filter__filter_object``) applies a filter
only to objects marked ``NOT_USER_GIVEN``; revision.c ``handle_commit`` adds a wanted
tag's chain and the tree or blob it ends at as given. So ``git rev-list --objects
--filter=<spec> <every ref>`` (what upload-pack's pack-objects computes for a clone)
lists them under any filter, and a given tree's entries count from depth 0. Each case
is compared with that rev-list on the same history, and ``tree:<n>`` for any ``n`` up
to 2^64 ends as soon as the trees do.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.engine.serve import (
    BlobLimit,
    BlobNone,
    FetchFilter,
    TreeDepth,
    plan_fetch,
)
from enroute_core.engine.view import View
from enroute_testing.pushed import push_layer, rev_list_objects, rev_parse
from enroute_testing.tagged import tagged_history

pytestmark = pytest.mark.interop

SPECS: list[tuple[FetchFilter, str]] = [
    (BlobNone(), "blob:none"),
    (BlobLimit(1), "blob:limit=1"),
    (BlobLimit(100), "blob:limit=100"),
    (TreeDepth(0), "tree:0"),
    (TreeDepth(1), "tree:1"),
    (TreeDepth(2), "tree:2"),
    (TreeDepth(3), "tree:3"),
    (TreeDepth(4), "tree:4"),
    (TreeDepth(2**64 - 1), "tree:18446744073709551615"),
]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("tagged") / "src.git"
    return path, tagged_history(path)


@pytest.fixture(scope="module")
def view(history: tuple[Path, dict[str, str]]) -> View:
    path, refs = history
    tips = [oid_from_hex(v) for v in refs.values()]
    return View([push_layer(path, [], 0, revs=["--all"], exclude=[], tips=tips)])


def _oids(view: View, ids: object) -> set[ObjectId]:
    assert hasattr(ids, "__iter__")
    return {view.oid_of_id(i) for i in ids}


@pytest.mark.parametrize(("spec", "git_spec"), SPECS, ids=[s for _, s in SPECS])
def test_a_clone_of_every_ref_matches_git(
    history: tuple[Path, dict[str, str]], view: View, spec: FetchFilter, git_spec: str
) -> None:
    path, refs = history
    wants = [oid_from_hex(v) for v in refs.values()]
    plan = plan_fetch(view, wants, filter=spec)
    assert _oids(view, plan.ids) == rev_list_objects(path, f"--filter={git_spec}", "--all")


@pytest.mark.parametrize(("spec", "git_spec"), SPECS, ids=[s for _, s in SPECS])
def test_each_tag_alone_matches_git(
    history: tuple[Path, dict[str, str]], view: View, spec: FetchFilter, git_spec: str
) -> None:
    path, refs = history
    for name, value in refs.items():
        if not name.startswith("refs/tags/"):
            continue
        plan = plan_fetch(view, [oid_from_hex(value)], filter=spec)
        want = rev_list_objects(path, f"--filter={git_spec}", value)
        assert _oids(view, plan.ids) == want, name


def test_the_tagged_blob_is_sent_once_the_client_has_main(
    history: tuple[Path, dict[str, str]], view: View
) -> None:
    """A fetch of the tags by a client with main: the tags and their targets, nothing it has."""
    path, refs = history
    main = rev_parse(path, "main")
    tags = [oid_from_hex(v) for n, v in refs.items() if n.startswith("refs/tags/")]
    plan = plan_fetch(view, tags, [main], filter=BlobNone())
    # git's walk marks only the edge of ``--not main`` as had; the closure is exact.
    want = rev_list_objects(path, "--filter=blob:none", *(t.hex() for t in tags))
    want -= rev_list_objects(path, "main")
    assert _oids(view, plan.ids) == want
    assert rev_parse(path, "key^{}") in want  # the blob itself, under blob:none


def test_a_huge_tree_depth_ends_with_the_trees(
    history: tuple[Path, dict[str, str]], view: View
) -> None:
    """``tree:18446744073709551615`` once took a microsecond per level, for 2^64 levels."""
    path, refs = history
    wants = [oid_from_hex(v) for v in refs.values()]
    started = time.monotonic()
    for depth in (2**31 - 1, 2**63, 2**64 - 1, 2**64 + 1, 10**20 - 1):
        plan = plan_fetch(view, wants, filter=TreeDepth(depth))
        assert _oids(view, plan.ids) == rev_list_objects(path, "--all")
    assert time.monotonic() - started < 5
