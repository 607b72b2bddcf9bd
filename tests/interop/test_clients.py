"""Push and clone end to end against a running `enroute dev`, with three Git clients.

1. libgit2 (pygit2) and dulwich clone over smart HTTP and get exactly the
   source's refs and objects; a commit each pushes lands, is advertised by
   `git ls-remote`, and a fresh git clone of it passes `git fsck --strict`.
2. The git CLI in the cases where the ref transaction matters
   (gitprotocol-pack "Pushing Data To a Server", report-status): two pushes
   racing for one ref, `--atomic` with one stale ref, a forced rewind, and a
   non-fast-forward refused without force.
"""

from __future__ import annotations

import io
import itertools
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pygit2
import pytest
from dulwich import porcelain
from dulwich.objects import Blob, Commit, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo

from enroute_testing.gitcli import FIXED_EMAIL, FIXED_NAME, default_home, git_env, run_git
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo

pytestmark = pytest.mark.interop

SPEC = RepoSpec(
    seed=23,
    commits=30,
    branches=2,
    merge_every=5,
    files=15,
    binary_files=1,
    annotated_tags=2,
    lightweight_tags=1,
    file_bytes=800,
)
FIXED_TIME_S = 1_700_000_000
RACE_TIMEOUT_S = 30.0
_names = itertools.count()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("clients-src") / "src.git", SPEC)


@pytest.fixture
def seeded(enroute_url: str, source: GeneratedRepo) -> str:
    """URL of a fresh repository on the server holding all of `source`'s refs."""
    url = f"{enroute_url}/clients-{next(_names)}-{time.monotonic_ns()}.git"
    run_git(
        ["push", "--quiet", url, "refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"],
        cwd=source.path,
        timeout_s=60,
    )
    return url


# --- helpers --------------------------------------------------------------------------------


def ls_remote(url: str, cwd: Path) -> dict[bytes, bytes]:
    """Ref name -> 40-hex oid as the server advertises them (peeled `^{}` lines dropped)."""
    refs: dict[bytes, bytes] = {}
    for line in run_git(["ls-remote", url], cwd=cwd, timeout_s=30).splitlines():
        oid, name = line.split(b"\t", 1)
        if not name.endswith(b"^{}") and name != b"HEAD":
            refs[name] = oid
    return refs


def object_ids(repo: Path) -> set[bytes]:
    listing = run_git(["cat-file", "--batch-all-objects", "--batch-check=%(objectname)"], cwd=repo)
    return set(listing.split())


def clone_and_fsck(url: str, tmp: Path) -> Path:
    """A bare git clone of `url` that `git fsck --strict` accepts."""
    target = tmp / f"verify-{next(_names)}.git"
    run_git(["clone", "--quiet", "--bare", url, str(target)], cwd=tmp, timeout_s=60)
    run_git(["fsck", "--strict", "--no-dangling"], cwd=target, timeout_s=60)
    return target


def git_clone(url: str, tmp: Path, name: str) -> Path:
    target = tmp / name
    run_git(["clone", "--quiet", url, str(target)], cwd=tmp, timeout_s=60)
    return target


def git_commit(work: Path, path: str, content: bytes) -> bytes:
    """Commit one file change in a working clone; returns the new 40-hex HEAD."""
    (work / path).write_bytes(content)
    run_git(["add", path], cwd=work)
    run_git(["commit", "--quiet", "-m", f"change {path}"], cwd=work)
    return run_git(["rev-parse", "HEAD"], cwd=work).strip()


def rev(work: Path, name: str) -> bytes:
    return run_git(["rev-parse", name], cwd=work).strip()


def heads_and_tags(refs: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """Branches and tags; a clone's remote-tracking branches count as the branches they track."""
    out: dict[bytes, bytes] = {}
    for name, oid in refs.items():
        if name.startswith(b"refs/remotes/origin/") and name != b"refs/remotes/origin/HEAD":
            out[b"refs/heads/" + name.removeprefix(b"refs/remotes/origin/")] = oid
        elif name.startswith((b"refs/heads/", b"refs/tags/")):
            out.setdefault(name, oid)
    return out


# --- libgit2 --------------------------------------------------------------------------------


class _PushStatus(pygit2.RemoteCallbacks):
    """Collects report-status per ref: libgit2 hands rejections to this callback."""

    def __init__(self) -> None:
        super().__init__()
        self.results: dict[str, str | None] = {}

    def push_update_reference(self, refname: str, message: str | None) -> None:
        self.results[refname] = message


def test_pygit2_clone_and_push(seeded: str, source: GeneratedRepo, tmp_path: Path) -> None:
    clone = pygit2.clone_repository(seeded, str(tmp_path / "pg"), bare=True)
    clone_path = Path(clone.path)
    got: dict[bytes, bytes] = {}
    for name in clone.references:
        ref = clone.references[name]
        if ref.type != pygit2.enums.ReferenceType.DIRECT:
            continue
        got[name.encode()] = str(ref.target).encode()
    assert heads_and_tags(got) == heads_and_tags(source.refs)
    assert object_ids(clone_path) == object_ids(source.path)
    run_git(["fsck", "--strict", "--no-dangling"], cwd=clone_path)

    main = clone.references.get("refs/heads/main") or clone.references["refs/remotes/origin/main"]
    parent = clone.get(main.target)
    assert isinstance(parent, pygit2.Commit)
    builder = clone.TreeBuilder(parent.tree)
    builder.insert("pygit2-note.txt", clone.create_blob(b"written by libgit2\n"), 0o100644)
    signature = pygit2.Signature(FIXED_NAME, FIXED_EMAIL, FIXED_TIME_S, 0)
    new = clone.create_commit(
        None, signature, signature, "libgit2 push\n", builder.write(), [parent.id]
    )
    status = _PushStatus()
    clone.remotes["origin"].push(
        [f"{new}:refs/heads/main", f"{new}:refs/heads/from-libgit2"], callbacks=status
    )
    assert status.results == {"refs/heads/main": None, "refs/heads/from-libgit2": None}

    advertised = ls_remote(seeded, tmp_path)
    assert advertised[b"refs/heads/main"] == str(new).encode()
    assert advertised[b"refs/heads/from-libgit2"] == str(new).encode()
    verify = clone_and_fsck(seeded, tmp_path)
    assert rev(verify, "refs/heads/main") == str(new).encode()
    assert run_git(["cat-file", "-p", f"{new}:pygit2-note.txt"], cwd=verify) == (
        b"written by libgit2\n"
    )


# --- dulwich --------------------------------------------------------------------------------


def test_dulwich_clone_and_push(seeded: str, source: GeneratedRepo, tmp_path: Path) -> None:
    err = io.BytesIO()
    clone = porcelain.clone(seeded, str(tmp_path / "dw.git"), bare=True, errstream=err)
    try:
        refs = {bytes(k): bytes(v) for k, v in clone.get_refs().items() if k != b"HEAD"}
        assert heads_and_tags(refs) == heads_and_tags(source.refs)
        assert object_ids(tmp_path / "dw.git") == object_ids(source.path)
        run_git(["fsck", "--strict", "--no-dangling"], cwd=tmp_path / "dw.git")

        parent = clone[ObjectID(refs[b"refs/heads/main"])]
        assert isinstance(parent, Commit)
        blob = Blob.from_string(b"written by dulwich\n")
        tree = Tree()
        for item in clone[parent.tree].items():  # type: ignore[attr-defined]
            tree.add(item.path, item.mode, item.sha)
        tree.add(b"dulwich-note.txt", 0o100644, blob.id)
        commit = Commit()
        commit.tree = tree.id
        commit.parents = [parent.id]
        commit.author = commit.committer = f"{FIXED_NAME} <{FIXED_EMAIL}>".encode()
        commit.author_time = commit.commit_time = FIXED_TIME_S
        commit.author_timezone = commit.commit_timezone = 0
        commit.message = b"dulwich push\n"
        for obj in (blob, tree, commit):
            clone.object_store.add_object(obj)
        clone.refs[Ref(b"refs/heads/main")] = commit.id

        result = porcelain.push(
            clone,
            seeded,
            [b"refs/heads/main:refs/heads/main", b"refs/heads/main:refs/heads/from-dulwich"],
            errstream=err,
        )
    finally:
        clone.close()
    assert result.ref_status is not None
    assert result.ref_status == {
        b"refs/heads/main": None,
        b"refs/heads/from-dulwich": None,
    }, err.getvalue()

    advertised = ls_remote(seeded, tmp_path)
    assert advertised[b"refs/heads/main"] == commit.id
    assert advertised[b"refs/heads/from-dulwich"] == commit.id
    verify = clone_and_fsck(seeded, tmp_path)
    assert rev(verify, "refs/heads/main") == commit.id
    with Repo(str(verify)) as check:
        pushed = check[commit.id]
        assert isinstance(pushed, Commit) and pushed.message == b"dulwich push\n"


# --- git CLI --------------------------------------------------------------------------------

# A loser either lost the compare-and-swap on the server (report-status `ng`) or saw the
# winner's commit in the advertisement and refused locally.
REJECTED = re.compile(
    rb"! \[(?:remote )?rejected\] +main -> main \((?:stale ref|fetch first|non-fast-forward)\)"
)


def test_concurrent_pushes_to_one_ref(seeded: str, tmp_path: Path) -> None:
    before = ls_remote(seeded, tmp_path)[b"refs/heads/main"]
    one = git_clone(seeded, tmp_path, "one")
    two = git_clone(seeded, tmp_path, "two")
    commits = {
        "one": git_commit(one, "race-one.txt", b"one\n"),
        "two": git_commit(two, "race-two.txt", b"two\n"),
    }
    env = git_env(default_home())
    procs = {
        name: subprocess.Popen(
            ["git", "push", "origin", "main:main"],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name, work in (("one", one), ("two", two))
    }
    outcomes: dict[str, tuple[int, bytes]] = {}
    try:
        for name, proc in procs.items():
            _, stderr = proc.communicate(timeout=RACE_TIMEOUT_S)
            outcomes[name] = (proc.returncode, stderr)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    winners = [name for name, (code, _) in outcomes.items() if code == 0]
    assert len(winners) == 1, outcomes
    (loser,) = set(outcomes) - set(winners)
    loser_err = outcomes[loser][1]
    assert REJECTED.search(loser_err), loser_err
    after = ls_remote(seeded, tmp_path)[b"refs/heads/main"]
    assert after == commits[winners[0]] != before
    clone_and_fsck(seeded, tmp_path)


def test_atomic_push_with_one_stale_ref_moves_nothing(seeded: str, tmp_path: Path) -> None:
    mine = git_clone(seeded, tmp_path, "mine")
    theirs = git_clone(seeded, tmp_path, "theirs")
    # Someone else moves `side` after `mine` cloned: mine's view of it is stale.
    run_git(["checkout", "--quiet", "-b", "side"], cwd=theirs)
    theirs_side = git_commit(theirs, "theirs.txt", b"theirs\n")
    run_git(["push", "--quiet", "origin", "side"], cwd=theirs, timeout_s=60)
    before = ls_remote(seeded, tmp_path)
    assert before[b"refs/heads/side"] == theirs_side

    git_commit(mine, "mine-main.txt", b"main\n")
    run_git(["checkout", "--quiet", "-b", "side", "origin/main"], cwd=mine)
    git_commit(mine, "mine-side.txt", b"side\n")
    push = subprocess.run(
        ["git", "push", "--atomic", "origin", "main:main", "side:side"],
        cwd=mine,
        env=git_env(default_home()),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert push.returncode != 0, push.stderr
    assert b"atomic" in push.stderr or b"rejected" in push.stderr, push.stderr
    assert ls_remote(seeded, tmp_path) == before


def test_force_push_moves_branch_backwards(seeded: str, tmp_path: Path) -> None:
    work = git_clone(seeded, tmp_path, "work")
    old = rev(work, "HEAD~3")
    assert ls_remote(seeded, tmp_path)[b"refs/heads/main"] != old
    run_git(["push", "--quiet", "--force", "origin", f"{old.decode()}:refs/heads/main"], cwd=work)
    assert ls_remote(seeded, tmp_path)[b"refs/heads/main"] == old
    verify = clone_and_fsck(seeded, tmp_path)
    assert rev(verify, "refs/heads/main") == old


def test_non_fast_forward_rejected_without_force(seeded: str, tmp_path: Path) -> None:
    work = git_clone(seeded, tmp_path, "work")
    tip = rev(work, "HEAD")
    old = rev(work, "HEAD~3")
    push = subprocess.run(
        ["git", "push", "origin", f"{old.decode()}:refs/heads/main"],
        cwd=work,
        env=git_env(default_home()),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert push.returncode != 0, push.stderr
    assert b"non-fast-forward" in push.stderr, push.stderr
    assert ls_remote(seeded, tmp_path)[b"refs/heads/main"] == tip


def _pkt(payload: bytes) -> bytes:
    return b"%04x%s" % (len(payload) + 4, payload)


def _pkt_lines(data: bytes) -> list[bytes]:
    """Split a pkt-line stream (gitprotocol-common "pkt-line Format"); flushes are dropped."""
    lines: list[bytes] = []
    pos = 0
    while pos + 4 <= len(data):
        size = int(data[pos : pos + 4], 16)
        if size == 0:
            pos += 4
            continue
        lines.append(data[pos + 4 : pos + size].rstrip(b"\n"))
        pos += size
    return lines


def test_atomic_push_stale_on_server_moves_nothing(seeded: str, tmp_path: Path) -> None:
    """The stale old-oid reaches the server: git's client checks would refuse it first."""
    work = git_clone(seeded, tmp_path, "work")
    advertised = ls_remote(seeded, tmp_path)
    branch = next(n for n in sorted(advertised) if n.startswith(b"refs/heads/feature/"))
    old_main, old_branch = advertised[b"refs/heads/main"], advertised[branch]
    new_main = git_commit(work, "atomic-main.txt", b"main\n")
    run_git(["checkout", "--quiet", "-b", "other", old_branch.decode()], cwd=work)
    new_branch = git_commit(work, "atomic-branch.txt", b"branch\n")
    pack = run_git(
        ["pack-objects", "--stdout", "--revs", "--quiet"],
        cwd=work,
        input=b"%s\n%s\n^%s\n^%s\n" % (new_main, new_branch, old_main, old_branch),
    )
    stale = rev(work, f"{old_main.decode()}~1")
    assert stale not in (old_main, old_branch)
    body = (
        _pkt(b"%s %s refs/heads/main\0report-status atomic\n" % (old_main, new_main))
        + _pkt(b"%s %s %s\n" % (stale, new_branch, branch))
        + b"0000"
        + pack
    )
    request = urllib.request.Request(
        f"{seeded}/git-receive-pack",
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/x-git-receive-pack-request",
            "Accept": "application/x-git-receive-pack-result",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        report = _pkt_lines(response.read())
    statuses = {line.split(b" ")[1]: line for line in report if line.startswith((b"ok ", b"ng "))}
    assert set(statuses) == {b"refs/heads/main", branch}, report
    assert all(line.startswith(b"ng ") for line in statuses.values()), report
    assert ls_remote(seeded, tmp_path) == advertised
