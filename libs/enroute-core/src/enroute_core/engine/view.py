"""A repository view: the layers of a manifest, numbered by stable ids.

Seed 004, "Stable object numbering": every object has the id its layer's
manifest range gives it; duplicates resolve to the smallest id, which is the
copy in the oldest layer, so :meth:`View.id_of_oid` asks the layers oldest
first (their Bloom filters make misses cheap, and one index page answers a
hit). Finding the layer of an id is a binary search over the ranges, then the
layer's id runs.

Seed 004, "Effects": a view is a list of per-layer views, each built against
ids once, when its layer joins. A pushed layer joins at the end
(:meth:`View.with_layers` with nothing removed); a flush or compaction swaps a
stretch of the list for its merged outputs. Either way every other layer's
view is shared as it is, and so is the body cache: nothing is rebuilt.

Seed 004, "Pages and memory" and DESIGN "Layers": per layer, the commit graph
in ids as flat arrays (:class:`~enroute_core.storage.layer.commits.CommitGraph`:
tree, parents, time, generation and segment, the ids a commit introduces). A
merged layer stores it; a pushed layer's is resolved from its commit section
when it joins (refs through the layer's local ids and its external oids). The
closure of a set of commits is the union of the segments of every ancestor,
which is how a fetch is planned without walking trees.

The view also implements :class:`~enroute_core.engine.snapshot.SnapshotObjects`,
so a push can be ingested against it: bodies are rebuilt along REF_DELTA
chains that may cross layers.

Memory: per layer its range, one bitmap per kind and the graph arrays (about
32 bytes per commit and 4 per segment member). Inflated bodies and full
entries live in the node's object and entry caches (``node.cache``, charged
to the buffer pool's budget; docs/buffer-pool.md), shared by the views of one
repository.
"""

from __future__ import annotations

import threading
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import accumulate
from operator import lt

from enroute_native.commit_closure import closure as native_closure
from enroute_native.commit_graph import first_graph as native_first_graph
from pyroaring import BitMap

from enroute_core.base.errors import (
    CorruptData,
    InvalidArgument,
    LimitExceeded,
    MissingObject,
    NotLocal,
)
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine.cancel import check_walk
from enroute_core.git.delta import apply_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.pack import OBJ_REF_DELTA, encode_entry_header, parse_entry_header
from enroute_core.git.tag import Tag
from enroute_core.git.tree import Tree
from enroute_core.git.zstream import deflate
from enroute_core.state.model import LayerEntry
from enroute_core.storage.layer import REF_EXTERNAL, Kind, LayerReader
from enroute_core.storage.layer.commits import CommitGraph
from enroute_core.storage.layer.format import DATA_PAGE_BYTES, REF_NONE
from enroute_core.storage.layer.reader import CommitColumns
from enroute_core.storage.machines import entry_loads
from enroute_core.storage.pool import SCAN_OBJECTS_MIN, BufferPool, Intent, NodeCaches

TYPE_OF_KIND = {
    Kind.COMMIT: ObjectType.COMMIT,
    Kind.TREE: ObjectType.TREE,
    Kind.BLOB: ObjectType.BLOB,
    Kind.TAG: ObjectType.TAG,
}
_SECTION = "view"
TREE_CLOSURES_KEPT = 8
"""Whole tree closures kept per repository (shallow and tree-only fetches of the same tips)."""
CACHED_KEYS_KEPT = 64
"""Node cache entries a view lineage remembers putting, so that :meth:`View.forget_cached`
takes them out when the view goes (issue 19): all of them for a repository that was
read a little (an idle one: a ref advertisement peels a few commits), the first few of
a busy one, whose others age out of the caches' LRU."""
SCAN_PAGES_KEPT = 64
"""Data pages (64 KiB) a large tree walk keeps for itself (:class:`ScanPages`): 4 MiB."""


@dataclass(frozen=True, slots=True)
class ViewCommit:
    """One commit of the graph, by ids (seed 004, "Pages and memory": the commit graph)."""

    commit_id: int
    tree_id: int
    parents: tuple[int, ...]
    time: int
    generation: int
    segment: BitMap


class _Bodies:
    """One view lineage's share of the node's caches, and its memoized tree closures.

    Bodies and full entries live in the node's object and entry caches
    (:class:`~enroute_core.storage.pool.NodeCaches`: seed 004, "Pages and memory",
    charged to the pool's budget), keyed by this lineage's scope and the object's
    id. Ids are stable, so a body never changes, and the views of a lineage (pushes,
    flushes and compactions applied to one view built whole) share every entry.
    Used from the fetch threads at once: the caches lock, and so does the memo.
    """

    __slots__ = ("_entries", "_lock", "_objects", "_put", "_scope", "_spill", "_trees")

    def __init__(self, caches: NodeCaches) -> None:
        self._objects = caches.objects
        self._entries = caches.entries
        self._spill = caches.spill
        self._scope = caches.new_scope()
        self._lock = threading.Lock()
        self._trees: OrderedDict[tuple[int, ...], BitMap] = OrderedDict()
        self._put: list[tuple[int, int]] | None = []
        """The first ``CACHED_KEYS_KEPT`` keys this lineage put in the node caches; None
        once forgotten."""

    def tree_closure(self, roots: tuple[int, ...]) -> BitMap | None:
        """A memoized closure of exactly these root trees (a tree's closure never changes:
        its content is fixed and ids are stable), or None."""
        with self._lock:
            found = self._trees.get(roots)
            if found is not None:
                self._trees.move_to_end(roots)
            return found

    def put_tree_closure(self, roots: tuple[int, ...], closure: BitMap) -> None:
        with self._lock:
            self._trees[roots] = closure
            while len(self._trees) > TREE_CLOSURES_KEPT:
                self._trees.popitem(last=False)

    def get(self, object_id: int) -> bytes | None:
        return self._objects.get((self._scope, object_id))

    def put(self, object_id: int, body: bytes, scan: list[int] | None = None) -> None:
        """Cache ``body``; a scan's puts are also listed in ``scan`` (:meth:`drop`)."""
        key = (self._scope, object_id)
        if self._objects.put(key, body):
            self._remember(key)
            if scan is not None:
                scan.append(object_id)

    def drop(self, object_ids: Iterable[int]) -> None:
        """Take bodies a one-off scan put back out of the object cache."""
        for object_id in object_ids:
            self._objects.discard((self._scope, object_id))

    def entry(self, object_id: int) -> bytes | None:
        return self._entries.get((self._scope, object_id))

    def put_entry(self, object_id: int, entry: bytes) -> None:
        key = (self._scope, object_id)
        if self._entries.put(key, entry):
            self._remember(key)

    def spilled_entry(self, object_id: int) -> bytes | None:
        """A full entry a large fetch rewrote before, from the node's disk, if kept."""
        return None if self._spill is None else self._spill.get((self._scope, object_id))

    def spill_entry(self, object_id: int, entry: bytes) -> None:
        key = (self._scope, object_id)
        if self._spill is not None and self._spill.put(key, entry):
            self._remember(key)

    def _remember(self, key: tuple[int, int]) -> None:
        with self._lock:
            if self._put is not None and len(self._put) < CACHED_KEYS_KEPT:
                self._put.append(key)  # past it (a busy lineage) the rest age out of the LRU

    def forget(self) -> None:
        """Take what this lineage put out of the node caches (no later view of it will
        ask: the scope is its own), and its tree closures."""
        with self._lock:
            put, self._put = self._put, None
            self._trees.clear()
        for key in put or ():  # one key space for the caches: a key not there is a no-op
            self._objects.discard(key)
            self._entries.discard(key)
            if self._spill is not None:
                self._spill.discard(key)


def private_caches(limits: Limits) -> NodeCaches:
    """Caches of their own for a view built outside a host (tools, tests): a pool of
    ``view_body_cache_bytes_max`` holding only them."""
    size = max(1, limits.view_body_cache_bytes_max)
    return NodeCaches(BufferPool(size), size)


class ScanPages:
    """The last data pages a one-off reader (a large tree walk, a large pack's resolved
    deltas) read through the pool, kept by that reader alone.

    Read through the pool entry by entry, a depth-1 clone of the `large` profile took
    2.5 s more compute CPU than with pages kept (15.9 -> 18.5 s; 55,000 reads, each a
    pread through the pool's and the disk budget's layers) for the same memory as
    this: trees of a level lie close together, so one read of their 64 KiB page
    answers the next entries. At most ``SCAN_PAGES_KEPT`` pages, gone with the walk.
    """

    __slots__ = ("_pages",)

    def __init__(self) -> None:
        self._pages: OrderedDict[tuple[int, int], bytes] = OrderedDict()

    def read(self, reader: LayerReader, offset: int, length: int) -> bytes:
        """``reader.data_bytes(offset, length)``, from a page kept here when it fits one."""
        page = offset - offset % DATA_PAGE_BYTES
        if offset + length > page + DATA_PAGE_BYTES:
            return reader.data_bytes(offset, length, Intent.SCAN)
        key = (id(reader), page)
        data = self._pages.get(key)
        if data is None:
            data = reader.data_bytes(
                page, min(DATA_PAGE_BYTES, reader.data_end - page), Intent.SCAN
            )
            self._pages[key] = data
            if len(self._pages) > SCAN_PAGES_KEPT:
                self._pages.popitem(last=False)
        else:
            self._pages.move_to_end(key)
        return data[offset - page : offset - page + length]


class _Layer:
    """The view of one layer, built against ids once (seed 004, "Effects"): its range,
    its ids per kind and its commit graph by repository ids."""

    __slots__ = ("end", "entry", "first", "graph", "kinds", "reader", "single", "source_ends")

    def __init__(
        self,
        entry: LayerEntry,
        reader: LayerReader,
        kinds: tuple[BitMap, ...],
        graph: CommitGraph,
        source_ends: list[int],
    ) -> None:
        self.entry = entry
        self.reader = reader
        self.first = entry.first_id
        self.end = entry.end_id
        self.kinds = kinds
        self.graph = graph
        self.single = reader.single_id_run
        self.source_ends = source_ends
        """Where each pushed range the layer holds ends, ascending; the last is ``end``."""


def _lookup(layers: Sequence[_Layer], oid: ObjectId, kind: Kind | None = None) -> int | None:
    """The smallest id of ``oid`` among ``layers`` (oldest first), or None."""
    for layer in layers:
        local = layer.reader.lookup(oid, kind)
        if local is not None:
            return layer.first + (local if layer.single else layer.reader.id_of(local))
    return None


def _build_layer(older: Sequence[_Layer], entry: LayerEntry, reader: LayerReader) -> _Layer:
    """Check the range ("Assignment") and resolve the layer's kinds and commit graph."""
    if (older and entry.first_id < older[-1].end) or entry.id_count < reader.object_count:
        raise InvalidArgument(
            f"layer range {entry.first_id}+{entry.id_count} overlaps or is too short"
        )
    if reader.object_count and reader.id_of(reader.object_count - 1) >= entry.id_count:
        raise CorruptData("layer ids run past its manifest range", section=_SECTION)
    kinds = tuple(BitMap() for _ in range(4))
    source_ends: list[int] = []
    previous = Kind.COMMIT
    for start, stop, kind in reader.kind_runs:
        first = entry.first_id + reader.id_of(start)
        last = entry.first_id + reader.id_of(stop - 1)
        kinds[kind].add_range(first, last + 1)
        if start and kind < previous:  # a merged layer's next source ("Layers": runs per source)
            source_ends.append(first)
        previous = kind
    source_ends.append(entry.end_id)
    graph = reader.commit_graph()
    if graph is None:
        graph = _pushed_graph(older, entry, reader)
    return _Layer(entry, reader, kinds, graph, source_ends)


def _pushed_graph(older: Sequence[_Layer], entry: LayerEntry, reader: LayerReader) -> CommitGraph:
    """A pushed layer's commit section by repository ids, as flat arrays.

    Every ref (local index or external oid) becomes an id. A local ref is looked up
    in the older layers first: a concurrent push may have stored the same object
    there, and the oldest copy has the id. Generations are one more than the
    largest parent's.

    A repository's first push (no older layer, so no externals and no duplicates)
    maps whole arrays at once, in one compiled call (docs/native.md, ``commit_graph``)
    whose reference is :func:`_first_graph`; what the compiled call leaves to the
    reference, and anything the reference does not recognise, goes the ref-by-ref
    way, which gives the same graph or error.
    """
    if not older and not reader.external_count and reader.single_id_run:
        columns = reader.commit_columns()
        if columns is not None:
            graph = _first_graph_compiled(entry.first_id, columns)
            if graph is None:
                graph = _first_graph(entry.first_id, columns)
            if graph is not None:
                return graph
    return _resolved_graph(older, entry, reader)


def _first_graph_compiled(first: int, c: CommitColumns) -> CommitGraph | None:
    """:func:`_first_graph` in one compiled call, or None where the reference decides.

    The reference took about 180 ms on the `large` profile's 80,006 commits, the wait of
    the first read after the push, and 31 MiB of Python objects the compute kept as free
    heap afterwards (issue 25)."""
    got = native_first_graph(
        first, c.local_indexes, c.tree_refs, c.times, c.parent_starts, c.parent_counts,
        c.member_starts, c.member_counts, c.parent_refs, c.member_refs,
    )  # fmt: skip
    if got is None:
        return None
    columns = {}
    for name, data in zip(CommitGraph.__dataclass_fields__, got, strict=True):
        column = array("q" if name == "times" else "I")
        column.frombytes(data)
        columns[name] = column
    return CommitGraph(**columns)


def _first_graph(first: int, c: CommitColumns) -> CommitGraph | None:
    """The graph when every ref is local and nothing is older: each id is ``first`` plus
    the ref (one id run from 0), so whole arrays map at once.

    None (take the ref-by-ref way) for a repeated commit record, which that way
    skips, or a member run that is not ascending and unique, which its bitmap sorts.
    """
    locals_ = c.local_indexes
    if len(set(locals_)) != len(locals_):
        return None
    generations = _first_generations(first, c)
    order = sorted(range(len(locals_)), key=locals_.__getitem__)  # by commit id

    def by_id(column: array[int]) -> array[int]:
        return array(column.typecode, map(column.__getitem__, order))

    parent_counts, segment_counts = by_id(c.parent_counts), by_id(c.member_counts)
    parent_ids = _runs(c.parent_refs, by_id(c.parent_starts), parent_counts)
    segment_starts = _starts(segment_counts)
    segment_ids = _runs(c.member_refs, by_id(c.member_starts), segment_counts)
    if not _runs_ascend(segment_ids, segment_starts):
        return None

    def ids(refs: array[int]) -> array[int]:
        return array("I", map(first.__add__, refs)) if first else refs

    return CommitGraph(
        commit_ids=ids(by_id(locals_)),
        tree_ids=ids(by_id(c.tree_refs)),
        generations=by_id(generations),
        times=by_id(c.times),
        parent_starts=_starts(parent_counts),
        parent_counts=parent_counts,
        segment_starts=segment_starts,
        segment_counts=segment_counts,
        parent_ids=ids(parent_ids),
        segment_ids=ids(segment_ids),
    )


def _first_generations(first: int, c: CommitColumns) -> array[int]:
    """Generations by rank; a parent that is no earlier commit of the layer raises what
    :func:`_generation` raises for it."""
    known: dict[int, int] = {}  # local index -> generation
    out = array("I")
    refs = c.parent_refs
    for local, start, count in zip(c.local_indexes, c.parent_starts, c.parent_counts, strict=True):
        generation = 1
        for p in refs[start : start + count]:
            parent = known.get(p)
            if parent is None:
                parent = _generation((), first + p)
            if parent >= generation:
                generation = parent + 1
        known[local] = generation
        out.append(generation)
    return out


def _runs(refs: array[int], starts: array[int], counts: array[int]) -> array[int]:
    """The runs ``refs[start : start + count]`` one after the other."""
    out = array("I")
    for start, count in zip(starts, counts, strict=True):
        out.extend(refs[start : start + count])
    return out


def _runs_ascend(values: array[int], starts: array[int]) -> bool:
    """Each run of ``values`` (laid one after the other from ``starts``) strictly ascends:
    every neighbour pair does, except where a run starts."""
    items = values.tolist()  # compared as a list: no int object made per comparison
    ascends = list(map(lt, items, items[1:]))
    for start in starts:
        if 0 < start < len(items):
            ascends[start - 1] = True
    return all(ascends)


def _starts(counts: array[int]) -> array[int]:
    """Where each run starts when the runs are laid one after the other."""
    out = array("I", accumulate(counts, initial=0))
    out.pop()
    return out


def _resolved_graph(older: Sequence[_Layer], entry: LayerEntry, reader: LayerReader) -> CommitGraph:
    """:func:`_pushed_graph` ref by ref: externals and duplicates looked up in ``older``,
    each distinct ref once."""
    externals: dict[int, int] = {}
    locals_: dict[int, int] = {}
    first = entry.first_id

    def resolve(ref: int) -> int:
        if ref & REF_EXTERNAL:
            index = ref & ~REF_EXTERNAL
            found = externals.get(index)
            if found is None:
                oid = reader.external_oid(index)
                found = _lookup(older, oid)
                if found is None:
                    raise CorruptData(
                        f"external oid {oid_to_hex(oid)} is in no older layer", section=_SECTION
                    )
                externals[index] = found
            return found
        found = locals_.get(ref)
        if found is None:
            duplicate = _lookup(older, reader.ref_oid(ref)) if older else None
            found = first + reader.id_of(ref) if duplicate is None else duplicate
            locals_[ref] = found
        return found

    rows: list[tuple[int, int, int, tuple[int, ...], BitMap]] = []
    own: dict[int, int] = {}  # commit id -> generation, for parents in this layer
    for rec in reader.commits():
        commit_id = resolve(rec.local_index)
        if commit_id < first or commit_id in own:
            continue  # a duplicate of a commit an older layer holds
        parents = tuple(map(resolve, rec.parent_refs))
        generation = 1
        for p in parents:
            known = own.get(p)
            if known is None:
                known = _generation(older, p)
            generation = max(generation, known + 1)
        own[commit_id] = generation
        segment = BitMap(map(resolve, rec.segment_refs))
        rows.append((commit_id, resolve(rec.tree_ref), rec.time, parents, segment))
    rows.sort(key=lambda r: r[0])
    g = CommitGraph.empty()
    for commit_id, tree_id, time, parents, segment in rows:
        g.append(commit_id, tree_id=tree_id, generation=own[commit_id], time=time,
                 parents=parents, segment=segment)  # fmt: skip
    return g


GraphColumns = tuple[
    int,
    int,
    "array[int]",
    "array[int]",
    "array[int]",
    "array[int]",
    "array[int]",
    "array[int]",
    "array[int]",
]
"""A layer's id range and its commit graph's columns, as the compiled walk reads them."""


def closure_reference(layers: Sequence[_Layer], commit_ids: Iterable[int]) -> BitMap:
    """The rule of :meth:`View.closure` in Python, the reference of its compiled walk:
    each ancestor met once, depth first, its segment added."""
    out = BitMap()
    seen = BitMap()
    stack = list(commit_ids)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        check_walk()
        seen.add(c)
        g, rank = _commit_of(layers, c)
        out.update(g.segment(rank))
        stack.extend(g.parents(rank))
    return out


def _walk_columns(layer: _Layer) -> GraphColumns:
    g = layer.graph
    return (layer.first, layer.end, g.commit_ids, g.parent_starts, g.parent_counts,
            g.parent_ids, g.segment_starts, g.segment_counts, g.segment_ids)  # fmt: skip


def _generation(layers: Sequence[_Layer], commit_id: int) -> int:
    found = _commit_rank(layers, commit_id)
    if found is None:
        raise CorruptData(f"parent {commit_id} is no known commit", section=_SECTION)
    graph, rank = found
    return graph.generations[rank]


def _commit_of(layers: Sequence[_Layer], commit_id: int) -> tuple[CommitGraph, int]:
    """:func:`_commit_rank` of an id that must be a commit (``KeyError`` otherwise)."""
    found = _commit_rank(layers, commit_id)
    if found is None:
        raise KeyError(f"id {commit_id} is not a commit of the view")
    return found


def _commit_rank(layers: Sequence[_Layer], commit_id: int) -> tuple[CommitGraph, int] | None:
    lo, hi = 0, len(layers)
    while lo < hi:  # the layer whose range holds the id
        mid = (lo + hi) // 2
        if layers[mid].end <= commit_id:
            lo = mid + 1
        else:
            hi = mid
    if lo == len(layers) or commit_id < layers[lo].first:
        return None
    graph = layers[lo].graph
    ids = graph.commit_ids
    rank = bisect_left(ids, commit_id)
    if rank < len(ids) and ids[rank] == commit_id:
        return graph, rank
    return None


_MEMO_MAX = 2048
"""Entries of each of a view's two memos (:meth:`View.named_id`, :meth:`View.tag_target`),
emptied when full: a clone of the large profile looked its 1,005 wants up three times and
parsed its 604 wanted tags twice (checked, planned, given), 8 µs a lookup, 34 of the
blobless plan's 48 ms; and every fetch of a repository names the same refs. A view never
changes, so neither can what they hold; full, each is about 250 KiB, and only a view
fetches are served from fills them."""

_UNASKED = object()


class View:
    """Layers in id order, their ids, kinds, bodies and commit graph."""

    __slots__ = (
        "_bodies",
        "_graphs",
        "_ids",
        "_kind_ids",
        "_layers",
        "_limits",
        "_settled",
        "_starts",
        "_tag_targets",
    )

    def __init__(
        self,
        layers: Sequence[tuple[LayerEntry, LayerReader]],
        *,
        limits: Limits = DEFAULT_LIMITS,
        caches: NodeCaches | None = None,
    ) -> None:
        """A full build: every layer's view, oldest first (a compute opening a repository).

        ``caches`` are the node's object and entry caches (the host's); without them
        the view lineage gets caches of its own (:func:`private_caches`)."""
        built: list[_Layer] = []
        for entry, reader in layers:
            built.append(_build_layer(built, entry, reader))
        bodies = _Bodies(caches if caches is not None else private_caches(limits))
        self._init(tuple(built), bodies, limits)

    def _init(self, layers: tuple[_Layer, ...], bodies: _Bodies, limits: Limits) -> None:
        self._layers = layers
        self._starts = [layer.first for layer in layers]
        self._graphs = tuple(map(_walk_columns, layers))
        self._bodies = bodies
        self._limits = limits
        self._kind_ids: list[BitMap | None] = [None] * 4
        self._settled = False
        self._ids: dict[ObjectId, int | None] = {}
        self._tag_targets: dict[int, ObjectId] = {}

    def with_layers(
        self,
        removed: Sequence[LayerEntry],
        added: Sequence[tuple[LayerEntry, LayerReader]],
    ) -> View:
        """The view after a manifest change (seed 004, "Effects"): ``removed`` is a
        consecutive stretch of the layers (empty: ``added`` go after the newest) and
        ``added`` take its place. Only the added layers' views are built; every other
        layer's, and the body cache, are shared with this view, which stays as it is
        for the reads that hold it."""
        layers = self._layers
        if removed:
            pos = next(
                (i for i, layer in enumerate(layers) if layer.entry == removed[0]), len(layers)
            )
            stop = pos + len(removed)
            if stop > len(layers) or any(layers[pos + i].entry != e for i, e in enumerate(removed)):
                raise InvalidArgument("removed layers are not a stretch of the view")
        else:
            pos = stop = len(layers)
        older = list(layers[:pos])
        for entry, reader in added:
            older.append(_build_layer(older, entry, reader))
        newer = layers[stop:]
        if newer and older and older[-1].end > newer[0].first:
            raise InvalidArgument("added layers overlap the layers after them")
        view = View.__new__(View)
        view._init((*older, *newer), self._bodies, self._limits)
        return view

    def forget_cached(self) -> None:
        """The view's lineage is done (its repository's view was evicted or dropped):
        what it put in the node's object and entry caches goes now rather than when the
        LRU reaches it. Keyed by the lineage's scope, it could never be hit again, and
        until then it took the room of live views and memory per repository touched
        (issue 19). A read still holding a view of the lineage only reads again."""
        self._bodies.forget()

    # -- residency (seed 004, "Never waiting on the object store", Machines) -------------------

    def settled(self) -> bool:
        """No read of this view needs a load first (every layer in memory, linked, or
        complete outside a disk budget): the fast path, where the load step is nothing.
        Once true it stays true (only budgeted copies lose chunks, and they never are)."""
        if not self._settled:
            self._settled = all(layer.reader.settled() for layer in self._layers)
        return self._settled

    def entry_of_oid(self, oid: ObjectId) -> tuple[LayerReader, int] | None:
        """(layer, local index) of the canonical copy of ``oid``: the lookup delta chains
        across layers take (``storage.machines.chain_of``)."""
        found = self.id_of_oid(oid)
        return None if found is None else self.locate(found)

    def loads_of(self, object_ids: Iterable[int]) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The layer entries reading ``object_ids`` takes, each with its whole delta
        chain across layers, from table records only (always local): () when all of
        them are local now or their bodies are cached. Otherwise every entry of every
        chain, so that one load pins all that the reads touch ("A chain costs one round
        trip, not one per step")."""
        if self.settled():
            return ()
        bodies = self._bodies
        pairs = [self.locate(i) for i in object_ids if bodies.get(i) is None]
        loads = entry_loads(pairs, self.entry_of_oid, limits=self._limits)
        if not loads:
            return ()
        readers = {layer.reader.name: layer.reader for layer in self._layers}
        if all(readers[ld.layer].entry_local(j) for ld in loads for j in ld.local_indexes):
            return ()
        return tuple((ld.layer, ld.local_indexes) for ld in loads)

    def require_local(self, object_ids: Iterable[int]) -> None:
        """Raise :class:`NotLocal` naming what reading ``object_ids`` needs when any of it
        is not local, before anything is read: a level of a tree walk is parked whole,
        with its chains, and the driver (``storage.machines``) loads it in one round."""
        loads = self.loads_of(object_ids)
        if loads:
            count = sum(len(ix) for _, ix in loads)
            raise NotLocal(f"{count} entries to load before reading", loads=loads)

    # -- ids ------------------------------------------------------------------------------------

    @property
    def layers(self) -> tuple[tuple[LayerEntry, LayerReader], ...]:
        return tuple((layer.entry, layer.reader) for layer in self._layers)

    @property
    def end_id(self) -> int:
        """One past the last id of the newest layer (0 for an empty view)."""
        return self._layers[-1].end if self._layers else 0

    def id_of_oid(
        self, oid: ObjectId, *, below: int | None = None, kind: Kind | None = None
    ) -> int | None:
        """The smallest id of ``oid`` ("Duplicates resolve to the smallest id"), or None.

        ``below`` limits the search to the first ``below`` layers; ``kind`` to one
        kind's part of each oid index (a tree entry's mode says tree or blob).
        """
        layers = self._layers if below is None else self._layers[:below]
        return _lookup(layers, oid, kind)

    def named_id(self, oid: ObjectId) -> int | None:
        """:meth:`id_of_oid` of an oid a fetch names (a want, a tag's target), remembered
        (``_MEMO_MAX``): the next question about it, in this fetch or the next, is a dict
        read. Ingest's questions, about every object a push names, go to
        :meth:`id_of_oid` and are not kept."""
        ids = self._ids
        found = ids.get(oid, _UNASKED)
        if found is _UNASKED:
            found = _lookup(self._layers, oid)
            if len(ids) >= _MEMO_MAX:
                ids.clear()
            ids[ObjectId(bytes(oid))] = found
        return found  # type: ignore[return-value]  # not _UNASKED

    def _layer_at(self, object_id: int) -> _Layer:
        pos = bisect_right(self._starts, object_id) - 1
        if pos >= 0:
            layer = self._layers[pos]
            if object_id < layer.end:
                return layer
        raise KeyError(f"id {object_id} names no object of the view")

    def layer_of(self, object_id: int) -> tuple[int, int, LayerReader]:
        """(first id, end id, reader) of the layer whose range holds ``object_id``."""
        layer = self._layer_at(object_id)
        return layer.first, layer.end, layer.reader

    def locate(self, object_id: int) -> tuple[LayerReader, int]:
        """(layer, local index) of an id: a search over the ranges, then over the id runs.

        An id outside every range, or in a hole, is a programmer error (``KeyError``):
        ids reach callers only from this view.
        """
        layer = self._layer_at(object_id)
        rel = object_id - layer.first
        local = rel if layer.single and rel < layer.reader.object_count else None
        if local is None:
            local = layer.reader.local_of(rel)
            if local is None:
                raise KeyError(f"id {object_id} names no object of the view")
        return layer.reader, local

    def oid_of_id(self, object_id: int) -> ObjectId:
        reader, local = self.locate(object_id)
        return reader.ref_oid(local)

    def kind_of(self, object_id: int) -> Kind:
        reader, local = self.locate(object_id)
        return reader.kind_of(local)

    def kind_ids(self, kind: Kind) -> BitMap:
        """Every id of one kind (seed 004, "Kinds are id runs"; holes may be included)."""
        found = self._kind_ids[kind]
        if found is None:
            found = BitMap.union(BitMap(), *(layer.kinds[kind] for layer in self._layers))
            self._kind_ids[kind] = found
        return found

    # -- commit graph ---------------------------------------------------------------------------

    def commit(self, commit_id: int) -> ViewCommit | None:
        found = _commit_rank(self._layers, commit_id)
        if found is None:
            return None
        g, rank = found
        return ViewCommit(
            commit_id,
            g.tree_ids[rank],
            tuple(g.parents(rank)),
            g.times[rank],
            g.generations[rank],
            BitMap(g.segment(rank)),
        )

    def parents(self, commit_id: int) -> Sequence[int]:
        """A commit's parent ids (``KeyError`` for an id that is no commit of the view)."""
        g, rank = _commit_of(self._layers, commit_id)
        return g.parents(rank)

    @property
    def commit_count(self) -> int:
        return sum(len(layer.graph) for layer in self._layers)

    def closure(self, commit_ids: Iterable[int]) -> BitMap:
        """Union of the segments of every ancestor (DESIGN "Layers": a commit's closure).

        Walked in one compiled call (docs/native.md, ``commit_closure``): the large
        profile's 80,000 commits cost a blobless clone's planning, and an incremental
        fetch whose haves reach far below the new commits, about 3 µs each in Python
        (issue 25). Graphs the routine does not answer for go to the reference."""
        check_walk()  # a fetch's planning stops when its request goes (cancel.py)
        starts = array("I", commit_ids)
        found = native_closure(self._graphs, starts, self.end_id)
        if found is None:
            return closure_reference(self._layers, starts)
        members = array("I")
        members.frombytes(found)
        return BitMap(members)

    def new_commits(
        self, want_commits: Iterable[int], have_commits: Iterable[int]
    ) -> tuple[list[int], list[int]]:
        """(the commits reachable from ``want_commits`` and not from ``have_commits``, the
        have side's commits the walk met: the haves, the parents of the new commits
        among them, and what it passed), by a walk in generation order that
        stops once every commit it holds is the have side's (git's ``limit_list``, its
        ``everybody_uninteresting``). A generation is above every parent's, so a commit
        leaves the queue after every descendant the walk meets, with its side settled:
        a fetch of a few commits on top of what the client has walks those commits and
        the client's tips above them, not the history below (issue 25)."""
        queue: list[tuple[int, int]] = []
        have_side: dict[int, bool] = {}
        layers = self._layers
        for side, commits in ((True, have_commits), (False, want_commits)):
            for c in commits:
                if c not in have_side:
                    have_side[c] = side
                    heappush(queue, (-_generation(layers, c), c))
        wanted = sum(1 for v in have_side.values() if not v)
        new: list[int] = []
        while queue and wanted:
            check_walk()  # a fetch's planning stops when its request goes (cancel.py)
            _, c = heappop(queue)
            side = have_side[c]
            if not side:
                wanted -= 1
                new.append(c)
            for p in self.parents(c):
                known = have_side.get(p)
                if known is None:
                    have_side[p] = side
                    heappush(queue, (-_generation(layers, p), p))
                    wanted += not side
                elif side and not known:  # queued as wanted, reached by the have side too
                    have_side[p] = True
                    wanted -= 1
        return new, [c for c, side in have_side.items() if side]

    def all_reach(self, starts: Iterable[int], targets: Collection[int]) -> bool:
        """Whether every commit of ``starts`` reaches one of ``targets`` (commits).

        Each start is walked down to the lowest target's generation and no further: a
        commit below it is the ancestor of no target (the bound git's
        ``can_all_from_reach_with_flag`` takes from commit dates). The first start that
        reaches none ends the answer."""
        layers = self._layers
        if not targets:
            return False
        floor = min(_generation(layers, t) for t in targets)
        for start in starts:
            seen: set[int] = set()
            stack = [start]
            while stack:
                c = stack.pop()
                if c in targets:
                    break
                if c in seen:
                    continue
                check_walk()  # a fetch's negotiation stops when its request goes
                seen.add(c)
                stack.extend(p for p in self.parents(c) if _generation(layers, p) >= floor)
            else:
                return False
        return True

    def segments(self, commit_ids: Iterable[int]) -> BitMap:
        """The union of these commits' segments (the objects each introduces)."""
        out = BitMap()
        layers = self._layers
        for c in commit_ids:
            g, rank = _commit_of(layers, c)
            out.update(g.segment(rank))
        return out

    def incremental_closure(
        self, want_ids: Sequence[int], have_ids: Sequence[int]
    ) -> tuple[BitMap, BitMap] | None:
        """``closure(wants) - closure(haves)`` without the wants' closure, with the part of
        the haves' closure that decided it; None when a want or a have peels to a tree
        (then both closures are walked).

        The objects are the segments of :meth:`new_commits`: every object reachable from
        the wants and not from the haves is introduced by a commit the haves do not
        reach. A segment may also name an older object the haves reach (a moved path,
        a file put back as it was); none can when every id left is past the pushed
        range of the newest have (:meth:`_source_end`), since whatever an object reaches
        was stored with it or before it. Then the part of the haves' closure answered is
        the segments of the have side's commits met (the haves, the new commits'
        parents): what a thin pack may leave out as a delta base, as git's thin packs
        take their bases from the edge commits' trees, not the whole history. Otherwise
        the haves' closure is walked and taken out, but not the wants': the segments
        already hold all they reach past the haves. A 20-commit fetch of the `large`
        profile walked both closures, 80,000 commits each, for most of its 0.65 s of
        compute CPU; a client whose haves reach far below the new commits still walks
        the one (issue 25)."""
        if not have_ids:
            return None
        wanted, want_commits, want_trees = self.peel(want_ids)
        had, have_commits, have_trees = self.peel(have_ids)
        if want_trees or have_trees:
            return None
        new, met = self.new_commits(want_commits, have_commits)
        had |= self.segments(met)
        ids = (self.segments(new) | wanted) - had
        if ids and ids.min() < self._source_end(max(have_ids)):
            # an older object (a path moved, a file put back) may be had: the haves decide
            had |= self.closure(have_commits)
            ids -= had
        return ids, had

    def _source_end(self, object_id: int) -> int:
        """Where the pushed range that brought ``object_id`` ends: nothing it reaches lies
        past it, since a push refers only to its own objects and older ones ("Object
        ids"). A merged layer keeps each source's kind runs in order (seed 004,
        "Layers"), so a run of a lower kind than the one before starts the next source;
        two sources that do not show that (one ending in trees, the next holding only
        blobs) read as one, a bound past the true end and so still safe. The layer's end
        alone would be the bound of every source a flush or compaction merged: after
        geometric compaction rolled the last pushes into one layer, an incremental fetch
        on top of the one before fell back to both closures (issue 25)."""
        ends = self._layer_at(object_id).source_ends
        return ends[bisect_right(ends, object_id)]

    def object_closure(self, object_ids: Iterable[int]) -> BitMap:
        """Everything reachable from any objects: commits by segments, tags peeled,
        trees walked (refs may name tags, trees and blobs too)."""
        out, commits, trees = self.peel(object_ids)
        out |= self.closure(commits)
        out |= self.tree_closure(trees, skip=out)
        return out

    def peel(self, object_ids: Iterable[int]) -> tuple[BitMap, list[int], list[int]]:
        """The objects with every tag peeled down its chain: (the tags and blobs met, the
        commits, the trees), the start of a closure (:meth:`object_closure`, and serving's
        walk with the parents of shallow commits cut)."""
        out = BitMap()
        commits: list[int] = []
        trees: list[int] = []
        stack = list(object_ids)
        while stack:
            oid_id = stack.pop()
            kind = self.kind_of(oid_id)
            if kind == Kind.COMMIT:
                commits.append(oid_id)
            elif kind == Kind.TAG:
                out.add(oid_id)
                stack.append(self._require(self.tag_target(oid_id)))
            elif kind == Kind.TREE:
                trees.append(oid_id)
            else:
                out.add(oid_id)
        return out, commits, trees

    def tree_closure(self, tree_ids: Iterable[int], *, skip: BitMap | None = None) -> BitMap:
        """Trees and blobs below ``tree_ids`` (with them), read and walked; ids in ``skip``
        (a closed set) are not descended.

        A walk that skipped nothing is kept by its roots (a tree's closure never
        changes: its content is fixed and ids are stable), so shallow and tree-only
        fetches of the same tips walk once.
        """
        roots = tuple(sorted(set(tree_ids)))
        found = self._bodies.tree_closure(roots)
        if found is not None:
            return found - skip if skip else BitMap(found)
        out = BitMap()
        level = [t for t in roots if skip is None or t not in skip]
        skipped = len(level) != len(roots)
        out.update(level)
        met: set[bytes] = set()  # oids already taken or skipped: trees share most entries
        read = 0
        scan: list[int] | None = None  # the bodies a large walk put in the object cache
        pages = ScanPages()
        try:
            while level:
                # Level by level (seed 004, "Machines": tree walks): a level's trees and
                # their chains are loaded in one round before any of them is read.
                self.require_local(level)
                read += len(level)
                if scan is None and read >= SCAN_OBJECTS_MIN:
                    scan = []
                level, cut = self._walk_level(level, out, met, skip, scan=scan, pages=pages)
                skipped = skipped or cut
        finally:
            if scan:
                self._bodies.drop(scan)
        if roots and not skipped:
            self._bodies.put_tree_closure(roots, BitMap(out))
        return out

    def _walk_level(
        self,
        level: list[int],
        out: BitMap,
        met: set[bytes],
        skip: BitMap | None,
        *,
        scan: list[int] | None,
        pages: ScanPages,
    ) -> tuple[list[int], bool]:
        """One level of :meth:`tree_closure`: the trees below ``level`` not met yet, and
        whether ``skip`` cut any child; ``out`` and ``met`` updated.

        A large walk (``scan`` not None, from ``SCAN_OBJECTS_MIN`` trees read on) is a
        scan: its entries are read through the pool and the bodies it puts in the object
        cache leave it when the walk ends. A depth-1 clone of the `large` profile read
        45,000 trees once and kept 82 MiB of data pages and 146 MiB of bodies nobody
        read again (the walk's result is memoized by its roots; issue 25).
        """
        window = None if scan is None else pages
        following: list[int] = []
        skipped = False
        for tree in level:
            check_walk()
            for kind, oid in tree_children(self._read(tree, scan=scan, pages=window), self._limits):
                if oid in met:
                    continue
                met.add(oid)
                child = self._require(oid, kind)
                if child in out:
                    continue
                if skip is not None and child in skip:
                    skipped = True
                    continue
                out.add(child)
                if kind == Kind.TREE:
                    following.append(child)
        return following, skipped

    def tag_target(self, tag_id: int) -> ObjectId:
        """The object tag ``tag_id`` names, remembered as :meth:`named_id` remembers."""
        targets = self._tag_targets
        found = targets.get(tag_id)
        if found is None:
            found = Tag.parse(self.read_id(tag_id), limits=self._limits).object
            if len(targets) >= _MEMO_MAX:
                targets.clear()
            targets[tag_id] = found
        return found

    def _require(self, oid: ObjectId, kind: Kind | None = None) -> int:
        """The id of ``oid``, which the repository must hold: a tag's target (remembered,
        :meth:`named_id`) or, with ``kind``, a tree's entry."""
        found = self.named_id(oid) if kind is None else self.id_of_oid(oid, kind=kind)
        if found is None:
            raise MissingObject(
                f"object {oid_to_hex(oid)} is not in the repository", oid=oid_to_hex(oid)
            )
        return found

    # -- bodies (SnapshotObjects) ---------------------------------------------------------------

    def contains(self, oid: ObjectId) -> bool:
        return self.id_of_oid(oid) is not None

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        """The kind of the id's run (seed 004, "Kinds are id runs"): no body is read."""
        found = self.id_of_oid(oid)
        return None if found is None else TYPE_OF_KIND[self.kind_of(found)]

    def size_of(self, oid: ObjectId) -> int | None:
        """The size the layer's object table records: no body is read."""
        found = self.id_of_oid(oid)
        if found is None:
            return None
        reader, local = self.locate(found)
        return reader.record(local).size

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        found = self.id_of_oid(oid)
        if found is None:
            return None
        return TYPE_OF_KIND[self.kind_of(found)], self.read_id(found)

    def full_entry(
        self, object_id: int, intent: Intent | None = None, pages: ScanPages | None = None
    ) -> bytes:
        """The object as a full pack entry (header and zlib stream): what a fetch sends for
        a stored delta whose base it does not send (gitformat-pack, "Deltified
        representation"). Kept in a byte-bounded LRU shared like the bodies, so repeated
        shallow or filtered fetches of the same tips deflate once. A scan (``intent``: a
        large pack) reads through the pool and keeps no body: the entry is what a repeat
        reads, and a depth-1 clone of the `large` profile left 139 MiB of bodies in the
        object cache that no later read hit (issue 25); its chains are read from
        ``pages``, the writer's own, when given."""
        cached = self._bodies.entry(object_id)
        if cached is None:
            cached = self._bodies.spilled_entry(object_id)
        if cached is not None:
            return cached
        scan: list[int] | None = [] if intent is Intent.SCAN else None
        body = self._read(object_id, intent, scan, pages)
        if scan:
            self._bodies.drop(scan)
        kind = TYPE_OF_KIND[self.kind_of(object_id)]
        # Deflating is nearly all of a depth-1 clone's CPU (issue 25, docs/serving.md,
        # "Rewritten deltas"): at a fast level by default, git's pack default when set.
        level = self._limits.serve_deflate_level
        entry = encode_entry_header(int(kind), len(body)) + deflate(body, level)
        self._bodies.put_entry(object_id, entry)
        if scan is not None:
            # More than the entry cache holds, for the next fetch of the same tips
            # (an LRU under this scan kept none of them: docs/serving.md).
            self._bodies.spill_entry(object_id, entry)
        return entry

    def read_id(self, object_id: int) -> bytes:
        """The full body: the entry inflated, REF_DELTA chains applied across layers."""
        return self._read(object_id)

    def _read(
        self,
        object_id: int,
        intent: Intent | None = None,
        scan: list[int] | None = None,
        pages: ScanPages | None = None,
    ) -> bytes:
        """:meth:`read_id`, its entries read with ``intent`` (``Intent.SCAN``: through the
        pool, no page kept) or from a walk's own ``pages``; the bodies it caches listed
        in ``scan`` when given."""
        cached = self._bodies.get(object_id)
        if cached is not None:
            return cached
        if not self._settled:
            self.require_local((object_id,))  # the whole chain, before a byte is read
        chain: list[tuple[int, bytes]] = []
        current = object_id
        while True:
            body = self._bodies.get(current)
            if body is not None:
                break
            layer = self._layer_at(current)
            reader, local = self.locate(current)
            offset, length, base_ref = reader.entry_row(local)
            if pages is None:
                raw = reader.data_bytes(offset, length, intent)
            else:
                raw = pages.read(reader, offset, length)
            type_num, size, hlen, _, base_oid = parse_entry_header(raw, 0, 0)
            data = _inflate(raw[hlen:], size, current)
            if type_num != OBJ_REF_DELTA:
                body = data
                break
            assert base_oid is not None
            chain.append((current, data))
            if len(chain) > self._limits.delta_chain_depth_max:
                raise LimitExceeded(
                    "delta_chain_depth_max", len(chain), self._limits.delta_chain_depth_max
                )
            # The base by the table's ref (seed 004, "Layers": base ref), as write_pack
            # finds it: a local one is an addition, no oid lookup. A duplicate's id
            # names the same bytes as the canonical one.
            if base_ref != REF_NONE and not base_ref & REF_EXTERNAL:
                base: int | None = layer.first + (
                    base_ref if layer.single else reader.id_of(base_ref)
                )
            else:
                base = self.id_of_oid(base_oid)
            if base is None or base >= current:
                raise CorruptData(f"id {current}: delta base is not older", section=_SECTION)
            current = base
        self._bodies.put(current, body, scan)
        for delta_id, delta in reversed(chain):
            body = apply_delta(body, delta, limits=self._limits)
            self._bodies.put(delta_id, body, scan)
        return body


_CHILD_KINDS = {
    b"40000": Kind.TREE,
    b"100644": Kind.BLOB,
    b"100755": Kind.BLOB,
    b"120000": Kind.BLOB,
    b"100664": Kind.BLOB,
}
_GITLINK = b"160000"


def tree_children(body: bytes, limits: Limits = DEFAULT_LIMITS) -> list[tuple[Kind, ObjectId]]:
    """(kind, oid) of each entry a walk follows: trees and blobs, not gitlinks (git's
    ``rev-list --objects`` does not follow them). The common modes are scanned here
    without building entries; a tree with any other mode goes through ``Tree.parse``,
    which refuses what git refuses (gitformat-tree via ``decode_tree_entry``)."""
    out: list[tuple[Kind, ObjectId]] = []
    pos, end = 0, len(body)
    kinds = _CHILD_KINDS
    while pos < end:
        space = body.find(b" ", pos, pos + 8)
        nul = body.find(b"\0", space + 2) if space > pos else -1
        oid_end = nul + 21
        if nul < 0 or oid_end > end:
            break
        mode = body[pos:space]
        kind = kinds.get(mode)
        if kind is not None:
            out.append((kind, ObjectId(body[nul + 1 : oid_end])))
        elif mode != _GITLINK:
            break
        pos = oid_end
    else:
        if len(out) <= limits.tree_entries_max:
            return out
    return [
        (Kind.TREE if e.is_tree else Kind.BLOB, e.oid)
        for e in Tree.parse(body, limits=limits).entries
        if not e.is_gitlink
    ]


def _inflate(data: bytes, size: int, object_id: int) -> bytes:
    try:
        out = zlib.decompress(data)
    except zlib.error as exc:
        raise CorruptData(
            f"id {object_id}: entry is not a zlib stream: {exc}", section=_SECTION
        ) from None
    if len(out) != size:
        raise CorruptData(
            f"id {object_id}: entry inflates to {len(out)}, not {size}", section=_SECTION
        )
    return out
