"""Ingest: a pushed pack becomes a pushed layer, ready for the state's ``Commit`` command.

Seed 004, "Layers" (pushed layers: kinds grouped commit | tree | blob | tag,
topological order within a kind, a delta's base before the delta, REF_DELTA
only) and "Stable object numbering" (a push refers only to its own objects and
to the snapshot it was ingested against); DESIGN "Layers" (segments).

:func:`ingest_pack` runs these steps, each a function below:

1. Index the pack (:func:`~enroute_core.git.packindexer.index_pack`, a
   compiled pass with the Python indexer as its reference); thin bases come
   from the snapshot. Each commit, tree and tag is checked as git
   fsck checks it (:mod:`enroute_core.git.fsck`, docs/security.md) as it is
   resolved, and the .gitmodules and .gitattributes blobs trees name once all
   are. Commit and tag headers are kept as they go by; tree bodies go into the bounded body cache.
2. Connectivity, from the new ref tips: commits (through parents) and tags
   (through targets, of the type the tag says) that the snapshot lacks are new;
   trees nest at most ``Limits.tree_depth_max`` deep. Every object a new commit
   needs is found by its segment diff (:mod:`enroute_core.engine.segments`), so
   connectivity and segments are one walk, commits oldest first. An object
   neither in the pack nor in the snapshot raises ``MissingObject`` (Git shows
   ``ng <ref> missing necessary objects``). An object the snapshot holds is
   not stored again, and its closure is not walked (the snapshot is closed,
   see :mod:`enroute_core.engine.snapshot`). Every object named (a parent, a
   tag's target, a tree entry by its mode, gitlinks aside) has the type it is
   named as, in the pack or in the snapshot alike (index-pack.c ``check_object``;
   the snapshot tells a type without reading a body); an object named twice as
   two types is visited twice by the segment diff (segments, rule 5) and
   refused. Pack objects no tip reaches are dropped.
3. Storage order: commits parents first; trees and blobs in the order the walk
   first reached them, moved so that a delta's base precedes it; tags targets
   first.
4. Entries: full entries are copied verbatim; an OFS_DELTA becomes a REF_DELTA
   (type 7, same size, the base's oid, the same zlib bytes); a delta whose base
   the snapshot holds stays a REF_DELTA to an external oid; a delta whose base is
   stored later, has another kind, or is not kept at all is re-deflated as a
   full entry. Depth counts the chain inside the layer; a chain ending at an
   external base counts that base as depth 0 (its depth in the snapshot is not
   known here), so such a delta has depth 1.
5. Commit section: each new commit with its tree, parents, committer time and segment.

Memory held (seed 004, "Pages and memory": "a 128 MiB cache per concurrent
ingest"; docs/ingest.md): one cache budget, ``Limits.ingest_body_cache_bytes_max``,
split in eighths: 3 for the indexer's delta bases (``pack_base_cache_bytes_max``
is capped to it), 5 for the body cache less the tree fsck memo (1/64). Beside
it, about 1 KiB per pack object (the indexer's per-entry words, a dict entry
per pack oid, one order slot and context per stored object, the segments, the
layer writer's table) and the headers of the pack's commits and tags. Bodies
are never all held: a body needed again is rebuilt from the pack or
read from the snapshot. Nothing holds the pack or the layer: ``source`` may be
a file (a push's spool) and ``sink`` a file (the push's layer builder). A full
blob over ``Limits.pack_stream_threshold_bytes`` is never held at all: the
indexer hashes it as it inflates and step 4 copies its pack entry in pieces
(:func:`_copy_entry`); a delta on a large base, or a large delta, is still
resolved whole (docs/ingest.md, "Delta bombs and large objects").

Segments are found as :func:`~enroute_core.engine.segments.commit_segment`
finds them (same members, same order; a test compares the two), by compiled
code over raw tree bodies (``enroute_native.segment_diff``, docs/native.md): a
push pays no Python object per tree entry, only one per member.
"""

from __future__ import annotations

import re
from array import array
from binascii import unhexlify
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import filterfalse
from typing import NamedTuple

from enroute_native.entry_plan import bases_first, plan_run
from enroute_native.pack_entry import as_ref_delta
from enroute_native.segment_diff import segment
from enroute_native.tree_fsck import clean as tree_clean

from enroute_core.base.errors import (
    InvalidArgument,
    InvalidObject,
    InvalidPack,
    LimitExceeded,
    MissingObject,
)
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.engine.bodies import BodyCache, ObjectBodies, SpillFile
from enroute_core.engine.segments import Visit
from enroute_core.engine.snapshot import SnapshotObjects
from enroute_core.git.commit import Commit, commit_date
from enroute_core.git.fsck import (
    RECEIVE_POLICY,
    USUAL_IDENT_DATE,
    USUAL_IDENT_NAME_EMAIL,
    USUAL_IDENT_ZONE,
    FsckPolicy,
    FsckWarning,
    FsckWarnings,
    SpecialBlob,
    TreeCheckMemo,
    check_object,
    check_special_blob,
    check_tree,
    gitmodules_parse_bytes,
)
from enroute_core.git.growing import GrowingSource
from enroute_core.git.object_type import ObjectType
from enroute_core.git.pack import (
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    encode_entry_header,
    read_exactly,
    read_pack_header,
)
from enroute_core.git.packindexer import PackIndexResult, PackObjects, index_pack
from enroute_core.git.source import ByteSource, BytesSource
from enroute_core.git.tag import Tag
from enroute_core.git.tree import Tree, TreeEntry
from enroute_core.git.zstream import deflate
from enroute_core.state.commands import NewLayer
from enroute_core.state.model import LayerKind as ManifestKind
from enroute_core.storage.heap import trim_free_heap
from enroute_core.storage.layer import CommitInfo, EntryRun, Kind, LayerWriter, SealedLayer

_I64_MAX = (1 << 63) - 1

KIND_OF_TYPE = {
    ObjectType.COMMIT: Kind.COMMIT,
    ObjectType.TREE: Kind.TREE,
    ObjectType.BLOB: Kind.BLOB,
    ObjectType.TAG: Kind.TAG,
}

# The steps ``progress`` names, as a push's client shows them (``remote: <stage>: ...``).
INDEXING = "Indexing objects"
CONNECTIVITY = "Checking connectivity"
WRITING = "Writing layer"

_KIND_OF_TYPE_NUM: dict[int, Kind] = {int(t): k for t, k in KIND_OF_TYPE.items()}
_UNSEEN, _NEW, _HELD = 0, 1, 2  # a pack object's class in the walk (_Walk.marks)
_COMMIT, _TREE, _BLOB, _TAG = (
    int(t) for t in (ObjectType.COMMIT, ObjectType.TREE, ObjectType.BLOB, ObjectType.TAG)
)

LayerSink = Callable[[bytes], object]
ProgressFn = Callable[[str, int, int | None, bool], object]
"""``(stage, done, total, final)``: how far a step is, for side-band channel 2 (a push's
``remote:`` lines). Called every :data:`PROGRESS_EVERY` objects and once at each step's
end, from the ingest's thread; the caller throttles and formats."""
PROGRESS_EVERY = 1024
_PROGRESS_MASK = PROGRESS_EVERY - 1

# The free heap given back (_give_back) every this many commits walked and runs written:
# those steps free what they read as they go (trees read back, each run's entries) in
# pieces under the heap's mmap threshold, among what they keep (segments, the writer's
# columns), and glibc kept the holes. On the large profile the writing step grew 142 MiB
# for 64 MiB of columns and peaked 66 MiB lower with this. A trim took about 2 ms in one
# process; in the compute, the trims and the pages faulted in again after them cost about
# 0.3 s of a large push's 24 s of CPU, for a peak 15 MiB lower (interleaved, six pushes).
_TRIM_COMMITS = 4096
_TRIM_RUNS = 16

# Seed 004, "Pages and memory": one cache per concurrent ingest
# (``Limits.ingest_body_cache_bytes_max``, 128 MiB), shared in eighths by the
# indexer's delta bases and the body cache (tree bodies for the segment diff among them).
_CACHE_SHARES = 8
_RUN_BYTES = 1 << 20  # pack entries planned and handed to the layer writer at once
_BASE_SHARE = 3
_BODY_SHARE = 5
# Out of the body share: the fsck memo of tree names and modes (fsck.TreeCheckMemo).
_MEMO_DIVISOR = 64


def _memo_bytes(limits: Limits) -> int:
    return limits.ingest_body_cache_bytes_max // _MEMO_DIVISOR


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What a push adds; the caller adds the ref updates and proposes the ``Commit``.

    ``data`` is the whole layer file when no sink was given; otherwise the sink
    got it (a push writes it to a scratch file, docs/ingest.md). ``sealed`` is
    None when the push adds no object (every object was in the snapshot): the
    commit then carries ref updates only.
    """

    data: bytes | None
    sealed: SealedLayer | None
    object_count: int
    new_commits: tuple[ObjectId, ...]
    """Stored commits, parents first."""
    external_oids: tuple[ObjectId, ...]
    """Oids the layer names but does not store, sorted (the layer's external oid table)."""
    thin_bases: tuple[ObjectId, ...]
    """Delta bases the pack left out, read from the snapshot."""
    deduplicated: int
    """Pack objects not stored because the snapshot holds them."""
    dropped: int
    """Pack objects no new ref tip reaches, not stored."""
    compiled_index: bool = True
    """Whether the compiled pass indexed the pack (:attr:`PackIndexResult.compiled`)."""
    warnings: tuple[FsckWarning, ...] = ()
    """What the checks let in with a warning (harmless classes, docs/security.md): per
    message id, how many objects of the pack and the first of them, sorted by id."""
    spilled_bytes: int = 0
    """Bytes of trees the body cache dropped to the ``spill`` file (removed since)."""

    def new_layer(
        self, *, inline: bool, upload_gen: int = 0, data: bytes | None = None
    ) -> NewLayer | None:
        """The ``new_layer`` of the state's ``Commit`` command (None when nothing is new).

        ``data`` gives an inline layer's bytes when a sink took them.
        """
        sealed = self.sealed
        if sealed is None:
            return None
        if data is None:
            data = self.data
        if inline and (data is None or len(data) != sealed.file_size):
            raise InvalidArgument("an inline layer needs its bytes; ingest without a sink")
        return NewLayer(
            kind=ManifestKind.INLINE if inline else ManifestKind.STORED,
            object_count=sealed.object_count,
            file_size=sealed.file_size,
            meta_size=sealed.meta_size,
            root=sealed.root,
            upload_gen=0 if inline else upload_gen,
            data=(data or b"") if inline else b"",
        )


class _CommitHead(NamedTuple):
    """A commit's tree, parents and time (a named tuple: made once per pushed commit, where a
    frozen dataclass's ``__init__`` cost a third of reading a clean commit's header)."""

    tree: ObjectId
    parents: tuple[ObjectId, ...]
    time: int


class _Headers:
    """Step 1's by-product: commit and tag headers of the pack, tree bodies into the cache."""

    __slots__ = (
        "_entries_max",
        "_name_max",
        "cache",
        "commits",
        "fsck",
        "limits",
        "memo",
        "progress",
        "resolved",
        "special",
        "tag_types",
        "tags",
        "total",
        "warnings",
    )

    def __init__(
        self,
        cache: BodyCache,
        limits: Limits,
        fsck: FsckPolicy | None,
        progress: ProgressFn | None = None,
        total: int = 0,
    ) -> None:
        self.cache = cache
        self.progress = progress
        self.resolved = 0  # objects seen (again, when the reference reruns the pass)
        self.total = total
        self.limits = limits
        self._entries_max = limits.tree_entries_max
        self._name_max = limits.tree_entry_name_bytes_max
        self.fsck = fsck
        self.memo = TreeCheckMemo(_memo_bytes(limits))
        self.warnings = FsckWarnings()  # noted only for an object with a problem
        self.commits: dict[ObjectId, _CommitHead] = {}
        self.tags: dict[ObjectId, ObjectId] = {}
        self.tag_types: dict[ObjectId, ObjectType] = {}  # the type each tag says it names
        # what trees name .gitmodules or .gitattributes, in order
        self.special: dict[tuple[SpecialBlob, ObjectId], None] = {}

    def on_object(self, index: int, oid: ObjectId, type_num: int, body: bytes | None) -> None:
        """Called by the indexer once per object (24,268 times on the benchmark push):
        plain ints, the usual tree first. Progress costs a count and a mask test here.
        ``body`` is None only for a blob streamed past ``pack_stream_threshold_bytes``;
        no blob body is read here."""
        resolved = self.resolved = self.resolved + 1
        if not resolved & _PROGRESS_MASK and self.progress is not None:
            self.progress(INDEXING, min(resolved, self.total), self.total, False)
        if type_num == _TREE:  # the usual object: 17,412 of the 24,268
            assert body is not None  # only blobs are streamed
            fsck = self.fsck
            # A tree the compiled check calls clean has no problem and names no special
            # blob: check_tree answers [] for it after the same call, which is skipped.
            if fsck is not None and not tree_clean(body, self._entries_max, self._name_max):
                found = check_tree(
                    oid, body, policy=fsck, limits=self.limits, memo=self.memo,
                    warnings=self.warnings,
                )  # fmt: skip
                for named in found:
                    self.special[named] = None
            self.cache.put(oid, ObjectType.TREE, body)
            return
        if type_num == _BLOB:
            return
        assert body is not None  # only blobs are streamed
        if type_num == _COMMIT:
            self._commit(oid, body)
        else:
            if self.fsck is not None:
                check_object(
                    oid,
                    type_num,
                    body,
                    policy=self.fsck,
                    limits=self.limits,
                    warnings=self.warnings,
                )
            if type_num == _TAG and oid not in self.tags:
                tag = Tag.parse(body, limits=self.limits)
                self.tags[oid] = tag.object
                self.tag_types[oid] = tag.object_type

    def _commit(self, oid: ObjectId, body: bytes) -> None:
        """fsck's checks and the header, in one read for a clean commit (:func:`_clean_head`)."""
        head = _clean_head(body, self.limits)
        if head is None:
            if self.fsck is not None:
                check_object(
                    oid,
                    ObjectType.COMMIT,
                    body,
                    policy=self.fsck,
                    limits=self.limits,
                    warnings=self.warnings,
                )
            if oid in self.commits:
                return
            head = _commit_head(body, self.limits)
        self.commits.setdefault(oid, head)


# The header lines git writes, in its order: the tree, the parents, one author and a
# committer with a date of at most 18 digits; the committer's time is group 3.
_TREE_AND_PARENTS = rb"tree ([0-9a-f]{40})\n((?:parent [0-9a-f]{40}\n)*)"
_USUAL_COMMIT_HEAD = re.compile(
    _TREE_AND_PARENTS + rb"author [^\n]*\n"
    rb"committer [^<>\n]* <[^<>\n]*> (" + USUAL_IDENT_DATE + b")" + USUAL_IDENT_ZONE + b"\n"
)
# The same, for a commit fsck finds nothing in (fsck.fsck_commit): both identities in the
# form fsck_ident accepts at once (fsck's own pattern), the committer's time group 3; with
# no NUL anywhere and the header ended (a blank line, or a final LF: fsck's
# verify_headers), both checked apart.
_CLEAN_COMMIT_HEAD = re.compile(
    _TREE_AND_PARENTS
    + b"author " + USUAL_IDENT_NAME_EMAIL + b"(?:" + USUAL_IDENT_DATE + b")" + USUAL_IDENT_ZONE
    + b"\ncommitter " + USUAL_IDENT_NAME_EMAIL + b"(" + USUAL_IDENT_DATE + b")" + USUAL_IDENT_ZONE
    + b"\n"
)  # fmt: skip
_PARENT_LINE_BYTES = 48  # "parent " + 40 hex digits + LF


def _clean_head(body: bytes, limits: Limits) -> _CommitHead | None:
    """The header of a commit git's fsck finds nothing in, or None (the checks decide)."""
    clean = _CLEAN_COMMIT_HEAD.match(body)
    if clean is None or b"\0" in body or not (b"\n\n" in body or body.endswith(b"\n")):
        return None
    return _head_of(clean, limits)


def _head_of(usual: re.Match[bytes], limits: Limits) -> _CommitHead | None:
    """Tree, parents and time from a usual header's match; None past ``commit_parents_max``."""
    tree_hex, lines, time = usual.groups()
    if len(lines) // _PARENT_LINE_BYTES > limits.commit_parents_max:
        return None
    # The pattern took lowercase hex digits only, which is all unhexlify reads as git does.
    parents = [unhexlify(lines[i + 7 : i + 47]) for i in range(0, len(lines), _PARENT_LINE_BYTES)]
    return _CommitHead(unhexlify(tree_hex), tuple(parents), int(time))  # type: ignore[arg-type]


def _commit_head(body: bytes, limits: Limits) -> _CommitHead:
    """Tree, parents (as ``Commit.parse`` reads them) and the commit time (as git's
    ``parse_commit_date`` reads it: :func:`~enroute_core.git.commit.commit_date`).

    A commit headed as git writes it is read with one regular expression (the
    whole parse cost 60 us a commit); any other goes through ``Commit.parse``:
    one with an identity quirk an old tool wrote (``--700`` for a zone, no
    email) still has the time git gives it.
    """
    usual = _USUAL_COMMIT_HEAD.match(body)
    if usual is not None:
        head = _head_of(usual, limits)
        if head is not None:
            return head
    commit = Commit.parse(body, limits=limits)
    stamp = commit_date(body, len(commit.parents))
    return _CommitHead(commit.tree, commit.parents, min(stamp, _I64_MAX))


def ingest_pack(
    source: ByteSource,
    tips: Sequence[ObjectId],
    snapshot: SnapshotObjects,
    *,
    limits: Limits = DEFAULT_LIMITS,
    sink: LayerSink | None = None,
    fsck: FsckPolicy | None = RECEIVE_POLICY,
    refs: Sequence[tuple[bytes, ObjectId]] = (),
    progress: ProgressFn | None = None,
    spill: Callable[[], SpillFile] | None = None,
) -> IngestResult:
    """Turn the pack in ``source`` into a pushed layer against ``snapshot``.

    ``tips`` are the new values of the pushed refs (deletions left out). Raises
    ``MissingObject`` when a tip needs an object neither side has, and the
    typed errors of the pack and object parsers on bad input. Every commit,
    tree and tag of the pack is checked with the policy ``fsck``
    (:mod:`enroute_core.git.fsck`, docs/security.md) as it is resolved: a refused
    problem raises ``InvalidObject``, a harmless one is counted in
    :attr:`IngestResult.warnings`; ``fsck=None`` skips the checks.
    ``refs`` (ref name, new value) lets a branch be refused unless it names a commit.
    ``progress`` hears how far the steps are (:data:`ProgressFn`): :data:`INDEXING`
    (objects), :data:`CONNECTIVITY` (new commits) and :data:`WRITING` (stored objects).
    ``spill`` makes the file trees dropped from the body cache go to, so that the
    segment diff reads them back instead of rebuilding them along their delta chains
    (:class:`~enroute_core.engine.bodies.BodyCache`); it is removed before this returns.
    """
    count = _check_pack_bounds(source, limits)
    share = limits.ingest_body_cache_bytes_max // _CACHE_SHARES
    cache = BodyCache(share * _BODY_SHARE - _memo_bytes(limits), spill)
    try:
        result = _ingest(
            source, tips, snapshot, cache=cache, count=count, share=share, limits=limits,
            sink=sink, fsck=fsck, refs=refs, progress=progress,
        )  # fmt: skip
        return replace(result, spilled_bytes=cache.spilled_bytes) if cache.spilled_bytes else result
    finally:
        cache.close()
        # What the writer's tables and the steps held is free now: kept by glibc, it would
        # stay in the compute's resident set and count in the next request's peak (a
        # blobless clone after the large push measured 290 MiB of it, docs/ingest.md).
        _give_back()


def _ingest(
    source: ByteSource,
    tips: Sequence[ObjectId],
    snapshot: SnapshotObjects,
    *,
    cache: BodyCache,
    count: int,
    share: int,
    limits: Limits,
    sink: LayerSink | None,
    fsck: FsckPolicy | None,
    refs: Sequence[tuple[bytes, ObjectId]],
    progress: ProgressFn | None,
) -> IngestResult:
    """:func:`ingest_pack`'s steps, with the body cache it made."""
    headers = _Headers(cache, limits, fsck, progress, count)
    indexed = _index(source, snapshot, headers, limits)
    if progress is not None:
        progress(INDEXING, count, count, True)
    source = _held(source, share * _BASE_SHARE)
    _give_back()  # the indexer's bases and bodies
    by_oid, keys = _first_copies(indexed.objects)
    cache.index_spills(by_oid.get, len(keys))
    if fsck is not None and len(by_oid) < len(indexed.objects):
        _refuse_duplicate(indexed.objects)
    bodies = ObjectBodies(source, indexed.objects, by_oid, snapshot, limits=limits, cache=cache)
    if fsck is not None:
        _check_special_blobs(
            headers.special,
            indexed.objects,
            by_oid,
            bodies,
            snapshot=snapshot,
            policy=fsck,
            limits=limits,
            warnings=headers.warnings,
        )
    walk = _Walk(
        indexed.objects, by_oid, keys=keys, snapshot=snapshot, bodies=bodies,
        headers=headers, limits=limits,
    )  # fmt: skip
    walk.discover(tips)
    _check_ref_types(refs, walk)
    commits = walk.commit_order()
    infos = _segments(walk, commits, progress)
    headers.commits.clear()  # the infos hold what the layer needs of them
    _give_back()
    walk.walk_loose_roots()
    order = _storage_order(walk, indexed.objects, by_oid)
    dedup, dropped = _unstored(by_oid, walk)
    stored = len(walk.placed)
    sealed, externals, data = _write_layer(
        order, walk, infos, source=source, indexed=indexed, by_oid=by_oid, bodies=bodies,
        cache=cache, limits=limits, sink=sink,
    )  # fmt: skip
    if progress is not None:
        progress(WRITING, len(order), len(order), True)
    return IngestResult(
        data=data,
        sealed=sealed,
        object_count=stored,
        new_commits=tuple(commits),
        external_oids=tuple(sorted(externals)),
        thin_bases=indexed.external_bases,
        deduplicated=dedup,
        dropped=dropped,
        compiled_index=indexed.compiled,
        warnings=headers.warnings.summary(),
    )


def _write_layer(
    order: list[ObjectId],
    walk: _Walk,
    infos: Sequence[CommitInfo],
    *,
    source: ByteSource,
    indexed: PackIndexResult,
    by_oid: dict[ObjectId, int],
    bodies: ObjectBodies,
    cache: BodyCache,
    limits: Limits,
    sink: LayerSink | None,
) -> tuple[SealedLayer | None, set[ObjectId], bytes | None]:
    """Steps 4 and 5: (the sealed layer, its external oids, its bytes when no sink took them).

    What only step 4 reads (the walk's dicts, the oid index, the body cache) is let go
    before the writer's ``finish``, which builds its tables beside its own per-object
    columns: on the large profile that step is the push's peak (docs/ingest.md, "Memory").
    """
    if not order:
        return None, set(), None
    # The trees the segment diff read are not read again, and a tree step 4 stores whole
    # it reads once; what it rebuilds (a delta stored whole) needs far less than the walk.
    cache.shrink(limits.ingest_body_cache_bytes_max // _CACHE_SHARES, read_backs=False)
    walk.walked()
    _give_back()
    parts: list[bytes] = []
    writer = LayerWriter(sink if sink is not None else parts.append, limits=limits)
    externals = _write_entries(
        writer, order, walk, source=source, indexed=indexed, by_oid=by_oid, bodies=bodies,
        limits=limits,
    )  # fmt: skip
    externals |= _commit_externals(infos, walk.placed)
    walk.release()
    by_oid.clear()
    cache.close()
    # What the walk's dicts, the oid index and the cache held is free: given back before
    # finish builds its tables, or they came on top of it (the large profile's finish
    # peaked 39 MiB higher, the push's highest step).
    _give_back()
    for info in infos:
        writer.add_commit(info)
    sealed = writer.finish()
    return sealed, externals, b"".join(parts) if sink is None else None


def _give_back() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``;
    nothing elsewhere) where a step has freed what the next does not reuse: what the
    indexer, the commit headers and the walk's trees held is in pieces under the
    compute's mmap threshold (``heap_mmap_threshold_bytes``), which glibc keeps
    otherwise, so it would count twice in the push's peak (docs/ingest.md, "Memory")."""
    trim_free_heap()


# -- step 1: index ---------------------------------------------------------------------------


def _check_pack_bounds(source: ByteSource, limits: Limits) -> int:
    """The pack's object count, once the pack and the count are within their bounds.

    A pack still arriving (:class:`GrowingSource`) has no size yet: the receive loop
    that spools it holds it to ``ingest_pack_bytes_max`` and cuts it over the bound."""
    if not isinstance(source, GrowingSource):
        check_limit("ingest_pack_bytes_max", source.size, limits.ingest_pack_bytes_max)
    header = read_pack_header(source, limits)
    check_limit("ingest_objects_max", header.count, limits.ingest_objects_max)
    return header.count


def _segments(
    walk: _Walk, commits: Sequence[ObjectId], progress: ProgressFn | None
) -> list[CommitInfo]:
    """Step 2's walk, commit by commit, with its progress every PROGRESS_EVERY commits and
    the free heap given back every ``_TRIM_COMMITS``."""
    infos: list[CommitInfo] = []
    total = len(commits)
    for done, commit in enumerate(commits, 1):
        infos.append(walk.segment(commit))
        if not done & _PROGRESS_MASK and progress is not None:
            progress(CONNECTIVITY, done, total, False)
        if not done % _TRIM_COMMITS:
            _give_back()
    if progress is not None:
        progress(CONNECTIVITY, total, total, True)
    return infos


def _index(
    source: ByteSource, snapshot: SnapshotObjects, headers: _Headers, limits: Limits
) -> PackIndexResult:
    def external_base(oid: ObjectId) -> tuple[int, bytes] | None:
        found = snapshot.read(oid)
        return None if found is None else (int(found[0]), found[1])

    base_cache_max = limits.ingest_body_cache_bytes_max // _CACHE_SHARES * _BASE_SHARE
    if limits.pack_base_cache_bytes_max > base_cache_max:
        limits = replace(limits, pack_base_cache_bytes_max=base_cache_max)
    # Delta results a pack declares for free stay within the ingest's memory budget.
    if limits.pack_delta_expansion_free_bytes > limits.ingest_body_cache_bytes_max:
        budget = limits.ingest_body_cache_bytes_max
        limits = replace(limits, pack_delta_expansion_free_bytes=budget)
    return index_pack(
        source, limits=limits, external_base=external_base, on_object=headers.on_object
    )


def _held(source: ByteSource, share: int) -> ByteSource:
    """The pack in memory for the later steps when it fits the indexer's share, now free.

    Those steps read entries in storage order, not pack order, one read each
    (docs/ingest.md, "Speed"); from memory that is a slice, not a ``pread``.
    A larger pack stays where it is, so memory still does not grow with it.
    """
    if isinstance(source, BytesSource) or source.size > share:
        return source
    return BytesSource(source.read_at(0, source.size))


def _check_special_blobs(
    named: Iterable[tuple[SpecialBlob, ObjectId]],
    objects: PackObjects,
    by_oid: dict[ObjectId, int],
    bodies: ObjectBodies,
    *,
    snapshot: SnapshotObjects,
    policy: FsckPolicy,
    limits: Limits,
    warnings: FsckWarnings | None = None,
) -> None:
    """Every blob a tree of the pack names .gitmodules or .gitattributes, wherever it is
    stored (fsck.c
    ``fsck_finish`` reads each from the object database, the pack's or the repository's).

    A blob the repository already holds may have arrived under another name, unchecked
    (push ``notes.txt``, then a tree naming the same blob ``.gitmodules``): it is checked
    here like one the pack brings, its type and size told by the snapshot before its body
    is read. One that neither holds is missing, as index-pack's ``check_objects`` dies on
    a tree entry naming an object it did not receive.

    The .gitmodules blobs parsed are added up first, bounded by
    ``ingest_gitmodules_bytes_max`` (:func:`~enroute_core.git.fsck.gitmodules_parse_bytes`).
    """
    parsed = 0
    for kind, oid in named:
        index = by_oid.get(oid)
        if index is not None:
            type_num, size = objects.types[index], objects.object_sizes[index]
        else:
            held = snapshot.type_of(oid)
            if held is None:
                raise _missing(oid, None)
            type_num, found_size = int(held), snapshot.size_of(oid)
            assert found_size is not None, oid_to_hex(oid)  # the snapshot holds it
            size = found_size
        parsed += gitmodules_parse_bytes(kind, type_num, size, parsed, limits)

        def read(oid: ObjectId = oid) -> bytes:
            found = bodies.get(oid)
            assert found is not None, oid_to_hex(oid)  # the pack or the snapshot holds it
            return found[1]

        check_special_blob(
            kind, oid, type_num, read, size, policy=policy, limits=limits, warnings=warnings
        )


def _refuse_duplicate(objects: PackObjects) -> None:
    """``index-pack --strict`` (what ``receive.fsckObjects`` runs) refuses an object
    the pack holds twice (pack-write.c, ``WRITE_IDX_STRICT``), with git's words."""
    seen: set[ObjectId] = set()
    for oid in objects.oid_list():
        if oid in seen:
            raise InvalidPack(
                f"the same object {oid_to_hex(oid)} appears twice in the pack",
                oid=oid_to_hex(oid),
            )
        seen.add(oid)


def _first_copies(objects: PackObjects) -> tuple[dict[ObjectId, int], list[ObjectId]]:
    """Pack index of each oid's first copy (git without ``--strict`` allows an object
    twice in a pack; ``:func:`ingest_pack` refuses it unless ``fsck`` is None), and the
    oids by pack index: ``keys[by_oid[oid]]`` is the dict's own key object."""
    oids = objects.oid_list()
    by_oid = dict(zip(oids, range(len(oids)), strict=True))
    if len(by_oid) == len(oids):
        return by_oid, oids
    by_oid = {}
    for i, oid in enumerate(oids):
        by_oid.setdefault(oid, i)
    return by_oid, oids


# -- step 2: connectivity, segments and the order objects are first reached -----------------


class _Walk:
    """Which objects are new, in the order first reached, and through what."""

    def __init__(
        self,
        objects: PackObjects,
        by_oid: dict[ObjectId, int],
        *,
        keys: Sequence[ObjectId],
        snapshot: SnapshotObjects,
        bodies: ObjectBodies,
        headers: _Headers,
        limits: Limits,
    ) -> None:
        self.objects = objects
        self.by_oid = by_oid
        self.keys = keys  # by_oid's own oid objects by pack index: the walk keeps these
        self.snapshot = snapshot
        self.bodies = bodies
        self.headers = headers
        self.limits = limits
        # Each pack object's class by pack index (_UNSEEN, _NEW, or _HELD: the snapshot holds
        # it too): a byte each, where a dict by oid was ~40 bytes an object at the walk's
        # peak. An object outside the pack is classified by ``held`` alone.
        self.marks = bytearray(len(keys))
        self.held: dict[ObjectId, int] = {}  # type numbers of the snapshot's objects named
        self.placed: dict[ObjectId, Kind] = {}
        self.order: tuple[list[ObjectId], ...] = ([], [], [], [])
        self.context: dict[ObjectId, ObjectId] = {}
        self.commits: list[ObjectId] = []  # new commits, in discovery order
        self.tags: list[ObjectId] = []
        self.loose: list[tuple[ObjectId, ObjectId | None]] = []  # new trees/blobs named by refs
        self.members = 0
        self._snapshot_trees: dict[ObjectId, ObjectId] = {}
        self._tree_body = bodies.tree_reader()
        self._visit = self._visitor()

    def walked(self) -> None:
        """Let go of what only the walk reads (the classification of new objects, the
        order by kind) once the storage order is made: writing reads ``placed``,
        ``context`` and ``held``."""
        self.marks.clear()  # in place: the visitor holds it too
        for listed in self.order:
            listed.clear()

    def release(self) -> None:
        """Let go of the walk's per-object dicts once the entries are written."""
        self.walked()
        for held in (self.held, self.placed, self.context):
            held.clear()

    # classification

    def is_new(self, oid: ObjectId, needed_by: ObjectId | None) -> bool:
        """True for a pack object the snapshot lacks; False for one the snapshot holds
        (its type noted, told by the snapshot without reading its body)."""
        index = self.by_oid.get(oid)
        if index is not None:
            mark = self.marks[index]
            if mark:
                return mark == _NEW
        elif oid in self.held:
            return False
        held = self.snapshot.type_of(oid)
        if held is not None:
            self.held[oid] = int(held)
        elif index is None:
            raise _missing(oid, needed_by)
        if index is not None:
            self.marks[index] = _HELD if held is not None else _NEW
        return held is None

    def _classified_new(self, oid: ObjectId) -> bool:
        """What :meth:`is_new` answered for ``oid``, which it has classified."""
        index = self.by_oid.get(oid)
        return index is not None and self.marks[index] == _NEW

    def type_of(self, oid: ObjectId) -> ObjectType:
        """The type of an object :meth:`is_new` has classified: the snapshot's or the pack's."""
        held = self.held.get(oid)
        return ObjectType(held if held is not None else self.objects.types[self.by_oid[oid]])

    def place(self, oid: ObjectId, context: ObjectId | None) -> None:
        if oid in self.placed:
            return
        placed = len(self.placed) + 1
        if placed > self.limits.ingest_objects_max:
            check_limit("ingest_objects_max", placed, self.limits.ingest_objects_max)
        kind = _KIND_OF_TYPE_NUM[self.objects.types[self.by_oid[oid]]]
        self.placed[oid] = kind
        self.order[kind].append(oid)
        if context is not None:
            self.context[oid] = context

    def _expect(self, oid: ObjectId, want: ObjectType, needed_by: ObjectId | None) -> None:
        """An object named as ``want`` is one, in the pack or in the snapshot alike
        (index-pack.c ``check_object``: "expected type %s, found %s")."""
        got = self.type_of(oid)
        if got != want:
            raise InvalidObject(
                f"object {oid_to_hex(oid)} is a {got.name.lower()}, expected a {want.name.lower()}",
                oid=oid_to_hex(oid),
                needed_by=oid_to_hex(needed_by) if needed_by is not None else None,
            )

    # discovery of new commits and tags from the tips

    def discover(self, tips: Iterable[ObjectId]) -> None:
        """Commits through parents and tags through targets, stopping at the snapshot."""
        seen: set[ObjectId] = set()
        stack: list[tuple[ObjectId, ObjectId | None, ObjectType | None]] = [
            (t, None, None) for t in reversed(list(tips))
        ]
        while stack:
            oid, via, want = stack.pop()
            if oid in seen:
                continue
            seen.add(oid)
            new = self.is_new(oid, via)
            if want is not None:
                self._expect(oid, want, via)
            if not new:
                continue
            type_ = self.type_of(oid)
            if via is not None:
                self.context[oid] = via
            if type_ == ObjectType.COMMIT:
                self.commits.append(oid)
                parents = self.headers.commits[oid].parents
                stack.extend((p, oid, ObjectType.COMMIT) for p in reversed(parents))
            elif type_ == ObjectType.TAG:
                self.tags.append(oid)
                stack.append((self.headers.tags[oid], oid, self.headers.tag_types[oid]))
            else:
                self.loose.append((oid, via))

    def commit_order(self) -> list[ObjectId]:
        """New commits parents first (a post-order walk, in discovery order)."""
        heads = self.headers.commits
        new = self._classified_new
        return _postorder(self.commits, lambda c: [p for p in heads[c].parents if new(p)])

    # segments

    def segment(self, commit: ObjectId) -> CommitInfo:
        head = self.headers.commits[commit]
        self.place(commit, self.context.get(commit))
        parent_trees = [self._tree_of(p) for p in head.parents]
        members = _segment(
            commit, head.tree, parent_trees, self._tree_body, self._visit, limits=self.limits
        )
        self.members += len(members)
        members_max = self.limits.ingest_segment_members_max
        check_limit("ingest_segment_members_max", self.members, members_max)
        # by_oid's own objects, not the diff's copies: at C speed while every member is the
        # pack's (an initial push's are), one by one once one is the snapshot's
        by_oid, keys = self.by_oid, self.keys
        try:
            kept = tuple(map(keys.__getitem__, map(by_oid.__getitem__, members)))
        except KeyError:
            get = by_oid.get
            kept = tuple(m if (i := get(m)) is None else keys[i] for m in members)
        return CommitInfo(commit, head.tree, head.parents, head.time, kept)

    def _visitor(self) -> Visit:
        """:meth:`is_new`, then :meth:`_expect` and :meth:`place` for a new one, inlined
        over bound locals: this runs once per tree entry the segment diff reaches
        (22,333 times on the benchmark push, docs/ingest.md "Speed")."""
        marks = self.marks
        held = self.held
        placed = self.placed
        by_oid = self.by_oid
        by_oid_get = by_oid.get
        keys = self.keys
        types = self.objects.types
        held_type = self.snapshot.type_of
        order = self.order
        context = self.context
        objects_max = self.limits.ingest_objects_max
        kind_of = _KIND_OF_TYPE_NUM
        expect = self._expect
        tree_num, blob_num = int(ObjectType.TREE), int(ObjectType.BLOB)

        def visit(oid: ObjectId, is_tree: bool, via: ObjectId) -> None:
            index = by_oid_get(oid)  # is_new, inlined
            if index is None:
                new = False
                if oid not in held:
                    found = held_type(oid)
                    if found is None:
                        raise _missing(oid, via)
                    held[oid] = int(found)
            else:
                mark = marks[index]
                if not mark:
                    found = held_type(oid)
                    if found is not None:
                        held[oid] = int(found)
                    mark = marks[index] = _NEW if found is None else _HELD
                new = mark == _NEW
            want = tree_num if is_tree else blob_num
            if not new:  # the snapshot's object, named as a tree or a blob
                if held[oid] != want:
                    expect(oid, ObjectType(want), via)
                return
            # The dicts below keep by_oid's own object, not the diff's copy: one bytes
            # object per pack object, however many dicts name it.
            assert index is not None  # a new object is the pack's
            oid = keys[index]
            type_num = types[index]
            if type_num != want:
                expect(oid, ObjectType(want), via)
            if oid in placed:
                return
            if len(placed) >= objects_max:
                check_limit("ingest_objects_max", len(placed) + 1, objects_max)
            kind = kind_of[type_num]
            placed[oid] = kind
            order[kind].append(oid)
            via_index = by_oid_get(via)
            context[oid] = via if via_index is None else keys[via_index]

        return visit

    def _tree_of(self, commit: ObjectId) -> ObjectId:
        if self._classified_new(commit):
            return self.headers.commits[commit].tree
        tree = self._snapshot_trees.get(commit)
        if tree is None:
            found = self.bodies.get(commit)
            if found is None or found[0] != ObjectType.COMMIT:
                raise InvalidObject(
                    f"parent {oid_to_hex(commit)} is not a commit of the repository",
                    oid=oid_to_hex(commit),
                )
            tree = Commit.parse(found[1], limits=self.limits).tree
            self._snapshot_trees[commit] = tree
        return tree

    # trees and blobs that refs or tags name directly

    def walk_loose_roots(self) -> None:
        """Whole closures of new trees/blobs named by refs or tags, then the tags themselves."""
        for oid, via in self.loose:
            if oid in self.placed:
                continue
            self.place(oid, via)
            if self.type_of(oid) != ObjectType.TREE:
                continue
            stack = [(oid, 0)]
            while stack:
                tree, depth = stack.pop()
                for entry in Tree.parse(self.bodies.tree(tree), limits=self.limits).entries:
                    entry_oid = entry.oid
                    if entry.is_gitlink:
                        continue
                    new = self.is_new(entry_oid, tree)
                    want = ObjectType.TREE if entry.is_tree else ObjectType.BLOB
                    self._expect(entry_oid, want, tree)
                    if new and entry_oid not in self.placed:
                        self.place(entry_oid, tree)
                        if entry.is_tree:
                            _check_depth(depth + 1, entry_oid, self.limits.tree_depth_max)
                            stack.append((entry_oid, depth + 1))
        targets = self.headers.tags
        new_tags = set(self.tags)

        def tag_edges(tag: ObjectId) -> list[ObjectId]:
            return [targets[tag]] if targets[tag] in new_tags else []

        for tag in _postorder(self.tags, tag_edges):
            self.place(tag, self.context.get(tag))


def _postorder(
    roots: Sequence[ObjectId], edges: Callable[[ObjectId], Sequence[ObjectId]]
) -> list[ObjectId]:
    """Every root after what its edges reach (iterative, so deep histories do not recurse)."""
    done: set[ObjectId] = set()
    out: list[ObjectId] = []
    for root in roots:
        if root in done:
            continue
        stack: list[tuple[ObjectId, int]] = [(root, 0)]
        done.add(root)
        while stack:
            node, i = stack[-1]
            children = edges(node)
            if i < len(children):
                stack[-1] = (node, i + 1)
                child = children[i]
                if child not in done:
                    done.add(child)
                    stack.append((child, 0))
            else:
                stack.pop()
                out.append(node)
    return out


def _check_ref_types(refs: Sequence[tuple[bytes, ObjectId]], walk: _Walk) -> None:
    """A branch (``refs/heads/``) names a commit, as git's own tools assume; the type of
    one the snapshot holds is told without reading its body."""
    for ref, oid in refs:
        if not ref.startswith(b"refs/heads/"):
            continue
        walk.is_new(oid, None)
        got = walk.type_of(oid)
        if got != ObjectType.COMMIT:
            shown = ref[:200].decode("utf-8", "replace")
            raise InvalidObject(
                f"{shown} must name a commit; {oid_to_hex(oid)} is a {got.name.lower()}",
                ref=shown,
                oid=oid_to_hex(oid),
            )


def _missing(oid: ObjectId, needed_by: ObjectId | None) -> MissingObject:
    via = f", needed by {oid_to_hex(needed_by)}" if needed_by is not None else ""
    return MissingObject(
        f"missing necessary objects: {oid_to_hex(oid)} is neither in the pack nor in the "
        f"repository{via}",
        oid=oid_to_hex(oid),
        needed_by=oid_to_hex(needed_by) if needed_by is not None else None,
    )


def _unstored(by_oid: dict[ObjectId, int], walk: _Walk) -> tuple[int, int]:
    """Pack objects not stored: (held by the snapshot, reached by no tip and new)."""
    dedup = dropped = 0
    marks = walk.marks
    for oid, index in by_oid.items():
        if oid in walk.placed:
            continue
        mark = marks[index]
        if mark == _HELD or (not mark and walk.snapshot.contains(oid)):
            dedup += 1
        else:
            dropped += 1
    return dedup, dropped


# -- the segment diff ---------------------------------------------------------------------------


def _segment(
    commit: ObjectId,
    tree: ObjectId,
    parent_trees: Sequence[ObjectId],
    body: Callable[[ObjectId], bytes],
    visit: Visit,
    *,
    limits: Limits,
) -> list[ObjectId]:
    """:func:`~enroute_core.engine.segments.commit_segment`, compiled.

    The same members in the same order, and the same visits (tests compare the
    two). ``enroute_native.segment_diff`` reads tree bodies as git writes them;
    a tree in any other form is parsed strictly here (its typed errors and
    limits) and handed back in that form.
    """

    def unusual(oid: ObjectId) -> bytes:
        return _git_form(Tree.parse(body(oid), limits=limits))

    return segment(
        commit,
        tree,
        parent_trees,
        body,
        unusual,
        visit,
        partial(_check_depth, depth_max=limits.tree_depth_max),
        limits.tree_depth_max,
        limits.tree_entries_max,
    )


def _git_form(tree: Tree) -> bytes:
    """``tree`` written with the modes the segment diff reads (gitlink, tree, or not)."""
    return b"".join(_mode_token(e) + b" " + e.name + b"\0" + e.oid for e in tree.entries)


def _mode_token(entry: TreeEntry) -> bytes:
    """The mode git writes for what the segment diff makes of ``entry`` (gitlink, tree or not)."""
    if entry.is_gitlink:
        return b"160000"
    return b"40000" if entry.is_tree else b"100644"


def _check_depth(depth: int, tree: ObjectId, depth_max: int) -> None:
    """git's ``core.maxTreeDepth``: nesting is bounded before it is walked further."""
    if depth > depth_max:
        raise LimitExceeded(
            "tree_depth_max",
            depth,
            depth_max,
            f"tree {oid_to_hex(tree)} is nested {depth} deep, over tree_depth_max {depth_max}",
        )


# -- step 3: storage order --------------------------------------------------------------------


def _storage_order(
    walk: _Walk, objects: PackObjects, by_oid: dict[ObjectId, int]
) -> list[ObjectId]:
    """Kinds in order; commits and tags as walked, trees and blobs with delta bases first
    (compiled, ``entry_plan.bases_first``; :func:`_bases_first` is its reference)."""
    out = list(walk.order[Kind.COMMIT])
    for kind in (Kind.TREE, Kind.BLOB):
        out.extend(bases_first(walk.order[kind], by_oid, objects.columns, walk.placed, kind))
    out.extend(walk.order[Kind.TAG])
    return out


def _bases_first(
    order: Sequence[ObjectId],
    base_of: Callable[[ObjectId], ObjectId | None],
    same_kind: Callable[[ObjectId], bool],
) -> list[ObjectId]:
    """``order`` with each delta's stored chain moved just before it; otherwise unchanged."""
    emitted: set[ObjectId] = set()
    out: list[ObjectId] = []
    for oid in order:
        if oid in emitted:
            continue
        chain = [oid]
        base = base_of(oid)
        while base is not None and same_kind(base) and base not in emitted and base not in chain:
            chain.append(base)
            base = base_of(base)
        for item in reversed(chain):
            emitted.add(item)
            out.append(item)
    return out


# -- step 4: entries ---------------------------------------------------------------------------


def _write_entries(
    writer: LayerWriter,
    order: list[ObjectId],
    walk: _Walk,
    *,
    source: ByteSource,
    indexed: PackIndexResult,
    by_oid: dict[ObjectId, int],
    bodies: ObjectBodies,
    limits: Limits,
) -> set[ObjectId]:
    """Append every entry in storage order; return the external delta bases.

    In runs of about ``_RUN_BYTES`` of pack entries, each planned by compiled code
    (``enroute_native.entry_plan``, docs/native.md) and handed to
    :meth:`LayerWriter.append_many` at once, so a run stays bounded whatever the pack.
    The plan slices a pack held in memory and reads any other through the source's
    ``read_at``, an entry a call: a pack over the indexer's share (the large profile's
    265 MiB) was planned by the Python reference, 1.3 s more of the push's CPU.
    :func:`_write_entries_reference` is its reference.
    """
    plan = _Plan(walk, indexed, by_oid, limits)
    pack = _held_pack(source)
    read = source.read_at if pack is None else pack
    start = runs = 0
    while start < len(order):
        runs += 1
        if not runs % _TRIM_RUNS:
            _give_back()
        stop, run, redo, large = plan_run(
            read, order, start, _RUN_BYTES, by_oid, indexed.objects.columns, walk.placed,
            walk.context, plan.thin, walk.held, walk.snapshot.contains,
            limits.delta_chain_depth_max, plan.depths, plan.externals,
            limits.pack_stream_threshold_bytes,
        )  # fmt: skip
        entries = run[2]
        for j in redo:  # what the compiled plan leaves to the reference's routines
            oid = order[start + j]
            index = by_oid[oid]
            if run[4][j] is None:
                entries[j] = _full_entry(indexed.objects, index, source, oid, bodies)
            else:
                entries[j] = _ref_delta_entry(indexed.objects, index, source)
        writer.append_many(EntryRun(*run))  # type: ignore[arg-type]  # redo filled
        if large:
            oid = order[stop - 1]
            index = by_oid[oid]
            _copy_entry(
                writer, source, indexed.objects,
                (oid, walk.placed[oid], index, walk.context.get(oid)),
            )  # fmt: skip
        start = stop
    return plan.externals


def _write_entries_reference(
    writer: LayerWriter,
    order: list[ObjectId],
    walk: _Walk,
    *,
    source: ByteSource,
    indexed: PackIndexResult,
    by_oid: dict[ObjectId, int],
    bodies: ObjectBodies,
    limits: Limits,
) -> set[ObjectId]:
    """:func:`_write_entries` planned by :meth:`_Plan.run`: the reference its compiled plan
    is tested against (test_ingest.py), the same layer byte for byte."""
    plan = _Plan(walk, indexed, by_oid, limits)
    start = 0
    while start < len(order):
        start, planned = plan.run(order, start, source, bodies)
        writer.append_many(planned)
        if plan.large is not None:
            _copy_entry(writer, source, indexed.objects, plan.large)
            plan.large = None
    return plan.externals


def _held_pack(source: ByteSource) -> bytes | None:
    """The pack's bytes when it is held in memory (:func:`_held`), for the compiled plan."""
    return source.data if isinstance(source, BytesSource) else None


_LargeEntry = tuple[ObjectId, Kind, int, ObjectId | None]
"""A full pack entry to copy in pieces: (oid, kind, its pack index, base context)."""


class _Plan:
    """Each entry's stored base, depth and bytes, in storage order.

    A delta keeps its pack base when that base is stored before it with the
    same kind and the chain stays within ``delta_chain_depth_max``, or when the
    base is outside the push (thin, or in the snapshot); otherwise it is stored
    whole (:func:`_full_entry`). An OFS_DELTA kept is rewritten as a REF_DELTA.
    A full pack entry over ``pack_stream_threshold_bytes`` ends its run and waits in
    :attr:`large`, to be copied in pieces (:func:`_copy_entry`), never held whole.
    """

    def __init__(
        self, walk: _Walk, indexed: PackIndexResult, by_oid: dict[ObjectId, int], limits: Limits
    ) -> None:
        self.walk = walk
        self.objects = indexed.objects
        self.by_oid = by_oid
        self.depth_max = limits.delta_chain_depth_max
        self.stream_bytes = limits.pack_stream_threshold_bytes
        self.large: _LargeEntry | None = None
        self.thin = set(indexed.external_bases)
        # The stored depth by pack index, -1 while not planned (a word per pack object; a
        # dict by oid was 40 bytes and a key's worth per stored object).
        self.depths = array("i", [-1]) * len(indexed.objects)
        self.externals: set[ObjectId] = set()

    def run(
        self, order: Sequence[ObjectId], start: int, source: ByteSource, bodies: ObjectBodies
    ) -> tuple[int, EntryRun]:
        """The columns of ``order[start:stop]``, ``stop`` the first place after which the
        run's pack entries reach ``_RUN_BYTES``; the reference of ``entry_plan.plan_run``."""
        walk, depths, by_oid = self.walk, self.depths, self.by_oid
        oids: list[ObjectId] = []
        run_kinds: list[Kind] = []
        entries: list[bytes] = []
        sizes: list[int] = []
        bases: list[ObjectId | None] = []
        run_depths: list[int] = []
        contexts: list[ObjectId | None] = []
        objects = self.objects
        run_bytes = 0
        stop = start
        while stop < len(order) and run_bytes < _RUN_BYTES:
            oid = order[stop]
            stop += 1
            index = by_oid[oid]
            kind = walk.placed[oid]
            base = objects.base_oid(index)
            depth = 0
            if base is not None:
                base_index = by_oid.get(base)
                if base_index is not None:  # the writer keeps by_oid's own object
                    base = walk.keys[base_index]
                if base_index is not None and depths[base_index] >= 0:  # planned before it
                    depth = depths[base_index] + 1
                    if walk.placed[base] != kind or depth > self.depth_max:
                        base = None
                elif base not in walk.placed and (
                    base in self.thin or base in walk.held or walk.snapshot.contains(base)
                ):
                    depth = 1  # the base's depth in the snapshot is not known here
                    self.externals.add(base)
                else:
                    base = None
            length = objects.lengths[index]
            if base is None:
                depth = 0
                if not objects.has_base[index] and length > self.stream_bytes:
                    depths[index] = depth
                    self.large = (oid, kind, index, walk.context.get(oid))
                    break  # after the run's entries, copied in pieces
                entry = _full_entry(objects, index, source, oid, bodies)
            else:
                entry = _ref_delta_entry(objects, index, source)
            oids.append(oid)
            run_kinds.append(kind)
            entries.append(entry)
            sizes.append(objects.object_sizes[index])
            bases.append(base)
            run_depths.append(depth)
            contexts.append(walk.context.get(oid))
            depths[index] = depth
            run_bytes += length
        return stop, EntryRun(oids, run_kinds, entries, sizes, bases, run_depths, contexts)


def _copy_entry(
    writer: LayerWriter, source: ByteSource, objects: PackObjects, large: _LargeEntry
) -> None:
    """A full pack entry into the layer verbatim, read and written ``_RUN_BYTES`` at a time:
    a large object's entry is never held whole (its body never was: the indexer streamed
    it, git/packindexer.py)."""
    oid, kind, index, context = large
    offset, length = objects.offsets[index], objects.lengths[index]
    end = offset + length
    pieces = (
        read_exactly(source, pos, min(_RUN_BYTES, end - pos))
        for pos in range(offset, end, _RUN_BYTES)
    )
    head = next(pieces)
    writer.append_pieces(
        oid, kind, head, pieces, length=length, size=objects.object_sizes[index],
        base_context=context,
    )  # fmt: skip


def _full_entry(
    objects: PackObjects, index: int, source: ByteSource, oid: ObjectId, bodies: ObjectBodies
) -> bytes:
    """The pack's full entry verbatim, or a delta's object re-deflated as a full entry."""
    if not objects.has_base[index]:
        return source.read_at(objects.offsets[index], objects.lengths[index])
    found = bodies.get(oid)
    assert found is not None, oid_to_hex(oid)  # a pack object always has a body
    type_, body = found
    return encode_entry_header(int(type_), len(body)) + deflate(body)


def _ref_delta_entry(objects: PackObjects, index: int, source: ByteSource) -> bytes:
    """A REF_DELTA entry: verbatim, or an OFS_DELTA with its header rewritten, zlib untouched.

    The rewrite is compiled (``enroute_native.pack_entry.as_ref_delta``); this is its
    reference, taken for any entry it does not read as a usual OFS_DELTA."""
    raw = source.read_at(objects.offsets[index], objects.lengths[index])
    entry_type, base_oid = objects.entry_types[index], objects.base_oid(index)
    if entry_type == OBJ_REF_DELTA:
        return raw
    assert entry_type == OBJ_OFS_DELTA and base_oid is not None, objects[index]
    header_length = objects.header_lengths[index]
    rewritten = as_ref_delta(raw, header_length, base_oid)
    if rewritten is not None:
        return rewritten
    header = encode_entry_header(OBJ_REF_DELTA, objects.sizes[index])
    return header + base_oid + raw[header_length:]


# -- step 5: commit section --------------------------------------------------------------------


def _commit_externals(infos: Iterable[CommitInfo], stored: dict[ObjectId, Kind]) -> set[ObjectId]:
    found: set[ObjectId] = set()
    for info in infos:  # at C speed: the segments name every tree and blob stored
        found.update(filterfalse(stored.__contains__, (info.tree, *info.parents, *info.segment)))
    return found
