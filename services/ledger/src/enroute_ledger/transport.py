"""Outgoing Raft traffic: one client stream per peer (docs/rpc.md, RaftTransport).

Each peer gets a bounded queue and a task that keeps one ``Send`` stream open,
writing every batch for it. A failed or ended stream reports the peer
unreachable to the multi-Raft layer and reconnects with backoff; batches
queued meanwhile may be dropped, which Raft tolerates.

Snapshots do not ride in batches: a repository's state can be far larger than
one gRPC message (4 MiB). Each SNAP message is taken out of its batch and sent
on its own ``SendSnapshot`` call in chunks (header, 1 MiB data chunks, SHA-256
trailer), one at a time per peer; the outcome is reported to the group
(``report_snapshot``), so a failed transfer is retried by the leader later.
Raft tolerates the reordering against the peer's ``Send`` stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import NodeId
from enroute_proto.channels import open_channel
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2_grpc

from .multiraft import Batch, GroupMessage, MultiRaft
from .rpc.convert import batch_to_proto, snapshot_chunks

log = logging.getLogger("enroute.ledger.transport")
QUEUE_MAX = 1024
SNAPSHOTS_QUEUED_MAX = 64
"""Snapshots waiting per peer; more are reported failed at once (the leader retries)."""
SNAPSHOT_TIMEOUT_S = 120.0
"""One snapshot transfer at most (64 MiB at about 0.5 MiB/s)."""
MERGE_MESSAGES_MAX = 512
MERGE_BYTES_MAX = 1 << 20
"""Bounds of batches merged into one stream write (a gRPC message is at most 4 MiB)."""


def _entry_bytes(batch: Batch) -> int:
    return sum(len(e.data) for gm in batch.messages for e in gm.message.entries)


def merge_queued(
    batch: Batch, q: asyncio.Queue[tuple[float, Batch]]
) -> tuple[Batch, tuple[float, Batch] | None]:
    """``batch`` and the batches queued behind it, as one, while that keeps their order;
    and the batch taken from the queue that did not fit (to be written next).

    The receiver steps a batch's messages, then its heartbeats, then the heartbeat
    responses; so a batch is merged with the next only while what was merged so far
    carries no heartbeat or response (one write per batch cost most of a leader's
    send time under load).
    """
    size = _entry_bytes(batch)
    while not q.empty() and not batch.heartbeats and not batch.heartbeat_responses:
        item = q.get_nowait()
        nxt = item[1]
        more = _entry_bytes(nxt)
        if (
            len(batch.messages) + len(nxt.messages) > MERGE_MESSAGES_MAX
            or size + more > MERGE_BYTES_MAX
        ):
            return batch, item
        size += more
        batch = Batch(
            batch.from_node,
            batch.to_node,
            batch.messages + nxt.messages,
            nxt.heartbeats,
            nxt.heartbeat_responses,
        )
    return batch, None


class GrpcTransport:
    def __init__(
        self,
        mr: MultiRaft,
        addresses: dict[NodeId, str],
        *,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.mr = mr
        self.addresses = addresses
        self._wake = wake
        self._queues: dict[NodeId, asyncio.Queue[tuple[float, Batch]]] = {
            n: asyncio.Queue(QUEUE_MAX) for n in addresses
        }
        self._snaps: dict[NodeId, asyncio.Queue[GroupMessage]] = {
            n: asyncio.Queue(SNAPSHOTS_QUEUED_MAX) for n in addresses
        }
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0
        self.snapshots_sent = 0
        self.snapshots_failed = 0
        self.queue_seconds = 0.0
        """Time batches waited in their peer's queue (the event loop's clock)."""
        self.write_seconds = 0.0
        """Time spent writing batches to their streams."""
        self._time = asyncio.get_running_loop().time

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for node in self.addresses:
            self._tasks.append(loop.create_task(self._run(node)))
            self._tasks.append(loop.create_task(self._run_snapshots(node)))

    def send(self, batch: Batch) -> None:
        q = self._queues.get(batch.to_node)
        if q is None:
            return
        if any(gm.message.snapshot is not None for gm in batch.messages):
            batch = self._take_snapshots(batch)
        try:
            q.put_nowait((self._time(), batch))
        except asyncio.QueueFull:
            self.dropped += 1

    def _take_snapshots(self, batch: Batch) -> Batch:
        sq = self._snaps[batch.to_node]
        rest: list[GroupMessage] = []
        for gm in batch.messages:
            if gm.message.snapshot is None:
                rest.append(gm)
                continue
            try:
                sq.put_nowait(gm)
            except asyncio.QueueFull:
                self._report(gm, batch.to_node, ok=False)
        return Batch(
            batch.from_node,
            batch.to_node,
            tuple(rest),
            batch.heartbeats,
            batch.heartbeat_responses,
        )

    def _report(self, gm: GroupMessage, node: NodeId, *, ok: bool) -> None:
        if ok:
            self.snapshots_sent += 1
        else:
            self.snapshots_failed += 1
        with contextlib.suppress(EnrouteError):  # the group may be gone meanwhile
            self.mr.report_snapshot(gm.group, node, ok=ok)
        if self._wake is not None:
            self._wake()

    async def _run(self, node: NodeId) -> None:
        q = self._queues[node]
        backoff = 0.05
        while True:
            channel = open_channel(self.addresses[node])
            try:
                call = ledger_pb2_grpc.RaftTransportStub(channel).Send()
                carry: tuple[float, Batch] | None = None
                while True:
                    queued, batch = carry if carry is not None else await q.get()
                    batch, carry = merge_queued(batch, q)
                    t = self._time()
                    self.queue_seconds += t - queued
                    await call.write(batch_to_proto(batch))
                    self.write_seconds += self._time() - t
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

    async def _run_snapshots(self, node: NodeId) -> None:
        """One chunked SendSnapshot call at a time to ``node``; each outcome reported."""
        sq = self._snaps[node]
        channel = open_channel(self.addresses[node])
        try:
            stub = ledger_pb2_grpc.RaftTransportStub(channel)
            while True:
                gm = await sq.get()
                ok = False
                try:
                    chunks = snapshot_chunks(self.mr.id, gm)
                    await stub.SendSnapshot(chunks, timeout=SNAPSHOT_TIMEOUT_S)
                    ok = True
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # refused, timed out, link lost: the leader retries
                    log.warning("snapshot of %r to node %s failed: %r", gm.group, node, e)
                self._report(gm, node, ok=ok)
        finally:
            await channel.close()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
