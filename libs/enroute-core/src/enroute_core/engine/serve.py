"""Serving a fetch: plan the pack with bitmaps, then stream it in id order.

DESIGN "Layers": the objects of a fetch are ``closure(wants) - closure(haves)``,
a difference of roaring bitmaps of ids; kinds are id runs, so ``blob:none``
is one more difference. Seed 004, "Layers" ("One order"): id order is a
topological order with every delta base before its delta, so a pack written
in id order can name each base by offset, and stored entries are copied
verbatim ("Entries are stored as pack entries, so serving copies them").

:func:`write_pack` is a planner plus an emitter: :class:`PackPlanner` decides per
stored entry (gitformat-pack, "Deltified representation") and says so as an
instruction (:class:`Copy`, :class:`Rewrite`, :class:`Resolved`, or a :class:`Run`
of entries), reading the layers and writing nothing; :class:`PackWriter` carries
the instructions out:

1. A full entry is copied as it is.
2. A REF_DELTA whose base is earlier in this pack becomes an OFS_DELTA when the
   client said ``ofs-delta`` (the header is rewritten, the zlib bytes are the
   same); otherwise it stays a REF_DELTA.
3. A REF_DELTA whose base the client has (in ``closure(haves)``) stays as it
   is when the client allows a thin pack (gitprotocol-v2 "fetch", thin-pack).
4. Any other REF_DELTA (a base filtered out, not reachable by the client, or
   a thin pack not allowed) is resolved to its full body and deflated.

Shallow fetches (gitprotocol-v2 "fetch", shallow, deepen, deepen-relative,
deepen-since, deepen-not): :func:`plan_shallow` picks the new boundary as git's
upload-pack does; then both the wants and the haves are walked with the parents
of every boundary commit (new, and the client's own) cut. A commit with no cut
below it contributes its segments; one above a cut has its tree walked, since a
segment assumes the parents.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

from enroute_native.pack_run import write_run
from pyroaring import BitMap

from enroute_core.base.errors import CorruptData, InvalidArgument, MissingObject, NotLocal
from enroute_core.base.ids import OID_BYTES, ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.engine.cancel import check_walk
from enroute_core.engine.view import ScanPages, View, ViewCommit
from enroute_core.git.pack import (
    OBJ_REF_DELTA,
    encode_pack_header,
    ref_delta_as_ofs,
)
from enroute_core.git.packwrite import ChunkSink
from enroute_core.git.tree import Tree
from enroute_core.storage.budgeted import LoadPins
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.layer import REF_EXTERNAL, Kind, LayerReader
from enroute_core.storage.layer.format import REF_NONE, S_DATA
from enroute_core.storage.layer.reader import EntryRows
from enroute_core.storage.machines import (
    EntryLoad,
    MachineContext,
    Progress,
    Ticket,
    chain_of,
    ticket_of,
)
from enroute_core.storage.pool import SCAN_OBJECTS_MIN, Intent

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

    ``shallow`` lists the new boundary commits (``shallow <oid>`` lines) and
    ``unshallow`` the client's shallow commits whose parents it now gets.
    """

    ids: BitMap
    have_ids: BitMap
    shallow: tuple[ObjectId, ...]
    thin: bool
    ofs_delta: bool
    unshallow: tuple[ObjectId, ...] = ()

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


INFINITE_DEPTH = 0x7FFFFFFF
"""``deepen 2147483647``: what ``git fetch --unshallow`` asks for (git's INFINITE_DEPTH)."""


@dataclass(frozen=True, slots=True)
class Shallow:
    """The shallow boundary a fetch gives the client (gitprotocol-v2 "fetch", shallow-info).

    ``shallow``: new boundary commits, sent as ``shallow <oid>``; ``unshallow``: the
    client's shallow commits whose parents it now gets; ``grafts``: every commit whose
    parents the walks cut (the new boundary and all of the client's shallow commits).
    """

    shallow: tuple[ObjectId, ...]
    unshallow: tuple[ObjectId, ...]
    grafts: BitMap


# -- planning --------------------------------------------------------------------------------


def plan_shallow(
    view: View,
    wants: Sequence[ObjectId],
    *,
    client_shallow: Sequence[ObjectId] = (),
    deepen: int | None = None,
    deepen_relative: bool = False,
    deepen_since: int | None = None,
    deepen_not: Sequence[ObjectId] = (),
) -> Shallow:
    """The new shallow boundary, as git's upload-pack decides it (gitprotocol-v2
    "fetch": shallow, deepen, deepen-relative, deepen-since, deepen-not).

    It does not depend on the haves, so v0 can answer it before the acks. ``deepen``
    counts commits from the wants (1 = the wanted commits), or, with
    ``deepen_relative``, from the client's shallow commits (it deepens them by N).
    :data:`INFINITE_DEPTH` unshallows every client shallow commit. ``deepen_since``
    keeps commits whose time is at least it, ``deepen_not`` stops at the ancestors of
    the given objects (both as ``git rev-list --max-age=<t> --not <refs>``). Client
    shallow commits the view lacks are ignored, as git does.
    """
    if deepen is not None and deepen < 1:
        raise InvalidArgument(f"deepen must be at least 1, not {deepen}")
    if deepen is not None and (deepen_since is not None or deepen_not):
        raise InvalidArgument("deepen cannot be used with deepen-since or deepen-not")
    client = BitMap()
    for oid in client_shallow:
        found = view.id_of_oid(oid)
        if found is not None and view.kind_of(found) == Kind.COMMIT:
            client.add(found)
    new = BitMap()
    walked = BitMap()  # git's NOT_SHALLOW: commits whose parents the client gets
    if deepen == INFINITE_DEPTH:
        walked = BitMap(client)
    elif deepen is not None:
        starts = list(client) if deepen_relative else _want_commits(view, wants)
        walked, new = _depth_walk(view, starts, deepen + 1 if deepen_relative else deepen)
    elif deepen_since is not None or deepen_not:
        excluded = _ancestors(view, _want_commits(view, deepen_not))
        walked, new = _since_walk(view, _want_commits(view, wants), deepen_since, excluded)
    return Shallow(
        tuple(view.oid_of_id(c) for c in new - client),
        tuple(view.oid_of_id(c) for c in client & walked),
        new | client,
    )


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
    deepen_relative: bool = False,
    deepen_since: int | None = None,
    deepen_not: Sequence[ObjectId] = (),
    client_shallow: Sequence[ObjectId] = (),
) -> PackPlan:
    """``closure(wants) - closure(haves)``, then filtered, plus include-tag's tags.

    Wants may be any objects (a partial clone fetches missing trees and blobs by
    id). What the client names is always sent, the filter applies below it, as git's
    ``list_objects_filter__filter_object`` exempts objects not marked
    ``NOT_USER_GIVEN`` (list-objects-filter.c): the wants, and the tags and the tree
    or blob that a wanted tag peels to (revision.c ``handle_commit`` adds those as
    given). A tag on a blob or a tree thus brings its target under every filter, and
    ``git rev-list --objects --all --missing=print`` in the partial clone finds no
    tag without its target. ``include_tag`` takes the
    annotated tags the refs name (gitprotocol-v2 "fetch", include-tag): each is sent
    when the object it peels to is sent. Haves the view lacks are ignored (the client
    may have more than we do); a want it lacks raises ``MissingObject``. The shallow
    arguments are those of :func:`plan_shallow`; with a shallow client, both sides
    are walked with the parents of the boundary commits cut, so what lies behind the
    client's boundary is not taken as had. A fetch on top of the haves takes its
    objects from the new commits' segments (``View.incremental_closure``), and
    ``have_ids`` is then the part of the haves' closure that walk met.
    """
    want_ids = [_want_id(view, w) for w in wants]
    have_ids = [h for h in (view.id_of_oid(o) for o in haves) if h is not None]
    bound = plan_shallow(
        view,
        wants,
        client_shallow=client_shallow,
        deepen=deepen,
        deepen_relative=deepen_relative,
        deepen_since=deepen_since,
        deepen_not=deepen_not,
    )
    unshallow = [_want_id(view, u) for u in bound.unshallow]
    extra_wants: list[int] = []
    for u in unshallow:
        commit = view.commit(u)
        assert commit is not None
        extra_wants.extend(commit.parents)
    found = None
    if not bound.grafts and not unshallow and filter is None:
        found = view.incremental_closure(want_ids, have_ids)  # a fetch on top of the haves
    if found is None:
        have_closure = _reach(view, have_ids + unshallow, bound.grafts)
        ids = _reach(view, want_ids + extra_wants, bound.grafts) - have_closure
    else:
        ids, have_closure = found
    if filter is not None:
        given = _given(view, want_ids) - have_closure
        ids = _apply_filter(view, ids, filter, have_closure, given) | given
    tags = _included_tags(view, include_tag, ids, have_closure)
    ids |= tags
    return PackPlan(ids, have_closure, bound.shallow, thin, ofs_delta, bound.unshallow)


def check_wants(
    view: View, wants: Iterable[ObjectId], *, tips: Iterable[ObjectId] | None = None
) -> None:
    """Refuse a request whose wants the repository lacks, before anything is answered.

    git's upload-pack checks each want when it reads the want list and ends the
    conversation with ``ERR upload-pack: not our ref <oid>`` (gitprotocol-pack,
    "Packfile Negotiation"). Checking here, ahead of any ACK, NAK, shallow line or
    progress, lets the caller answer with that ``ERR`` packet instead of cutting a
    started response.

    ``tips`` None (protocol v2, gitprotocol-v2 "fetch": wants "are not limited to
    advertised objects"): any object of the repository may be wanted. With ``tips``
    (the advertised values and their peeled objects; v0 and v1 over stateless HTTP),
    a want that is no tip must be reachable from one, as git's ``check_non_tip``
    decides for a stateless request; the closure is walked only when such a want
    comes.
    """
    wants = list(wants)
    for oid in wants:
        if view.named_id(oid) is None:
            raise _not_ours(oid)
    if tips is None:
        return
    tip_set = set(tips)
    others = [w for w in wants if w not in tip_set]
    if not others:
        return
    tip_ids = [i for i in (view.id_of_oid(t) for t in tip_set) if i is not None]
    reach = view.object_closure(tip_ids)
    for oid in others:
        if _want_id(view, oid) not in reach:
            raise _not_ours(oid)


def _not_ours(oid: ObjectId) -> MissingObject:
    hex_oid = oid_to_hex(oid)
    return MissingObject(f"upload-pack: not our ref {hex_oid}", oid=hex_oid)


def ready_to_pack(view: View, wants: Iterable[ObjectId], common: Iterable[ObjectId]) -> bool:
    """Whether a negotiation may end at these common haves (``ready``, ``ACK ... ready``):
    every wanted commit reaches one of them or a parent of one. This is upload-pack's
    ``ok_to_give_up``: a want must reach a commit marked ``THEY_HAVE``, which ``got_oid``
    sets on each have and its parents; a want that peels to no commit counts as reached.

    Ready at the first common have stopped a client before it named the tip a fetch
    builds on whenever its 16 newest-dated refs were other branches not below the wants
    (git sends haves by commit date): the plan then took everything above their fork
    points as new and sent again what the client had."""
    targets: set[int] = set()
    for oid in common:
        found = view.id_of_oid(oid)
        if found is not None and view.kind_of(found) == Kind.COMMIT:
            targets.add(found)
            targets.update(view.parents(found))
    return view.all_reach(_want_commits(view, wants), targets)


def _want_id(view: View, oid: ObjectId) -> int:
    found = view.named_id(oid)
    if found is None:
        raise MissingObject(f"want {oid_to_hex(oid)} is not our object", oid=oid_to_hex(oid))
    return found


def _want_commits(view: View, oids: Iterable[ObjectId]) -> list[int]:
    """The commits the objects peel to (trees and blobs have none)."""
    out: list[int] = []
    for oid in oids:
        current = _want_id(view, oid)
        while view.kind_of(current) == Kind.TAG:
            current = _want_id(view, view.tag_target(current))
        if view.kind_of(current) == Kind.COMMIT:
            out.append(current)
    return out


def _commit(view: View, commit_id: int) -> ViewCommit:
    commit = view.commit(commit_id)
    assert commit is not None
    return commit


def _parents(view: View, commit_id: int) -> Sequence[int]:
    check_walk()  # every commit walk steps through here: it stops when its request goes
    return view.parents(commit_id)


def _depth_walk(view: View, starts: Sequence[int], depth: int) -> tuple[BitMap, BitMap]:
    """Breadth first, so each commit is met at its smallest depth (the starts are at 1):
    (commits above ``depth``, commits at ``depth`` that have parents)."""
    walked, cut = BitMap(), BitMap()
    level = list(dict.fromkeys(starts))
    seen = BitMap(level)
    for d in range(1, depth + 1):
        following: list[int] = []
        for c in level:
            parents = _parents(view, c)
            if d < depth:
                walked.add(c)
                following.extend(p for p in parents if p not in seen)
                seen.update(parents)
            elif parents:
                cut.add(c)
        level = following
        if not level:
            break
    return walked, cut


def _ancestors(view: View, starts: Iterable[int]) -> BitMap:
    out = BitMap()
    stack = list(starts)
    while stack:
        c = stack.pop()
        if c not in out:
            out.add(c)
            stack.extend(p for p in _parents(view, c) if p not in out)
    return out


def _since_walk(
    view: View, starts: Sequence[int], since: int | None, excluded: BitMap
) -> tuple[BitMap, BitMap]:
    """git's ``get_shallow_commits_by_rev_list``: the commits ``rev-list`` selects, and
    those of them with a parent it does not select (the boundary)."""

    def selected(c: int) -> bool:
        if c in excluded:
            return False
        commit = view.commit(c)
        assert commit is not None
        return since is None or commit.time >= since

    chosen = BitMap()
    stack = [c for c in starts if selected(c)]
    while stack:
        c = stack.pop()
        if c in chosen:
            continue
        chosen.add(c)
        stack.extend(p for p in _parents(view, c) if p not in chosen and selected(p))
    if not chosen:
        raise InvalidArgument("no commits selected for shallow requests")
    cut = BitMap(c for c in chosen if any(p not in chosen for p in _parents(view, c)))
    return chosen - cut, cut


def _reach(view: View, starts: Sequence[int], grafts: BitMap) -> BitMap:
    """Every object reachable from ``starts`` when the parents of ``grafts`` are cut.

    Commits with no graft below them contribute their closure (segments); a commit
    above a graft cannot, since its segment assumes parents the walk cut, so its tree
    is walked (skipping the closed part already found)."""
    if not grafts:
        return view.object_closure(starts)
    out, commits, trees = view.peel(starts)
    walk: list[int] = []
    seen = BitMap()
    while commits:
        c = commits.pop()
        if c in seen:
            continue
        seen.add(c)
        walk.append(c)
        if c not in grafts:
            commits.extend(p for p in _parents(view, c) if p not in seen)
    by_generation = sorted(walk, key=lambda c: _commit(view, c).generation)
    above = BitMap()  # commits with a graft at or below them
    for c in by_generation:
        if c in grafts or any(p in above for p in _parents(view, c)):
            above.add(c)
    out |= view.closure(c for c in walk if c not in above)
    roots: list[int] = []
    for c in above:
        commit = view.commit(c)
        assert commit is not None
        roots.append(commit.tree_id)
    out |= view.tree_closure(roots + trees, skip=out)
    out |= above
    return out


def _given(view: View, want_ids: Iterable[int]) -> BitMap:
    """The objects a fetch names itself: each want, and down each wanted tag's chain
    the tags and the object it ends at (git's objects without ``NOT_USER_GIVEN``).
    A chain is walked once per tag, so its length is bounded by the tags of the view."""
    out = BitMap()
    for want in want_ids:
        current = want
        while current not in out:
            out.add(current)
            if view.kind_of(current) != Kind.TAG:
                break
            current = _want_id(view, view.tag_target(current))
    return out


def _apply_filter(
    view: View, ids: BitMap, spec: FetchFilter, have: BitMap, given: BitMap
) -> BitMap:
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
    return _tree_depth(view, ids, spec.depth, have, given & view.kind_ids(Kind.TREE))


def _tree_depth(view: View, ids: BitMap, depth: int, have: BitMap, given: BitMap) -> BitMap:
    """Commits and tags, and trees and blobs met above ``depth`` (breadth first, so each
    object is met first at its smallest depth, as git's filter counts it).

    A commit's root tree is at depth 0 and its entries at 1. A tree the client names
    (``given``: a want, or a wanted tag's target) is sent whatever the depth, and its
    entries are at depth 0: git's filter never sees the given tree itself, so its
    depth count does not go up for it (list-objects-filter.c, ``filter_trees_depth``;
    ``git rev-list --objects --filter=tree:1 <tree>`` lists the tree's entries).

    ``depth`` is the client's number and may be anything up to 2^64: the walk ends at
    the first level that adds no tree, so its work is bounded by the trees of the
    closure, never by ``depth`` (``tree:18446744073709551615`` is a whole clone).
    """
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
    # The entries of a given tree start at depth 0, beside the commits' root trees.
    level.extend(_unseen_entries(view, given, ids, have, seen=seen, kept=kept))
    d = 0
    while level:
        kept.update(t for t in level if t in ids)
        d += 1
        if d == depth:
            break
        level = _unseen_entries(view, level, ids, have, seen=seen, kept=kept)
    return kept


def _unseen_entries(
    view: View, trees: Iterable[int], ids: BitMap, have: BitMap, *, seen: BitMap, kept: BitMap
) -> list[int]:
    """One level of the breadth-first walk: the subtrees of ``trees`` not met before (the
    next level); their blobs not met before are kept when the fetch sends them."""
    following: list[int] = []
    trees = list(trees)
    view.require_local(trees)  # seed 004, "Machines": one load round per level
    for tree in trees:
        for entry in Tree.parse(view.read_id(tree)).entries:
            if entry.is_gitlink:
                continue
            child = _want_id(view, entry.oid)
            if child in seen or child in have:
                continue
            seen.add(child)
            if entry.is_tree:
                following.append(child)
            elif child in ids:
                kept.add(child)
    return following


def _included_tags(view: View, tags: Iterable[ObjectId], ids: BitMap, have: BitMap) -> BitMap:
    out = BitMap()
    for oid in tags:
        chain: list[int] = []
        current = view.named_id(oid)
        while current is not None and view.kind_of(current) == Kind.TAG:
            chain.append(current)
            current = view.named_id(view.tag_target(current))
        if current is not None and (current in ids or current in out):
            out.update(t for t in chain if t not in have and t not in ids)
    return out


# -- writing ---------------------------------------------------------------------------------


_FLUSH_BYTES = 256 * 1024
"""The writer hands the sink pieces of about this size (side-band frames and RPC
messages). Pieces of 1 MiB were measured (issue 25, docs/serving.md): they cost the
compute less and gitproto more, the two together no less (each piece is copied a few
times on its way, and 1 MiB no longer stays in the caches between the copies)."""
_PIECE_BYTES_MAX = 2 * _FLUSH_BYTES
"""Largest piece handed on whole: :data:`_FLUSH_BYTES` plus an entry or a run
(``_RUN_BYTES_MAX``) fits; a larger one is cut."""
_WINDOW_BYTES = 1024 * 1024
"""Bytes of a layer's data region read at once: runs of entries are sliced from them."""
_NO_ROWS = EntryRows(b"")
"""No slab of records read (a sparse slab is read record by record)."""
_SLAB_RECORDS = 4096
"""Object-table records decoded at once."""


def write_pack(
    view: View,
    plan: PackPlan,
    sink: ChunkSink,
    *,
    progress: ProgressFn | None = None,
    progress_every: int = 1024,
) -> WriteStats:
    """Stream the planned pack to ``sink`` in id order (rules 1-4 of the module docstring),
    every byte it reads local already (a view whose layers are all here, or one whose
    batches :class:`PackMachine` loaded). See :class:`PackWriter`."""
    writer = PackWriter(view, plan, sink, progress=progress, progress_every=progress_every)
    writer.write()
    return writer.finish()


# -- the planner's instructions ----------------------------------------------------------------


class Copy(NamedTuple):
    """Send a stored entry as it is: a full entry (rule 1), a REF_DELTA whose base is in the
    pack when the client did not say ``ofs-delta`` (rule 2), or one whose base the client
    has (rule 3, ``thin``)."""

    data: memoryview
    thin: bool = False


class Rewrite(NamedTuple):
    """Send a stored REF_DELTA as an OFS_DELTA (rule 2): the header rewritten with the
    distance back to entry number ``base`` of the pack (``git.pack.ref_delta_as_ofs``),
    then the zlib bytes after the base oid. ``object_id`` names it in an error."""

    data: memoryview
    base: int
    object_id: int


class Resolved(NamedTuple):
    """Send a delta's object whole (rule 4): ``data`` is its full entry, deflated."""

    data: bytes


class Run(NamedTuple):
    """Send the stored entries of locals ``[start, stop)`` of a single-run layer, all
    planned, as far as they lie back to back and need no resolving (:func:`_write_run`);
    the emitter answers how many it sent (0: none, they come one by one)."""

    reader: LayerReader
    first: int
    rows: EntryRows
    row0: int
    start: int
    stop: int
    externals: dict[int, int | None]


Instruction = Copy | Rewrite | Resolved | Run


class PackPlanner:
    """What each planned entry is sent as, in id order (rules 1-4 of the module docstring),
    as :data:`Instruction` values; no output and no pack offsets (those are the emitter's).

    Seed 004, "Layers": entries are stored as pack entries in id order, so the pack is
    mostly the data regions of the layers, sliced a window at a time; delta bases come
    from the object table's base refs, not oid lookups. Consecutive planned ids of a
    layer whose entries lie back to back (a clone, the kind runs of a filtered one, a
    new layer) become one :class:`Run`. Memory: a data window (``_WINDOW_BYTES``) and a
    slab of records. Resumable at any planned id: see :meth:`instructions`.
    """

    def __init__(self, view: View, plan: PackPlan, intent: Intent = Intent.SCAN) -> None:
        self.view, self.plan, self.intent = view, plan, intent
        self.pages = ScanPages() if intent is Intent.SCAN else None  # for resolved deltas
        self.object_id = plan.ids.min() if len(plan.ids) else -1
        # the current layer, slab and window
        self.layer_end = -1
        self.first = self.n = self.slab = self.w0 = self.w1 = self.run_from = 0
        self.single = self.settled = False
        self.reader: LayerReader | None = None
        self.window = memoryview(b"")
        self.rows = _NO_ROWS
        self.externals: dict[int, int | None] = {}

    def instructions(self, limit_id: int | None = None) -> Generator[Instruction, int | None, None]:
        """The instructions for the planned ids below ``limit_id`` (all when None).

        Each entry's bytes are read before its instruction is yielded, and
        :attr:`object_id` moves past an entry only when the generator is resumed after
        it (the instruction was carried out), so a read that finds bytes missing
        (``NotLocal``) leaves the planner at that entry: loading them and asking again
        goes on from there. The emitter sends back, for a :class:`Run`, how many
        entries it wrote."""
        ids = self.plan.ids
        stop_id = 1 << 62 if limit_id is None else limit_id
        it = ids.iter_equal_or_larger(self.object_id) if self.object_id >= 0 else iter(())
        object_id = self.object_id = next(it, -1)
        while 0 <= object_id < stop_id:
            if object_id >= self.layer_end:
                self._enter_layer(object_id)
            local = object_id - self.first
            if not (self.single and local < self.n and local // _SLAB_RECORDS == self.slab):
                local = self._local(object_id)  # the slow case: another slab, a lookup
            run = (
                self._run(object_id, local, stop_id)
                if self.single and self.rows and local >= self.run_from
                else None
            )
            if run is not None:
                taken = yield run
                if taken:
                    it = ids.iter_equal_or_larger(self.first + local + taken)
                    object_id = self.object_id = next(it, -1)
                    continue
                self.run_from = local + 1  # cut at once (a base to resolve): try after it
            yield self._entry(object_id, local)
            object_id = self.object_id = next(it, -1)

    def _enter_layer(self, object_id: int) -> None:
        self.first, self.layer_end, reader = self.view.layer_of(object_id)
        self.reader, self.n, self.single = reader, reader.object_count, reader.single_id_run
        self.settled = reader.settled()
        self.slab, self.w0, self.w1, self.window, self.externals = -1, 0, 0, memoryview(b""), {}
        self.run_from = 0

    def _local(self, object_id: int) -> int:
        """The entry's local index, its slab of records loaded (the caller takes the common
        case itself: a single-run layer's id in the slab loaded)."""
        reader, n = self.reader, self.n
        assert reader is not None
        rel = object_id - self.first
        local = rel if self.single and rel < n else reader.local_of(rel)
        if local is None or local >= n:
            raise KeyError(f"id {object_id} names no object of the view")
        if local // _SLAB_RECORDS != self.slab:
            start = (local // _SLAB_RECORDS) * _SLAB_RECORDS
            stop = min(n, start + _SLAB_RECORDS)
            # A sparse slab (a shallow or filtered fetch) is read record by record.
            first, ids = self.first, self.plan.ids
            dense = not self.single or ids.range_cardinality(first + start, first + stop) * 4 > (
                stop - start
            )
            self.rows = reader.entry_rows(start, stop) if dense else _NO_ROWS
            self.slab = local // _SLAB_RECORDS
        return local

    def _run(self, object_id: int, local: int, stop_id: int) -> Run | None:
        """A :class:`Run` from ``local`` (of a dense slab of a single-run layer, past
        :attr:`run_from`) when enough planned ids follow it without a gap."""
        ids, first = self.plan.ids, self.first
        end = min(self.n, (self.slab + 1) * _SLAB_RECORDS, stop_id - first)
        if not ids.contains_range(object_id, first + end):
            end = local + _plan_run(ids, object_id, first + end)
        if end - local < _RUN_MIN:
            self.run_from = end + 1  # too few planned ids in a row before a gap
            return None
        assert self.reader is not None
        row0 = self.slab * _SLAB_RECORDS
        return Run(self.reader, first, self.rows, row0, local, end, self.externals)

    def _entry(self, object_id: int, local: int) -> Copy | Rewrite | Resolved:
        """Rules 1-4 for one entry, its bytes read."""
        reader, plan = self.reader, self.plan
        assert reader is not None
        offset, length, base = (
            self.rows[local % _SLAB_RECORDS] if self.rows else reader.entry_row(local)
        )
        w0 = self.w0
        if w0 <= offset and offset + length <= self.w1:  # in the window: the common case
            raw = self.window[offset - w0 : offset - w0 + length]
        else:
            raw = self._read(offset, length)
        if base == REF_NONE:
            return Copy(raw)
        if raw[0] >> 4 & 7 != OBJ_REF_DELTA:
            raise CorruptData(f"id {object_id}: a delta record on a full entry", section=S_DATA)
        base_id = self.externals.get(base, -1)  # the cache of _base_id, read here
        if base_id == -1:
            base_id = _base_id(
                self.view, reader, self.first, plan.ids, base, externals=self.externals
            )

        in_pack = base_id is not None and base_id in plan.ids and base_id < object_id
        if in_pack and plan.ofs_delta:
            assert base_id is not None
            return Rewrite(raw, plan.ids.rank(base_id) - 1, object_id)
        if in_pack or (plan.thin and base_id is not None and base_id in plan.have_ids):
            return Copy(raw, not in_pack)
        return Resolved(self.view.full_entry(object_id, self.intent, self.pages))

    def _read(self, offset: int, length: int) -> memoryview:
        """The stored bytes ``[offset, offset + length)`` that are not in the window: a
        new window from them, no further than the local bytes."""
        reader = self.reader
        assert reader is not None
        span = min(reader.data_end - offset, max(length, _WINDOW_BYTES))
        if not self.settled:  # read no further than what was loaded
            span = max(length, reader.local_bytes(offset, span))
        self.window = memoryview(reader.data_bytes(offset, span, self.intent))
        self.w0, self.w1 = offset, offset + span
        return self.window[:length]


def _base_id(
    view: View,
    reader: LayerReader,
    first: int,
    ids: BitMap,
    base: int,
    *,
    externals: dict[int, int | None] | None = None,
) -> int | None:
    """The view id of the delta base that base ref ``base`` of a layer starting at id
    ``first`` names (seed 004, "Layers": base refs), None when the view lacks it; a
    duplicate's base is the oldest copy's id. ``externals`` caches the external refs."""
    if base & REF_EXTERNAL:
        found = -1 if externals is None else externals.get(base, -1)
        if found == -1:
            found = view.id_of_oid(reader.external_oid(base & ~REF_EXTERNAL))
            if externals is not None:
                externals[base] = found
        return found
    base_id = first + (base if reader.single_id_run else reader.id_of(base))
    if base_id not in ids and first:  # a duplicate: the oldest copy's id
        return view.id_of_oid(reader.ref_oid(base))
    return base_id


# -- the emitter -------------------------------------------------------------------------------


class PackWriter:
    """The pack writer: :class:`PackPlanner`'s instructions carried out, resumable at any
    planned id (seed 004, "Machines": the pack writer is a machine).

    The emitter's part is small: the pack offset of each entry it writes (8 bytes per
    object, for OFS_DELTA distances), the REF_DELTA-to-OFS_DELTA rewrite
    (``git.pack.ref_delta_as_ofs``), the counts, the sink's pieces and ``progress``, which
    receives a ``Writing objects`` event every ``progress_every`` objects and at the
    end. :meth:`write` writes the planned ids below a limit and can be called again
    for the next ones; a read that finds bytes missing (``NotLocal``) leaves the
    planner at that entry, nothing written twice.
    """

    def __init__(
        self,
        view: View,
        plan: PackPlan,
        sink: ChunkSink,
        *,
        progress: ProgressFn | None = None,
        progress_every: int = 1024,
    ) -> None:
        self.view, self.plan, self.progress, self.every = view, plan, progress, progress_every
        self.total = len(plan.ids)
        # seed 004, "Intent steers eviction": streaming a large fetch is a scan (its
        # chunks go cold and do not displace the working set); a small one reads points
        self.intent = Intent.SCAN if self.total >= SCAN_OBJECTS_MIN else Intent.POINT
        self.planner = PackPlanner(view, plan, self.intent)
        self.out = _PackOut(sink)
        self.out.buf += encode_pack_header(self.total)
        self.offsets = array("Q")
        self.copied = self.rewritten = self.thin_kept = self.resolved = self.done = 0

    @property
    def finished(self) -> bool:
        return self.planner.object_id < 0

    def write(self, limit_id: int | None = None) -> None:
        """Write the planned ids below ``limit_id`` (all of them when None)."""
        steps = self.planner.instructions(limit_id)
        emit = self._emit
        try:
            step = next(steps)
            while True:
                step = steps.send(emit(step))
        except StopIteration:
            pass

    def _emit(self, step: Instruction) -> int | None:
        out = self.out
        buf = out.buf
        here = out.flushed + len(buf)
        if type(step) is Copy:
            buf += step.data
            self.copied += 1
            self.thin_kept += step.thin
        elif type(step) is Rewrite:
            hlen = ref_delta_as_ofs(buf, step.data, 0, here - self.offsets[step.base])
            if hlen < 0:
                raise CorruptData(f"id {step.object_id}: bad entry header", section=S_DATA)
            buf += step.data[hlen + OID_BYTES :]
            self.rewritten += 1
        elif type(step) is Resolved:
            buf += step.data
            self.resolved += 1
        else:
            return self._emit_run(cast(Run, step))
        self.offsets.append(here)
        done = self.done + 1
        if len(buf) < _FLUSH_BYTES and (
            self.progress is None or (done % self.every and done != self.total)
        ):
            self.done = done  # the common case of _written(1): no piece, no event
        else:
            self._written(1)
        return None

    def _emit_run(self, run: Run) -> int:
        count = _write_run(
            self.view, self.plan, run.reader, run.first, run.rows, run.row0, run.start,
            run.stop, self.out, self.offsets, run.externals, self.intent,
        )  # fmt: skip
        if count:
            self.copied += count.copied
            self.rewritten += count.rewritten
            self.thin_kept += count.thin_kept
            self._written(count.entries)
        return count.entries

    def _written(self, entries: int) -> None:
        """After ``entries`` more entries: the piece handed on when full, progress."""
        if len(self.out.buf) >= _FLUSH_BYTES:
            self.out.flush()
        before, self.done = self.done, self.done + entries
        if self.progress is not None:
            every, done, total = self.every, self.done, self.total
            for d in range(before // every * every + every, done + 1, every):
                self.progress(ProgressEvent("Writing objects", d, total))
            if done == total and done % every:
                self.progress(ProgressEvent("Writing objects", done, total))

    def finish(self) -> WriteStats:
        """The trailer, once every planned id is written."""
        assert self.finished, "the pack is not all written"
        size = self.out.finish()
        return WriteStats(
            self.total, size, self.copied, self.rewritten, self.thin_kept, self.resolved
        )


class PackMachine:
    """:class:`PackWriter` as a load-ahead machine (seed 004, "Machines" and "Disk budget":
    the pack writer drops its pins once it is past a read-ahead batch).

    The planned ids are cut, in id order, into batches of about ``read_ahead_bytes``
    of entry bytes (:func:`pack_batches`); the first ones are smaller (one chunk, then
    doubling), so the first bytes wait for little. The first run parks batch 0 alone;
    each later run writes every batch whose loads are done, in order, releases its
    pins, and parks up to :data:`_BATCHES_AHEAD` batches past it, so batch k+1 loads
    while batch k is written and the first pack bytes go out as soon as batch 0 is
    local, long before the whole layer is. A batch's ticket carries the chunks of its
    entries and the whole chains of the deltas the writer will resolve. A read that
    still finds bytes missing parks its batch again with what it names (loaded again,
    bounded).
    """

    def __init__(
        self,
        view: View,
        plan: PackPlan,
        sink: ChunkSink,
        *,
        progress: ProgressFn | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.writer = PackWriter(view, plan, sink, progress=progress)
        self._batches = pack_batches(
            view, plan, _ramp(limits.serve_read_ahead_bytes), limits=limits
        )
        self._limit_ids: list[int | None] = []
        self._exhausted = False
        self._next = 0
        self._ready: dict[int, list[LoadPins]] = {}
        self._rounds = 0
        self._rounds_max = limits.read_load_rounds_max
        self.stats: WriteStats | None = None

    def _park(self) -> Ticket | None:
        if self._exhausted:
            return None
        found = next(self._batches, None)
        if found is None:
            self._exhausted = True
            return None
        limit_id, loads = found
        self._limit_ids.append(limit_id)
        return Ticket(len(self._limit_ids) - 1, loads)

    def run(self, ctx: MachineContext) -> Progress:
        try:
            return self._run(ctx)
        except BaseException:
            self.release()
            raise

    def _run(self, ctx: MachineContext) -> Progress:
        for r in ctx.resumed:
            assert isinstance(r.ticket.item, int)
            self._ready.setdefault(r.ticket.item, []).append(r.pins)
        tickets: list[Ticket] = []
        if ctx.run == 0:
            first = self._park()  # alone: the first bytes wait for it only
            tickets.extend(() if first is None else (first,))
        while self._next in self._ready and self._next < len(self._limit_ids):
            k = self._next
            try:
                self.writer.write(self._limit_ids[k])
            except NotLocal as exc:
                self._rounds += 1
                check_limit("read_load_rounds_max", self._rounds, self._rounds_max)
                tickets.append(ticket_of(k, exc))  # batch k's pins stay held
                return Progress(False, tuple(tickets))
            for pins in self._ready.pop(k):
                pins.release()
            self._next += 1
            while len(self._limit_ids) < self._next + _BATCHES_AHEAD:  # read ahead
                ticket = self._park()
                if ticket is None:
                    break
                tickets.append(ticket)
        if self._exhausted and self._next == len(self._limit_ids):
            assert self.writer.finished
            self.stats = self.writer.finish()
            return Progress(True)
        return Progress(False, tuple(tickets))

    def release(self) -> None:
        ready, self._ready = self._ready, {}
        for held in ready.values():
            for pins in held:
                pins.release()


_BATCHES_AHEAD = 2
"""Batches the pack writer keeps loading past the one it writes (all pinned)."""


def _ramp(read_ahead_bytes: int) -> Iterator[int]:
    """Batch sizes: one chunk, one chunk, then doubling up to ``read_ahead_bytes``."""
    size = min(CHUNK_BYTES, read_ahead_bytes)
    yield size
    while True:
        yield size
        size = min(size * 2, max(read_ahead_bytes, size))


def pack_batches(
    view: View, plan: PackPlan, batch_bytes: Iterable[int], *, limits: Limits = DEFAULT_LIMITS
) -> Iterator[tuple[int | None, tuple[EntryLoad, ...]]]:
    """The plan's ids in id order, cut into batches of about the next of ``batch_bytes``
    of entry bytes each: (the first id after the batch, or None for the last; what it
    loads).

    From table records only (always local): the chunks of every planned entry of a
    layer that may lack bytes, and for a delta the writer will resolve (its base is
    neither sent nor, in a thin pack, had) the whole chain across layers. A blobless
    or ``tree:0`` plan names no blob, so no blob chunk is loaded; a settled layer
    (linked, complete, in memory) loads nothing.
    """
    ids, have, thin = plan.ids, plan.have_ids, plan.thin
    sizes = iter(batch_bytes)
    bound = next(sizes)
    chunks: dict[str, set[int]] = {}
    entries: dict[str, set[int]] = {}
    size = 0
    layer_end = -1
    first = n = 0
    single = settled = False
    reader: LayerReader | None = None
    name: str | None = None
    slab = -1
    rows = _NO_ROWS

    def batch() -> tuple[EntryLoad, ...]:
        out = [
            EntryLoad(nm, tuple(sorted(entries.get(nm, ()))), tuple(sorted(chunks.get(nm, ()))))
            for nm in chunks.keys() | entries.keys()
        ]
        chunks.clear()
        entries.clear()
        return tuple(out)

    for object_id in ids:
        if object_id >= layer_end:
            first, layer_end, reader = view.layer_of(object_id)
            n, single, name = reader.object_count, reader.single_id_run, reader.name
            settled = name is None or reader.settled()
            slab = -1
        if settled:
            continue
        assert reader is not None and name is not None
        rel = object_id - first
        local = rel if single and rel < n else reader.local_of(rel)
        if local is None:
            raise KeyError(f"id {object_id} names no object of the view")
        if local // _SLAB_RECORDS != slab:
            slab = local // _SLAB_RECORDS
            rows = reader.entry_rows(slab * _SLAB_RECORDS, min(n, (slab + 1) * _SLAB_RECORDS))
        offset, length, base = rows[local % _SLAB_RECORDS]
        chunks.setdefault(name, set()).update(reader.data_chunks_for(offset, length))
        size += length
        if base != REF_NONE:
            base_id = _base_id(view, reader, first, ids, base)
            if base_id is None or not (
                (base_id in ids and base_id < object_id) or (thin and base_id in have)
            ):
                for r, j in chain_of(reader, local, view.entry_of_oid, limits=limits):
                    if r.name is not None and not r.settled():
                        entries.setdefault(r.name, set()).add(j)
        if size >= bound:
            size = 0
            bound = next(sizes, bound)
            yield object_id + 1, batch()
    yield None, batch()


_RUN_MIN = 8
"""Fewest consecutive planned entries worth the run path of :func:`write_pack`."""
_RUN_BYTES_MAX = 1024 * 1024
"""Bytes of stored entries one run reads at once (a larger entry goes alone)."""


def _plan_run(ids: BitMap, start_id: int, limit_id: int) -> int:
    """How many ids from ``start_id`` (which is in ``ids``) are in ``ids`` without a gap,
    up to ``limit_id``: a bisection over ``contains_range``."""
    lo, hi = 1, limit_id - start_id  # contains_range(start, start + lo) holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ids.contains_range(start_id, start_id + mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class _RunCounts:
    entries: int
    copied: int
    rewritten: int
    thin_kept: int

    def __bool__(self) -> bool:
        return self.entries > 0


_OUTSIDE_KEPT = -1
""":func:`_outside_base`: a base the client has (a thin pack), the delta goes as stored."""
_OUTSIDE_NO = -2
""":func:`_outside_base`: a base the run cannot send; the run stops before its delta."""


def _write_run(  # noqa: PLR0917 (the writer's loop state, passed whole)
    view: View,
    plan: PackPlan,
    reader: LayerReader,
    first: int,
    rows: EntryRows,
    row0: int,
    start: int,
    stop: int,
    out: _PackOut,
    offsets: array[int],
    externals: dict[int, int | None],
    intent: Intent = Intent.SCAN,
) -> _RunCounts:
    """Write the entries of locals ``[start, stop)`` of a single-run layer, all planned,
    as far as they lie back to back and need no resolving, in one compiled call
    (``enroute_native.pack_run``, docs/native.md): the per-entry header rewrite costs
    no interpreter time. :func:`_write_run_reference` is its reference, step for step,
    and writes a run the compiled code does not (an entry it would find corrupt, whose
    error it words).

    A local base below the run is read from ``offsets`` by its rank when every id of
    the layer below the run is planned (a clone); other bases outside the run are
    asked of :func:`_outside_base`, as the reference asks.
    """
    ids = plan.ids
    i = start - row0
    offset, length, base = rows[i]
    if length > _PIECE_BYTES_MAX and base == REF_NONE:
        # A large full entry (a 64 MiB blob): read once and handed on in pieces; the
        # compiled run would return a copy of it (issue 25: the clone's peak RSS).
        offsets.append(out.flushed + len(out.buf))
        out.hand_large(reader.data_bytes(offset, length, intent))
        return _RunCounts(1, 1, 0, 0)
    limit = _run_limit(reader, offset)
    rank0 = ids.rank(first) - 1 if start and ids.contains_range(first, first + start) else -1
    got = write_run(
        rows.raw, i, stop - row0, start, limit, out.flushed + len(out.buf), plan.ofs_delta,
        offsets, rank0,
        lambda base: _outside_base(view, plan, reader, first, base, offsets, externals),
        lambda offset, length: reader.data_bytes(offset, length, intent),
    )  # fmt: skip
    if got is None:
        return _write_run_reference(
            view, plan, reader, first, rows, row0, start, stop, out, offsets, externals, intent
        )
    entries, data, run_offs, copied, rewritten, thin_kept = got
    if entries:
        if len(data) > _PIECE_BYTES_MAX:
            out.hand_large(data)  # one large entry: not joined to the buffer first
        else:
            out.buf += data
        offsets.frombytes(run_offs)
    return _RunCounts(entries, copied, rewritten, thin_kept)


def _run_limit(reader: LayerReader, off0: int) -> int:
    """The stored offset a run from ``off0`` ends by: within ``_RUN_BYTES_MAX`` and no
    further than the bytes that are local (what the batch loaded)."""
    return off0 + reader.local_bytes(off0, min(_RUN_BYTES_MAX, reader.data_end - off0))


def _write_run_reference(  # noqa: PLR0917 (the writer's loop state, passed whole)
    view: View,
    plan: PackPlan,
    reader: LayerReader,
    first: int,
    rows: EntryRows,
    row0: int,
    start: int,
    stop: int,
    out: _PackOut,
    offsets: array[int],
    externals: dict[int, int | None],
    intent: Intent = Intent.SCAN,
) -> _RunCounts:
    """The reference of :func:`_write_run` (the differential tests compare the two), and
    its writer where the compiled code answers None: rules 1-3 of the module docstring,
    decided as :class:`PackPlanner` decides them; the caller writes the rest.

    The run is read with one ``data_bytes`` call; full entries and the zlib streams
    of deltas go out as slices of it, so the per-entry work is the header rewrite.
    A base in the run is found by its position in the run, not by a bitmap rank.
    """
    i, last = start - row0, stop - row0
    off0 = rows[i][0]
    j, end, outside = _run_extent(
        view, plan, reader, first, rows, i, last, start, offsets, externals
    )
    if j - i < 2:
        return _RunCounts(0, 0, 0, 0)
    data = memoryview(reader.data_bytes(off0, end - off0, intent))
    # The bytes: verbatim slices, each REF_DELTA header rewritten or kept.
    buf = out.buf
    run_offs: list[int] = []
    shift = out.flushed + len(buf) - off0  # pack offset minus stored offset, so far
    pending = 0  # start (in data) of bytes not yet copied
    copied = rewritten = thin_kept = 0
    for k in range(i, j):
        off, length, base = rows[k]
        here = off + shift
        run_offs.append(here)
        if base == REF_NONE:
            copied += 1
            continue
        s = off - off0
        if data[s] >> 4 & 7 != OBJ_REF_DELTA:
            raise CorruptData(
                f"id {first + row0 + k}: a delta record on a full entry", section=S_DATA
            )
        base_offset = run_offs[base - start] if k not in outside else outside[k]
        if base_offset == _OUTSIDE_KEPT or not plan.ofs_delta:
            copied += 1
            thin_kept += base_offset == _OUTSIDE_KEPT
            continue
        buf += data[pending:s]
        before = len(buf)
        hlen = ref_delta_as_ofs(buf, data[: s + length], s, here - base_offset)
        if hlen < 0:
            raise CorruptData(f"id {first + row0 + k}: bad entry header", section=S_DATA)
        shift -= hlen + OID_BYTES - (len(buf) - before)  # the header got shorter
        pending = s + hlen + OID_BYTES
        rewritten += 1
    buf += data[pending:]
    offsets.extend(run_offs)
    return _RunCounts(j - i, copied, rewritten, thin_kept)


def _run_extent(  # noqa: PLR0917 (the writer's loop state, passed whole)
    view: View,
    plan: PackPlan,
    reader: LayerReader,
    first: int,
    rows: EntryRows,
    i: int,
    last: int,
    start: int,
    offsets: array[int],
    externals: dict[int, int | None],
) -> tuple[int, int, dict[int, int]]:
    """The extent of :func:`_write_run_reference`'s run from row ``i``: (the row it ends
    before, the stored offset it ends at, row -> what :func:`_outside_base` answered for
    its base). Rows back to back, within the byte bound (the first may pass it), before
    the first delta whose base cannot be sent."""
    off0 = expect = rows[i][0]
    limit = _run_limit(reader, off0)
    outside: dict[int, int] = {}
    j = i
    while j < last:
        off, length, base = rows[j]
        if off != expect or (off + length > limit and j > i):
            break
        if base != REF_NONE and (base & REF_EXTERNAL or base < start):
            # a local base >= start is in the run
            where = _outside_base(view, plan, reader, first, base, offsets, externals)
            if where == _OUTSIDE_NO:
                break
            outside[j] = where
        expect = off + length
        j += 1
    return j, expect, outside


def _outside_base(  # noqa: PLR0917
    view: View,
    plan: PackPlan,
    reader: LayerReader,
    first: int,
    base: int,
    offsets: array[int],
    externals: dict[int, int | None],
) -> int:
    """Where a delta of a run whose base ref ``base`` lies outside the run points: the
    base's pack offset (in the pack, written before it: the delta may become an
    OFS_DELTA), :data:`_OUTSIDE_KEPT` (a base the client has when the pack may be thin:
    the delta goes as stored), or :data:`_OUTSIDE_NO` (anything else: a duplicate's
    base, a base to resolve), which the entry-by-entry path of :class:`PackWriter` takes."""
    ids = plan.ids
    if base & REF_EXTERNAL:
        base_id = externals.get(base, -1)  # the cache of _base_id, read here
        if base_id == -1:
            base_id = _base_id(view, reader, first, ids, base, externals=externals)
        if base_id is None or base_id >= first:
            return _OUTSIDE_NO
    else:
        base_id = first + base
    if base_id in ids:
        return offsets[ids.rank(base_id) - 1]
    return _OUTSIDE_KEPT if plan.thin and base_id in plan.have_ids else _OUTSIDE_NO


class _PackOut:
    """The pack's bytes on their way to the sink: a running SHA-1 for the trailer
    (gitformat-pack), handed on in pieces. The writers flush once :data:`_FLUSH_BYTES`
    are buffered, so a piece is that plus at most one entry or run; a piece of at most
    :data:`_PIECE_BYTES_MAX` goes to the sink as the buffer itself (a new one takes its
    place: no copy of the pack's bytes here), a larger one (an entry of many MiB) in
    pieces of :data:`_FLUSH_BYTES`, so no RPC message outgrows its bound. The sink may
    keep what it is given: nothing writes to a buffer once it is handed on."""

    __slots__ = ("_sha", "_sink", "buf", "flushed")

    def __init__(self, sink: ChunkSink) -> None:
        self._sink = sink
        self._sha = hashlib.sha1()
        self.buf = bytearray()
        self.flushed = 0

    def flush(self, trailer: bool = False) -> None:
        """Hand the buffer on; the writer takes up :attr:`buf` anew after this."""
        data = self.buf
        self.buf = bytearray()
        self._sha.update(data)
        if trailer:
            data += self._sha.digest()
        self.flushed += len(data)
        if len(data) <= _PIECE_BYTES_MAX + (20 if trailer else 0):
            # the bytearray itself: bytes-like, and never written again once handed on
            self._sink(cast(bytes, data))
            return
        step = _FLUSH_BYTES
        view = memoryview(data)
        last = len(data) - (20 if trailer else 0)
        for start in range(0, last, step):
            end = start + step
            self._sink(bytes(view[start : len(data) if end >= last else end]))

    def hand_large(self, data: bytes) -> None:
        """Bytes longer than a piece (a run of one large entry), handed on after the
        buffer in pieces of :data:`_FLUSH_BYTES` without being joined to it first: a
        64 MiB entry was held twice, as the run and in the buffer (issue 25: the clone's
        peak RSS of the ``large`` profile)."""
        if self.buf:
            self.flush()
        view = memoryview(data)
        for start in range(0, len(view), _FLUSH_BYTES):
            piece = bytes(view[start : start + _FLUSH_BYTES])
            self._sha.update(piece)
            self.flushed += len(piece)
            self._sink(piece)

    def finish(self) -> int:
        """The last piece with the trailer after it; the pack's size."""
        self.flush(trailer=True)
        return self.flushed
