"""Ingest memory does not grow with the pack (seed 004, "Pages and memory": "a 128 MiB
cache per concurrent ingest"; docs/ingest.md, "Memory").

The pack is read from a scratch file and the layer written to one, as a push
does. With the cache budget set small, a 20 MiB and an 80 MiB pack of the same
kind of objects (random blobs, some of them deltas) both fill it, and the
peak of Python allocations differs only by the per-object words of the extra
objects. Randomised: prints its seed, replays with ``ENROUTE_SEED=``.
"""

from __future__ import annotations

import os
import random
import tracemalloc
import zlib
from pathlib import Path

import pytest

from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits, MiB
from enroute_core.engine.ingest import ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT
from enroute_core.git.delta import create_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import parse_entry_header
from enroute_core.git.packindexer import PackIndexer
from enroute_core.git.packwrite import PackWriter
from enroute_core.git.tree import MODE_FILE, Tree, TreeEntry
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.localfile import ScratchFile

BLOB_BYTES = 256 * 1024
CACHE_BYTES = 16 * MiB
PER_OBJECT_BYTES = 2048  # generous: index words, walk and writer entries of one object
TRANSIENT_BYTES = 8 * MiB  # read windows, the writer's 1 MiB buffer, one entry being copied


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={value}")
    return value


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def _write_pack(path: Path, blobs: int, rng: random.Random) -> tuple[ScratchFile, ObjectId]:
    """One commit of ``blobs`` random blobs; every fourth is an OFS_DELTA on the one before."""
    spool = ScratchFile(path, "pack")
    writer = PackWriter(spool.append, level=1)
    writer.header(blobs + 2)
    entries: list[TreeEntry] = []
    previous: tuple[int, bytes] | None = None
    for i in range(blobs):
        offset = writer.offset
        if previous is not None and i % 4 == 3:
            base_offset, base = previous
            at = rng.randrange(len(base))
            body = base[:at] + _random_bytes(rng, 64) + base[at:]
            delta = create_delta(base, body)
            assert delta is not None
            writer.add_ofs_delta(base_offset, delta)
        else:
            body = _random_bytes(rng, BLOB_BYTES)
            writer.add_full(int(ObjectType.BLOB), body)
        previous = (offset, body)
        entries.append(TreeEntry(MODE_FILE, b"f%05d.bin" % i, object_id(ObjectType.BLOB, body)))
    tree = Tree.build(entries).serialize()
    writer.add_full(int(ObjectType.TREE), tree)
    who = b"T <t@example.com> 1700000000 +0000"
    commit = b"tree %s\nauthor %s\ncommitter %s\n\nblobs\n" % (
        object_id(ObjectType.TREE, tree).hex().encode(),
        who,
        who,
    )
    writer.add_full(int(ObjectType.COMMIT), commit)
    writer.finish()
    return spool, object_id(ObjectType.COMMIT, commit)


def _peak_of_ingest(tmp: Path, blobs: int, seed: int) -> tuple[int, int]:
    """(tracemalloc peak of one ingest, pack bytes); the layer is read back and checked."""
    spool, tip = _write_pack(tmp, blobs, random.Random(seed))
    layer = ScratchFile(tmp, "layer")
    try:
        tracemalloc.start()
        try:
            result = ingest_pack(
                spool,
                [tip],
                EMPTY_SNAPSHOT,
                limits=Limits(ingest_body_cache_bytes_max=CACHE_BYTES),
                sink=layer.append,
            )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert result.data is None and result.sealed is not None
        assert result.object_count == blobs + 2
        assert layer.size == result.sealed.file_size
        reader = LayerReader.open(layer, meta_size=result.sealed.meta_size)
        assert reader.object_count == blobs + 2
        return peak, spool.size
    finally:
        spool.close()
        layer.close()


@pytest.mark.slow
def test_ingest_memory_does_not_grow_with_the_pack(tmp_path: Path, seed: int) -> None:
    small_peak, small_bytes = _peak_of_ingest(tmp_path, 108, seed)  # 81 full blobs
    large_peak, large_bytes = _peak_of_ingest(tmp_path, 428, seed + 1)  # 321 full blobs
    assert small_bytes >= 20 * MiB and large_bytes >= 80 * MiB
    print(f"peak {small_peak / MiB:.1f} MiB for {small_bytes / MiB:.0f} MiB, "
          f"{large_peak / MiB:.1f} MiB for {large_bytes / MiB:.0f} MiB")  # fmt: skip
    bound = CACHE_BYTES + TRANSIENT_BYTES + 2 * BLOB_BYTES + PER_OBJECT_BYTES * 430
    assert large_peak <= bound
    assert large_peak - small_peak <= PER_OBJECT_BYTES * 320 + 2 * MiB


def test_scratch_file_reads_what_was_appended(tmp_path: Path) -> None:
    with ScratchFile(tmp_path, "t") as f:
        assert f.size == 0 and f.read_at(0, 10) == b""
        f.append(b"hello ")
        f.append(memoryview(b"world"))
        assert f.size == 11
        assert f.read_at(0, 100) == b"hello world"
        assert f.read_at(6, 5) == b"world"
        assert f.read_at(11, 5) == b""
        assert f.read_all() == b"hello world"
        path = Path(f.path)
        assert path.parent == tmp_path and path.exists()
    assert not path.exists()


def test_scratch_file_close_tolerates_a_moved_file(tmp_path: Path) -> None:
    f = ScratchFile(tmp_path, "t")
    f.append(b"layer")
    moved = tmp_path / "published"
    os.replace(f.path, moved)  # what publishing does
    f.close()
    f.close()
    assert moved.read_bytes() == b"layer"


LARGE_BLOB_BYTES = 48 * MiB
STREAM_THRESHOLD_BYTES = 1 * MiB


def _write_large_pack(path: Path, rng: random.Random) -> tuple[ScratchFile, ObjectId, ObjectId]:
    """One commit of one random blob of LARGE_BLOB_BYTES and a small one: (spool, tip, blob)."""
    spool = ScratchFile(path, "pack")
    writer = PackWriter(spool.append, level=1)
    writer.header(4)
    entries: list[TreeEntry] = []
    for name, size in ((b"large.bin", LARGE_BLOB_BYTES), (b"small.txt", 100)):
        body = _random_bytes(rng, size)
        writer.add_full(int(ObjectType.BLOB), body)
        entries.append(TreeEntry(MODE_FILE, name, object_id(ObjectType.BLOB, body)))
        del body
    tree = Tree.build(entries).serialize()
    writer.add_full(int(ObjectType.TREE), tree)
    who = b"T <t@example.com> 1700000000 +0000"
    commit = b"tree %s\nauthor %s\ncommitter %s\n\nlarge\n" % (
        object_id(ObjectType.TREE, tree).hex().encode(),
        who,
        who,
    )
    writer.add_full(int(ObjectType.COMMIT), commit)
    writer.finish()
    return spool, object_id(ObjectType.COMMIT, commit), entries[0].oid


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("streamed", [True, False])
def test_a_large_blob_is_ingested_without_being_held(
    tmp_path: Path, seed: int, streamed: bool, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob over ``pack_stream_threshold_bytes`` is hashed as it inflates and its pack
    entry copied into the layer in pieces (git's index-pack with a blob over
    core.bigFileThreshold): the peak of Python allocations stays far below the blob's
    size, by the compiled pass and by its reference alike. Under a threshold above the
    blob it is held whole, which this bound tells apart."""
    if not compiled:  # the reference's own scan, as when the compiled pass gives up
        monkeypatch.setattr(PackIndexer, "_run_compiled", lambda self: None)
    spool, tip, blob = _write_large_pack(tmp_path, random.Random(seed))
    layer = ScratchFile(tmp_path, "layer")
    threshold = STREAM_THRESHOLD_BYTES if streamed else 2 * LARGE_BLOB_BYTES
    limits = Limits(ingest_body_cache_bytes_max=CACHE_BYTES, pack_stream_threshold_bytes=threshold)
    try:
        tracemalloc.start()
        try:
            result = ingest_pack(spool, [tip], EMPTY_SNAPSHOT, limits=limits, sink=layer.append)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        print(f"peak {peak / MiB:.1f} MiB for a {LARGE_BLOB_BYTES // MiB} MiB blob, "
              f"streamed={streamed} compiled={compiled}")  # fmt: skip
        assert result.sealed is not None and result.object_count == 4
        assert result.compiled_index == compiled
        reader = LayerReader.open(layer, meta_size=result.sealed.meta_size)
        reader.verify()
        local = reader.lookup(blob)
        assert local is not None
        entry = reader.entry_bytes(local)
        type_num, size, header_length, _, _ = parse_entry_header(entry, 0, 0)
        body = zlib.decompress(entry[header_length:])
        assert type_num == int(ObjectType.BLOB) and size == len(body) == LARGE_BLOB_BYTES
        assert object_id(ObjectType.BLOB, body) == blob
        del entry, body
        bound = TRANSIENT_BYTES + 4 * STREAM_THRESHOLD_BYTES
        if streamed:
            assert peak <= bound
        else:
            assert peak >= LARGE_BLOB_BYTES
    finally:
        spool.close()
        layer.close()
