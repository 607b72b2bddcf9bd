"""Deleting a local copy of a layer that left every manifest (``LayerService.remove_copy``),
publishing the same layer twice (seed 004, "Files and tiers", "Storage service"), and a
published layer's chunks checked only while their state is unknown (seed 004, "Layers")."""

from __future__ import annotations

import asyncio
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.base.errors import CorruptData, PreconditionFailed
from enroute_core.base.ids import ObjectId
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.layer import Kind, LayerEntry, SealedLayer, write_layer
from enroute_core.storage.layer.reader import LayerReader
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore.file import FileStore

KEY = "repos/r/layers/1"


def _header(size: int) -> bytes:
    """A blob's pack entry header (gitformat-pack, "Object entries")."""
    byte = (3 << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def make_layer(seed: int, count: int = 8, size: int = 3000) -> tuple[bytes, SealedLayer]:
    rng = random.Random(seed)
    entries = []
    for _ in range(count):
        body = rng.randbytes(size)
        entry = _header(len(body)) + body
        entries.append(LayerEntry(ObjectId(rng.randbytes(20)), Kind.BLOB, entry, size, None, 0))
    return write_layer(entries)


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"  # another filesystem: no links
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("linked", [True, False])
def test_remove_copy_deletes_the_file_and_the_record_and_a_later_open_refetches(
    tmp_path: Path, shm_dir: Path, linked: bool
) -> None:
    data, sealed = make_layer(1)
    local = tmp_path / "node" if linked else shm_dir / "node"

    async def run() -> None:
        service = LayerService(FileStore(tmp_path / "store"), local)
        await service.publish("r", KEY, data)
        opened = await service.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        name = service.name_of("r", KEY)
        path = Path(service.path_of(name))
        assert path.exists() and service.catalog.get(name) is not None
        assert opened.linked is linked
        first_entry = opened.reader.entry_bytes(0)
        freed = await service.remove_copy("r", KEY)
        assert freed is not None and (freed == 0) is linked
        assert not path.exists() and service.catalog.get(name) is None
        assert await service.remove_copy("r", KEY) == 0  # nothing left: still fine
        again = await service.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        assert again is not opened
        pins = await service.load(again, ranges=[(0, sealed.file_size - sealed.meta_size)])
        assert again.reader.entry_bytes(0) == first_entry
        pins.release()
        assert again.reader.object_count == sealed.object_count
        await service.close()

    asyncio.run(run())


def test_publishing_the_same_layer_twice_is_fine_and_another_one_is_refused(
    tmp_path: Path,
) -> None:
    data, sealed = make_layer(2)
    other, _ = make_layer(3)

    async def run() -> None:
        service = LayerService(FileStore(tmp_path / "store"), tmp_path / "node")
        await service.publish("r", KEY, data)
        await service.publish("r", KEY, data)  # a concurrent push of the same objects
        spooled = tmp_path / "spooled"
        spooled.write_bytes(data)
        await service.publish("r", KEY, spooled)
        with pytest.raises(PreconditionFailed):
            await service.publish("r", KEY, other[:-1])  # another size under the key
        opened = await service.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        assert opened.reader.object_count == sealed.object_count
        await service.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("linked", "budget"), [(True, None), (False, None), (True, 1 << 20), (False, 1 << 20)]
)
def test_close_layer_keeps_the_copy_and_a_reopen_loads_metadata_only(
    tmp_path: Path, shm_dir: Path, linked: bool, budget: int | None
) -> None:
    """``close_layer`` (a view went: docs/fleet.md): the reader, its metadata and pool file
    go ("Files and tiers": opened layers are kept for reuse, not for good); the local copy
    stays and the re-open reads its metadata from it, without a request to the store
    ("Metadata is always local"). Under a disk budget a non-linked copy goes with its
    layer ("Disk budget": a closed copy would hold disk the budget no longer counts),
    and the re-open is one ranged read. Publishing under a budget with links on opens
    nothing (it held a descriptor and a budget registration per layer, and the first
    open then failed: "registered already")."""
    data, sealed = make_layer(2)
    local = tmp_path / "node" if linked else shm_dir / "node"

    async def run() -> None:
        service = LayerService(FileStore(tmp_path / "store"), local, disk_budget_bytes=budget)
        await service.publish("r", KEY, data)
        assert service.layers_open == 0
        if service.budget is not None:
            assert service.budget.stats().files == 0, "publish left a copy registered"
        opened = await service.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        pins = await service.load(opened, ranges=[(0, sealed.file_size - sealed.meta_size)])
        first_entry = opened.reader.entry_bytes(0)
        pins.release()
        assert service.layers_open == 1
        name = service.name_of("r", KEY)
        assert service.close_layer("r", KEY)
        assert service.layers_open == 0 and service.stats().layers_closed == 1
        assert service.layer_named(name) is None
        if service.budget is not None:
            assert service.budget.stats().files == 0
        goes = budget is not None and not linked
        assert Path(service.path_of(name)).exists() is not goes
        assert (service.catalog.get(name) is None) is goes
        gets = service.stats().gets
        again = await service.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        assert again is not opened and service.layers_open == 1
        assert service.stats().gets == gets + (1 if goes else 0)
        pins = await service.load(again, ranges=[(0, sealed.file_size - sealed.meta_size)])
        assert again.reader.entry_bytes(0) == first_entry
        pins.release()
        assert service.close_layer("r", "repos/r/layers/never-opened")
        await service.close()

    asyncio.run(run())


@pytest.mark.parametrize("linked", [True, False])
def test_a_layer_published_here_is_read_without_checking_its_data_chunks_again(
    tmp_path: Path, shm_dir: Path, linked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk hashes check "bytes read by range from the object store, and chunks of a
    local copy of unknown state (after a restart), before first use" (seed 004,
    "Layers"). A layer this process published is neither: its first reads check no
    data chunk (a SHA-256 of every byte of the first clone after a push, before). After
    a restart the linked copy is the stored file of unknown state: a byte changed in it
    is found on the first read."""
    data, sealed = make_layer(4, count=40, size=100_000)  # 4 MB: chunks 0-3 hold data only
    local = tmp_path / "node" if linked else shm_dir / "node"
    data_chunks = set(range((sealed.file_size - sealed.meta_size) // CHUNK_BYTES))
    assert len(data_chunks) >= 3
    checked: list[int] = []
    check = LayerReader._verify_chunk

    def counted(reader: LayerReader, chunk: int) -> None:
        checked.append(chunk)
        check(reader, chunk)

    monkeypatch.setattr(LayerReader, "_verify_chunk", counted)

    async def run() -> None:
        service = LayerService(FileStore(tmp_path / "store"), local)
        await service.publish("r", KEY, data)
        opened = await service.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        assert opened.linked is linked
        bodies = [opened.reader.entry_bytes(i) for i in range(sealed.object_count)]
        assert not data_chunks & set(checked), checked
        await service.close()
        if not linked:
            return  # a restart's copy is unchecked: loads check it (test_budget_service)
        stored = service.path_of(service.name_of("r", KEY))  # the stored file's inode
        with open(stored, "r+b") as f:
            f.seek(CHUNK_BYTES + 10)
            f.write(bytes([f.read(1)[0] ^ 0xFF]))
        restarted = LayerService(FileStore(tmp_path / "store"), local)
        again = await restarted.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        assert again.linked
        assert again.reader.entry_bytes(0) == bodies[0]
        with pytest.raises(CorruptData, match="chunk 1 fails its SHA-256"):
            for i in range(sealed.object_count):
                again.reader.entry_bytes(i)
        await restarted.close()

    asyncio.run(run())
