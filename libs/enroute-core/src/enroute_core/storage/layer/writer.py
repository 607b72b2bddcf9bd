"""Write an ``ENRLAYR1`` layer (seed 004, "Layers"; "Stable object numbering" for id runs).

Sans-IO: bytes leave through a ``sink(bytes)`` callable. Pack entries stream
straight out as they are added; the metadata (table, oid index, external
oids, commit section, commit graph, index region, footer) is built in memory
and written by :meth:`LayerWriter.finish`. Everything written is hashed on
the way: SHA-256 of every 1 MiB chunk before the index region, and BLAKE3 of
the whole file (the root).

The writer refuses input that breaks the storage-order invariants of "Layers"
(kinds grouped commit | tree | blob | tag in a pushed layer, a local delta base
before its delta, no OFS_DELTA, topological commit order) with
:class:`InvalidArgument`, before writing anything for that input.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import blake3
from enroute_native.layer_append import append_run
from enroute_native.pack_entry import header_is

from enroute_core.base.errors import InvalidArgument, InvalidPack
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.git.pack import parse_entry_header
from enroute_core.storage.layer.bloom import PROBES, bloom_bits_for, build_bloom
from enroute_core.storage.layer.commits import (
    I64_MAX,
    I64_MIN,
    CommitInfo,
    CommitRecord,
    GraphCommit,
    check_graph_input,
    encode_commit_graph,
    encode_commit_section,
)
from enroute_core.storage.layer.format import (
    BLOOM_HEADER,
    CHUNK_BYTES,
    EXTERNAL_MAX,
    INDEX_ENTRIES_PER_PAGE,
    INDEX_ENTRY,
    LOCAL_MAX,
    OID_BYTES,
    PACK_OFS_DELTA,
    PACK_REF_DELTA,
    PACK_TYPE_OF_KIND,
    PAGE_BYTES,
    RECORD,
    REF_EXTERNAL,
    REF_NONE,
    RUN,
    SAMPLE_EVERY,
    U32_MAX,
    Footer,
    Kind,
    LayerKind,
    Layout,
)

_FLUSH_BYTES = 1 << 20
_TABLE_ROWS = 1 << 15  # object table records built at once at finish (1.6 MiB)
_INDEX_PAGES = 256  # oid index pages built at once at finish (1 MiB)
_PACK_TYPES = tuple(PACK_TYPE_OF_KIND[k] for k in sorted(Kind))  # by kind value
_NONE_REFS = array("I", [REF_NONE])


@dataclass(frozen=True, slots=True)
class LayerEntry:
    """One object as stored: its pack entry bytes and what the table records about it.

    ``entry`` is header + zlib stream (REF_DELTA: header, 20-byte base oid,
    zlib stream of the delta). ``size`` is the size of the object itself (for
    a delta, of the result). ``depth`` is the delta chain depth (0 when full),
    counted through bases in other layers by the caller. ``base_context`` is
    the object through which this one was first reached (DESIGN decision,
    docs/formats/layer.md), if any.
    """

    oid: ObjectId
    kind: Kind
    entry: bytes
    size: int
    base: ObjectId | None
    depth: int
    base_context: ObjectId | None = None


class EntryRun(NamedTuple):
    """A run of entries for :meth:`LayerWriter.append_many`: :meth:`LayerWriter.append`'s
    arguments column by column."""

    oids: Sequence[ObjectId]
    kinds: Sequence[Kind]
    entries: Sequence[bytes]
    sizes: Sequence[int]
    bases: Sequence[ObjectId | None]
    depths: Sequence[int]
    contexts: Sequence[ObjectId | None]


@dataclass(frozen=True, slots=True)
class SealedLayer:
    """What the manifest records of a finished layer (DESIGN "Repository state")."""

    root: bytes
    file_size: int
    meta_size: int
    object_count: int
    id_count: int


class _Output:
    """Position, BLAKE3 of everything, SHA-256 per 1 MiB chunk until stopped; buffered."""

    __slots__ = (
        "_buf",
        "_chunk",
        "_chunk_fill",
        "_chunk_hashes",
        "_chunking",
        "_root",
        "_sink",
        "pos",
    )

    def __init__(self, sink: Callable[[bytes], object]) -> None:
        self._sink = sink
        self._buf = bytearray()
        self._root = blake3.blake3()
        self._chunk = hashlib.sha256()
        self._chunk_fill = 0
        self._chunk_hashes: list[bytes] = []
        self._chunking = True
        self.pos = 0

    def write(self, data: bytes) -> None:
        self.pos += len(data)
        if len(data) >= _FLUSH_BYTES:
            # A large entry goes out as it is, after what is buffered: copying it into
            # the buffer and out again held it three times (docs/ingest.md, "Memory").
            self.flush()
            self._emit(data if type(data) is bytes else bytes(data))
            return
        self._buf += data
        if len(self._buf) >= _FLUSH_BYTES:
            self.flush()

    def pad_to(self, offset: int) -> None:
        assert offset >= self.pos, (offset, self.pos)
        self.write(bytes(offset - self.pos))

    def flush(self) -> None:
        if not self._buf:
            return
        block = bytes(self._buf)
        self._buf.clear()
        self._emit(block)

    def _emit(self, block: bytes) -> None:
        self._root.update(block)
        if self._chunking:
            self._hash_chunks(block)
        self._sink(block)

    def _hash_chunks(self, block: bytes) -> None:
        view = memoryview(block)
        while view:
            take = min(len(view), CHUNK_BYTES - self._chunk_fill)
            self._chunk.update(view[:take])
            self._chunk_fill += take
            view = view[take:]
            if self._chunk_fill == CHUNK_BYTES:
                self._chunk_hashes.append(self._chunk.digest())
                self._chunk = hashlib.sha256()
                self._chunk_fill = 0

    def stop_chunks(self) -> list[bytes]:
        """End chunk hashing at the current position (the start of the index region)."""
        self.flush()
        if self._chunk_fill:
            self._chunk_hashes.append(self._chunk.digest())
        self._chunking = False
        return self._chunk_hashes

    def root(self) -> bytes:
        self.flush()
        return self._root.digest()


class LayerWriter:
    """Streams one layer out through ``sink``.

    A pushed layer (``merged=False``) takes its entries grouped by kind in
    storage order and gets one id run. A merged layer takes the entries of its
    sources in their order, oldest source first, plus its id runs and commit
    graph at :meth:`finish` (seed 004, "Stable object numbering").
    """

    def __init__(
        self,
        sink: Callable[[bytes], object],
        *,
        merged: bool = False,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._out = _Output(sink)
        self._merged = merged
        self._limits = limits
        self._objects_max = min(limits.layer_objects_max, LOCAL_MAX + 1)
        self._depth_max = min(limits.delta_chain_depth_max, U32_MAX)
        self._oids: list[bytes] = []
        self._index: dict[bytes, int] = {}
        self._kinds = bytearray()
        self._kind_oids: tuple[list[bytes], ...] = ([], [], [], [])
        self._kind_runs: list[tuple[int, int]] = []
        self._offsets = array("Q")
        self._lengths = array("I")
        self._sizes = array("Q")
        self._depths = array("I")
        # The table's base and base context refs by local index: the local index where
        # the object is in the layer when the entry comes, else REF_NONE and the oid in
        # ``_later``'s dict, resolved at finish (an external base; a context written later
        # or external). Columns, not a dict each by local index: 4 bytes an object, where
        # the dicts held ~90 on a large push (docs/ingest.md, "Memory").
        self._base_refs = array("I")
        self._context_refs = array("I")
        self._later: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})
        self._pending_bases: dict[bytes, int] = {}
        self._commits: list[CommitInfo] = []
        self._commit_oids: set[bytes] = set()
        self._finished = False

    @property
    def object_count(self) -> int:
        return len(self._oids)

    def add(self, entry: LayerEntry) -> None:
        """Append one entry to the data region (storage order, "Layers": "One order")."""
        self.append(
            entry.oid,
            entry.kind,
            entry.entry,
            entry.size,
            base=entry.base,
            depth=entry.depth,
            base_context=entry.base_context,
        )

    def append(
        self,
        oid: ObjectId,
        kind: Kind,
        entry: bytes,
        size: int,
        *,
        base: ObjectId | None = None,
        depth: int = 0,
        base_context: ObjectId | None = None,
    ) -> None:
        """:meth:`add` by fields, for per-object loops that need not build a LayerEntry."""
        if self._finished:
            self._check_open()
        i = len(self._oids)
        if i >= self._objects_max:
            check_limit("layer_objects_max", i + 1, self._objects_max)
        self._check_entry(oid, kind, entry, size, base, depth, base_context)
        kinds = self._kinds
        if not kinds or kinds[-1] != kind:
            self._kind_runs.append((i, kind))
        self._oids.append(oid)
        self._index[oid] = i
        kinds.append(kind)
        self._kind_oids[kind].append(oid)
        out = self._out
        self._offsets.append(out.pos)
        self._lengths.append(len(entry))
        self._sizes.append(size)
        self._depths.append(depth)
        local = None if base is None else self._index.get(base)
        self._base_refs.append(REF_NONE if local is None else local)
        if base is not None and local is None:
            self._later[0][i] = base
            self._pending_bases.setdefault(base, i)
        local = None if base_context is None else self._index.get(base_context)
        self._context_refs.append(REF_NONE if local is None else local)
        if base_context is not None and local is None:
            self._later[1][i] = base_context
        out.write(entry)

    def append_pieces(
        self,
        oid: ObjectId,
        kind: Kind,
        head: bytes,
        rest: Iterable[bytes],
        *,
        length: int,
        size: int,
        base_context: ObjectId | None = None,
    ) -> None:
        """:meth:`append` of a full entry of ``length`` bytes too large to hold: ``head``
        (its first bytes, the header among them) is checked as :meth:`append` checks an
        entry, then ``rest`` goes out as it comes (ingest copies a large object's pack
        entry so, docs/ingest.md). Pieces that do not add up to ``length`` raise
        ``InvalidArgument`` and leave the layer unusable."""
        if not 0 < length <= U32_MAX or len(head) > length:
            raise InvalidArgument(f"object {oid.hex()}: entry length {length} is out of range")
        self.append(oid, kind, head, size, base_context=base_context)
        written = len(head)
        for piece in rest:
            written += len(piece)
            if written > length:
                break
            self._out.write(piece)
        if written != length:
            self._finished = True  # what was written no longer matches the table
            raise InvalidArgument(
                f"object {oid.hex()}: entry pieces of {written} bytes, not {length}"
            )
        self._lengths[-1] = length

    def append_many(self, run: EntryRun) -> None:
        """:meth:`append` of each entry in order, the run's checks and columns in one call.

        Ingest writes a push's entries in runs (docs/ingest.md, "Speed"):
        ``enroute_native.layer_append`` answers whether :meth:`_check_entry` takes
        every entry of the run in order and, when it does, what those appends add
        to the columns, which are added here. Any other run goes through
        :meth:`append` entry by entry, so what is refused and how is unchanged.
        """
        n = len(run.oids)
        assert all(len(column) == n for column in run), [len(c) for c in run]
        if not n:
            return
        taken = None
        if not self._finished:
            taken = append_run(
                tuple(c if type(c) is list else list(c) for c in run),
                len(self._oids), self._out.pos, self._index, self._pending_bases, self._kinds,
                self._depths, Kind, _PACK_TYPES, self._merged, self._objects_max,
                self._limits.object_bytes_max, self._depth_max,
            )  # fmt: skip
        if taken is None:
            for oid, kind, entry, size, base, depth, context in zip(*run, strict=True):
                self.append(oid, kind, entry, size, base=base, depth=depth, base_context=context)
            return
        kinds, offsets, lengths, sizes, depths, data, where, per_kind, runs, bases, ctx, waits = (
            taken
        )
        self._oids += run.oids
        self._index.update(where)
        self._kinds += kinds
        for oids, new in zip(self._kind_oids, per_kind, strict=True):
            oids.extend(new)
        self._kind_runs += runs
        self._offsets.frombytes(offsets)
        self._lengths.frombytes(lengths)
        self._sizes.frombytes(sizes)
        self._depths.frombytes(depths)
        self._add_refs(n, (bases, ctx))
        pending = self._pending_bases
        for base, local in waits.items():
            pending.setdefault(base, local)
        self._out.write(data)

    def _add_refs(self, n: int, given: tuple[dict[int, bytes], dict[int, bytes]]) -> None:
        """The base and context refs of a run of ``n`` entries appended by
        :meth:`append_many` (its oids already in ``_index``), from the oids by local index
        ``append_run`` answers."""
        index = self._index
        for refs, later, oids in zip(
            (self._base_refs, self._context_refs), self._later, given, strict=True
        ):
            refs.extend(_NONE_REFS * n)
            for i, oid in oids.items():
                local = index.get(oid)
                if local is None:
                    later[i] = oid
                else:
                    refs[i] = local

    def add_commit(self, info: CommitInfo) -> None:
        """Record a commit for the commit section; order of calls is the section's order."""
        self._check_open()
        for name, oid in (("oid", info.oid), ("tree", info.tree)):
            _check_oid(oid, f"commit {name}")
        named = (*info.parents, *info.segment)
        # the check of each, at C speed over the whole tuple (a push's segments name every
        # tree and blob it stores); one of another type or length is found one by one
        if not _all_oids(named):
            for oid in named:
                _check_oid(oid, "commit parent or segment member")
        check_limit("commit_parents_max", len(info.parents), self._limits.commit_parents_max)
        if not I64_MIN <= info.time <= I64_MAX:
            raise InvalidArgument(f"commit {info.oid.hex()}: time {info.time} is not an i64")
        if info.oid in self._commit_oids:
            raise InvalidArgument(f"commit {info.oid.hex()} is given twice")
        self._commit_oids.add(bytes(info.oid))
        self._commits.append(info)

    def finish(
        self,
        *,
        id_runs: Sequence[tuple[int, int]] | None = None,
        id_count: int | None = None,
        graph: Sequence[GraphCommit] | None = None,
    ) -> SealedLayer:
        """Write the metadata and the footer; return the root and sizes for the manifest.

        Pushed layers take none of the arguments. Merged layers give their id
        runs as (first local index, id relative to the range start), the number
        of ids their range covers, and their commit graph by repository ids.
        Invalid arguments raise before anything is written, so ``finish`` may be
        called again with corrected ones.
        """
        self._check_open()
        n = len(self._oids)
        runs, ids = self._check_id_runs(id_runs, id_count, n)
        records_in = self._check_commits()
        graph = self._check_graph(graph)
        external = self._externals(records_in)
        if len(external) > EXTERNAL_MAX + 1:
            raise InvalidArgument(f"{len(external)} external oids, more than a layer can name")
        self._finished = True
        ext_index = {oid: j for j, oid in enumerate(external)}
        index = self._index

        def ref(oid: bytes) -> int:
            local = index.get(oid)
            return local if local is not None else REF_EXTERNAL | ext_index[oid]

        def refs(oids: Sequence[bytes]) -> tuple[int, ...]:
            """``ref`` of each, sorted without repeats: a segment's members, nearly all in
            this layer, are looked up at C speed and only the others one by one."""
            found = set(map(index.get, oids))
            if None in found:
                return tuple(sorted({ref(s) for s in oids}))
            return tuple(sorted(found))  # type: ignore[arg-type]  # no None in it

        records = [
            CommitRecord(
                local_index=index[c.oid],
                tree_ref=ref(c.tree),
                time=c.time,
                parent_refs=tuple(ref(p) for p in c.parents),
                segment_refs=refs(c.segment),
            )
            for c in records_in
        ]
        counts = {  # of the sections, for the layout and the footer alike
            "external_count": len(external),
            "commit_count": len(records),
            "commit_parent_count": sum(len(r.parent_refs) for r in records),
            "commit_member_count": sum(len(r.segment_refs) for r in records),
            "graph_commit_count": len(graph),
            "graph_parent_count": sum(len(g.parents) for g in graph),
            "graph_member_count": sum(len(g.segment) for g in graph),
        }
        layout = Layout.compute(data_end=self._out.pos, object_count=n, **counts)
        samples = self._write_sections(layout, ref, external, records, graph)
        region = self._index_region(layout, runs, samples)
        self._out.write(self._footer(layout, region, len(runs), ids, counts).encode())
        out = self._out
        return SealedLayer(
            root=out.root(),
            file_size=out.pos,
            meta_size=out.pos - layout.data_end,
            object_count=n,
            id_count=ids,
        )

    def _check_graph(self, graph: Sequence[GraphCommit] | None) -> Sequence[GraphCommit]:
        """A merged layer's commit graph, one commit per commit record; none for a pushed one."""
        if not self._merged:
            if graph is not None:
                raise InvalidArgument("only merged layers store a commit graph")
            return ()
        if graph is None:
            raise InvalidArgument("a merged layer needs its commit graph")
        check_graph_input(graph)
        if len(graph) != len(self._commits):
            raise InvalidArgument(
                f"commit graph has {len(graph)} commits, the layer {len(self._commits)}"
            )
        return graph

    def _write_sections(
        self,
        layout: Layout,
        ref: Callable[[bytes], int],
        external: list[bytes],
        records: list[CommitRecord],
        graph: Sequence[GraphCommit],
    ) -> list[bytes]:
        """The object table, oid index, external oids, commit section and commit graph, each
        at its place in ``layout``; the oid index's samples, for the index region."""
        out = self._out
        out.pad_to(layout.table_off)
        for piece in self._table(ref):
            out.write(piece)
        out.pad_to(layout.oid_index_off)
        ordered, samples = self._oid_order()
        for piece in self._oid_index(ordered):
            out.write(piece)
        del ordered
        out.write(b"".join(external))
        assert out.pos == layout.commit_off, (out.pos, layout)
        out.write(encode_commit_section(records))
        assert out.pos == layout.graph_off, (out.pos, layout)
        if self._merged:
            out.write(encode_commit_graph(graph))
        assert out.pos == layout.index_region_off, (out.pos, layout)
        return samples

    def _index_region(
        self, layout: Layout, runs: list[tuple[int, int]], samples: list[bytes]
    ) -> bytes:
        """The index region (samples, kind runs, id runs, Bloom filter, chunk hashes), written."""
        chunk_hashes = self._out.stop_chunks()
        assert len(chunk_hashes) == layout.chunk_count, (len(chunk_hashes), layout)
        bits = bloom_bits_for(len(self._oids))
        region = b"".join(
            (
                b"".join(samples),
                b"".join(RUN.pack(s, k) for s, k in self._kind_runs),
                b"".join(RUN.pack(s, r) for s, r in runs),
                BLOOM_HEADER.pack(bits, PROBES, 0),
                build_bloom(self._oids, bits, PROBES),
                b"".join(chunk_hashes),
            )
        )
        self._out.write(region)
        return region

    def _footer(
        self, layout: Layout, region: bytes, id_runs: int, ids: int, counts: dict[str, int]
    ) -> Footer:
        return Footer(
            data_end=layout.data_end,
            table_off=layout.table_off,
            oid_index_off=layout.oid_index_off,
            external_off=layout.external_off,
            commit_off=layout.commit_off,
            graph_off=layout.graph_off,
            index_region_off=layout.index_region_off,
            kind_counts=(
                len(self._kind_oids[0]),
                len(self._kind_oids[1]),
                len(self._kind_oids[2]),
                len(self._kind_oids[3]),
            ),
            kind_run_count=len(self._kind_runs),
            id_run_count=id_runs,
            id_count=ids,
            layer_kind=LayerKind.MERGED if self._merged else LayerKind.PUSHED,
            index_region_crc=zlib.crc32(region),
            **counts,
        )

    # -- validation -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._finished:
            raise InvalidArgument("the layer is already finished")

    def _check_entry(  # noqa: PLR0917 (append's fields, as given)
        self,
        oid: ObjectId,
        kind: Kind,
        entry: bytes,
        size: int,
        base: ObjectId | None,
        depth: int,
        base_context: ObjectId | None,
    ) -> None:
        """The rule of an entry the layer takes (seed 004, "Layers"), its one home.

        Cheap checks first: this runs once per object written entry by entry. The
        header is read by the compiled ``header_is`` (``packfmt.h``) and, where that
        does not find the usual one, by ``parse_entry_header``, whose reading words
        the error. ``enroute_native.layer_append`` takes a run only where this takes
        every entry of it (``test_layer_writer_deltas.py`` compares the two).
        """
        if type(oid) is not bytes or len(oid) != OID_BYTES:
            _check_oid(oid, "entry oid")
        if oid in self._index:
            raise InvalidArgument(f"object {oid.hex()} is added twice")
        if oid in self._pending_bases:
            delta = self._oids[self._pending_bases[oid]].hex()
            raise InvalidArgument(f"object {oid.hex()} comes after {delta}, a delta against it")
        if type(kind) is not Kind:
            raise InvalidArgument(f"object {oid.hex()}: kind {kind!r} is not a Kind")
        kinds = self._kinds
        if not self._merged and kinds and kind < kinds[-1]:
            raise InvalidArgument(
                f"object {oid.hex()}: a pushed layer groups kinds commit | tree | blob | tag, "
                f"got a {kind.name.lower()} after a {Kind(kinds[-1]).name.lower()}"
            )
        if not 0 < len(entry) <= U32_MAX:
            raise InvalidArgument(f"object {oid.hex()}: entry length {len(entry)} is out of range")
        if not 0 <= size <= self._limits.object_bytes_max:
            if size < 0:
                raise InvalidArgument(f"object {oid.hex()}: size {size} is negative")
            check_limit("object_bytes_max", size, self._limits.object_bytes_max)
        if not 0 <= depth <= self._depth_max:
            if depth < 0:
                raise InvalidArgument(f"object {oid.hex()}: depth {depth} is negative")
            check_limit("delta_chain_depth_max", depth, self._depth_max)
        if base_context is not None:
            _check_oid(base_context, "base context")
            if base_context == oid:
                raise InvalidArgument(f"object {oid.hex()} is its own base context")
        if base is None:
            if not header_is(entry, PACK_TYPE_OF_KIND[kind], size, None):
                _check_full_header(oid, kind, entry, size)
            if depth != 0:
                raise InvalidArgument(f"object {oid.hex()}: a full entry has depth 0")
            return
        if (
            type(base) is not bytes
            or len(base) != OID_BYTES
            or not header_is(entry, PACK_REF_DELTA, -1, base)
        ):
            _check_delta_header(oid, entry, base)
        if base == oid:
            raise InvalidArgument(f"object {oid.hex()} is its own delta base")
        if depth < 1:
            raise InvalidArgument(f"object {oid.hex()}: a delta has depth at least 1")
        local = self._index.get(base)
        if local is not None:
            if kinds[local] != kind:
                raise InvalidArgument(f"object {oid.hex()}: delta base has another kind")
            if depth != self._depths[local] + 1:
                raise InvalidArgument(
                    f"object {oid.hex()}: depth {depth}, its base's is {self._depths[local]}"
                )

    def _check_id_runs(
        self, id_runs: Sequence[tuple[int, int]] | None, id_count: int | None, n: int
    ) -> tuple[list[tuple[int, int]], int]:
        """Canonical runs: one per stretch of consecutive ids ("Stable object numbering")."""
        if not self._merged:
            if id_runs is not None or id_count is not None:
                raise InvalidArgument("a pushed layer has one id run; give no runs")
            return ([(0, 0)] if n else []), n
        if id_runs is None or id_count is None:
            raise InvalidArgument("a merged layer needs its id runs and id count")
        runs = [(int(a), int(b)) for a, b in id_runs]
        if n == 0 and runs:
            raise InvalidArgument("an empty layer has no id runs")
        if n and (not runs or runs[0][0] != 0):
            raise InvalidArgument("the first id run must start at local index 0")
        for (l0, i0), (l1, i1) in itertools.pairwise(runs):
            if not l0 < l1 < n:
                raise InvalidArgument(f"id run at local {l1} does not ascend inside the layer")
            if i1 <= i0 + (l1 - l0):
                raise InvalidArgument(f"id run at local {l1} leaves no hole before it")
        if runs and not runs[0][1] >= 0:
            raise InvalidArgument("ids are not negative")
        end = runs[-1][1] + (n - runs[-1][0]) if runs else 0
        if not end <= id_count <= U32_MAX:
            raise InvalidArgument(f"id count {id_count} does not cover ids up to {end}")
        return runs, id_count

    def _check_commits(self) -> list[CommitInfo]:
        """Every commit entry has one commit record, parents first ("Layers": commit section)."""
        seen: set[bytes] = set()
        kinds, index = self._kinds, self._index
        for c in self._commits:
            local = index.get(c.oid)
            if local is None or kinds[local] != Kind.COMMIT:
                raise InvalidArgument(f"commit {c.oid.hex()} is not a commit entry of the layer")
            tree = index.get(c.tree)
            if tree is not None and kinds[tree] != Kind.TREE:
                raise InvalidArgument(f"commit {c.oid.hex()}: its tree is not a tree")
            for p in c.parents:
                local_parent = index.get(p)
                if local_parent is None:
                    continue
                if kinds[local_parent] != Kind.COMMIT:
                    raise InvalidArgument(f"commit {c.oid.hex()}: a parent is not a commit")
                if p not in seen:
                    raise InvalidArgument(f"commit {c.oid.hex()} comes before its parent {p.hex()}")
            seen.add(bytes(c.oid))
        missing = len(self._kind_oids[Kind.COMMIT]) - len(seen)
        if missing:
            raise InvalidArgument(f"{missing} commit entries have no commit record")
        return self._commits

    # -- building ---------------------------------------------------------------------------

    def _externals(self, commits: Iterable[CommitInfo]) -> list[bytes]:
        index = self._index
        found: set[bytes] = set(self._pending_bases)
        found.update(o for o in self._later[1].values() if o not in index)
        for c in commits:  # at C speed: a push's segments name every object it stores
            found.update(
                map(
                    bytes,
                    itertools.filterfalse(index.__contains__, (c.tree, *c.parents, *c.segment)),
                )
            )
        return sorted(found)

    def _table(self, ref: Callable[[bytes], int]) -> Iterator[bytes]:
        """52-byte records, built column by column with strided copies (C speed), in pieces
        of ``_TABLE_ROWS``: the whole table at once and its columns' bytes were ~150 bytes
        an object at the peak of a large push's finish (docs/ingest.md, "Memory")."""
        n = len(self._oids)
        base_refs, ctx_refs = self._base_refs, self._context_refs
        for refs, later in zip((base_refs, ctx_refs), self._later, strict=True):
            for i, oid in later.items():
                refs[i] = ref(oid)
        columns = (self._offsets, self._lengths, self._sizes, base_refs, ctx_refs, self._depths)
        for a in range(0, n, _TABLE_ROWS):
            b = min(n, a + _TABLE_ROWS)
            oids = b"".join(self._oids[a:b])
            yield _interleave(b - a, RECORD.size, (oids, *(_le_bytes(c[a:b]) for c in columns)))

    def _oid_order(self) -> tuple[list[bytes], list[bytes]]:
        """The oids sorted by (kind, oid), the oid index's order, and the per-kind samples."""
        ordered: list[bytes] = []
        samples: list[bytes] = []
        for oids in self._kind_oids:
            run = sorted(oids)
            samples.extend(run[::SAMPLE_EVERY])
            ordered.extend(run)
        return ordered, samples

    def _oid_index(self, ordered: list[bytes]) -> Iterator[bytes]:
        """Pages of 170 (oid, local) entries in ``ordered``'s order, ``_INDEX_PAGES`` at once,
        each padded to its 4 KiB."""
        per = INDEX_ENTRIES_PER_PAGE
        width = per * INDEX_ENTRY.size
        for a in range(0, len(ordered), per * _INDEX_PAGES):
            rows = ordered[a : a + per * _INDEX_PAGES]
            locals_ = array("I", map(self._index.__getitem__, rows))
            entries = _interleave(len(rows), INDEX_ENTRY.size, (b"".join(rows), _le_bytes(locals_)))
            yield b"".join(
                entries[p : p + width].ljust(PAGE_BYTES, b"\0")
                for p in range(0, len(entries), width)
            )


def _interleave(rows: int, width: int, columns: Sequence[bytes]) -> bytes:
    """Rows of ``width`` bytes from fixed-width columns: one strided copy per byte lane."""
    out = bytearray(rows * width)
    lane = 0
    for raw in columns:
        item = len(raw) // rows if rows else 0
        assert item * rows == len(raw), (item, rows, len(raw))
        for j in range(item):
            out[lane + j :: width] = raw[j::item]
        lane += item
    assert lane == width or rows == 0, (lane, width)
    return bytes(out)


def _le_bytes(values: array[int]) -> bytes:
    if sys.byteorder == "big":  # pragma: no cover - the file is little-endian
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _header(oid: bytes, entry: bytes) -> tuple[int, int, int]:
    try:
        ptype, size, length, _, _ = parse_entry_header(entry, 0, 0)
    except InvalidPack as err:
        raise InvalidArgument(f"object {oid.hex()}: {err.message}") from None
    # The pack parser counts a REF_DELTA's base oid in the header; the checks below do not.
    return ptype, size, length - OID_BYTES if ptype == PACK_REF_DELTA else length


def _check_full_header(oid: bytes, kind: Kind, entry: bytes, size: int) -> None:
    """The header of a full entry, read by ``parse_entry_header`` (where the compiled
    ``header_is`` did not find the usual one): its type and declared size."""
    ptype, hsize, _ = _header(oid, entry)
    if ptype == PACK_OFS_DELTA:
        raise InvalidArgument(f"object {oid.hex()}: layers store no OFS_DELTA entries")
    if ptype != PACK_TYPE_OF_KIND[kind]:
        raise InvalidArgument(f"object {oid.hex()}: pack type {ptype} is not a {kind.name}")
    if hsize != size:
        raise InvalidArgument(f"object {oid.hex()}: header size {hsize} is not {size}")


def _check_delta_header(oid: bytes, entry: bytes, base: object) -> None:
    """The header of a delta entry, read by ``parse_entry_header``: a REF_DELTA naming
    ``base``, with data after it."""
    ptype, _, hlen = _header(oid, entry)
    _check_oid(base, "delta base")
    if ptype == PACK_OFS_DELTA:
        raise InvalidArgument(f"object {oid.hex()}: layers store no OFS_DELTA entries")
    if ptype != PACK_REF_DELTA:
        raise InvalidArgument(f"object {oid.hex()}: an entry with a base must be a REF_DELTA")
    if len(entry) <= hlen + OID_BYTES or entry[hlen : hlen + OID_BYTES] != base:
        raise InvalidArgument(f"object {oid.hex()}: REF_DELTA entry does not name its base")


def _check_oid(oid: object, what: str) -> None:
    if not isinstance(oid, bytes) or len(oid) != OID_BYTES:
        raise InvalidArgument(f"{what} is not a 20-byte object id: {oid!r}")


_OID_LENGTHS = frozenset((OID_BYTES,))


def _all_oids(items: Sequence[object]) -> bool:
    """Whether :func:`_check_oid` takes every item (``isinstance`` of bytes, 20 long), asked
    at C speed over the whole sequence; the type first, so ``len`` meets only bytes."""
    if all(map(bytes.__instancecheck__, items)):
        return set(map(len, items)) <= _OID_LENGTHS  # type: ignore[arg-type]
    return False


def write_layer(
    entries: Iterable[LayerEntry],
    commits: Iterable[CommitInfo] = (),
    *,
    merged: bool = False,
    id_runs: Sequence[tuple[int, int]] | None = None,
    id_count: int | None = None,
    graph: Sequence[GraphCommit] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[bytes, SealedLayer]:
    """A whole layer in memory (small layers, inline layers and tests)."""
    parts: list[bytes] = []
    writer = LayerWriter(parts.append, merged=merged, limits=limits)
    for e in entries:
        writer.add(e)
    for c in commits:
        writer.add_commit(c)
    sealed = writer.finish(id_runs=id_runs, id_count=id_count, graph=graph)
    data = b"".join(parts)
    assert len(data) == sealed.file_size, (len(data), sealed.file_size)
    return data, sealed
