"""``python -m enroute_compute --config FILE``: ready line, HTTP endpoints, clean stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from enroute_testing.env import service_env
from enroute_testing.ready import START_TIMEOUT_S, read_ready


def test_process_serves_ops_endpoints_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "compute.yaml"
    config.write_text(
        f"node:\n  id: c1\n  data_dir: {tmp_path / 'data'}\n  disk_cache: 8MiB\n"
        f"store:\n  url: file://{tmp_path / 'store'}\n"
        "ledger:\n  members: ['127.0.0.1:1']\n"
        "listen:\n  grpc: 127.0.0.1:0\n  http: 127.0.0.1:0\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "enroute_compute", "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
        env=service_env(),
    )
    try:
        assert proc.stdout is not None
        ready = read_ready(proc.stdout, "compute", START_TIMEOUT_S)
        assert ready["grpc"].startswith("127.0.0.1:"), ready
        http = ready["http"]
        assert not http.endswith(":0")
        with urllib.request.urlopen(f"http://{http}/readyz", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://{http}/status", timeout=5) as r:
            status = json.load(r)
        assert status["role"] == "compute" and status["node_id"] == "c1"
        assert {"links", "hydrations", "loads_in_flight"} <= set(status["layers"])
        # Under a disk budget the rewritten-entry spill takes a quarter of it, not 1 GiB.
        assert status["caches"]["spill"]["cap_bytes"] == 2 * 1024 * 1024
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:
            assert b"enroute_compute_pushes_total 0.0" in r.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
