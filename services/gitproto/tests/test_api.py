"""REST /api/v1 shapes and errors (DESIGN.md, "External interfaces")."""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any

from enroute_gitproto.rpc.convert import rfc3339_us


def call(address: str, method: str, path: str, payload: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:  # fmt: skip
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    body = payload if isinstance(payload, bytes) else (
        None if payload is None else json.dumps(payload).encode())  # fmt: skip
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, decoded
    finally:
        conn.close()


def test_rfc3339_has_microseconds() -> None:
    assert rfc3339_us(1_796_230_131_123_456) == "2026-12-02T16:48:51.123456Z"
    assert rfc3339_us(0) == "1970-01-01T00:00:00.000000Z"


def test_create_get_list_delete(gitproto: Any) -> None:
    a = gitproto.address
    status, _, body = call(
        a, "POST", "/api/v1/repos", {"name": "team/app", "default_branch": "dev"}
    )
    assert status == 201
    assert body == {"name": "team/app", "head": "refs/heads/dev", "incarnation": 1,
                    "last_push": None, "deleted": False}  # fmt: skip
    assert call(a, "POST", "/api/v1/repos", {"name": "team/app"})[:3:2] == (200, body)
    assert call(a, "GET", "/api/v1/repos/team/app")[2] == body
    assert call(a, "GET", "/api/v1/repos/team%2Fapp")[2] == body
    call(a, "POST", "/api/v1/repos", {"name": "pushed"})
    assert call(a, "GET", "/api/v1/repos/pushed")[2]["last_push"] == "2026-12-02T16:48:51.123456Z"
    status, _, page = call(a, "GET", "/api/v1/repos?limit=1")
    assert status == 200 and [r["name"] for r in page["repos"]] == ["pushed"]
    token = page["next_page_token"]
    status, _, page = call(a, "GET", f"/api/v1/repos?limit=1&page_token={token}")
    assert [r["name"] for r in page["repos"]] == ["team/app"] and page["next_page_token"] is None
    assert call(a, "DELETE", "/api/v1/repos/team/app")[0] == 204
    assert call(a, "DELETE", "/api/v1/repos/team/app")[0] == 204
    status, _, error = call(a, "GET", "/api/v1/repos/team/app")
    assert status == 404 and error["error"]["code"] == "not_found"


def test_refs_and_commits(gitproto: Any) -> None:
    a = gitproto.address
    call(a, "POST", "/api/v1/repos", {"name": "r"})
    status, _, refs = call(a, "GET", "/api/v1/repos/r/-/refs")
    assert status == 200
    assert refs["refs"][1] == {"name": "refs/heads/main", "oid": bytes(range(1, 21)).hex(),
                               "updated_at": "1970-01-01T00:00:02.500000Z"}  # fmt: skip
    commit = {
        "branch": "main", "expected_oid": bytes(range(1, 21)).hex(), "message": "m",
        "author": {"name": "A", "email": "a@example.com"},
        "changes": [{"path": "x.txt", "content_base64": base64.b64encode(b"hi").decode(),
                     "mode": "100755"}, {"path": "gone", "content_base64": None}],
    }  # fmt: skip
    status, _, body = call(a, "POST", "/api/v1/repos/r/-/commits", commit)
    assert (status, body) == (
        201,
        {"oid": bytes(range(20)).hex(), "tree": bytes(range(1, 21)).hex(), "warnings": []},
    )
    stale = {**commit, "expected_oid": "0" * 40}
    status, _, body = call(a, "POST", "/api/v1/repos/r/-/commits", stale)
    assert status == 409 and body["error"]["code"] == "stale_ref"
    assert body["error"]["details"]["current_oid"] == bytes(range(1, 21)).hex()
    bad_path = {**commit, "changes": [{"path": ".git/config", "content_base64": ""}]}
    status, _, body = call(a, "POST", "/api/v1/repos/r/-/commits", bad_path)
    assert status == 400 and body["error"]["details"]["path"] == ".git/config"
    for broken in ({**commit, "expected_oid": "xyz"}, {**commit, "author": None},
                   {**commit, "changes": [{"path": "a", "content_base64": "!!"}]},
                   {**commit, "changes": [{"path": "a", "mode": "100600"}]}):  # fmt: skip
        status, _, body = call(a, "POST", "/api/v1/repos/r/-/commits", broken)
        assert status == 400 and body["error"]["code"] == "invalid_argument", broken


def test_errors(gitproto: Any) -> None:
    a = gitproto.address
    status, _, body = call(a, "POST", "/api/v1/repos", {"name": "a/../b"})
    assert status == 400 and body["error"]["code"] == "invalid_name"
    assert body["error"]["details"]["name"] == "a/../b"
    assert call(a, "POST", "/api/v1/repos", b"{not json")[0] == 400
    assert call(a, "POST", "/api/v1/repos", {"nom": "x"})[0] == 400
    assert call(a, "GET", "/api/v1/repos/a//b")[0] == 400
    assert call(a, "GET", "/api/v1/repos?limit=-1")[0] == 400
    assert call(a, "GET", "/api/v1/repos/r/-/nothing")[0] == 404
    assert call(a, "PUT", "/api/v1/repos/r")[0] == 405
    status, _, body = call(a, "GET", "/api/v1/repos/none/-/refs")
    assert status == 404 and set(body["error"]) == {"code", "message", "details"}


def test_openapi_and_status(gitproto: Any) -> None:
    a = gitproto.address
    status, _, doc = call(a, "GET", "/api/v1/openapi.json")
    assert status == 200 and "/api/v1/repos/{name}/-/commits" in doc["paths"]
    assert all(path.startswith("/api/v1/repos") for path in doc["paths"])
    assert call(gitproto.ops_address, "GET", "/status")[2]["role"] == "gitproto"
    assert call(a, "GET", "/status")[0] == 404  # listen.ops only (docs/security.md)
    host, port = a.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    for path, expect in (("/healthz", 200), ("/readyz", 200)):
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == expect
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert (resp.status, resp.read()) == (404, b"no such path: /metrics\n")
    conn.close()
    host, port = gitproto.ops_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    assert "enroute_gitproto_requests_total" in text and "enroute_build_info" in text
    conn.close()


def test_auth_tokens(tmp_path: Any, computes: Any, make_gitproto: Any) -> None:
    from enroute_gitproto.cli import add_token

    tokens = tmp_path / "tokens.yaml"
    reader = add_token(tokens, "reader", ["read"], "team/*")
    server = make_gitproto([computes[0].address], anonymous="none", tokens_file=str(tokens))
    a = server.address
    status, headers, _ = call(a, "GET", "/api/v1/repos/team/x")
    assert status == 401 and headers["www-authenticate"] == 'Basic realm="enroute"'
    bearer = {"Authorization": f"Bearer {reader}"}
    assert call(a, "GET", "/api/v1/repos/team/x", headers=bearer)[0] == 404  # allowed, missing
    assert call(a, "GET", "/api/v1/repos/other", headers=bearer)[0] == 403
    assert call(a, "GET", "/api/v1/repos/team/x", headers={"Authorization": "Bearer no"})[0] == 401
    basic = base64.b64encode(f"anyone:{reader}".encode()).decode()
    git = {"Authorization": f"Basic {basic}"}
    assert call(a, "POST", "/team/x.git/git-receive-pack", b"", headers=git)[0] == 403
    writer = add_token(tokens, "writer", ["read", "write"], None)  # reloaded on change
    basic = base64.b64encode(f"u:{writer}".encode()).decode()
    status, _, _ = call(a, "GET", "/x.git/info/refs?service=git-receive-pack",
                        headers={"Authorization": f"Basic {basic}"})  # fmt: skip
    assert status == 200
