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

A batch holds every group's messages of one Ready round for the peer, so its
size has no bound of its own (many groups each appending a large entry).
Each stream write carries at most :data:`MERGE_BYTES_MAX` of entries, or one
message over it: a larger batch goes out in pieces (:func:`split_batch`).
One message is at most one entry over Raft's ``msg_bytes_max``, and one
entry at most a log record, within the ``rpc_message_bytes_max`` limit both
ends enforce (docs/rpc.md, "Message size").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import NodeId
from enroute_core.base.limits import DEFAULT_LIMITS
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
"""Bounds of one stream write: batches merged into one, or the pieces of a split one."""


def _message_bytes(gm: GroupMessage) -> int:
    return sum(len(e.data) for e in gm.message.entries)


def _entry_bytes(batch: Batch) -> int:
    return sum(_message_bytes(gm) for gm in batch.messages)


def split_batch(batch: Batch, bytes_max: int = MERGE_BYTES_MAX) -> list[Batch]:
    """``batch`` as pieces in order, each with at most ``bytes_max`` of entries or one
    message; the heartbeats and responses ride in the last piece, so the receiver steps
    everything in the order one batch would have it (messages, heartbeats, responses)."""
    pieces: list[Batch] = []
    start = size = 0
    messages = batch.messages
    for i, gm in enumerate(messages):
        more = _message_bytes(gm)
        if i > start and size + more > bytes_max:
            pieces.append(Batch(batch.from_node, batch.to_node, messages[start:i]))
            start, size = i, 0
        size += more
    if not pieces:
        return [batch]
    last = Batch(
        batch.from_node,
        batch.to_node,
        messages[start:],
        batch.heartbeats,
        batch.heartbeat_responses,
    )
    return [*pieces, last]


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
        message_bytes_max: int = DEFAULT_LIMITS.rpc_message_bytes_max,
    ) -> None:
        self.mr = mr
        self.addresses = addresses
        self._message_bytes_max = message_bytes_max
        self._wake = wake
        self._queues: dict[NodeId, asyncio.Queue[tuple[float, Batch]]] = {
            n: asyncio.Queue(QUEUE_MAX) for n in addresses
        }
        self._snaps: dict[NodeId, asyncio.Queue[GroupMessage]] = {
            n: asyncio.Queue(SNAPSHOTS_QUEUED_MAX) for n in addresses
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._links: dict[NodeId, tuple[asyncio.Task[None], asyncio.Task[None]]] = {}
        self.dropped = 0
        self.snapshots_sent = 0
        self.snapshots_failed = 0
        self.queue_seconds = 0.0
        """Time batches waited in their peer's queue (the event loop's clock)."""
        self.write_seconds = 0.0
        """Time spent writing batches to their streams."""
        self._time = asyncio.get_running_loop().time

    def _open(self, node: NodeId) -> grpc.aio.Channel:
        return open_channel(self.addresses[node], message_bytes_max=self._message_bytes_max)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for node in self.addresses:
            link = (loop.create_task(self._run(node)), loop.create_task(self._run_snapshots(node)))
            self._links[node] = link
            self._tasks.extend(link)

    def set_peers(self, addresses: dict[NodeId, str]) -> None:
        """Follow a membership change: links to new voters open, links to removed ones
        close (docs/raft.md, "Membership changes"); a known voter keeps its link."""
        loop = asyncio.get_running_loop()
        for node, address in addresses.items():
            if node in self._queues:
                continue
            self.addresses[node] = address
            self._queues[node] = asyncio.Queue(QUEUE_MAX)
            self._snaps[node] = asyncio.Queue(SNAPSHOTS_QUEUED_MAX)
            if self._tasks:  # started: a new voter gets its link at once
                self._links[node] = (
                    loop.create_task(self._run(node)),
                    loop.create_task(self._run_snapshots(node)),
                )
        for node in [n for n in self._queues if n not in addresses]:
            del self._queues[node], self._snaps[node], self.addresses[node]
            for t in self._links.pop(node, ()):
                t.cancel()

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
            channel = self._open(node)
            try:
                call = ledger_pb2_grpc.RaftTransportStub(channel).Send()
                carry: tuple[float, Batch] | None = None
                while True:
                    queued, batch = carry if carry is not None else await q.get()
                    batch, carry = merge_queued(batch, q)
                    t = self._time()
                    self.queue_seconds += t - queued
                    for piece in split_batch(batch):
                        await call.write(batch_to_proto(piece))
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
        channel = self._open(node)
        try:
            stub = ledger_pb2_grpc.RaftTransportStub(channel)
            while True:
                gm = await sq.get()
                ok = False
                # written through the call, not handed over as an iterator: gRPC's task
                # that consumes an iterator outlives a call that failed (the peer went),
                # and asyncio logged it as an ERROR ("Task was destroyed but it is pending")
                call = stub.SendSnapshot(timeout=SNAPSHOT_TIMEOUT_S)
                try:
                    for chunk in snapshot_chunks(self.mr.id, gm):
                        await call.write(chunk)
                    await call.done_writing()
                    await call
                    ok = True
                except asyncio.CancelledError:
                    call.cancel()
                    raise
                except Exception as e:  # refused, timed out, link lost: the leader retries
                    call.cancel()
                    log.warning("snapshot of %r to node %s failed: %r", gm.group, node, e)
                self._report(gm, node, ok=ok)
        finally:
            await channel.close()

    async def close(self) -> None:
        self._tasks = [t for link in self._links.values() for t in link]
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
