"""Typed ids shared by every layer.

``ObjectId`` is a raw 20-byte SHA-1; hex appears only at the edges.
"""

from __future__ import annotations

from typing import NewType

ObjectId = NewType("ObjectId", bytes)
"""A Git object id: 20 raw bytes of SHA-1."""

LogIndex = NewType("LogIndex", int)
Term = NewType("Term", int)
NodeId = NewType("NodeId", int)
Incarnation = NewType("Incarnation", int)

OID_BYTES = 20
OID_HEX_CHARS = 40
ZERO_OID = ObjectId(b"\x00" * OID_BYTES)

_HEX = frozenset(b"0123456789abcdef")


def oid_from_hex(text: bytes | str) -> ObjectId:
    """Parse 40 lowercase hex digits; uppercase is refused as Git refuses it on the wire."""
    raw = text.encode("ascii") if isinstance(text, str) else text
    if len(raw) != OID_HEX_CHARS or not _HEX.issuperset(raw):
        raise ValueError(f"not an object id: {raw[:64]!r}")
    return ObjectId(bytes.fromhex(raw.decode("ascii")))


def oid_to_hex(oid: ObjectId) -> str:
    assert len(oid) == OID_BYTES, len(oid)
    return oid.hex()
