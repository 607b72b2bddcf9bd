"""The ``enroute dev`` supervisor: it starts the three roles and waits on them.

``enroute dev`` (the command in cli.py) parses its options and reads the drain each
role's config gives it, then replaces itself (``exec``) with this module, so the
process that stays for the session imports the standard library and YAML only: the
command line's typer, gRPC, protobuf and pydantic (the config models) would be
about 40 MiB of resident memory kept only to supervise three children
(docs/services.md, "Memory before any work"). Same process id, same stdout, so
whoever started ``enroute dev`` sees no difference.

It runs the roles as child processes on loopback with generated configs under
``--data``: one ledger voter, a ``file://`` store, internal ports picked by the
children (port 0) and read from their ready lines, gitproto on ``--listen`` with
anonymous write. It prints ``enroute ready: http://HOST:PORT`` and forwards
SIGTERM/SIGINT to the children, then exits when they have.

Usage (from cli.py only): ``python -m enroute_gitproto.dev FILE``, FILE a JSON
object of ``run_dev``'s arguments (``DIR/config/dev-args.json``, mode 0600).
"""

from __future__ import annotations

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
from typing import Any

import yaml

DEV_ARGS_FILE = "dev-args.json"
"""Under ``--data``/config: what ``enroute dev`` hands this module (see main)."""
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


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
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


def _child_argv(role: str, config_path: Path, templates: dict[str, str]) -> list[str]:
    template = templates.get(role)
    if template is None:
        return [sys.executable, "-m", f"enroute_{role}", "--config", str(config_path)]
    return shlex.split(template.format(role=role, config=config_path, python=sys.executable))


def run_dev(data: Path, listen: str, user_config: dict[str, Any], templates: dict[str, str],
            start_timeout_s: float, *, drains: dict[str, float]) -> int:  # fmt: skip
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
            config = merge(role_config(role, data, listen, found), user_config)
            if role == "gitproto" and config.get("auth", {}).get("anonymous") == "write":
                print(ANONYMOUS_WRITE_WARNING, file=sys.stderr, flush=True)
            config_path = data / "config" / f"{role}.yaml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=True))
            child = Child(
                role,
                _child_argv(role, config_path, templates),
                data / "logs" / f"{role}.log",
                STOP_GRACE_S + drains.get(role, 0.0),
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


def main(argv: list[str] | None = None) -> int:
    path = Path((sys.argv[1:] if argv is None else argv)[0])
    args = json.loads(path.read_text(encoding="utf-8"))
    return run_dev(Path(args["data"]), args["listen"], args["user_config"], args["templates"],
                   args["start_timeout_s"], drains=args["drains"])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
