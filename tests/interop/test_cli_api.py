"""`enroute repo ...` and `enroute commit` against a running `enroute dev`.

The commands are REST /api/v1 clients (DESIGN.md, "External interfaces"); each
test drives them through typer's runner and checks what the server then holds
through the API itself, so a CLI that prints the right thing but sends the
wrong request fails.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dulwich import porcelain
from dulwich.objects import Commit, Tree
from dulwich.repo import Repo
from typer.testing import CliRunner

from enroute_gitproto.cli import app

pytestmark = pytest.mark.interop

_names = itertools.count()
AUTHOR = ["--author-name", "Ann Author", "--author-email", "ann@example.com"]


def fresh_name(prefix: str) -> str:
    return f"cli/{prefix}-{next(_names)}-{time.monotonic_ns()}"


def run(url: str, *args: str, ok: bool = True) -> Any:
    result = CliRunner().invoke(app, [*args, "--url", url])
    if ok:
        assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def api(url: str, method: str, path: str, body: object = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/api/v1{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def test_create_get_json_and_table(enroute_url: str) -> None:
    name = fresh_name("create")
    created = run(enroute_url, "repo", "create", name, "--default-branch", "trunk", "--json")
    repo = json.loads(created.stdout)
    assert repo["name"] == name
    assert repo["head"] == "refs/heads/trunk"
    assert repo["last_push"] is None
    again = run(enroute_url, "repo", "create", name)
    assert "(exists)" in again.stdout
    got = run(enroute_url, "repo", "get", name)
    header, row = got.stdout.splitlines()
    assert header.split() == ["NAME", "HEAD", "INCARNATION", "LAST_PUSH", "DELETED"]
    assert row.split() == [name, "refs/heads/trunk", str(repo["incarnation"]), "-", "false"]
    # Columns are aligned: every column starts at the same offset in both lines.
    assert header.index("HEAD") == row.index("refs/heads/trunk")
    assert api(enroute_url, "GET", f"/repos/{name}")["head"] == "refs/heads/trunk"


def test_list_follows_page_tokens(enroute_url: str) -> None:
    prefix = fresh_name("list")
    names = [f"{prefix}/r{i}" for i in range(5)]
    for name in names:
        run(enroute_url, "repo", "create", name)
    # One repository per page: every one must still be printed.
    listed = json.loads(run(enroute_url, "repo", "list", "--limit", "1", "--json").stdout)
    listed_names = [r["name"] for r in listed["repos"]]
    assert [n for n in listed_names if n.startswith(prefix + "/")] == names
    assert listed_names == sorted(listed_names, key=str.encode)
    assert len(listed_names) == len(set(listed_names))
    table = run(enroute_url, "repo", "list", "--limit", "2").stdout.splitlines()
    assert [line.split()[0] for line in table[1:]] == listed_names
    # The server really pages at this size (otherwise the test proves nothing). A page may
    # be short, even empty, where deleted names take its places (seed 001, "Listing").
    first = api(enroute_url, "GET", "/repos?limit=1")
    assert len(first["repos"]) <= 1 and first["next_page_token"]


def test_refs_after_api_commit(enroute_url: str) -> None:
    name = fresh_name("refs")
    run(enroute_url, "repo", "create", name)
    assert run(enroute_url, "repo", "refs", name).stdout.splitlines()[1:] == []
    made = api(enroute_url, "POST", f"/repos/{name}/-/commits", {
        "branch": "main", "expected_oid": None, "message": "first",
        "author": {"name": "A", "email": "a@example.com"},
        "changes": [{"path": "README", "content_base64": base64.b64encode(b"hi\n").decode()}],
    })  # fmt: skip
    refs = json.loads(run(enroute_url, "repo", "refs", name, "--json").stdout)["refs"]
    assert [(r["name"], r["oid"]) for r in refs] == [("refs/heads/main", made["oid"])]
    rows = run(enroute_url, "repo", "refs", name).stdout.splitlines()
    assert rows[1].split()[:2] == ["refs/heads/main", made["oid"]]


def test_commit_add_delete_mode_and_stale(enroute_url: str, tmp_path: Path) -> None:
    name = fresh_name("commit")
    run(enroute_url, "repo", "create", name)
    (tmp_path / "a.txt").write_bytes(b"alpha\n")
    (tmp_path / "run.sh").write_bytes(b"#!/bin/sh\necho run\n")
    first = json.loads(run(
        enroute_url, "commit", name, "--branch", "main", "--unborn", "--message", "add", *AUTHOR,
        "--add", "a.txt=" + str(tmp_path / "a.txt"), "--add", "bin/run=" + str(tmp_path / "run.sh"),
        "--mode", "bin/run=100755", "--json",
    ).stdout)  # fmt: skip
    refs = api(enroute_url, "GET", f"/repos/{name}/-/refs")["refs"]
    assert [r["oid"] for r in refs] == [first["oid"]]

    # Without --expected-oid the CLI builds on the current tip.
    second = json.loads(run(
        enroute_url, "commit", name, "--branch", "refs/heads/main", "--message", "rm", *AUTHOR,
        "--delete", "a.txt", "--json",
    ).stdout)  # fmt: skip
    assert second["oid"] != first["oid"] and second["tree"] != first["tree"]

    # A stale tip: the commit is refused with stale_ref and the ref stays put.
    stale = run(
        enroute_url, "commit", name, "--branch", "main", "--expected-oid", first["oid"],
        "--message", "late", *AUTHOR, "--delete", "bin/run", ok=False,
    )  # fmt: skip
    assert stale.exit_code != 0
    assert "stale_ref" in stale.stderr
    assert second["oid"] in stale.stderr  # details.current_oid is shown
    refs = api(enroute_url, "GET", f"/repos/{name}/-/refs")["refs"]
    assert [r["oid"] for r in refs] == [second["oid"]]
    # --unborn on a born branch is stale too.
    unborn = run(enroute_url, "commit", name, "--branch", "main", "--unborn", "--message", "x",
                 *AUTHOR, ok=False)  # fmt: skip
    assert unborn.exit_code != 0 and "stale_ref" in unborn.stderr


def test_commit_tree_content_via_git(enroute_url: str, tmp_path: Path) -> None:
    """The added file's bytes and mode and the deletion land in the tree (read back by clone)."""

    name = fresh_name("tree")
    run(enroute_url, "repo", "create", name)
    (tmp_path / "x").write_bytes(b"\x00binary\xff")
    (tmp_path / "y").write_bytes(b"gone soon\n")
    run(enroute_url, "commit", name, "--branch", "main", "--unborn", "--message", "one", *AUTHOR,
        "--add", f"tool={tmp_path / 'x'}", "--mode", "tool=100755",
        "--add", f"d/y={tmp_path / 'y'}")  # fmt: skip
    run(enroute_url, "commit", name, "--branch", "main", "--message", "two", *AUTHOR,
        "--delete", "d/y")  # fmt: skip
    target = tmp_path / "clone"
    porcelain.clone(f"{enroute_url}/{name}.git", str(target), errstream=io.BytesIO())
    repo = Repo(str(target))
    commit = repo[repo.head()]
    assert isinstance(commit, Commit)
    tree = repo[commit.tree]
    assert isinstance(tree, Tree)
    entries = {entry.path: (entry.mode, entry.sha) for entry in tree.iteritems()}
    assert set(entries) == {b"tool"}
    mode, sha = entries[b"tool"]
    assert mode == 0o100755
    assert repo[sha].as_raw_string() == b"\x00binary\xff"
    assert commit.message.rstrip(b"\n") == b"two"
    assert commit.author == b"Ann Author <ann@example.com>"


def test_delete_and_errors(enroute_url: str) -> None:
    name = fresh_name("delete")
    run(enroute_url, "repo", "create", name)
    assert run(enroute_url, "repo", "delete", name).stdout.strip() == f"deleted {name}"
    missing = run(enroute_url, "repo", "get", name, ok=False)
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: not_found:")
    run(enroute_url, "repo", "delete", name)  # deleting a missing repository succeeds
    bad = run(enroute_url, "repo", "get", "a//b", ok=False)
    assert bad.exit_code == 1 and "error: invalid_name:" in bad.stderr


def test_unreachable_server_and_bad_options(tmp_path: Path) -> None:
    down = run("http://127.0.0.1:1", "repo", "list", ok=False)
    assert down.exit_code == 2 and "unavailable" in down.stderr
    usage = run("http://127.0.0.1:1", "commit", "r", "--branch", "main", "--message", "m",
                *AUTHOR, "--unborn", "--expected-oid", "0" * 40, ok=False)  # fmt: skip
    assert usage.exit_code == 2 and "not both" in usage.output
    mode = run("http://127.0.0.1:1", "commit", "r", "--branch", "main", "--message", "m",
               *AUTHOR, "--mode", "p=100755", ok=False)  # fmt: skip
    assert mode.exit_code == 2 and "not added" in mode.output


def test_token_is_sent_as_bearer(enroute_url: str) -> None:
    """Anonymous write is on in dev, but a wrong token must still be refused (401), not ignored."""
    result = CliRunner().invoke(
        app, ["repo", "list", "--url", enroute_url], env={"ENROUTE_TOKEN": "enr_wrong"}
    )
    assert result.exit_code == 1, result.output
    assert "error:" in result.stderr
