"""A compute that starts following from a Subscribe snapshot can read inline layers.

The checkpoint names an inline layer only by its pin (the log index holding its
bytes), so the snapshot must carry the bytes too. Reproduced with a real ledger
process: push a small repository (one inline layer), then clone through a
fresh compute, after a compute restart and after a ledger restart (which loses
the ledger's in-memory change history).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from enroute_compute.host import RepositoryHost
from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.main import SystemClock
from enroute_compute.rpc.servicer import ComputeServicer
from enroute_core.state import LayerKind
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import open_store
from enroute_proto.gen.enroute.compute.v1 import compute_pb2_grpc
from enroute_testing.env import service_env
from enroute_testing.gitcli import GitFailed, run_git
from enroute_testing.repogen import RepoSpec, generate_repo, list_refs

pytestmark = pytest.mark.interop

Bridge = Callable[[str], ThreadingHTTPServer]


class _Ledger:
    """``python -m enroute_ledger`` on a data directory that outlives the process."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.config = data / "ledger.yaml"
        self.config.write_text(
            f"node:\n  id: '1'\n  data_dir: {data / 'node'}\n"
            f"store:\n  url: file://{data / 'store'}\n"
            "listen:\n  grpc: 127.0.0.1:0\n  http: 127.0.0.1:0\n"
        )
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self) -> str:
        log = self.data / "ledger.stderr"
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "enroute_ledger", "--config", str(self.config)],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=service_env(PYTHONUNBUFFERED="1"),
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "ready" not in line:
            self.stop()
            pytest.fail(f"ledger did not start ({line!r}): {log.read_text()[-1500:]}")
        self.address = line.split("grpc=")[1].split()[0]
        return self.address

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(10) == 0
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()
        self.proc = None


class _Compute:
    """A compute (RepositoryHost + Compute gRPC) in its own event loop thread."""

    def __init__(self, ledger_address: str, store_url: str, cache: Path) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict[str, object] = {}

        async def start() -> None:
            layers = LayerService(open_store(store_url), cache)
            host = RepositoryHost(GrpcLedger((ledger_address,)), layers, SystemClock())
            server = grpc.aio.server()
            compute_pb2_grpc.add_ComputeServicer_to_server(ComputeServicer(host), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            box.update(server=server, host=host, layers=layers, port=port)
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.box = box
        host = box["host"]
        assert isinstance(host, RepositoryHost)
        self.host = host
        self.address = f"127.0.0.1:{box['port']}"

    def stop(self) -> None:
        async def stop() -> None:
            await self.host.close()
            await self.host.ledger.close()
            server = self.box["server"]
            assert isinstance(server, grpc.aio.Server)
            await server.stop(0)
            layers = self.box["layers"]
            assert isinstance(layers, LayerService)
            await layers.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[_Ledger, list[_Compute]]]:
    (tmp_path / "ledger").mkdir()
    ledger = _Ledger(tmp_path / "ledger")
    ledger.start()
    computes: list[_Compute] = []
    yield ledger, computes
    for c in computes:
        c.stop()
    ledger.stop()


def _clone_checked(url: str, dest: Path, want: dict[bytes, bytes], cwd: Path) -> None:
    deadline = time.monotonic() + 20
    while True:  # a restarted ledger may still be electing its leader
        try:
            run_git(["clone", "--mirror", url, str(dest)], cwd=cwd)
            break
        except GitFailed as e:
            if time.monotonic() > deadline or b"not known here" in e.stderr:
                raise
            time.sleep(0.2)
    assert list_refs(dest) == want
    run_git(["fsck", "--strict", "--no-progress"], cwd=dest)


def test_fresh_compute_and_restarted_ledger_serve_inline_layers(
    cluster: tuple[_Ledger, list[_Compute]], git_bridge: Bridge, tmp_path: Path
) -> None:
    ledger, computes = cluster
    store_url = f"file://{tmp_path / 'store'}"

    def compute(n: int) -> str:
        c = _Compute(ledger.address, store_url, tmp_path / f"compute{n}")
        computes.append(c)
        return f"http://127.0.0.1:{git_bridge(c.address).server_address[1]}/small.git"

    spec = RepoSpec(seed=11, commits=3, branches=1, files=3, annotated_tags=1)
    source = generate_repo(tmp_path / "source.git", spec)
    url = compute(1)
    run_git(["push", "--mirror", url], cwd=source.path)
    manifest = computes[0].host._repos["small"].state.manifest
    assert manifest and all(e.kind is LayerKind.INLINE for e in manifest)
    _clone_checked(url, tmp_path / "c1.git", source.refs, tmp_path)

    # A second compute, and the first one restarted: both start from a snapshot.
    url2 = compute(2)
    _clone_checked(url2, tmp_path / "c2.git", source.refs, tmp_path)
    computes.pop(0).stop()
    url3 = compute(3)
    _clone_checked(url3, tmp_path / "c3.git", source.refs, tmp_path)

    # The ledger restarted: its change history is gone, the pinned entries are not.
    for c in computes:
        c.stop()
    computes.clear()
    ledger.stop()
    ledger.start()
    url4 = compute(4)
    _clone_checked(url4, tmp_path / "c4.git", source.refs, tmp_path)

    # A second small push after the restart, then one more fresh compute.
    work = tmp_path / "c4-work"
    run_git(["clone", url4, str(work)], cwd=tmp_path)
    (work / "more.txt").write_text("more\n")
    run_git(["add", "more.txt"], cwd=work)
    run_git(["commit", "-q", "-m", "more"], cwd=work)
    run_git(["push", "origin", "main"], cwd=work)
    want = dict(source.refs)
    want[b"refs/heads/main"] = run_git(["rev-parse", "HEAD"], cwd=work).strip()
    url5 = compute(5)
    _clone_checked(url5, tmp_path / "c5.git", want, tmp_path)
    inline = [e for e in computes[-1].host._repos["small"].state.manifest]
    assert len(inline) >= 2 and all(e.kind is LayerKind.INLINE for e in inline)
