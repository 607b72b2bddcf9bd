"""Pushes that name objects the repository already holds, against a real `enroute dev` (issue 20).

``index-pack --strict`` (what ``receive.fsckObjects`` runs) checks a pushed
object against the repository too, not only against the pack:

- fsck.c ``fsck_finish`` reads every blob a pushed tree names ``.gitmodules``
  from the object database, so a hostile ``.gitmodules`` pushed first as a
  harmless ``notes.txt`` and then renamed is refused;
- builtin/index-pack.c ``check_object`` asks the type of every object a pushed
  tree, commit or tag names ("object %s: expected type %s, found %s"), so a
  tag or tree entry naming a held object of another type is refused.

Each case is pushed to Enroute and, beside it, to C git with
``receive.fsckObjects`` (or its ``index-pack --strict``), which refuses it too.
The git client will not build a pack with a wrong-type reference (its own
walk stops at ``object … is a commit, not a blob``), so those objects are made
with ``git hash-object --literally``, packed by ``git pack-objects`` from an
explicit list, and sent as a smart-HTTP push request. Every refusal leaves the
refs as they were, and the repository still clones.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hostile_wire import Client, report_lines

from enroute_testing.gitcli import git_env, run_git

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

HOSTILE = b'[submodule "x"]\n\tpath = x\n\turl = --upload-pack=touch x\n'
"""Refused by git's fsck as ``gitmodulesUrl`` (CVE-2018-17456), a harmless file elsewhere."""
ZERO = b"0" * 40


def _git(work: Path, *args: str, input: bytes | None = None) -> bytes:
    return run_git(list(args), cwd=work, home=work.parent / "home", input=input).strip()


def _push(work: Path, url: str, *refspecs: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "push", "--porcelain", url, *refspecs],
        cwd=work,
        env=git_env(work.parent / "home"),
        capture_output=True,
        timeout=120,
        check=False,
    )


def _remote_refs(work: Path, url: str) -> dict[bytes, bytes]:
    out = _git(work, "ls-remote", url)
    return {name: oid for oid, name in (line.split(b"\t") for line in out.splitlines())}


def _repo(tmp_path: Path, name: str) -> Path:
    """A work tree with one commit: README, dir/f and the hostile text as notes.txt."""
    work = tmp_path / name
    (tmp_path / "home").mkdir(exist_ok=True)
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "README").write_bytes(b"hello\n")
    (work / "dir").mkdir()
    (work / "dir" / "f").write_bytes(b"f\n")
    (work / "notes.txt").write_bytes(HOSTILE)
    _git(work, "add", ".")
    _git(work, "commit", "-q", "-m", "base")
    return work


def _c_git_remote(tmp_path: Path, name: str) -> str:
    """A bare repository as C git's receive-pack with ``receive.fsckObjects`` serves it."""
    bare = tmp_path / f"{name}-c-git.git"
    run_git(["init", "-q", "--bare", str(bare)], cwd=tmp_path)
    run_git(["config", "receive.fsckObjects", "true"], cwd=bare)
    return str(bare)


# -- a .gitmodules that arrives under another name ---------------------------------------------


@pytest.mark.parametrize("name", [".gitmodules", ".GitModules", "GITMOD~1"])
def test_gitmodules_renamed_from_a_held_blob_is_refused(
    enroute_url: str, tmp_path: Path, name: str
) -> None:
    work = _repo(tmp_path, "renamed")
    url = f"{enroute_url}/holes/renamed-{time.monotonic_ns()}.git"
    c_git = _c_git_remote(tmp_path, "renamed")
    for remote in (url, c_git):  # a harmless file: both accept it
        first = _push(work, remote, "main:refs/heads/main")
        assert first.returncode == 0, first.stderr
    before = _remote_refs(work, url)
    _git(work, "mv", "notes.txt", name)
    _git(work, "commit", "-q", "-m", "rename")
    refused = _push(work, url, "main:refs/heads/main")
    assert refused.returncode != 0, refused.stdout
    assert b"gitmodulesUrl" in refused.stderr + refused.stdout, refused.stderr
    assert b"[remote rejected]" in refused.stderr or b"!\t" in refused.stdout
    assert _remote_refs(work, url) == before
    # C git with receive.fsckObjects refuses the same push, with the same message id
    by_c_git = _push(work, c_git, "main:refs/heads/main")
    assert by_c_git.returncode != 0 and b"gitmodulesUrl" in by_c_git.stderr, by_c_git.stderr
    # nothing changed: the repository still clones, at the first commit
    clone = tmp_path / "clone"
    run_git(["clone", "-q", url, str(clone)], cwd=tmp_path)
    assert _git(clone, "rev-parse", "HEAD") == before[b"refs/heads/main"]


# -- the same through the REST API -------------------------------------------------------------


def _api(url: str, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}/api/v1{path}",
        data=None if payload is None else json.dumps(payload).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _api_commit(url: str, repo: str, parent: str | None, changes: list[dict[str, Any]]) -> Any:
    return _api(url, "POST", f"/repos/{repo}/-/commits", {
        "branch": "main", "expected_oid": parent, "message": "m\n",
        "author": {"name": "A", "email": "a@example.com"}, "changes": changes,
    })  # fmt: skip


def _content(path: str, data: bytes) -> dict[str, Any]:
    return {"path": path, "content_base64": base64.b64encode(data).decode()}


def test_gitmodules_through_the_api_is_refused_however_it_arrives(enroute_url: str) -> None:
    """An API commit is a pack ingested like a push (DESIGN "API commits"): a hostile
    .gitmodules is refused whether written at once or moved from a held notes.txt."""
    repo = f"holes/api-{time.monotonic_ns()}"
    assert _api(enroute_url, "POST", "/repos", {"name": repo})[0] == 201
    status, made = _api_commit(enroute_url, repo, None, [_content("notes.txt", HOSTILE)])
    assert status == 201, made
    head = made["oid"] if "oid" in made else made["commit"]["oid"]
    for changes in (
        [{"path": "notes.txt"}, _content(".gitmodules", HOSTILE)],  # the held blob, renamed
        [_content(".GITMODULES", HOSTILE)],  # another spelling
        [_content(".gitmodules", HOSTILE.replace(b"x\n\turl", b"y\n\turl"))],  # a new blob
    ):
        status, body = _api_commit(enroute_url, repo, head, changes)
        assert status == 400, (changes, body)
        assert body["error"]["code"] == "invalid_object", body
        assert "gitmodulesUrl" in body["error"]["message"], body
    refs = _api(enroute_url, "GET", f"/repos/{repo}/-/refs")[1]["refs"]
    assert [(r["name"], r["oid"]) for r in refs] == [("refs/heads/main", head)]


# -- wrong-type references to held objects ------------------------------------------------------


def _object(work: Path, type_name: str, body: bytes) -> bytes:
    return _git(work, "hash-object", "-t", type_name, "-w", "--literally", "--stdin", input=body)


def _tree(work: Path, entries: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """A tree object of (mode, name, hex oid) entries, written as given (git's order)."""
    body = b"".join(m + b" " + n + b"\0" + bytes.fromhex(o.decode()) for m, n, o in entries)
    return _object(work, "tree", body)


def _pack(work: Path, oids: list[bytes]) -> bytes:
    """``git pack-objects`` of exactly ``oids`` (no walk, so nothing checks their links)."""
    return run_git(["pack-objects", "--stdout", "-q"], cwd=work, input=b"\n".join(oids) + b"\n")


Entries = list[tuple[bytes, bytes]]
COMMIT_AS_BLOB = b"is a commit, expected a blob"
TREE_AS_BLOB = b"is a tree, expected a blob"
CASES: dict[str, tuple[str, Entries | None, bytes]] = {
    # name: (the held object named, (mode, name) entries naming it beside README, or a tag
    # of type blob when None, the words of the refusal)
    "tag-type-blob-names-held-commit": ("commit", None, COMMIT_AS_BLOB),
    "entry-100644-names-held-commit": ("commit", [(b"100644", b"x")], COMMIT_AS_BLOB),
    "entry-100755-names-held-tree": ("tree", [(b"100755", b"x")], TREE_AS_BLOB),
    "entry-120000-names-held-tree": ("tree", [(b"120000", b"x")], TREE_AS_BLOB),
    "entry-40000-names-held-blob": ("blob", [(b"40000", b"x")], b"is a blob, expected a tree"),
    "entry-40000-names-held-commit": (
        "commit",
        [(b"40000", b"x")],
        b"is a commit, expected a tree",
    ),
    # dir is 40000 in the parent: the same id at the same path, now with a file's mode
    "entry-100644-at-the-trees-own-path": ("tree", [(b"100644", b"dir")], TREE_AS_BLOB),
    # one id as a directory and as a file in one tree
    "entry-tree-and-file-at-once": ("tree", [(b"40000", b"a"), (b"100644", b"b")], TREE_AS_BLOB),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_type_reference_to_a_held_object_is_refused(
    enroute_url: str, tmp_path: Path, case: str
) -> None:
    held, entries, words = CASES[case]
    work = _repo(tmp_path, "typed")
    url = f"{enroute_url}/holes/typed-{time.monotonic_ns()}.git"
    assert _push(work, url, "main:refs/heads/main").returncode == 0
    base = _git(work, "rev-parse", "HEAD")
    target = {
        "commit": base,
        "tree": _git(work, "rev-parse", "HEAD:dir"),
        "blob": _git(work, "rev-parse", "HEAD:README"),
    }[held]
    if entries is None:
        tag = b"object %s\ntype blob\ntag evil\ntagger A <a@b.c> 1700000000 +0000\n\nt\n" % target
        new = [_object(work, "tag", tag)]
        ref = b"refs/tags/evil"
        old = ZERO
    else:
        readme = _git(work, "rev-parse", "HEAD:README")
        named = [(mode, name, target) for mode, name in entries]
        tree = _tree(work, [(b"100644", b"README", readme), *named])
        top = _git(work, "commit-tree", "-p", base.decode(), "-m", "evil", tree.decode())
        new = [tree, top]
        ref = b"refs/heads/main"
        old = base
    pack = _pack(work, new)
    # C git refuses the pack: index-pack --strict as receive.fsckObjects runs it
    c_git = Path(_c_git_remote(tmp_path, "typed"))
    assert _push(work, str(c_git), "main:refs/heads/main").returncode == 0
    by_c_git = subprocess.run(
        ["git", "index-pack", "--strict", "--stdin"],
        cwd=c_git,
        env=git_env(tmp_path / "home"),
        input=pack,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert by_c_git.returncode != 0, by_c_git.stdout
    client = Client(enroute_url)
    repo = url.removeprefix(enroute_url + "/").removesuffix(".git")
    before = client.refs(repo)
    reply = client.push(repo, [(old, new[-1], ref)], pack)
    lines = report_lines(reply)
    assert reply.status == 200, reply
    assert any(line.startswith(b"unpack ") and words in line for line in lines), lines
    assert b"ng " + ref + b" unpacker error" in lines, lines
    assert client.refs(repo) == before
    clone = tmp_path / "clone"
    run_git(["clone", "-q", url, str(clone)], cwd=tmp_path)
    assert _git(clone, "rev-parse", "HEAD") == base
