"""Serving a fetch: plan the pack with bitmaps, then stream it in id order.

DESIGN "Layers": the objects of a fetch are ``closure(wants) - closure(haves)``,
a difference of roaring bitmaps of ids; kinds are id runs, so ``blob:none``
is one more difference. Seed 004, "Layers" ("One order"): id order is a
topological order with every delta base before its delta, so a pack written
in id order can name each base by offset, and stored entries are copied
verbatim ("Entries are stored as pack entries, so serving copies them").

:func:`write_pack` decides per stored entry (gitformat-pack, "Deltified
representation"):

1. A full entry is copied as it is.
2. A REF_DELTA whose base is earlier in this pack becomes an OFS_DELTA when the
   client said ``ofs-delta`` (the header is rewritten, the zlib bytes are the
   same); otherwise it stays a REF_DELTA.
3. A REF_DELTA whose base the client has (in ``closure(haves)``) stays as it
   is when the client allows a thin pack (gitprotocol-v2 "fetch", thin-pack).
4. Any other REF_DELTA (a base filtered out, not reachable by the client, or
   a thin pack not allowed) is resolved to its full body and deflated.

Shallow fetches (gitprotocol-v2 "fetch", deepen): the commits within depth N
of the wants are sent with their segments; commits at depth N whose parents
are cut (the new shallow boundary) get their whole tree closure, since their
segments assume the parents.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pyroaring import BitMap

from enroute_core.base.errors import InvalidArgument, MissingObject
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.engine.view import TYPE_OF_KIND, View
from enroute_core.git.pack import (
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    encode_entry_header,
    encode_ofs_distance,
    parse_entry_header,
)
from enroute_core.git.packwrite import ChunkSink, PackWriter
from enroute_core.git.tree import MODE_GITLINK, Tree
from enroute_core.storage.layer import Kind

# -- filters (git rev-list --filter; gitprotocol-v2 "fetch", filter) ---------------------------


@dataclass(frozen=True, slots=True)
class BlobNone:
    """``blob:none``: no blobs."""


@dataclass(frozen=True, slots=True)
class BlobLimit:
    """``blob:limit=<n>``: blobs of fewer than ``limit_bytes`` bytes (git omits size >= n)."""

    limit_bytes: int


@dataclass(frozen=True, slots=True)
class TreeDepth:
    """``tree:<depth>``: trees and blobs less than ``depth`` levels below a root tree
    (the root tree is at depth 0, so ``tree:0`` sends commits and tags only)."""

    depth: int


FetchFilter = BlobNone | BlobLimit | TreeDepth


@dataclass(frozen=True, slots=True)
class PackPlan:
    """What a fetch sends, by id, and what the client is known to have.

    ``shallow`` lists the commits whose parents are cut by ``deepen``: the
    protocol answers them as ``shallow <oid>`` lines.
    """

    ids: BitMap
    have_ids: BitMap
    shallow: tuple[ObjectId, ...]
    thin: bool
    ofs_delta: bool

    @property
    def object_count(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Counts for side-band channel 2 (the protocol formats the text)."""

    stage: str
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class WriteStats:
    """What :func:`write_pack` did, entry by entry."""

    object_count: int
    pack_bytes: int
    copied: int
    """Entries copied verbatim (full, REF_DELTA in the pack, or thin)."""
    ofs_rewritten: int
    thin_kept: int
    resolved: int
    """Deltas sent as full objects (rule 4)."""


ProgressFn = Callable[[ProgressEvent], object]


# -- planning --------------------------------------------------------------------------------


def plan_fetch(
    view: View,
    wants: Sequence[ObjectId],
    haves: Sequence[ObjectId] = (),
    *,
    filter: FetchFilter | None = None,
    thin: bool = False,
    ofs_delta: bool = True,
    include_tag: Iterable[ObjectId] = (),
    deepen: int | None = None,
) -> PackPlan:
    """``closure(wants) - closure(haves)``, then filtered, plus include-tag's tags.

    ``include_tag`` takes the annotated tags the refs name (gitprotocol-v2
    "fetch", include-tag): each is sent when the object it peels to is sent.
    Haves the view lacks are ignored (the client may have more than we do);
    a want it lacks raises ``MissingObject``. ``deepen`` is a commit depth
    (1 = the wanted commits alone).
    """
    if deepen is not None and deepen < 1:
        raise InvalidArgument(f"deepen must be at least 1, not {deepen}")
    want_ids = [_want_id(view, w) for w in wants]
    have_ids = [h for h in (view.id_of_oid(o) for o in haves) if h is not None]
    have_closure = view.object_closure(have_ids)
    shallow: tuple[ObjectId, ...] = ()
    if deepen is None:
        ids = view.object_closure(want_ids)
    else:
        ids, cut = _shallow_closure(view, want_ids, deepen)
        shallow = tuple(view.oid_of_id(c) for c in cut)
    ids -= have_closure
    if filter is not None:
        ids = _apply_filter(view, ids, filter, have_closure)
    tags = _included_tags(view, include_tag, ids, have_closure)
    ids |= tags
    return PackPlan(ids, have_closure, shallow, thin, ofs_delta)


def _want_id(view: View, oid: ObjectId) -> int:
    found = view.id_of_oid(oid)
    if found is None:
        raise MissingObject(f"want {oid_to_hex(oid)} is not our object", oid=oid_to_hex(oid))
    return found


def _shallow_closure(view: View, want_ids: Sequence[int], depth: int) -> tuple[BitMap, BitMap]:
    """(objects of the commits within ``depth``, the commits whose parents are cut)."""
    out = BitMap()
    others: list[int] = []
    level: list[int] = []
    for want in want_ids:
        current = want
        while view.kind_of(current) == Kind.TAG:  # a wanted tag is sent with what it peels to
            out.add(current)
            current = _want_id(view, view.tag_target(current))
        (level if view.kind_of(current) == Kind.COMMIT else others).append(current)
    seen = BitMap(level)
    cut = BitMap()
    for d in range(1, depth + 1):
        following: list[int] = []
        for c in level:
            commit = view.commit(c)
            assert commit is not None
            out |= commit.segment
            if d == depth and commit.parents:
                cut.add(c)
            elif d < depth:
                following.extend(p for p in commit.parents if p not in seen)
                seen.update(commit.parents)
        level = following
    roots = []
    for c in cut:
        commit = view.commit(c)
        assert commit is not None
        out.add(c)
        roots.append(commit.tree_id)
    out |= view.tree_closure(roots)
    out |= view.object_closure(others)
    return out, cut


def _apply_filter(view: View, ids: BitMap, spec: FetchFilter, have: BitMap) -> BitMap:
    blobs = ids & view.kind_ids(Kind.BLOB)
    if isinstance(spec, BlobNone):
        return ids - blobs
    if isinstance(spec, BlobLimit):
        big = BitMap()
        for b in blobs:
            reader, local = view.locate(b)
            if reader.record(local).size >= spec.limit_bytes:
                big.add(b)
        return ids - big
    return _tree_depth(view, ids, spec.depth, have)


def _tree_depth(view: View, ids: BitMap, depth: int, have: BitMap) -> BitMap:
    """Commits and tags, and trees and blobs met above ``depth`` (breadth first, so each
    object is met first at its smallest depth, as git's filter counts it)."""
    kept = ids & (view.kind_ids(Kind.COMMIT) | view.kind_ids(Kind.TAG))
    if depth == 0:
        return kept
    roots: list[int] = []
    for c in ids & view.kind_ids(Kind.COMMIT):
        commit = view.commit(c)
        assert commit is not None
        roots.append(commit.tree_id)
    level = [t for t in dict.fromkeys(roots) if t not in have]
    seen = BitMap(level)
    for d in range(depth):
        kept.update(t for t in level if t in ids)
        if d + 1 == depth:
            break
        following: list[int] = []
        for tree in level:
            for entry in Tree.parse(view.read_id(tree)).entries:
                if entry.mode == MODE_GITLINK:
                    continue
                child = _want_id(view, entry.oid)
                if child in seen or child in have:
                    continue
                seen.add(child)
                if entry.is_tree:
                    following.append(child)
                elif child in ids:
                    kept.add(child)
        level = following
    return kept


def _included_tags(view: View, tags: Iterable[ObjectId], ids: BitMap, have: BitMap) -> BitMap:
    out = BitMap()
    for oid in tags:
        chain: list[int] = []
        current = view.id_of_oid(oid)
        while current is not None and view.kind_of(current) == Kind.TAG:
            chain.append(current)
            current = view.id_of_oid(view.tag_target(current))
        if current is not None and (current in ids or current in out):
            out.update(t for t in chain if t not in have and t not in ids)
    return out


# -- writing ---------------------------------------------------------------------------------


def write_pack(
    view: View,
    plan: PackPlan,
    sink: ChunkSink,
    *,
    progress: ProgressFn | None = None,
    progress_every: int = 1024,
) -> WriteStats:
    """Stream the planned pack to ``sink`` in id order (rules 1-4 of the module docstring).

    ``progress`` receives a ``Writing objects`` event every ``progress_every``
    objects and at the end. Memory: the offset of each object written (for
    OFS_DELTA distances) and the view's body cache.
    """
    writer = PackWriter(sink)
    total = len(plan.ids)
    writer.header(total)
    offsets: dict[int, int] = {}
    copied = rewritten = thin_kept = resolved = 0
    for done, object_id in enumerate(plan.ids, start=1):
        reader, local = view.locate(object_id)
        raw = reader.entry_bytes(local)
        offset = writer.offset
        type_num, size, hlen, _, base_oid = parse_entry_header(raw, 0, 0)
        if type_num != OBJ_REF_DELTA:
            writer.add_raw_entry(raw)
            copied += 1
        else:
            assert base_oid is not None
            base = view.id_of_oid(base_oid)
            base_offset = offsets.get(base) if base is not None else None
            if base_offset is not None and plan.ofs_delta:
                head = encode_entry_header(OBJ_OFS_DELTA, size)
                head += encode_ofs_distance(offset - base_offset)
                writer.add_raw_entry(head + raw[hlen:])
                rewritten += 1
            elif base_offset is not None or (
                plan.thin and base is not None and base in plan.have_ids
            ):
                writer.add_raw_entry(raw)
                copied += 1
                thin_kept += base_offset is None
            else:
                body = view.read_id(object_id)
                writer.add_full(int(TYPE_OF_KIND[reader.kind_of(local)]), body)
                resolved += 1
        offsets[object_id] = offset
        if progress is not None and (done % progress_every == 0 or done == total):
            progress(ProgressEvent("Writing objects", done, total))
    writer.finish()
    return WriteStats(total, writer.offset, copied, rewritten, thin_kept, resolved)
