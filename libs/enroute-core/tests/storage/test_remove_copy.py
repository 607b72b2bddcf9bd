"""Deleting a local copy of a layer that left every manifest (``LayerService.remove_copy``)
and publishing the same layer twice (seed 004, "Files and tiers", "Storage service")."""

from __future__ import annotations

import asyncio
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.base.errors import PreconditionFailed
from enroute_core.base.ids import ObjectId
from enroute_core.storage.layer import Kind, LayerEntry, SealedLayer, write_layer
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


def make_layer(seed: int) -> tuple[bytes, SealedLayer]:
    rng = random.Random(seed)
    entries = []
    for _ in range(8):
        body = rng.randbytes(3000)
        entry = _header(len(body)) + body
        entries.append(LayerEntry(ObjectId(rng.randbytes(20)), Kind.BLOB, entry, 3000, None, 0))
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
