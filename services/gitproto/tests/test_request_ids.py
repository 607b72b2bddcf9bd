"""One request id per push and per API commit, the same on every compute tried.

docs/rpc.md, "Request ids": a compute that took the request and failed
(UNAVAILABLE) may have applied it; the next compute must propose under the same
id, so the ledger answers the replay with the first outcome. An API commit's
times are fixed once, so every compute builds the same commit.
"""

# ruff: noqa: N802 (servicer methods are named after the RPCs)
from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_gitproto.routing import rendezvous_order
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_proto.request_id import find_request_id

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import FakeCompute  # noqa: E402
from test_api import call  # noqa: E402
from test_githttp import request  # noqa: E402


class Recording(FakeCompute):
    """Records the request id of every write; with ``fail`` it answers UNAVAILABLE
    after reading the request, as a compute that died after committing."""

    def __init__(self, name: str, fail: bool) -> None:
        super().__init__(name)
        self.fail = fail
        self.ids: list[bytes | None] = []
        self.times: list[int] = []

    def ReceivePack(self, request_iterator: Any, context: Any) -> Any:
        self.ids.append(find_request_id(context.invocation_metadata()))
        if self.fail:
            list(request_iterator)
            context.abort(grpc.StatusCode.UNAVAILABLE, "went away")
        yield from super().ReceivePack(request_iterator, context)

    def CreateCommit(self, request: Any, context: Any) -> Any:
        self.ids.append(find_request_id(context.invocation_metadata()))
        self.times.append(request.author.time_us)
        assert not request.HasField("committer")
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "went away")
        return super().CreateCommit(request, context)


@pytest.fixture
def pair() -> Iterator[tuple[list[str], Recording, Recording]]:
    fakes = (Recording("c0", fail=True), Recording("c1", fail=False))
    servers, addresses = [], []
    for fake in fakes:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        compute_pb2_grpc.add_ComputeServicer_to_server(fake, server)
        addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        server.start()
        servers.append(server)
    yield addresses, fakes[0], fakes[1]
    for server in servers:
        server.stop(0).wait()


def _owned_by(members: list[str], owner: str) -> str:
    return next(
        n for n in (f"r{i}" for i in range(1000)) if rendezvous_order(n, members)[0] == owner
    )


def test_a_push_replayed_on_the_next_compute_keeps_its_id(
    pair: tuple[list[str], Recording, Recording], make_gitproto: Any
) -> None:
    members, first, second = pair
    server = make_gitproto(members, anonymous="write")
    name = _owned_by(members, members[0])
    for _ in range(2):
        status, _, body = request(server.address, "POST", f"/{name}.git/git-receive-pack", b"p")
        assert status == 200 and body.startswith(b"c1:ReceivePack:")
    assert len(first.ids) == len(second.ids) == 2
    assert first.ids == second.ids  # each request: one id on both computes
    assert first.ids[0] != first.ids[1] and all(i is not None for i in first.ids)


def test_an_api_commit_replayed_keeps_its_id_and_its_time(
    pair: tuple[list[str], Recording, Recording], make_gitproto: Any
) -> None:
    members, first, second = pair
    server = make_gitproto(members, anonymous="write")
    name = _owned_by(members, members[0])
    second.repos[name] = compute_pb2.CreateRepositoryRequest(repo=name)
    commit = {"branch": "main", "message": "m", "author": {"name": "A", "email": "a@e.org"},
              "changes": []}  # fmt: skip
    status, _, _ = call(server.address, "POST", f"/api/v1/repos/{name}/-/commits", commit)
    assert status == 201
    assert first.ids == second.ids and first.ids[0] is not None
    assert first.times == second.times and first.times[0] > 0
