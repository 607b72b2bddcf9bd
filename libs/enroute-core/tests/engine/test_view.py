"""The repository view over pushed layers (seed 004, "Stable object numbering": ids,
duplicates resolve to the smallest id; "Pages and memory": the commit graph in ids;
DESIGN "Layers": segments and closures).

The layers come from a real generated repository pushed in three parts: the
first part of main's history, then thin packs of the later parts ingested
against a view of the earlier layers, with ids assigned as the state does.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random

import pytest
from pyroaring import BitMap

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_core.base.ids import LogIndex, ObjectId, oid_from_hex
from enroute_core.engine.ingest import ingest_pack
from enroute_core.engine.serve import PackPlan, plan_fetch, write_pack
from enroute_core.engine.view import View, _first_graph, _resolved_graph
from enroute_core.git.object_type import ObjectType
from enroute_core.git.source import BytesSource
from enroute_core.state.model import LayerEntry
from enroute_core.state.model import LayerKind as ManifestKind
from enroute_core.storage.layer import Kind, LayerReader
from enroute_testing.gitcli import run_git
from enroute_testing.pushed import (
    history_cuts,
    merge,
    push_layer,
    rev_list_objects,
    rev_parse,
    three_pushes,
)
from enroute_testing.repogen import (
    GeneratedRepo,
    RepoSpec,
    all_objects,
    generate_repo,
    pack_objects,
)

pytestmark = pytest.mark.interop

_SPEC = RepoSpec(seed=11, commits=30, branches=2, merge_every=5, files=16, file_bytes=900,
                 rename_rate=0.1, annotated_tags=2, lightweight_tags=1)  # fmt: skip
_TYPES = {b"commit": ObjectType.COMMIT, b"tree": ObjectType.TREE, b"blob": ObjectType.BLOB,
          b"tag": ObjectType.TAG}  # fmt: skip


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("view") / "full.git", _SPEC)


@pytest.fixture(scope="module")
def layers(repo: GeneratedRepo) -> list[tuple[LayerEntry, LayerReader]]:
    return three_pushes(repo)


@pytest.fixture(scope="module")
def view(layers: list[tuple[LayerEntry, LayerReader]]) -> View:
    return View(layers)


def test_layers_are_three_thin_pushes(layers: list[tuple[LayerEntry, LayerReader]]) -> None:
    assert len(layers) == 3
    assert all(r.object_count > 0 for _, r in layers)
    assert layers[1][1].external_count > 0 and layers[2][1].external_count > 0
    assert [e.first_id for e, _ in layers] == [0, layers[0][0].end_id, layers[1][0].end_id]


def test_every_object_reads_back(repo: GeneratedRepo, view: View) -> None:
    objects = all_objects(repo.path)
    ids: set[int] = set()
    for hex_oid, type_name, body in objects:
        oid = oid_from_hex(hex_oid)
        assert view.contains(oid)
        assert view.read(oid) == (_TYPES[type_name], body)
        object_id = view.id_of_oid(oid)
        assert object_id is not None and view.oid_of_id(object_id) == oid
        assert view.kind_of(object_id) == Kind(int(_TYPES[type_name]) - 1)
        assert object_id in view.kind_ids(view.kind_of(object_id))
        ids.add(object_id)
    assert len(ids) == len(objects) == view.end_id, "ids are dense without duplicates"


def test_missing_objects(view: View) -> None:
    absent = ObjectId(b"\x01" * 20)
    assert not view.contains(absent)
    assert view.read(absent) is None and view.id_of_oid(absent) is None
    with pytest.raises(KeyError):
        view.locate(view.end_id)


def test_locate_by_ranges(view: View, layers: list[tuple[LayerEntry, LayerReader]]) -> None:
    for entry, reader in layers:
        for local in (0, reader.object_count // 2, reader.object_count - 1):
            found, at = view.locate(entry.first_id + local)
            assert found is reader and at == local


@pytest.mark.parametrize("ref", ["main", "HEAD~3", "--all"])
def test_closure_is_rev_list(repo: GeneratedRepo, view: View, ref: str) -> None:
    if ref == "--all":
        tips = [view.id_of_oid(oid_from_hex(v)) for v in repo.refs.values()]
        got = view.object_closure(t for t in tips if t is not None)
    else:
        tip = view.id_of_oid(rev_parse(repo.path, ref))
        assert tip is not None
        got = view.closure([tip])
    want = {view.id_of_oid(o) for o in rev_list_objects(repo.path, ref)}
    assert set(got) == want


def test_commit_graph(repo: GeneratedRepo, view: View) -> None:
    out = run_git(["rev-list", "--all", "--parents", "--timestamp"], cwd=repo.path)
    lines = out.splitlines()
    assert view.commit_count == len(lines)
    for line in lines:
        time, commit_hex, *parent_hexes = line.split()
        cid = view.id_of_oid(oid_from_hex(commit_hex))
        assert cid is not None
        commit = view.commit(cid)
        assert commit is not None and commit.time == int(time)
        assert commit.parents == tuple(view.id_of_oid(oid_from_hex(p)) for p in parent_hexes)
        tree = rev_parse(repo.path, commit_hex.decode() + "^{tree}")
        assert commit.tree_id == view.id_of_oid(tree)
        parents = [view.commit(p) for p in commit.parents]
        assert commit.generation == 1 + max((p.generation for p in parents if p), default=0)
        assert cid in commit.segment and all(p < cid for p in commit.parents)


def test_commit_sections_decode_whole_as_record_by_record(
    layers: list[tuple[LayerEntry, LayerReader]],
) -> None:
    """Real pushes (the second and third thin, with externals): the bulk decode gives every
    record ``commit(rank)`` gives, and a first push's graph by whole arrays is the one
    resolved ref by ref."""
    for _, reader in layers:
        columns = reader.commit_columns()
        assert columns is not None and len(columns) == reader.commit_count > 0
        assert list(columns.records()) == [reader.commit(k) for k in range(reader.commit_count)]
    entry, reader = layers[0]
    columns = reader.commit_columns()
    assert columns is not None and reader.external_count == 0
    for first in (0, 5000):
        at = dataclasses.replace(entry, first_id=first)
        fast = _first_graph(first, columns)
        assert fast is not None and fast == _resolved_graph((), at, reader)


def test_duplicates_resolve_to_the_smallest_id(
    repo: GeneratedRepo, layers: list[tuple[LayerEntry, LayerReader]]
) -> None:
    """A concurrent push stored the second part again: its copies never win."""
    first, second = history_cuts(repo.path)
    b = rev_parse(repo.path, second)
    again = push_layer(
        repo.path, layers[:1], layers[-1][0].end_id, revs=[b.hex()], exclude=[first], tips=[b]
    )
    view = View([*layers, again])
    dup_entry, dup_reader = again
    for local in range(dup_reader.object_count):
        oid = dup_reader.ref_oid(local)
        found = view.id_of_oid(oid)
        assert found is not None and found < dup_entry.first_id
    tip = view.id_of_oid(b)
    assert tip is not None
    assert set(view.closure([tip])) == {
        view.id_of_oid(o) for o in rev_list_objects(repo.path, b.hex())
    }


def test_overlapping_ranges_are_refused(layers: list[tuple[LayerEntry, LayerReader]]) -> None:
    (e0, r0), (e1, r1) = layers[0], layers[1]
    shifted = LayerEntry(e1.kind, e0.end_id - 1, e1.id_count, e1.object_count, 0, e1.file_size,
                         e1.meta_size, e1.root, e1.pin)  # fmt: skip
    with pytest.raises(InvalidArgument, match="overlaps"):
        View([(e0, r0), (shifted, r1)])


def test_a_thin_layer_without_its_base_layer_is_corrupt(
    layers: list[tuple[LayerEntry, LayerReader]],
) -> None:
    with pytest.raises(CorruptData):
        View(layers[1:])


def test_flipped_data_bytes_raise_only_corrupt_data(repo: GeneratedRepo) -> None:
    """A flipped byte in the data region fails its chunk hash on the first read."""
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    a = rev_parse(repo.path, history_cuts(repo.path)[0])
    result = ingest_pack(BytesSource(pack_objects(repo.path, revs=[a.hex()])), [a], View([]))
    assert result.data is not None and result.sealed is not None
    good = LayerReader.open(BytesSource(result.data), meta_size=result.sealed.meta_size)
    meta_size = result.sealed.meta_size
    for _ in range(4):
        data = bytearray(result.data)
        data[rng.randrange(good.data_end)] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptData):  # at open when the chunk also holds metadata
            reader = LayerReader.open(BytesSource(bytes(data)), meta_size=meta_size)
            entry = LayerEntry(
                ManifestKind.INLINE, 0, reader.object_count, reader.object_count, 0,
                len(data), meta_size, result.sealed.root, LogIndex(1),
            )  # fmt: skip
            view = View([(entry, reader)])
            if rng.random() < 0.5:  # the pack writer reads spans, not entries
                every = BitMap(range(view.end_id))
                write_pack(view, PackPlan(every, BitMap(), (), False, True), lambda b: None)
            for object_id in range(view.end_id):
                view.read_id(object_id)


# -- updates in place (seed 004, "Effects") ----------------------------------------------------


def _assert_same_view(a: View, b: View, repo: GeneratedRepo) -> None:
    """Every object has the same id, kind and body; commits and closures agree."""
    for hex_oid, _, _ in all_objects(repo.path):
        oid = oid_from_hex(hex_oid.decode())
        found = a.id_of_oid(oid)
        assert found is not None and b.id_of_oid(oid) == found
        assert a.kind_of(found) == b.kind_of(found)
        assert a.read_id(found) == b.read_id(found)
        ca, cb = a.commit(found), b.commit(found)
        assert (ca is None) == (cb is None)
        if ca is not None and cb is not None:
            assert (ca.tree_id, ca.parents, ca.time, ca.generation) == (
                cb.tree_id,
                cb.parents,
                cb.time,
                cb.generation,
            )
            assert ca.segment == cb.segment
    for kind in Kind:
        assert a.kind_ids(kind) == b.kind_ids(kind)
    assert a.commit_count == b.commit_count
    tips = [a.id_of_oid(oid_from_hex(v)) for v in repo.refs.values()]
    assert a.object_closure([t for t in tips if t is not None]) == b.object_closure(
        [t for t in tips if t is not None]
    )


def test_appending_layers_matches_a_full_build(
    repo: GeneratedRepo, layers: list[tuple[LayerEntry, LayerReader]], view: View
) -> None:
    grown = View([])
    steps = [grown]
    for layer in layers:
        grown = grown.with_layers((), [layer])
        steps.append(grown)
    _assert_same_view(grown, view, repo)
    # Each step kept the views of the layers before it, and left the older view alone.
    for older, newer in itertools.pairwise(steps):
        assert newer._layers[: len(older._layers)] == older._layers
        assert all(a is b for a, b in zip(older._layers, newer._layers, strict=False))
    assert len(steps[1].layers) == 1 and steps[1].end_id == layers[0][0].end_id


def test_swapping_a_stretch_for_its_merge_rebuilds_nothing_else(
    repo: GeneratedRepo, layers: list[tuple[LayerEntry, LayerReader]], view: View
) -> None:
    _, (entry, reader) = merge(layers, 0, 2)
    swapped = view.with_layers([e for e, _ in layers[:2]], [(entry, reader)])
    assert [e for e, _ in swapped.layers] == [entry, layers[2][0]]
    assert swapped._layers[1] is view._layers[2], "the newer layer's view was rebuilt"
    _assert_same_view(swapped, view, repo)
    _assert_same_view(swapped, View([(entry, reader), layers[2]]), repo)
    assert len(view.layers) == 3, "the older view changed"
    # Same ids, entries copied verbatim: the same full clone, byte for byte.
    tips = [oid_from_hex(v) for v in repo.refs.values()]
    packs = []
    for v in (view, swapped):
        parts: list[bytes] = []
        write_pack(v, plan_fetch(v, tips), parts.append)
        packs.append(b"".join(parts))
    assert packs[0] == packs[1]


def test_changes_that_do_not_fit_are_refused(
    layers: list[tuple[LayerEntry, LayerReader]], view: View
) -> None:
    with pytest.raises(InvalidArgument):
        view.with_layers([layers[0][0], layers[2][0]], [])  # not a stretch
    with pytest.raises(InvalidArgument):
        view.with_layers((), [layers[1]])  # overlaps the newest layer
    wider = dataclasses.replace(layers[0][0], id_count=layers[0][0].id_count + 1)
    with pytest.raises(InvalidArgument):
        view.with_layers([layers[0][0]], [(wider, layers[0][1])])  # overlaps the next layer
    with pytest.raises(CorruptData):
        View([layers[0]]).with_layers((), [layers[2]])  # its bases are in the skipped layer
