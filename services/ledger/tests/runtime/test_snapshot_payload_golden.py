"""Golden vectors of the ledger snapshot payload ``ENLS`` (docs/formats/ledger-snapshot.md).

The payload is persisted (the log store's snapshot row) and sent to lagging voters,
so its bytes are a format: these vectors pin them. Each is decoded to its values,
encoded back byte for byte, and read field by field at the offsets the page gives.
"""

from __future__ import annotations

import struct
import zlib

from enroute_core.state import MISSING, Activate, OutcomeCode, RepoState, apply, encode_state
from enroute_ledger.machine import Done, decode_snapshot, encode_snapshot

MAIN = b"refs/heads/main"
CHECKPOINT = bytes.fromhex(
    "454e5253010100000000000000000046020000000000000001000000000000000100000000000000"
    "410000004000000000000000000000000000000000000f726566732f68656164732f6d61696e0000"
    "0000000000000b4353c8"
)
"""The checkpoint (docs/formats/state.md) of a repository just created with HEAD main."""
EMPTY_WINDOW = bytes.fromhex(
    "454e4c5301000000000000000000005a" + CHECKPOINT.hex() + "00000000" + "dcca4edd"
)
TWO_RECORDS = bytes.fromhex(
    "454e4c5301000000000000000000005a"
    + CHECKPOINT.hex()
    + "00000002"
    + "000102030405060708090a0b0c0d0e0f"
    + "0000000000000007"
    + "0000000000000003"
    + "02"
    + "6f6b"
    + "abababababababababababababababab"
    + "0000000000000009"
    + "0000000000000004"
    + "09"
    + "7374616c655f726566"
    + "89277d97"
)
RECORDS = (
    Done(bytes(range(16)), 7, 3, OutcomeCode.OK),
    Done(b"\xab" * 16, 9, 4, OutcomeCode.STALE_REF),
)


def created() -> RepoState:
    return apply(MISSING, Activate(create=True, head=MAIN, upload_window=64), log_index=2).state


def key(d: Done) -> tuple[bytes, int, int, OutcomeCode]:
    return d.rid, d.index, d.version, d.outcome


def test_the_checkpoint_inside_is_the_state_codec_s() -> None:
    assert encode_state(created()) == CHECKPOINT


def test_vectors_encode_and_decode_both_ways() -> None:
    st = created()
    assert encode_snapshot(st, ()) == EMPTY_WINDOW
    assert encode_snapshot(st, RECORDS) == TWO_RECORDS
    assert decode_snapshot(EMPTY_WINDOW) == (st, ())
    got_state, got = decode_snapshot(TWO_RECORDS)
    assert got_state == st and [key(d) for d in got] == [key(d) for d in RECORDS]


def test_layout_field_by_field() -> None:
    """The table of docs/formats/ledger-snapshot.md, read at its offsets."""
    data = TWO_RECORDS
    magic, fmt, reserved, n = struct.unpack_from(">4sB3sQ", data)
    assert (magic, fmt, reserved, n) == (b"ENLS", 1, b"\0\0\0", len(CHECKPOINT))
    assert data[16 : 16 + n] == CHECKPOINT
    pos = 16 + n
    assert struct.unpack_from(">I", data, pos) == (2,)
    pos += 4
    for d in RECORDS:
        rid, index, version, length = struct.unpack_from(">16sQQB", data, pos)
        pos += 33
        assert (rid, index, version) == (d.rid, d.index, d.version)
        assert data[pos : pos + length] == d.outcome.value.encode("ascii")
        pos += length
    assert struct.unpack_from(">I", data, pos) == (zlib.crc32(data[:pos]),)
    assert pos + 4 == len(data)


def test_a_bare_checkpoint_is_a_payload_with_an_empty_window() -> None:
    """Payloads written before the window existed (docs/formats/ledger-snapshot.md)."""
    assert decode_snapshot(CHECKPOINT) == (created(), ())
