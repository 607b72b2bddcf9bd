"""A real gRPC Compute double on 127.0.0.1 and gitproto served by uvicorn in a thread."""
# ruff: noqa: N802 (servicer methods are named after the RPCs)

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from enroute_core.base.errors import ERROR_TABLE
from enroute_gitproto.app import GitprotoApp
from enroute_gitproto.githttp import GitHttpLimits
from enroute_gitproto.main import bind, serve
from enroute_proto import error_detail_metadata
from enroute_proto.gen.enroute.common.v1 import common_pb2
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc

OID_A = bytes(range(20))
OID_B = bytes(range(1, 21))


def abort(context: Any, code: str, message: str, details: dict[str, Any] | None = None) -> None:
    context.set_trailing_metadata(error_detail_metadata(code, message, json.dumps(details or {})))
    context.abort(getattr(grpc.StatusCode, ERROR_TABLE[code].grpc_status), message)


class FakeCompute(compute_pb2_grpc.ComputeServicer):
    """Answers from a dict of repositories; echoes Git bodies so tests see what arrived."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.repos: dict[str, compute_pb2.CreateRepositoryRequest] = {}
        self.headers: list[compute_pb2.GitRequestHeader] = []
        self.bodies: list[bytes] = []

    def _git(self, requests: Iterator[compute_pb2.GitRequest], context: Any, rpc: str) -> Any:
        first = next(requests)
        assert first.WhichOneof("part") == "header"
        self.headers.append(first.header)
        repo = first.header.repo
        body = b"".join(r.body for r in requests)
        if repo.startswith("missing"):
            abort(context, "not_found", f"repository {repo!r} does not exist")
        if repo.startswith("bad"):
            abort(context, "invalid_pack", "pack header is garbage")
        self.bodies.append(body)
        if repo.startswith("typed"):
            yield compute_pb2.GitResponse(
                header=compute_pb2.GitResponseHeader(content_type="application/x-custom")
            )
        reply = f"{self.name}:{rpc}:{first.header.service}:{first.header.git_protocol}:".encode()
        yield compute_pb2.GitResponse(body=reply)
        if body:
            yield compute_pb2.GitResponse(body=body)
        if repo.startswith("broken"):
            abort(context, "internal", "disk on fire")

    def InfoRefs(self, request_iterator: Any, context: Any) -> Any:
        yield from self._git(request_iterator, context, "InfoRefs")

    def UploadPack(self, request_iterator: Any, context: Any) -> Any:
        yield from self._git(request_iterator, context, "UploadPack")

    def ReceivePack(self, request_iterator: Any, context: Any) -> Any:
        yield from self._git(request_iterator, context, "ReceivePack")

    def _state(self, name: str) -> common_pb2.RepositoryState:
        branch = self.repos[name].default_branch or b"refs/heads/main"
        if not branch.startswith(b"refs/"):
            branch = b"refs/heads/" + branch
        state = common_pb2.RepositoryState(name=name, incarnation=1, head=branch, head_kept=True)
        if name.startswith("pushed"):
            state.last_push_us = 1_796_230_131_123_456
        return state

    def CreateRepository(self, request: Any, context: Any) -> Any:
        created = request.repo not in self.repos
        if created:
            self.repos[request.repo] = request
        return compute_pb2.CreateRepositoryResponse(
            repository=self._state(request.repo), created=created
        )

    def GetRepository(self, request: Any, context: Any) -> Any:
        if request.repo not in self.repos:
            abort(context, "not_found", f"no repository {request.repo!r}")
        return compute_pb2.GetRepositoryResponse(repository=self._state(request.repo))

    def ListRepositories(self, request: Any, context: Any) -> Any:
        names = sorted(n for n in self.repos if n > request.page_token)
        limit = request.limit or 100
        page = names[:limit]
        token = page[-1] if len(names) > limit else ""
        return compute_pb2.ListRepositoriesResponse(
            repositories=[self._state(n) for n in page], next_page_token=token
        )

    def DeleteRepository(self, request: Any, context: Any) -> Any:
        self.repos.pop(request.repo, None)
        return compute_pb2.DeleteRepositoryResponse()

    def ListRefs(self, request: Any, context: Any) -> Any:
        if request.repo not in self.repos:
            abort(context, "not_found", f"no repository {request.repo!r}")
        yield compute_pb2.ListRefsResponse(
            refs=[common_pb2.Ref(name=b"refs/heads/a", oid=OID_A, set_time_us=1)]
        )
        yield compute_pb2.ListRefsResponse(
            refs=[common_pb2.Ref(name=b"refs/heads/main", oid=OID_B, set_time_us=2_500_000)]
        )

    def CreateCommit(self, request: Any, context: Any) -> Any:
        if request.repo not in self.repos:
            abort(context, "not_found", f"no repository {request.repo!r}")
        if request.HasField("expected_oid") and request.expected_oid != OID_B:
            abort(context, "stale_ref", "branch moved", {"current_oid": OID_B.hex()})
        for change in request.changes:
            if change.path.startswith(b".git"):
                abort(context, "invalid_path", "path through .git", {"path": change.path.decode()})
        return compute_pb2.CreateCommitResponse(oid=OID_A, tree=OID_B)


class ComputeServer:
    def __init__(self, name: str) -> None:
        self.fake = FakeCompute(name)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        compute_pb2_grpc.add_ComputeServicer_to_server(self.fake, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()


def dead_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


class Gitproto:
    """GitprotoApp on a real socket, served by uvicorn on a loop in a thread."""

    def __init__(self, app: GitprotoApp) -> None:
        self.app = app
        sock = bind("127.0.0.1", 0)
        ops_sock = bind("127.0.0.1", 0)
        self.loop = asyncio.new_event_loop()
        self.stop_event = asyncio.Event()
        ready = threading.Event()
        self.address = ""
        self.ops_address = ""
        """listen.ops: /metrics and /status."""

        def on_ready(where: str) -> None:
            self.address, _, self.ops_address = where.partition(" ops=")
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            served = serve(app, sock, on_ready, self.stop_event, ops_sock=ops_sock)
            self.loop.run_until_complete(served)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(10)


@pytest.fixture
def computes() -> Iterator[list[ComputeServer]]:
    servers = [ComputeServer("c0"), ComputeServer("c1")]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def make_gitproto() -> Iterator[Callable[..., Gitproto]]:
    started: list[Gitproto] = []

    def start(members: list[str], **kwargs: Any) -> Gitproto:
        limits = kwargs.pop("limits", GitHttpLimits())
        server = Gitproto(GitprotoApp(members, limits=limits, **kwargs))
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def gitproto(computes: list[ComputeServer], make_gitproto: Callable[..., Gitproto]) -> Gitproto:
    return make_gitproto([computes[0].address], anonymous="write")


@pytest.fixture
def unused_address() -> str:
    return dead_address()
