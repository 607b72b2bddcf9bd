"""Tree entries whose mode git reads as a gitlink, such as ``160644``, through `enroute dev`.

git reads every tree mode through ``canon_mode`` (tree-walk.c ``decode_tree_entry``):
a mode that is not a file, a symlink or a directory is ``S_IFGITLINK``, so
``160644`` (and ``170000``) name a submodule commit. Its object need not exist
and no walk follows it: list-objects.c ``process_tree`` (what packs a clone),
fsck.c ``fsck_walk_tree`` (connectivity, index-pack's type checks). fsck calls
the mode itself ``badFilemode`` (INFO in git; harmless in Enroute: a warning).

A history with such entries, one naming a commit neither side holds and one naming
a blob the repository holds only there, is pushed by the real git client to Enroute
and to C git with ``receive.fsckObjects``. Both accept it; full and blobless clones
from Enroute hold exactly the objects C git's do (the named blob is not sent, as it
is reachable only through a gitlink), and pass ``git fsck``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from enroute_testing.gitcli import git_env, run_git

pytestmark = pytest.mark.interop

ABSENT = "1234567890abcdef1234567890abcdef12345678"


def _git(cwd: Path, *args: str, input: bytes | None = None) -> bytes:
    return run_git(list(args), cwd=cwd, home=cwd.parent / "home", input=input).strip()


def _objects(repo: Path) -> set[bytes]:
    out = _git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)")
    return set(out.splitlines())


def test_gitlink_typed_modes_are_gitlinks_as_in_git(enroute_url: str, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    readme = _git(work, "hash-object", "-w", "--stdin", input=b"hello\n").decode()
    # only named by a gitlink-typed entry: no walk reaches it, so no clone holds it
    hidden = _git(work, "hash-object", "-w", "--stdin", input=b"behind a gitlink\n").decode()
    entries = [
        (b"100644", b"README", readme),
        (b"170000", b"odd-sub", hidden),
        (b"160644", b"old-sub", ABSENT),  # a commit nobody holds: fine for a gitlink
    ]
    body = b"".join(m + b" " + n + b"\0" + bytes.fromhex(o) for m, n, o in entries)
    tree = _git(work, "hash-object", "-t", "tree", "-w", "--literally", "--stdin", input=body)
    commit = _git(work, "commit-tree", "-m", "gitlink modes", tree.decode())
    _git(work, "update-ref", "refs/heads/main", commit.decode())

    url = f"{enroute_url}/gitlinks/modes-{time.monotonic_ns()}.git"
    bare = tmp_path / "c-git.git"
    run_git(["init", "-q", "--bare", str(bare)], cwd=tmp_path)
    run_git(["config", "receive.fsckObjects", "true"], cwd=bare)
    run_git(["config", "uploadpack.allowFilter", "true"], cwd=bare)
    _push_both(work, url, bare)

    clones = []
    for how in ([], ["--filter=blob:none"]):
        ours, theirs = tmp_path / f"ours{len(how)}", tmp_path / f"theirs{len(how)}"
        run_git(["clone", "-q", "--bare", *how, url, str(ours)], cwd=tmp_path)
        run_git(["clone", "-q", "--bare", *how, f"file://{bare}", str(theirs)], cwd=tmp_path)
        clones.append((ours, theirs))
        _same_and_sound(ours, theirs, hidden)

    # an incremental push and fetch: a tree beside the same gitlinks, diffed against its parent
    more = _git(work, "hash-object", "-w", "--stdin", input=b"more\n").decode()
    entries.insert(0, (b"100644", b"MORE", more))
    body = b"".join(m + b" " + n + b"\0" + bytes.fromhex(o) for m, n, o in entries)
    tree = _git(work, "hash-object", "-t", "tree", "-w", "--literally", "--stdin", input=body)
    nxt = _git(work, "commit-tree", "-p", commit.decode(), "-m", "next", tree.decode())
    _git(work, "update-ref", "refs/heads/main", nxt.decode())
    _push_both(work, url, bare)
    for ours, theirs in clones:
        for repo in (ours, theirs):
            _git(repo, "fetch", "-q", "origin", "+refs/heads/*:refs/heads/*")
        _same_and_sound(ours, theirs, hidden)


def _push_both(work: Path, url: str, bare: Path) -> None:
    for remote in (url, str(bare)):
        pushed = subprocess.run(
            ["git", "push", "--porcelain", remote, "main:refs/heads/main"],
            cwd=work,
            env=git_env(work.parent / "home"),
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert pushed.returncode == 0, (remote, pushed.stderr)
        if remote == url:
            assert b"warning: badFilemode: 1 object(s)" in pushed.stderr, pushed.stderr


def _same_and_sound(ours: Path, theirs: Path, hidden: str) -> None:
    """Enroute's clone holds what C git's does, never the blob behind a gitlink, passes git
    fsck, and a walk that prints missing objects (a blobless clone's blobs) sees what it
    sees in C git's."""
    assert _objects(ours) == _objects(theirs), ours
    assert not any(line.startswith(hidden.encode()) for line in _objects(ours))
    _git(ours, "fsck", "--no-dangling")
    walks = [
        sorted(_git(r, "rev-list", "--objects", "--all", "--missing=print").splitlines())
        for r in (ours, theirs)
    ]
    assert walks[0] == walks[1], walks
