"""Fuzz target: the ``ENRLAYR1`` layer reader (``enroute_core.storage.layer.reader``).

Seed 004, "Layers", "Metadata is always local", "Chunk hashes verify any chunk
on its own", "Stable object numbering"; byte layout in docs/formats/layer.md.
Inputs: the golden layers (``libs/enroute-core/tests/storage/golden``: a
pushed layer and a merged one with a commit graph and id holes), a synthetic
pushed layer (several oid-index pages and samples) and a layer of four large
blobs (a data region over 1 MiB), mutated in five ways:

1. bytes of a hashed section (data, table, oid index, externals, commits,
   graph) changed, then every checksum made right again (chunk SHA-256s,
   index-region crc32, footer crc32), so the change reaches the structural
   checks instead of stopping at a checksum;
2. u32s of one part of the index region (samples, kind runs, id runs, Bloom
   header, Bloom bits) changed, checksums made right;
3. footer counts changed by meaning (objects moved between kinds, the layer
   kind, run, id and commit counts moved by one with the offsets recomputed);
4. footer fields set to other or boundary values, offsets recomputed from
   the counts or left as they are, footer crc made right;
5. plain byte mutations (checksums made right or not), raw bytes.

The reader is opened with and without ``meta_size``, then driven through
its whole API with in-range arguments (lookups of every known oid, records,
entries, rows, ids, commits, the commit graph, ``verify``). Only
``CorruptData`` and ``LimitExceeded`` may escape.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import zlib

import pytest
from fuzzkit import (
    INTERESTING_U32,
    INTERESTING_U64,
    LAYER_GOLDEN,
    fuzz_bytes,
    fuzz_settings,
    mutated,
    typed_errors,
)
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData, LimitExceeded
from enroute_core.base.limits import Limits
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import encode_entry_header
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer import LayerReader, LayerWriter, root_of
from enroute_core.storage.layer.format import (
    CHUNK_BYTES,
    FOOTER,
    FOOTER_BYTES,
    FOOTER_CRC_AT,
    Footer,
    IndexRegionLayout,
    Kind,
    Layout,
)
from enroute_testing.synthlayer import synthetic_layer

pytestmark = pytest.mark.fuzz

ALLOWED = (CorruptData, LimitExceeded)


def _big_layer() -> bytes:
    """Four 400 KB blobs: a data region over 1 MiB, so entries span 64 KiB pages and the
    first chunk is read from the source, not from the pinned metadata."""
    parts: list[bytes] = []
    writer = LayerWriter(parts.append)
    blobs = sorted(
        (object_id(ObjectType.BLOB, body), body)
        for body in (hashlib.shake_256(b"%d" % i).digest(400_000) for i in range(4))
    )
    for oid, body in blobs:
        writer.append(
            oid, Kind.BLOB, encode_entry_header(3, len(body)) + zlib.compress(body, 0), len(body)
        )
    writer.finish()
    return b"".join(parts)


SEEDS = [
    (LAYER_GOLDEN / "pushed.layer").read_bytes(),
    (LAYER_GOLDEN / "merged.layer").read_bytes(),
    synthetic_layer(600)[0],
    _big_layer(),
]
KNOWN_OIDS: list[bytes] = []
for _seed in SEEDS:
    _reader = LayerReader.open(BytesSource(_seed))
    KNOWN_OIDS += [_reader.record(i).oid for i in range(_reader.object_count)]
    KNOWN_OIDS += list(_reader.external_oids)
PROBES = st.lists(st.sampled_from(KNOWN_OIDS) | st.binary(min_size=20, max_size=20), max_size=12)
_FOOTER_FIELDS = 24  # 7 offsets, 17 u32s (the last is the footer crc), the magic


def _footer_values(data: bytes) -> list[int | bytes] | None:
    if len(data) < FOOTER_BYTES:
        return None
    return list(FOOTER.unpack(data[-FOOTER_BYTES:]))


def _with_footer(data: bytes, values: list[int | bytes]) -> bytes:
    body = FOOTER.pack(*values)
    crc = zlib.crc32(body[:FOOTER_CRC_AT]).to_bytes(4, "little")
    return data[:-FOOTER_BYTES] + body[:FOOTER_CRC_AT] + crc + body[-8:]


def reseal(data: bytes) -> bytes:
    """Make the chunk hashes, the index-region crc32 and the footer crc32 right again.

    The footer's own ``index_region_off`` says where the region is; a footer
    that makes no sense is left as it is.
    """
    values = _footer_values(data)
    if values is None:
        return data
    region_off = values[6]
    assert isinstance(region_off, int)
    meta_end = len(data) - FOOTER_BYTES
    chunks = -(-region_off // CHUNK_BYTES)
    hashes_at = meta_end - chunks * 32
    if not 0 <= region_off <= hashes_at or chunks > 64:
        return _with_footer(data, values)
    buf = bytearray(data)
    for chunk in range(chunks):
        start = chunk * CHUNK_BYTES
        end = min(start + CHUNK_BYTES, region_off)
        buf[hashes_at + chunk * 32 : hashes_at + chunk * 32 + 32] = hashlib.sha256(
            buf[start:end]
        ).digest()
    values[22] = zlib.crc32(buf[region_off:meta_end])
    return _with_footer(bytes(buf), values)


@st.composite
def _section_mutation(draw: st.DrawFn) -> bytes:
    data = draw(st.sampled_from(SEEDS))
    footer = Footer.decode(data[-FOOTER_BYTES:])
    region_off = footer.index_region_off
    meta_end = len(data) - FOOTER_BYTES
    lo, hi = draw(
        st.sampled_from(
            [
                (0, footer.data_end),
                (footer.table_off, footer.oid_index_off),
                (footer.oid_index_off, footer.external_off),
                (footer.external_off, footer.commit_off),
                (footer.commit_off, region_off),
                (region_off, meta_end - 32),
            ]
        ).filter(lambda r: r[1] > r[0])
    )
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(lo, hi - 1))
        kind = draw(st.integers(0, 2))
        if kind == 0:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == 1:
            buf[pos] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
        else:
            value = draw(st.sampled_from(INTERESTING_U32) | st.integers(0, 2**32 - 1))
            end = min(pos + 4, hi)
            buf[pos:end] = struct.pack("<I", value)[: end - pos]
    return reseal(bytes(buf))


@st.composite
def _footer_mutation(draw: st.DrawFn) -> bytes:
    data = draw(st.sampled_from(SEEDS))
    values = _footer_values(data)
    assert values is not None
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.integers(0, 22))
        if field < 7:
            value = draw(st.sampled_from(INTERESTING_U64) | st.integers(0, len(data) + 8192))
        else:
            current = values[field]
            assert isinstance(current, int)
            value = draw(
                st.sampled_from(INTERESTING_U32)
                | st.integers(max(current - 3, 0), current + 3)
                | st.integers(0, 2**32 - 1)
            )
        values[field] = value
    if draw(st.booleans()):  # offsets that agree with the new counts
        f = Footer.decode(_with_footer(data, values)[-FOOTER_BYTES:])
        layout = Layout.of_footer(f)
        values[:7] = [
            layout.data_end,
            layout.table_off,
            layout.oid_index_off,
            layout.external_off,
            layout.commit_off,
            layout.graph_off,
            layout.index_region_off,
        ]
        if any(v >= 2**64 for v in values[:7] if isinstance(v, int)):
            return data
    mutated_data = _with_footer(data, values)
    return reseal(mutated_data) if draw(st.booleans()) else mutated_data


def _region_parts(data: bytes) -> list[tuple[int, int]]:
    """Absolute extents of the index region's parts: samples, kind runs, id runs, Bloom
    header, Bloom bits (the chunk hashes are left to ``reseal``)."""
    f = Footer.decode(data[-FOOTER_BYTES:])
    region = data[f.index_region_off : len(data) - FOOTER_BYTES]
    bare = IndexRegionLayout.compute(
        kind_counts=f.kind_counts,
        kind_run_count=f.kind_run_count,
        id_run_count=f.id_run_count,
        bloom_bits=0,
        chunk_count=0,
    )
    bits = int.from_bytes(region[bare.bloom_off : bare.bloom_off + 8], "little")
    rl = IndexRegionLayout.compute(
        kind_counts=f.kind_counts,
        kind_run_count=f.kind_run_count,
        id_run_count=f.id_run_count,
        bloom_bits=bits,
        chunk_count=0,
    )
    base = f.index_region_off
    cuts = [
        0,
        rl.kind_runs_off,
        rl.id_runs_off,
        rl.bloom_off,
        rl.bloom_bits_off,
        rl.chunk_hashes_off,
    ]
    return [(base + a, base + b) for a, b in itertools.pairwise(cuts) if b > a]


@st.composite
def _index_region_mutation(draw: st.DrawFn) -> bytes:
    """Samples, kind runs, id runs and Bloom parameters changed as u32s; crc32s made right."""
    data = draw(st.sampled_from(SEEDS))
    lo, hi = draw(st.sampled_from(_region_parts(data)))
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        pos = lo + 4 * draw(st.integers(0, max((hi - lo) // 4 - 1, 0)))
        current = int.from_bytes(buf[pos : pos + 4], "little")
        value = draw(
            st.sampled_from(INTERESTING_U32)
            | st.integers(max(current - 2, 0), current + 2)
            | st.integers(0, 2**32 - 1)
        )
        buf[pos : pos + 4] = struct.pack("<I", value % 2**32)
    return reseal(bytes(buf))


@st.composite
def _footer_semantics(draw: st.DrawFn) -> bytes:
    """Counts changed so that the layout still holds: kinds traded, layer kind, run, id
    and commit counts moved by one (offsets then recomputed), checksums made right."""
    data = draw(st.sampled_from(SEEDS))
    values = _footer_values(data)
    assert values is not None
    action = draw(st.integers(0, 3))
    if action == 0:  # move objects from one kind to another: the total stays
        a, b = draw(st.integers(7, 10)), draw(st.integers(7, 10))
        moved = draw(st.integers(1, 3))
        if isinstance(values[a], int) and values[a] >= moved:
            values[a] -= moved  # type: ignore[operator]
            values[b] += moved  # type: ignore[operator]
    elif action == 1:
        values[21] = draw(st.sampled_from([0, 1, 2, 0xFFFFFFFF]))
    else:  # external, kind-run, id-run, id, commit and commit-array counts
        field = draw(st.sampled_from([11, 12, 13, 14, 15, 16, 17, 18, 19, 20]))
        current = values[field]
        assert isinstance(current, int)
        values[field] = max(current + draw(st.sampled_from([-1, 1, 2])), 0)
        f = Footer.decode(_with_footer(data, values)[-FOOTER_BYTES:])
        layout = Layout.of_footer(f)
        values[:7] = [
            layout.data_end,
            layout.table_off,
            layout.oid_index_off,
            layout.external_off,
            layout.commit_off,
            layout.graph_off,
            layout.index_region_off,
        ]
    return reseal(_with_footer(data, values))


LAYERS = st.one_of(
    _section_mutation(),
    _section_mutation(),
    _index_region_mutation(),
    _index_region_mutation(),
    _footer_semantics(),
    _footer_mutation(),
    mutated(SEEDS, 3).map(reseal),
    fuzz_bytes(SEEDS, 3),
)


def _exercise(reader: LayerReader, probes: list[bytes]) -> None:
    n = reader.object_count
    for oid in probes:
        local = reader.lookup(oid)
        if local is not None:
            assert 0 <= local < n
        reader.lookup(oid, Kind(oid[0] % 4))
    for i in range(min(n, 40)):
        record = reader.record(i)
        reader.kind_of(i)
        reader.id_of(i)
        reader.entry_bytes(i)
        reader.entry_row(i)
        if record.base_ref != 0xFFFFFFFF:
            reader.ref_oid(record.base_ref)
    reader.entry_rows(0, n)
    for rel in range(min(reader.id_count, 40)):
        local = reader.local_of(rel)
        assert local is None or 0 <= local < n
    list(reader.commit_infos())
    reader.commit_graph()
    reader.external_oids  # noqa: B018 (a read that checks)
    reader.kind_runs  # noqa: B018
    reader.verify()


@fuzz_settings(400)
@given(
    data=LAYERS,
    meta=st.sampled_from(["footer", "exact", "any"]),
    any_meta=st.integers(0, 20000),
    probes=PROBES,
    limits=st.sampled_from(
        [Limits(), Limits(), Limits(), Limits(layer_meta_bytes_max=16384, layer_objects_max=50)]
    ),
)
def test_layer_reader(
    data: bytes, meta: str, any_meta: int, probes: list[bytes], limits: Limits
) -> None:
    source = BytesSource(data)
    meta_size: int | None = None
    if meta == "exact":
        values = _footer_values(data)
        data_end = values[0] if values is not None else 0
        assert isinstance(data_end, int)
        meta_size = len(data) - data_end
    elif meta == "any":
        meta_size = any_meta
    stage = "open"
    with typed_errors(*ALLOWED) as caught:
        reader = LayerReader.open(source, meta_size=meta_size, limits=limits)
        stage = "use"
        _exercise(reader, probes)
        stage = "verified"
    tally(f"{stage}: {type(caught[0]).__name__ if caught else 'ok'}")
    root_of(source)
