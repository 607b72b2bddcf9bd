"""Clones and fetches through every serving path, against a real ``enroute dev``, each
result checked by ``git fsck --strict``.

The paths: the run copy of stored entries (full, blobless and shallow packs), a plan
reused by an identical clone of an unchanged repository and not reused once a push
changed it, and fetches served from the view without a read barrier when the view
holds every want (DESIGN "Read path": only the ref reads need one).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from enroute_testing.gitcli import run_git
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo, list_refs

pytestmark = pytest.mark.interop

_names = itertools.count()
_SPEC = RepoSpec(seed=5, commits=60, branches=2, files=40, annotated_tags=2, lightweight_tags=1)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("clone-paths") / "source.git", _SPEC)


def _push(url: str, repo: Path) -> None:
    run_git(["push", "--quiet", "--mirror", url], cwd=repo)


def _fsck(path: Path) -> None:
    run_git(["fsck", "--strict", "--no-progress", "--no-dangling"], cwd=path)


def _clone(url: str, dest: Path, *flags: str, version: str = "2") -> Path:
    run_git(["-c", f"protocol.version={version}", "clone", "--quiet", "--bare", *flags, url,
             str(dest)], cwd=dest.parent)  # fmt: skip
    return dest


def test_full_clones_twice_over_v2_and_v0(
    enroute_url: str, source: GeneratedRepo, tmp_path: Path
) -> None:
    url = f"{enroute_url}/paths{next(_names)}.git"
    _push(url, source.path)
    for version, attempt in itertools.product(("2", "0"), (1, 2)):  # the second: same plan
        dest = _clone(url, tmp_path / f"v{version}-{attempt}.git", version=version)
        assert list_refs(dest) == source.refs
        _fsck(dest)


def test_blobless_and_shallow_clones(
    enroute_url: str, source: GeneratedRepo, tmp_path: Path
) -> None:
    url = f"{enroute_url}/paths{next(_names)}.git"
    _push(url, source.path)
    main = run_git(["rev-parse", "refs/heads/main"], cwd=source.path).strip()
    for attempt in (1, 2):
        blobless = _clone(url, tmp_path / f"blobless-{attempt}.git", "--filter=blob:none")
        _fsck(blobless)
        assert run_git(["rev-parse", "refs/heads/main"], cwd=blobless).strip() == main
        shallow = _clone(url, tmp_path / f"shallow-{attempt}.git", "--depth", "1")
        _fsck(shallow)
        assert run_git(["rev-list", "--count", "refs/heads/main"], cwd=shallow).strip() == b"1"


def test_fetch_and_clone_after_a_push_see_it(
    enroute_url: str, source: GeneratedRepo, tmp_path: Path
) -> None:
    """A clone after a push gets the new state (a plan of the old one is not reused), and
    fetches over v2 and v0 bring the new commits."""
    url = f"{enroute_url}/paths{next(_names)}.git"
    _push(url, source.path)
    fetchers = {v: _clone(url, tmp_path / f"fetch-v{v}.git", version=v) for v in ("2", "0")}
    _clone(url, tmp_path / "before.git")
    work = tmp_path / "work"
    run_git(["clone", "--quiet", url, str(work)], cwd=tmp_path)
    for i in range(3):
        (work / f"new-{i}.txt").write_text(f"new {i}\n" * 40)
        run_git(["add", "."], cwd=work)
        run_git(["commit", "--quiet", "-m", f"new {i}"], cwd=work)
    run_git(["push", "--quiet", "origin", "HEAD:refs/heads/main"], cwd=work)
    tip = run_git(["rev-parse", "HEAD"], cwd=work).strip()
    for version, dest in fetchers.items():
        run_git(["-c", f"protocol.version={version}", "fetch", "--quiet", "origin",
                 "+refs/heads/*:refs/heads/*"], cwd=dest)  # fmt: skip
        assert run_git(["rev-parse", "refs/heads/main"], cwd=dest).strip() == tip
        _fsck(dest)
    after = _clone(url, tmp_path / "after.git")
    assert run_git(["rev-parse", "refs/heads/main"], cwd=after).strip() == tip
    _fsck(after)
