"""The ``enroute`` command: ``enroute dev``, ``enroute token create|list|revoke``, and the
API client commands ``enroute repo ...`` and ``enroute commit`` (cli_api.py).

``enroute dev`` (DESIGN.md, "Processes"; docs: services) runs the three roles
as child processes on loopback with generated configs under ``--data``: one
ledger voter, a ``file://`` store, internal ports picked by the children
(port 0) and read from their ready lines, gitproto on ``--listen`` with
anonymous write. It prints ``enroute ready: http://HOST:PORT`` and forwards
SIGTERM/SIGINT to the children, then exits when they have.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from enroute_core.base.errors import InvalidArgument
from enroute_core.config import load_config
from enroute_gitproto.auth import parse_tokens, repos_glob_problem
from enroute_gitproto.cli_api import commit, repo_app, table
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

READY = re.compile(r"^enroute (\w+) ready: (.*)$")
ROLES = ("ledger", "compute", "gitproto")
STOP_GRACE_S = 10.0
"""How long a stopped role may take beyond the drain its config gives it."""
DEV_SHUTDOWN_GRACE_S = 5.0
"""gitproto's ``transport.shutdown_grace`` under `enroute dev` (a deployment's: 25 s)."""
LOG_TAIL_BYTES = 4000
ANONYMOUS_WRITE_WARNING = (
    "enroute dev: WARNING: anonymous read AND WRITE is on (auth.anonymous: write): anyone who "
    "can reach this port can clone, push and delete; for development only"
)


class Child:
    """One role: its process, its log file, and the addresses of its ready line."""

    def __init__(
        self, role: str, argv: list[str], log_path: Path, stop_grace_s: float = STOP_GRACE_S
    ) -> None:
        self.role = role
        self.log_path = log_path
        self.stop_grace_s = stop_grace_s
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log
        )
        self.ready = threading.Event()
        self.addresses: dict[str, str] = {}
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self._log.write(raw)
            self._log.flush()
            match = READY.match(raw.decode("utf-8", "replace").strip())
            if match and match.group(1) == self.role and not self.ready.is_set():
                for item in match.group(2).split():
                    key, _, value = item.partition("=")
                    self.addresses[key] = value
                self.ready.set()

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready.wait(0.05):
                return True
            if self.process.poll() is not None:
                return self.ready.wait(0.2)
        return False

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-LOG_TAIL_BYTES:].decode("utf-8", "replace")

    def stop(self, grace_s: float) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(grace_s)
        self._log.close()
        return self.process.returncode


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


INTERNAL_TOKEN_FILE = "internal-token"
"""Under ``--data``: the shared secret of the internal gRPC calls (docs/security.md)."""


def internal_token(data: Path) -> Path:
    """``--data``'s internal token, made once (mode 0600) and kept across restarts."""
    path = data / INTERNAL_TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


def role_config(
    role: str, data: Path, listen: str, found: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """The generated config of one role; ``found`` holds the ready addresses of earlier roles."""
    store = {"url": f"file://{data / 'store'}"}
    log = {"format": "text"}  # for a terminal; containers keep the default, JSON lines
    internal = str(data / INTERNAL_TOKEN_FILE)  # every internal gRPC call carries it
    if role == "ledger":
        return {
            "node": {"id": "dev-ledger-1", "data_dir": str(data / "ledger")},
            "auth": {"internal_token_file": internal},
            "store": store,
            "listen": {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0"},
            "log": log,
        }
    if role == "compute":
        return {
            "node": {"id": "dev-compute-1", "data_dir": str(data / "compute")},
            "ledger": {"members": [found["ledger"]["grpc"]]},
            "auth": {"internal_token_file": internal},
            "store": store,
            "listen": {"grpc": "127.0.0.1:0", "http": "127.0.0.1:0"},
            "log": log,
        }
    return {
        "node": {"id": "dev-gitproto-1"},
        "compute": {"members": [found["compute"]["grpc"]]},
        "auth": {"anonymous": "write", "internal_token_file": internal},
        "listen": {"http": listen, "ops": "127.0.0.1:0"},  # /metrics, /status: listen.ops
        "log": log,
        "transport": {"shutdown_grace": f"{DEV_SHUTDOWN_GRACE_S:g}s"},  # Ctrl-C stops soon
    }


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


def _child_argv(role: str, config_path: Path, templates: dict[str, str]) -> list[str]:
    template = templates.get(role)
    if template is None:
        return [sys.executable, "-m", f"enroute_{role}", "--config", str(config_path)]
    return shlex.split(template.format(role=role, config=config_path, python=sys.executable))


def run_dev(data: Path, listen: str, user_config: dict[str, Any], templates: dict[str, str],
            start_timeout_s: float) -> int:  # fmt: skip
    data.mkdir(parents=True, exist_ok=True)
    (data / "config").mkdir(exist_ok=True)
    (data / "logs").mkdir(exist_ok=True)
    internal_token(data)
    children: list[Child] = []
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        found: dict[str, dict[str, str]] = {}
        for role in ROLES:
            config = _merge(role_config(role, data, listen, found), user_config)
            if role == "gitproto" and config.get("auth", {}).get("anonymous") == "write":
                print(ANONYMOUS_WRITE_WARNING, file=sys.stderr, flush=True)
            config_path = data / "config" / f"{role}.yaml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=True))
            child = Child(
                role,
                _child_argv(role, config_path, templates),
                data / "logs" / f"{role}.log",
                STOP_GRACE_S + _drain_s(role, config),
            )
            children.append(child)
            if not child.wait_ready(start_timeout_s) or stopping.is_set():
                if stopping.is_set():
                    return 0
                print(f"enroute dev: {role} was not ready within {start_timeout_s:g} s "
                      f"(exit status {child.process.poll()}); its log ({child.log_path}):\n"
                      f"{child.log_tail()}", file=sys.stderr, flush=True)  # fmt: skip
                return 1
            found[role] = child.addresses
        print(f"enroute ready: http://{found['gitproto']['http']}", flush=True)
        print(f"enroute operator endpoints: http://{found['gitproto'].get('ops', '-')}"
              "/metrics and /status", flush=True)  # fmt: skip
        while not stopping.wait(0.2):
            for child in children:
                if child.process.poll() is not None:
                    print(f"enroute dev: {child.role} exited with status "
                          f"{child.process.returncode}; its log ({child.log_path}):\n"
                          f"{child.log_tail()}", file=sys.stderr, flush=True)  # fmt: skip
                    return 1
        return 0
    finally:
        for child in reversed(children):
            child.stop(child.stop_grace_s)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    raise typer.Exit(run_dev(data.resolve(), listen, user, templates, start_timeout))


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
