"""Trees dropped from ingest's body cache go to a spill file and come back from it
(engine/bodies.py ``BodyCache``; docs/ingest.md, "Speed").

The segment diff reads each new tree and its parents' trees in commit order; the
pack holds them in its own order, deltified against one another (gitformat-pack,
"Deltified representation"). Without the spill, a tree the cache dropped is rebuilt
along its delta chain each time it is read again: on the large profile, 189,443
rebuilds of 987,379 entries. With it, no tree is rebuilt from the pack after
indexing, and the layer is the same byte for byte.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_core.engine.bodies import _SPILL_WRITE_BYTES, BodyCache, ObjectBodies
from enroute_core.engine.ingest import ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT
from enroute_core.git.object_type import ObjectType
from enroute_core.git.source import BytesSource
from enroute_core.storage.localfile import ScratchFile
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo, pack_objects

# Wide trees edited often, so that the trees outgrow a small cache.
_SPEC = RepoSpec(seed=11, commits=60, branches=2, merge_every=5, files=30, file_bytes=400,
                 wide_files=300, wide_edit_rate=0.5, annotated_tags=1)  # fmt: skip
_SMALL = replace(DEFAULT_LIMITS, ingest_body_cache_bytes_max=256 * 1024)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("spill") / "r.git", _SPEC)


def _tips(repo: GeneratedRepo) -> list[ObjectId]:
    return [oid_from_hex(v) for v in repo.refs.values()]


def test_a_dropped_tree_is_read_back_from_the_spill(tmp_path: Path) -> None:
    made: list[ScratchFile] = []

    def spill() -> ScratchFile:
        made.append(ScratchFile(tmp_path, "trees"))
        return made[-1]

    cache = BodyCache(100, spill)
    cache.put(ObjectId(b"a" * 20), ObjectType.TREE, b"x" * 60)
    cache.put(ObjectId(b"b" * 20), ObjectType.BLOB, b"y" * 60)  # drops tree a: spilled
    assert len(made) == 1 and cache.spilled_bytes == 60
    cache.put(ObjectId(b"c" * 20), ObjectType.TREE, b"z" * 60)  # drops blob b: not spilled
    assert cache.spilled_bytes == 60
    assert cache.get(ObjectId(b"b" * 20)) is None
    assert cache.get(ObjectId(b"a" * 20)) == (ObjectType.TREE, b"x" * 60)  # back in the LRU
    # over the bound: straight to the spill
    cache.put(ObjectId(b"d" * 20), ObjectType.TREE, b"w" * 200)
    assert cache.get(ObjectId(b"d" * 20)) == (ObjectType.TREE, b"w" * 200)
    assert cache.spilled_bytes == 60 + 60 + 200  # c dropped by a's return; a not twice
    path = made[0].path
    assert os.path.exists(path)
    cache.close()
    assert not os.path.exists(path)
    assert cache.get(ObjectId(b"d" * 20)) is None  # only the spill had it
    cache.put(ObjectId(b"e" * 20), ObjectType.TREE, b"v" * 200)
    assert len(made) == 1  # no spill is made after close


def test_a_tree_read_back_is_dropped_again_without_asking_where_it_was_spilled(
    tmp_path: Path,
) -> None:
    """The segment diff reads spilled trees back by the hundred thousand and drops them
    again: a drop of one read back writes nothing and asks no oid index (the large
    profile's push paid a second for those questions)."""
    a, b, c = (ObjectId(x * 20) for x in (b"a", b"b", b"c"))
    asked: list[ObjectId] = []

    def index_of(oid: ObjectId) -> int | None:
        asked.append(oid)
        return {a: 0, b: 1, c: 2}.get(oid)

    cache = BodyCache(100, lambda: ScratchFile(tmp_path, "trees"))
    cache.index_spills(index_of, 3)
    cache.put(a, ObjectType.TREE, b"x" * 60)
    cache.put(b, ObjectType.TREE, b"y" * 60)  # drops a: spilled
    assert cache.get(a) == (ObjectType.TREE, b"x" * 60)  # drops b: spilled; a read back
    asked.clear()
    cache.put(c, ObjectType.TREE, b"z" * 60)  # drops a again
    assert a not in asked and cache.spilled_bytes == 120
    assert cache.get(a) == (ObjectType.TREE, b"x" * 60)  # still in the spill
    cache.close()


def test_spilled_trees_are_written_in_large_writes_and_read_from_file_and_buffer(
    tmp_path: Path,
) -> None:
    """Trees go to the file a write of about ``_SPILL_WRITE_BYTES`` at a time (one write per
    tree was 277,265 system calls on the large profile): a tree is read back from the file
    once its write is done and from the buffer before."""
    made: list[ScratchFile] = []

    def spill() -> ScratchFile:
        made.append(ScratchFile(tmp_path, "trees"))
        return made[-1]

    cache = BodyCache(100, spill)
    bodies = {ObjectId(i.to_bytes(20, "big")): os.urandom(9000 + i) for i in range(300)}
    for oid, body in bodies.items():  # each over the bound: straight to the spill
        cache.put(oid, ObjectType.TREE, body)
    total = sum(map(len, bodies.values()))
    written = made[0].size
    assert 0 < written < total and total - written < _SPILL_WRITE_BYTES
    assert written >= _SPILL_WRITE_BYTES and cache.spilled_bytes == total
    for oid, body in reversed(bodies.items()):  # the buffered ones first, then the file's
        assert cache.get(oid) == (ObjectType.TREE, body)
    cache.close()


def test_without_a_spill_nothing_is_written() -> None:
    cache = BodyCache(100)
    cache.put(ObjectId(b"a" * 20), ObjectType.TREE, b"x" * 60)
    cache.put(ObjectId(b"b" * 20), ObjectType.TREE, b"y" * 60)
    assert cache.spilled_bytes == 0 and cache.get(ObjectId(b"a" * 20)) is None
    cache.close()


def test_ingest_with_a_spill_rebuilds_no_tree_and_writes_the_same_layer(
    repo: GeneratedRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = BytesSource(pack_objects(repo.path))
    rebuilt: list[int] = []
    from_pack = ObjectBodies._from_pack

    def counted(self: ObjectBodies, index: int) -> tuple[ObjectType, bytes]:
        found = from_pack(self, index)
        if found[0] is ObjectType.TREE:
            rebuilt.append(index)
        return found

    monkeypatch.setattr(ObjectBodies, "_from_pack", counted)
    plain = ingest_pack(pack, _tips(repo), EMPTY_SNAPSHOT, limits=_SMALL)
    assert rebuilt, "the trees must outgrow the cache for this test to mean anything"
    rebuilt.clear()
    made: list[ScratchFile] = []

    def spill() -> ScratchFile:
        made.append(ScratchFile(tmp_path, "trees"))
        return made[-1]

    spilled = ingest_pack(pack, _tips(repo), EMPTY_SNAPSHOT, limits=_SMALL, spill=spill)
    assert rebuilt == []
    assert len(made) == 1 and not os.path.exists(made[0].path)  # removed when ingest ends
    assert spilled.data == plain.data
    assert spilled.spilled_bytes > 0 and plain.spilled_bytes == 0
    assert spilled.new_commits == plain.new_commits


def test_a_shrunk_cache_keeps_the_most_recent_within_its_new_bound(tmp_path: Path) -> None:
    """Ingest shrinks the body cache before writing the layer (the walk's trees are not
    read again; docs/ingest.md, "Memory"): what is over the new bound goes, least recent
    first, a tree to the spill; closing keeps the spilled count the push reports."""
    a, b, c, d = (ObjectId(bytes([x]) * 20) for x in b"abcd")
    cache = BodyCache(300, lambda: ScratchFile(tmp_path, "trees"))
    cache.put(a, ObjectType.BLOB, b"x" * 60)
    cache.put(b, ObjectType.TREE, b"y" * 60)
    cache.put(c, ObjectType.BLOB, b"z" * 60)
    assert cache.get(a) is not None  # now the most recent
    cache.shrink(100)
    assert cache.spilled_bytes == 60  # tree b, dropped
    assert cache.get(c) is None  # blob c, dropped
    assert cache.get(a) == (ObjectType.BLOB, b"x" * 60)
    cache.shrink(1000)  # never grows back
    cache.put(d, ObjectType.BLOB, b"w" * 60)
    assert cache.get(a) is None
    cache.close()
    assert cache.spilled_bytes == 60 and cache.get(d) is None


def test_spilled_places_by_pack_index_read_back_the_same(tmp_path: Path) -> None:
    """Once ingest has its oid index, spilled places live in an array by pack index
    (``index_spills``; docs/ingest.md, "Memory"): trees spilled before and after, in the
    pack or not, come back the same."""
    a, b, c, d = (ObjectId(bytes([x]) * 20) for x in b"abcd")
    cache = BodyCache(100, lambda: ScratchFile(tmp_path, "trees"))
    cache.put(a, ObjectType.TREE, b"x" * 60)
    cache.put(d, ObjectType.TREE, b"w" * 60)  # a spilled, under the dict
    cache.index_spills({a: 0, b: 1, c: 2}.get, 3)  # d is not in the pack
    cache.put(b, ObjectType.TREE, b"y" * 60)  # d spilled: by oid
    cache.put(c, ObjectType.TREE, b"z" * 60)  # b spilled: by index
    assert cache.spilled_bytes == 180
    assert cache.get(a) == (ObjectType.TREE, b"x" * 60)
    assert cache.get(b) == (ObjectType.TREE, b"y" * 60)
    assert cache.get(d) == (ObjectType.TREE, b"w" * 60)
    assert cache.spilled_bytes == 180 + 60  # c dropped and spilled once, not again
    cache.close()


def test_a_step_that_reads_each_tree_once_keeps_no_read_back(tmp_path: Path) -> None:
    """``shrink(read_backs=False)``, ingest's writing step: the trees read back from the
    spill leave the LRU, and those read from now on are answered without being kept."""
    a, b, c = (ObjectId(x * 20) for x in (b"a", b"b", b"c"))
    cache = BodyCache(100, lambda: ScratchFile(tmp_path, "trees"))
    cache.put(a, ObjectType.TREE, b"x" * 60)
    cache.put(b, ObjectType.TREE, b"y" * 60)  # drops a: spilled
    assert cache.get(a) == (ObjectType.TREE, b"x" * 60)  # drops b; a read back, kept
    cache.put(c, ObjectType.BLOB, b"z" * 30)  # a body the step made: kept
    cache.shrink(100, read_backs=False)
    assert cache._items.keys() == {c}
    assert cache.get(b) == (ObjectType.TREE, b"y" * 60)
    assert cache.get(a) == (ObjectType.TREE, b"x" * 60)
    assert cache._items.keys() == {c} and cache.get(c) == (ObjectType.BLOB, b"z" * 30)
    cache.close()


def test_ingest_gives_the_free_heap_back_while_it_walks_and_writes(
    repo: GeneratedRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connectivity and writing steps free as they go, in pieces the heap keeps: they
    give it back every ``_TRIM_COMMITS`` commits and ``_TRIM_RUNS`` runs (the large
    profile's writing step peaked 66 MiB lower)."""
    import enroute_core.engine.ingest as ingest_module

    trims: list[str] = []
    monkeypatch.setattr(ingest_module, "_give_back", lambda: trims.append("trim"))
    monkeypatch.setattr(ingest_module, "_TRIM_COMMITS", 1)
    monkeypatch.setattr(ingest_module, "_TRIM_RUNS", 1 << 30)
    monkeypatch.setattr(ingest_module, "_RUN_BYTES", 4096)
    pack = pack_objects(repo.path)
    result = ingest_pack(BytesSource(pack), _tips(repo), EMPTY_SNAPSHOT)
    walking = len(trims)
    assert walking >= len(result.new_commits)  # one a commit, and the steps' own
    trims.clear()
    monkeypatch.setattr(ingest_module, "_TRIM_RUNS", 1)
    ingest_pack(BytesSource(pack), _tips(repo), EMPTY_SNAPSHOT)
    assert len(trims) > walking + 1  # one a run of 4 KiB as well
