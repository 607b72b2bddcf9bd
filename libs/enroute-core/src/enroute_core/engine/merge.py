"""Merge a run of layers into one merged layer: the work of a flush and of a compaction.

Seed 004, "Stable object numbering" (Assignment, Effects) and "Layers":

1. Sources are consecutive manifest layers, oldest first. Their entries are
   copied in that order, each source in its own storage order, so every kept
   object keeps its id and the output's local order is id order; the output
   covers exactly the range of the run, ``[first source's first id, last
   source's end)``, and its id runs mark the holes.
2. A copy is kept only when it is canonical: its oid has no copy with a
   smaller id (in a layer before the run, or in an older source of the run).
   Duplicates come from concurrent pushes; dropping them leaves holes that no
   view references ("Duplicates resolve to the smallest id").
3. Pack entries are copied verbatim, so delta chains stay as stored. A
   REF_DELTA names its base by oid inside the entry (docs/formats/layer.md,
   "Data region"), so an entry whose base copy was dropped still resolves: the
   table's base ref names the canonical copy (local, before the delta, or an
   external oid of an older layer). Only the recorded depth follows the
   canonical base.
4. The commit section lists the kept commits, sources oldest first, each in
   its topological order; the commit graph holds them by repository ids with
   every reference resolved to its canonical id and generations recomputed.

Memory: one entry at a time flows from a reader to the writer's sink; the
merge keeps only the depths it changed and the generations of the run's
commits, besides what the writer keeps per object for its metadata.
Reads go through :class:`LayerReader` only, so the caller loads the sources'
bytes first (seed 004, "Machines": merges load their inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine.view import View
from enroute_core.state.commands import NewLayer, PlacedLayer, ReplaceLayers
from enroute_core.state.model import LayerEntry, LayerKind
from enroute_core.storage.layer import (
    REF_EXTERNAL,
    REF_NONE,
    GraphCommit,
    LayerReader,
    LayerWriter,
    SealedLayer,
)
from enroute_core.storage.pool import Intent

_SECTION = "merge"


class OlderObjects(Protocol):
    """What a merge needs of the layers before its run (their view)."""

    def find_id(self, oid: ObjectId) -> int | None:
        """The smallest id of ``oid`` before the run, or None."""
        ...

    def depth(self, object_id: int) -> int:
        """The delta depth of the object with ``object_id`` (0 for a full entry)."""
        ...

    def generation(self, commit_id: int) -> int:
        """The generation of a commit before the run (1 for a root commit)."""
        ...


class NoOlder:
    """The run starts at the first layer of the manifest."""

    def find_id(self, oid: ObjectId) -> int | None:
        return None

    def depth(self, object_id: int) -> int:
        raise CorruptData(f"id {object_id} is before the first layer", section=_SECTION)

    def generation(self, commit_id: int) -> int:
        raise CorruptData(f"commit id {commit_id} is before the first layer", section=_SECTION)


class ViewBefore:
    """The layers of ``view`` before position ``below``: the usual :class:`OlderObjects`."""

    __slots__ = ("_below", "_view")

    def __init__(self, view: View, below: int) -> None:
        assert 0 <= below <= len(view.layers), below
        self._view = view
        self._below = below

    def find_id(self, oid: ObjectId) -> int | None:
        return self._view.id_of_oid(oid, below=self._below)

    def depth(self, object_id: int) -> int:
        reader, local = self._view.locate(object_id)
        return reader.record(local).depth

    def generation(self, commit_id: int) -> int:
        commit = self._view.commit(commit_id)
        if commit is None:
            raise CorruptData(f"parent id {commit_id} is no commit of the view", section=_SECTION)
        return commit.generation


@dataclass(frozen=True, slots=True)
class MergedLayer:
    """A finished merge: the sealed file and what ``replace_layers`` needs to commit it."""

    sealed: SealedLayer
    first_id: int
    id_count: int
    dropped: int
    run_first_id: int
    run_roots: tuple[bytes, ...]

    @property
    def object_count(self) -> int:
        return self.sealed.object_count

    def outputs(self, upload_gen: int, data: bytes = b"") -> tuple[PlacedLayer, ...]:
        """The outputs of the replacement: none when every object was a duplicate.

        A stored output names the ``upload_gen`` it was uploaded with; ``data``
        (the whole file) makes an inline output instead.
        """
        if self.sealed.object_count == 0:
            return ()
        kind = LayerKind.INLINE if data else LayerKind.STORED
        layer = NewLayer(
            kind=kind,
            object_count=self.sealed.object_count,
            file_size=self.sealed.file_size,
            meta_size=self.sealed.meta_size,
            root=self.sealed.root,
            upload_gen=0 if data else upload_gen,
            data=data,
        )
        return (PlacedLayer(self.first_id, self.id_count, layer),)

    def replace_command(
        self, incarnation: int, upload_gen: int, data: bytes = b""
    ) -> ReplaceLayers:
        """The ``replace_layers`` command that swaps the run for this layer."""
        return ReplaceLayers(
            incarnation=incarnation,
            run_first_id=self.run_first_id,
            run_roots=self.run_roots,
            outputs=self.outputs(upload_gen, data),
        )


class _Run:
    """The sources, which of their copies are kept, and where each oid's canonical copy is
    (the smallest id: layers before the run first, then sources oldest first)."""

    __slots__ = ("entries", "first_id", "kept", "older", "readers")

    def __init__(
        self, sources: Sequence[tuple[LayerEntry, LayerReader]], older: OlderObjects
    ) -> None:
        self.entries = tuple(e for e, _ in sources)
        self.readers = tuple(r for _, r in sources)
        self.first_id = self.entries[0].first_id
        self.older = older
        # One byte per source object: is this copy the canonical one (kept)?
        self.kept = tuple(bytearray(r.object_count) for r in self.readers)

    def source_of(self, oid: ObjectId, before: int) -> tuple[int, int] | None:
        """(source, local) of the oldest copy among the first ``before`` sources."""
        for s in range(before):
            local = self.readers[s].lookup(oid)
            if local is not None:
                return s, local
        return None

    def canonical_id(self, oid: ObjectId) -> int:
        """The repository id every reference to ``oid`` resolves to."""
        found = self.older.find_id(oid)
        if found is not None:
            return found
        inside = self.source_of(oid, len(self.readers))
        if inside is None:
            raise CorruptData(f"object {oid_to_hex(oid)} is in no layer", section=_SECTION)
        s, local = inside
        return self.entries[s].first_id + self.readers[s].id_of(local)

    def keep(self, s: int, local: int, oid: ObjectId) -> bool:
        """Decide (once, in source order) whether a copy is canonical, and remember it."""
        if self.older.find_id(oid) is not None or self.source_of(oid, s) is not None:
            return False
        self.kept[s][local] = 1
        return True

    def ref_id(self, s: int, ref: int, externals: dict[int, int]) -> int:
        """The canonical id a layer ref of source ``s`` resolves to: a kept local copy
        is its own id; anything else is looked up by oid (externals once each)."""
        reader = self.readers[s]
        if not ref & REF_EXTERNAL:
            if self.kept[s][ref]:
                return self.entries[s].first_id + reader.id_of(ref)
            return self.canonical_id(reader.ref_oid(ref))
        found = externals.get(ref)
        if found is None:
            found = externals[ref] = self.canonical_id(reader.ref_oid(ref))
        return found


def check_run(sources: Sequence[tuple[LayerEntry, LayerReader]]) -> None:
    """Seed 004, "Assignment": a run of layers with ascending, disjoint ranges that fit
    their files (the state machine checks that the run is consecutive)."""
    if not sources:
        raise InvalidArgument("a merge needs at least one source layer")
    end = sources[0][0].first_id
    for entry, reader in sources:
        if entry.first_id < end:
            raise InvalidArgument(f"source at id {entry.first_id} overlaps the one before it")
        if entry.id_count != reader.id_count or entry.object_count != reader.object_count:
            raise InvalidArgument(f"source at id {entry.first_id} disagrees with its file")
        end = entry.end_id


def check_replacement(run: Sequence[LayerEntry], command: ReplaceLayers, *, dropped: int) -> None:
    """Refuse to propose a replacement whose outputs do not cover ``run`` exactly.

    Seed 004, "Stable object numbering" (Assignment): the outputs of a merge keep the
    run's ids, so together they span ``[run's first id, run's end)`` with no gap
    between them, and they hold the run's objects less the ``dropped`` duplicates.
    The state machine refuses ranges outside the run; this also catches a merge that
    lost or invented objects before it reaches the ledger. Raises ``InvalidArgument``
    (``reason="replacement"``).
    """

    def refuse(why: str) -> InvalidArgument:
        return InvalidArgument(
            f"replacement of the run does not cover it: {why}", reason="replacement"
        )

    if not run:
        raise refuse("the run is empty")
    if command.run_first_id != run[0].first_id:
        raise refuse(f"it starts at id {command.run_first_id}, the run at {run[0].first_id}")
    if command.run_roots != tuple(e.root for e in run):
        raise refuse("it names other layers than the run's")
    low, high = run[0].first_id, run[-1].end_id
    expected = sum(e.object_count for e in run) - dropped
    objects = sum(o.layer.object_count for o in command.outputs)
    if dropped < 0 or objects != expected:
        raise refuse(f"its outputs hold {objects} objects, the run {expected} after duplicates")
    if not command.outputs:
        return
    end = low
    for out in command.outputs:
        if out.first_id != end:
            raise refuse(f"an output starts at id {out.first_id}, not at {end}")
        if out.layer.object_count > out.id_count:
            raise refuse(f"the output at id {out.first_id} holds more objects than ids")
        end = out.first_id + out.id_count
    if end != high:
        raise refuse(f"its outputs end at id {end}, the run at {high}")


def merge_layers(
    sources: Sequence[tuple[LayerEntry, LayerReader]],
    sink: Callable[[bytes], object],
    *,
    older: OlderObjects | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> MergedLayer:
    """Write the merged layer of ``sources`` (oldest first) through ``sink``.

    ``older`` answers for the layers before the run (:class:`ViewBefore` of
    the snapshot's view); without it the run must start the manifest.
    """
    check_run(sources)
    run = _Run(sources, older or NoOlder())
    writer = LayerWriter(sink, merged=True, limits=limits)
    id_runs: list[tuple[int, int]] = []
    depths: dict[bytes, int] = {}  # only depths that differ from the source's record
    dropped = 0
    last_rel = -2
    for s, (entry, reader) in enumerate(sources):
        offset = entry.first_id - run.first_id
        for local in range(reader.object_count):
            rec = reader.record(local)
            if not run.keep(s, local, rec.oid):
                dropped += 1
                continue
            rel = offset + reader.id_of(local)
            if rel != last_rel + 1:
                id_runs.append((writer.object_count, rel))
            last_rel = rel
            kind = reader.kind_of(local)
            base: ObjectId | None = None
            depth = 0
            if rec.base_ref != REF_NONE:
                base = reader.ref_oid(rec.base_ref)
                depth = _depth_over(run, s, base, depths)
                if depth != rec.depth:
                    depths[rec.oid] = depth
            ctx = None if rec.base_context_ref == REF_NONE else reader.ref_oid(rec.base_context_ref)
            writer.append(
                rec.oid,
                kind,
                reader.entry_bytes(local, Intent.SCAN),  # a merge reads each entry once: cold
                rec.size,
                base=base,
                depth=depth,
                base_context=ctx,
            )
    graph = _graph(run, writer)
    id_count = sources[-1][0].end_id - run.first_id
    sealed = writer.finish(id_runs=id_runs, id_count=id_count, graph=graph)
    return MergedLayer(
        sealed=sealed,
        first_id=run.first_id,
        id_count=id_count,
        dropped=dropped,
        run_first_id=run.first_id,
        run_roots=tuple(e.root for e in run.entries),
    )


def _depth_over(run: _Run, s: int, base: ObjectId, changed: dict[bytes, int]) -> int:
    """The depth through the base's canonical copy: its depth plus one (the writer checks
    this for a local base; for an external one it is the depth counted through it)."""
    found = run.older.find_id(base)
    if found is not None:
        return run.older.depth(found) + 1
    inside = run.source_of(base, s + 1)
    if inside is None:
        raise CorruptData(f"delta base {oid_to_hex(base)} is in no layer", section=_SECTION)
    bs, blocal = inside
    base_depth = changed.get(base)
    if base_depth is None:
        base_depth = run.readers[bs].record(blocal).depth
    return base_depth + 1


def _graph(run: _Run, writer: LayerWriter) -> list[GraphCommit]:
    """Add the kept commits' records to the writer; return their graph by repository ids."""
    out: list[GraphCommit] = []
    for s, reader in enumerate(run.readers):
        kept = run.kept[s]
        first = run.entries[s].first_id
        stored = reader.commit_graph()
        externals: dict[int, int] = {}
        for rec, info in zip(reader.commits(), reader.commit_infos(), strict=True):
            if not kept[rec.local_index]:
                continue
            writer.add_commit(info)
            commit_id = first + reader.id_of(rec.local_index)
            if stored is None:
                out.append(
                    GraphCommit(
                        commit_id=commit_id,
                        tree_id=run.ref_id(s, rec.tree_ref, externals),
                        generation=1,
                        time=rec.time,
                        parents=tuple(run.ref_id(s, p, externals) for p in rec.parent_refs),
                        segment=tuple(
                            sorted({run.ref_id(s, m, externals) for m in rec.segment_refs})
                        ),
                    )
                )
                continue
            rank = stored.rank_of(commit_id)
            if rank is None:
                raise CorruptData(
                    f"commit id {commit_id} is missing from its layer's graph", section=_SECTION
                )
            out.append(stored.commit(rank))  # ids are canonical for good: reuse them
    out.sort(key=lambda g: g.commit_id)
    generations: dict[int, int] = {}  # parents first: id order is topological
    return [_with_generation(g, generations, run) for g in out]


def _with_generation(g: GraphCommit, generations: dict[int, int], run: _Run) -> GraphCommit:
    generation = 1
    for p in g.parents:
        if p >= g.commit_id:
            raise CorruptData(f"commit id {g.commit_id}: parent {p} is not older", section=_SECTION)
        if p >= run.first_id:
            parent = generations.get(p)
            if parent is None:
                raise CorruptData(
                    f"commit id {g.commit_id}: parent {p} is no commit of the run",
                    section=_SECTION,
                )
        else:
            parent = run.older.generation(p)
        generation = max(generation, parent + 1)
    generations[g.commit_id] = generation
    return GraphCommit(g.commit_id, g.tree_id, generation, g.time, g.parents, g.segment)
