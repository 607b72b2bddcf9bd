"""Views of a generated repository pushed in parts, with ids as the state assigns them.

Engine tests (view, serve) need layers that look like a repository's real life: the
first part of main's history, then thin packs of the later parts ingested against a
view of the earlier layers. This builds them through ``ingest_pack`` from packs of the
real git CLI; the layers are inline, so nothing touches a store.
"""

from __future__ import annotations

from pathlib import Path

from enroute_core.base.ids import LogIndex, ObjectId, oid_from_hex
from enroute_core.engine.ingest import ingest_pack
from enroute_core.engine.merge import MergedLayer, ViewBefore, merge_layers
from enroute_core.engine.view import View
from enroute_core.git.source import BytesSource
from enroute_core.state.model import LayerEntry, LayerKind
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.layer.writer import SealedLayer
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import GeneratedRepo, pack_objects

Layers = list[tuple[LayerEntry, LayerReader]]


def rev_parse(repo: Path, rev: str) -> ObjectId:
    return oid_from_hex(run_git(["rev-parse", rev], cwd=repo).strip())


def rev_list_objects(repo: Path, *args: str) -> set[ObjectId]:
    out = run_git(["rev-list", "--objects", *args], cwd=repo)
    return {oid_from_hex(line.split(b" ", 1)[0]) for line in out.splitlines() if line}


def history_cuts(repo: Path) -> tuple[str, str]:
    """Two points on main's first-parent line: about a third and two thirds of the way."""
    count = int(run_git(["rev-list", "--count", "--first-parent", "main"], cwd=repo))
    return f"main~{count * 2 // 3}", f"main~{count // 3}"


def inline_entry(sealed: SealedLayer, first_id: int, pin: int) -> LayerEntry:
    """The manifest entry of ``sealed`` as an inline layer whose ids start at ``first_id``,
    pinned at log index ``pin``."""
    return LayerEntry(
        kind=LayerKind.INLINE,
        first_id=first_id,
        id_count=sealed.id_count,
        object_count=sealed.object_count,
        upload_gen=0,
        file_size=sealed.file_size,
        meta_size=sealed.meta_size,
        root=sealed.root,
        pin=LogIndex(pin),
    )


def push_layer(
    repo: Path,
    layers: Layers,
    next_id: int,
    *,
    revs: list[str],
    exclude: list[str],
    tips: list[ObjectId],
) -> tuple[LayerEntry, LayerReader]:
    """Ingest one (thin) pack against a view of ``layers``; the range starts at ``next_id``."""
    pack = pack_objects(repo, revs=revs, exclude=exclude, thin=bool(exclude))
    result = ingest_pack(BytesSource(pack), tips, View(layers))
    assert result.data is not None and result.sealed is not None
    sealed = result.sealed
    reader = LayerReader.open(BytesSource(result.data), meta_size=sealed.meta_size)
    return inline_entry(sealed, next_id, len(layers) + 1), reader


def three_pushes(repo: GeneratedRepo) -> Layers:
    """Main up to the first cut; then, thin, up to the second; then every ref."""
    first, second = history_cuts(repo.path)
    a, b = rev_parse(repo.path, first), rev_parse(repo.path, second)
    all_tips = [oid_from_hex(v) for v in repo.refs.values()]
    steps = [([a.hex()], [], [a]), ([b.hex()], [a.hex()], [b]), (["--all"], [b.hex()], all_tips)]
    layers: Layers = []
    next_id = 0
    for revs, exclude, tips in steps:
        entry, reader = push_layer(
            repo.path, layers, next_id, revs=revs, exclude=exclude, tips=tips
        )
        layers.append((entry, reader))
        next_id = entry.end_id
    return layers


def merge(
    layers: Layers, start: int, stop: int
) -> tuple[MergedLayer, tuple[LayerEntry, LayerReader]]:
    """``layers[start:stop]`` merged into one stored layer, as a flush or compaction writes
    it (``merge_layers``), with the manifest entry that replaces them."""
    parts: list[bytes] = []
    view = View(layers)
    merged = merge_layers(layers[start:stop], parts.append, older=ViewBefore(view, start))
    data = b"".join(parts)
    assert len(data) == merged.sealed.file_size
    reader = LayerReader.open(BytesSource(data), meta_size=merged.sealed.meta_size)
    entry = LayerEntry(
        kind=LayerKind.STORED,
        first_id=merged.first_id,
        id_count=merged.id_count,
        object_count=merged.object_count,
        upload_gen=1,
        file_size=merged.sealed.file_size,
        meta_size=merged.sealed.meta_size,
        root=merged.sealed.root,
        pin=LogIndex(0),
    )
    return merged, (entry, reader)
