"""The Raft message codec (enroute_ledger.multiraft.codec): round trip and corruption.

STYLE rule 3: round-trip property, fixed vectors, every flipped byte and cut
prefix of a good vector raises only CorruptData.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.multiraft import decode_message, encode_message
from enroute_ledger.raft import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)
from enroute_ledger.raft.types import LOCAL_MESSAGES

U64 = st.integers(0, (1 << 64) - 1)
IDS = st.integers(1, (1 << 64) - 1).map(NodeId)
WIRE_TYPES = [t for t in MessageType if t not in LOCAL_MESSAGES]

entries = st.builds(
    Entry,
    U64.map(Term),
    U64.map(LogIndex),
    st.sampled_from(EntryType),
    st.binary(max_size=40),
)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes = draw(st.lists(IDS, unique=True, max_size=6))
    cut = draw(st.integers(0, len(nodes)))
    conf = ConfState(frozenset(nodes[:cut]), frozenset(nodes[cut:]))
    meta = SnapshotMetadata(LogIndex(draw(U64)), Term(draw(U64)), conf)
    return Snapshot(meta, draw(st.binary(max_size=40)))


messages = st.builds(
    Message,
    st.sampled_from(WIRE_TYPES),
    IDS,
    IDS,
    U64.map(Term),
    U64.map(Term),
    U64.map(LogIndex),
    st.lists(entries, max_size=4).map(tuple),
    U64.map(LogIndex),
    st.none() | snapshots(),
    st.booleans(),
    U64.map(LogIndex),
    st.binary(max_size=20),
    st.booleans(),
    U64,
)


@given(messages)
def test_round_trip(m: Message) -> None:
    data = encode_message(m)
    assert decode_message(data) == m
    assert encode_message(decode_message(data)) == data


def _vectors() -> list[Message]:
    app = Message(
        MessageType.APP,
        NodeId(2),
        NodeId(1),
        Term(3),
        Term(2),
        LogIndex(7),
        (
            Entry(Term(3), LogIndex(8), EntryType.NORMAL, b"push"),
            Entry(Term(3), LogIndex(9), EntryType.CONF_CHANGE, b"\x00cc"),
        ),
        LogIndex(7),
        context=b"ctx",
    )
    snap = Snapshot(
        SnapshotMetadata(LogIndex(300), Term(5), ConfState(frozenset({NodeId(1), NodeId(2)}))),
        b"state",
    )
    return [
        app,
        Message(MessageType.SNAP, NodeId(3), NodeId(1), Term(5), snapshot=snap),
        Message(
            MessageType.APP_RESP,
            NodeId(1),
            NodeId(2),
            Term(3),
            reject=True,
            index=LogIndex(9),
            reject_hint=LogIndex(4),
            log_term=Term(2),
        ),
        Message(MessageType.HEARTBEAT, NodeId(2), NodeId(1), Term(1), quiesce=True),
        Message(MessageType.HEARTBEAT_RESP, NodeId(1), NodeId(2), Term(4), blank=0xB1A7),
    ]


def test_blank_id_vector_bytes() -> None:
    """Flag bit 3 and the blank id last (docs/raft.md, "A voter that lost its disk")."""
    m = Message(MessageType.VOTE_RESP, NodeId(1), NodeId(2), Term(2), reject=True, blank=300)
    assert encode_message(m).hex() == "524d010809" + "010202000000000000" + "ac02"


def test_fixed_vector_bytes() -> None:
    m = Message(MessageType.HEARTBEAT, NodeId(2), NodeId(1), Term(300), quiesce=True)
    assert encode_message(m).hex() == "524d010c02" + "0201ac02000000000000"


@pytest.mark.parametrize("m", _vectors(), ids=lambda m: m.type.value)
def test_corruption_only_typed_error(m: Message) -> None:
    good = encode_message(m)
    assert decode_message(good) == m
    for cut in range(len(good)):
        with pytest.raises(CorruptData):
            decode_message(good[:cut])
    with pytest.raises(CorruptData):
        decode_message(good + b"\x00")
    for i in range(len(good)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(good)
            bad[i] ^= flip
            try:
                decode_message(bytes(bad))
            except CorruptData as e:
                assert e.details["section"] == "raft-message"


def test_local_types_refused() -> None:
    for t in LOCAL_MESSAGES:
        with pytest.raises(InvalidArgument):
            encode_message(Message(t, NodeId(1), NodeId(1)))
    good = bytearray(encode_message(_vectors()[0]))
    good[3] = 0  # no wire code 0
    with pytest.raises(CorruptData):
        decode_message(bytes(good))


def test_overlong_and_non_minimal_varints_refused() -> None:
    head = bytes.fromhex("524d010c00")
    with pytest.raises(CorruptData):
        decode_message(head + b"\x82\x00" + bytes(8))  # non-minimal "to"
    with pytest.raises(CorruptData):
        decode_message(head + b"\xff" * 11)
