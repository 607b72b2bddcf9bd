"""A real `enroute dev` for end-to-end client tests, one per test session.

The server is started the way an operator starts it (DESIGN.md "Processes"):
`enroute dev --listen 127.0.0.1:0 --data DIR`, ready once it prints
`enroute ready: URL`, stopped with SIGTERM, which it forwards to its roles.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

ENROUTE_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "enroute"
READY_LINE = re.compile(rb"enroute ready: (http://\S+)")
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 20.0
LOG_TAIL_BYTES = 6000


def _log_tail(log_path: Path) -> str:
    try:
        data = log_path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-LOG_TAIL_BYTES:].decode("utf-8", "replace")


def _pump_stdout(
    process: subprocess.Popen[bytes], log: BinaryIO, found: list[str], ready: threading.Event
) -> None:
    """Copy stdout into the log and note the first ready line; ends when stdout closes."""
    assert process.stdout is not None
    for raw in process.stdout:
        log.write(raw)
        log.flush()
        match = READY_LINE.search(raw)
        if match and not found:
            found.append(match.group(1).decode("ascii").rstrip("/"))
            ready.set()
    ready.set()  # stdout closed: wake the waiter so it can report the exit


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        # The dev process did not bring its roles down: take the whole group.
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_GRACE_S)


@pytest.fixture(scope="session")
def enroute_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (`http://HOST:PORT`, no trailing slash) of a running `enroute dev`."""
    root = tmp_path_factory.mktemp("enroute-dev")
    log_path = root / "enroute.log"
    argv = [
        str(ENROUTE_BIN),
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--data",
        str(root / "data"),
    ]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # own process group: a last-resort kill reaches the roles
        )
        found: list[str] = []
        ready = threading.Event()
        pump = threading.Thread(target=_pump_stdout, args=(process, log, found, ready), daemon=True)
        pump.start()
        try:
            ready.wait(READY_TIMEOUT_S)
            if not found:
                _stop(process)
                status = process.poll()
                pytest.fail(
                    f"{argv} not ready within {READY_TIMEOUT_S} s (exit status {status}):\n"
                    f"{_log_tail(log_path)}",
                    pytrace=False,
                )
            yield found[0]
        finally:
            _stop(process)
            pump.join(timeout=5)
