"""Shared fixtures: a Compute gRPC server on 127.0.0.1 in a background event loop, a real
ledger process, and a test-only smart-HTTP bridge that turns git's HTTP requests into
Compute streams (the real ingress is gitproto's)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import grpc
import pytest

from enroute_compute.host import RepositoryHost
from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.ledger_port import LedgerPort
from enroute_compute.main import SystemClock
from enroute_compute.rpc.servicer import ComputeServicer
from enroute_core.base.errors import ERROR_TABLE
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import open_store
from enroute_proto import find_error_detail
from enroute_proto.channels import server_options
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.env import service_env
from enroute_testing.local_ledger import LocalLedger

ROOT = Path(__file__).resolve().parents[3]
LEDGER_MAIN = ROOT / "services/ledger/src/enroute_ledger/__main__.py"
SERVICES = {"git-upload-pack": 1, "git-receive-pack": 2}


@dataclass
class ComputeServer:
    address: str
    host: RepositoryHost
    loop: asyncio.AbstractEventLoop

    def call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def ledger_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ledger (one voter) on 127.0.0.1; its gRPC address."""
    if not LEDGER_MAIN.exists():
        pytest.skip("services/ledger has no enroute_ledger/__main__.py yet")
    data = tmp_path_factory.mktemp("ledger")
    config = data / "ledger.yaml"
    config.write_text(
        f"node:\n  id: '1'\n  data_dir: {data / 'node'}\n"
        f"store:\n  url: file://{data / 'store'}\n"
        "listen:\n  grpc: 127.0.0.1:0\n  http: 127.0.0.1:0\n"
    )
    log = data / "ledger.stderr"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "enroute_ledger", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=service_env(PYTHONUNBUFFERED="1"),
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "ready" not in line:
        proc.kill()
        proc.wait()
        tail = log.read_text(errors="replace")[-1500:]
        pytest.fail(f"the ledger process did not start ({line!r}); its stderr:\n{tail}")
    yield line.split("grpc=")[1].split()[0]
    proc.terminate()
    proc.wait(10)


@pytest.fixture(params=["local-ledger", "grpc-ledger"])
def compute(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ComputeServer]:
    address = request.getfixturevalue("ledger_process") if "grpc" in request.param else None
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, object] = {}

    async def start() -> None:
        store = open_store(f"file://{tmp_path / 'store'}")
        layers = LayerService(store, tmp_path / "compute")
        ledger: LedgerPort = LocalLedger() if address is None else GrpcLedger((address,))
        host = RepositoryHost(ledger, layers, SystemClock(), inline_max_bytes=16 * 1024)
        # The production server's message bound (main.py), so tests see what it allows.
        server = grpc.aio.server(options=server_options(DEFAULT_LIMITS.rpc_message_bytes_max))
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
    host = box["host"]
    assert isinstance(host, RepositoryHost)
    yield ComputeServer(f"127.0.0.1:{box['port']}", host, loop)

    async def stop() -> None:
        await host.close()
        await host.ledger.close()
        server = box["server"]
        assert isinstance(server, grpc.aio.Server)
        await server.stop(0)
        layers = box["layers"]
        assert isinstance(layers, LayerService)
        await layers.close()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def http_bridge(address: str) -> ThreadingHTTPServer:
    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(address))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _body(self) -> Iterator[bytes]:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    yield self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            elif n := int(self.headers.get("Content-Length") or 0):
                yield self.rfile.read(n)

        def _serve(self, method: str, service: str, body: Iterator[bytes]) -> None:
            path = (
                urlsplit(self.path).path.lstrip("/").rsplit("/", 2 if method == "InfoRefs" else 1)
            )
            header = compute_pb2.GitRequestHeader(
                repo=path[0].removesuffix(".git"),
                service=SERVICES[service],  # type: ignore[arg-type]
                git_protocol=self.headers.get("Git-Protocol", ""),
                content_encoding=self.headers.get("Content-Encoding", ""),
            )
            msgs = [compute_pb2.GitRequest(header=header)]
            msgs += [compute_pb2.GitRequest(body=b) for b in body]
            try:
                replies = iter(getattr(stub, method)(iter(msgs)))
                first = next(replies)
            except grpc.RpcError as e:
                detail = find_error_detail(e.trailing_metadata())  # type: ignore[arg-type]
                status = ERROR_TABLE[detail.code].http_status if detail else 500
                self.send_error(status, detail.message if detail else str(e))
                return
            self.send_response(200)
            self.send_header("Content-Type", first.header.content_type)
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for reply in replies:
                self.wfile.write(reply.body)

        def do_GET(self) -> None:
            service = parse_qs(urlsplit(self.path).query)["service"][0]
            self._serve("InfoRefs", service, iter(()))

        def do_POST(self) -> None:
            service = urlsplit(self.path).path.rsplit("/", 1)[1]
            method = "UploadPack" if service == "git-upload-pack" else "ReceivePack"
            self._serve(method, service, self._body())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def git_bridge() -> Iterator[Callable[[str], ThreadingHTTPServer]]:
    """Start bridges to Compute addresses; all are shut down after the test."""
    started: list[ThreadingHTTPServer] = []

    def start(address: str) -> ThreadingHTTPServer:
        server = http_bridge(address)
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()
