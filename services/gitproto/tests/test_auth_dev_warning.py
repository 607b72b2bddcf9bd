"""`enroute dev` says, in one line at start-up, that anyone may read and write."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import yaml

from enroute_testing.env import service_env

FAKE_CHILD = """
import signal, sys, time
role = sys.argv[1]
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
print(f"enroute {role} ready: grpc=127.0.0.1:1{len(role)} http=127.0.0.1:0", flush=True)
while not stop:
    time.sleep(0.05)
"""


def _dev_stderr(tmp_path: Path, *extra: str) -> tuple[str, str]:
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    templates = [f"--child-cmd={role}={{python}} {script} {role} {{config}}"
                 for role in ("ledger", "compute", "gitproto")]  # fmt: skip
    argv = [sys.executable, "-m", "enroute_gitproto.cli", "dev", "--data", str(tmp_path / "d"),
            "--listen", "127.0.0.1:0", "--start-timeout", "20", *templates, *extra]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=service_env()
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return ready, err


def test_dev_warns_once_about_anonymous_write(tmp_path: Path) -> None:
    ready, err = _dev_stderr(tmp_path)
    assert ready.startswith("enroute ready: http://")  # stdout keeps the ready line first
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert warnings == [
        "enroute dev: WARNING: anonymous read AND WRITE is on (auth.anonymous: write): anyone "
        "who can reach this port can clone, push and delete; for development only"
    ]


def test_dev_with_auth_on_does_not_warn(tmp_path: Path) -> None:
    config = tmp_path / "auth.yaml"
    config.write_text(yaml.safe_dump({"auth": {"anonymous": "read"}}))
    _, err = _dev_stderr(tmp_path, "--config", str(config))
    assert "WARNING" not in err
