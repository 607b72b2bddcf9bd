"""A real `enroute dev` per test module, and a raw smart-HTTP client for hostile requests.

Started as an operator starts it (DESIGN.md "Processes"): `enroute dev --listen
127.0.0.1:0 --data DIR`, ready on `enroute ready: URL`, stopped with SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ENROUTE_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "enroute"
READY_LINE = re.compile(rb"enroute ready: (http://\S+)")
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 20.0


def _pump(
    process: subprocess.Popen[bytes], log_path: Path, found: list[str], ready: threading.Event
) -> None:
    assert process.stdout is not None
    with open(log_path, "ab") as log:
        for raw in process.stdout:
            log.write(raw)
            log.flush()
            match = READY_LINE.search(raw)
            if match and not found:
                found.append(match.group(1).decode("ascii").rstrip("/"))
                ready.set()
    ready.set()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own group: the dev process and its roles
        process.wait(timeout=STOP_GRACE_S)


@pytest.fixture(scope="module")
def enroute_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (`http://HOST:PORT`) of a running `enroute dev`, one per module."""
    root = tmp_path_factory.mktemp("enroute-hostile")
    log_path = root / "enroute.log"
    argv = [str(ENROUTE_BIN), "dev", "--listen", "127.0.0.1:0", "--data", str(root / "data")]
    with open(log_path, "ab") as err:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    found: list[str] = []
    ready = threading.Event()
    pump = threading.Thread(target=_pump, args=(process, log_path, found, ready), daemon=True)
    pump.start()
    try:
        ready.wait(READY_TIMEOUT_S)
        if not found:
            _stop(process)
            tail = log_path.read_bytes()[-4000:].decode("utf-8", "replace")
            pytest.fail(f"{argv} not ready within {READY_TIMEOUT_S} s:\n{tail}", pytrace=False)
        yield found[0]
    finally:
        _stop(process)
        pump.join(timeout=5)


# hostile_wire.py sits beside this file; the tests import it by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))
