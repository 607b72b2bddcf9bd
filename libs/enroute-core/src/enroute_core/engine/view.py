"""A repository view: the layers of a manifest, numbered by stable ids.

Seed 004, "Stable object numbering": every object has the id its layer's
manifest range gives it; duplicates resolve to the smallest id, which is the
copy in the oldest layer, so :meth:`View.id_of_oid` asks the layers oldest
first (their Bloom filters make misses cheap). Finding the layer of an id is
a binary search over the ranges, then the layer's id runs.

Seed 004, "Pages and memory" and DESIGN "Layers": the view holds the commit
graph in ids: per commit its tree, parents, time, generation and segment (a
roaring bitmap of the ids it introduces). A pushed layer's graph is built
from its commit section when the view is built (refs resolved through the
layer's local ids and its external oids); a merged layer stores its graph by
ids. The closure of a set of commits is the union of the segments of every
ancestor, which is how a fetch is planned without walking trees.

The view also implements :class:`~enroute_core.engine.snapshot.SnapshotObjects`,
so a push can be ingested against it: bodies are rebuilt along REF_DELTA
chains that may cross layers.

Memory: the id ranges, one record per commit with its segment bitmap, one
bitmap per kind, and a bounded LRU of inflated bodies
(``Limits.view_body_cache_bytes_max``).
"""

from __future__ import annotations

import zlib
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyroaring import BitMap

from enroute_core.base.errors import CorruptData, InvalidArgument, LimitExceeded, MissingObject
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.delta import apply_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.pack import OBJ_REF_DELTA, parse_entry_header
from enroute_core.git.tag import Tag
from enroute_core.git.tree import MODE_GITLINK, Tree
from enroute_core.state.model import LayerEntry
from enroute_core.storage.layer import REF_EXTERNAL, Kind, LayerReader

TYPE_OF_KIND = {
    Kind.COMMIT: ObjectType.COMMIT,
    Kind.TREE: ObjectType.TREE,
    Kind.BLOB: ObjectType.BLOB,
    Kind.TAG: ObjectType.TAG,
}
_SECTION = "view"


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
    """LRU of inflated bodies by id, bounded in bytes; a body over the bound is not kept."""

    __slots__ = ("_bytes", "_items", "_max")

    def __init__(self, max_bytes: int) -> None:
        self._items: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes

    def get(self, object_id: int) -> bytes | None:
        found = self._items.get(object_id)
        if found is not None:
            self._items.move_to_end(object_id)
        return found

    def put(self, object_id: int, body: bytes) -> None:
        if len(body) > self._max or object_id in self._items:
            return
        self._bytes += len(body)
        while self._bytes > self._max:
            _, old = self._items.popitem(last=False)
            self._bytes -= len(old)
        self._items[object_id] = body


class View:
    """Layers in id order, their ids, kinds, bodies and commit graph."""

    __slots__ = ("_bodies", "_commits", "_entries", "_kind_ids", "_limits", "_readers", "_starts")

    def __init__(
        self,
        layers: Sequence[tuple[LayerEntry, LayerReader]],
        *,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        """Check the ranges ("Assignment": ascending, disjoint) and build the commit graph."""
        self._limits = limits
        self._entries = tuple(e for e, _ in layers)
        self._readers = tuple(r for _, r in layers)
        end = 0
        for entry, reader in layers:
            if entry.first_id < end or entry.id_count < reader.object_count:
                raise InvalidArgument(
                    f"layer range {entry.first_id}+{entry.id_count} overlaps or is too short"
                )
            if reader.object_count and reader.id_of(reader.object_count - 1) >= entry.id_count:
                raise CorruptData("layer ids run past its manifest range", section=_SECTION)
            end = entry.end_id
        self._starts = [e.first_id for e in self._entries]
        self._bodies = _Bodies(limits.view_body_cache_bytes_max)
        self._kind_ids = self._build_kind_ids()
        self._commits: dict[int, ViewCommit] = {}
        for pos in range(len(self._readers)):
            self._load_commits(pos)

    # -- ids ------------------------------------------------------------------------------------

    @property
    def layers(self) -> tuple[tuple[LayerEntry, LayerReader], ...]:
        return tuple(zip(self._entries, self._readers, strict=True))

    @property
    def end_id(self) -> int:
        """One past the last id of the newest layer (0 for an empty view)."""
        return self._entries[-1].end_id if self._entries else 0

    def id_of_oid(self, oid: ObjectId, *, below: int | None = None) -> int | None:
        """The smallest id of ``oid`` ("Duplicates resolve to the smallest id"), or None.

        ``below`` limits the search to the first ``below`` layers.
        """
        stop = len(self._readers) if below is None else below
        for pos in range(stop):
            local = self._readers[pos].lookup(oid)
            if local is not None:
                return self._entries[pos].first_id + self._readers[pos].id_of(local)
        return None

    def locate(self, object_id: int) -> tuple[LayerReader, int]:
        """(layer, local index) of an id: a search over the ranges, then over the id runs.

        An id outside every range, or in a hole, is a programmer error (``KeyError``):
        ids reach callers only from this view.
        """
        pos = bisect_right(self._starts, object_id) - 1
        if pos >= 0 and object_id < self._entries[pos].end_id:
            local = self._readers[pos].local_of(object_id - self._entries[pos].first_id)
            if local is not None:
                return self._readers[pos], local
        raise KeyError(f"id {object_id} names no object of the view")

    def oid_of_id(self, object_id: int) -> ObjectId:
        reader, local = self.locate(object_id)
        return reader.ref_oid(local)

    def kind_of(self, object_id: int) -> Kind:
        reader, local = self.locate(object_id)
        return reader.kind_of(local)

    def kind_ids(self, kind: Kind) -> BitMap:
        """Every id of one kind (seed 004, "Kinds are id runs"; holes may be included)."""
        return self._kind_ids[kind]

    def _build_kind_ids(self) -> tuple[BitMap, ...]:
        out = tuple(BitMap() for _ in range(4))
        for entry, reader in zip(self._entries, self._readers, strict=True):
            for start, stop, kind in reader.kind_runs:
                first = entry.first_id + reader.id_of(start)
                last = entry.first_id + reader.id_of(stop - 1)
                out[kind].add_range(first, last + 1)
        return out

    # -- commit graph ---------------------------------------------------------------------------

    def commit(self, commit_id: int) -> ViewCommit | None:
        return self._commits.get(commit_id)

    @property
    def commit_count(self) -> int:
        return len(self._commits)

    def _load_commits(self, pos: int) -> None:
        reader = self._readers[pos]
        graph = reader.commit_graph()
        if graph is not None:
            for rank in range(len(graph)):
                c = graph.commit(rank)
                self._add_commit(c.commit_id, c.tree_id, c.parents, c.time, BitMap(c.segment))
            return
        externals: dict[int, int] = {}
        first = self._entries[pos].first_id

        def resolve(ref: int) -> int:
            if ref & REF_EXTERNAL:
                index = ref & ~REF_EXTERNAL
                found = externals.get(index)
                if found is None:
                    oid = reader.external_oid(index)
                    found = self.id_of_oid(oid, below=pos)
                    if found is None:
                        raise CorruptData(
                            f"external oid {oid_to_hex(oid)} is in no older layer",
                            section=_SECTION,
                        )
                    externals[index] = found
                return found
            if pos:  # a concurrent push may have stored the same object first
                older = self.id_of_oid(reader.ref_oid(ref), below=pos)
                if older is not None:
                    return older
            return first + reader.id_of(ref)

        for rec in reader.commits():
            commit_id = resolve(rec.local_index)
            if commit_id in self._commits:
                continue  # a duplicate of a commit an older layer holds
            parents = tuple(resolve(p) for p in rec.parent_refs)
            segment = BitMap(resolve(m) for m in rec.segment_refs)
            self._add_commit(commit_id, resolve(rec.tree_ref), parents, rec.time, segment)

    def _add_commit(
        self, commit_id: int, tree_id: int, parents: tuple[int, ...], time: int, segment: BitMap
    ) -> None:
        generation = 1
        for p in parents:
            parent = self._commits.get(p)
            if parent is None:
                raise CorruptData(f"commit {commit_id}: parent {p} is unknown", section=_SECTION)
            generation = max(generation, parent.generation + 1)
        self._commits[commit_id] = ViewCommit(
            commit_id, tree_id, parents, time, generation, segment
        )

    def closure(self, commit_ids: Iterable[int]) -> BitMap:
        """Union of the segments of every ancestor (DESIGN "Layers": a commit's closure)."""
        out = BitMap()
        seen = BitMap()
        stack = list(commit_ids)
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            found = self._commits.get(c)
            if found is None:
                raise KeyError(f"id {c} is not a commit of the view")
            out |= found.segment
            stack.extend(p for p in found.parents if p not in seen)
        return out

    def object_closure(self, object_ids: Iterable[int]) -> BitMap:
        """Everything reachable from any objects: commits by segments, tags peeled,
        trees walked (refs may name tags, trees and blobs too)."""
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
        out |= self.closure(commits)
        out |= self.tree_closure(trees, skip=out)
        return out

    def tree_closure(self, tree_ids: Iterable[int], *, skip: BitMap | None = None) -> BitMap:
        """Trees and blobs below ``tree_ids`` (with them), read and walked; ids in ``skip``
        (a closed set) are not descended."""
        out = BitMap()
        stack = [t for t in tree_ids if skip is None or t not in skip]
        out.update(stack)
        while stack:
            for entry in Tree.parse(self.read_id(stack.pop()), limits=self._limits).entries:
                if entry.mode == MODE_GITLINK:
                    continue
                child = self._require(entry.oid)
                if child in out or (skip is not None and child in skip):
                    continue
                out.add(child)
                if entry.is_tree:
                    stack.append(child)
        return out

    def tag_target(self, tag_id: int) -> ObjectId:
        return Tag.parse(self.read_id(tag_id), limits=self._limits).object

    def _require(self, oid: ObjectId) -> int:
        found = self.id_of_oid(oid)
        if found is None:
            raise MissingObject(
                f"object {oid_to_hex(oid)} is not in the repository", oid=oid_to_hex(oid)
            )
        return found

    # -- bodies (SnapshotObjects) ---------------------------------------------------------------

    def contains(self, oid: ObjectId) -> bool:
        return self.id_of_oid(oid) is not None

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        found = self.id_of_oid(oid)
        if found is None:
            return None
        return TYPE_OF_KIND[self.kind_of(found)], self.read_id(found)

    def read_id(self, object_id: int) -> bytes:
        """The full body: the entry inflated, REF_DELTA chains applied across layers."""
        cached = self._bodies.get(object_id)
        if cached is not None:
            return cached
        chain: list[tuple[int, bytes]] = []
        current = object_id
        while True:
            body = self._bodies.get(current)
            if body is not None:
                break
            reader, local = self.locate(current)
            raw = reader.entry_bytes(local)
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
            base = self.id_of_oid(base_oid)
            if base is None or base >= current:
                raise CorruptData(f"id {current}: delta base is not older", section=_SECTION)
            current = base
        self._bodies.put(current, body)
        for delta_id, delta in reversed(chain):
            body = apply_delta(body, delta, limits=self._limits)
            self._bodies.put(delta_id, body)
        return body


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
