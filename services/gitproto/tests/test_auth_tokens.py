"""Tokens, their file and the authorizer (DESIGN.md "External interfaces", Auth;
docs/access-control.md)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from enroute_core.base.errors import InvalidArgument, PermissionDenied, Unauthenticated
from enroute_gitproto import auth
from enroute_gitproto.auth import Authorizer, TokenFile, credential, parse_tokens, token_digest
from enroute_gitproto.cli import add_token


def _entry(name: str, token: str, scopes: list[str], repos: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "sha256": token_digest(token), "scopes": scopes}
    if repos is not None:
        entry["repos"] = repos
    return entry


def _write(path: Path, *entries: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump({"tokens": list(entries)}))


def basic(token: str, user: str = "anyone") -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def test_file_holds_digests_only(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    token = add_token(path, "ci", ["read"], "team/*")
    text = path.read_text()
    assert token not in text and token[4:] not in text
    assert hashlib.sha256(token.encode()).hexdigest() in text


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"name": "a", "token": "enr_plain", "scopes": ["read"]}, "unknown keys ['token']"),
        ({"name": "a", "sha256": "ab" * 31, "scopes": ["read"]}, "64 hex digits"),
        ({"name": "a", "sha256": "zz" * 32, "scopes": ["read"]}, "64 hex digits"),
        ({"name": "a", "sha256": "ab" * 32, "scopes": ["push"]}, "scopes must be"),
        ({"name": "a", "sha256": "ab" * 32, "scopes": ["read"], "repos": 3}, "glob"),
        ("just a string", "not a mapping"),
        # issue 24: an empty or null repos, or no scopes, refuses the file (no silent widening)
        ({"name": "a", "sha256": "ab" * 32, "scopes": ["read"], "repos": None}, "repos is None"),
        ({"name": "a", "sha256": "ab" * 32, "scopes": ["read"], "repos": ""}, "repos is ''"),
        ({"name": "a", "sha256": "ab" * 32, "scopes": []}, "non-empty list"),
        ({"name": "a", "sha256": "ab" * 32, "scopes": None}, "non-empty list"),
        ({"name": "a", "sha256": "ab" * 32}, "non-empty list"),
        ({"name": "a", "sha256": "ab" * 32, "scopes": "read"}, "non-empty list"),
        ({"name": None, "sha256": "ab" * 32, "scopes": ["read"]}, "name must be a string"),
    ],
)
def test_bad_entries_are_refused(entry: Any, words: str) -> None:
    with pytest.raises(InvalidArgument, match="entry 0") as caught:
        parse_tokens(yaml.safe_dump({"tokens": [entry]}))
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("tokens:\n  - {name: a, sha256: %s, scopes: [read], repos:}\n", "repos is None"),
        ("tokens:\n  - {name: a, sha256: %s, scopes: [read], repos: null}\n", "repos is None"),
        ('tokens:\n  - {name: a, sha256: %s, scopes: [read], repos: ""}\n', "repos is ''"),
        ("tokens:\n  - {name: a, sha256: %s, scopes: []}\n", "non-empty list"),
        ("tokens:\n  - {name: a, sha256: %s, scopes: [read]}\ntoken: x\n", "unknown keys"),
        ("tokens:\n  - {name: a, sha256: %s, scopes: [read], Repos: x}\n", "unknown keys"),
        ("tokens:\n", "'tokens' list"),
        ("tokens: {name: a}\n", "'tokens' list"),
        ("- {name: a, sha256: %s}\n", "'tokens' list"),
        ("tokens: [\n", "not valid YAML"),
        (
            "tokens:\n  - {name: a, sha256: %s, scopes: [read]}\n"
            "  - {name: b, sha256: %s, scopes: [admin]}\n",
            "same sha256 as token 'a'",
        ),
    ],
)
def test_bad_files_are_refused_as_written(text: str, words: str) -> None:
    """The YAML an operator or a template writes, not a dict dumped by the test."""
    with pytest.raises(InvalidArgument, match="tokens file") as caught:
        parse_tokens(text.replace("%s", "ab" * 32))
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("glob", "ok"),
    [
        ("*", True), ("team/*", True), ("*/app", True), ("team/app", True), ("t?am/[a-c]*", True),
        ("team/[!x]*", True), ("team/sub/*", True), ("*.x", True),
        # no repository segment, or an empty one: matches no name
        ("/", False), ("*/", False), ("/*", False), ("team//*", False), ("team/", False),
        # a segment or a character no repository name has
        ("team/-/*", False), ("../*", False), ("team app", False), ("team/*.git", False),
        ("x" * 257, False),
    ],
)  # fmt: skip
def test_repos_glob_needs_a_repository_segment(glob: str, ok: bool) -> None:
    assert (auth.repos_glob_problem(glob) is None) == ok
    entry = {"name": "g", "sha256": "ab" * 32, "scopes": ["read"], "repos": glob}
    if ok:
        assert parse_tokens(yaml.safe_dump({"tokens": [entry]}))["ab" * 32].repos == glob
    else:
        with pytest.raises(InvalidArgument, match="matches no repository name"):
            parse_tokens(yaml.safe_dump({"tokens": [entry]}))


def test_empty_file_holds_no_tokens() -> None:
    assert parse_tokens("") == {} and parse_tokens("tokens: []\n") == {}


def test_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{name: ci, sha256: {'ab' * 32}, scopes: [read], repos:}}\n")
    with pytest.raises(InvalidArgument, match=r"tokens.yaml: tokens file: entry 0 \('ci'\)"):
        TokenFile(str(path))


def test_failed_reload_keeps_the_last_good_file_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.yaml"
    _write(path, _entry("a", "tok-a", ["read"], "team/*"))
    tokens = TokenFile(str(path))
    good = tokens.status()
    assert good is not None and good["ok"] is True and good["error"] is None
    assert good["tokens"] == 1 and str(good["loaded_at"]).endswith("Z")
    bad = dict(_entry("a", "tok-a", ["read"]), repos=None)  # the slip that would widen "a"
    _write(path, bad, _entry("b", "tok-b", ["admin"]))
    with caplog.at_level(logging.ERROR, logger="enroute_gitproto.auth"):
        assert tokens.match("tok-b") is None  # the new file is not in force
        token = tokens.match("tok-a")
    assert token is not None and not token.allows("read", "other/x")  # still limited
    failed = tokens.status()
    assert failed is not None and failed["ok"] is False
    assert "repos is None" in str(failed["error"]) and failed["loaded_at"] == good["loaded_at"]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "the last good file stays in force" in logged[0]
    _write(path, _entry("b", "tok-b", ["admin"]))
    assert tokens.match("tok-b") is not None
    fixed = tokens.status()
    assert fixed is not None and fixed["ok"] is True and fixed["reloads_total"] == 2


def test_missing_file_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="does not exist"):
        TokenFile(str(tmp_path / "nope.yaml"))


def test_revocation_and_broken_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    _write(path, _entry("a", "tok-a", ["read"]), _entry("b", "tok-b", ["read"]))
    tokens = TokenFile(str(path))
    assert tokens.match("tok-a") is not None and tokens.match("tok-b") is not None
    _write(path, _entry("b", "tok-b", ["read"]))  # "a" revoked
    assert tokens.match("tok-a") is None
    assert tokens.match("tok-b") is not None
    path.write_text("tokens: [{name: b, sha256: short}]")  # broken: the last good set stays
    assert tokens.match("tok-b") is not None
    path.unlink()  # gone: every token is revoked
    assert tokens.match("tok-b") is None


def _secret_volume(root: Path, version: str, text: str) -> None:
    """What the kubelet does to a Secret volume: a new timestamped directory, then an
    atomic rename of the ``..data`` symlink onto it; the old directory goes last."""
    new_dir = root / f"..{version}"
    new_dir.mkdir()
    (new_dir / "tokens.yaml").write_text(text)
    old = os.readlink(root / "..data") if (root / "..data").is_symlink() else None
    os.symlink(new_dir.name, root / "..data_tmp")
    os.rename(root / "..data_tmp", root / "..data")
    if not (root / "tokens.yaml").is_symlink():
        os.symlink("..data/tokens.yaml", root / "tokens.yaml")
    if old is not None:
        (root / old / "tokens.yaml").unlink()
        (root / old).rmdir()


def test_secret_symlink_swap_is_seen(tmp_path: Path) -> None:
    """Same size and same times in the new file: only the resolved path and inode change."""
    first = yaml.safe_dump({"tokens": [_entry("a", "tok-a", ["read"])]})
    second = yaml.safe_dump({"tokens": [_entry("b", "tok-b", ["read"])]})
    assert len(first) == len(second)
    _secret_volume(tmp_path, "2026_12_03_01", first)
    stat = os.stat(tmp_path / "tokens.yaml")
    tokens = TokenFile(str(tmp_path / "tokens.yaml"))
    assert tokens.match("tok-a") is not None
    _secret_volume(tmp_path, "2026_12_03_02", second)
    os.utime(tmp_path / "tokens.yaml", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert tokens.match("tok-a") is None
    assert tokens.match("tok-b") is not None
    assert tokens.reloads_total == 2


def test_every_entry_is_compared_in_constant_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tokens.yaml"
    _write(path, *(_entry(f"t{i}", f"tok-{i}", ["read"]) for i in range(5)))
    tokens = TokenFile(str(path))
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", counting)  # auth.py looks it up per call
    for secret, expected in (("tok-0", "t0"), ("tok-4", "t4"), ("tok-9", None)):
        calls.clear()
        found = tokens.match(secret)
        assert (found.name if found else None) == expected
        assert len(calls) == 5  # no early exit, no lookup keyed by the digest
        assert all(a == token_digest(secret).encode() for a, _ in calls)


def test_credentials_from_headers() -> None:
    assert credential(None) is None and credential("") is None
    assert credential(basic("s3cret", "x")) == "s3cret"
    assert credential(basic("with:colon", "u")) == "with:colon"
    assert credential("Bearer abc") == "abc"
    assert credential("Basic !!!notbase64") == ""
    assert credential("Digest foo") == ""


def test_authorizer_scopes_globs_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens.yaml"
    _write(
        path,
        _entry("reader", "tok-r", ["read"], "team/*"),
        _entry("writer", "tok-w", ["read", "write"]),
        _entry("root", "tok-admin", ["admin"]),
    )
    reasons: list[str] = []
    authorizer = Authorizer("none", TokenFile(str(path)), reasons.append)
    assert authorizer.authorize(basic("tok-r"), "read", "team/app").name == "reader"
    assert authorizer.authorize("Bearer tok-admin", "admin", "x").name == "root"
    assert authorizer.authorize("Bearer tok-w", "write", "other/x").name == "writer"
    token = auth.REMOTE.set("192.0.2.7:5555")
    caplog.set_level(logging.INFO, logger="enroute_gitproto.auth")
    try:
        cases: list[tuple[str | None, str, str, type[Exception], str]] = [
            (None, "read", "team/app", Unauthenticated, "missing_credentials"),
            (basic("tok-nope"), "read", "team/app", Unauthenticated, "unknown_token"),
            ("Basic ***", "read", "team/app", Unauthenticated, "malformed_credentials"),
            (basic("tok-r"), "write", "team/app", PermissionDenied, "scope_not_granted"),
            (basic("tok-r"), "read", "other/x", PermissionDenied, "repo_not_granted"),
        ]
        for header, scope, repo, error, reason in cases:
            with pytest.raises(error):
                authorizer.authorize(header, scope, repo)
            assert reasons[-1] == reason
            line = caplog.records[-1].getMessage()
            assert f"remote=192.0.2.7:5555 repo={repo} scope={scope} reason={reason}" in line
            # git asks without credentials first, always: that 401 is no warning (issue 23)
            expected = logging.INFO if reason == "missing_credentials" else logging.WARNING
            assert caplog.records[-1].levelno == expected, (reason, caplog.records[-1].levelname)
    finally:
        auth.REMOTE.reset(token)
    logged = caplog.text
    for secret in ("tok-r", "tok-nope", "tok-w", "tok-admin"):
        assert secret not in logged


def test_anonymous_levels(tmp_path: Path) -> None:
    none = Authorizer("none", TokenFile(None))
    read = Authorizer("read", TokenFile(None))
    write = Authorizer("write", TokenFile(None))
    with pytest.raises(Unauthenticated):
        none.authorize(None, "read", "a")
    assert read.authorize(None, "read", "a").name == ""
    with pytest.raises(Unauthenticated):
        read.authorize(None, "write", "a")
    assert write.authorize(None, "admin", "a").token is None


def _post_headers_only(address: str, target: str, extra: str = "") -> bytes:
    """A POST promising a body it never sends; what the server answers meanwhile."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n{extra}"
                     "\r\n".encode())  # fmt: skip
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        return data


def test_unauthorized_posts_are_refused_before_the_body(
    tmp_path: Path, computes: Any, make_gitproto: Any
) -> None:
    path = tmp_path / "tokens.yaml"
    _write(path, _entry("reader", "tok-r", ["read"]))
    server = make_gitproto([computes[0].address], anonymous="none", tokens_file=str(path))
    answer = _post_headers_only(server.address, "/api/v1/repos")
    assert (
        answer.startswith(b"HTTP/1.1 401") and b'www-authenticate: Basic realm="enroute"' in answer
    )
    answer = _post_headers_only(server.address, "/api/v1/repos/team/x/-/commits",
                                "Authorization: Bearer tok-r\r\n")  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 403")
    answer = _post_headers_only(server.address, "/team/x.git/git-receive-pack",
                                f"Authorization: {basic('tok-r')}\r\n")  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 403")
    assert computes[0].fake.headers == []  # no compute was asked
    host, port = server.ops_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    conn.close()
    for reason, count in (("missing_credentials", 1), ("scope_not_granted", 2)):
        line = f'enroute_gitproto_auth_failures_total{{reason="{reason}"}} {count:.1f}'
        assert line in metrics, metrics
