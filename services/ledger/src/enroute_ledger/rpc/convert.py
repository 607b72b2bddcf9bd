"""Protobuf <-> domain values; protobuf types stop here (services.md)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator

from enroute_core.base.errors import CorruptData, InvalidArgument, LimitExceeded
from enroute_core.base.ids import Incarnation, LogIndex, NodeId, Term
from enroute_core.state import RepoState
from enroute_proto.gen.enroute.common.v1 import common_pb2
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

from ..multiraft import Batch, GroupId, GroupMessage, Heartbeat, decode_message, encode_message
from ..raft.types import MessageType, Snapshot


def state_to_proto(name: str, s: RepoState) -> common_pb2.RepositoryState:
    msg = common_pb2.RepositoryState(
        name=name,
        incarnation=s.incarnation,
        version=s.version,
        deleted=s.deleted,
        head=s.head,
        head_kept=s.head_kept,
    )
    if s.last_push_us is not None:
        msg.last_push_us = s.last_push_us
    return msg


def _group_to_proto(g: GroupId) -> ledger_pb2.RaftGroup:
    return ledger_pb2.RaftGroup(repo=g.repo.decode(), incarnation=int(g.incarnation))


def _group_from_proto(g: ledger_pb2.RaftGroup) -> GroupId:
    if not g.repo or g.incarnation < 1:
        raise InvalidArgument("bad raft group", repo=g.repo, incarnation=g.incarnation)
    return GroupId(g.repo.encode(), Incarnation(g.incarnation))


def _hb_to_proto(h: Heartbeat) -> ledger_pb2.Heartbeat:
    return ledger_pb2.Heartbeat(
        group=_group_to_proto(h.group),
        term=int(h.term),
        commit=int(h.commit),
        context=h.context,
        quiesce=h.quiesce,
    )


def _hb_from_proto(h: ledger_pb2.Heartbeat) -> Heartbeat:
    return Heartbeat(
        _group_from_proto(h.group), Term(h.term), LogIndex(h.commit), h.context, h.quiesce
    )


def batch_to_proto(b: Batch) -> ledger_pb2.RaftBatch:
    return ledger_pb2.RaftBatch(
        from_node=int(b.from_node),
        to_node=int(b.to_node),
        messages=[
            ledger_pb2.GroupMessage(
                group=_group_to_proto(m.group), message=encode_message(m.message)
            )
            for m in b.messages
        ],
        heartbeats=[_hb_to_proto(h) for h in b.heartbeats],
        heartbeat_responses=[_hb_to_proto(h) for h in b.heartbeat_responses],
    )


def batch_from_proto(p: ledger_pb2.RaftBatch) -> Batch:
    """Raises InvalidArgument or CorruptData(section="raft-message") on a bad batch."""
    try:
        return Batch(
            NodeId(p.from_node),
            NodeId(p.to_node),
            tuple(
                GroupMessage(_group_from_proto(m.group), decode_message(m.message))
                for m in p.messages
            ),
            tuple(_hb_from_proto(h) for h in p.heartbeats),
            tuple(_hb_from_proto(h) for h in p.heartbeat_responses),
        )
    except UnicodeError as e:
        raise CorruptData("raft group name is not text", section="raft-message") from e


# -- snapshots in chunks (ledger.proto, RaftTransport.SendSnapshot) --------------------------

SNAPSHOT_CHUNK_BYTES = 1 << 20
"""Data bytes per SnapshotChunk: far below gRPC's 4 MiB message bound."""


def snapshot_chunks(
    from_node: NodeId, gm: GroupMessage, chunk_bytes: int = SNAPSHOT_CHUNK_BYTES
) -> Iterator[ledger_pb2.SnapshotChunk]:
    """A SNAP message as header (the message with empty data), data chunks, trailer."""
    snap = gm.message.snapshot
    assert snap is not None and chunk_bytes > 0
    bare = dataclasses.replace(gm.message, snapshot=Snapshot(snap.metadata, b""))
    yield ledger_pb2.SnapshotChunk(
        header=ledger_pb2.SnapshotHeader(
            from_node=int(from_node),
            to_node=int(gm.message.to),
            group=_group_to_proto(gm.group),
            message=encode_message(bare),
            data_size_bytes=len(snap.data),
        )
    )
    view = memoryview(snap.data)
    for at in range(0, len(view), chunk_bytes):
        yield ledger_pb2.SnapshotChunk(data=bytes(view[at : at + chunk_bytes]))
    yield ledger_pb2.SnapshotChunk(
        trailer=ledger_pb2.SnapshotTrailer(data_sha256=hashlib.sha256(snap.data).digest())
    )


class SnapshotAssembler:
    """The receiving side of ``snapshot_chunks``: feed each chunk, then ``finish``.

    Bounded by ``data_bytes_max`` (a snapshot the log store could not hold is refused
    before it is buffered). Raises InvalidArgument (order, addressing), LimitExceeded,
    or CorruptData(section="raft-snapshot") for a size or SHA-256 mismatch.
    """

    def __init__(self, me: NodeId, data_bytes_max: int) -> None:
        self.me = me
        self.data_bytes_max = data_bytes_max
        self._head: ledger_pb2.SnapshotHeader | None = None
        self._data = bytearray()
        self._done: Batch | None = None

    def feed(self, chunk: ledger_pb2.SnapshotChunk) -> None:
        if self._done is not None:
            raise InvalidArgument("snapshot chunk after the trailer")
        part = chunk.WhichOneof("part")
        if part == "header":
            if self._head is not None:
                raise InvalidArgument("second snapshot header")
            head = chunk.header
            if head.to_node != self.me:
                raise InvalidArgument("snapshot addressed to another node", to_node=head.to_node)
            if head.data_size_bytes > self.data_bytes_max:
                raise LimitExceeded(
                    "ledger_record_bytes_max", head.data_size_bytes, self.data_bytes_max
                )
            self._head = head
        elif self._head is None:
            raise InvalidArgument("snapshot chunk before the header")
        elif part == "data":
            if len(self._data) + len(chunk.data) > self._head.data_size_bytes:
                raise CorruptData("snapshot data past its size", section="raft-snapshot")
            self._data += chunk.data
        elif part == "trailer":
            self._done = self._finish(self._head, chunk.trailer.data_sha256)
        else:
            raise InvalidArgument("empty snapshot chunk")

    def _finish(self, head: ledger_pb2.SnapshotHeader, sha256: bytes) -> Batch:
        if len(self._data) != head.data_size_bytes:
            raise CorruptData(
                "snapshot data shorter than its size",
                section="raft-snapshot",
                got=len(self._data),
                size=head.data_size_bytes,
            )
        data = bytes(self._data)
        if hashlib.sha256(data).digest() != sha256:
            raise CorruptData("snapshot SHA-256 mismatch", section="raft-snapshot")
        try:
            group = _group_from_proto(head.group)
        except UnicodeError as e:
            raise CorruptData("raft group name is not text", section="raft-message") from e
        m = decode_message(head.message)
        if m.type is not MessageType.SNAP or m.snapshot is None or m.snapshot.data:
            raise CorruptData("snapshot header holds no bare snapshot", section="raft-snapshot")
        if m.to != self.me or m.from_ != head.from_node:
            raise InvalidArgument("snapshot message and header disagree on nodes")
        full = dataclasses.replace(m, snapshot=Snapshot(m.snapshot.metadata, data))
        return Batch(NodeId(head.from_node), self.me, (GroupMessage(group, full),))

    def finish(self) -> Batch:
        """The one-message batch to step; InvalidArgument if the trailer never came."""
        if self._done is None:
            raise InvalidArgument("snapshot stream ended before its trailer")
        return self._done
