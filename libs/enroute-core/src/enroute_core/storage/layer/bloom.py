"""The Bloom filter of a layer's index region (seed 004, "Layers": about 10 bits per object).

Oids are SHA-1 digests, so their own bytes are uniform and serve as the two
hashes of double hashing: ``h1 = u64le(oid[0:8])``, ``h2 = u64le(oid[8:16]) | 1``
and probe ``i`` (``0 <= i < k``) sets bit ``(h1 + i*h2) mod m``, computed
exactly (no 64-bit wrap). Bit ``b`` is bit ``b & 7`` (least significant
first) of byte ``b >> 3``. ``m`` is the next multiple of 64 of ``10 * n``
(at least 64) and ``k = 7``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from enroute_native.layer_bloom import build as build_compiled

BITS_PER_OBJECT: Final = 10
PROBES: Final = 7
PROBES_MAX: Final = 32
_HASHES = struct.Struct("<QQ4x")
"""h1 and h2 (before ``| 1``) of one 20-byte oid."""
_DIGITS: Final = b"01" + bytes(254)


def bloom_bits_for(object_count: int) -> int:
    return max(64, (BITS_PER_OBJECT * object_count + 63) // 64 * 64)


def build_bloom(oids: Sequence[bytes], bits: int, probes: int = PROBES) -> bytes:
    """The filter bytes for ``oids`` (20 bytes each), built by compiled code
    (``enroute_native.layer_bloom``, docs/native.md); :func:`build_bloom_py` is its
    reference."""
    assert bits > 0 and bits % 64 == 0 and 0 < probes <= PROBES_MAX, (bits, probes)
    return build_compiled(b"".join(oids), bits, probes)


def build_bloom_py(oids: Sequence[bytes], bits: int, probes: int = PROBES) -> bytes:
    """:func:`build_bloom` in Python alone (the reference).

    One flag byte per bit while building (a plain store is the cheapest thing
    Python does per probe), then one pass packs the flags into bits: reversed,
    read as a base-2 numeral, written little-endian, flag ``b`` lands on bit
    ``b & 7`` of byte ``b >> 3``.
    """
    assert bits > 0 and bits % 64 == 0 and 0 < probes <= PROBES_MAX, (bits, probes)
    flags = bytearray(bits)
    pairs = _HASHES.iter_unpack(b"".join(oids))
    if probes == PROBES:  # unrolled: about a million oids a second
        for first, second in pairs:
            h2 = second | 1
            flags[first % bits] = 1
            h = first + h2
            flags[h % bits] = 1
            h += h2
            flags[h % bits] = 1
            h += h2
            flags[h % bits] = 1
            h += h2
            flags[h % bits] = 1
            h += h2
            flags[h % bits] = 1
            h += h2
            flags[h % bits] = 1
    else:
        for first, second in pairs:
            h2 = second | 1
            for i in range(probes):
                flags[(first + i * h2) % bits] = 1
    numeral = flags[::-1].translate(_DIGITS)
    return int(numeral, 2).to_bytes(bits // 8, "little")


def bloom_may_contain(filter_bytes: bytes, bits: int, probes: int, oid: bytes) -> bool:
    """False only when ``oid`` was certainly not added."""
    h1 = int.from_bytes(oid[0:8], "little")
    h2 = int.from_bytes(oid[8:16], "little") | 1
    for _ in range(probes):
        b = h1 % bits
        if not (filter_bytes[b >> 3] >> (b & 7)) & 1:
            return False
        h1 += h2
    return True
