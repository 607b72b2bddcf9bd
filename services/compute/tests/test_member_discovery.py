"""A compute process finds its ledger through the Kubernetes API and follows changes live.

docs/observability.md "Discovery": ``ledger.discovery`` names the ledger's
Service; the compute lists and watches its EndpointSlices (here served by
enroute_testing.kubeapi on 127.0.0.1) and swaps its member set as they change.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from enroute_compute.ledger_client import GrpcLedger
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.env import service_env
from enroute_testing.kubeapi import NS, SERVICE, ThreadedKubeApi, endpoint_slice
from enroute_testing.waiting import wait_until


def _members(http: str) -> list[str]:
    with urllib.request.urlopen(f"http://{http}/status", timeout=10) as r:
        members: list[str] = json.load(r)["ledger_members"]
    return members


def _until(fn: Callable[[], object], want: object, timeout_s: float = 20.0) -> None:
    wait_until(
        lambda: fn() == want, timeout_s, f"members {want!r}", explain=lambda: f"last saw {fn()!r}"
    )


@pytest.mark.timeout(120)
def test_compute_follows_ledger_endpoint_slices(tmp_path: Path, ledger_process: str) -> None:
    ip, port = ledger_process.rsplit(":", 1)
    with ThreadedKubeApi() as api:
        api.call(
            lambda s: s.put(endpoint_slice("l-1", {ip: True, "10.1.1.1": False}, port=int(port)))
        )
        config = tmp_path / "compute.yaml"
        config.write_text(
            f"node:\n  id: disc-1\n  data_dir: {tmp_path / 'data'}\n"
            f"store:\n  url: file://{tmp_path / 'store'}\n"
            "ledger:\n  discovery:\n"
            f"    service: {SERVICE}\n    namespace: {NS}\n    api_url: {api.url}\n"
            "    watch_timeout: 5s\n"
            "layers:\n  maintenance_interval: 0\n"
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
            line = proc.stdout.readline().strip()
            assert line.startswith("enroute compute ready:"), line
            parts = dict(p.split("=", 1) for p in line.split(": ", 1)[1].split())
            http = parts["http"]
            assert _members(http) == [ledger_process]  # the not-ready endpoint is left out
            with grpc.insecure_channel(parts["grpc"]) as channel:  # the ledger answers
                stub = compute_pb2_grpc.ComputeStub(channel)
                stub.ListRepositories(compute_pb2.ListRepositoriesRequest(), timeout=20)
            # a second voter becomes ready, in a second slice: added live
            api.call(lambda s: s.put(endpoint_slice("l-2", {"127.0.0.1": True}, port=1)))
            _until(lambda: _members(http), sorted([ledger_process, "127.0.0.1:1"]))
            # it goes away again
            api.call(lambda s: s.delete("l-2"))
            _until(lambda: _members(http), [ledger_process])
            with grpc.insecure_channel(parts["grpc"]) as channel:
                stub = compute_pb2_grpc.ComputeStub(channel)
                stub.ListRepositories(compute_pb2.ListRepositoriesRequest(), timeout=20)
            assert api.call(lambda s: s.lists) == 1  # followed by watching, not by listing
            with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as r:
                text = r.read()
            assert b'enroute_discovery_lists_total{target="ledger"} 1.0' in text
        finally:
            proc.terminate()
            assert proc.wait(30) == 0


def test_grpc_ledger_set_members_keeps_channels_that_stay() -> None:
    async def run() -> None:
        ledger = GrpcLedger(("127.0.0.1:1",))
        kept = ledger._channels[0]
        ledger.set_members(("127.0.0.1:2", "127.0.0.1:1"))
        assert ledger.members == ("127.0.0.1:2", "127.0.0.1:1")
        assert ledger._channels[1] is kept and ledger._next == 1  # still the last one used
        ledger.set_members(())  # an empty set is ignored
        assert ledger.members == ("127.0.0.1:2", "127.0.0.1:1")
        ledger.set_members(("127.0.0.1:2",))
        assert ledger.members == ("127.0.0.1:2",) and ledger._next == 0
        assert list(ledger._retiring.values()) == [kept]
        await ledger.close()

    asyncio.run(run())
