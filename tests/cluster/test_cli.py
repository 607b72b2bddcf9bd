"""``enroute cluster up|status|down`` as an operator runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from enroute_testing.cluster import NAMES, STATE_FILE, pid_alive
from enroute_testing.gitcli import run_git

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.interop]

ENROUTE_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "enroute"


def _enroute(*args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENROUTE_BIN), "cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_up_status_down(tmp_path: Path) -> None:
    data = tmp_path / "c"
    up = _enroute("up", "--data", str(data))
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        url = up.stdout.split("enroute cluster ready: ", 1)[1].split()[0]
        state = json.loads((data / STATE_FILE).read_text())
        assert set(state["members"]) == set(NAMES)
        pids = [m["pid"] for m in state["members"].values()] + [state["s3"]["pid"]]
        assert all(pid_alive(p) for p in pids)
        for name in NAMES:  # each its own config and data directory
            assert (data / name / "config.yaml").exists() and (data / name / "data").is_dir()

        status = _enroute("status", "--data", str(data))
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("readyz=200") == len(NAMES)

        src = tmp_path / "src"
        src.mkdir()
        run_git(["init", "-q", "-b", "main"], cwd=src)
        run_git(["commit", "-q", "--allow-empty", "-m", "first"], cwd=src)
        run_git(["push", "-q", f"{url}/demo.git", "main"], cwd=src)
        run_git(["clone", "-q", f"{url}/demo.git", str(tmp_path / "copy")], cwd=tmp_path)
        assert (tmp_path / "copy" / ".git").is_dir()
    finally:
        down = _enroute("down", "--data", str(data))
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids)
    assert _enroute("status", "--data", str(data)).returncode == 1
