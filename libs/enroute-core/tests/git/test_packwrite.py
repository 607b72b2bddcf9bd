"""Writing packs (gitformat-pack.txt, "pack-*.pack files have the following format").

Round trips go through our reader; ``tests/interop/test_pack_interop.py``
proves git accepts what we write (``index-pack --strict``, ``fsck --strict``).
Randomised tests print their seed and replay with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.git.delta import create_delta
from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.pack import (
    OBJ_BLOB,
    OBJ_COMMIT,
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    OBJ_TAG,
    OBJ_TREE,
    iter_entries,
)
from enroute_core.git.packindexer import index_pack
from enroute_core.git.packwrite import PackWriter, write_pack
from enroute_core.git.source import BytesSource

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
DATA = Path(__file__).resolve().parent / "testdata"
TYPES = [OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG]


def _bodies(pack: bytes) -> list[tuple[bytes, int, bytes]]:
    out: dict[int, tuple[bytes, int, bytes]] = {}

    def sink(index: int, oid: bytes, type_num: int, body: bytes) -> None:
        out[index] = (oid, type_num, body)

    index_pack(BytesSource(pack), on_object=sink)
    return [out[i] for i in range(len(out))]


def test_chunks_returned_and_sunk_are_the_pack() -> None:
    sunk: list[bytes] = []
    writer = PackWriter(sunk.append)
    returned = [writer.header(2)]
    assert writer.offset == 12
    returned.append(writer.add_full(OBJ_BLOB, b"hello\n"))
    returned.append(writer.add_full(OBJ_TREE, b""))
    trailer = writer.finish()
    returned.append(trailer)
    pack = b"".join(returned)
    assert sunk == returned
    assert trailer == hashlib.sha1(pack[:-20]).digest()
    assert writer.offset == len(pack)
    assert pack.startswith(b"PACK\x00\x00\x00\x02\x00\x00\x00\x02")
    # Without a sink the chunks are only returned.
    alone = PackWriter()
    assert alone.header(0) + alone.finish() == b"PACK\x00\x00\x00\x02\x00\x00\x00\x00" + (
        hashlib.sha1(b"PACK\x00\x00\x00\x02\x00\x00\x00\x00").digest()
    )


def test_writer_misuse_is_an_assertion() -> None:
    writer = PackWriter()
    with pytest.raises(AssertionError):
        writer.add_full(OBJ_BLOB, b"x")  # before the header
    writer.header(1)
    writer.add_full(OBJ_BLOB, b"x")
    with pytest.raises(AssertionError):
        writer.add_full(OBJ_BLOB, b"y")  # one more than the header said
    with pytest.raises(AssertionError):
        writer.add_ofs_delta(writer.offset, b"")  # a base must be behind the writer
    short = PackWriter()
    short.header(2)
    short.add_full(OBJ_BLOB, b"x")
    with pytest.raises(AssertionError):
        short.finish()


def test_delta_entries_name_their_bases() -> None:
    base = b"a base line\n" * 20
    target = base + b"tail\n"
    delta = create_delta(base, target)
    writer = PackWriter()
    parts = [writer.header(3)]
    base_offset = writer.offset
    parts.append(writer.add_full(OBJ_BLOB, base))
    parts.append(writer.add_ofs_delta(base_offset, delta))
    parts.append(writer.add_ref_delta(object_id(ObjectType(OBJ_BLOB), base), delta))
    parts.append(writer.finish())
    pack = b"".join(parts)
    entries = list(iter_entries(BytesSource(pack)))
    assert [e.type_num for e in entries] == [OBJ_BLOB, OBJ_OFS_DELTA, OBJ_REF_DELTA]
    assert entries[1].header.base_offset == base_offset
    assert entries[2].header.base_oid == object_id(ObjectType(OBJ_BLOB), base)
    assert [o.oid for o in index_pack(BytesSource(pack)).objects] == [
        object_id(ObjectType(OBJ_BLOB), base),
        object_id(ObjectType(OBJ_BLOB), target),
        object_id(ObjectType(OBJ_BLOB), target),
    ]


@pytest.mark.parametrize("name", ["small-ofs", "small-ref"])
def test_raw_entries_copy_a_pack_byte_for_byte(name: str) -> None:
    """Serving copies stored entries verbatim: same order, same offsets, same bytes."""
    pack = (DATA / f"{name}.pack").read_bytes()
    entries = list(iter_entries(BytesSource(pack)))
    writer = PackWriter()
    out = [writer.header(len(entries))]
    for entry in entries:
        assert writer.offset == entry.offset
        out.append(writer.add_raw_entry(pack[entry.offset : entry.end]))
    out.append(writer.finish())
    assert b"".join(out) == pack


def _objects(rng: random.Random, count: int) -> list[tuple[int, bytes]]:
    lines = [b"%d %s\n" % (i, rng.randbytes(8).hex().encode()) for i in range(200)]
    objects = []
    for _ in range(count):
        type_num = rng.choice(TYPES)
        if rng.random() < 0.2:
            body = rng.randbytes(rng.randrange(0, 300))
        else:
            start = rng.randrange(50)
            body = b"".join(lines[start : start + rng.randrange(0, 120)])
        objects.append((type_num, body))
    return objects


@pytest.mark.parametrize("ofs_delta", [True, False])
def test_write_pack_round_trips_with_deltas(ofs_delta: bool) -> None:
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    objects = _objects(rng, 60)
    pack = write_pack(objects, delta=create_delta, ofs_delta=ofs_delta, depth_max=3)
    result = index_pack(BytesSource(pack))
    assert [(t, b) for _, t, b in _bodies(pack)] == objects
    assert [o.oid for o in result.objects] == [object_id(ObjectType(t), b) for t, b in objects]
    kinds = {o.entry_type for o in result.objects}
    assert (OBJ_OFS_DELTA if ofs_delta else OBJ_REF_DELTA) in kinds
    assert max(o.depth for o in result.objects) <= 3
    assert write_pack(objects, delta=create_delta, ofs_delta=ofs_delta, depth_max=3) == pack


def test_write_pack_streams_to_a_sink() -> None:
    objects = [(OBJ_BLOB, b"x" * 100), (OBJ_COMMIT, b"tree 0\n")]
    sunk: list[bytes] = []
    assert write_pack(objects, sink=sunk.append) == b""
    assert b"".join(sunk) == write_pack(objects)


@settings(max_examples=40, deadline=None)
@hypothesis_seed(SEED)
@given(
    objects=st.lists(
        st.tuples(st.sampled_from(TYPES), st.binary(max_size=400)), min_size=0, max_size=12
    ),
    deltify=st.booleans(),
)
def test_any_objects_round_trip(objects: list[tuple[int, bytes]], deltify: bool) -> None:
    print(f"ENROUTE_SEED={SEED}")
    pack = write_pack(objects, delta=create_delta if deltify else None)
    assert [(t, b) for _, t, b in _bodies(pack)] == objects
