"""The ``enroute`` command: ``enroute dev``, ``enroute token create|list|revoke``, and the
API client commands ``enroute repo ...`` and ``enroute commit`` (cli_api.py).

``enroute dev`` (DESIGN.md, "Processes"; docs: services) runs the three roles
as child processes on loopback with generated configs under ``--data``: one
ledger voter, a ``file://`` store, internal ports picked by the children
(port 0) and read from their ready lines, gitproto on ``--listen`` with
anonymous write. It prints ``enroute ready: http://HOST:PORT`` and forwards
SIGTERM/SIGINT to the children, then exits when they have; the process that does
that is enroute_gitproto.dev, which this command becomes once its options are read.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from enroute_core.base.errors import InvalidArgument
from enroute_core.config import load_config
from enroute_gitproto.auth import parse_tokens, repos_glob_problem
from enroute_gitproto.cli_api import commit, repo_app, table
from enroute_gitproto.cli_ledger import ledger_app
from enroute_gitproto.dev import DEV_ARGS_FILE, ROLES, merge, role_config
from enroute_gitproto.observe import VERSION

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Enroute Git hosting",
    context_settings={"help_option_names": ["-h", "--help"]},  # sub-commands inherit it
)
token_app = typer.Typer(no_args_is_help=True, help="Access tokens")
app.add_typer(token_app, name="token")
app.add_typer(repo_app, name="repo")
app.add_typer(ledger_app, name="ledger")
app.command("commit")(commit)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"enroute {VERSION}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Enroute Git hosting."""


def _add_plugin_commands() -> None:
    """Sub-commands other installed packages offer (``enroute cluster`` from the test kit).

    Production code never imports the test kit; the kit registers its commands
    under the ``enroute.commands`` entry-point group instead, so they exist
    exactly where it is installed (the development environment).
    """
    for entry in importlib.metadata.entry_points(group="enroute.commands"):
        app.add_typer(entry.load(), name=entry.name)


_add_plugin_commands()


def _drain_s(role: str, config: dict[str, Any]) -> float:
    """The drain a role's config gives it on SIGTERM, so that it is not killed during it."""
    try:
        loaded = load_config(yaml.safe_dump(config), {})
    except InvalidArgument:
        return 0.0  # the role refuses the config itself, and says why
    if role == "gitproto":
        return loaded.transport.shutdown_grace
    if role == "compute":
        return loaded.compute.drain_grace
    return 0.0


def _drains(data: Path, listen: str, user_config: dict[str, Any]) -> dict[str, float]:
    """Each role's drain, read here with the config models the supervisor does not import.

    The internal addresses are not known yet (each role picks its ports); a stand-in
    takes their place, as no drain depends on them.
    """
    stand_in = {role: {"grpc": "127.0.0.1:1"} for role in ROLES}
    return {
        role: _drain_s(role, merge(role_config(role, data, listen, stand_in), user_config))
        for role in ROLES
    }


@app.command()
def dev(
    data: Annotated[Path, typer.Option(help="data directory")] = Path(".enroute"),
    listen: Annotated[str, typer.Option(help="HTTP address HOST:PORT (:0 for a free port)")] = (
        "127.0.0.1:8080"
    ),
    config: Annotated[
        Path | None, typer.Option(help="YAML config merged over the generated ones")
    ] = None,
    start_timeout: Annotated[float, typer.Option(help="seconds each role may take")] = 60.0,
    child_cmd: Annotated[list[str] | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run ledger, compute and gitproto on loopback with a file:// store."""
    if listen.startswith(":"):
        listen = "127.0.0.1" + listen
    user: dict[str, Any] = {}
    if config is not None:
        loaded = yaml.safe_load(config.read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise typer.BadParameter("the config file must be a mapping", param_hint="--config")
        user = loaded or {}
    templates = {}
    for item in child_cmd or []:
        role, _, template = item.partition("=")
        templates[role] = template
    data = data.resolve()
    args = {"data": str(data), "listen": listen, "user_config": user, "templates": templates,
            "start_timeout_s": start_timeout, "drains": _drains(data, listen, user)}  # fmt: skip
    # The arguments go through a file of the data directory, not the command line,
    # which any user can read (ps): the user's config may hold the store's keys.
    (data / "config").mkdir(parents=True, exist_ok=True)
    path = data / "config" / DEV_ARGS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(args, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # The lean supervisor takes this process over (enroute_gitproto.dev explains why).
    os.execv(sys.executable, [sys.executable, "-m", "enroute_gitproto.dev", str(path)])


def _read_tokens_file(path: Path) -> dict[str, Any]:
    """The tokens file as a mapping (empty when missing), refused as gitproto refuses it."""
    if not path.exists():
        return {}
    text = path.read_text()
    parse_tokens(text)  # strict: a file gitproto would refuse is not edited further
    data = yaml.safe_load(text) or {}
    return dict(data)


def _write_tokens_file(path: Path, data: dict[str, Any]) -> None:
    """Replace the file at once: gitproto, re-reading it on change, never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)


def add_token(path: Path, name: str, scopes: list[str], repos: str | None) -> str:
    """Append a token entry (its SHA-256 only) to ``path`` and return the token."""
    data = _read_tokens_file(path)
    entries = data.setdefault("tokens", [])
    if any(entry.get("name") == name for entry in entries):
        raise ValueError(f"a token named {name!r} exists already in {path}")
    token = "enr_" + secrets.token_urlsafe(32)
    entry: dict[str, Any] = {
        "name": name,
        "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "scopes": scopes,
    }
    if repos:
        entry["repos"] = repos
    entries.append(entry)
    _write_tokens_file(path, data)
    return token


def remove_token(path: Path, name: str) -> None:
    """Drop the entry named ``name``; ValueError when there is none."""
    data = _read_tokens_file(path)
    entries = data.get("tokens") or []
    kept = [entry for entry in entries if entry.get("name") != name]
    if len(kept) == len(entries):
        raise ValueError(f"no token named {name!r} in {path}")
    data["tokens"] = kept
    _write_tokens_file(path, data)


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="token name (shown as the principal)")],
    scopes: Annotated[str, typer.Option(help="comma-separated: read,write,admin")],
    file: Annotated[Path, typer.Option(help="tokens YAML file")],
    repos: Annotated[str | None, typer.Option(help="repository-name glob")] = None,
) -> None:
    """Add a token to the tokens file and print it once."""
    wanted = [s.strip() for s in scopes.split(",") if s.strip()]
    bad = [s for s in wanted if s not in ("read", "write", "admin")]
    if not wanted or bad:
        raise typer.BadParameter("scopes are read, write and admin", param_hint="--scopes")
    problem = None if repos is None else repos_glob_problem(repos)
    if problem is not None:
        raise typer.BadParameter(
            f"{repos!r} matches no repository name: it {problem}", param_hint="--repos"
        )
    try:
        token = add_token(file, name, wanted, repos)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--name") from None
    except InvalidArgument as error:
        raise typer.BadParameter(error.message, param_hint="--file") from None
    typer.echo(token)


@token_app.command("list")
def token_list(
    file: Annotated[Path, typer.Option(help="tokens YAML file")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List the tokens of the file: name, scopes, repositories; never a token or digest."""
    try:
        tokens = parse_tokens(file.read_text()) if file.exists() else {}
    except InvalidArgument as error:
        raise typer.BadParameter(error.message, param_hint="--file") from None
    listed = sorted(tokens.values(), key=lambda t: t.name)
    if as_json:
        rows = [{"name": t.name, "scopes": sorted(t.scopes), "repos": t.repos} for t in listed]
        typer.echo(json.dumps({"tokens": rows}, indent=2, sort_keys=True))
        return
    cells = [[t.name, ",".join(sorted(t.scopes)), t.repos or "*"] for t in listed]
    typer.echo(table(("NAME", "SCOPES", "REPOS"), cells))


@token_app.command("revoke")
def token_revoke(
    name: Annotated[str, typer.Option(help="name of the token to remove")],
    file: Annotated[Path, typer.Option(help="tokens YAML file")],
) -> None:
    """Remove a token from the file; gitproto refuses it from its next request on."""
    try:
        remove_token(file, name)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--name") from None
    except InvalidArgument as error:
        raise typer.BadParameter(error.message, param_hint="--file") from None
    typer.echo(f"revoked {name}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
