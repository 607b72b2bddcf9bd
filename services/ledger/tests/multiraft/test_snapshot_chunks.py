"""SendSnapshot chunks (docs/rpc.md, RaftTransport): header, data chunks, SHA-256 trailer.

Round trips at the chunk boundaries, and every damage to a good stream (a cut,
changed data, a wrong size, chunks out of order) ends in a typed error only.
"""

from __future__ import annotations

import pytest

from enroute_core.base.errors import CorruptData, EnrouteError, InvalidArgument, LimitExceeded
from enroute_core.base.ids import Incarnation, LogIndex, NodeId, Term
from enroute_ledger.multiraft import GroupId, GroupMessage, encode_message
from enroute_ledger.raft import ConfState, Message, MessageType, Snapshot, SnapshotMetadata
from enroute_ledger.rpc.convert import SnapshotAssembler, snapshot_chunks
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

ME, LEADER = NodeId(3), NodeId(1)
GROUP = GroupId(b"team/app", Incarnation(2))


def snap_message(data: bytes) -> GroupMessage:
    meta = SnapshotMetadata(LogIndex(40), Term(3), ConfState(frozenset({LEADER, NodeId(2), ME})))
    m = Message(MessageType.SNAP, ME, LEADER, Term(3), snapshot=Snapshot(meta, data))
    return GroupMessage(GROUP, m)


def assemble(chunks: list[ledger_pb2.SnapshotChunk], limit: int = 1 << 20) -> GroupMessage:
    asm = SnapshotAssembler(ME, limit)
    for c in chunks:
        asm.feed(c)
    batch = asm.finish()
    assert batch.from_node == LEADER and batch.to_node == ME
    (gm,) = batch.messages
    return gm


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 64, 65])
def test_round_trip_at_chunk_boundaries(size: int) -> None:
    gm = snap_message(bytes(range(256)) * (size // 256) + bytes(range(size % 256)))
    chunks = list(snapshot_chunks(LEADER, gm, chunk_bytes=8))
    assert len(chunks) == 2 + -(-size // 8)
    assert all(len(c.data) <= 8 for c in chunks)
    assert assemble(chunks) == gm


def test_header_holds_the_message_without_data() -> None:
    head = next(snapshot_chunks(LEADER, snap_message(b"x" * 100)))
    assert head.header.data_size_bytes == 100 and b"x" * 10 not in head.header.message


def test_every_cut_and_change_is_a_typed_error() -> None:
    gm = snap_message(b"repository state " * 5)
    good = list(snapshot_chunks(LEADER, gm, chunk_bytes=16))
    for cut in range(len(good)):
        with pytest.raises(InvalidArgument):
            assemble(good[:cut])
    for i in range(1, len(good) - 1):  # each data chunk changed in one byte
        bad = list(good)
        data = bytearray(bad[i].data)
        data[0] ^= 1
        bad[i] = ledger_pb2.SnapshotChunk(data=bytes(data))
        with pytest.raises(CorruptData):
            assemble(bad)
    for order in (good[1:] + good[:1], good[::-1], good + good[-1:], [good[0], *good]):
        with pytest.raises(EnrouteError):
            assemble(order)


def test_sizes_and_addressing_are_checked() -> None:
    gm = snap_message(b"y" * 40)
    good = list(snapshot_chunks(LEADER, gm, chunk_bytes=16))
    with pytest.raises(LimitExceeded):
        assemble(good, limit=39)
    short = [good[0], *good[2:]]
    with pytest.raises(CorruptData):
        assemble(short)
    extra = [*good[:-1], ledger_pb2.SnapshotChunk(data=b"z"), good[-1]]
    with pytest.raises(CorruptData):
        assemble(extra)
    other = ledger_pb2.SnapshotChunk()
    other.CopyFrom(good[0])
    other.header.to_node = 9
    with pytest.raises(InvalidArgument):
        assemble([other, *good[1:]])
    with pytest.raises(InvalidArgument):
        assemble([ledger_pb2.SnapshotChunk(), *good])


def test_a_header_without_a_snapshot_message_is_refused() -> None:
    gm = snap_message(b"")
    chunks = list(snapshot_chunks(LEADER, gm))
    chunks[0].header.message = encode_message(Message(MessageType.APP, ME, LEADER, Term(3)))
    with pytest.raises(CorruptData):
        assemble(chunks)
