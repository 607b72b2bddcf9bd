"""Ingest of pushed packs into pushed layers (seed 004, "Layers", "Stable object numbering";
DESIGN "Layers": segments).

Packs come from real git (``enroute_testing.repogen``) or are staged with
:class:`PackWriter`; snapshots are a real git repository read through
``git cat-file --batch`` or plain object maps. Every layer is read back with
:class:`LayerReader` and every entry inflated and hashed.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from enroute_native.entry_plan import bases_first

from enroute_core.base.errors import EnrouteError, LimitExceeded, MissingObject
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine.ingest import IngestResult, _bases_first, ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT, SnapshotObjects
from enroute_core.git.commit import Commit, Identity
from enroute_core.git.delta import apply_delta, create_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import OBJ_OFS_DELTA, OBJ_REF_DELTA, parse_entry_header
from enroute_core.git.packindexer import PackObjectInfo, PackObjects, index_pack
from enroute_core.git.packwrite import PackWriter
from enroute_core.git.source import BytesSource
from enroute_core.git.tree import MODE_FILE, Tree, TreeEntry
from enroute_core.state.model import LayerKind as ManifestKind
from enroute_core.storage.layer import REF_EXTERNAL, REF_NONE, Kind, LayerReader
from enroute_testing.gitcli import default_home, git_env, run_git
from enroute_testing.repogen import (
    GeneratedRepo,
    RepoSpec,
    all_objects,
    generate_repo,
    pack_objects,
)

_TYPES = {b"commit": ObjectType.COMMIT, b"tree": ObjectType.TREE, b"blob": ObjectType.BLOB,
          b"tag": ObjectType.TAG}  # fmt: skip
_PACK_TYPE = {1: ObjectType.COMMIT, 2: ObjectType.TREE, 3: ObjectType.BLOB, 4: ObjectType.TAG}


# -- snapshots ----------------------------------------------------------------------------------


class MapSnapshot:
    """A snapshot over a fixed object map (from ``all_objects`` or built by hand)."""

    def __init__(self, objects: dict[ObjectId, tuple[ObjectType, bytes]]) -> None:
        self.objects = objects
        self.reads: list[ObjectId] = []

    def contains(self, oid: ObjectId) -> bool:
        return oid in self.objects

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        found = self.objects.get(oid)
        return None if found is None else found[0]

    def size_of(self, oid: ObjectId) -> int | None:
        found = self.objects.get(oid)
        return None if found is None else len(found[1])

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        self.reads.append(oid)
        return self.objects.get(oid)


def map_snapshot(repo: Path) -> MapSnapshot:
    return MapSnapshot({oid_from_hex(h): (_TYPES[t], body) for h, t, body in all_objects(repo)})


class CatFileSnapshot:
    """A snapshot over a real git repository, read through one ``git cat-file --batch``."""

    def __init__(self, repo: Path) -> None:
        self._proc = subprocess.Popen(
            ["git", "cat-file", "--batch"],
            cwd=repo,
            env=git_env(default_home()),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._seen: dict[ObjectId, tuple[ObjectType, bytes] | None] = {}

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=10)

    def contains(self, oid: ObjectId) -> bool:
        return self.read(oid) is not None

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        found = self.read(oid)
        return None if found is None else found[0]

    def size_of(self, oid: ObjectId) -> int | None:
        found = self.read(oid)
        return None if found is None else len(found[1])

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        if oid in self._seen:
            return self._seen[oid]
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(oid.hex().encode() + b"\n")
        stdin.flush()
        header = stdout.readline().split()
        found: tuple[ObjectType, bytes] | None = None
        if header[-1] != b"missing":
            size = int(header[2])
            body = stdout.read(size + 1)[:size]
            found = (_TYPES[header[1]], body)
        self._seen[oid] = found
        return found


# -- fixtures and helpers -----------------------------------------------------------------------

_SPEC = RepoSpec(seed=7, commits=36, branches=2, merge_every=6, files=20, file_bytes=1200,
                 rename_rate=0.1, annotated_tags=2, lightweight_tags=1)  # fmt: skip


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("ingest") / "full.git", _SPEC)


def _tips(repo: GeneratedRepo) -> list[ObjectId]:
    return [oid_from_hex(v) for v in repo.refs.values()]


def _rev_parse(repo: Path, rev: str) -> ObjectId:
    return oid_from_hex(run_git(["rev-parse", rev], cwd=repo).strip())


def _rev_list_objects(repo: Path, *args: str) -> set[ObjectId]:
    out = run_git(["rev-list", "--objects", *args], cwd=repo)
    return {oid_from_hex(line.split(b" ", 1)[0]) for line in out.splitlines() if line}


def _open(result: IngestResult) -> LayerReader:
    assert result.data is not None and result.sealed is not None
    assert len(result.data) == result.sealed.file_size
    return LayerReader.open(BytesSource(result.data), meta_size=result.sealed.meta_size)


def _inflate_all(
    reader: LayerReader, snapshot: SnapshotObjects
) -> Iterator[tuple[int, ObjectType, bytes, int]]:
    """(local index, type, body, entry type) of every entry; bodies hashed against oids."""
    bodies: dict[ObjectId, tuple[ObjectType, bytes]] = {}
    for i in range(reader.object_count):
        rec = reader.record(i)
        raw = reader.entry_bytes(i)
        ptype, size, hlen, _, base_oid = parse_entry_header(raw, 0, 0)
        assert ptype != OBJ_OFS_DELTA
        data = zlib.decompress(raw[hlen:])
        assert len(data) == size
        if ptype == OBJ_REF_DELTA:
            assert base_oid is not None and rec.base_ref != REF_NONE
            assert reader.ref_oid(rec.base_ref) == base_oid
            if rec.base_ref & REF_EXTERNAL:
                found = snapshot.read(base_oid)
                assert found is not None, "external base not in the snapshot"
                assert rec.depth == 1
            else:
                assert rec.base_ref < i, "a delta base comes before its delta"
                found = bodies[base_oid]
                assert rec.depth == reader.record(rec.base_ref).depth + 1
            type_, body = found[0], apply_delta(found[1], data)
        else:
            assert rec.base_ref == REF_NONE and rec.depth == 0
            type_, body = _PACK_TYPE[ptype], data
        assert object_id(type_, body) == rec.oid
        assert rec.size == len(body)
        assert reader.kind_of(i) == Kind(int(type_) - 1)
        bodies[rec.oid] = (type_, body)
        yield i, type_, body, ptype


def _layer_oids(reader: LayerReader) -> set[ObjectId]:
    return {reader.record(i).oid for i in range(reader.object_count)}


def _check_segments(reader: LayerReader, repo: Path) -> tuple[int, int]:
    """Each segment covers rev-list's exact set, and adds only objects the parents reach.

    Returns (commits, commits whose segment is exactly rev-list's set).
    """
    exact = 0
    infos = list(reader.commit_infos())
    for info in infos:
        parents = [p.hex() for p in info.parents]
        want = _rev_list_objects(repo, info.oid.hex(), "--not", *parents)
        got = set(info.segment)
        assert len(got) == len(info.segment), "segment members repeat"
        assert want <= got, f"segment of {info.oid.hex()} misses objects"
        extra = got - want
        if extra:
            assert extra <= _rev_list_objects(repo, *parents), "extra members the parents lack"
        else:
            exact += 1
    return len(infos), exact


# -- whole history against an empty snapshot ----------------------------------------------------


@pytest.mark.interop
def test_full_push_stores_every_object_and_hashes_back(repo: GeneratedRepo) -> None:
    pack = pack_objects(repo.path)
    result = ingest_pack(BytesSource(pack), _tips(repo), EMPTY_SNAPSHOT)
    reader = _open(result)
    everything = {oid_from_hex(h) for h, _, _ in all_objects(repo.path)}
    assert _layer_oids(reader) == everything
    assert result.object_count == reader.object_count == len(everything)
    assert result.deduplicated == result.dropped == 0
    assert result.external_oids == reader.external_oids == ()
    for oid in everything:
        assert reader.lookup(oid) is not None
    kinds = [reader.kind_of(i) for i in range(reader.object_count)]
    assert kinds == sorted(kinds), "kinds are grouped commit | tree | blob | tag"
    types = [t for _, t, _, _ in _inflate_all(reader, EMPTY_SNAPSHOT)]
    assert len(types) == len(everything)
    deltas = sum(1 for i in range(reader.object_count) if reader.record(i).base_ref != REF_NONE)
    assert deltas > 0, "git's deltas are kept"


@pytest.mark.interop
def test_full_push_commit_section(repo: GeneratedRepo) -> None:
    result = ingest_pack(BytesSource(pack_objects(repo.path)), _tips(repo), EMPTY_SNAPSHOT)
    reader = _open(result)
    infos = list(reader.commit_infos())
    commits = {oid_from_hex(x) for x in run_git(["rev-list", "--all"], cwd=repo.path).split()}
    assert {c.oid for c in infos} == commits == set(result.new_commits)
    seen: set[ObjectId] = set()
    for info in infos:  # parents first, in the section and in the commit entries
        assert all(p in seen for p in info.parents)
        seen.add(info.oid)
        body = Commit.parse(_cat(repo.path, info.oid))
        assert info.tree == body.tree and info.parents == body.parents
        assert body.committer is not None and info.time == body.committer.timestamp
    entry_order = [reader.record(i).oid for i in range(reader.kind_runs[0][1])]
    assert entry_order == [c.oid for c in infos]
    total, exact = _check_segments(reader, repo.path)
    assert total == len(commits)
    assert exact >= total - max(3, total // 4), (exact, total)


@pytest.mark.interop
def test_segments_exact_without_renames(tmp_path: Path) -> None:
    spec = RepoSpec(seed=3, commits=20, branches=1, merge_every=5, files=12, rename_rate=0.0,
                    delete_rate=0.0, symlinks=0, file_bytes=800)  # fmt: skip
    repo = generate_repo(tmp_path / "r.git", spec)
    result = ingest_pack(BytesSource(pack_objects(repo.path)), _tips(repo), EMPTY_SNAPSHOT)
    total, exact = _check_segments(_open(result), repo.path)
    assert exact == total


def _cat(repo: Path, oid: ObjectId) -> bytes:
    return run_git(["cat-file", "commit", oid.hex()], cwd=repo)


@pytest.mark.interop
def test_ofs_delta_becomes_ref_delta_with_the_same_zlib_bytes(repo: GeneratedRepo) -> None:
    pack = pack_objects(repo.path, ofs_delta=True)
    indexed = {o.oid: o for o in index_pack(BytesSource(pack)).objects}
    result = ingest_pack(BytesSource(pack), _tips(repo), EMPTY_SNAPSHOT)
    reader = _open(result)
    rewritten = 0
    for i in range(reader.object_count):
        rec = reader.record(i)
        info = indexed[rec.oid]
        raw = reader.entry_bytes(i)
        packed = pack[info.offset : info.offset + info.size_in_pack]
        if info.entry_type == OBJ_OFS_DELTA and rec.base_ref != REF_NONE:
            ptype, size, hlen, _, base = parse_entry_header(raw, 0, 0)
            assert (ptype, size, base) == (OBJ_REF_DELTA, info.size, info.base_oid)
            assert raw[hlen:] == packed[info.header_length :]
            rewritten += 1
        elif info.entry_type != OBJ_OFS_DELTA:
            assert raw == packed, "full entries are copied verbatim"
    assert rewritten > 0


@pytest.mark.interop
def test_ref_delta_pack_is_copied_verbatim(repo: GeneratedRepo) -> None:
    pack = pack_objects(repo.path, ofs_delta=False)
    indexed = {o.oid: o for o in index_pack(BytesSource(pack)).objects}
    reader = _open(ingest_pack(BytesSource(pack), _tips(repo), EMPTY_SNAPSHOT))
    for i in range(reader.object_count):
        info = indexed[reader.record(i).oid]
        if reader.record(i).base_ref != REF_NONE:
            assert reader.entry_bytes(i) == pack[info.offset : info.offset + info.size_in_pack]


# -- incremental pushes -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def old_repo(repo: GeneratedRepo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding exactly what ``main~6`` reaches (the snapshot of an older push)."""
    path = tmp_path_factory.mktemp("old") / "old.git"
    path.mkdir()
    run_git(["init", "--quiet", "--bare", "."], cwd=path)
    old = _rev_parse(repo.path, "main~6").hex()
    run_git(["index-pack", "--stdin"], cwd=path, input=pack_objects(repo.path, revs=[old]))
    return path


@pytest.mark.interop
def test_thin_push_against_a_git_snapshot(repo: GeneratedRepo, old_repo: Path) -> None:
    old = _rev_parse(repo.path, "main~6")
    new = _rev_parse(repo.path, "main")
    pack = pack_objects(repo.path, revs=[new.hex()], exclude=[old.hex()], thin=True)
    snapshot = CatFileSnapshot(old_repo)
    try:
        result = ingest_pack(BytesSource(pack), [new], snapshot)
        reader = _open(result)
        old_objects = set(map_snapshot(old_repo).objects)
        assert _layer_oids(reader) == _rev_list_objects(repo.path, new.hex()) - old_objects
        assert result.thin_bases, "the thin pack left bases out"
        assert set(result.thin_bases) <= old_objects
        assert result.external_oids == reader.external_oids
        assert set(result.external_oids) <= old_objects
        assert old in result.external_oids, "the old tip is a parent"
        externals = {
            reader.ref_oid(reader.record(i).base_ref)
            for i in range(reader.object_count)
            if reader.record(i).base_ref & REF_EXTERNAL and reader.record(i).base_ref != REF_NONE
        }
        assert externals and externals <= set(result.external_oids)
        assert len(list(_inflate_all(reader, snapshot))) == reader.object_count
        new_commits = set(run_git(["rev-list", f"{old.hex()}..{new.hex()}"], cwd=repo.path)
                          .split())  # fmt: skip
        assert {c.hex().encode() for c in result.new_commits} == new_commits
        _check_segments(reader, repo.path)
    finally:
        snapshot.close()


@pytest.mark.interop
def test_objects_the_snapshot_holds_are_not_stored_again(
    repo: GeneratedRepo, old_repo: Path
) -> None:
    new = _rev_parse(repo.path, "main")
    pack = pack_objects(repo.path, revs=[new.hex()])  # not thin: the whole history again
    snapshot = map_snapshot(old_repo)
    result = ingest_pack(BytesSource(pack), [new], snapshot)
    reader = _open(result)
    old_objects = set(snapshot.objects)
    stored = _layer_oids(reader)
    assert stored == _rev_list_objects(repo.path, new.hex()) - old_objects
    assert result.deduplicated == len(old_objects)
    assert result.dropped == 0
    assert len(list(_inflate_all(reader, snapshot))) == len(stored)


@pytest.mark.interop
def test_push_of_known_objects_adds_no_layer(repo: GeneratedRepo, old_repo: Path) -> None:
    old = _rev_parse(repo.path, "main~6")
    pack = pack_objects(repo.path, revs=[old.hex()])
    result = ingest_pack(BytesSource(pack), [old], map_snapshot(old_repo))
    assert result.sealed is None and result.data is None and result.object_count == 0
    assert result.new_layer(inline=True) is None


@pytest.mark.interop
def test_missing_base_history_is_missing_object(repo: GeneratedRepo) -> None:
    old = _rev_parse(repo.path, "main~1")
    new = _rev_parse(repo.path, "main")
    pack = pack_objects(repo.path, revs=[new.hex()], exclude=[old.hex()])
    with pytest.raises(MissingObject) as err:
        ingest_pack(BytesSource(pack), [new], EMPTY_SNAPSHOT)
    assert err.value.details["oid"] is not None
    assert err.value.mapping.git_form.name == "REF"


@pytest.mark.interop
def test_pack_without_one_blob_names_it(repo: GeneratedRepo) -> None:
    main = _rev_parse(repo.path, "main")
    listed = run_git(["rev-list", "--objects", "main"], cwd=repo.path).splitlines()
    oids = [line.split(b" ", 1)[0] for line in listed]
    types = {h: t for h, t, _ in all_objects(repo.path)}
    dropped = next(h for h in reversed(oids) if types[h] == b"blob")
    stdin = b"".join(h + b"\n" for h in oids if h != dropped)
    pack = run_git(["pack-objects", "--stdout", "-q"], cwd=repo.path, input=stdin)
    with pytest.raises(MissingObject) as err:
        ingest_pack(BytesSource(pack), [main], EMPTY_SNAPSHOT)
    assert err.value.details["oid"] == dropped.decode()
    assert "missing necessary objects" in err.value.message


# -- staged packs -------------------------------------------------------------------------------

_WHO = Identity(b"A U Thor", b"author@example.com", 1_700_000_000, b"+0000")


def _staged(
    entries: list[tuple[str, ObjectType, bytes, ObjectId | None]],
) -> bytes:
    """A pack of (name, type, body, delta base) entries; a delta is a REF_DELTA on its base."""
    w = PackWriter()
    out = [w.header(len(entries))]
    bodies: dict[ObjectId, bytes] = {}
    for _, type_, body, base in entries:
        bodies[object_id(type_, body)] = body
        if base is None:
            out.append(w.add_full(int(type_), body))
        else:
            out.append(w.add_ref_delta(base, create_delta(bodies[base], body)))
    out.append(w.finish())
    return b"".join(out)


def _blobs() -> tuple[bytes, bytes]:
    rng = random.Random(5)
    a = bytes(rng.randrange(97, 123) for _ in range(3000))
    return a, a[:1500] + b"changed" + a[1500:]


def _commit_of(tree: ObjectId, parents: tuple[ObjectId, ...] = ()) -> bytes:
    c = Commit.create(tree=tree, parents=parents, author=_WHO, committer=_WHO, message=b"m\n")
    return c.serialize()


def test_delta_base_reached_later_is_moved_before_its_delta() -> None:
    a, b = _blobs()
    ida, idb = object_id(ObjectType.BLOB, a), object_id(ObjectType.BLOB, b)
    # the walk reaches b (first entry) before a; b is a delta on a
    tree = Tree.build([TreeEntry(MODE_FILE, b"1.txt", idb), TreeEntry(MODE_FILE, b"2.txt", ida)])
    tree_body = tree.serialize()
    commit = _commit_of(object_id(ObjectType.TREE, tree_body))
    cid = object_id(ObjectType.COMMIT, commit)
    pack = _staged([("a", ObjectType.BLOB, a, None), ("b", ObjectType.BLOB, b, ida),
                    ("t", ObjectType.TREE, tree_body, None),
                    ("c", ObjectType.COMMIT, commit, None)])  # fmt: skip
    result = ingest_pack(BytesSource(pack), [cid], EMPTY_SNAPSHOT)
    reader = _open(result)
    order = [reader.record(i).oid for i in range(reader.object_count)]
    assert order.index(ida) < order.index(idb)
    rec = reader.record(order.index(idb))
    assert rec.base_ref == order.index(ida) and rec.depth == 1
    assert len(list(_inflate_all(reader, EMPTY_SNAPSHOT))) == 4
    info = next(reader.commit_infos())
    assert set(info.segment) == set(order)
    assert reader.ref_oid(rec.base_context_ref) == object_id(ObjectType.TREE, tree_body)


def test_delta_on_a_dropped_base_is_stored_full() -> None:
    a, b = _blobs()
    ida, idb = object_id(ObjectType.BLOB, a), object_id(ObjectType.BLOB, b)
    tree_body = Tree.build([TreeEntry(MODE_FILE, b"b.txt", idb)]).serialize()
    commit = _commit_of(object_id(ObjectType.TREE, tree_body))
    cid = object_id(ObjectType.COMMIT, commit)
    pack = _staged([("a", ObjectType.BLOB, a, None), ("b", ObjectType.BLOB, b, ida),
                    ("t", ObjectType.TREE, tree_body, None),
                    ("c", ObjectType.COMMIT, commit, None)])  # fmt: skip
    result = ingest_pack(BytesSource(pack), [cid], EMPTY_SNAPSHOT)
    reader = _open(result)
    assert result.dropped == 1 and reader.lookup(ida) is None
    rec = reader.record(reader.lookup(idb) or 0)
    assert rec.oid == idb and rec.base_ref == REF_NONE and rec.depth == 0
    assert len(list(_inflate_all(reader, EMPTY_SNAPSHOT))) == 3


def test_delta_on_a_snapshot_object_keeps_its_external_base() -> None:
    a, b = _blobs()
    ida, idb = object_id(ObjectType.BLOB, a), object_id(ObjectType.BLOB, b)
    old_tree = Tree.build([TreeEntry(MODE_FILE, b"x.txt", ida)]).serialize()
    old_commit = _commit_of(object_id(ObjectType.TREE, old_tree))
    old_id = object_id(ObjectType.COMMIT, old_commit)
    snapshot = MapSnapshot({
        ida: (ObjectType.BLOB, a),
        object_id(ObjectType.TREE, old_tree): (ObjectType.TREE, old_tree),
        old_id: (ObjectType.COMMIT, old_commit),
    })  # fmt: skip
    tree_body = Tree.build([TreeEntry(MODE_FILE, b"x.txt", idb)]).serialize()
    commit = _commit_of(object_id(ObjectType.TREE, tree_body), (old_id,))
    cid = object_id(ObjectType.COMMIT, commit)
    # the base travels in the pack too: it is deduplicated, the delta stays a REF_DELTA
    pack = _staged([("a", ObjectType.BLOB, a, None), ("b", ObjectType.BLOB, b, ida),
                    ("t", ObjectType.TREE, tree_body, None),
                    ("c", ObjectType.COMMIT, commit, None)])  # fmt: skip
    result = ingest_pack(BytesSource(pack), [cid], snapshot)
    reader = _open(result)
    assert result.deduplicated == 1 and reader.lookup(ida) is None
    rec = reader.record(reader.lookup(idb) or 0)
    assert rec.base_ref & REF_EXTERNAL and reader.ref_oid(rec.base_ref) == ida
    assert rec.depth == 1
    assert result.external_oids == tuple(sorted({ida, old_id}))
    assert len(list(_inflate_all(reader, snapshot))) == 3
    info = next(reader.commit_infos())
    assert set(info.segment) == {cid, idb, object_id(ObjectType.TREE, tree_body)}
    layer = result.new_layer(inline=True)
    assert layer is not None and layer.kind == ManifestKind.INLINE and layer.data == result.data
    stored = result.new_layer(inline=False, upload_gen=9)
    assert stored is not None and stored.data == b"" and stored.upload_gen == 9


def test_sink_receives_the_same_layer() -> None:
    a, _ = _blobs()
    tree_body = Tree.build([TreeEntry(MODE_FILE, b"a.txt", object_id(ObjectType.BLOB, a))])
    body = tree_body.serialize()
    commit = _commit_of(object_id(ObjectType.TREE, body))
    cid = object_id(ObjectType.COMMIT, commit)
    pack = _staged([("c", ObjectType.COMMIT, commit, None), ("t", ObjectType.TREE, body, None),
                    ("a", ObjectType.BLOB, a, None)])  # fmt: skip
    parts: list[bytes] = []
    streamed = ingest_pack(BytesSource(pack), [cid], EMPTY_SNAPSHOT, sink=parts.append)
    whole = ingest_pack(BytesSource(pack), [cid], EMPTY_SNAPSHOT)
    assert streamed.data is None and b"".join(parts) == whole.data
    assert streamed.sealed == whole.sealed
    assert hashlib.sha256(b"".join(parts)).digest() == hashlib.sha256(whole.data or b"").digest()


def test_object_count_limit() -> None:
    a, _ = _blobs()
    body = Tree.build([TreeEntry(MODE_FILE, b"a.txt", object_id(ObjectType.BLOB, a))]).serialize()
    commit = _commit_of(object_id(ObjectType.TREE, body))
    pack = _staged([("c", ObjectType.COMMIT, commit, None), ("t", ObjectType.TREE, body, None),
                    ("a", ObjectType.BLOB, a, None)])  # fmt: skip
    with pytest.raises(LimitExceeded):
        ingest_pack(
            BytesSource(pack),
            [object_id(ObjectType.COMMIT, commit)],
            EMPTY_SNAPSHOT,
            limits=Limits(ingest_objects_max=2),
        )


def test_corrupt_packs_raise_only_typed_errors() -> None:
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 30)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    a, b = _blobs()
    ida = object_id(ObjectType.BLOB, a)
    idb = object_id(ObjectType.BLOB, b)
    body = Tree.build([TreeEntry(MODE_FILE, b"a.txt", ida), TreeEntry(MODE_FILE, b"b.txt", idb)])
    tree_body = body.serialize()
    commit = _commit_of(object_id(ObjectType.TREE, tree_body))
    cid = object_id(ObjectType.COMMIT, commit)
    pack = _staged([("c", ObjectType.COMMIT, commit, None), ("t", ObjectType.TREE, tree_body, None),
                    ("a", ObjectType.BLOB, a, None), ("b", ObjectType.BLOB, b, ida)])  # fmt: skip
    for _ in range(200):
        bad = bytearray(pack)
        if rng.random() < 0.5:
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        else:
            del bad[rng.randrange(len(bad)) :]
        with pytest.raises(EnrouteError):
            ingest_pack(BytesSource(bytes(bad)), [cid], EMPTY_SNAPSHOT)


@pytest.mark.interop
def test_tiny_body_cache_gives_the_same_layer(repo: GeneratedRepo) -> None:
    """Bodies that fall out of the cache are rebuilt along their chains, same bytes out."""
    pack = BytesSource(pack_objects(repo.path))
    whole = ingest_pack(pack, _tips(repo), EMPTY_SNAPSHOT)
    tiny = Limits(ingest_body_cache_bytes_max=512, pack_base_cache_bytes_max=512)
    small = ingest_pack(pack, _tips(repo), EMPTY_SNAPSHOT, limits=tiny)
    assert small.data == whole.data and small.sealed == whole.sealed


# -- the compiled plan of entries against its reference ----------------------------------------


def _both_plans(
    monkeypatch: pytest.MonkeyPatch,
    pack: bytes,
    tips: list[ObjectId],
    snapshot: SnapshotObjects,
    limits: Limits = DEFAULT_LIMITS,
) -> IngestResult:
    """Ingest ``pack`` with ``entry_plan.plan_run`` over the pack held in memory, with it
    reading the entries through the source's ``read_at``, and with ``_Plan.run``
    (``_write_entries_reference``); the same layer, the same questions asked."""
    import enroute_core.engine.ingest as ingest_module

    calls = 0
    compiled = ingest_module.plan_run

    def counted(*args: object) -> object:
        nonlocal calls
        calls += 1
        return compiled(*args)  # type: ignore[arg-type]

    asked: list[list[ObjectId]] = [[], [], []]

    class Asked:
        """``snapshot``, noting what ``contains`` is asked: both plans ask the same."""

        def __init__(self, into: list[ObjectId]) -> None:
            self.into = into

        def contains(self, oid: ObjectId) -> bool:
            self.into.append(oid)
            return snapshot.contains(oid)

        def type_of(self, oid: ObjectId) -> ObjectType | None:
            self.into.append(oid)
            return snapshot.type_of(oid)

        def size_of(self, oid: ObjectId) -> int | None:
            return snapshot.size_of(oid)

        def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
            return snapshot.read(oid)

    with monkeypatch.context() as m:
        m.setattr(ingest_module, "plan_run", counted)
        held = ingest_pack(BytesSource(pack), tips, Asked(asked[0]), limits=limits)
        held_calls, calls = calls, 0
        m.setattr(ingest_module, "_held_pack", lambda source: None)
        read = ingest_pack(BytesSource(pack), tips, Asked(asked[1]), limits=limits)
    assert (held_calls > 0 and calls > 0) or held.sealed is None
    with monkeypatch.context() as m:
        m.setattr(ingest_module, "_write_entries", ingest_module._write_entries_reference)
        m.setattr(ingest_module, "plan_run", None)
        slow = ingest_pack(BytesSource(pack), tips, Asked(asked[2]), limits=limits)
    assert held == slow and read == slow
    assert asked[0] == asked[2] and asked[1] == asked[2]
    return held


@pytest.mark.interop
def test_compiled_plan_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch, repo: GeneratedRepo, old_repo: Path
) -> None:
    """``enroute_native.entry_plan`` against ``_Plan.run``: OFS and REF packs, chains three
    deep, a thin push, a delta whose base is dropped (stored whole) or in the snapshot;
    byte for byte the same layer."""
    tips = _tips(repo)
    for ofs in (True, False):
        _both_plans(monkeypatch, pack_objects(repo.path, ofs_delta=ofs), tips, EMPTY_SNAPSHOT)
    deep = _both_plans(monkeypatch, pack_objects(repo.path, depth=3), tips, EMPTY_SNAPSHOT)
    reader = _open(deep)
    assert max(reader.record(i).depth for i in range(reader.object_count)) == 3
    old, new = _rev_parse(repo.path, "main~6"), _rev_parse(repo.path, "main")
    thin = pack_objects(repo.path, revs=[new.hex()], exclude=[old.hex()], thin=True)
    assert _both_plans(monkeypatch, thin, [new], map_snapshot(old_repo)).thin_bases
    a, b = _blobs()
    ida, idb = object_id(ObjectType.BLOB, a), object_id(ObjectType.BLOB, b)
    tree_body = Tree.build([TreeEntry(MODE_FILE, b"b.txt", idb)]).serialize()
    commit = _commit_of(object_id(ObjectType.TREE, tree_body))
    dropped = _staged([("a", ObjectType.BLOB, a, None), ("b", ObjectType.BLOB, b, ida),
                       ("t", ObjectType.TREE, tree_body, None),
                       ("c", ObjectType.COMMIT, commit, None)])  # fmt: skip
    cid = object_id(ObjectType.COMMIT, commit)
    assert _both_plans(monkeypatch, dropped, [cid], EMPTY_SNAPSHOT).dropped == 1
    snapshot = MapSnapshot({ida: (ObjectType.BLOB, a)})
    assert _both_plans(monkeypatch, dropped, [cid], snapshot).external_oids == (ida,)
    # Full entries over pack_stream_threshold_bytes end their runs and are copied in pieces.
    import enroute_core.engine.ingest as ingest_module

    copied = 0
    copy_entry = ingest_module._copy_entry

    def counted(*args: Any) -> None:
        nonlocal copied
        copied += 1
        copy_entry(*args)

    monkeypatch.setattr(ingest_module, "_copy_entry", counted)
    streamed = Limits(pack_stream_threshold_bytes=64)
    pack = pack_objects(repo.path)
    whole = _both_plans(monkeypatch, pack, tips, EMPTY_SNAPSHOT)
    assert copied == 0
    assert _both_plans(monkeypatch, pack, tips, EMPTY_SNAPSHOT, streamed) == whole
    assert copied > 0


def test_compiled_bases_first_matches_the_reference() -> None:
    """``entry_plan.bases_first`` against ``_bases_first`` on random base links: chains in
    and out of the kind, bases outside the pack's objects, repeats and cycles."""
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    for _ in range(200):
        n = rng.randrange(1, 40)
        oids = [ObjectId(hashlib.sha1(b"%d %d" % (n, i)).digest()) for i in range(n)]
        outside = ObjectId(hashlib.sha1(b"outside").digest())
        objects = tuple(
            PackObjectInfo(i, oid, 3, 1, 1, 1, 0, rng.choice([None, outside, *oids]), 7, 22)
            for i, oid in enumerate(oids)
        )
        by_oid = {oid: i for i, oid in enumerate(oids)}
        members = set(rng.sample(oids, rng.randrange(n + 1)))
        # the others placed with another kind, or not placed: neither is a member
        placed = {o: Kind.TREE if o in members else Kind.BLOB for o in oids if rng.random() < 0.8}
        placed.update(dict.fromkeys(members, Kind.TREE))
        order = [o for o in oids if o in members]
        rng.shuffle(order)
        if order and rng.random() < 0.2:
            order.append(rng.choice(order))  # a repeat: placed once

        bases = {oid: info.base_oid for oid, info in zip(oids, objects, strict=True)}
        want = _bases_first(order, bases.__getitem__, members.__contains__)
        columns = PackObjects.from_infos(objects).columns
        assert bases_first(order, by_oid, columns, placed, Kind.TREE) == want
