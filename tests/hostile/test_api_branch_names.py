"""Branch names through the REST API against a real `enroute dev` (issue 24, item 7).

The API takes what ``git check-ref-format --branch`` takes (git 2.39
``object-name.c``, ``strbuf_check_branch_ref``): ``refs/heads/HEAD`` and names
beginning with ``-`` are refused as well as every name the ref-name rules
refuse, by ``POST .../-/commits`` and by ``POST /api/v1/repos``
(``default_branch``) alike. The verdicts are compared with the real git CLI.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from enroute_testing.gitcli import git_branch_verdicts

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

NAMES = [
    b"main", b"feature/x", b"HEAD", b"-x", b"-", b"x/-y", b"head", b"HEAD/x", b"x/HEAD", b"@",
    b"a..b", b".x", b"x.", b"x.lock", b"a b", b"a//b", b"a/", b"a~1", b"\xc3\xa9t\xc3\xa9",
]  # fmt: skip


def _call(url: str, method: str, path: str, payload: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path,
        data=None if payload is None else json.dumps(payload).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _commit(url: str, repo: str, branch: str) -> tuple[int, Any]:
    return _call(url, "POST", f"/api/v1/repos/{repo}/-/commits", {
        "branch": branch, "expected_oid": None, "message": "m\n",
        "author": {"name": "A", "email": "a@example.com"},
        "changes": [{"path": "f", "content_base64": base64.b64encode(b"x").decode()}],
    })  # fmt: skip


def test_api_branch_names_follow_git_check_ref_format_branch(
    enroute_url: str, tmp_path: Path
) -> None:
    verdicts = dict(zip(NAMES, git_branch_verdicts(NAMES, tmp_path / "home"), strict=True))
    assert verdicts[b"HEAD"] is False and verdicts[b"-x"] is False and verdicts[b"main"] is True
    assert _call(enroute_url, "POST", "/api/v1/repos", {"name": "branches/api"})[0] == 201
    seen = {}
    for name in NAMES:
        text = name.decode()
        status, body = _commit(enroute_url, "branches/api", text)
        seen[name] = status == 201
        if status != 201:
            assert status == 400 and body["error"]["code"] == "invalid_ref_name", (name, body)
        repo = {"name": f"branches/head{len(seen)}", "default_branch": text}
        created, made = _call(enroute_url, "POST", "/api/v1/repos", repo)
        assert (created == 201) == verdicts[name], (name, made)
    assert seen == verdicts
    # the full form names the same branch and is judged the same way
    status, body = _commit(enroute_url, "branches/api", "refs/heads/HEAD")
    assert status == 400 and "HEAD" in body["error"]["message"], body
    refs = _call(enroute_url, "GET", "/api/v1/repos/branches/api/-/refs", None)[1]["refs"]
    names = {r["name"].encode() for r in refs}
    assert b"refs/heads/HEAD" not in names and b"refs/heads/-x" not in names
    assert names == {b"refs/heads/" + n for n, ok in verdicts.items() if ok}
