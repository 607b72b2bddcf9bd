"""Seed 001, "Compute nodes": the compute side of a deletion, against a real ledger.

"A deletion reaches the subscription of a compute as a change that marks the
repository deleted. The compute drops the view and stops following. Later requests
activate the repository again and find nothing, or the new incarnation. A
subscription that ends without that change (E dropped on its ledger node) is
followed again. A state of another incarnation replaces the view instead of
updating it. The compute that asked for the deletion drops its view at once."

Two computes (A and B) serve the Compute gRPC service on 127.0.0.1, both on the one
real ledger process of the session. B may reach the ledger through a TCP proxy the
test can cut, so that B's subscription ends without the deletion reaching it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_compute.host import RepositoryHost
from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.main import SystemClock
from enroute_compute.rpc.servicer import ComputeServicer
from enroute_core.base.clock import Clock
from enroute_core.git.pktline import pkt_line
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import open_store
from enroute_proto import find_error_detail
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.waiting import wait_until

AUTHOR = compute_pb2.Signature(name=b"A U Thor", email=b"author@example.com")
WAIT_S = 15.0
_names = itertools.count()


@dataclass
class Compute:
    """One compute: a RepositoryHost behind a real gRPC server, in its own event loop."""

    address: str
    host: RepositoryHost
    loop: asyncio.AbstractEventLoop
    stub: compute_pb2_grpc.ComputeStub

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the compute's loop (the host is not thread-safe)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def hosted(self, name: str) -> Any:
        """The host's record of ``name`` (None when it keeps no view)."""
        return self.call(lambda: self.host._repos.get(name))


class TcpProxy:
    """Forwards 127.0.0.1 TCP connections to ``target``; ``cut()`` ends every one of them.

    While cut, new connections are closed at once, so gRPC calls through the proxy
    fail as unavailable; ``resume()`` lets them through again.
    """

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.loop = asyncio.new_event_loop()
        self.writers: set[asyncio.StreamWriter] = set()
        self.blocked = False
        ready = threading.Event()
        box: dict[str, Any] = {}

        async def start() -> None:
            server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
            box["port"] = server.sockets[0].getsockname()[1]
            box["server"] = server
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.server: asyncio.Server = box["server"]
        self.address = f"127.0.0.1:{box['port']}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}

    def _run(self, fn: Callable[[], None]) -> None:
        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def cut(self) -> None:
        def cut() -> None:
            self.blocked = True
            for w in list(self.writers):
                w.transport.abort()

        self._run(cut)

    def resume(self) -> None:
        def resume() -> None:
            self.blocked = False

        self._run(resume)

    def close(self) -> None:
        self.cut()
        self._run(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class GatedLedger:
    """The gRPC ledger with subscriptions that can be held: events wait while held."""

    def __init__(self, inner: GrpcLedger) -> None:
        self.inner = inner
        self.open = asyncio.Event()
        self.open.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    async def subscribe(self, name: str, incarnation: int, after: int) -> AsyncIterator[Any]:
        async for event in self.inner.subscribe(name, incarnation, after):
            await self.open.wait()
            yield event


def start_compute(ledger_address: str, store_dir: Path, data_dir: Path, clock: Clock) -> Any:
    """A compute on ``ledger_address``; returns (Compute, stop)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        layers = LayerService(open_store(f"file://{store_dir}"), data_dir)
        ledger = GatedLedger(GrpcLedger((ledger_address,)))
        host = RepositoryHost(ledger, layers, clock, wait_s=WAIT_S)
        server = grpc.aio.server()
        compute_pb2_grpc.add_ComputeServicer_to_server(ComputeServicer(host), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        box.update(server=server, host=host, layers=layers, port=port)
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    address = f"127.0.0.1:{box['port']}"
    channel = grpc.insecure_channel(address)
    node = Compute(address, box["host"], loop, compute_pb2_grpc.ComputeStub(channel))

    def stop() -> None:
        async def shutdown() -> None:
            await box["host"].close()
            await box["host"].ledger.close()
            await box["server"].stop(0)
            await box["layers"].close()

        channel.close()
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return node, stop


@pytest.fixture
def pair(ledger_process: str, tmp_path: Path) -> Iterator[tuple[Compute, Compute, TcpProxy]]:
    """Computes A (direct) and B (through a proxy) on one ledger and one store."""
    proxy = TcpProxy(ledger_process)
    a, stop_a = start_compute(ledger_process, tmp_path / "store", tmp_path / "a", SystemClock())
    b, stop_b = start_compute(proxy.address, tmp_path / "store", tmp_path / "b", SystemClock())
    yield a, b, proxy
    stop_b()
    stop_a()
    proxy.close()


def fresh(prefix: str) -> str:
    return f"deletion/{prefix}-{next(_names)}-{time.monotonic_ns()}"


def commit(c: Compute, repo: str, expected: bytes | None, files: dict[bytes, bytes]) -> bytes:
    request = compute_pb2.CreateCommitRequest(
        repo=repo,
        branch=b"main",
        message=b"change",
        author=AUTHOR,
        changes=[compute_pb2.FileChange(path=p, content=d) for p, d in files.items()],
    )
    if expected is not None:
        request.expected_oid = expected
    oid: bytes = c.stub.CreateCommit(request, timeout=WAIT_S).oid
    return oid


def refs(c: Compute, repo: str) -> dict[bytes, bytes]:
    chunks = c.stub.ListRefs(compute_pb2.ListRefsRequest(repo=repo), timeout=WAIT_S)
    return {r.name: r.oid for m in chunks for r in m.refs}


def error_code(fn: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    call: Any = info.value  # a failed call is also a grpc.Call
    detail = find_error_detail(call.trailing_metadata())
    return detail.code if detail is not None else str(call.code())


def fetch_want(c: Compute, repo: str, oid: bytes) -> bytes:
    """A protocol v2 fetch of ``oid`` over Compute.UploadPack: the whole answer."""
    body = (
        pkt_line(b"command=fetch\n")
        + b"0001"
        + pkt_line(b"want " + oid.hex().encode() + b"\n")
        + pkt_line(b"done\n")
        + b"0000"
    )
    header = compute_pb2.GitRequestHeader(
        repo=repo, service=compute_pb2.GIT_SERVICE_UPLOAD_PACK, git_protocol="version=2"
    )
    msgs = [compute_pb2.GitRequest(header=header), compute_pb2.GitRequest(body=body)]
    return b"".join(r.body for r in c.stub.UploadPack(iter(msgs), timeout=WAIT_S))


def served(c: Compute, repo: str, oid: bytes) -> bool:
    """Whether ``c`` sends a pack for a want of ``oid`` in ``repo``."""
    try:
        answer = fetch_want(c, repo, oid)
    except grpc.RpcError:
        return False
    return b"packfile\n" in answer and b"PACK" in answer


# -- the rules --------------------------------------------------------------------------


def test_a_deletion_reaching_a_subscription_drops_the_view_and_stops_following(
    pair: tuple[Compute, Compute, TcpProxy],
) -> None:
    """Seed 001: "A deletion reaches the subscription of a compute as a change that marks
    the repository deleted. The compute drops the view and stops following." B did not
    ask for the deletion: only its subscription tells it."""
    a, b, _ = pair
    name = fresh("reach")
    a.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    tip = commit(a, name, None, {b"f": b"one\n"})
    assert refs(b, name) == {b"refs/heads/main": tip}
    followed = b.hosted(name)
    assert followed is not None and followed.task is not None
    a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name))
    wait_until(lambda: b.hosted(name) is None, WAIT_S, "B drops its view")
    wait_until(followed.task.done, WAIT_S, "B's follower stops")
    assert followed.dead and followed.state.deleted
    assert isinstance(followed.error, Exception)
    # "Later requests activate the repository again and find nothing, or the new incarnation."
    assert error_code(lambda: refs(b, name)) == "not_found"
    assert b.hosted(name) is None
    a.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    assert refs(b, name) == {}
    assert b.hosted(name).state.incarnation == followed.state.incarnation + 1


def test_the_compute_that_asked_for_the_deletion_drops_its_view_at_once(
    pair: tuple[Compute, Compute, TcpProxy],
) -> None:
    """Seed 001: "The compute that asked for the deletion drops its view at once."

    B's subscription is held first, so the deletion cannot reach B through it: only
    the call can make B drop its view, and it must have when the call returns.
    """
    a, b, _ = pair
    name = fresh("asked")
    b.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    tip = commit(b, name, None, {b"f": b"one\n"})
    viewed = b.hosted(name)
    assert viewed is not None
    gate = b.host.ledger
    assert isinstance(gate, GatedLedger)
    b.call(gate.hold)
    b.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=WAIT_S)
    assert b.hosted(name) is None, "the asking compute still keeps a view"
    assert viewed.dead and not viewed.state.deleted  # dropped by the call, not the stream
    b.call(gate.release)
    assert not served(b, name, tip)
    assert error_code(lambda: refs(b, name)) == "not_found"
    assert error_code(lambda: refs(a, name)) == "not_found"


def test_a_subscription_that_ends_without_the_deletion_is_followed_again(
    pair: tuple[Compute, Compute, TcpProxy],
) -> None:
    """Seed 001: "A subscription that ends without that change (E dropped on its ledger
    node) is followed again." The proxy cuts B's stream; B keeps the same view and, once
    the ledger is reachable again, applies what A committed meanwhile, without a request."""
    a, b, proxy = pair
    name = fresh("again")
    a.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    first = commit(a, name, None, {b"f": b"one\n"})
    assert refs(b, name) == {b"refs/heads/main": first}
    viewed = b.hosted(name)
    version = viewed.state.version
    proxy.cut()
    second = commit(a, name, first, {b"f": b"two\n"})
    time.sleep(0.3)  # the point: B's follower fails to subscribe a few times meanwhile
    assert b.hosted(name) is viewed and not viewed.dead
    proxy.resume()
    wait_until(lambda: viewed.state.version > version, WAIT_S, "B follows again")
    assert b.hosted(name) is viewed, "the view was re-opened rather than followed again"
    assert viewed.state.refs[b"refs/heads/main"].oid == second
    assert not viewed.task.done()


def test_a_state_of_another_incarnation_replaces_the_view(
    pair: tuple[Compute, Compute, TcpProxy],
) -> None:
    """Seed 001: "A state of another incarnation replaces the view instead of updating
    it." B's stream is cut while the name is deleted and created again through A, so the
    deletion never reaches B: when B follows again, the ledger answers with a snapshot of
    E + 1, and nothing of E stays in B's view."""
    a, b, proxy = pair
    name = fresh("replace")
    a.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    old = commit(a, name, None, {b"old": b"only in E\n"})
    assert refs(b, name) == {b"refs/heads/main": old}
    viewed = b.hosted(name)
    incarnation = viewed.state.incarnation
    old_roots = {e.root for e in viewed.state.manifest}
    proxy.cut()
    a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name))
    a.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    new = commit(a, name, None, {b"new": b"only in E+1\n"})
    proxy.resume()
    wait_until(lambda: viewed.state.incarnation == incarnation + 1, WAIT_S, "B takes E + 1")
    wait_until(lambda: b"refs/heads/main" in viewed.state.refs, WAIT_S, "B reaches the commit")
    assert b.hosted(name) is viewed, "the view was dropped rather than replaced"
    assert viewed.state.refs[b"refs/heads/main"].oid == new
    assert not old_roots & set(viewed.readers), "a reader of E was kept"
    assert not old_roots & set(viewed.inline), "inline bytes of E were kept"
    assert viewed.view.contains(new) and not viewed.view.contains(old)
    assert refs(b, name) == {b"refs/heads/main": new}
    assert not served(b, name, old)
    assert served(b, name, new)


def test_delete_through_a_then_b_never_serves_the_old_incarnation(
    pair: tuple[Compute, Compute, TcpProxy],
) -> None:
    """Seed 001, "Compute nodes", with two computes: after a delete through A returns, B's
    next read answers not found or the new incarnation, never E, however soon it asks."""
    a, b, _ = pair
    name = fresh("two")
    a.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    tip = commit(a, name, None, {b"f": b"round 0\n"})
    for round_ in range(1, 6):
        assert refs(b, name) == {b"refs/heads/main": tip}  # B follows E
        a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name))
        assert error_code(lambda: refs(b, name)) == "not_found"
        assert not served(b, name, tip)
        a.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
        assert refs(b, name) == {}
        assert not served(b, name, tip)
        old = tip
        tip = commit(a, name, None, {b"f": f"round {round_}\n".encode()})
        assert refs(b, name) == {b"refs/heads/main": tip}
        assert not served(b, name, old), "B served an object of the old incarnation"


def test_reads_waiting_on_a_view_the_asking_compute_drops_answer_not_found_at_once(
    pair: tuple[Compute, Compute, TcpProxy],
) -> None:
    """Seed 001: "The compute that asked for the deletion drops its view at once." A read
    already waiting for B's view to catch up (B's subscription is held, so it never does)
    is answered not found as soon as B deletes, not after the view's wait runs out."""
    import concurrent.futures

    a, b, _ = pair
    name = fresh("waiter")
    b.stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
    first = commit(b, name, None, {b"f": b"one\n"})
    gate = b.host.ledger
    assert isinstance(gate, GatedLedger)
    b.call(gate.hold)
    try:
        commit(a, name, first, {b"f": b"two\n"})  # B's view is now behind the log
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(lambda: error_code(lambda: refs(b, name)))
            time.sleep(0.5)  # the point: the read waits (nothing to wait for but time)
            assert not waiting.done(), "the read did not wait for the view"
            started = time.monotonic()
            b.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=WAIT_S)
            assert waiting.result(WAIT_S) == "not_found"
            assert time.monotonic() - started < WAIT_S / 3
    finally:
        b.call(gate.release)
