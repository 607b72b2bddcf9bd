"""A real `enroute dev` for end-to-end tests, started as an operator starts it.

DESIGN.md "Processes": `enroute dev --listen 127.0.0.1:0 --data DIR [--config FILE]`,
ready once it prints `enroute ready: URL`, stopped with SIGTERM, which it forwards
to its roles. The process gets its own group, so a last-resort kill reaches the roles.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from enroute_testing.env import service_env
from enroute_testing.ready import latest_ready, ready_in_log

ENROUTE_BIN = Path(sys.executable).parent / "enroute"
READY_LINE = re.compile(rb"enroute ready: (http://\S+)")
ROLE_START_TIMEOUT_S = 60.0
"""`enroute dev --start-timeout`: how long each role may take to print its ready line."""
READY_TIMEOUT_S = 3 * ROLE_START_TIMEOUT_S + 30.0
"""A backstop only: dev starts its three roles one after the other, each within
ROLE_START_TIMEOUT_S, and when one is late it says which and exits, which ends the wait
at once. A single bound of 60 s for all three was hit on a loaded machine while every
role was still within its own."""
STOP_GRACE_S = 20.0
LOG_TAIL_BYTES = 6000


class DevNotReady(RuntimeError):
    """`enroute dev` exited or printed no ready line in time; the message holds its log."""


@dataclass(frozen=True, slots=True)
class DevServer:
    url: str
    """`http://HOST:PORT`, no trailing slash."""
    log_path: Path
    pid: int
    """Of the `enroute dev` process; its roles are its children."""

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    @property
    def ops_url(self) -> str:
        """gitproto's operator port (``/metrics``, ``/status``; listen.ops), latest start."""
        return gitproto_ops(self.log_path.parent)

    @property
    def admin_headers(self) -> dict[str, str]:
        """The internal token as a bearer token: computes' and ledgers' ``/status?repo=``."""
        token = (self.log_path.parent / "data" / "internal-token").read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    def compute_status(self) -> dict[str, Any]:
        """The compute's ``/status``, at the address its (latest) ready line names."""
        return compute_status(self.log_path.parent)


def role_log(root: Path, role: str) -> str:
    """The log `enroute dev` under ``root`` keeps of ``role`` (every start, ready lines too)."""
    return (root / "data" / "logs" / f"{role}.log").read_text(errors="replace")


def role_http(root: Path) -> dict[str, str]:
    """The HTTP base URL of the ledger and the compute of the `enroute dev` under ``root``
    (their first start)."""
    out = {}
    for role in ("ledger", "compute"):
        starts = ready_in_log(role_log(root, role), role)
        assert starts, f"no ready line in the {role} log"
        out[role] = f"http://{starts[0]['http']}"
    return out


def gitproto_ops(root: Path) -> str:
    """``http://HOST:PORT`` of the operator port of the gitproto under ``root`` (latest start)."""
    return f"http://{latest_ready(role_log(root, 'gitproto'), 'gitproto')['ops']}"


def compute_status(root: Path) -> dict[str, Any]:
    """``/status`` of the compute of the `enroute dev` under ``root`` (its latest start)."""
    http = latest_ready(role_log(root, "compute"), "compute")["http"]
    with urllib.request.urlopen(f"http://{http}/status", timeout=20) as r:
        status: dict[str, Any] = json.loads(r.read())
    return status


def largest_stored_layer(root: Path) -> Path:
    """The largest layer file in the ``file://`` store of the `enroute dev` under ``root``."""
    files = [p for p in (root / "data" / "store").rglob("*") if p.is_file() and "layers" in p.parts]
    assert files, f"no stored layer under {root}"
    return max(files, key=lambda p: p.stat().st_size)


def _pump(
    process: subprocess.Popen[bytes], log_path: Path, found: list[str], ready: threading.Event
) -> None:
    """Copy stdout into the log and note the first ready line; ends when stdout closes."""
    assert process.stdout is not None
    with open(log_path, "ab") as log:
        for raw in process.stdout:
            log.write(raw)
            log.flush()
            match = READY_LINE.search(raw)
            if match and not found:
                found.append(match.group(1).decode("ascii").rstrip("/"))
                ready.set()
    ready.set()  # stdout closed: wake the waiter so it can report the exit


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the dev process did not bring its roles down
        process.wait(timeout=STOP_GRACE_S)


@contextmanager
def running_dev(root: Path, config: dict[str, Any] | None = None) -> Iterator[DevServer]:
    """An `enroute dev` with data and log under ``root`` and ``config`` merged into every role."""
    log_path = root / "enroute.log"
    argv = [str(ENROUTE_BIN), "dev", "--listen", "127.0.0.1:0", "--data", str(root / "data"),
            "--start-timeout", str(ROLE_START_TIMEOUT_S)]  # fmt: skip
    if config is not None:
        config_path = root / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv += ["--config", str(config_path)]
    with open(log_path, "ab") as err:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            env=service_env(),
        )
    found: list[str] = []
    ready = threading.Event()
    pump = threading.Thread(target=_pump, args=(process, log_path, found, ready), daemon=True)
    pump.start()
    try:
        ready.wait(READY_TIMEOUT_S)
        if not found:
            stop(process)
            tail = log_path.read_bytes()[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
            raise DevNotReady(
                f"{argv} not ready within {READY_TIMEOUT_S} s (exit {process.poll()}):\n{tail}"
            )
        yield DevServer(found[0], log_path, process.pid)
    finally:
        stop(process)
        pump.join(timeout=5)
