"""A compute that restarts is reached again at once, not after gRPC's reconnect backoff.

Real gRPC on 127.0.0.1: a Compute server that is down while calls are tried
(so the channel backs off), then comes up on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """Without the ready wait, calls succeed again within the bounded backoff."""
    async with _restarted_compute(ready_wait_s=0.0) as pool:
        deadline = time.monotonic() + RECONNECT_MAX_MS / 1000 * 1.2 + 0.5
        while True:
            try:
                await pool.call("r", _get)
                break
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline, "still backing off after the bound"
                await asyncio.sleep(0.02)


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
