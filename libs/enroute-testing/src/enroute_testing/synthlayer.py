"""Synthetic layers and point-lookup timing for tests and benchmarks (seed 004, "Layers":
"Lookup reads one page").

No ambient clock: the caller passes ``timer`` (``time.perf_counter`` in
``bench/``). Oids come from SHAKE-256 of a seed, so runs are reproducible.
"""

from __future__ import annotations

import hashlib
import statistics
import struct
import zlib
from collections.abc import Callable, Sequence

from enroute_core.base.ids import ObjectId
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer.commits import CommitInfo
from enroute_core.storage.layer.format import CHUNK_BYTES, FOOTER_BYTES, PACK_TYPE_OF_KIND, Kind
from enroute_core.storage.layer.reader import LayerReader
from enroute_core.storage.layer.writer import LayerWriter, SealedLayer

# Empty zlib stream: the entries are tiny and never inflated here.
_EMPTY_ZLIB = b"x\x9c\x03\x00\x00\x00\x00\x01"
# Object mix of a typical repository: per 16 objects, 2 commits, 6 trees, 7 blobs, 1 tag.
_MIX = (2, 6, 7, 1)


def synthetic_oids(count: int, seed: bytes = b"enroute") -> list[ObjectId]:
    raw = hashlib.shake_256(seed + count.to_bytes(8, "little")).digest(20 * count)
    return [ObjectId(raw[p : p + 20]) for p in range(0, len(raw), 20)]


def synthetic_layer(
    object_count: int, seed: bytes = b"enroute"
) -> tuple[bytes, SealedLayer, list[ObjectId]]:
    """A pushed layer of ``object_count`` tiny entries in the kind mix above, with commits."""
    oids = synthetic_oids(object_count, seed)
    counts = [object_count * m // 16 for m in _MIX]
    counts[Kind.BLOB] += object_count - sum(counts)
    parts: list[bytes] = []
    writer = LayerWriter(parts.append)
    pos = 0
    for kind, count in zip(Kind, counts, strict=True):
        entry = bytes([PACK_TYPE_OF_KIND[kind] << 4]) + _EMPTY_ZLIB
        for oid in oids[pos : pos + count]:
            writer.append(oid, kind, entry, 0)
        pos += count
    trees = oids[counts[0] : counts[0] + counts[1]] or oids[:1]
    for i in range(counts[Kind.COMMIT]):
        parents = (oids[i - 1],) if i else ()
        tree = trees[i % len(trees)]
        writer.add_commit(CommitInfo(oids[i], tree, parents, 1_700_000_000 + i, (oids[i], tree)))
    sealed = writer.finish()
    return b"".join(parts), sealed, oids


def lookup_latencies(
    reader: LayerReader, probes: Sequence[bytes], timer: Callable[[], float]
) -> list[float]:
    """Seconds per ``reader.lookup`` call, one timing per probe."""
    out: list[float] = []
    lookup = reader.lookup
    for oid in probes:
        t0 = timer()
        lookup(oid)
        out.append(timer() - t0)
    return out


def median_lookup_seconds(
    timer: Callable[[], float],
    object_count: int = 1_000_000,
    probe_count: int = 20_000,
    absent_share: float = 0.0,
) -> float:
    """Median point-lookup time in a synthetic layer with its pages in memory.

    ``absent_share`` of the probes are oids not in the layer (most stop at the
    Bloom filter).
    """
    data, sealed, oids = synthetic_layer(object_count)
    reader = LayerReader.open(BytesSource(data), meta_size=sealed.meta_size)
    absent = int(probe_count * absent_share)
    step = max(1, object_count // max(1, probe_count - absent))
    probes: list[bytes] = list(oids[::step][: probe_count - absent])
    probes += synthetic_oids(absent, b"absent")
    return statistics.median(lookup_latencies(reader, probes, timer))


def reseal(data: bytearray) -> bytes:
    """A layer edited in place with its checksums made again: chunk hashes, the index
    region's crc and the footer's, so a reader meets the edit itself, not a bad sum."""
    foot = len(data) - FOOTER_BYTES
    idx = struct.unpack_from("<Q", data, foot + 48)[0]
    chunks = -(-idx // CHUNK_BYTES)
    if idx <= foot and idx + chunks * 32 <= foot:
        pos = foot - chunks * 32
        for c in range(chunks):
            block = bytes(data[c * CHUNK_BYTES : min((c + 1) * CHUNK_BYTES, idx)])
            data[pos + 32 * c : pos + 32 * c + 32] = hashlib.sha256(block).digest()
        struct.pack_into("<I", data, foot + 116, zlib.crc32(bytes(data[idx:foot])))
    struct.pack_into("<I", data, foot + 120, zlib.crc32(bytes(data[foot : foot + 120])))
    return bytes(data)
