"""``enroute repo ...`` and ``enroute commit``: a REST /api/v1 client for operators.

DESIGN.md, "External interfaces": each command is one or a few calls to a
running gitproto, made with the standard library so the CLI needs nothing the
server does not. Errors print the API's stable ``code`` and message and exit 1;
a server that cannot be reached exits 2.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer

repo_app = typer.Typer(no_args_is_help=True, help="Repositories (REST API client)")

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 60.0
FILE_MODES = ("100644", "100755", "120000")
EXIT_API_ERROR = 1
EXIT_UNREACHABLE = 2

UrlOption = Annotated[str, typer.Option("--url", envvar="ENROUTE_URL", help="server base URL")]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="ENROUTE_TOKEN", help="API token (sent as Bearer)"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print the API's JSON")]
NameArgument = Annotated[str, typer.Argument(help="repository name, e.g. team/app")]


class ApiError(Exception):
    """A non-2xx answer, with the error body's code and message when it has one."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class Client:
    """One server: base URL and optional Bearer token."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def call(
        self, method: str, path: str, body: object = None, query: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        target = f"{self.url}/api/v1{path}"
        if query:
            target += "?" + urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(target, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return response.status, _decode(response.read())
        except urllib.error.HTTPError as error:
            raise _api_error(error.code, error.read()) from None

    def refs(self, name: str) -> list[dict[str, Any]]:
        _, page = self.call("GET", f"/repos/{repo_path(name)}/-/refs")
        return list(page.get("refs") or [])


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _api_error(status: int, raw: bytes) -> ApiError:
    body = _decode(raw)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        details = error.get("details")
        return ApiError(
            status,
            str(error.get("code") or f"http_{status}"),
            str(error.get("message") or ""),
            details if isinstance(details, dict) else {},
        )
    text = body if isinstance(body, str) else json.dumps(body)
    return ApiError(status, f"http_{status}", (text or "").strip()[:500], {})


def repo_path(name: str) -> str:
    """The name as it appears in API paths: ``/`` kept, anything else unsafe quoted."""
    return quote(name, safe="/")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Plain columns padded to the widest cell; the last column is not padded."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


REPO_HEADERS = ("NAME", "HEAD", "INCARNATION", "LAST_PUSH", "DELETED")


def _repo_rows(repos: Sequence[dict[str, Any]]) -> list[list[object]]:
    return [
        [r.get("name"), r.get("head"), r.get("incarnation"), r.get("last_push"),
         str(bool(r.get("deleted"))).lower()]
        for r in repos
    ]  # fmt: skip


def _emit(as_json: bool, value: object, text: str) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True) if as_json else text)


def _run(url: str, token: str | None, action: Any, as_json: bool = False) -> None:
    """Run ``action(client)``; turn API and connection errors into a message and exit status.

    Under ``--json`` the error is the API's own error body, ``{"error": {"code",
    "message", "details"}}``, on stdout where the answer would have been, so a
    script reads one JSON document either way and tells them apart by the exit status.
    """
    try:
        action(Client(url, token))
    except ApiError as error:
        _fail(as_json, error.code, error.message, error.details, EXIT_API_ERROR)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        message = f"cannot reach {url}: {reason}"
        _fail(as_json, "unavailable", message, {"url": url}, EXIT_UNREACHABLE)


def _fail(as_json: bool, code: str, message: str, details: dict[str, Any], status: int) -> None:
    if as_json:
        error = {"code": code, "message": message, "details": details}
        typer.echo(json.dumps({"error": error}, indent=2, sort_keys=True))
    else:
        typer.echo(f"error: {code}: {message}", err=True)
        if details and code != "unavailable":
            typer.echo(f"details: {json.dumps(details, sort_keys=True)}", err=True)
    raise typer.Exit(status)


@repo_app.command("create")
def repo_create(
    name: NameArgument,
    default_branch: Annotated[str, typer.Option(help="initial HEAD branch")] = "main",
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a repository (an existing one is shown unchanged)."""

    def action(client: Client) -> None:
        status, repo = client.call(
            "POST", "/repos", {"name": name, "default_branch": default_branch}
        )
        note = "created" if status == 201 else "exists"
        _emit(as_json, repo, f"{table(REPO_HEADERS, _repo_rows([repo]))}\n({note})")

    _run(url, token, action, as_json)


@repo_app.command("get")
def repo_get(
    name: NameArgument, url: UrlOption = DEFAULT_URL, token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:  # fmt: skip
    """Describe one repository."""

    def action(client: Client) -> None:
        _, repo = client.call("GET", f"/repos/{repo_path(name)}")
        _emit(as_json, repo, table(REPO_HEADERS, _repo_rows([repo])))

    _run(url, token, action, as_json)


@repo_app.command("list")
def repo_list(
    limit: Annotated[int, typer.Option(min=0, help="page size asked of the server")] = 0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List every repository, following page tokens to the last page."""

    def action(client: Client) -> None:
        repos: list[dict[str, Any]] = []
        page_token = ""
        seen: set[str] = set()
        while True:
            query = {"limit": str(limit)} if limit else {}
            if page_token:
                query["page_token"] = page_token
            _, page = client.call("GET", "/repos", query=query)
            repos.extend(page.get("repos") or [])
            page_token = page.get("next_page_token") or ""
            if not page_token:
                break
            if page_token in seen:
                raise ApiError(0, "internal", f"the server repeated page token {page_token!r}", {})
            seen.add(page_token)
        _emit(as_json, {"repos": repos}, table(REPO_HEADERS, _repo_rows(repos)))

    _run(url, token, action, as_json)


@repo_app.command("delete")
def repo_delete(
    name: NameArgument, url: UrlOption = DEFAULT_URL, token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:  # fmt: skip
    """Delete a repository (succeeds when it is missing too)."""

    def action(client: Client) -> None:
        client.call("DELETE", f"/repos/{repo_path(name)}")
        _emit(as_json, {"deleted": name}, f"deleted {name}")

    _run(url, token, action, as_json)


@repo_app.command("refs")
def repo_refs(
    name: NameArgument, url: UrlOption = DEFAULT_URL, token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:  # fmt: skip
    """List a repository's refs with their update times."""

    def action(client: Client) -> None:
        refs = client.refs(name)
        rows = [[r.get("name"), r.get("oid"), r.get("updated_at")] for r in refs]
        _emit(as_json, {"refs": refs}, table(("REF", "OID", "UPDATED_AT"), rows))

    _run(url, token, action, as_json)


def full_branch(branch: str) -> str:
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"


def _pairs(items: Sequence[str], option: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        path, sep, value = item.partition("=")
        if not sep or not path or not value:
            raise typer.BadParameter(f"expected PATH=VALUE, got {item!r}", param_hint=option)
        pairs.append((path, value))
    return pairs


def build_changes(
    add: Sequence[str], delete: Sequence[str], mode: Sequence[str]
) -> list[dict[str, Any]]:
    """The ``changes`` list of a commit body; files are read here, modes must name an added path."""
    modes = dict(_pairs(mode, "--mode"))
    for path, value in modes.items():
        if value not in FILE_MODES:
            raise typer.BadParameter(
                f"{path}: mode {value!r} is not one of {', '.join(FILE_MODES)}",
                param_hint="--mode",
            )
    changes: list[dict[str, Any]] = []
    added = set()
    for path, local in _pairs(add, "--add"):
        try:
            content = Path(local).read_bytes()
        except OSError as error:
            raise typer.BadParameter(f"cannot read {local}: {error}", param_hint="--add") from None
        change: dict[str, Any] = {
            "path": path,
            "content_base64": base64.b64encode(content).decode("ascii"),
        }
        if path in modes:
            change["mode"] = modes[path]
        changes.append(change)
        added.add(path)
    for path in modes:
        if path not in added:
            raise typer.BadParameter(f"{path} is not added with --add", param_hint="--mode")
    changes.extend({"path": path, "content_base64": None} for path in delete)
    return changes


def commit(
    name: NameArgument,
    *,
    branch: Annotated[str, typer.Option(help="branch to move (short or refs/heads/...)")],
    message: Annotated[str, typer.Option(help="commit message")],
    author_name: Annotated[str, typer.Option(help="author name")],
    author_email: Annotated[str, typer.Option(help="author email")],
    expected_oid: Annotated[
        str | None,
        typer.Option(help="the branch tip the commit builds on (default: its current tip)"),
    ] = None,
    unborn: Annotated[
        bool, typer.Option("--unborn", help="expect the branch not to exist yet")
    ] = False,
    add: Annotated[
        list[str] | None, typer.Option(help="PATH=LOCALFILE to write (repeatable)")
    ] = None,
    delete: Annotated[list[str] | None, typer.Option(help="PATH to remove (repeatable)")] = None,
    mode: Annotated[
        list[str] | None, typer.Option(help="PATH=100644|100755|120000 for an added path")
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Commit a change set to a branch by compare-and-swap on its tip."""
    if expected_oid is not None and unborn:
        raise typer.BadParameter("give --expected-oid or --unborn, not both")
    changes = build_changes(add or [], delete or [], mode or [])

    def action(client: Client) -> None:
        expected = expected_oid
        if expected is None and not unborn:
            ref = full_branch(branch)
            expected = next((r["oid"] for r in client.refs(name) if r.get("name") == ref), None)
        body = {
            "branch": branch,
            "expected_oid": expected,
            "message": message,
            "author": {"name": author_name, "email": author_email},
            "changes": changes,
        }
        _, made = client.call("POST", f"/repos/{repo_path(name)}/-/commits", body)
        _emit(as_json, made, table(("COMMIT", "TREE"), [[made.get("oid"), made.get("tree")]]))

    _run(url, token, action, as_json)
