"""A compute that restarts is reached again at once, not after gRPC's reconnect backoff.

Real gRPC on 127.0.0.1: a Compute server that is down while calls are tried
(so the channel backs off), then comes up on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from enroute_gitproto.routing import ComputePool
from enroute_proto.channels import RECONNECT_MAX_MS
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.ports import free_port


class _Compute(compute_pb2_grpc.ComputeServicer):
    async def GetRepository(  # noqa: N802 (gRPC method name)
        self, request: compute_pb2.GetRepositoryRequest, context: grpc.aio.ServicerContext
    ) -> compute_pb2.GetRepositoryResponse:
        return compute_pb2.GetRepositoryResponse()


async def _serve(port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    compute_pb2_grpc.add_ComputeServicer_to_server(_Compute(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def _get(stub: compute_pb2_grpc.ComputeAsyncStub) -> compute_pb2.GetRepositoryResponse:
    return await stub.GetRepository(compute_pb2.GetRepositoryRequest(), timeout=5.0)


async def _back_off(pool: ComputePool, seconds: float) -> None:
    """Calls while the compute is down: the channel fails and backs off."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await pool.call("r", _get)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


@contextlib.asynccontextmanager
async def _restarted_compute(ready_wait_s: float) -> AsyncIterator[ComputePool]:
    """A pool whose one compute was down for 4 s of calls (its channel backed off) and is
    now up again on the same port."""
    port = free_port()
    pool = ComputePool([f"127.0.0.1:{port}"], ready_wait_s=0.2)
    try:
        await _back_off(pool, 4.0)
        server = await _serve(port)
        pool.ready_wait_s = ready_wait_s
        try:
            yield pool
        finally:
            await server.stop(None)
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_call_waits_for_a_restarting_compute() -> None:
    async with _restarted_compute(ready_wait_s=3.0) as pool:
        started = time.monotonic()
        await pool.call("r", _get)  # would fail at once inside a default backoff
        assert time.monotonic() - started < 3.0


@pytest.mark.asyncio
async def test_reconnect_backoff_is_bounded() -> None:
    """A peer that takes connections and closes them at once (a proxy whose upstream is
    down) is tried again at least every RECONNECT_MAX_MS: in 5 s of calls, gRPC's default
    backoff (1 s growing 1.6x, jittered 20%) makes at most 4 attempts, ours at least 7."""
    attempts = 0
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen(64)
    listener.setblocking(False)

    async def accept() -> None:
        nonlocal attempts
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            attempts += 1
            conn.close()

    counting = asyncio.ensure_future(accept())
    pool = ComputePool([f"127.0.0.1:{listener.getsockname()[1]}"], ready_wait_s=0.0)
    try:
        await _back_off(pool, 5.0)
    finally:
        counting.cancel()
        listener.close()
        await pool.close()
    assert attempts >= 5_000 // RECONNECT_MAX_MS + 2, attempts


@pytest.mark.asyncio
async def test_all_members_down_fails_within_the_wait() -> None:
    pool = ComputePool([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"], ready_wait_s=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await pool.call("r", _get)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 5.0
        assert pool.failovers_total == 1  # the second member; neither connected, no second pass
    finally:
        await pool.close()
