"""Byte forms of the values the store keeps as blobs: snapshot metadata and kept entries.

Layouts (big-endian; docs/ledger-storage.md, "On disk"):

- snapshot metadata: index u64, term u64, voter count u32, voter ids u64 each
  (ascending), learner count u32, learner ids u64 each (ascending).
- kept entries: count u32, then per entry index u64 and term u64 (ascending
  indexes).

Decoders take exactly one value: short input, trailing bytes, unsorted or
duplicate ids raise ``CorruptData``; nothing else escapes.
"""

from __future__ import annotations

import itertools
import struct

from enroute_core.base.errors import CorruptData, EnrouteError
from enroute_core.base.ids import LogIndex, NodeId, Term

from ..raft.types import ConfState, SnapshotMetadata

_META_HEAD = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
_PAIR = struct.Struct(">QQ")
MEMBERS_MAX = 1 << 16
KEPT_MAX = 1 << 24


def encode_snapshot_meta(meta: SnapshotMetadata) -> bytes:
    voters = sorted(meta.conf_state.voters)
    learners = sorted(meta.conf_state.learners)
    return b"".join(
        [
            _META_HEAD.pack(meta.index, meta.term),
            _U32.pack(len(voters)),
            struct.pack(f">{len(voters)}Q", *voters),
            _U32.pack(len(learners)),
            struct.pack(f">{len(learners)}Q", *learners),
        ]
    )


def _ids(buf: memoryview, at: int, limit: int, section: str) -> tuple[list[int], int]:
    if at + 4 > len(buf):
        raise CorruptData("truncated count", section=section, at=at)
    (n,) = _U32.unpack_from(buf, at)
    at += 4
    if n > limit or at + 8 * n > len(buf):
        raise CorruptData("count out of range", section=section, count=n)
    ids = list(struct.unpack_from(f">{n}Q", buf, at))
    if any(b <= a for a, b in itertools.pairwise(ids)):
        raise CorruptData("ids not ascending", section=section)
    return ids, at + 8 * n


def decode_snapshot_meta(data: bytes | memoryview, section: str) -> SnapshotMetadata:
    buf = memoryview(data)
    if len(buf) < _META_HEAD.size:
        raise CorruptData("truncated snapshot metadata", section=section, length=len(buf))
    index, term = _META_HEAD.unpack_from(buf, 0)
    voters, at = _ids(buf, _META_HEAD.size, MEMBERS_MAX, section)
    learners, at = _ids(buf, at, MEMBERS_MAX, section)
    if at != len(buf):
        raise CorruptData("trailing bytes after snapshot metadata", section=section)
    if 0 in voters or 0 in learners:
        raise CorruptData("member id 0", section=section)
    try:
        conf = ConfState(
            frozenset(NodeId(v) for v in voters), frozenset(NodeId(v) for v in learners)
        )
    except EnrouteError as e:
        raise CorruptData(f"bad configuration: {e.message}", section=section) from None
    return SnapshotMetadata(LogIndex(index), Term(term), conf)


def encode_kept(kept: dict[int, int]) -> bytes:
    ks = sorted(kept)
    return _U32.pack(len(ks)) + b"".join(_PAIR.pack(k, kept[k]) for k in ks)


def decode_kept(data: bytes | memoryview, section: str) -> dict[int, int]:
    buf = memoryview(data)
    if len(buf) < 4:
        raise CorruptData("truncated kept entries", section=section)
    (n,) = _U32.unpack_from(buf, 0)
    if n > KEPT_MAX or len(buf) != 4 + _PAIR.size * n:
        raise CorruptData("kept entries have the wrong size", section=section, count=n)
    kept: dict[int, int] = {}
    last = 0
    for i in range(n):
        index, term = _PAIR.unpack_from(buf, 4 + _PAIR.size * i)
        if index <= last or term < 1:
            raise CorruptData("kept entries out of order", section=section, index=index)
        kept[index] = term
        last = index
    return kept
