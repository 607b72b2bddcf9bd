"""Seed 004, "Disk budget" wired into the layer service (Pins, Intent, Races, restarts)."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.base.errors import NotLocal
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import MiB
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.layer import Kind, LayerEntry, SealedLayer, write_layer
from enroute_core.storage.layers import LayerService, OpenLayer
from enroute_core.storage.localfile import hole_punch_supported
from enroute_core.storage.objectstore import StoreOptions
from enroute_core.storage.objectstore.file import FileStore
from enroute_core.storage.pool import Intent

KEY = "repos/r/layers/1"


def _header(size: int) -> bytes:
    byte = (3 << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def make_layer(blobs: int, blob_bytes: int, seed: int) -> tuple[bytes, SealedLayer, list[bytes]]:
    rng = random.Random(seed)
    entries = []
    for _ in range(blobs):
        entry = _header(blob_bytes) + rng.randbytes(blob_bytes)
        entries.append(
            LayerEntry(ObjectId(rng.randbytes(20)), Kind.BLOB, entry, blob_bytes, None, 0)
        )
    data, sealed = write_layer(entries)
    return data, sealed, [e.entry for e in entries]


LAYER = make_layer(24, 250_000, seed=11)  # about 6 MiB of data


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"  # another filesystem: no links
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def _open(svc: LayerService, sealed: SealedLayer) -> OpenLayer:
    return await svc.open_layer("r", KEY, sealed.file_size, sealed.meta_size)


def _seed() -> int:
    seed = int(os.environ.get("ENROUTE_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    return seed


@pytest.mark.asyncio
async def test_evicted_entry_is_not_local_and_pins_hold(tmp_path: Path, shm_dir: Path) -> None:
    data, sealed, entries = LAYER
    store = FileStore(str(shm_dir), StoreOptions(fsync=False))
    await store.put(KEY, data)
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=2 * MiB)
    layer = await _open(svc, sealed)
    assert svc.stats().hydrations == 0  # with a budget nothing loads in the background
    held = await svc.load(layer, local_indexes=[0])
    for i in range(4, len(entries)):  # far more than the budget
        with await svc.load(layer, local_indexes=[i]):
            assert layer.entry_bytes(i, Intent.SCAN) == entries[i]
    assert layer.entry_bytes(0) == entries[0]  # pinned: never evicted
    held.release()
    for i in range(4, len(entries)):
        with await svc.load(layer, local_indexes=[i]):
            pass
    disk = svc.stats().disk_budget
    assert disk is not None and disk.evictions > 0 and disk.punched_bytes > 0
    with pytest.raises(NotLocal):
        layer.entry_bytes(0)  # a punched hole is never returned
    assert layer.chunks_needed(layer.reader.record(0).offset, 10) == [0]
    await svc.close()


async def _after_scan(store: FileStore, node: Path, first: Intent) -> bool:
    """Whether entry 1 is still local after a scan through the rest of the layer."""
    _, sealed, entries = LAYER
    svc = LayerService(store, node, disk_budget_bytes=4 * MiB)
    layer = await _open(svc, sealed)
    with await svc.load(layer, local_indexes=[1]):
        assert layer.entry_bytes(1, first) == entries[1]
    for i in range(8, len(entries)):  # a scan cycles through
        with await svc.load(layer, local_indexes=[i]):
            layer.entry_bytes(i, Intent.SCAN)
    try:
        return layer.entry_bytes(1) == entries[1]
    except NotLocal:
        return False
    finally:
        await svc.close()


@pytest.mark.asyncio
async def test_point_reads_survive_scans(tmp_path: Path, shm_dir: Path) -> None:
    data, _, _ = LAYER
    store = FileStore(str(shm_dir), StoreOptions(fsync=False))
    await store.put(KEY, data)
    assert await _after_scan(store, tmp_path / "a", Intent.POINT)  # the working set stays
    assert not await _after_scan(store, tmp_path / "b", Intent.SCAN)  # a scan read does not


@pytest.mark.asyncio
async def test_linked_copy_is_outside_the_budget(tmp_path: Path) -> None:
    data, sealed, entries = LAYER
    store = FileStore(str(tmp_path / "store"), StoreOptions(fsync=False))
    await store.put(KEY, data)
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=MiB)
    layer = await _open(svc, sealed)
    disk = svc.stats().disk_budget
    assert layer.linked and disk is not None
    assert disk.linked_files == 1 and disk.present_bytes == 0 and disk.linked_bytes == len(data)
    assert [layer.entry_bytes(i) for i in range(len(entries))] == entries
    await svc.close()


def _racing_reader(
    layer: OpenLayer, entries: list[bytes], stop: threading.Event, seen: list[str]
) -> None:
    rng = random.Random(len(entries))
    while not stop.is_set():
        i = rng.randrange(len(entries))
        try:
            got = layer.entry_bytes(i, rng.choice([Intent.POINT, Intent.SCAN]))
        except NotLocal:
            seen.append("not local")
            continue
        seen.append("ok" if got == entries[i] else f"WRONG {i}")


def _read_all(layer: OpenLayer, picks: list[int], intent: Intent) -> list[bytes]:
    return [layer.entry_bytes(i, intent) for i in picks]


@pytest.mark.asyncio
async def test_property_no_punched_hole_and_restarts(tmp_path: Path, shm_dir: Path) -> None:
    """Properties of "Disk budget": no read ever returns bytes from a punched hole (even
    racing evictions), and a restart with partial (possibly damaged) copies serves
    correct bytes once loaded ("Files and tiers")."""
    seed = _seed()
    rng = random.Random(seed)
    data, sealed, entries = LAYER
    store = FileStore(str(shm_dir), StoreOptions(fsync=False))
    await store.put(KEY, data)
    node = tmp_path / "node"
    for life in range(3):
        budget = rng.choice([MiB, 2 * MiB, 3 * MiB])
        svc = LayerService(store, node, disk_budget_bytes=budget)
        layer = await _open(svc, sealed)
        stop = threading.Event()
        seen: list[str] = []
        reader = threading.Thread(target=_racing_reader, args=(layer, entries, stop, seen))
        reader.start()
        try:
            for _ in range(30):
                picks = rng.sample(range(len(entries)), rng.randint(1, 4))
                pins = await svc.load(layer, local_indexes=picks)
                intent = rng.choice([Intent.POINT, Intent.SCAN])
                got = await asyncio.to_thread(_read_all, layer, picks, intent)
                assert got == [entries[i] for i in picks], (seed, life, picks)
                pins.release()
        finally:
            stop.set()
            reader.join()
        assert seen and not [s for s in seen if s.startswith("WRONG")], (seed, life)
        disk = svc.stats().disk_budget
        assert disk is not None and disk.present_bytes <= budget + disk.pinned_bytes
        path = layer.copy.path
        await svc.close()
        # damage a recorded chunk, as a crash or a lost punch could leave it
        victim = rng.randrange(sealed.file_size // CHUNK_BYTES)
        with open(path, "r+b") as f:
            f.seek(victim * CHUNK_BYTES + rng.randrange(CHUNK_BYTES // 2))
            f.write(b"\0" * 64 if rng.random() < 0.5 else rng.randbytes(64))
    svc = LayerService(store, node, disk_budget_bytes=MiB)
    layer = await _open(svc, sealed)
    for i in range(len(entries)):
        with await svc.load(layer, local_indexes=[i]):
            assert layer.entry_bytes(i) == entries[i], (seed, i)
    await svc.close()


@pytest.mark.asyncio
async def test_a_filesystem_without_holes_is_found_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A budget that cannot evict is said when the node starts, not at its first eviction:
    the probe's answer (the copies' filesystem) turns eviction off, with a warning."""
    store = FileStore(str(tmp_path / "store"), StoreOptions(fsync=False))
    real = LayerService(store, tmp_path / "real", disk_budget_bytes=MiB)
    disk = real.stats().disk_budget
    assert disk is not None and disk.eviction_supported == hole_punch_supported(tmp_path)
    assert not [n for n in os.listdir(tmp_path / "real" / "copies") if "probe" in n]
    await real.close()

    seen: list[str] = []
    monkeypatch.setattr(
        "enroute_core.storage.layers.hole_punch_supported", lambda d: bool(seen.append(d))
    )
    with caplog.at_level("WARNING", logger="enroute_core.storage.layers"):
        svc = LayerService(store, tmp_path / "node", disk_budget_bytes=MiB)
    disk = svc.stats().disk_budget
    assert disk is not None and not disk.eviction_supported
    assert seen == [str(tmp_path / "node" / "copies")]
    assert "cannot punch holes: the disk budget will not evict" in caplog.text
    await svc.close()
    unbounded = LayerService(store, tmp_path / "free")  # no budget: nothing to probe
    assert len(seen) == 1 and unbounded.stats().disk_budget is None
    await unbounded.close()
