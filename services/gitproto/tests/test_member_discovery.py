"""A gitproto process finds computes through the Kubernetes API and follows changes live.

docs/observability.md "Discovery": ``compute.discovery`` names the computes'
Service; gitproto watches its EndpointSlices (enroute_testing.kubeapi on
127.0.0.1) and routes over the ready endpoints.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from enroute_testing.env import service_env
from enroute_testing.kubeapi import NS, ThreadedKubeApi, endpoint_slice
from enroute_testing.ready import START_TIMEOUT_S, read_ready
from enroute_testing.waiting import until, wait_until

SERVICE = "enroute-compute"


def _members(base: str) -> list[str]:
    with urllib.request.urlopen(f"http://{base}/status", timeout=10) as r:
        members: list[str] = json.load(r)["compute_members"]
    return members


def _until(base: str, want: list[str], timeout_s: float = 20.0) -> None:
    wait_until(
        lambda: _members(base) == want,
        timeout_s,
        f"members {want}",
        explain=lambda: f"last saw {_members(base)}",
    )


@pytest.mark.timeout(120)
def test_gitproto_follows_compute_endpoint_slices(tmp_path: Path) -> None:
    with ThreadedKubeApi() as api:
        api.call(
            lambda s: s.put(
                endpoint_slice("c-1", {"10.0.0.1": True, "10.0.0.2": None}, service=SERVICE)
            )
        )
        config = tmp_path / "gitproto.yaml"
        config.write_text(
            "node:\n  id: gp-1\n"
            "compute:\n  discovery:\n"
            f"    service: {SERVICE}\n    namespace: {NS}\n    api_url: {api.url}\n"
            "    watch_timeout: 5s\n"
            "listen:\n  http: 127.0.0.1:0\n  ops: 127.0.0.1:0\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "enroute_gitproto", "--config", str(config)],
            stdout=subprocess.PIPE,
            text=True,
            env=service_env(),
        )
        try:
            assert proc.stdout is not None
            # /status: the operator port
            base = read_ready(proc.stdout, "gitproto", START_TIMEOUT_S)["ops"]
            _until(base, ["10.0.0.1:7000", "10.0.0.2:7000"])
            api.call(
                lambda s: s.put(
                    endpoint_slice("c-1", {"10.0.0.1": False, "10.0.0.3": True}, service=SERVICE)
                )
            )
            _until(base, ["10.0.0.3:7000"])
            with urllib.request.urlopen(f"http://{base}/metrics", timeout=10) as r:
                text = r.read()
            assert b"enroute_gitproto_compute_members 1.0" in text
            assert b'enroute_discovery_updates_total{target="compute"} 2.0' in text
        finally:
            proc.terminate()
            assert proc.wait(30) == 0


@pytest.mark.asyncio
async def test_departed_member_channel_closes_after_grace() -> None:
    """A compute leaving the set stops being routed to and its channel is closed, not leaked."""
    from enroute_gitproto.routing import ComputePool

    pool = ComputePool(["127.0.0.1:1", "127.0.0.1:2"], retire_grace_s=0.05)
    pool.stub("127.0.0.1:1")
    pool.stub("127.0.0.1:2")
    pool.set_members(["127.0.0.1:2"])
    assert pool.order("any") == ["127.0.0.1:2"]
    assert set(pool._channels) == {"127.0.0.1:2"}
    assert len(pool._retiring) == 1
    await until(lambda: not pool._retiring, 10, "the retired channel closed")
    await pool.close()
