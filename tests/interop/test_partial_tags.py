"""Partial clones of a history with tags on blobs and trees, against a real ``enroute dev``.

git's upload-pack never filters what the client names: a wanted tag's target, or a
ref's own blob or tree (list-objects-filter.c exempts objects not marked
``NOT_USER_GIVEN``). A partial clone that lacks such a blob breaks
``git rev-list --objects --all --missing=print`` (``fatal: bad object``). Each clone
through Enroute must hold exactly the objects of the same clone from git's own
upload-pack over ``file://``, and pass ``git fsck`` and that rev-list.

A filter depth far past the deepest tree (``tree:18446744073709551615``) once walked
2^64 empty levels and held a core for good; it must answer as fast as a clone.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from enroute_testing.gitcli import run_git
from enroute_testing.tagged import tagged_history

pytestmark = pytest.mark.interop

_names = itertools.count()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("partial-tags") / "src.git"
    refs = tagged_history(path)
    run_git(["config", "uploadpack.allowFilter", "true"], cwd=path)
    return path, refs


@pytest.fixture(scope="module")
def url(enroute_url: str, source: tuple[Path, dict[str, str]]) -> str:
    url = f"{enroute_url}/partial-tags{next(_names)}.git"
    run_git(["push", "--quiet", "--mirror", url], cwd=source[0])
    return url


def _objects(repo: Path) -> set[bytes]:
    out = run_git(["cat-file", "--batch-all-objects", "--batch-check=%(objectname)"], cwd=repo)
    return set(out.split())


def _clone(url: str, dest: Path, *flags: str) -> Path:
    run_git(["clone", "--quiet", "--bare", *flags, url, str(dest)], cwd=dest.parent)
    return dest


@pytest.mark.parametrize("spec", ["blob:none", "blob:limit=1", "blob:limit=100", "tree:0",
                                  "tree:1", "tree:2"])  # fmt: skip
def test_partial_clone_holds_what_git_sends(
    url: str, source: tuple[Path, dict[str, str]], tmp_path: Path, spec: str
) -> None:
    path, refs = source
    ours = _clone(url, tmp_path / "enroute.git", f"--filter={spec}")
    theirs = _clone(f"file://{path}", tmp_path / "git.git", f"--filter={spec}")
    assert _objects(ours) == _objects(theirs)
    for name, value in refs.items():
        assert run_git(["rev-parse", name], cwd=ours).strip().decode() == value
    # Every tag's target is here: the walk names only what the filter left out.
    listed = run_git(["rev-list", "--objects", "--all", "--missing=print"], cwd=ours)
    missing = {line[1:] for line in listed.split() if line.startswith(b"?")}
    for name in refs:
        if name.startswith("refs/tags/"):
            target = run_git(["rev-parse", name + "^{}"], cwd=path).strip()
            assert target not in missing, name
    run_git(["fsck", "--no-progress", "--no-dangling"], cwd=ours)


def test_a_huge_tree_depth_answers_at_once(
    url: str, source: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """``--filter=tree:<2^64-1>`` is a whole clone, answered as fast as one."""
    path, _ = source
    started = time.monotonic()
    ours = _clone(url, tmp_path / "deep.git", "--filter=tree:18446744073709551615")
    assert time.monotonic() - started < 30
    assert _objects(ours) == _objects(path)
    run_git(["fsck", "--no-progress", "--no-dangling"], cwd=ours)
