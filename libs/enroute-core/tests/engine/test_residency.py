"""Reads that load first (seed 004, "Never waiting on the object store", Machines; "Disk
budget", Pins and "Intent steers eviction").

A generated repository is ingested into one pushed layer. The same layer is read
two ways: from its bytes in memory (every byte here: the fast path, no loads) and
through a :class:`LayerService` that opened it remotely (a ``file://`` store on
another filesystem, so no link) under a disk budget smaller than the layer, so
that nothing but the metadata is local at first. Whatever is served the cold way
must equal what the local way serves, every load must come from the driver
(``storage.machines.drive``), a blobless pack must load no chunk that only blobs
occupy, a tree walk must take one load round per level, and every pin must be
released at the end.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyroaring import BitMap

from enroute_core.base.errors import NotLocal
from enroute_core.base.ids import LogIndex, ObjectId
from enroute_core.engine import serve
from enroute_core.engine.ingest import ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT
from enroute_core.engine.view import View, tree_children
from enroute_core.git.source import BytesSource
from enroute_core.state.model import LayerEntry, LayerKind
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.layer import Kind, LayerReader
from enroute_core.storage.layers import LayerService
from enroute_core.storage.machines import Restartable, drive
from enroute_core.storage.objectstore import StoreOptions
from enroute_core.storage.objectstore.file import FileStore
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects

KEY = "L/one"


class RecordingStore(FileStore):
    """Records the range of every GET: what was fetched, chunk by chunk."""

    gets: list[tuple[int, int]]

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        data = await super().get(key, start=start, end=end)
        self.gets.append((start or 0, (start or 0) + len(data)))
        return data


def _fetched(store: RecordingStore) -> set[int]:
    return {c for s, e in store.gets for c in range(s // CHUNK_BYTES, -(-e // CHUNK_BYTES))}


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, LayerEntry, list[ObjectId]]:
    """(layer bytes, its manifest entry, the tips) of a generated repository."""
    work = tmp_path_factory.mktemp("repo")
    spec = RepoSpec(seed=18, commits=40, files=30, file_bytes=60_000, binary_files=3)
    repo = generate_repo(work / "r.git", spec)
    tips = [ObjectId(bytes.fromhex(v.decode())) for v in set(repo.refs.values())]
    result = ingest_pack(BytesSource(pack_objects(repo.path)), tips, EMPTY_SNAPSHOT, fsck=None)
    assert result.data is not None and result.sealed is not None
    sealed = result.sealed
    entry = LayerEntry(
        kind=LayerKind.STORED,
        first_id=0,
        id_count=sealed.id_count,
        object_count=sealed.object_count,
        upload_gen=1,
        file_size=sealed.file_size,
        meta_size=sealed.meta_size,
        root=sealed.root,
        pin=LogIndex(0),
    )
    return result.data, entry, tips


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def _cold(
    data: bytes, entry: LayerEntry, node: Path, store_dir: Path
) -> tuple[LayerService, View, RecordingStore]:
    store = RecordingStore(str(store_dir), StoreOptions(fsync=False))
    store.gets = []
    await store.put(KEY, data)
    svc = LayerService(store, node, disk_budget_bytes=CHUNK_BYTES)
    opened = await svc.open_layer("r", KEY, entry.file_size, entry.meta_size)
    assert not opened.linked and not opened.reader.settled()
    return svc, View([(entry, opened.reader)]), store


def _local(data: bytes, entry: LayerEntry) -> View:
    reader = LayerReader.open(BytesSource(data), meta_size=entry.meta_size)
    view = View([(entry, reader)])
    assert view.settled()
    return view


def _pack(view: View, plan: serve.PackPlan) -> bytes:
    out: list[bytes] = []
    serve.write_pack(view, plan, out.append)
    return b"".join(out)


def _meta_bytes(entry: LayerEntry) -> int:
    data_end = entry.file_size - entry.meta_size
    return entry.file_size - (data_end - data_end % CHUNK_BYTES)


@pytest.mark.asyncio
@pytest.mark.parametrize("spec", ["full", "blobless", "depth1", "tree0"])
async def test_a_cold_pack_is_the_local_pack(
    layer: tuple[bytes, LayerEntry, list[ObjectId]], tmp_path: Path, shm_dir: Path, spec: str
) -> None:
    data, entry, tips = layer
    assert entry.file_size > 3 * CHUNK_BYTES  # several chunks, a budget of one
    local = _local(data, entry)
    kwargs: dict[str, object] = {
        "full": {},
        "blobless": {"filter": serve.BlobNone()},
        "depth1": {"deepen": 1},
        "tree0": {"filter": serve.TreeDepth(0)},
    }[spec]
    plan = serve.plan_fetch(local, tips, **kwargs)  # type: ignore[arg-type]
    svc, cold, store = await _cold(data, entry, tmp_path / "node", shm_dir)
    # the plan needs loads on the cold view (depth-1 walks trees): a restartable step
    machine = Restartable(
        lambda: serve.plan_fetch(cold, tips, **kwargs),  # type: ignore[arg-type]
        rounds_max=64,
    )
    await drive(machine, svc)
    cold_plan = machine.result
    assert isinstance(cold_plan, serve.PackPlan) and cold_plan.ids == plan.ids
    out: list[bytes] = []
    pack = serve.PackMachine(cold, plan, out.append)
    stats = await drive(pack, svc)
    assert b"".join(out) == _pack(local, plan)
    assert stats.tickets >= 1
    disk = svc.stats().disk_budget
    assert disk is not None and disk.pinned_bytes == _meta_bytes(entry)  # every pin released
    if spec == "full":
        # "Intent steers eviction": a large pack streams as a scan, its chunks cold
        assert len(plan.ids) >= 256 and disk.evictions_scan > 0, (len(plan.ids), disk)
        assert disk.evictions_point == 0, disk
    if spec in ("blobless", "tree0"):
        # "A blobless or tree:0 fetch never loads blob chunks": no chunk that only
        # blobs occupy was fetched from the store
        reader = cold.layers[0][1]
        blob_only: set[int] = set()
        others: set[int] = set()
        for start, stop, kind in reader.kind_runs:
            if start < stop:
                first, last = reader.entry_row(start), reader.entry_row(stop - 1)
                span = reader.data_chunks_for(first[0], last[0] + last[1] - first[0])
                (blob_only if kind == Kind.BLOB else others).update(span)
        blob_only -= others
        assert blob_only, "the test needs chunks that only blobs occupy"
        assert not _fetched(store) & blob_only
    await svc.close()


@pytest.mark.asyncio
async def test_a_tree_walk_loads_one_level_per_round(
    layer: tuple[bytes, LayerEntry, list[ObjectId]], tmp_path: Path, shm_dir: Path
) -> None:
    data, entry, _ = layer
    local = _local(data, entry)
    roots = [c.tree_id for c in (local.commit(i) for i in local.kind_ids(Kind.COMMIT)) if c]
    expect = local.tree_closure(roots)
    depth = _tree_levels(local, roots)
    svc, cold, _ = await _cold(data, entry, tmp_path / "node", shm_dir)
    with pytest.raises(NotLocal) as raised:
        cold.tree_closure(roots)  # nothing loaded: the first level is named whole
    named = sum(len(ix) for _, ix in raised.value.loads)
    assert named >= len(set(roots)) > 1  # every root tree of the level, with its chain
    machine = Restartable(lambda: cold.tree_closure(roots), rounds_max=4096)
    stats = await drive(machine, svc)
    assert machine.result == expect
    assert 1 <= stats.tickets <= depth  # one round per level at most, not one per tree
    assert len(expect & local.kind_ids(Kind.TREE)) > depth
    disk = svc.stats().disk_budget
    assert disk is not None and disk.pinned_bytes == _meta_bytes(entry)
    await svc.close()


def _tree_levels(view: View, roots: list[int]) -> int:
    level, seen, depth = list(dict.fromkeys(roots)), BitMap(roots), 0
    trees = view.kind_ids(Kind.TREE)
    while level:
        depth += 1
        following = []
        for t in level:
            for kind, oid in tree_children(view.read_id(t)):
                child = view.id_of_oid(oid)
                if kind == Kind.TREE and child is not None and child in trees and child not in seen:
                    seen.add(child)
                    following.append(child)
        level = following
    return depth
