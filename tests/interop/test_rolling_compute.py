"""A compute restarted under load: its push completes, and gitproto moves new calls elsewhere.

docs/observability.md "Rolling upgrades": on SIGTERM a compute stops taking
calls (UNAVAILABLE), finishes the pushes it has, and exits 0; gitproto fails
over to the next compute of the rendezvous order (DESIGN.md "Processes").
Real processes: one ledger voter, two computes on one store, one gitproto,
and the git CLI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.env import service_env
from enroute_testing.gitcli import run_git
from enroute_testing.ledgers import LedgerProc, write_config
from enroute_testing.ready import START_TIMEOUT_S, read_ready

pytestmark = [pytest.mark.interop, pytest.mark.slow]

BLOB_BYTES = 24 * 1024 * 1024
REPO = "rolling/big"


def _spawn(role: str, config: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", f"enroute_{role}", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=service_env(),
    )
    assert proc.stdout is not None
    return proc, read_ready(proc.stdout, role, START_TIMEOUT_S)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, object]]:
    procs: list[subprocess.Popen[str]] = []
    ledger = LedgerProc(
        write_config(tmp_path / "l.yaml", node_id=1, data=tmp_path / "l", store=tmp_path / "s")
    ).start()
    try:
        computes = []
        for i in (1, 2):
            cfg = tmp_path / f"c{i}.yaml"
            cfg.write_text(
                f"node:\n  id: c{i}\n  data_dir: {tmp_path / f'c{i}'}\n"
                f"store:\n  url: file://{tmp_path / 's'}\n"
                f"ledger:\n  members: ['{ledger.grpc_addr}']\n"
                "compute:\n  drain_grace: 90s\n"
                "layers:\n  maintenance_interval: 0\n"
                "listen:\n  grpc: 127.0.0.1:0\n  http: 127.0.0.1:0\n"
            )
            proc, addrs = _spawn("compute", cfg)
            procs.append(proc)
            computes.append((proc, addrs))
        members = ", ".join(f"'{a['grpc']}'" for _, a in computes)
        gcfg = tmp_path / "g.yaml"
        gcfg.write_text(
            f"node:\n  id: g1\ncompute:\n  members: [{members}]\n"
            "auth:\n  anonymous: write\nlisten:\n  http: 127.0.0.1:0\n"
        )
        gproc, gaddrs = _spawn("gitproto", gcfg)
        procs.append(gproc)
        yield {"computes": computes, "url": f"http://{gaddrs['http']}"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        ledger.kill()


def _in_flight(http: str) -> float:
    try:
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("enroute_compute_git_calls_in_flight "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


@pytest.mark.timeout(300)
def test_sigterm_of_the_serving_compute_mid_push(
    cluster: dict[str, object], tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    (src / "big.bin").write_bytes(os.urandom(BLOB_BYTES))
    run_git(["add", "."], cwd=src)
    run_git(["commit", "-q", "-m", "big"], cwd=src)
    url = f"{cluster['url']}/{REPO}.git"
    computes = cluster["computes"]
    assert isinstance(computes, list)

    pushed: dict[str, object] = {}

    def push() -> None:
        try:
            run_git(["push", "-q", url, "main:refs/heads/main"], cwd=src, timeout_s=240)
            pushed["ok"] = True
        except Exception as e:  # reported below
            pushed["error"] = e

    pusher = threading.Thread(target=push)
    pusher.start()
    serving = None
    deadline = time.monotonic() + 60
    while serving is None and time.monotonic() < deadline and pusher.is_alive():
        for proc, addrs in computes:
            if _in_flight(addrs["http"]) >= 1:
                serving = (proc, addrs)
                break
        time.sleep(0.02)
    if serving is None:
        pusher.join(240)
        pytest.skip(f"the push finished before it could be caught in flight: {pushed}")
    proc, _ = serving
    proc.send_signal(signal.SIGTERM)
    pusher.join(240)
    assert pushed.get("ok"), pushed.get("error")
    assert proc.wait(60) == 0
    # the repository is served by the other compute now
    refs = run_git(["ls-remote", url], cwd=tmp_path)
    head = run_git(["rev-parse", "HEAD"], cwd=src)
    assert head.strip() in refs
    run_git(["clone", "-q", url, str(tmp_path / "clone")], cwd=tmp_path, timeout_s=240)
    assert (tmp_path / "clone" / "big.bin").stat().st_size == BLOB_BYTES
