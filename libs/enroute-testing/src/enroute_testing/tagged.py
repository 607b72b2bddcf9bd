"""A small history whose refs point at every kind of object, for filter tests.

Real repositories carry annotated tags on blobs (a maintainer's public key) and on
trees, and refs straight at a blob or a tree. A filtered fetch must still send what
those refs name (git's list-objects-filter.c exempts objects the client gives), so
the engine's filter tests and the partial-clone interop tests build this history
with the real git CLI and compare against git's own answers.
"""

from __future__ import annotations

from pathlib import Path

from enroute_testing.gitcli import run_git

__all__ = ["tagged_history"]


def _hash(repo: Path, body: bytes) -> str:
    return run_git(["hash-object", "-w", "--stdin"], cwd=repo, input=body).decode().strip()


def _tag(repo: Path, name: str, target: str) -> None:
    run_git(["tag", "-a", "-m", f"{name}\n", name, target], cwd=repo)


def tagged_history(repo: Path) -> dict[str, str]:
    """A bare repository at ``repo``: three commits of nested directories on ``main``,
    and refs at blobs and trees. Returns its refs (name -> hex value):

    - ``refs/tags/key``: an annotated tag on a blob no commit holds (``blob:none``'s case);
    - ``refs/tags/big-key``: an annotated tag on a 4 KiB blob (``blob:limit``'s case);
    - ``refs/tags/dir``: an annotated tag on a tree that is also a subtree of ``main``,
      three levels deep (``tree:<n>``'s case);
    - ``refs/tags/loose-dir``: an annotated tag on a tree no commit holds;
    - ``refs/tags/key-of-key``: an annotated tag on the annotated tag ``key``;
    - ``refs/tags/light-blob`` and ``refs/tags/light-tree``: lightweight tags straight at
      a blob and a tree.
    """
    repo.mkdir(parents=True, exist_ok=True)
    run_git(["init", "--quiet", "--bare", "--initial-branch=main", "."], cwd=repo)
    parent: str | None = None
    for step in range(3):
        inner = run_git(
            ["mktree"],
            cwd=repo,
            input=b"100644 blob %s\tdeep.txt\n" % _hash(repo, b"deep %d\n" % step).encode()
            + b"100644 blob %s\tsame.txt\n" % _hash(repo, b"same\n").encode(),
        ).strip()
        middle = run_git(
            ["mktree"],
            cwd=repo,
            input=b"040000 tree %s\tinner\n" % inner
            + b"100644 blob %s\tmid.txt\n" % _hash(repo, b"mid %d\n" % step).encode(),
        ).strip()
        root = run_git(
            ["mktree"],
            cwd=repo,
            input=b"100644 blob %s\tREADME\n" % _hash(repo, b"readme %d\n" % step).encode()
            + b"040000 tree %s\tsrc\n" % middle,
        ).strip()
        args = ["commit-tree", root.decode(), "-m", f"step {step}"]
        if parent is not None:
            args += ["-p", parent]
        parent = run_git(args, cwd=repo).decode().strip()
    assert parent is not None
    run_git(["update-ref", "refs/heads/main", parent], cwd=repo)
    _tag(repo, "key", _hash(repo, b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nkey\n"))
    _tag(repo, "big-key", _hash(repo, b"k" * 4096 + b"\n"))
    _tag(repo, "dir", "main:src/inner")
    loose = run_git(
        ["mktree"],
        cwd=repo,
        input=b"100644 blob %s\tloose.txt\n" % _hash(repo, b"loose\n").encode(),
    ).strip()
    outer = run_git(["mktree"], cwd=repo, input=b"040000 tree %s\tsub\n" % loose).strip()
    _tag(repo, "loose-dir", outer.decode())
    _tag(repo, "key-of-key", "key")
    light_blob = _hash(repo, b"lightweight\n")
    run_git(["update-ref", "refs/tags/light-blob", light_blob], cwd=repo)
    run_git(["update-ref", "refs/tags/light-tree", "main~1:src"], cwd=repo)
    out = run_git(["for-each-ref", "--format=%(refname) %(objectname)"], cwd=repo)
    return dict(line.split(" ", 1) for line in out.decode().splitlines())
