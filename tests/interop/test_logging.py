"""Structured logs end to end: every line of every role is JSON, one access line per
HTTP request, audit lines for every ref change and repository create and delete, and
one request id across gitproto, compute and ledger (issue 23, item 1; docs/logging.md).

A real `enroute dev` runs with ``log.format: json`` and auth on (a token made by
``enroute token create``'s own function); the git CLI pushes and clones with the
token in the URL, so each of its conversations starts without credentials as git
always does (http.c: the credential is asked for after a 401); the REST API
creates, commits to and deletes a repository. The test then reads the three log
files line by line.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enroute_gitproto.cli import add_token
from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.ready import ROLE_READY

pytestmark = [pytest.mark.interop]

ZERO = "0" * 40
ROLES = ("gitproto", "compute", "ledger")


def log_lines(logs: Path, role: str) -> list[dict[str, Any]]:
    """Every log line of ``role``, each parsed as JSON (a line that is not fails here)."""
    out = []
    for raw in (logs / f"{role}.log").read_text(encoding="utf-8").splitlines():
        if ROLE_READY.match(raw):  # its stdout line (the process protocol), not a log line
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            pytest.fail(f"{role} wrote a line that is not JSON: {raw!r}")
        assert isinstance(line, dict), raw
        for key in ("ts", "level", "logger", "msg", "role"):
            assert key in line, (key, raw)
        assert line["role"] == role
        out.append(line)
    return out


def api(
    url: str, method: str, path: str, token: str, body: object = None, *, upstream: str = ""
) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/api/v1{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if upstream:  # as a proxy in front would send it
        request.add_header("X-Request-Id", upstream)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            return response.status, dict(response.headers), json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read() or b"null")


def audits(lines: list[dict[str, Any]], action: str) -> Iterator[dict[str, Any]]:
    return (x for x in lines if x["logger"] == "enroute.audit" and x["action"] == action)


@pytest.mark.timeout(300)
def test_json_logs_access_and_audit_lines_follow_one_request_id(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    secret = add_token(tokens, "ci-bot", ["admin"], None)
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    (src / "a.txt").write_text("a\n")
    run_git(["add", "."], cwd=src)
    run_git(["commit", "-q", "-m", "one"], cwd=src)
    pushed = run_git(["rev-parse", "HEAD"], cwd=src).decode().strip()
    root = tmp_path / "dev"
    root.mkdir()
    config = {
        "log": {"format": "json"},
        "auth": {"anonymous": "none", "tokens_file": str(tokens)},
    }
    with running_dev(root, config) as dev:
        host = dev.url.removeprefix("http://")
        remote = f"http://ci:{secret}@{host}/team/app.git"
        run_git(["push", "-q", remote, "main"], cwd=src)
        run_git(["clone", "-q", remote, str(tmp_path / "clone")], cwd=tmp_path)
        status, headers, _ = api(dev.url, "POST", "/repos", secret, {"name": "team/other"})
        assert status == 201
        create_request = headers["x-request-id"]
        status, headers, built = api(
            dev.url, "POST", "/repos/team/app/-/commits", secret,
            {"branch": "main", "expected_oid": pushed, "message": "api\n",
             "author": {"name": "A", "email": "a@example.com"},
             "changes": [{"path": "b.txt", "content_base64": "Ygo="}]},
        )  # fmt: skip
        assert status == 201, built
        commit_request = headers["x-request-id"]
        status, _, _ = api(dev.url, "DELETE", "/repos/team/other", secret)
        assert status == 204
        status, _, _ = api(dev.url, "GET", "/repos/team/missing", secret, upstream="edge-42")
        assert status == 404
        status, _, _ = api(dev.url, "GET", "/repos/team/app", "not-a-token")
        assert status == 401
    logs = root / "data" / "logs"
    lines = {role: log_lines(logs, role) for role in ROLES}
    every = [line for role in ROLES for line in lines[role]]

    # the token never appears, and a normal session has no warning: git's first
    # unauthenticated request is INFO; only the bad token is a WARNING
    assert not [x for x in every if secret in json.dumps(x)]
    loud = [x for x in every if x["level"] in ("warning", "error", "critical")]
    assert len(loud) == 1 and "unknown_token" in loud[0]["msg"], loud

    access = [x for x in lines["gitproto"] if x["logger"] == "enroute.access"]
    assert len({x["request_id"] for x in access}) == len(access), "one line per request"
    for x in access:
        assert re.fullmatch(r"[0-9a-f]{32}", x["request_id"]), x
        for key in ("method", "path", "service", "status", "bytes_in", "bytes_out",
                    "duration_s", "client"):  # fmt: skip
            assert key in x, (key, x)
    git_lines = [x for x in access if x["service"].startswith("git-")]
    authed = [x for x in git_lines if x["status"] == 200]
    assert authed and all(x["user"] == "ci-bot" and x["repo"] == "team/app" for x in authed)
    assert any(x["status"] == 401 and "user" not in x for x in git_lines), "git's first ask"
    push = [x for x in authed if x["path"].endswith("/git-receive-pack")]
    assert len(push) == 1 and push[0]["bytes_in"] > 0 and push[0]["bytes_out"] > 0
    missing = [x for x in access if x["status"] == 404 and x["repo"] == "team/missing"]
    assert len(missing) == 1 and missing[0]["upstream_request_id"] == "edge-42"
    assert missing[0]["request_id"] != "edge-42"  # the id is ours, the proxy's is kept beside

    # audit: the push and the API commit with old and new values, who, and the id
    push_id = push[0]["request_id"]
    updates = list(audits(lines["compute"], "ref.update"))
    seen = [(u["ref"], u["old"], u["new"], u["via"], u["user"], u["request_id"]) for u in updates]
    assert seen == [
        ("refs/heads/main", ZERO, pushed, "push", "ci-bot", push_id),
        ("refs/heads/main", pushed, built["oid"], "api", "ci-bot", commit_request),
    ]
    created = [(x["repo"], x["user"]) for x in audits(lines["compute"], "repo.create")]
    assert created == [("team/app", "ci-bot"), ("team/other", "ci-bot")]
    deleted = [(x["repo"], x["user"]) for x in audits(lines["compute"], "repo.delete")]
    assert deleted == [("team/other", "ci-bot")]

    # the ledger's lines: a unary call's carry the request id (the API create); the
    # proposals, which share one stream per member, carry the proposal id the compute's
    # audit lines give beside the request id
    created_here = [x for x in lines["ledger"] if x["msg"].startswith("created team/other")]
    assert [(x["request_id"], x["user"]) for x in created_here] == [(create_request, "ci-bot")]
    proposals = {x.get("proposal_id") for x in lines["ledger"]}
    assert all(re.fullmatch(r"[0-9a-f]{32}", u["proposal_id"]) for u in updates)
    assert {u["proposal_id"] for u in updates} <= proposals
