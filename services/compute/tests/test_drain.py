"""SIGTERM drains a compute process: the push in flight completes, new calls get UNAVAILABLE.

Rolling upgrades (docs/observability.md, "Rolling upgrades"): /readyz turns
503, every new call is refused with UNAVAILABLE so gitproto moves it to
another compute, the calls in flight run to their end (for at most
``compute.drain_grace``), then the process exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from enroute_compute.main import pack_object_count
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.env import service_env
from enroute_testing.waiting import wait_until

BLOB_BYTES = 8 * 1024 * 1024
CHUNK_BYTES = 128 * 1024
CHUNK_PAUSE_S = 0.03  # ~64 chunks: the push takes a few seconds on its own
ZERO = "0" * 40
Proc = tuple[subprocess.Popen[str], str, str]


def _git(cwd: Path, *args: str, data: bytes | None = None) -> bytes:
    env = {
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd),
        "GIT_AUTHOR_NAME": "A",
        "GIT_AUTHOR_EMAIL": "a@example.com",
        "GIT_AUTHOR_DATE": "1700000000 +0000",
        "GIT_COMMITTER_NAME": "A",
        "GIT_COMMITTER_EMAIL": "a@example.com",
        "GIT_COMMITTER_DATE": "1700000000 +0000",
        "PATH": os.environ.get("PATH", ""),
    }
    out = subprocess.run(
        ["git", *args], cwd=cwd, env=env, input=data, capture_output=True, check=True
    )
    return out.stdout


def _pkt(line: bytes) -> bytes:
    return f"{len(line) + 4:04x}".encode() + line


def large_push_body(tmp_path: Path) -> tuple[bytes, str]:
    """A receive-pack request (gitprotocol-pack, "Reference Update Request and Packfile
    Transfer") creating refs/heads/main with an incompressible blob of BLOB_BYTES."""
    work = tmp_path / "src"
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "big.bin").write_bytes(os.urandom(BLOB_BYTES))
    _git(work, "add", "big.bin")
    _git(work, "commit", "-q", "-m", "big")
    head = _git(work, "rev-parse", "HEAD").decode().strip()
    pack = _git(work, "pack-objects", "--stdout", "--revs", data=b"HEAD\n")
    command = f"{ZERO} {head} refs/heads/main\0report-status side-band-64k\n".encode()
    return _pkt(command) + b"0000" + pack, head


@pytest.fixture
def compute_process(tmp_path: Path, ledger_process: str) -> Iterator[Proc]:
    config = tmp_path / "compute.yaml"
    config.write_text(
        f"node:\n  id: drain-1\n  data_dir: {tmp_path / 'data'}\n"
        f"store:\n  url: file://{tmp_path / 'store'}\n"
        f"ledger:\n  members: ['{ledger_process}']\n"
        "compute:\n  drain_grace: 60s\n"
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
        yield proc, parts["grpc"], parts["http"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _requests(body: bytes, repo: str) -> Iterator[compute_pb2.GitRequest]:
    yield compute_pb2.GitRequest(
        header=compute_pb2.GitRequestHeader(repo=repo, service=compute_pb2.GIT_SERVICE_RECEIVE_PACK)
    )
    for at in range(0, len(body), CHUNK_BYTES):
        time.sleep(CHUNK_PAUSE_S)
        yield compute_pb2.GitRequest(body=body[at : at + CHUNK_BYTES])


def _http(http: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{http}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.timeout(120)
def test_sigterm_during_a_large_push_lets_it_complete(
    tmp_path: Path, compute_process: Proc
) -> None:
    proc, grpc_addr, http = compute_process
    body, head = large_push_body(tmp_path)
    result: dict[str, object] = {}

    def push() -> None:
        with grpc.insecure_channel(grpc_addr) as channel:
            stub = compute_pb2_grpc.ComputeStub(channel)
            try:
                out = b"".join(
                    m.body for m in stub.ReceivePack(_requests(body, "drain/big"), timeout=90)
                )
                result["body"] = out
            except grpc.RpcError as e:
                result["error"] = e

    pusher = threading.Thread(target=push)
    pusher.start()
    wait_until(  # the push is in flight once the node counts it
        lambda: b"enroute_compute_git_calls_in_flight 1.0" in _http(http, "/metrics")[1],
        30,
        "the push shows as in flight",
        poll_s=0.05,
    )
    proc.send_signal(signal.SIGTERM)
    # draining: not ready, and a new call is refused so gitproto would go elsewhere
    wait_until(lambda: _http(http, "/readyz")[0] == 503, 10, "/readyz answers 503")
    assert pusher.is_alive(), "the push ended before the drain could be observed"
    with grpc.insecure_channel(grpc_addr) as channel:
        stub = compute_pb2_grpc.ComputeStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListRepositories(compute_pb2.ListRepositoriesRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    pusher.join(90)
    assert "error" not in result, result.get("error")
    report = result["body"]
    assert isinstance(report, bytes)
    assert b"unpack ok" in report and b"ok refs/heads/main" in report, report[:500]
    assert proc.wait(30) == 0
    assert head


def test_pack_object_count_reads_the_pack_header() -> None:
    """gitformat-pack: "PACK", version 2 or 3, then the object count (network order)."""
    commands = _pkt(f"{ZERO} {'1' * 40} refs/heads/x\0report-status\n".encode()) + b"0000"
    header = b"PACK\x00\x00\x00\x02\x00\x00\x01\x02"
    assert pack_object_count(commands + header + b"rest") == 258
    assert pack_object_count(b"PACK\x00\x00\x00\x03\x00\x00\x00\x07") == 7
    assert pack_object_count(commands + header[:11]) is None  # cut: not yet known
    assert pack_object_count(b"PACK\x00\x00\x00\x04\x00\x00\x00\x07") is None
    assert pack_object_count(commands) is None
