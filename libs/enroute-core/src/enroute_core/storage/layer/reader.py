"""Read an ``ENRLAYR1`` layer through a :class:`ByteSource` (seed 004, "Layers").

Seed 004, "Layers", "Metadata is always local": everything after the data
region is loaded when the layer opens (one ranged read when the manifest gives
``meta_size``) and checked there: footer crc32, index region crc32, and the
SHA-256 of every chunk overlapping the metadata. Lookups and table reads then
never wait; only :meth:`LayerReader.entry_bytes` reads the data region, and it
checks each 1 MiB chunk the first time it touches it ("Chunk hashes verify any
chunk on its own").

All byte access goes through the page methods (``_meta_page``, ``_meta_read``,
``_data_read``), the seam where the buffer pool and the local and remote tiers
go (seed 004, "Pages and memory", Design 2). Opened with a
:class:`~enroute_core.storage.pool.BufferPool`, the reader keeps only the index
region's facts (Bloom, samples, runs, chunk hashes) after the open-time checks,
and reads the object table, oid index, external oids and commit sections as
4 KiB pool pages and the data region as 64 KiB pool pages. Each read carries
an :class:`~enroute_core.storage.pool.Intent`; without one, a read of
``SCAN_READ_BYTES`` or more (a serving window, a slab of records, a chunk
check) is a scan and goes in cold, anything smaller is a point read. Without a
pool (inline layers, whose bytes are already in memory, and tests) the
metadata stays in memory and data pages are read from the source.

Every failed check raises :class:`CorruptData` naming the section; a chunk
hash failure names every section the chunk overlaps and its number.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from operator import add
from typing import NoReturn

import blake3
from enroute_native.pack_run import check_rows
from pyroaring import BitMap

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.git.source import ByteSource
from enroute_core.storage.layer.bloom import PROBES_MAX, bloom_may_contain
from enroute_core.storage.layer.commits import (
    CommitGraph,
    CommitInfo,
    CommitRecord,
    decode_commit_graph,
    u32_array,
)
from enroute_core.storage.layer.format import (
    BLOOM_HEADER,
    CHUNK_BYTES,
    CHUNK_HASH_BYTES,
    COMMIT_RECORD,
    DATA_PAGE_BYTES,
    EXTERNAL_MAX,
    FOOTER_BYTES,
    GRAPH_BYTES_PER_COMMIT,
    INDEX_ENTRIES_PER_PAGE,
    INDEX_ENTRY,
    LOCAL_MAX,
    OID_BYTES,
    PAGE_BYTES,
    RECORD,
    REF_EXTERNAL,
    REF_NONE,
    RUN,
    S_COMMITS,
    S_DATA,
    S_EXTERNAL,
    S_FOOTER,
    S_GRAPH,
    S_INDEX_REGION,
    S_OID_INDEX,
    S_TABLE,
    SAMPLE_EVERY,
    Footer,
    IndexRegionLayout,
    Kind,
    LayerKind,
    Layout,
    sample_count,
)
from enroute_core.storage.pool import BufferPool, Intent, PageClass, PoolFile, Region

_PER_PAGE = INDEX_ENTRIES_PER_PAGE
_ENTRY = INDEX_ENTRY.size
_KEY_END = 1 << 64
SCAN_READ_BYTES = 128 * 1024  # a read this long without an explicit intent is a scan


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """One object-table record ("Layers": oid, offset, length, size, base ref,
    base-context ref, depth)."""

    oid: ObjectId
    offset: int
    length: int
    size: int
    base_ref: int
    base_context_ref: int
    depth: int


@dataclass(frozen=True, slots=True)
class CommitColumns:
    """The commit section decoded whole ("Layers": commit section), one column per record
    field by rank plus the shared arrays, so a view is built from arrays, not records."""

    local_indexes: array[int]
    tree_refs: array[int]
    times: array[int]
    parent_starts: array[int]
    parent_counts: array[int]
    member_starts: array[int]
    member_counts: array[int]
    parent_refs: array[int]
    member_refs: array[int]

    def __len__(self) -> int:
        return len(self.local_indexes)

    def records(self) -> Iterator[CommitRecord]:
        """The records as :meth:`LayerReader.commit` returns them, in rank order."""
        parents, members = self.parent_refs, self.member_refs
        for local, tree, time, ps, pc, ms, mc in zip(
            self.local_indexes,
            self.tree_refs,
            self.times,
            self.parent_starts,
            self.parent_counts,
            self.member_starts,
            self.member_counts,
            strict=True,
        ):
            yield CommitRecord(
                local, tree, time, tuple(parents[ps : ps + pc]), tuple(members[ms : ms + mc])
            )


def _corrupt(message: str, section: str, **details: object) -> NoReturn:
    raise CorruptData(message, section=section, **details)


_ROW = struct.Struct("<20xQI8xI8x")
"""The part of a :data:`RECORD` serving reads: offset, length, base ref."""
assert _ROW.size == RECORD.size


class EntryRows:
    """Records of the object table as the table's bytes, checked: ``rows[k]`` is the
    ``(offset, length, base ref)`` of the ``k``-th.

    Serving reads the table a slab of 4,096 records at a time; a tuple per record cost
    a clone about 0.3 us a record (8 ms of a 24k-object clone's 24 ms of compute CPU,
    issue 25), most of which the compiled run writer (``enroute_native.pack_run``,
    docs/native.md) then read back out of the tuples. It reads these bytes instead;
    the Python paths unpack the records they need."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes | memoryview) -> None:
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw) // RECORD.size

    def __getitem__(self, k: int) -> tuple[int, int, int]:
        if not 0 <= k < len(self.raw) // RECORD.size:
            raise IndexError(f"row {k} is outside 0..{len(self)}")
        return _ROW.unpack_from(self.raw, k * RECORD.size)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return _ROW.iter_unpack(self.raw)


def bad_row(
    raw: bytes | memoryview, start: int, data_end: int, externals: int
) -> tuple[int, str] | None:
    """The first record of ``raw`` (records from local ``start``) that fails the
    checks :meth:`LayerReader.record` makes of its extent and base ref, with why; None
    when all pass. The reference of the compiled ``check_rows``, and the words of
    its failure."""
    for k, (offset, length, base) in enumerate(_ROW.iter_unpack(raw)):
        if not 0 < length <= data_end - offset:
            return k, "record points outside the data region"
        if base != REF_NONE and not (
            (base & ~REF_EXTERNAL) < externals if base & REF_EXTERNAL else base < start + k
        ):
            return k, "invalid delta base ref"
    return None


def _read_exact(source: ByteSource, offset: int, length: int, section: str) -> bytes:
    data = source.read_at(offset, length)
    if len(data) != length:
        _corrupt(f"short read at {offset}: {len(data)} of {length} bytes", section, offset=offset)
    return bytes(data)


class LayerReader:
    """An open layer: metadata in memory, data read page by page on demand."""

    __slots__ = (
        "_bits",
        "_bloom",
        "_chunk_hashes",
        "_commit_members_off",
        "_commit_parents_off",
        "_footer",
        "_graph",
        "_index_pages_off",
        "_kind_base",
        "_kind_counts",
        "_kind_probe",
        "_kind_probe_one",
        "_layout",
        "_meta",
        "_meta_base",
        "_meta_first_page",
        "_missing",
        "_n",
        "_pfile",
        "_pool",
        "_probes",
        "_run_ids",
        "_run_kinds",
        "_run_locals",
        "_run_starts",
        "_sample_keys",
        "_samples",
        "_size",
        "_source",
        "_touch",
        "_verified",
    )

    def __init__(
        self, source: ByteSource, footer: Footer, meta: bytes, meta_base: int, limits: Limits
    ) -> None:
        """Use :meth:`open`; this checks what ``open`` loaded."""
        self._source = source
        self._missing = getattr(source, "missing", None)
        self._touch = getattr(source, "touch", None)
        """Marks chunks referenced on the disk budget (a budgeted copy); None elsewhere."""
        """Chunks of a list that are not local (a local copy); None: all bytes are here."""
        self._size = source.size
        self._footer = footer
        self._meta = meta
        self._meta_base = meta_base
        self._graph: CommitGraph | None = None
        self._pool: BufferPool | None = None
        self._pfile: PoolFile | None = None
        self._meta_first_page = 0
        self._layout = self._check_footer(footer, self._size, limits)
        self._load_index_region()
        self._verified = bytearray(self._layout.chunk_count)
        for chunk in range(meta_base // CHUNK_BYTES, self._layout.chunk_count):
            self._verify_chunk(chunk)
        if getattr(source, "known", False):
            # seed 004, "Layers": chunk hashes check bytes of unknown state before first
            # use; a source whose chunks are known (LocalCopy.known) needs no second check,
            # which was a SHA-256 of every byte on the first clone after a push
            self._verified[:] = b"\x01" * len(self._verified)

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        source: ByteSource,
        *,
        meta_size: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
        pool: BufferPool | None = None,
        name: str = "layer",
    ) -> LayerReader:
        """Load and check the metadata: one read with ``meta_size``, else footer then the rest.

        Checks, in order: footer magic and crc32 ("footer"), offsets against
        counts ("footer"), index region crc32 ("index region"), the SHA-256 of
        every chunk overlapping the metadata (the sections of the chunk).
        With ``pool``, the checked metadata bytes are then let go and every
        later read goes through the pool's pages (file ``name``); call
        :meth:`close` when the layer is closed.
        """
        size = source.size
        if size < FOOTER_BYTES:
            _corrupt("layer file is shorter than its footer", S_FOOTER, size=size)
        if meta_size is not None:
            if not FOOTER_BYTES <= meta_size <= size:
                _corrupt(f"metadata size {meta_size} does not fit a {size}-byte file", S_FOOTER)
            data_end = size - meta_size
            meta_base = data_end - data_end % CHUNK_BYTES
            check_limit("layer_meta_bytes_max", size - meta_base, limits.layer_meta_bytes_max)
            meta = _read_exact(source, meta_base, size - meta_base, S_FOOTER)
            footer = Footer.decode(meta[-FOOTER_BYTES:])
            if footer.data_end != data_end:
                _corrupt(
                    "metadata size disagrees with the footer",
                    S_FOOTER,
                    meta_size=meta_size,
                    data_end=footer.data_end,
                )
        else:
            footer = Footer.decode(_read_exact(source, size - FOOTER_BYTES, FOOTER_BYTES, S_FOOTER))
            if footer.data_end > size - FOOTER_BYTES:
                _corrupt("data region ends past the footer", S_FOOTER)
            meta_base = footer.data_end - footer.data_end % CHUNK_BYTES
            check_limit("layer_meta_bytes_max", size - meta_base, limits.layer_meta_bytes_max)
            meta = _read_exact(source, meta_base, size - meta_base, S_FOOTER)
        reader = cls(source, footer, meta, meta_base, limits)
        if pool is not None:
            reader._attach_pool(pool, name)
        return reader

    def _attach_pool(self, pool: BufferPool, name: str) -> None:
        """Register the file with the pool: data pages up to the metadata chunk, then
        4 KiB pages (seed 004, "Pages and memory", Design 2). The metadata chunk starts
        on a 1 MiB boundary, so both page grids line up with the file's own offsets."""
        source, base = self._source, self._meta_base

        read_intent = getattr(source, "read_intent", None)

        def load(offset: int, length: int, intent: Intent) -> bytes:
            if read_intent is not None and offset < base:
                # seed 004, "Intent steers eviction": a point read's pool miss marks
                # its chunks referenced on the disk budget, a scan's does not.
                data = read_intent(offset, length, intent)
                if len(data) != length:
                    _corrupt(f"short read at {offset}", S_DATA, offset=offset)
                return bytes(data)
            return _read_exact(source, offset, length, S_DATA if offset < base else S_FOOTER)

        regions = [Region(base, self._size, PageClass.META)]
        if base:
            regions.insert(0, Region(0, base, PageClass.DATA))
        self._pfile = pool.open_file(name, self._size, load, regions)
        self._meta_first_page = base // DATA_PAGE_BYTES
        self._pool = pool
        self._meta = b""

    @property
    def pool_file(self) -> PoolFile | None:
        """The pool's page table of this layer, when it reads through a pool."""
        return self._pfile

    def close(self) -> None:
        """Let the pool drop this layer's pages (lazily, Design 2); reads fail after."""
        if self._pool is not None and self._pfile is not None:
            self._pool.close_file(self._pfile)

    @staticmethod
    def _check_footer(f: Footer, size: int, limits: Limits) -> Layout:
        """The footer's offsets must be the ones its counts dictate (docs/formats/layer.md)."""
        layout = Layout.of_footer(f)
        if not layout.matches(f):
            _corrupt("section offsets disagree with the counts", S_FOOTER)
        if layout.index_region_off > size - FOOTER_BYTES:
            _corrupt("sections run past the footer", S_FOOTER)
        n = f.object_count
        if n > LOCAL_MAX + 1 or f.external_count > EXTERNAL_MAX + 1:
            _corrupt("more objects than refs can name", S_FOOTER)
        if f.layer_kind not in (LayerKind.PUSHED, LayerKind.MERGED):
            _corrupt(f"unknown layer kind {f.layer_kind}", S_FOOTER)
        if not (min(n, 1) <= f.kind_run_count <= n and min(n, 1) <= f.id_run_count <= n):
            _corrupt("run counts do not fit the object count", S_FOOTER)
        if f.id_count < n or f.commit_count > f.kind_counts[Kind.COMMIT]:
            _corrupt("id or commit counts do not fit the object counts", S_FOOTER)
        if f.layer_kind == LayerKind.PUSHED:
            if f.id_run_count != min(n, 1) or f.id_count != n or f.graph_commit_count:
                _corrupt("a pushed layer has one id run and no commit graph", S_FOOTER)
            if f.graph_parent_count or f.graph_member_count:
                _corrupt("a pushed layer has no commit graph", S_FOOTER)
        check_limit("layer_objects_max", n, limits.layer_objects_max)
        return layout

    def _load_index_region(self) -> None:
        """Crc, then samples, kind runs, id runs and Bloom into memory ("Layers")."""
        f, layout = self._footer, self._layout
        start = layout.index_region_off - self._meta_base
        region = self._meta[start : len(self._meta) - FOOTER_BYTES]
        if zlib.crc32(region) != f.index_region_crc:
            _corrupt("index region fails its crc32", S_INDEX_REGION)
        rl = IndexRegionLayout.compute(
            kind_counts=f.kind_counts,
            kind_run_count=f.kind_run_count,
            id_run_count=f.id_run_count,
            bloom_bits=0,
            chunk_count=0,
        )
        if len(region) < rl.bloom_bits_off:
            _corrupt("index region is too short", S_INDEX_REGION)
        bits, probes, reserved = BLOOM_HEADER.unpack_from(region, rl.bloom_off)
        if bits < 64 or bits % 64 or not 1 <= probes <= PROBES_MAX or reserved:
            _corrupt("Bloom parameters are invalid", S_INDEX_REGION, bits=bits, probes=probes)
        rl = IndexRegionLayout.compute(
            kind_counts=f.kind_counts,
            kind_run_count=f.kind_run_count,
            id_run_count=f.id_run_count,
            bloom_bits=bits,
            chunk_count=layout.chunk_count,
        )
        if rl.end != len(region):
            _corrupt("index region length disagrees with its contents", S_INDEX_REGION)
        self._bits, self._probes = bits, probes
        self._bloom = region[rl.bloom_bits_off : rl.chunk_hashes_off]
        self._chunk_hashes = [
            region[p : p + CHUNK_HASH_BYTES] for p in range(rl.chunk_hashes_off, rl.end, 32)
        ]
        self._n = f.object_count
        self._kind_counts = f.kind_counts
        self._kind_base = tuple(sum(f.kind_counts[:k]) for k in range(4))
        self._load_samples(region)
        self._index_pages_off = layout.oid_index_off
        # Per kind: samples, their keys (plus an end sentinel), count, first index entry.
        probe = [
            (self._samples[k], [*self._sample_keys[k], _KEY_END], count, self._kind_base[k])
            for k, count in enumerate(f.kind_counts)
        ]
        self._kind_probe = tuple(
            probe[k] for k in sorted(range(4), key=lambda k: -f.kind_counts[k]) if probe[k][2]
        )
        self._kind_probe_one = tuple((probe[k],) for k in range(4))
        self._load_kind_runs(region[rl.kind_runs_off : rl.id_runs_off])
        self._load_id_runs(region[rl.id_runs_off : rl.bloom_off])
        self._commit_parents_off = layout.commit_off + f.commit_count * COMMIT_RECORD.size
        self._commit_members_off = self._commit_parents_off + f.commit_parent_count * 4

    def _load_samples(self, region: bytes) -> None:
        pos = 0
        samples: list[list[bytes]] = []
        for count in self._kind_counts:
            end = pos + sample_count(count) * OID_BYTES
            run = [region[p : p + OID_BYTES] for p in range(pos, end, OID_BYTES)]
            pos += len(run) * OID_BYTES
            if any(a >= b for a, b in pairwise(run)):
                _corrupt("oid samples are not ascending", S_INDEX_REGION)
            samples.append(run)
        self._samples = tuple(samples)
        self._sample_keys = tuple([int.from_bytes(s[:8], "big") for s in run] for run in samples)

    def _load_kind_runs(self, raw: bytes) -> None:
        runs = list(RUN.iter_unpack(raw))
        n = self._n
        counts = [0, 0, 0, 0]
        pushed = self._footer.layer_kind == LayerKind.PUSHED
        for r, (start, kind) in enumerate(runs):
            end = runs[r + 1][0] if r + 1 < len(runs) else n
            if kind > Kind.TAG or not start < end or (r == 0 and start != 0):
                _corrupt("kind runs are invalid", S_INDEX_REGION, run=r)
            if r and (kind == runs[r - 1][1] or (pushed and kind < runs[r - 1][1])):
                _corrupt("kind runs are not in storage order", S_INDEX_REGION, run=r)
            counts[kind] += end - start
        if tuple(counts) != self._kind_counts:
            _corrupt("kind runs disagree with the per-kind counts", S_INDEX_REGION)
        self._run_starts: list[int] = [s for s, _ in runs]
        self._run_kinds = bytes(k for _, k in runs)

    def _load_id_runs(self, raw: bytes) -> None:
        runs = list(RUN.iter_unpack(raw))
        n = self._n
        for r, ((l0, i0), (l1, i1)) in enumerate(pairwise(runs), start=1):
            if not l0 < l1 < n or i1 <= i0 + (l1 - l0):
                _corrupt("id runs are invalid", S_INDEX_REGION, run=r)
        if runs and (runs[0][0] != 0 or runs[-1][1] + n - runs[-1][0] > self._footer.id_count):
            _corrupt("id runs do not fit the id count", S_INDEX_REGION)
        if self._footer.layer_kind == LayerKind.PUSHED and runs and runs[0] != (0, 0):
            _corrupt("a pushed layer's id run is (0, 0)", S_INDEX_REGION)
        self._run_locals: list[int] = [a for a, _ in runs]
        self._run_ids: list[int] = [b for _, b in runs]

    # -- pages: every byte goes through these -----------------------------------------------

    def _meta_page(self, page_off: int) -> bytes:
        """The 4 KiB page at ``page_off`` (>= the metadata start, page-aligned)."""
        start = page_off - self._meta_base
        if self._pool is not None:
            return self._pool_page(self._meta_first_page + (start >> 12))
        return self._meta[start : start + PAGE_BYTES]

    def _pool_page(self, page_no: int) -> bytes:
        """A copy of one pool page, read as a point read (the lookup path)."""
        assert self._pool is not None and self._pfile is not None
        return self._pool.read_page(self._pfile, page_no, 0, PAGE_BYTES, Intent.POINT)

    def _meta_read(self, offset: int, length: int, intent: Intent | None = None) -> bytes:
        """Bytes of the metadata; without a pool one slice of what ``open`` loaded."""
        start = offset - self._meta_base
        pool = self._pool
        if pool is not None:
            if start < 0 or offset + length > self._size:
                raise ValueError(f"[{offset}, {offset + length}) is outside the metadata")
            skip = start % PAGE_BYTES
            if length > 0 and skip + length <= PAGE_BYTES:  # the common case, inlined
                assert self._pfile is not None
                page_no = self._meta_first_page + start // PAGE_BYTES
                return pool.read_page(
                    self._pfile, page_no, skip, skip + length, intent or Intent.POINT
                )
            return self._pool_read(offset, length, intent)
        if start < 0 or start + length > len(self._meta):
            raise ValueError(f"[{offset}, {offset + length}) is outside the metadata")
        return self._meta[start : start + length]

    def _pool_read(self, offset: int, length: int, intent: Intent | None) -> bytes:
        """``[offset, offset + length)`` through pool pages.

        A scan (``Intent.SCAN``, or no intent and ``SCAN_READ_BYTES`` or more) reads
        through the pool
        (:meth:`BufferPool.read_through`: resident pages copied, one loader call
        per run of missing ones, nothing kept), since a serving window or a slab
        of records is read once per clone and pages kept for it would only fill
        the pool (issue 25).
        """
        pool, pfile = self._pool, self._pfile
        assert pool is not None and pfile is not None
        if length <= 0:
            return b""
        if intent is Intent.SCAN:
            return pool.read_through(pfile, offset, length)
        # One page (a record, an entry, an oid): page number by arithmetic, one lock.
        rel = offset - self._meta_base
        if rel >= 0:
            skip = rel % PAGE_BYTES
            if skip + length <= PAGE_BYTES:
                page_no = self._meta_first_page + rel // PAGE_BYTES
                return pool.read_page(pfile, page_no, skip, skip + length, intent or Intent.POINT)
        else:
            skip = offset % DATA_PAGE_BYTES
            if skip + length <= DATA_PAGE_BYTES:
                page_no = offset // DATA_PAGE_BYTES
                return pool.read_page(pfile, page_no, skip, skip + length, intent or Intent.POINT)
        if intent is None and length >= SCAN_READ_BYTES:
            return pool.read_through(pfile, offset, length)
        return pool.read(pfile, offset, length, intent or Intent.POINT)

    def _data_page(self, page_off: int) -> bytes:
        """The 64 KiB page at ``page_off``; pages from the metadata start on are in memory."""
        if page_off >= self._meta_base:
            start = page_off - self._meta_base
            return self._meta[start : start + DATA_PAGE_BYTES]
        length = min(DATA_PAGE_BYTES, self._size - page_off)
        return _read_exact(self._source, page_off, length, S_DATA)

    def _data_read(self, offset: int, length: int, intent: Intent | None = None) -> bytes:
        if self._pool is not None:
            return self._pool_read(offset, length, intent)
        page_off = offset - offset % DATA_PAGE_BYTES
        skip = offset - page_off
        if skip + length <= DATA_PAGE_BYTES:
            return self._data_page(page_off)[skip : skip + length]
        parts = []
        end = offset + length
        while page_off < end:
            parts.append(self._data_page(page_off))
            page_off += DATA_PAGE_BYTES
        return b"".join(parts)[skip : skip + length]

    # -- chunks -----------------------------------------------------------------------------

    def _verify_chunk(self, chunk: int) -> None:
        start = chunk * CHUNK_BYTES
        end = min(start + CHUNK_BYTES, self._layout.index_region_off)
        digest = hashlib.sha256(self._data_read(start, end - start, Intent.SCAN)).digest()
        if digest != self._chunk_hashes[chunk]:
            _corrupt(
                f"chunk {chunk} fails its SHA-256",
                self._layout.sections_of_chunk(chunk),
                chunk=chunk,
            )
        self._verified[chunk] = 1

    # -- residency (seed 004, "Residency": what a read needs, found without reading) --------

    @property
    def name(self) -> str | None:
        """The layer's file name in storage (what loads name it by); None for a layer
        read from memory (inline), whose bytes are all here."""
        return self._pfile.name if self._pfile is not None else None

    def settled(self) -> bool:
        """No read of this layer can find its bytes missing (in memory, a linked copy, a
        complete copy outside any disk budget): callers skip the load step."""
        settled = getattr(self._source, "settled", None)
        return settled is None or bool(settled())

    def entry_local(self, local_index: int) -> bool:
        """Whether the entry's bytes are local (table record only, no data read)."""
        if self._missing is None:
            return True
        offset, length, _ = self.entry_row(local_index)
        return not self._missing(self.data_chunks_for(offset, length))

    def local_bytes(self, offset: int, length: int) -> int:
        """How many bytes from ``offset`` (up to ``length``) can be read without a load:
        a reader of a window clips it here instead of reading past what was loaded."""
        if self._missing is None or length <= 0:
            return length
        missing: list[int] = self._missing(self.data_chunks_for(offset, length))
        if not missing:
            return length
        return max(0, min(length, missing[0] * CHUNK_BYTES - offset))

    def data_chunks_for(self, offset: int, length: int) -> range:
        """Chunks a read of [offset, offset+length) needs, page-aligned (seed 004, "Residency")."""
        end = offset + length
        if offset < 0 or length <= 0 or end > self._layout.index_region_off:
            raise ValueError(f"[{offset}, {end}) is not inside the hashed part of the layer")
        first = offset - offset % DATA_PAGE_BYTES
        last = min(-(-end // DATA_PAGE_BYTES) * DATA_PAGE_BYTES, self._layout.index_region_off)
        return range(first // CHUNK_BYTES, (last - 1) // CHUNK_BYTES + 1)

    # -- facts held in memory ---------------------------------------------------------------

    @property
    def object_count(self) -> int:
        return self._n

    @property
    def id_count(self) -> int:
        """Ids the layer's range covers, holes included ("Stable object numbering")."""
        return self._footer.id_count

    @property
    def kind_counts(self) -> tuple[int, int, int, int]:
        return self._kind_counts

    @property
    def is_merged(self) -> bool:
        return self._footer.layer_kind == LayerKind.MERGED

    @property
    def file_size(self) -> int:
        return self._size

    @property
    def meta_size(self) -> int:
        return self._size - self._footer.data_end

    @property
    def data_end(self) -> int:
        return self._footer.data_end

    @property
    def chunk_count(self) -> int:
        return self._layout.chunk_count

    def chunk_hash(self, chunk: int) -> bytes:
        """The SHA-256 of ``chunk`` from the index region (seed 004, "Layers": chunk hashes)."""
        return self._chunk_hashes[chunk]

    @property
    def external_count(self) -> int:
        return self._footer.external_count

    @property
    def commit_count(self) -> int:
        return self._footer.commit_count

    @property
    def kind_runs(self) -> tuple[tuple[int, int, Kind], ...]:
        """(first local index, end, kind) per run of the table."""
        ends = [*self._run_starts[1:], self._n]
        return tuple(
            (s, e, Kind(k)) for s, e, k in zip(self._run_starts, ends, self._run_kinds, strict=True)
        )

    @property
    def id_runs(self) -> tuple[tuple[int, int], ...]:
        """(first local index, id relative to the range start) per run."""
        return tuple(zip(self._run_locals, self._run_ids, strict=True))

    def kind_of(self, local_index: int) -> Kind:
        """From the kind runs in memory: no read ("Layers": "Splitting by type")."""
        self._check_local(local_index)
        return Kind(self._run_kinds[bisect_right(self._run_starts, local_index) - 1])

    def id_of(self, local_index: int) -> int:
        """The id relative to the range start: an addition, or a run search and an addition."""
        self._check_local(local_index)
        r = bisect_right(self._run_locals, local_index) - 1
        return self._run_ids[r] + local_index - self._run_locals[r]

    def local_of(self, rel_id: int) -> int | None:
        """The local index of a relative id; None for a hole or an id outside the range."""
        if not 0 <= rel_id < self._footer.id_count:
            return None
        r = bisect_right(self._run_ids, rel_id) - 1
        if r < 0:
            return None
        local = self._run_locals[r] + rel_id - self._run_ids[r]
        end = self._run_locals[r + 1] if r + 1 < len(self._run_locals) else self._n
        return local if local < end else None

    def _check_local(self, local_index: int) -> None:
        if not 0 <= local_index < self._n:
            raise IndexError(f"local index {local_index} is outside 0..{self._n}")

    # -- lookup -----------------------------------------------------------------------------

    def lookup(self, oid: bytes, kind: Kind | None = None) -> int | None:
        """Local index of ``oid``, or None ("Layers": "Lookup reads one page").

        Bloom filter, then a bisect of the in-memory samples, then one oid index
        page chosen by interpolation and scanned. ``kind`` limits the search to
        one kind's run of the index. Interpolation misses the page only when
        the entry sits near a page boundary; then :meth:`_walk` reads the
        neighbours. This is the hottest path of the layer, hence inlined.
        """
        if type(oid) is not bytes:
            oid = bytes(oid)
        if len(oid) != OID_BYTES:
            raise ValueError(f"not a 20-byte object id: {oid!r}")
        if not self._bloom_has(oid):
            return None
        key = int.from_bytes(oid[:8], "big")
        misses = []
        for samples, keys, count, base in (
            self._kind_probe if kind is None else self._kind_probe_one[kind]
        ):
            b = bisect_right(samples, oid) - 1
            if b < 0:
                continue
            lo = b << 8
            hi = lo + SAMPLE_EVERY if lo + SAMPLE_EVERY < count else count
            k_lo = keys[b]
            est = base + lo + (key - k_lo) * (hi - lo) // (keys[b + 1] - k_lo + 1)
            first = base + lo
            last = base + hi
            page = (first if est < first else last - 1 if est >= last else est) // _PER_PAGE
            top = self._index_pages_off + (page << 12) - self._meta_base
            if self._pool is None:  # scanned in place in the metadata (no copy of it)
                pg = self._meta
            else:  # one pool page, a point read (a whole bytes page is not copied)
                pfile = self._pfile
                assert pfile is not None
                page_no = self._meta_first_page + (top >> 12)
                pg = self._pool.read_page(pfile, page_no, 0, PAGE_BYTES, Intent.POINT)
                top = 0
            end = top + min((self._n - page * _PER_PAGE) * _ENTRY, PAGE_BYTES)
            pos = pg.find(oid, top, end)  # no oid fits in the 16 bytes after the entries
            while pos > top and (pos - top) % _ENTRY:
                pos = pg.find(oid, pos + 1, end)
            if pos >= 0:
                local = int.from_bytes(pg[pos + OID_BYTES : pos + _ENTRY], "little")
                if local >= self._n:
                    _corrupt("oid index names a local index past the table", S_OID_INDEX)
                if (
                    kind is None
                    or self._run_kinds[bisect_right(self._run_starts, local) - 1] == kind
                ):
                    return local
                return None
            misses.append((first, last, page))
        for first, last, page in misses:
            found = self._walk(first, last, page, oid)
            if found is not None:
                return found if kind is None or self.kind_of(found) == kind else None
        return None

    def _bloom_has(self, oid: bytes) -> bool:
        """The filter of the index region (bloom.py), on small ints: a lookup's first step."""
        bits, filt = self._bits, self._bloom
        a = int.from_bytes(oid[0:8], "little") % bits
        b = (int.from_bytes(oid[8:16], "little") | 1) % bits
        for _ in range(self._probes):
            if not (filt[a >> 3] >> (a & 7)) & 1:
                return False
            a = (a + b) % bits
        return True

    def _scan(self, page: int, oid: bytes) -> int | None:
        """Find ``oid`` among the entries of one index page: of any kind, since an oid is
        stored once in a layer (``lookup`` checks the kind when one is asked for)."""
        pg = self._meta_page(self._layout.oid_index_off + page * PAGE_BYTES)
        end = min(self._n - page * _PER_PAGE, _PER_PAGE) * _ENTRY
        pos = pg.find(oid, 0, end)
        while pos > 0 and pos % _ENTRY:
            pos = pg.find(oid, pos + 1, end)
        if pos < 0:
            return None
        local = int.from_bytes(pg[pos + OID_BYTES : pos + _ENTRY], "little")
        if local >= self._n:
            _corrupt("oid index names a local index past the table", S_OID_INDEX)
        return local

    def _walk(self, first: int, last: int, page: int, oid: bytes) -> int | None:
        """Move from the guessed page to the neighbour that must hold ``oid``, if any."""
        pages = range(first // _PER_PAGE, (last - 1) // _PER_PAGE + 1)
        base_off = self._layout.oid_index_off
        pg = self._meta_page(base_off + page * PAGE_BYTES)
        top = page * _PER_PAGE
        a = (max(first, top) - top) * _ENTRY
        z = (min(last, top + _PER_PAGE) - top) * _ENTRY
        if oid < pg[a : a + OID_BYTES]:
            step = -1
        elif oid > pg[z - _ENTRY : z - 4]:
            step = 1
        else:
            return None  # inside the guessed page's range, and _scan did not find it
        page += step
        while page in pages:  # at most 2 more: 256 entries span at most 3 pages of 170
            local = self._scan(page, oid)
            if local is not None:
                return local
            pg = self._meta_page(base_off + page * PAGE_BYTES)
            top = page * _PER_PAGE
            a = (max(first, top) - top) * _ENTRY
            z = (min(last, top + _PER_PAGE) - top) * _ENTRY
            if (step < 0 and oid > pg[a : a + OID_BYTES]) or (
                step > 0 and oid < pg[z - _ENTRY : z - 4]
            ):
                return None
            page += step
        return None

    # -- records and refs -------------------------------------------------------------------

    def record(self, local_index: int) -> ObjectRecord:
        """The table record; its refs and extent are checked before it is returned."""
        self._check_local(local_index)
        raw = self._meta_read(self._layout.table_off + local_index * RECORD.size, RECORD.size)
        oid, offset, length, size, base, ctx, depth = RECORD.unpack(raw)
        if not 0 < length <= self._footer.data_end - offset:
            _corrupt("record points outside the data region", S_TABLE, local_index=local_index)
        if base == REF_NONE:
            if depth:
                _corrupt("full entry with a delta depth", S_TABLE, local_index=local_index)
        elif not depth or not self._ref_ok(base, local_index):
            _corrupt("invalid delta base ref", S_TABLE, local_index=local_index)
        if ctx != REF_NONE and (ctx == local_index or not self._ref_ok(ctx, self._n)):
            _corrupt("invalid base-context ref", S_TABLE, local_index=local_index)
        return ObjectRecord(ObjectId(oid), offset, length, size, base, ctx, depth)

    def _ref_ok(self, ref: int, local_below: int) -> bool:
        if ref == REF_NONE:
            return False
        if ref & REF_EXTERNAL:
            return (ref & ~REF_EXTERNAL) < self._footer.external_count
        return ref < local_below

    def ref_oid(self, ref: int) -> ObjectId:
        """The oid a ref names: a local index or an index into the external oids."""
        if not self._ref_ok(ref, self._n):
            raise ValueError(f"ref {ref:#x} names nothing in this layer")
        if ref & REF_EXTERNAL:
            return self.external_oid(ref & ~REF_EXTERNAL)
        raw = self._meta_read(self._layout.table_off + ref * RECORD.size, OID_BYTES)
        return ObjectId(raw)

    def external_oid(self, index: int) -> ObjectId:
        if not 0 <= index < self._footer.external_count:
            raise IndexError(f"external index {index} is outside 0..{self._footer.external_count}")
        return ObjectId(self._meta_read(self._layout.external_off + index * OID_BYTES, OID_BYTES))

    @property
    def external_oids(self) -> tuple[ObjectId, ...]:
        raw = self._meta_read(self._layout.external_off, self._footer.external_count * OID_BYTES)
        return tuple(ObjectId(raw[p : p + OID_BYTES]) for p in range(0, len(raw), OID_BYTES))

    def entry_bytes(self, local_index: int, intent: Intent | None = None) -> bytes:
        """The stored pack entry, after checking every chunk it touches (once per chunk)."""
        rec = self.record(local_index)
        return self.data_bytes(rec.offset, rec.length, intent)

    def data_bytes(self, offset: int, length: int, intent: Intent | None = None) -> bytes:
        """Bytes of the data region (a run of entries), chunks checked once each.

        Serving copies runs of stored entries verbatim ("Entries are stored as
        pack entries, so serving copies them"), so it reads spans, not entries.
        """
        if length > self._footer.data_end - offset:
            raise ValueError(f"[{offset}, {offset + length}) runs past the data region")
        verified = self._verified
        chunks = self.data_chunks_for(offset, length)
        for chunk in chunks:
            if not verified[chunk]:
                self._verify_chunk(chunk)
        if self._touch is not None:
            # seed 004, "Intent steers eviction": a point read keeps its chunks on disk
            # even when the pool answers it; a scan leaves them cold
            point = intent is Intent.POINT or (intent is None and length < SCAN_READ_BYTES)
            if point:
                self._touch(chunks, Intent.POINT)
        return self._data_read(offset, length, intent)

    def entry_row(self, local_index: int) -> tuple[int, int, int]:
        """``(offset, length, base ref)`` of one record, checked as :meth:`entry_rows` checks."""
        return self.entry_rows(local_index, local_index + 1)[0]

    def entry_rows(self, start: int, stop: int, intent: Intent | None = None) -> EntryRows:
        """The records ``[start, stop)`` as :class:`EntryRows`, in one table read.

        The extent and base ref of each record are checked as :meth:`record` checks
        them, all at once by compiled code (``check_rows``; :func:`bad_row` words a
        failure); serving decodes the table a slab at a time instead of record by record.
        """
        if not 0 <= start <= stop <= self._n:
            raise IndexError(f"records [{start}, {stop}) are outside 0..{self._n}")
        raw = self._meta_read(
            self._layout.table_off + start * RECORD.size, (stop - start) * RECORD.size, intent
        )
        data_end, externals = self._footer.data_end, self._footer.external_count
        if check_rows(raw, start, data_end, externals) >= 0:
            k, why = bad_row(raw, start, data_end, externals) or (0, "record check failed")
            _corrupt(why, S_TABLE, local_index=start + k)
        return EntryRows(raw)

    @property
    def single_id_run(self) -> bool:
        """Local index and relative id are one (a pushed layer, or a merged one without
        holes), so the id of a local index is an addition."""
        return len(self._run_locals) <= 1 and (not self._run_ids or self._run_ids[0] == 0)

    # -- commits ----------------------------------------------------------------------------

    def commit(self, rank: int) -> CommitRecord:
        """The commit-section record at ``rank`` (topological order), refs checked."""
        f = self._footer
        if not 0 <= rank < f.commit_count:
            raise IndexError(f"commit rank {rank} is outside 0..{f.commit_count}")
        off = self._layout.commit_off + rank * COMMIT_RECORD.size
        local, tree, time, p_start, p_count, s_start, s_count = COMMIT_RECORD.unpack(
            self._meta_read(off, COMMIT_RECORD.size)
        )
        if local >= self._n or self.kind_of(local) != Kind.COMMIT:
            _corrupt("commit record names no commit entry", S_COMMITS, rank=rank)
        if p_start + p_count > f.commit_parent_count or s_start + s_count > f.commit_member_count:
            _corrupt("commit record ranges run past their arrays", S_COMMITS, rank=rank)
        parents = self._u32s(self._commit_parents_off + p_start * 4, p_count)
        members = self._u32s(self._commit_members_off + s_start * 4, s_count)
        for ref in (tree, *parents, *members):
            if not self._ref_ok(ref, self._n):
                _corrupt("commit record holds an invalid ref", S_COMMITS, rank=rank)
        return CommitRecord(local, tree, time, parents, members)

    def _u32s(self, offset: int, count: int) -> tuple[int, ...]:
        return tuple(u32_array(self._meta_read(offset, count * 4)))

    def commit_columns(self) -> CommitColumns | None:
        """The whole commit section in one read per array, checked in bulk; None when a
        check fails.

        Record by record, a view of a large push paid three pool reads and a call per
        ref for each commit. The bulk checks cover every slot of the shared arrays,
        including slots no record's range names, so a failure is not yet proof of a
        bad record: the caller then goes back to :meth:`commit`, which raises the
        first bad record's ``CorruptData`` exactly as before, or none.
        """
        f = self._footer
        raw = self._meta_read(self._layout.commit_off, f.commit_count * COMMIT_RECORD.size)
        words = u32_array(raw)  # 8 words a record: local, tree, time (2), 4 range words
        times = array("q")
        assert times.itemsize == 8, times.itemsize
        times.frombytes(raw)
        if sys.byteorder == "big":  # pragma: no cover - the file is little-endian
            times.byteswap()
        c = CommitColumns(
            local_indexes=words[0::8],
            tree_refs=words[1::8],
            times=times[1::4],
            parent_starts=words[4::8],
            parent_counts=words[5::8],
            member_starts=words[6::8],
            member_counts=words[7::8],
            parent_refs=u32_array(
                self._meta_read(self._commit_parents_off, f.commit_parent_count * 4)
            ),
            member_refs=u32_array(
                self._meta_read(self._commit_members_off, f.commit_member_count * 4)
            ),
        )
        ok = (
            self._all_commits(c.local_indexes)
            and _ranges_fit(c.parent_starts, c.parent_counts, f.commit_parent_count)
            and _ranges_fit(c.member_starts, c.member_counts, f.commit_member_count)
            and self._refs_ok(c.tree_refs)
            and self._refs_ok(c.parent_refs)
            and self._refs_ok(c.member_refs)
        )
        return c if ok else None

    def _all_commits(self, locals_: array[int]) -> bool:
        """Every local index names a commit entry (what :meth:`commit` checks one by one)."""
        if not locals_:
            return True
        if max(locals_) >= self._n:
            return False
        starts, kinds = self._run_starts, self._run_kinds
        runs = [r for r, kind in enumerate(kinds) if kind == Kind.COMMIT]
        if len(runs) == 1:  # a pushed layer's commits are one run: two comparisons
            r = runs[0]
            end = starts[r + 1] if r + 1 < len(starts) else self._n
            return starts[r] <= min(locals_) and max(locals_) < end
        return all(kinds[bisect_right(starts, x) - 1] == Kind.COMMIT for x in locals_)

    def _refs_ok(self, refs: array[int]) -> bool:
        """:meth:`_ref_ok` for a whole array: no ref between the last local index and
        the first external ref, none past the last external (``REF_NONE`` is past it).
        A bitmap is built from the array's buffer in C, and answers both in one step."""
        if not refs:
            return True
        found = BitMap(refs)
        if found.range_cardinality(self._n, REF_EXTERNAL):
            return False
        return bool(found.max() < REF_EXTERNAL + self._footer.external_count)

    def commits(self) -> Iterator[CommitRecord]:
        """The commit section in its order (parents first)."""
        columns = self.commit_columns()
        if columns is not None:
            yield from columns.records()
            return
        for rank in range(self._footer.commit_count):
            yield self.commit(rank)

    def commit_infos(self) -> Iterator[CommitInfo]:
        """The commit section with every ref resolved to its oid."""
        oid = self.ref_oid
        for c in self.commits():
            yield CommitInfo(
                oid=oid(c.local_index),
                tree=oid(c.tree_ref),
                parents=tuple(map(oid, c.parent_refs)),
                time=c.time,
                segment=tuple(map(oid, c.segment_refs)),
            )

    def commit_graph(self) -> CommitGraph | None:
        """A merged layer's commit graph by repository ids (decoded once); None when pushed."""
        if not self.is_merged:
            return None
        if self._graph is None:
            f = self._footer
            length = self._layout.index_region_off - self._layout.graph_off
            assert length == f.graph_commit_count * GRAPH_BYTES_PER_COMMIT + 4 * (
                f.graph_parent_count + f.graph_member_count
            )
            self._graph = decode_commit_graph(
                self._meta_read(self._layout.graph_off, length),
                f.graph_commit_count,
                f.graph_parent_count,
                f.graph_member_count,
            )
        return self._graph

    # -- full check -------------------------------------------------------------------------

    def verify(self) -> None:
        """Check every chunk hash and every structural invariant (maintenance, hydration)."""
        for chunk in range(self._layout.chunk_count):
            self._verify_chunk(chunk)
        self._verify_padding()
        oids = self._verify_table()
        self._verify_oid_index(oids)
        self._verify_externals()
        self._verify_commits()
        graph = self.commit_graph()
        if graph is not None:
            graph.check()
            if len(graph) != self._footer.commit_count:
                _corrupt("commit graph and commit section disagree", S_GRAPH)

    def _verify_padding(self) -> None:
        lay, n = self._layout, self._n
        gaps = (
            (S_DATA, lay.data_end, lay.table_off),
            (S_TABLE, lay.table_off + n * RECORD.size, lay.oid_index_off),
        )
        for section, start, end in gaps:
            if end > start and any(self._data_read(start, end - start)):
                _corrupt("padding is not zero", section, offset=start)

    def _verify_table(self) -> list[bytes]:
        lay, n = self._layout, self._n
        expected = 0
        oids: list[bytes] = []
        depths: list[int] = []
        for i in range(n):
            rec = self.record(i)
            if rec.offset != expected:
                _corrupt("entries are not contiguous", S_TABLE, local_index=i)
            expected += rec.length
            if rec.base_ref != REF_NONE and not rec.base_ref & REF_EXTERNAL:
                if self.kind_of(rec.base_ref) != self.kind_of(i):
                    _corrupt("delta base of another kind", S_TABLE, local_index=i)
                if rec.depth != depths[rec.base_ref] + 1:
                    _corrupt("depth is not its base's plus one", S_TABLE, local_index=i)
            oids.append(rec.oid)
            depths.append(rec.depth)
        if expected != lay.data_end:
            _corrupt("entries do not fill the data region", S_TABLE)
        return oids

    def _verify_oid_index(self, oids: list[bytes]) -> None:
        lay, n = self._layout, self._n
        seen = bytearray(n)
        pos = 0
        for kind in range(4):
            prev = b""
            for j in range(self._kind_counts[kind]):
                page, slot = divmod(pos, _PER_PAGE)
                pg = self._meta_page(lay.oid_index_off + page * PAGE_BYTES)
                oid, local = INDEX_ENTRY.unpack_from(pg, slot * _ENTRY)
                if oid <= prev or local >= n or seen[local] or oids[local] != oid:
                    _corrupt("oid index entry is out of order or wrong", S_OID_INDEX, entry=pos)
                if self.kind_of(local) != kind:
                    _corrupt("oid index entry under the wrong kind", S_OID_INDEX, entry=pos)
                if j % SAMPLE_EVERY == 0 and self._samples[kind][j // SAMPLE_EVERY] != oid:
                    _corrupt("oid sample disagrees with the oid index", S_INDEX_REGION, entry=pos)
                if not bloom_may_contain(self._bloom, self._bits, self._probes, oid):
                    _corrupt("Bloom filter misses an oid", S_INDEX_REGION, entry=pos)
                seen[local] = 1
                prev = oid
                pos += 1
        used = n * _ENTRY + (n // _PER_PAGE) * (PAGE_BYTES - _PER_PAGE * _ENTRY)
        rest = self._meta_read(lay.oid_index_off, lay.external_off - lay.oid_index_off)
        for page in range(0, len(rest), PAGE_BYTES):
            tail = rest[page + _PER_PAGE * _ENTRY : page + PAGE_BYTES]
            if any(tail):
                _corrupt("oid index page padding is not zero", S_OID_INDEX, offset=page)
        if any(rest[used:]):
            _corrupt("oid index padding is not zero", S_OID_INDEX)

    def _verify_externals(self) -> None:
        prev = b""
        for j, oid in enumerate(self.external_oids):
            if oid <= prev:
                _corrupt("external oids are not sorted", S_EXTERNAL, index=j)
            if self.lookup(oid) is not None:
                _corrupt("external oid is stored in the layer", S_EXTERNAL, index=j)
            prev = oid

    def _verify_commits(self) -> None:
        f = self._footer
        seen: set[int] = set()
        p_next = s_next = 0
        for rank in range(f.commit_count):
            c = self.commit(rank)
            off = self._layout.commit_off + rank * COMMIT_RECORD.size
            _, _, _, p_start, _, s_start, _ = COMMIT_RECORD.unpack(
                self._meta_read(off, COMMIT_RECORD.size)
            )
            if p_start != p_next or s_start != s_next or c.local_index in seen:
                _corrupt("commit records are not contiguous or repeat", S_COMMITS, rank=rank)
            p_next += len(c.parent_refs)
            s_next += len(c.segment_refs)
            if not c.tree_ref & REF_EXTERNAL and self.kind_of(c.tree_ref) != Kind.TREE:
                _corrupt("commit tree is not a tree", S_COMMITS, rank=rank)
            for p in c.parent_refs:
                if not p & REF_EXTERNAL and p not in seen:
                    _corrupt("commit comes before a parent", S_COMMITS, rank=rank)
            if any(a >= b for a, b in pairwise(c.segment_refs)):
                _corrupt("segment is not sorted and unique", S_COMMITS, rank=rank)
            seen.add(c.local_index)
        if p_next != f.commit_parent_count or s_next != f.commit_member_count:
            _corrupt("commit records do not cover their arrays", S_COMMITS)
        if len(seen) != f.kind_counts[Kind.COMMIT]:
            _corrupt("a commit entry has no commit record", S_COMMITS)


def _ranges_fit(starts: array[int], counts: array[int], total: int) -> bool:
    """Every range ``[start, start + count)`` lies inside an array of ``total``."""
    return not starts or max(map(add, starts, counts)) <= total


def root_of(source: ByteSource) -> bytes:
    """BLAKE3 of the whole file: the root the manifest names a layer by."""
    h = blake3.blake3()
    for offset in range(0, source.size, CHUNK_BYTES):
        h.update(_read_exact(source, offset, min(CHUNK_BYTES, source.size - offset), S_DATA))
    return h.digest()
