"""The ledger's Raft message codec: one ``Message`` to bytes and back.

``RaftBatch.messages`` (ledger.proto, RaftTransport) carries each group's
non-heartbeat messages as opaque bytes; this is their form. Layout, all
integers unsigned LEB128 varints (at most 10 bytes, below 2**64):

- magic ``RM`` (2 bytes), version u8 (= 1), type code u8, flags u8
  (bit 0 reject, bit 1 quiesce, bit 2 a snapshot follows, bit 3 a blank id
  follows; others zero);
- to, from (both positive), term, log term, index, commit, reject hint;
- context: length, bytes;
- entries: count, then per entry term, index, type u8 (0 normal,
  1 conf change), length, data;
- snapshot (when flagged): index, term, voter count, voter ids (strictly
  ascending, positive), learner count, learner ids (same), length, data;
- blank id (when flagged, non-zero): the sender is a blank voter (docs/raft.md).

Local message types (HUP, BEAT, ...) never travel and are refused both ways.
``decode`` takes exactly one message: short input, trailing bytes and any
out-of-range field raise ``CorruptData(section="raft-message")``; nothing
else escapes.
"""

from __future__ import annotations

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId, Term

from ..raft.types import (
    LOCAL_MESSAGES,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)

SECTION = "raft-message"
_MAGIC = b"RM"
_VERSION = 1
_U64_MAX = (1 << 64) - 1
_F_REJECT = 1
_F_QUIESCE = 2
_F_SNAPSHOT = 4
_F_BLANK = 8

# Wire codes are fixed forever: append new types, never renumber.
_CODES: dict[MessageType, int] = {
    MessageType.PROP: 1,
    MessageType.READ_INDEX: 2,
    MessageType.READ_INDEX_RESP: 3,
    MessageType.TRANSFER_LEADER: 4,
    MessageType.APP: 5,
    MessageType.APP_RESP: 6,
    MessageType.VOTE: 7,
    MessageType.VOTE_RESP: 8,
    MessageType.PRE_VOTE: 9,
    MessageType.PRE_VOTE_RESP: 10,
    MessageType.SNAP: 11,
    MessageType.HEARTBEAT: 12,
    MessageType.HEARTBEAT_RESP: 13,
    MessageType.TIMEOUT_NOW: 14,
}
_TYPES = {code: t for t, code in _CODES.items()}
_ENTRY_TYPES = (EntryType.NORMAL, EntryType.CONF_CHANGE)
assert not LOCAL_MESSAGES & _CODES.keys()


def _uvarint(out: bytearray, n: int) -> None:
    assert 0 <= n <= _U64_MAX, n
    if n < 0x80:  # most fields: one byte
        out.append(n)
        return
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _blob(out: bytearray, data: bytes) -> None:
    _uvarint(out, len(data))
    out += data


def _ids(out: bytearray, ids: frozenset[NodeId]) -> None:
    _uvarint(out, len(ids))
    for n in sorted(ids):
        _uvarint(out, n)


def encode_message(m: Message) -> bytes:
    code = _CODES.get(m.type)
    if code is None:
        raise InvalidArgument("local message type cannot be encoded", type=m.type.value)
    flags = (
        (_F_REJECT if m.reject else 0)
        | (_F_QUIESCE if m.quiesce else 0)
        | (_F_SNAPSHOT if m.snapshot is not None else 0)
        | (_F_BLANK if m.blank else 0)
    )
    out = bytearray(_MAGIC)
    out += bytes((_VERSION, code, flags))
    for n in (m.to, m.from_, m.term, m.log_term, m.index, m.commit, m.reject_hint):
        _uvarint(out, n)
    _blob(out, m.context)
    _uvarint(out, len(m.entries))
    for e in m.entries:
        _uvarint(out, e.term)
        _uvarint(out, e.index)
        out.append(e.type.value)
        _blob(out, e.data)
    if m.snapshot is not None:
        meta = m.snapshot.metadata
        _uvarint(out, meta.index)
        _uvarint(out, meta.term)
        _ids(out, meta.conf_state.voters)
        _ids(out, meta.conf_state.learners)
        _blob(out, m.snapshot.data)
    if m.blank:
        _uvarint(out, m.blank)
    return bytes(out)


class _Reader:
    __slots__ = ("at", "buf")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.buf):
            raise CorruptData("truncated", section=SECTION, at=self.at)
        b = self.buf[self.at]
        self.at += 1
        return b

    def uvarint(self) -> int:
        n, self.at = _uvarint_at(self.buf, self.at)
        return n

    def blob(self) -> bytes:
        n = self.uvarint()
        if n > len(self.buf) - self.at:
            raise CorruptData("length past the end", section=SECTION, length=n)
        data = self.buf[self.at : self.at + n]
        self.at += n
        return data

    def ids(self) -> frozenset[NodeId]:
        count = self.uvarint()
        if count > len(self.buf) - self.at:
            raise CorruptData("count past the end", section=SECTION, count=count)
        ids: list[NodeId] = []
        for _ in range(count):
            n = self.uvarint()
            if n == 0 or (ids and n <= ids[-1]):
                raise CorruptData("node ids not ascending", section=SECTION, id=n)
            ids.append(NodeId(n))
        return frozenset(ids)


def _uvarint_at(buf: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it; minimal, below 2**64, or CorruptData."""
    n = 0
    end = len(buf)
    for shift in range(0, 70, 7):
        if at >= end:
            raise CorruptData("truncated", section=SECTION, at=at)
        b = buf[at]
        at += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            if n > _U64_MAX or (b == 0 and shift > 0):
                raise CorruptData("bad varint", section=SECTION, at=at)
            return n, at
    raise CorruptData("varint too long", section=SECTION, at=at)


def decode_message(data: bytes) -> Message:
    # The transport's hot path (a voter decodes every peer message): one-byte varints,
    # most fields, are read inline; longer ones, and every error, by the reader's rules.
    buf = bytes(data)
    end = len(buf)
    if end < 5:
        raise CorruptData("truncated", section=SECTION, at=end)
    if buf[0] != _MAGIC[0] or buf[1] != _MAGIC[1]:
        raise CorruptData("not a raft message", section=SECTION)
    if (version := buf[2]) != _VERSION:
        raise CorruptData("unknown version", section=SECTION, version=version)
    mtype = _TYPES.get(buf[3])
    if mtype is None:
        raise CorruptData("unknown message type", section=SECTION)
    flags = buf[4]
    if flags & ~(_F_REJECT | _F_QUIESCE | _F_SNAPSHOT | _F_BLANK):
        raise CorruptData("unknown flags", section=SECTION, flags=flags)
    at = 5
    head: list[int] = []  # to, from, term, log term, index, commit, reject hint, context length
    for _ in range(8):
        if at < end and buf[at] < 0x80:
            head.append(buf[at])
            at += 1
        else:
            n, at = _uvarint_at(buf, at)
            head.append(n)
    to, from_, term, log_term, index, commit, hint, n = head
    if to == 0 or from_ == 0:
        raise CorruptData("node id 0", section=SECTION)
    if n > end - at:
        raise CorruptData("length past the end", section=SECTION, length=n)
    context = buf[at : at + n]
    entries, at = _entries_at(buf, at + n, end)
    r = _Reader(buf)
    r.at = at
    snapshot = _snapshot(r) if flags & _F_SNAPSHOT else None
    blank = r.uvarint() if flags & _F_BLANK else 0
    if flags & _F_BLANK and blank == 0:
        raise CorruptData("blank id 0", section=SECTION)
    if r.at != end:
        raise CorruptData("trailing bytes", section=SECTION, extra=end - r.at)
    return Message(
        mtype,
        NodeId(to),
        NodeId(from_),
        Term(term),
        Term(log_term),
        LogIndex(index),
        tuple(entries),
        LogIndex(commit),
        snapshot,
        bool(flags & _F_REJECT),
        LogIndex(hint),
        context,
        bool(flags & _F_QUIESCE),
        blank,
    )


def _entries_at(buf: bytes, at: int, end: int) -> tuple[list[Entry], int]:
    """The message's entries from ``at``: the count, then each entry (decode_message's
    hot path, one-byte terms read inline); the entries and where they end."""
    if at < end and buf[at] < 0x80:
        count = buf[at]
        at += 1
    else:
        count, at = _uvarint_at(buf, at)
    if count > end - at:
        raise CorruptData("entry count past the end", section=SECTION, count=count)
    entries: list[Entry] = []
    for _ in range(count):
        if at < end and buf[at] < 0x80:
            e_term = buf[at]
            at += 1
        else:
            e_term, at = _uvarint_at(buf, at)
        e_index, at = _uvarint_at(buf, at)
        if at >= end:
            raise CorruptData("truncated", section=SECTION, at=at)
        e_type = buf[at]
        if e_type > 1:
            raise CorruptData("unknown entry type", section=SECTION, type=e_type)
        n, at = _uvarint_at(buf, at + 1)
        if n > end - at:
            raise CorruptData("length past the end", section=SECTION, length=n)
        entries.append(
            Entry(Term(e_term), LogIndex(e_index), _ENTRY_TYPES[e_type], buf[at : at + n])
        )
        at += n
    return entries, at


def _snapshot(r: _Reader) -> Snapshot:
    index, term = r.uvarint(), r.uvarint()
    voters, learners = r.ids(), r.ids()
    if voters & learners:
        raise CorruptData("a node is both voter and learner", section=SECTION)
    meta = SnapshotMetadata(LogIndex(index), Term(term), ConfState(voters, learners))
    return Snapshot(meta, r.blob())
