"""API commits through REST on `enroute dev`, read back with the real git client.

Issue acceptance (DESIGN "API commits"): "An API commit followed by `git clone` shows
exactly the requested tree; a stale expected value changes nothing; invalid paths are
refused with the path named."
"""

from __future__ import annotations

import base64
import json
import random
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from enroute_testing.gitcli import run_git

pytestmark = pytest.mark.interop

AUTHOR = {"name": "Ann Author", "email": "ann@example.com"}


def post(url: str, path: str, body: object) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}/api/v1{path}", data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def commit(url: str, name: str, expected: str | None, changes: list[dict[str, Any]]) -> Any:
    body = {"branch": "main", "expected_oid": expected, "message": "m", "author": AUTHOR,
            "changes": changes}  # fmt: skip
    return post(url, f"/repos/{name}/-/commits", body)


def add(path: str, data: bytes, mode: str | None = None) -> dict[str, Any]:
    change: dict[str, Any] = {"path": path, "content_base64": base64.b64encode(data).decode()}
    if mode is not None:
        change["mode"] = mode
    return change


def tree_of(url: str, name: str, work: Path) -> list[tuple[str, str, bytes]]:
    """(mode, path, content) of every entry of HEAD's tree, from a fresh `git clone`."""
    run_git(["clone", "--quiet", "--no-checkout", f"{url}/{name}.git", str(work)], cwd=work.parent)
    listing = run_git(["ls-tree", "-r", "-z", "HEAD"], cwd=work).split(b"\0")
    out = []
    for entry in filter(None, listing):
        meta, path = entry.split(b"\t", 1)
        mode, _, oid = meta.decode().split()
        out.append((mode, path.decode(), run_git(["cat-file", "blob", oid], cwd=work)))
    return out


def new_repo(url: str) -> str:
    name = f"apicommit/r-{time.monotonic_ns()}"
    status, _ = post(url, "/repos", {"name": name})
    assert status == 201
    return name


def test_api_commit_then_clone_shows_exactly_the_requested_tree(
    enroute_url: str, tmp_path: Path
) -> None:
    name = new_repo(enroute_url)
    status, first = commit(enroute_url, name, None, [
        add("README", b"hello\n"), add("bin/run", b"#!/bin/sh\n", "100755"),
        add("docs/a.txt", b"a\n"), add("docs/b.txt", b"b\n"), add("link", b"README", "120000"),
    ])  # fmt: skip
    assert status == 201, first
    assert tree_of(enroute_url, name, tmp_path / "one") == [
        ("100644", "README", b"hello\n"),
        ("100755", "bin/run", b"#!/bin/sh\n"),
        ("100644", "docs/a.txt", b"a\n"),
        ("100644", "docs/b.txt", b"b\n"),
        ("120000", "link", b"README"),
    ]
    # Replace, delete, re-mode and add over the parent; untouched paths are inherited.
    status, second = commit(enroute_url, name, first["oid"], [
        add("README", b"changed\n"), {"path": "docs/a.txt"},
        add("bin/run", b"#!/bin/sh\n", "100644"),
        add("new/deep/file", b"\x00\xff"),
    ])  # fmt: skip
    assert status == 201, second
    assert tree_of(enroute_url, name, tmp_path / "two") == [
        ("100644", "README", b"changed\n"),
        ("100644", "bin/run", b"#!/bin/sh\n"),
        ("100644", "docs/b.txt", b"b\n"),
        ("120000", "link", b"README"),
        ("100644", "new/deep/file", b"\x00\xff"),
    ]
    head = run_git(["rev-parse", "HEAD", "HEAD^", "HEAD^{tree}"], cwd=tmp_path / "two").split()
    assert [h.decode() for h in head] == [second["oid"], first["oid"], second["tree"]]
    run_git(["fsck", "--strict", "--no-progress"], cwd=tmp_path / "two")


def test_a_stale_expected_value_changes_nothing(enroute_url: str, tmp_path: Path) -> None:
    name = new_repo(enroute_url)
    first = commit(enroute_url, name, None, [add("a", b"1")])[1]
    second = commit(enroute_url, name, first["oid"], [add("a", b"2")])[1]
    url = f"{enroute_url}/{name}.git"
    before = run_git(["ls-remote", url], cwd=tmp_path)
    for expected in (first["oid"], None, "0" * 40):
        status, error = commit(enroute_url, name, expected, [add("a", b"3"), add("b", b"b")])
        assert status == 409 and error["error"]["code"] == "stale_ref", error
        assert second["oid"] in json.dumps(error)  # the current value is reported
        assert run_git(["ls-remote", url], cwd=tmp_path) == before
    assert tree_of(enroute_url, name, tmp_path / "c") == [("100644", "a", b"2")]


@pytest.mark.parametrize(
    "path", ["", ".", "..", "/abs", "a/../b", "a/./b", "a//b", "a/", ".git/config",
             "x/.git/y", "x/.GIT/y", "nul\x00byte"],
)  # fmt: skip
def test_invalid_paths_are_refused_with_the_path_named(
    enroute_url: str, tmp_path: Path, path: str
) -> None:
    name = new_repo(enroute_url)
    first = commit(enroute_url, name, None, [add("ok", b"ok")])[1]
    status, error = commit(enroute_url, name, first["oid"], [add("fine", b"f"), add(path, b"x")])
    assert status == 400, error
    assert error["error"]["code"] in ("invalid_path", "invalid_argument"), error
    text = json.dumps(error)
    assert json.dumps(path)[1:-1] in text, f"the path is not named: {error}"
    assert run_git(["ls-remote", f"{enroute_url}/{name}.git"], cwd=tmp_path).split()[0] == (
        first["oid"].encode()
    )


def test_a_commit_over_grpcs_default_message_bound_lands(enroute_url: str, tmp_path: Path) -> None:
    """A 6 MB file, within ``transport.api_body_max``: gitproto hands it to the compute in
    one message, over gRPC's default 4 MiB bound, which refused it with a raw
    RESOURCE_EXHAUSTED before the ``rpc_message_bytes_max`` limit (docs/rpc.md,
    "Message size")."""
    name = new_repo(enroute_url)
    data = random.Random(6).randbytes(6_000_000)
    status, made = commit(enroute_url, name, None, [add("big.bin", data)])
    assert status == 201, made
    assert tree_of(enroute_url, name, tmp_path / "clone") == [("100644", "big.bin", data)]
