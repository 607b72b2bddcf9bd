"""A draining compute refuses Git streams as UNAVAILABLE, every time (docs/reliability.md).

gitproto fails over to the next compute on UNAVAILABLE only. A stream the
server aborts while its caller is still sending ends, about one time in three
on this gRPC, as INTERNAL ("Internal error from Core"): gitproto then answered
HTTP 500 to a push or a clone that the other compute would have served (seen
in tests/cluster/test_drain_drill.py). The compute's call gate
(``enroute_compute.main.CallGate``) now reads the refused stream first (up to
``REFUSAL_READ_BYTES_MAX``). Real gRPC server and channel on 127.0.0.1, the
real gate, the Compute messages; streams of 0 to 6 body messages, some sent
with pauses, as gitproto relays a body as it arrives.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

import grpc

from enroute_compute.http import ComputeMetrics
from enroute_compute.main import CallGate
from enroute_proto.gen.enroute.compute.v1 import compute_pb2

STREAMS = 150


async def _echo(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for r in requests:
        yield compute_pb2.GitResponse(body=r.body)


class _Handlers(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> Any:
        return grpc.stream_stream_rpc_method_handler(
            _echo,
            request_deserializer=compute_pb2.GitRequest.FromString,
            response_serializer=compute_pb2.GitResponse.SerializeToString,
        )


async def _refusals() -> tuple[collections.Counter[str], CallGate]:
    gate = CallGate(ComputeMetrics())
    server = grpc.aio.server(interceptors=[gate])
    server.add_generic_rpc_handlers((_Handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    gate.drain.start()
    seen: collections.Counter[str] = collections.Counter()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.stream_stream(
                "/enroute.compute.v1.Compute/ReceivePack",
                request_serializer=compute_pb2.GitRequest.SerializeToString,
                response_deserializer=compute_pb2.GitResponse.FromString,
            )
            for i in range(STREAMS):

                async def requests(i: int = i) -> AsyncIterator[compute_pb2.GitRequest]:
                    yield compute_pb2.GitRequest(header=compute_pb2.GitRequestHeader(repo="r"))
                    for _ in range(i % 7):
                        yield compute_pb2.GitRequest(body=b"x" * 100)
                        if i % 3 == 0:
                            await asyncio.sleep(0.001)

                call = method(requests())
                try:
                    while await call.read() is not grpc.aio.EOF:
                        pass
                    seen["answered"] += 1
                except grpc.aio.AioRpcError as error:
                    seen[f"{error.code().name}: {error.details()}"] += 1
    finally:
        await server.stop(0)
    return seen, gate


def test_every_stream_a_draining_compute_gets_is_refused_as_unavailable() -> None:
    seen, gate = asyncio.run(_refusals())
    assert seen == {"UNAVAILABLE: compute is stopping; try another member": STREAMS}, seen
    assert gate.drain.in_flight == 0
