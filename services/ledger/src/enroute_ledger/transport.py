"""Outgoing Raft traffic: one client stream per peer (docs/rpc.md, RaftTransport).

Each peer gets a bounded queue and a task that keeps one ``Send`` stream open,
writing every batch for it. A failed or ended stream reports the peer
unreachable to the multi-Raft layer and reconnects with backoff; batches
queued meanwhile may be dropped, which Raft tolerates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import NodeId
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2_grpc

from .multiraft import Batch, MultiRaft
from .rpc.convert import batch_to_proto

log = logging.getLogger("enroute.ledger.transport")
QUEUE_MAX = 1024


class GrpcTransport:
    def __init__(self, mr: MultiRaft, addresses: dict[NodeId, str]) -> None:
        self.mr = mr
        self.addresses = addresses
        self._queues: dict[NodeId, asyncio.Queue[Batch]] = {
            n: asyncio.Queue(QUEUE_MAX) for n in addresses
        }
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0

    def start(self) -> None:
        for node in self.addresses:
            self._tasks.append(asyncio.get_running_loop().create_task(self._run(node)))

    def send(self, batch: Batch) -> None:
        q = self._queues.get(batch.to_node)
        if q is None:
            return
        try:
            q.put_nowait(batch)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _run(self, node: NodeId) -> None:
        q = self._queues[node]
        backoff = 0.05
        while True:
            channel = grpc.aio.insecure_channel(self.addresses[node])
            try:
                call = ledger_pb2_grpc.RaftTransportStub(channel).Send()
                while True:
                    batch = await q.get()
                    await call.write(batch_to_proto(batch))
                    for gm in batch.messages:  # snapshots travel inline; report them
                        if gm.message.snapshot is not None:
                            with contextlib.suppress(EnrouteError):
                                self.mr.report_snapshot(gm.group, node, ok=True)
                    backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure of a link means: reconnect
                log.debug("link to node %s failed: %r", node, e)
            finally:
                await channel.close()
            with contextlib.suppress(EnrouteError):
                self.mr.report_node_unreachable(node)
            while not q.empty():
                q.get_nowait()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
