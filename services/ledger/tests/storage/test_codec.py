"""The blob layouts of the store's group rows (docs/ledger-storage.md, "On disk")."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft.types import ConfState, SnapshotMetadata
from enroute_ledger.storage.codec import (
    decode_kept,
    decode_snapshot_meta,
    encode_kept,
    encode_snapshot_meta,
)

META = SnapshotMetadata(
    LogIndex(40), Term(3), ConfState(frozenset({NodeId(2), NodeId(1)}), frozenset({NodeId(7)}))
)
META_HEX = (
    "0000000000000028" "0000000000000003"  # index, term
    "00000002" "0000000000000001" "0000000000000002"  # voters
    "00000001" "0000000000000007"  # learners
)  # fmt: skip
KEPT = {12: 2, 5: 1}
KEPT_HEX = "0000000200000000000000050000000000000001000000000000000c0000000000000002"


def test_golden() -> None:
    assert encode_snapshot_meta(META).hex() == META_HEX
    assert decode_snapshot_meta(bytes.fromhex(META_HEX), "t") == META
    assert encode_kept(KEPT).hex() == KEPT_HEX
    assert decode_kept(bytes.fromhex(KEPT_HEX), "t") == KEPT


@pytest.mark.parametrize(
    ("raw", "decode"),
    [(bytes.fromhex(META_HEX), decode_snapshot_meta), (bytes.fromhex(KEPT_HEX), decode_kept)],
)
def test_every_cut_flip_and_trailing_byte_is_corrupt_data(
    raw: bytes, decode: Callable[[bytes, str], object]
) -> None:
    for cut in range(len(raw)):
        with pytest.raises(CorruptData):
            decode(raw[:cut], "t")
    with pytest.raises(CorruptData):
        decode(raw + b"\x00", "t")
    for at in range(len(raw)):
        for bit in (0x01, 0x80):
            damaged = bytearray(raw)
            damaged[at] ^= bit
            with contextlib.suppress(CorruptData):  # or a different valid value
                decode(bytes(damaged), "t")


ids = st.frozensets(st.integers(1, 2**63 - 1), max_size=6)


@given(index=st.integers(0, 2**63 - 1), term=st.integers(0, 2**63 - 1), v=ids, w=ids)
def test_snapshot_meta_round_trip(
    index: int, term: int, v: frozenset[int], w: frozenset[int]
) -> None:
    meta = SnapshotMetadata(
        LogIndex(index),
        Term(term),
        ConfState(frozenset(NodeId(x) for x in v), frozenset(NodeId(x) for x in w - v)),
    )
    assert decode_snapshot_meta(encode_snapshot_meta(meta), "t") == meta


@given(st.dictionaries(st.integers(1, 2**63 - 1), st.integers(1, 2**63 - 1), max_size=8))
def test_kept_round_trip(kept: dict[int, int]) -> None:
    assert decode_kept(encode_kept(kept), "t") == kept
