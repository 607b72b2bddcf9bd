"""The ``ENRLAYR1`` layer file: constants, record layouts, the layout and the footer.

Seed 004, "Layers" (and "Stable object numbering" for id runs); the byte
layout is documented in ``docs/formats/layer.md``. Sections, in file order::

    data region      pack entries (full or REF_DELTA) in storage order      [0, data_end)
    (zero padding to a multiple of 4096)
    object table     52-byte records <20s Q I Q I I I>                       at table_off
    (zero padding to a multiple of 4096)
    oid index        pages of 170 entries <20s I> + 16 zero bytes            at oid_index_off
    external oids    sorted 20-byte oids                                     at external_off
    commit section   32-byte records <I I q I I I I>, parents, members       at commit_off
    commit graph     columns by rank (merged layers only)                    at graph_off
    index region     samples, kind runs, id runs, Bloom, chunk SHA-256s      at index_region_off
    footer           132 bytes, ending in b"ENRLAYR1"                        at size - 132

All integers are little-endian. Every offset in the footer is redundant with
the counts (the layout is a function of them); the reader recomputes it and
refuses any disagreement, so structural nonsense never reaches an index
operation.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass
from typing import Final

from enroute_core.base.errors import CorruptData

MAGIC: Final = b"ENRLAYR1"
OID_BYTES: Final = 20

PAGE_BYTES: Final = 4096
"""Page of the object table, oid index and external oids ("Layers": 4 KiB pages)."""
DATA_PAGE_BYTES: Final = 65536
"""Page of the data region ("Layers": data uses 64 KiB)."""
CHUNK_BYTES: Final = 1 << 20
"""Unit of residency and of the chunk hashes (seed 004, "Residency": 1 MiB)."""

SAMPLE_EVERY: Final = 256
"""Every 256th oid-index entry of each kind is kept in memory ("Layers")."""
INDEX_ENTRIES_PER_PAGE: Final = 170
"""170 entries of 24 bytes fill 4080 bytes; 16 zero bytes end each page."""

RECORD = struct.Struct("<20sQIQIII")
"""Object table record: oid, offset, length, size, base ref, base-context ref, depth."""
INDEX_ENTRY = struct.Struct("<20sI")
"""Oid index entry: oid, local index."""
COMMIT_RECORD = struct.Struct("<IIqIIII")
"""Commit section record: local index, tree ref, time, parents start/count, members start/count."""
RUN = struct.Struct("<II")
"""Kind run (first local index, kind) and id run (first local index, relative id)."""
BLOOM_HEADER = struct.Struct("<QII")
"""Bloom parameters: m (bits), k (probes), reserved (0)."""
FOOTER = struct.Struct("<7Q17I8s")
FOOTER_BYTES: Final = FOOTER.size
GRAPH_BYTES_PER_COMMIT: Final = 36
"""Commit graph columns: commit id, tree id, generation (u32), time (i64), 4 range u32s."""
CHUNK_HASH_BYTES: Final = 32

REF_NONE: Final = 0xFFFFFFFF
REF_EXTERNAL: Final = 0x80000000
LOCAL_MAX: Final = 0x7FFFFFFF
"""Local indexes and external indexes are below 2**31 (the high bit tells them apart)."""
EXTERNAL_MAX: Final = 0x7FFFFFFE
"""The external index 0x7FFFFFFF would spell REF_NONE."""
U32_MAX: Final = 0xFFFFFFFF
DEPTH_MAX: Final = 0xFFFFFFFF

assert RECORD.size == 52 and INDEX_ENTRY.size == 24 and COMMIT_RECORD.size == 32
assert FOOTER_BYTES == 132 and INDEX_ENTRIES_PER_PAGE * INDEX_ENTRY.size + 16 == PAGE_BYTES
assert CHUNK_BYTES % DATA_PAGE_BYTES == 0 and DATA_PAGE_BYTES % PAGE_BYTES == 0


class Kind(enum.IntEnum):
    """Object kinds in storage order ("Layers": commits | trees | blobs | tags)."""

    COMMIT = 0
    TREE = 1
    BLOB = 2
    TAG = 3


class LayerKind(enum.IntEnum):
    """A pushed layer has one id run and no commit graph; a merged layer has both."""

    PUSHED = 0
    MERGED = 1


PACK_TYPE_OF_KIND: Final = {Kind.COMMIT: 1, Kind.TREE: 2, Kind.BLOB: 3, Kind.TAG: 4}
PACK_OFS_DELTA: Final = 6
PACK_REF_DELTA: Final = 7
PACK_HEADER_BYTES_MAX: Final = 10
"""A pack entry header for any size below 2**64 fits in 10 bytes."""

# Section names used in CorruptData(section=...).
S_DATA: Final = "data region"
S_TABLE: Final = "object table"
S_OID_INDEX: Final = "oid index"
S_EXTERNAL: Final = "external oids"
S_COMMITS: Final = "commit section"
S_GRAPH: Final = "commit graph"
S_INDEX_REGION: Final = "index region"
S_FOOTER: Final = "footer"


def align_page(offset: int) -> int:
    return (offset + PAGE_BYTES - 1) & ~(PAGE_BYTES - 1)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def index_pages(object_count: int) -> int:
    return ceil_div(object_count, INDEX_ENTRIES_PER_PAGE)


def sample_count(kind_count: int) -> int:
    return ceil_div(kind_count, SAMPLE_EVERY)


def layer_key_name(gen: int, root: bytes) -> str:
    """File name of a stored layer: ``<gen:016x>-<root:32 hex>.layer`` (DESIGN "Object store
    layout"); the first 16 bytes of the BLAKE3 root name it."""
    assert 0 <= gen < 1 << 64, gen
    assert len(root) == 32, len(root)
    return f"{gen:016x}-{root[:16].hex()}.layer"


@dataclass(frozen=True, slots=True)
class Footer:
    """The fixed footer ("Layers": section offsets, per-kind counts, run counts, ids, crc32s)."""

    data_end: int
    table_off: int
    oid_index_off: int
    external_off: int
    commit_off: int
    graph_off: int
    index_region_off: int
    kind_counts: tuple[int, int, int, int]
    external_count: int
    kind_run_count: int
    id_run_count: int
    id_count: int
    commit_count: int
    commit_parent_count: int
    commit_member_count: int
    graph_commit_count: int
    graph_parent_count: int
    graph_member_count: int
    layer_kind: int
    index_region_crc: int

    @property
    def object_count(self) -> int:
        return sum(self.kind_counts)

    def encode(self) -> bytes:
        body = FOOTER.pack(
            self.data_end,
            self.table_off,
            self.oid_index_off,
            self.external_off,
            self.commit_off,
            self.graph_off,
            self.index_region_off,
            *self.kind_counts,
            self.external_count,
            self.kind_run_count,
            self.id_run_count,
            self.id_count,
            self.commit_count,
            self.commit_parent_count,
            self.commit_member_count,
            self.graph_commit_count,
            self.graph_parent_count,
            self.graph_member_count,
            self.layer_kind,
            self.index_region_crc,
            0,
            MAGIC,
        )
        crc = zlib.crc32(body[:FOOTER_CRC_AT])
        return body[:FOOTER_CRC_AT] + crc.to_bytes(4, "little") + MAGIC

    @classmethod
    def decode(cls, raw: bytes) -> Footer:
        """Check the magic and the footer crc32, then unpack (any failure: section "footer")."""
        if len(raw) != FOOTER_BYTES:
            raise CorruptData("layer file is shorter than its footer", section=S_FOOTER)
        if raw[-8:] != MAGIC:
            raise CorruptData("layer footer has no ENRLAYR1 magic", section=S_FOOTER)
        crc = int.from_bytes(raw[FOOTER_CRC_AT : FOOTER_CRC_AT + 4], "little")
        if zlib.crc32(raw[:FOOTER_CRC_AT]) != crc:
            raise CorruptData("layer footer fails its crc32", section=S_FOOTER)
        v = FOOTER.unpack(raw)
        return cls(
            data_end=v[0],
            table_off=v[1],
            oid_index_off=v[2],
            external_off=v[3],
            commit_off=v[4],
            graph_off=v[5],
            index_region_off=v[6],
            kind_counts=(v[7], v[8], v[9], v[10]),
            external_count=v[11],
            kind_run_count=v[12],
            id_run_count=v[13],
            id_count=v[14],
            commit_count=v[15],
            commit_parent_count=v[16],
            commit_member_count=v[17],
            graph_commit_count=v[18],
            graph_parent_count=v[19],
            graph_member_count=v[20],
            layer_kind=v[21],
            index_region_crc=v[22],
        )


FOOTER_CRC_AT: Final = FOOTER_BYTES - 12
"""The footer crc32 covers bytes [0, 120) of the footer; the magic follows it."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Section offsets as the counts dictate them (the writer's plan, the reader's check)."""

    data_end: int
    table_off: int
    oid_index_off: int
    external_off: int
    commit_off: int
    graph_off: int
    index_region_off: int

    @classmethod
    def compute(
        cls,
        *,
        data_end: int,
        object_count: int,
        external_count: int,
        commit_count: int,
        commit_parent_count: int,
        commit_member_count: int,
        graph_commit_count: int,
        graph_parent_count: int,
        graph_member_count: int,
    ) -> Layout:
        table_off = align_page(data_end)
        oid_index_off = align_page(table_off + object_count * RECORD.size)
        external_off = oid_index_off + index_pages(object_count) * PAGE_BYTES
        commit_off = external_off + external_count * OID_BYTES
        graph_off = commit_off + (
            commit_count * COMMIT_RECORD.size + (commit_parent_count + commit_member_count) * 4
        )
        index_region_off = graph_off + (
            graph_commit_count * GRAPH_BYTES_PER_COMMIT
            + (graph_parent_count + graph_member_count) * 4
        )
        return cls(
            data_end,
            table_off,
            oid_index_off,
            external_off,
            commit_off,
            graph_off,
            index_region_off,
        )

    @classmethod
    def of_footer(cls, f: Footer) -> Layout:
        return cls.compute(
            data_end=f.data_end,
            object_count=f.object_count,
            external_count=f.external_count,
            commit_count=f.commit_count,
            commit_parent_count=f.commit_parent_count,
            commit_member_count=f.commit_member_count,
            graph_commit_count=f.graph_commit_count,
            graph_parent_count=f.graph_parent_count,
            graph_member_count=f.graph_member_count,
        )

    def matches(self, f: Footer) -> bool:
        return (
            self.data_end,
            self.table_off,
            self.oid_index_off,
            self.external_off,
            self.commit_off,
            self.graph_off,
            self.index_region_off,
        ) == (
            f.data_end,
            f.table_off,
            f.oid_index_off,
            f.external_off,
            f.commit_off,
            f.graph_off,
            f.index_region_off,
        )

    @property
    def chunk_count(self) -> int:
        """Chunks of [0, index_region_off), the last one short."""
        return ceil_div(self.index_region_off, CHUNK_BYTES)

    def sections(self) -> tuple[tuple[str, int, int], ...]:
        """Extents of the hashed sections; zero padding belongs to the section it follows."""
        return tuple(
            (name, start, end)
            for name, start, end in (
                (S_DATA, 0, self.table_off),
                (S_TABLE, self.table_off, self.oid_index_off),
                (S_OID_INDEX, self.oid_index_off, self.external_off),
                (S_EXTERNAL, self.external_off, self.commit_off),
                (S_COMMITS, self.commit_off, self.graph_off),
                (S_GRAPH, self.graph_off, self.index_region_off),
            )
            if end > start
        )

    def sections_of_chunk(self, chunk: int) -> str:
        """Names of the sections chunk ``chunk`` overlaps, joined for CorruptData(section=...)."""
        start = chunk * CHUNK_BYTES
        end = min(start + CHUNK_BYTES, self.index_region_off)
        names = [n for n, s, e in self.sections() if s < end and e > start]
        return ", ".join(names)


@dataclass(frozen=True, slots=True)
class IndexRegionLayout:
    """Offsets inside the index region (relative to its start), from counts and Bloom m."""

    samples_off: int
    kind_runs_off: int
    id_runs_off: int
    bloom_off: int
    bloom_bits_off: int
    chunk_hashes_off: int
    end: int

    @classmethod
    def compute(
        cls,
        *,
        kind_counts: tuple[int, int, int, int],
        kind_run_count: int,
        id_run_count: int,
        bloom_bits: int,
        chunk_count: int,
    ) -> IndexRegionLayout:
        samples = sum(sample_count(c) for c in kind_counts)
        kind_runs_off = samples * OID_BYTES
        id_runs_off = kind_runs_off + kind_run_count * RUN.size
        bloom_off = id_runs_off + id_run_count * RUN.size
        bloom_bits_off = bloom_off + BLOOM_HEADER.size
        chunk_hashes_off = bloom_bits_off + bloom_bits // 8
        end = chunk_hashes_off + chunk_count * CHUNK_HASH_BYTES
        return cls(0, kind_runs_off, id_runs_off, bloom_off, bloom_bits_off, chunk_hashes_off, end)
