"""The compute's layer maintenance (issue "Layer maintenance"; docs/maintenance.md) against
a real ledger process: flushes and compactions keep the manifest logarithmic, rebuild no
view and lose no object, also for a clone that started before a compaction."""

from __future__ import annotations

import asyncio
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
import pytest

from enroute_compute.maintainer import Maintainer, MaintainerConfig
from enroute_core.engine.compaction import plan
from enroute_core.engine.maintenance import MaintenanceSettings
from enroute_core.state import LayerKind
from enroute_core.state.names import layer_key
from enroute_core.storage.objectstore import open_store
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import list_refs
from enroute_testing.waiting import wait_until

pytestmark = pytest.mark.interop

AUTHOR = compute_pb2.Signature(name=b"A U Thor", email=b"author@example.com")
COMMITS = int(os.environ.get("MAINTENANCE_TEST_COMMITS", "200"))
"""API commits of the many-commits test (the issue's acceptance names 1,000)."""
SEED = 7
SERVICES = {"git-upload-pack": 1, "git-receive-pack": 2}


def _on_loop(compute: Any, make: Callable[[], Any]) -> Any:
    async def run() -> Any:
        result = make()
        if asyncio.iscoroutine(result):
            result = await result
        return result

    return asyncio.run_coroutine_threadsafe(run(), compute.loop).result(120)


@pytest.fixture
def maintainer(compute: Any, tmp_path: Path) -> Iterator[Callable[..., Maintainer]]:
    """Builds a Maintainer on the compute's loop over the compute's own store."""
    made: list[Maintainer] = []

    def make(interval_s: float = 0.0, sweep_interval_s: float = 0.0) -> Maintainer:
        store = open_store(f"file://{tmp_path / 'store'}")
        config = MaintainerConfig(
            interval_s=interval_s,
            sweep_interval_us=int(sweep_interval_s * 1e6),
            settings=MaintenanceSettings(sweep_retention_us=3_600_000_000),
        )

        def build() -> Maintainer:
            m = Maintainer(compute.host, store, "compute-a", compute.host.clock, config)
            m.start()
            return m

        m: Maintainer = _on_loop(compute, build)
        made.append(m)
        return m

    yield make
    for m in made:
        _on_loop(compute, m.stop)


def _manifest(compute: Any, name: str) -> Any:
    return _on_loop(compute, lambda: compute.host.read(name)).state.manifest


def _push_source(url: str, name: str, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    run_git(["init", "-q", "-b", "main", str(work)], cwd=tmp_path)
    (work / "README").write_text("maintenance\n")
    run_git(["add", "."], cwd=work)
    run_git(["commit", "-q", "-m", "initial"], cwd=work)
    run_git(["push", "-q", f"{url}/{name}.git", "main"], cwd=work)
    return work


@pytest.mark.slow
@pytest.mark.parametrize("compute", ["grpc-ledger"], indirect=True)
def test_many_commits_keep_few_layers_and_rebuild_no_view(
    compute: Any,
    maintainer: Callable[..., Maintainer],
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
) -> None:
    name = f"many-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _push_source(url, name, tmp_path)
    head = bytes.fromhex(run_git(["rev-parse", "HEAD"], cwd=work).strip().decode())
    builds = compute.host.view_builds
    m = maintainer(interval_s=0.05, sweep_interval_s=0.5)
    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(compute.address))
    most = 0
    started = time.monotonic()
    for i in range(COMMITS):
        request = compute_pb2.CreateCommitRequest(
            repo=name,
            branch=b"main",
            message=f"commit {i}\n".encode(),
            author=AUTHOR,
            expected_oid=head,
            changes=[compute_pb2.FileChange(path=f"d{i % 7}/f{i}".encode(), content=b"%d\n" % i)],
        )
        head = stub.CreateCommit(request, timeout=30).oid
        if i == COMMITS // 2:  # a clone while maintenance runs
            mid = tmp_path / "mid.git"
            run_git(["clone", "-q", "--mirror", f"{url}/{name}.git", str(mid)], cwd=tmp_path)
            run_git(["fsck", "--strict", "--no-progress"], cwd=mid)
        if i % 20 == 0:
            most = max(most, len(_manifest(compute, name)))
    pushing_s = time.monotonic() - started
    wait_until(
        lambda: plan(_manifest(compute, name)) is None,
        30,
        "maintenance catches up",
        poll_s=0.1,
        explain=m.status,
    )
    manifest = _manifest(compute, name)
    pushes = COMMITS + 1
    print(
        f"{pushes} pushes in {pushing_s:.1f} s: {len(manifest)} layers after, at most {most} "
        f"sampled during; {m.status()}"
    )
    assert plan(manifest) is None, "maintenance did not catch up"
    assert len(manifest) <= 2 * math.log2(pushes) + 2
    assert most <= 2 * math.log2(pushes) + 8
    assert all(e.kind is LayerKind.STORED for e in manifest)
    assert m.counters.flushes + m.counters.compactions >= 10
    assert m.counters.merges_refused <= m.counters.merges
    assert compute.host.view_builds == builds, "maintenance rebuilt the view"
    assert m.lease_holders() == {name: "compute-a@1"}

    clone = tmp_path / "clone.git"
    run_git(["clone", "-q", "--mirror", f"{url}/{name}.git", str(clone)], cwd=tmp_path)
    run_git(["fsck", "--strict", "--no-progress"], cwd=clone)
    assert list_refs(clone)[b"refs/heads/main"] == head.hex().encode()
    count = run_git(["rev-list", "--count", "main"], cwd=clone).strip()
    assert int(count) == pushes
    files = run_git(["ls-tree", "-r", "--name-only", "main"], cwd=clone).split()
    assert len(files) == COMMITS + 1


# -- a clone across a compaction ---------------------------------------------------------------


def _paused_bridge(address: str, paused: threading.Event, go: threading.Event) -> Any:
    """The conftest bridge, holding a fetch's reply after its first message until ``go``."""
    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(address))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _serve(self, method: str, service: str, body: bytes) -> None:
            path = urlsplit(self.path).path.lstrip("/")
            path_parts = path.rsplit("/", 2 if method == "InfoRefs" else 1)
            header = compute_pb2.GitRequestHeader(
                repo=path_parts[0].removesuffix(".git"),
                service=SERVICES[service],  # type: ignore[arg-type]
                git_protocol=self.headers.get("Git-Protocol", ""),
            )
            msgs = [compute_pb2.GitRequest(header=header)]
            if body:
                msgs.append(compute_pb2.GitRequest(body=body))
            replies = iter(getattr(stub, method)(iter(msgs)))
            first = next(replies)
            self.send_response(200)
            self.send_header("Content-Type", first.header.content_type)
            self.end_headers()
            hold = method == "UploadPack" and b"want " in body
            for reply in replies:
                self.wfile.write(reply.body)
                if hold and not paused.is_set():
                    self.wfile.flush()
                    paused.set()
                    assert go.wait(60)

        def do_GET(self) -> None:
            service = parse_qs(urlsplit(self.path).query)["service"][0]
            self._serve("InfoRefs", service, b"")

        def do_POST(self) -> None:
            service = urlsplit(self.path).path.rsplit("/", 1)[1]
            method = "UploadPack" if service == "git-upload-pack" else "ReceivePack"
            length = int(self.headers.get("Content-Length") or 0)
            self._serve(method, service, self.rfile.read(length))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.slow
@pytest.mark.parametrize("compute", ["grpc-ledger"], indirect=True)
def test_a_clone_that_started_before_a_compaction_finishes(
    compute: Any,
    maintainer: Callable[..., Maintainer],
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
) -> None:
    name = f"across-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _push_source(url, name, tmp_path)
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    for i in range(6):  # stored layers of incompressible data: a pack of ~12 MiB
        (work / f"blob{i}.bin").write_bytes(rng.randbytes(2 * 1024 * 1024))
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"blob {i}"], cwd=work)
        run_git(["push", "-q", f"{url}/{name}.git", "main"], cwd=work)
    before = _manifest(compute, name)
    assert plan(before) is not None and len(before) == 7
    m = maintainer()  # interval 0: passes run only when the test asks

    paused, go = threading.Event(), threading.Event()
    bridge = _paused_bridge(compute.address, paused, go)
    slow_url = f"http://127.0.0.1:{bridge.server_address[1]}"
    clone = tmp_path / "clone.git"
    failure: list[BaseException] = []

    def clone_it() -> None:
        try:
            run_git(["clone", "-q", "--mirror", f"{slow_url}/{name}.git", str(clone)], cwd=tmp_path)
        except BaseException as e:
            failure.append(e)

    cloning = threading.Thread(target=clone_it)
    cloning.start()
    try:
        assert paused.wait(60), "the clone never reached its pack"
        _on_loop(compute, m.run_once)  # compacts (and sweeps) while the pack is held
        after = _manifest(compute, name)
        assert m.counters.compactions >= 1 and len(after) < len(before), (before, after)
        assert plan(after) is None
        # The replaced files stay until the retention (and their upload window) passed.
        for e in before:
            if e.kind is LayerKind.STORED and e.key is not None:
                key = layer_key(name, e.key)
                assert _on_loop(compute, lambda k=key: m.store.head(k)) is not None, key
    finally:
        go.set()
        cloning.join(120)
        bridge.shutdown()
        bridge.server_close()
    assert not failure, failure
    run_git(["fsck", "--strict", "--no-progress"], cwd=clone)
    assert list_refs(clone)[b"refs/heads/main"] == run_git(["rev-parse", "HEAD"], cwd=work).strip()
    for i in range(6):
        blob = run_git(["cat-file", "blob", f"main:blob{i}.bin"], cwd=clone)
        assert blob == (work / f"blob{i}.bin").read_bytes()


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_one_compute_maintains_at_a_time_and_a_released_lease_is_taken_over(
    compute: Any,
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _push_source(url, name, tmp_path)
    store = open_store(f"file://{tmp_path / 'store'}")
    a, b = (
        _on_loop(compute, lambda h=holder: Maintainer(compute.host, store, h, compute.host.clock))
        for holder in ("compute-a", "compute-b")
    )
    for i in range(3):
        _on_loop(compute, a.run_once)
        _on_loop(compute, b.run_once)
        (work / f"f{i}").write_text(f"{i}\n")
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"{i}"], cwd=work)
        run_git(["push", "-q", f"{url}/{name}.git", "main"], cwd=work)
    _on_loop(compute, a.run_once)
    assert a.lease_holders() == {name: "compute-a@1"} and b.lease_holders() == {}
    assert a.counters.merges >= 3 and b.counters.merges == 0
    assert plan(_manifest(compute, name)) is None
    _on_loop(compute, a.stop)  # lets the lease go
    _on_loop(compute, b.run_once)
    assert b.lease_holders() == {name: "compute-b@2"} and a.lease_holders() == {}
