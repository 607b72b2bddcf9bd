"""Seed 004, "Files and tiers", "Linked local copies", "Never waiting on the object store"."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.base.errors import CorruptData, NotLocal
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import GiB, MiB
from enroute_core.git.pack import encode_entry_header as header
from enroute_core.storage.layer import CHUNK_BYTES, Kind, LayerEntry, SealedLayer, write_layer
from enroute_core.storage.layers import LayerService, open_inline
from enroute_core.storage.loads import LoadGate, coalesce
from enroute_core.storage.localfile import ScratchFile
from enroute_core.storage.objectstore import StoreOptions
from enroute_core.storage.objectstore.file import FileStore
from enroute_core.storage.objectstore.s3 import S3Store
from enroute_testing.faultproxy import FaultKind, FaultProxy, FaultRule
from enroute_testing.s3servers import S3Endpoint, create_bucket, moto_server

BUCKET = "enroute-tiers"


def make_layer(
    blobs: int, blob_bytes: int, seed: int = 7
) -> tuple[bytes, SealedLayer, list[bytes]]:
    """A pushed layer of ``blobs`` random blob entries (payloads are never inflated here)."""
    rng = random.Random(seed)
    entries = []
    for _ in range(blobs):
        payload = rng.randbytes(blob_bytes)
        entry = header(3, blob_bytes) + payload
        entries.append(
            LayerEntry(ObjectId(rng.randbytes(20)), Kind.BLOB, entry, blob_bytes, None, 0)
        )
    data, sealed = write_layer(entries)
    return data, sealed, [e.entry for e in entries]


class Counting:
    """Ranged GETs seen by a store: count, ranges and the highest concurrency."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.now = 0
        self.peak = 0
        self.delay_s = 0.0

    async def around(self, start: int | None, end: int | None, call: object) -> bytes:
        self.ranges.append((start or 0, -1 if end is None else end))
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return await call  # type: ignore[misc, no-any-return]
        finally:
            self.now -= 1


class CountingS3Store(S3Store):
    counting: Counting

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        return await self.counting.around(start, end, super().get(key, start=start, end=end))


class CountingFileStore(FileStore):
    counting: Counting

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        return await self.counting.around(start, end, super().get(key, start=start, end=end))


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[S3Endpoint]:
    with moto_server() as endpoint:
        create_bucket(endpoint, BUCKET)
        yield endpoint


@pytest.fixture(scope="session")
def proxy(moto_endpoint: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint.host, moto_endpoint.port) as p:
        yield p


def s3_store(endpoint: S3Endpoint, proxy: FaultProxy, prefix: str) -> CountingS3Store:
    opts = StoreOptions(
        endpoint_url=proxy.url,
        region=endpoint.region,
        access_key_id=endpoint.access_key_id,
        secret_access_key=endpoint.secret_access_key,
        backoff_base_ms=1,
        backoff_max_ms=5,
    )
    store = CountingS3Store(BUCKET, prefix, opts, rng=random.Random(0))
    store.counting = Counting()
    return store


def file_store(root: str) -> CountingFileStore:
    store = CountingFileStore(root, StoreOptions(fsync=False))
    store.counting = Counting()
    return store


def prefix_of(request: pytest.FixtureRequest) -> str:
    return "t-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]


KEY = "repos/r1/layers/0001"
SMALL = make_layer(6, 600_000)  # about 3.5 MiB: chunks 0..2 data, metadata in the last
BIG = make_layer(40, 1_000_000)  # about 38 MiB


def test_coalesce_bounds_runs() -> None:
    assert coalesce([5, 1, 2, 3, 9], 2) == [range(1, 3), range(3, 4), range(5, 6), range(9, 10)]
    assert coalesce(range(40), 16) == [range(0, 16), range(16, 32), range(32, 40)]
    assert coalesce([], 16) == []


@pytest.mark.asyncio
async def test_remote_open_is_one_ranged_read_and_reads_need_loads(
    request: pytest.FixtureRequest, moto_endpoint: S3Endpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data, sealed, entries = SMALL
    store = s3_store(moto_endpoint, proxy, prefix_of(request))
    await store.put(KEY, data)
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=GiB)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    data_end = sealed.file_size - sealed.meta_size
    assert store.counting.ranges == [(data_end - data_end % CHUNK_BYTES, sealed.file_size)]
    r = layer.reader
    oids = [r.record(i).oid for i in range(r.object_count)]
    assert [r.lookup(o) for o in oids] == list(range(len(entries)))  # no further GET
    assert len(store.counting.ranges) == 1
    with pytest.raises(NotLocal):
        layer.entry_bytes(0)
    need = layer.chunks_needed(r.record(0).offset, r.record(0).length)
    assert need == [0]
    # concurrent loads of the same chunks fetch each chunk once
    await asyncio.gather(*(svc.load(layer, local_indexes=range(6)) for _ in range(5)))
    fetched = [
        c
        for s, e in store.counting.ranges[1:]
        for c in range(s // CHUNK_BYTES, -(-e // CHUNK_BYTES))
    ]
    assert sorted(fetched) == sorted(set(fetched)) == list(range(data_end // CHUNK_BYTES))
    assert [layer.entry_bytes(i) for i in range(6)] == entries
    assert layer.chunks_needed(0, 10) == []
    # the same layer opened twice at once: one opener
    again = await asyncio.gather(
        *(svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size) for _ in range(3))
    )
    assert all(a is layer for a in again)
    await svc.close()
    await store.close()


@pytest.mark.asyncio
async def test_loads_coalesce_into_16_mib_ranges(
    request: pytest.FixtureRequest, moto_endpoint: S3Endpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data, sealed, entries = BIG
    store = s3_store(moto_endpoint, proxy, prefix_of(request))
    await store.put(KEY, data)
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=GiB)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    await svc.load(layer, local_indexes=range(len(entries)))
    loads = store.counting.ranges[1:]
    data_chunks = (sealed.file_size - sealed.meta_size) // CHUNK_BYTES
    assert len(loads) == -(-data_chunks // 16) == 3
    assert all(e - s <= 16 * MiB for s, e in loads)
    assert layer.entry_bytes(39) == entries[39] and layer.entry_bytes(0) == entries[0]
    fetched = sum(e - s for s, e in store.counting.ranges)
    assert svc.stats().bytes_fetched == fetched
    await svc.close()
    await store.close()


@pytest.mark.asyncio
async def test_at_most_8_loads_in_flight(tmp_path: Path) -> None:
    data, sealed, entries = BIG
    shm = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"
    store = file_store(str(shm))  # another filesystem: no links, real ranged reads
    try:
        await store.put(KEY, data)
        store.counting.delay_s = 0.02
        gate = LoadGate(range_bytes_max=CHUNK_BYTES)
        svc = LayerService(store, tmp_path / "node", disk_budget_bytes=GiB, gate=gate)
        layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
        assert not layer.linked and not svc.stats().linking
        await svc.load(layer, local_indexes=range(len(entries)))
        assert store.counting.peak == 8
        assert (
            len(store.counting.ranges) == 1 + (sealed.file_size - sealed.meta_size) // CHUNK_BYTES
        )
        assert [layer.entry_bytes(i) for i in range(len(entries))] == entries
        await svc.close()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.asyncio
async def test_flipped_bytes_fail_the_chunk_hash(
    request: pytest.FixtureRequest, moto_endpoint: S3Endpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data, sealed, entries = SMALL
    prefix = prefix_of(request)
    store = s3_store(moto_endpoint, proxy, prefix)
    await store.put(KEY, data)
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=GiB)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    flip = FaultRule(FaultKind.FLIP, method="GET", path_contains=prefix, times=1)
    with proxy.rules(flip):
        await svc.load(layer, local_indexes=[0])
    assert svc.stats().hash_retries == 1 and layer.entry_bytes(0) == entries[0]
    flip2 = FaultRule(FaultKind.FLIP, method="GET", path_contains=prefix, times=2)
    with proxy.rules(flip2), pytest.raises(CorruptData):
        await svc.load(layer, local_indexes=[5])
    with pytest.raises(NotLocal):
        layer.entry_bytes(5)
    with proxy.rules(FaultRule(FaultKind.STATUS, method="GET", path_contains=prefix, times=2)):
        await svc.load(layer, local_indexes=[5])
    assert layer.entry_bytes(5) == entries[5]
    await svc.close()
    await store.close()


@pytest.mark.asyncio
async def test_restart_rechecks_recorded_chunks(
    request: pytest.FixtureRequest, moto_endpoint: S3Endpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data, sealed, entries = SMALL
    store = s3_store(moto_endpoint, proxy, prefix_of(request))
    await store.put(KEY, data)
    node = tmp_path / "node"
    svc = LayerService(store, node, disk_budget_bytes=GiB)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    await svc.load(layer, local_indexes=[0, 5])  # chunks 0 and 2 (and the metadata)
    path = layer.copy.path
    await svc.close()
    with open(path, "r+b") as f:  # corrupt chunk 0 on disk
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))
    store.counting.ranges.clear()
    svc2 = LayerService(store, node, disk_budget_bytes=GiB)
    layer2 = await svc2.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert store.counting.ranges == []  # metadata was local and passed its checks
    with pytest.raises(NotLocal):
        layer2.entry_bytes(5)  # recorded, not yet checked
    await svc2.load(layer2, local_indexes=[0, 5])
    assert store.counting.ranges == [(0, CHUNK_BYTES)]  # only the bad chunk came again
    assert svc2.stats().chunks_dropped == 1
    assert layer2.entry_bytes(0) == entries[0] and layer2.entry_bytes(5) == entries[5]
    await svc2.close()
    await store.close()


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.asyncio
async def test_linked_copies_share_the_inode(tmp_path: Path) -> None:
    data, sealed, entries = SMALL
    store = file_store(str(tmp_path / "store"))
    svc = LayerService(store, tmp_path / "node")
    await svc.publish("r1", KEY, data)
    assert svc.stats().links == 1
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    stored = os.stat(store.path_of(KEY))
    assert layer.linked and os.stat(layer.copy.path).st_ino == stored.st_ino
    assert fcntl.fcntl(layer.copy.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    assert [layer.entry_bytes(i) for i in range(6)] == entries
    assert store.counting.ranges == []
    # a fresh node links on open
    svc2 = LayerService(store, tmp_path / "node2")
    layer2 = await svc2.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert layer2.linked and os.stat(layer2.copy.path).st_ino == stored.st_ino
    assert svc2.stats().links == 1 and store.counting.ranges == []
    await svc.close()
    await svc2.close()


@pytest.mark.asyncio
async def test_exdev_falls_back_to_a_hydrated_copy(tmp_path: Path, shm_dir: Path) -> None:
    data, sealed, entries = SMALL
    store = file_store(str(shm_dir))
    await store.put(KEY, data)
    svc = LayerService(store, tmp_path / "node")  # no disk budget: hydrate
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert not layer.linked and not svc.stats().linking and svc.stats().links == 0
    assert os.stat(layer.copy.path).st_ino != os.stat(store.path_of(KEY)).st_ino
    await svc.wait_hydrated()
    assert svc.stats().hydrations == 1 and layer.copy.complete()
    assert [layer.entry_bytes(i) for i in range(6)] == entries
    await svc.close()


@pytest.mark.asyncio
async def test_published_copy_has_every_chunk_without_links(tmp_path: Path, shm_dir: Path) -> None:
    data, sealed, entries = SMALL
    store = file_store(str(shm_dir))
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=GiB)
    await svc.publish("r1", KEY, data)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert not layer.linked and layer.copy.complete()
    assert [layer.entry_bytes(i) for i in range(6)] == entries
    assert store.counting.ranges == []
    await svc.close()


class UnlinkableFileStore(CountingFileStore):
    """A file store where a link cannot be made again (as after EXDEV or EMLINK)."""

    @property
    def linking(self) -> bool:
        return False

    async def link_local(self, key: str, dest_path: str | os.PathLike[str]) -> bool:
        return False


@pytest.mark.asyncio
async def test_an_old_link_is_trusted_only_when_it_shares_the_stored_inode(
    tmp_path: Path,
) -> None:
    """Seed 004, "Linked local copies": "If a link cannot be made again but the old one
    shares the inode of the stored file, the node opens it as linked, never for
    writing." A copy recorded as linked that is another file is never read."""
    data, sealed, entries = SMALL
    store = file_store(str(tmp_path / "store"))
    node = tmp_path / "node"
    svc = LayerService(store, node)
    await svc.publish("r1", KEY, data)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    path = layer.copy.path
    await svc.close()
    stored = os.stat(store.path_of(KEY))

    unlinkable = UnlinkableFileStore(str(tmp_path / "store"), StoreOptions(fsync=False))
    unlinkable.counting = Counting()
    svc = LayerService(unlinkable, node, disk_budget_bytes=GiB)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert layer.linked and os.stat(layer.copy.path).st_ino == stored.st_ino
    assert fcntl.fcntl(layer.copy.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    assert [layer.entry_bytes(i) for i in range(6)] == entries
    assert unlinkable.counting.ranges == []
    await svc.close()

    # the recorded link is now another file (same length, one byte flipped)
    flipped = bytearray(data)
    flipped[100] ^= 0x40
    os.unlink(path)
    Path(path).write_bytes(bytes(flipped))
    svc = LayerService(unlinkable, node, disk_budget_bytes=GiB)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert not layer.linked and os.stat(layer.copy.path).st_ino != stored.st_ino
    with pytest.raises(NotLocal):
        layer.entry_bytes(0)  # nothing of the old file is readable
    await svc.load(layer, local_indexes=range(6))
    assert [layer.entry_bytes(i) for i in range(6)] == entries  # from the store
    await svc.close()

    # a node that can link again makes the link anew over the other file
    svc = LayerService(store, tmp_path / "node2")
    await svc.publish("r1", KEY, data)  # records a link under node2
    path2 = svc.path_of(svc.name_of("r1", KEY))
    await svc.close()
    os.unlink(path2)
    Path(path2).write_bytes(bytes(flipped))
    svc = LayerService(store, tmp_path / "node2")
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert layer.linked and os.stat(layer.copy.path).st_ino == stored.st_ino
    assert [layer.entry_bytes(i) for i in range(6)] == entries
    await svc.close()
    await store.close()


def test_an_inline_layer_opens_only_when_its_bytes_match_the_root() -> None:
    """Seed 004, "Storage service", Read: an inline layer is opened from its bytes in
    the log "after it checks them against the root"; a mismatch is CorruptData."""
    data, sealed, entries = SMALL
    reader = open_inline(data, sealed.root, sealed.meta_size)
    assert reader.entry_bytes(3) == entries[3]
    flipped = bytearray(data)
    flipped[100] ^= 0x01  # a data byte: the metadata's own checks would not see it
    with pytest.raises(CorruptData) as err:
        open_inline(bytes(flipped), sealed.root, sealed.meta_size)
    assert err.value.section == "inline"


@pytest.mark.asyncio
async def test_a_linked_chunk_that_fails_its_hash_is_a_typed_error(tmp_path: Path) -> None:
    """Seed 004, "Linked local copies": "A chunk that fails its hash is not repaired.
    The bytes of the store are the same bytes": the read fails with CorruptData,
    nothing is fetched, and the read-only copy is never written."""
    data, sealed, entries = SMALL
    store = file_store(str(tmp_path / "store"))
    svc = LayerService(store, tmp_path / "node")
    await svc.publish("r1", KEY, data)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert layer.linked
    await svc.close()
    os.chmod(store.path_of(KEY), 0o644)
    with open(store.path_of(KEY), "r+b") as f:  # the stored file: the same inode
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=GiB)
    layer = await svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size)
    assert layer.linked
    await svc.load(layer, local_indexes=[0])  # a linked copy has every chunk: no load
    with pytest.raises(CorruptData) as err:
        layer.entry_bytes(0)
    assert err.value.details.get("chunk") == 0
    assert layer.entry_bytes(5) == entries[5]  # chunk 2 is sound
    assert store.counting.ranges == [] and svc.stats().chunks_fetched == 0
    await svc.close()
    await store.close()


class StoppedWhileLinking(CountingFileStore):
    """A file store whose link into scratch is made, then the node stops before the
    rename into place (the open is cancelled there, as a shutdown cancels it)."""

    made: asyncio.Event

    async def link_local(self, key: str, dest_path: str | os.PathLike[str]) -> bool:
        assert await super().link_local(key, dest_path)
        self.made.set()
        await asyncio.Event().wait()  # until cancelled
        raise AssertionError("not reached")


def _scratch_names(node: Path) -> list[str]:
    return sorted(p.name for p in (node / "scratch").iterdir())


@pytest.mark.asyncio
async def test_a_link_cut_short_by_shutdown_leaves_no_scratch_file(tmp_path: Path) -> None:
    """Seed 004, "Linked local copies": the link is made under scratch, then renamed
    into place. A shutdown between the two (the open cancelled) used to leave the
    ``link-*`` name behind, a second name of a whole layer, for good."""
    data, sealed, _ = SMALL
    await file_store(str(tmp_path / "store")).put(KEY, data)
    store = StoppedWhileLinking(str(tmp_path / "store"), StoreOptions(fsync=False))
    store.counting = Counting()
    store.made = asyncio.Event()
    node = tmp_path / "node"
    svc = LayerService(store, node)
    opening = asyncio.ensure_future(svc.open_layer("r1", KEY, sealed.file_size, sealed.meta_size))
    await store.made.wait()
    assert [n for n in _scratch_names(node) if n.startswith("link-")], "no link was made"
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    await svc.close()
    assert _scratch_names(node) == []


@pytest.mark.asyncio
async def test_scratch_files_of_an_earlier_run_go_at_start(tmp_path: Path) -> None:
    """Scratch holds files for one operation ("Storage service"); those of a run that
    stopped during one (a crash, a shutdown mid-link) go when the node starts again,
    and nothing of this process's own operations does."""
    node = tmp_path / "node"
    scratch = node / "scratch"
    scratch.mkdir(parents=True)
    other = os.getpid() + 1
    left = {
        "link-0123456789abcdef": b"x" * 10,  # a link of a run before names held a pid
        f"link-{other}-3-0a0b0c0d": b"y" * 20,
        f"pub-{other}-0-01020304": b"z" * 30,
        f"push-{other}-7-deadbeef": b"w" * 40,
    }
    for name, body in left.items():
        (scratch / name).write_bytes(body)
    ours = ScratchFile(scratch, "push")
    ours.append(b"in use")
    svc = LayerService(file_store(str(tmp_path / "store")), node)
    assert svc.scratch_leftovers == (4, 100)
    assert _scratch_names(node) == [os.path.basename(ours.path)]
    ours.close()
    await svc.close()
