"""Resolving a pack as ``git index-pack`` does and ``git verify-pack -v`` reports it.

gitformat-pack.txt, "Deltified representation": OFS_DELTA bases come before
the delta; REF_DELTA bases may come later or, in a thin pack, not at all.
Packs here are written with :class:`PackWriter` so every order and failure
can be staged; the golden vectors come from real git.
"""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from enroute_core.base.errors import (
    CorruptData,
    InvalidDelta,
    InvalidPack,
    LimitExceeded,
    MissingObject,
)
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.delta import create_delta
from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.pack import (
    OBJ_BLOB,
    OBJ_COMMIT,
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    OBJ_TAG,
    OBJ_TREE,
    encode_entry_header,
    encode_ofs_distance,
    encode_pack_header,
)
from enroute_core.git.packindexer import PackIndexer, PackIndexResult, index_pack
from enroute_core.git.packwrite import PackWriter
from enroute_core.git.source import BytesSource
from enroute_core.git.thin import ExternalBaseFn
from enroute_testing.repogen import RepoSpec, all_objects, generate_repo, pack_objects

DATA = Path(__file__).resolve().parent / "testdata"
NAMES = {OBJ_COMMIT: b"commit", OBJ_TREE: b"tree", OBJ_BLOB: b"blob", OBJ_TAG: b"tag"}
_TYPE_NUMS = {name: type_num for type_num, name in NAMES.items()}


def _text(n: int, tag: int = 0) -> bytes:
    return b"".join(
        b"line %d of a blob that deltas well, revision %d\n" % (i, tag) for i in range(n)
    )


BASE = _text(60)
V1 = BASE + b"one more line\n"
V2 = V1 + b"and another\n"
V3 = V2.replace(b"line 5 ", b"LINE 5 ")


@dataclass(frozen=True)
class Full:
    type_num: int
    body: bytes


@dataclass(frozen=True)
class Ref:
    base_oid: ObjectId
    delta: bytes


@dataclass(frozen=True)
class Ofs:
    base_index: int
    delta: bytes


Entry = Full | Ref | Ofs


def _pack(build: list[Entry]) -> bytes:
    chunks: list[bytes] = []
    writer = PackWriter(chunks.append)
    writer.header(len(build))
    offsets: list[int] = []
    for entry in build:
        offsets.append(writer.offset)
        if isinstance(entry, Full):
            writer.add_full(entry.type_num, entry.body)
        elif isinstance(entry, Ref):
            writer.add_ref_delta(entry.base_oid, entry.delta)
        else:
            writer.add_ofs_delta(offsets[entry.base_index], entry.delta)
    writer.finish()
    return b"".join(chunks)


def _oid(body: bytes, type_num: int = OBJ_BLOB) -> ObjectId:
    return object_id(ObjectType(type_num), body)


def _summary(result: PackIndexResult) -> list[tuple[str, int, int, str | None]]:
    return [
        (o.oid.hex(), o.type_num, o.depth, o.base_oid.hex() if o.base_oid else None)
        for o in result.objects
    ]


@pytest.mark.parametrize("name", ["small-ofs", "small-ref"])
def test_golden_matches_git_verify_pack(name: str) -> None:
    pack = (DATA / f"{name}.pack").read_bytes()
    rows = [line.split() for line in (DATA / f"{name}.verify").read_bytes().splitlines()]
    result = index_pack(BytesSource(pack))
    got = [
        [o.oid.hex().encode(), NAMES[o.type_num], b"%d" % o.size, b"%d" % o.size_in_pack]
        + [b"%d" % o.offset]
        + ([b"%d" % o.depth, o.base_oid.hex().encode()] if o.base_oid else [])
        for o in result.objects
    ]
    assert got == rows
    assert result.checksum == pack[-20:]
    assert result.external_bases == ()
    assert result.header.count == len(rows)


def test_bodies_reach_the_sink_with_their_ids() -> None:
    pack = (DATA / "small-ofs.pack").read_bytes()
    seen: dict[int, tuple[ObjectId, int, bytes]] = {}

    def sink(index: int, oid: ObjectId, type_num: int, body: bytes | None) -> None:
        assert index not in seen and body is not None  # nothing is over the stream threshold
        seen[index] = (oid, type_num, body)

    result = index_pack(BytesSource(pack), on_object=sink)
    assert sorted(seen) == list(range(len(result.objects)))
    for i, info in enumerate(result.objects):
        oid, type_num, body = seen[i]
        assert oid == info.oid == object_id(ObjectType(type_num), body)
        assert len(body) == info.object_size


def test_ofs_chain() -> None:
    pack = _pack(
        [
            Full(OBJ_BLOB, BASE),
            Ofs(0, create_delta(BASE, V1)),
            Ofs(1, create_delta(V1, V2)),
            Ofs(2, create_delta(V2, V3)),
        ]
    )
    result = index_pack(BytesSource(pack))
    assert _summary(result) == [
        (_oid(BASE).hex(), OBJ_BLOB, 0, None),
        (_oid(V1).hex(), OBJ_BLOB, 1, _oid(BASE).hex()),
        (_oid(V2).hex(), OBJ_BLOB, 2, _oid(V1).hex()),
        (_oid(V3).hex(), OBJ_BLOB, 3, _oid(V2).hex()),
    ]
    assert [o.entry_type for o in result.objects] == [OBJ_BLOB] + [OBJ_OFS_DELTA] * 3
    assert [o.object_size for o in result.objects] == [len(BASE), len(V1), len(V2), len(V3)]


def test_ref_bases_after_their_deltas_are_deferred() -> None:
    """git allows a REF_DELTA before its base; the chain resolves once the base arrives."""
    pack = _pack(
        [
            Ref(_oid(V2), create_delta(V2, V3)),
            Ref(_oid(V1), create_delta(V1, V2)),
            Full(OBJ_COMMIT, b"tree x\n\nunrelated\n"),
            Ref(_oid(BASE), create_delta(BASE, V1)),
            Full(OBJ_BLOB, BASE),
        ]
    )
    result = index_pack(BytesSource(pack))
    assert _summary(result) == [
        (_oid(V3).hex(), OBJ_BLOB, 3, _oid(V2).hex()),
        (_oid(V2).hex(), OBJ_BLOB, 2, _oid(V1).hex()),
        (_oid(b"tree x\n\nunrelated\n", OBJ_COMMIT).hex(), OBJ_COMMIT, 0, None),
        (_oid(V1).hex(), OBJ_BLOB, 1, _oid(BASE).hex()),
        (_oid(BASE).hex(), OBJ_BLOB, 0, None),
    ]
    assert result.external_bases == ()


def test_ofs_delta_on_a_deferred_ref_delta() -> None:
    pack = _pack(
        [
            Ref(_oid(BASE), create_delta(BASE, V1)),
            Ofs(0, create_delta(V1, V2)),
            Full(OBJ_BLOB, BASE),
        ]
    )
    assert _summary(index_pack(BytesSource(pack))) == [
        (_oid(V1).hex(), OBJ_BLOB, 1, _oid(BASE).hex()),
        (_oid(V2).hex(), OBJ_BLOB, 2, _oid(V1).hex()),
        (_oid(BASE).hex(), OBJ_BLOB, 0, None),
    ]


def test_a_cache_of_nothing_rebuilds_bases_and_agrees() -> None:
    build: list[Entry] = [
        Full(OBJ_BLOB, BASE),
        Ofs(0, create_delta(BASE, V1)),
        Ofs(1, create_delta(V1, V2)),
        Ref(_oid(V2), create_delta(V2, V3)),
        Ofs(0, create_delta(BASE, V3)),
    ]
    pack = _pack(build)
    expected = index_pack(BytesSource(pack))
    for cache in (0, len(BASE), 10 * len(BASE)):
        got = index_pack(BytesSource(pack), limits=Limits(pack_base_cache_bytes_max=cache))
        assert got == expected


def test_thin_pack_bases_come_from_the_callback() -> None:
    pack = _pack(
        [
            Ref(_oid(BASE), create_delta(BASE, V1)),
            Ofs(0, create_delta(V1, V2)),
            Ref(_oid(V3), create_delta(V3, V2 + b"x")),
        ]
    )
    store = {_oid(BASE): (OBJ_BLOB, BASE), _oid(V3): (OBJ_BLOB, V3)}
    asked: list[ObjectId] = []

    def lookup(oid: ObjectId) -> tuple[int, bytes] | None:
        asked.append(oid)
        return store.get(oid)

    result = index_pack(BytesSource(pack), external_base=lookup)
    assert result.external_bases == (_oid(BASE), _oid(V3))
    assert _summary(result) == [
        (_oid(V1).hex(), OBJ_BLOB, 1, _oid(BASE).hex()),
        (_oid(V2).hex(), OBJ_BLOB, 2, _oid(V1).hex()),
        (_oid(V2 + b"x").hex(), OBJ_BLOB, 1, _oid(V3).hex()),
    ]
    # Rebuilding with no cache asks again, but reports each base once.
    tiny = Limits(pack_base_cache_bytes_max=0)
    again = index_pack(BytesSource(pack), external_base=lookup, limits=tiny)
    assert again == result


def test_thin_chain_listed_before_its_external_root() -> None:
    """A base the store lacks may still come from the pack once an external root resolves."""
    pack = _pack(
        [
            Ref(_oid(V1), create_delta(V1, V2)),
            Ref(_oid(BASE), create_delta(BASE, V1)),
        ]
    )
    store = {_oid(BASE): (OBJ_BLOB, BASE)}
    result = index_pack(BytesSource(pack), external_base=store.get)
    assert result.external_bases == (_oid(BASE),)
    assert _summary(result) == [
        (_oid(V2).hex(), OBJ_BLOB, 2, _oid(V1).hex()),
        (_oid(V1).hex(), OBJ_BLOB, 1, _oid(BASE).hex()),
    ]


def test_missing_thin_base_names_the_object() -> None:
    pack = _pack([Ref(_oid(BASE), create_delta(BASE, V1))])
    with pytest.raises(MissingObject) as info:
        index_pack(BytesSource(pack))
    assert info.value.details["oid"] == _oid(BASE).hex()
    with pytest.raises(MissingObject):
        index_pack(BytesSource(pack), external_base=lambda oid: None)


def test_thin_base_that_does_not_hash_to_its_id() -> None:
    pack = _pack([Ref(_oid(BASE), create_delta(BASE, V1))])
    with pytest.raises(CorruptData):
        index_pack(BytesSource(pack), external_base=lambda oid: (OBJ_TREE, BASE))


def test_ref_deltas_on_each_other_are_missing_bases() -> None:
    pack = _pack(
        [
            Ref(_oid(V2), create_delta(V2, V1)),
            Ref(_oid(V1), create_delta(V1, V2)),
        ]
    )
    with pytest.raises(MissingObject):
        index_pack(BytesSource(pack))


def test_delta_chain_depth_limit() -> None:
    build: list[Entry] = [Full(OBJ_BLOB, BASE)]
    bodies = [BASE]
    for i in range(5):
        bodies.append(bodies[-1] + b"step %d\n" % i)
        build.append(Ofs(i, create_delta(bodies[-2], bodies[-1])))
    pack = _pack(build)
    assert max(o.depth for o in index_pack(BytesSource(pack)).objects) == 5
    index_pack(BytesSource(pack), limits=Limits(delta_chain_depth_max=5))
    with pytest.raises(LimitExceeded) as info:
        index_pack(BytesSource(pack), limits=Limits(delta_chain_depth_max=4))
    assert info.value.limit == "delta_chain_depth_max"


def test_delta_result_over_the_object_limit() -> None:
    pack = _pack([Full(OBJ_BLOB, BASE), Ofs(0, create_delta(BASE, V1))])
    with pytest.raises(LimitExceeded):
        index_pack(BytesSource(pack), limits=Limits(object_bytes_max=len(V1) - 1))


def test_delta_for_another_base_is_invalid() -> None:
    pack = _pack([Full(OBJ_BLOB, V1), Ofs(0, create_delta(BASE, V2))])
    with pytest.raises(InvalidDelta):
        index_pack(BytesSource(pack))


def test_ofs_base_inside_another_entry_is_invalid() -> None:
    delta = create_delta(BASE, V1)
    first = encode_entry_header(OBJ_BLOB, len(BASE))
    stream = zlib.compress(BASE)
    second_offset = 12 + len(first) + len(stream)
    head = encode_entry_header(OBJ_OFS_DELTA, len(delta))
    body = (
        encode_pack_header(2)
        + first
        + stream
        + head
        + encode_ofs_distance(second_offset - 13)  # one byte into the first entry
        + zlib.compress(delta)
    )
    pack = body + hashlib.sha1(body).digest()
    with pytest.raises(InvalidPack, match="not an entry"):
        index_pack(BytesSource(pack))


def test_duplicate_objects_keep_their_first_entry_as_ref_base() -> None:
    pack = _pack(
        [
            Full(OBJ_BLOB, BASE),
            Full(OBJ_BLOB, BASE),
            Ref(_oid(BASE), create_delta(BASE, V1)),
        ]
    )
    result = index_pack(BytesSource(pack))
    assert [o.oid for o in result.objects] == [_oid(BASE), _oid(BASE), _oid(V1)]
    assert result.objects[2].base_oid == _oid(BASE)


def test_entry_types_and_sizes_are_reported() -> None:
    delta = create_delta(BASE, V1)
    pack = _pack([Full(OBJ_TAG, b"object x\n"), Full(OBJ_BLOB, BASE)])
    pack2 = _pack([Full(OBJ_BLOB, BASE), Ref(_oid(BASE), delta)])
    tag, blob = index_pack(BytesSource(pack)).objects
    assert (tag.type_num, tag.size, tag.object_size) == (OBJ_TAG, 9, 9)
    assert blob.offset == tag.offset + tag.size_in_pack
    _, ref = index_pack(BytesSource(pack2)).objects
    assert (ref.entry_type, ref.size, ref.object_size) == (OBJ_REF_DELTA, len(delta), len(V1))
    assert ref.header_length == len(encode_entry_header(OBJ_REF_DELTA, len(delta))) + 20


@pytest.mark.parametrize("size", [0, 1, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 300_000])
def test_object_ids_either_side_of_the_joined_hash_bound(size: int) -> None:
    """Small bodies are hashed joined to their header, large ones in two steps: same ids."""
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    base = body[: size // 2] + b"tail"
    out: list[bytes] = []
    writer = PackWriter(out.append, level=1)
    writer.header(3)
    writer.add_full(int(ObjectType.BLOB), body)
    offset = writer.offset
    writer.add_full(int(ObjectType.BLOB), base)
    delta = create_delta(base, body)
    assert delta is not None
    writer.add_ofs_delta(offset, delta)
    writer.finish()
    result = index_pack(BytesSource(b"".join(out)))
    want_body = object_id(ObjectType.BLOB, body)
    assert [o.oid for o in result.objects] == [
        want_body,
        object_id(ObjectType.BLOB, base),
        want_body,
    ]
    assert hashlib.sha1(b"blob %d\x00" % size + body).digest() == want_body


# -- the compiled pass (enroute_native.pack_index, docs/native.md) ----------------------------

_GIT_SPEC = RepoSpec(seed=11, commits=60, branches=2, merge_every=7, files=30, file_bytes=1500,
                     binary_files=2, large_file_bytes=200_000)  # fmt: skip


class _Calls(list[tuple[int, ObjectId, int, bytes | None]]):
    def append_call(self, index: int, oid: ObjectId, type_num: int, body: bytes | None) -> None:
        self.append((index, oid, type_num, body))


def _both(
    pack: bytes,
    limits: Limits,
    external_base: ExternalBaseFn | None = None,
    *,
    threads: int | None = None,
) -> PackIndexResult:
    """Index with the compiled pass alone and with the reference alone: the same result and
    the same ``on_object`` calls; the compiled pass must not have given up."""
    runs = []
    for compiled in (True, False):
        seen = _Calls()
        indexer = PackIndexer(
            BytesSource(pack),
            limits=limits,
            external_base=external_base,
            on_object=seen.append_call,
            compiled=compiled,
            threads=threads,
        )
        result = indexer._run_compiled() if compiled else indexer.run()
        assert result is not None, "the compiled pass gave up on a usual pack"
        assert result.compiled == compiled
        runs.append((replace(result, compiled=True), seen))
    assert runs[0] == runs[1]
    return runs[0][0]


@pytest.mark.interop
@pytest.mark.parametrize("cache", [96 << 20, 4096, 0])
def test_the_compiled_pass_indexes_git_packs_as_the_reference(tmp_path: Path, cache: int) -> None:
    """Whole and thin packs from ``git pack-objects``, with a cache that holds every base,
    a few, or none (every base rebuilt along its chain, thin bases asked again)."""
    repo = generate_repo(tmp_path / "r.git", _GIT_SPEC)
    store = {
        ObjectId(bytes.fromhex(oid.decode())): (_TYPE_NUMS[type_], body)
        for oid, type_, body in all_objects(repo.path)
    }
    limits = Limits(pack_base_cache_bytes_max=cache)
    whole = _both(pack_objects(repo.path), limits)
    assert len(whole.objects) == len(store)
    thin = pack_objects(repo.path, revs=["main"], exclude=["main~20"], thin=True)
    result = _both(thin, limits, store.get)
    assert result.external_bases, "the thin pack left no base out"


@pytest.mark.interop
@pytest.mark.parametrize("threads", [2, 4])
def test_a_pack_of_ref_deltas_goes_on_serially_and_agrees(tmp_path: Path, threads: int) -> None:
    """A pack without OFS_DELTA (``--no-delta-base-offset``; libgit2's pack builder writes
    such packs): each REF_DELTA's lookup waits for the workers, so past a share of them
    the compiled pass stops its workers and goes on in the calling thread
    (``pipe_serial``, docs/native.md). The result and the calls stay the reference's."""
    repo = generate_repo(tmp_path / "r.git", _GIT_SPEC)
    pack = pack_objects(repo.path, ofs_delta=False)
    result = _both(pack, Limits(), threads=threads)
    refs = sum(1 for o in result.objects if o.entry_type == OBJ_REF_DELTA)
    assert refs >= 64 and refs * 8 > len(result.objects), refs  # past pipe_serial's bounds


# -- large blobs, streamed (git's index-pack above core.bigFileThreshold) ---------------------


def _streamed_calls(pack: bytes, limits: Limits, threshold: int) -> tuple[PackIndexResult, _Calls]:
    """Index with blobs over ``threshold`` streamed, by both passes (:func:`_both`)."""
    seen = _Calls()
    streaming = replace(limits, pack_stream_threshold_bytes=threshold)
    result = _both(pack, streaming)
    index_pack(BytesSource(pack), limits=streaming, on_object=seen.append_call)
    return result, seen


@pytest.mark.interop
@pytest.mark.parametrize("cache", [96 << 20, 0])
def test_streamed_blobs_index_as_held_ones(tmp_path: Path, cache: int) -> None:
    """A blob over ``pack_stream_threshold_bytes`` is hashed as it inflates: the compiled
    pass and the reference agree, the objects are those of a pass that held every body,
    and ``on_object`` gets None for exactly the blobs over the threshold, the rest as
    before. In a git pack most large blobs are delta bases: each is rebuilt whole from
    the pack for its deltas, with a cache or none."""
    repo = generate_repo(tmp_path / "r.git", _GIT_SPEC)
    pack = pack_objects(repo.path)
    limits = Limits(pack_base_cache_bytes_max=cache)
    held = _Calls()
    whole = index_pack(BytesSource(pack), limits=limits, on_object=held.append_call)
    threshold = 1024
    result, seen = _streamed_calls(pack, limits, threshold)
    assert result.objects == whole.objects
    streamed = {
        i for i, info in enumerate(result.objects)
        if info.base_oid is None and info.type_num == OBJ_BLOB and info.size > threshold
    }  # fmt: skip
    assert len(streamed) >= 5, "the pack has few blobs to stream"
    bases = {info.base_oid for info in result.objects}
    assert any(result.objects[i].oid in bases for i in streamed), "no streamed blob is a base"
    assert [(i, o, t) for i, o, t, _ in seen] == [(i, o, t) for i, o, t, _ in held]
    for (index, _, _, body), (_, _, _, held_body) in zip(seen, held, strict=True):
        assert body == (None if index in streamed else held_body)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_ref_delta_waiting_on_a_streamed_blob_gets_it_whole(compiled: bool) -> None:
    """A REF_DELTA may come before its base (git allows it): when the base arrives
    streamed, the waiting delta gets the base rebuilt from the pack."""
    big = _text(2000)
    grown = big + b"one more line\n"
    pack = _pack([Ref(_oid(big), create_delta(big, grown)), Full(OBJ_BLOB, big)])
    seen = _Calls()
    limits = Limits(pack_stream_threshold_bytes=len(big) - 1)
    result = index_pack(
        BytesSource(pack), limits=limits, on_object=seen.append_call, compiled=compiled
    )
    assert result.compiled == compiled
    assert [o.oid for o in result.objects] == [_oid(grown), _oid(big)]
    assert [(i, o, body) for i, o, _, body in seen] == [
        (1, _oid(big), None),
        (0, _oid(grown), grown),
    ]
    if compiled:
        assert _both(pack, limits) == result


def test_a_streamed_zlib_bomb_is_refused_as_a_held_one() -> None:
    """The zlib-bomb rule holds while a blob is streamed: the compiled pass gives up
    and the reference refuses it with ``pack_inflate_ratio_max``, as when it is held."""
    pack = _pack([Full(OBJ_BLOB, bytes(4 << 20))])
    for threshold in (1 << 30, 1000):
        limits = Limits(pack_inflate_free_bytes=1 << 20, pack_stream_threshold_bytes=threshold)
        assert PackIndexer(BytesSource(pack), limits=limits)._run_compiled() is None
        with pytest.raises(LimitExceeded) as info:
            index_pack(BytesSource(pack), limits=limits)
        assert info.value.limit == "pack_inflate_ratio_max"


@pytest.mark.parametrize("cut", ["short", "long"])
def test_a_streamed_blob_of_the_wrong_size_is_invalid(cut: str) -> None:
    """A streamed blob must inflate to the size its header declares, as a held one."""
    body = _text(3000)
    declared = len(body) + 1 if cut == "short" else len(body) - 1
    entry = encode_entry_header(OBJ_BLOB, declared) + zlib.compress(body)
    raw = encode_pack_header(1) + entry
    pack = raw + hashlib.sha1(raw).digest()
    limits = Limits(pack_stream_threshold_bytes=1000)
    assert PackIndexer(BytesSource(pack), limits=limits)._run_compiled() is None
    with pytest.raises(InvalidPack):
        index_pack(BytesSource(pack), limits=limits)


def test_the_compiled_pass_leaves_a_bad_delta_to_the_reference() -> None:
    """It never judges: a delta that does not apply makes it give up, and the reference
    raises the typed error."""
    bad = create_delta(BASE, V1)[:-1]
    pack = _pack([Full(OBJ_BLOB, BASE), Ofs(0, bad)])
    assert PackIndexer(BytesSource(pack))._run_compiled() is None
    with pytest.raises(InvalidDelta):
        index_pack(BytesSource(pack))


def test_a_valid_pack_the_compiled_pass_leaves_is_indexed_by_the_reference() -> None:
    """A size header of ten bytes (its high groups zero) is valid and the compiled pass
    does not read it: the reference indexes the pack, and the result says so."""
    usual = _pack([Full(OBJ_BLOB, BASE), Ofs(0, create_delta(BASE, V1))])
    assert index_pack(BytesSource(usual)).compiled
    head = bytearray(encode_entry_header(OBJ_BLOB, len(BASE)))
    padded = bytes(b | 0x80 for b in head) + b"\x80" * (9 - len(head)) + b"\x00"
    entry = padded + zlib.compress(BASE)
    raw = encode_pack_header(1) + entry
    pack = raw + hashlib.sha1(raw).digest()
    assert PackIndexer(BytesSource(pack))._run_compiled() is None
    result = index_pack(BytesSource(pack))
    assert not result.compiled
    assert [o.oid for o in result.objects] == [_oid(BASE)]


def _expansion_pack() -> tuple[bytes, int]:
    """A base and three deltas on it (OFS, REF, and one on a later delta): the results the
    deltas declare, and the pack."""
    build: list[Entry] = [
        Full(OBJ_BLOB, BASE),
        Ofs(0, create_delta(BASE, V1)),
        Ref(_oid(BASE), create_delta(BASE, V2)),
        Ofs(1, create_delta(V1, V3)),
    ]
    return _pack(build), len(V1) + len(V2) + len(V3)


def _allowing(pack: bytes, declared: int) -> Limits:
    """Limits whose expansion bound is exactly ``declared`` for ``pack`` (ratio 1)."""
    return Limits(
        pack_delta_expansion_ratio_max=1, pack_delta_expansion_free_bytes=declared - len(pack)
    )


@pytest.mark.parametrize("compiled", [True, False])
def test_delta_expansion_is_charged_before_the_deltas_are_applied(compiled: bool) -> None:
    """A delta bomb (issue 24, finding 2): the result sizes the deltas declare, added up in
    pack order, may pass the free bytes by the ratio times the pack's bytes; one byte less
    and the pack is refused, by the compiled pass (which gives up) and the reference alike,
    before the delta over the bound is applied."""
    pack, declared = _expansion_pack()
    exact = _allowing(pack, declared)
    result = index_pack(BytesSource(pack), limits=exact, compiled=compiled)
    assert result.compiled == compiled, "the compiled pass gave up on a pack within the bound"
    seen: list[int] = []
    over = replace(exact, pack_delta_expansion_free_bytes=exact.pack_delta_expansion_free_bytes - 1)
    with pytest.raises(LimitExceeded) as info:
        index_pack(
            BytesSource(pack),
            limits=over,
            on_object=lambda index, *_: seen.append(index),
            compiled=compiled,
        )
    assert info.value.limit == "pack_delta_expansion_ratio_max"
    assert "delta bomb" in str(info.value)
    assert seen.count(3) == 0, "the last delta was applied before it was charged"
    if compiled:
        assert PackIndexer(BytesSource(pack), limits=over)._run_compiled() is None


def test_a_ratio_of_zero_turns_the_expansion_bound_off() -> None:
    pack, _ = _expansion_pack()
    off = Limits(pack_delta_expansion_ratio_max=0, pack_delta_expansion_free_bytes=0)
    assert index_pack(BytesSource(pack), limits=off).compiled


@pytest.mark.parametrize("compiled", [True, False])
def test_a_declared_result_over_the_object_limit_is_refused_before_its_base_is_read(
    compiled: bool,
) -> None:
    """The delta's header is read as the delta is: a result over ``object_bytes_max``
    is refused although its base never arrives (a thin base nobody is asked for)."""
    delta = create_delta(BASE, V1)
    pack = _pack([Ref(_oid(BASE), delta)])
    asked: list[ObjectId] = []

    def external_base(oid: ObjectId) -> tuple[int, bytes] | None:
        asked.append(oid)
        return None

    with pytest.raises(LimitExceeded) as info:
        index_pack(
            BytesSource(pack),
            limits=Limits(object_bytes_max=len(V1) - 1),
            external_base=external_base,
            compiled=compiled,
        )
    assert info.value.limit == "object_bytes_max"
    assert asked == []


@pytest.mark.parametrize("compiled", [True, False])
def test_the_result_holds_no_python_object_per_entry(compiled: bool) -> None:
    """The entries come back as columns (``PackObjects``), as index-pack keeps its
    ``struct object_entry`` arrays: 76 bytes per entry of numbers and oids. As a
    PackObjectInfo tuple each they held about 480 bytes (tracemalloc, 504,433 entries of
    the large profile: 240 MiB), the largest of a push's per-object structures."""
    count = 5_000
    build: list[Entry] = []
    previous = b""
    for i in range(count):
        body = b"blob %d of a pack of many small entries\n" % i
        if i % 2:
            build.append(Ofs(i - 1, create_delta(previous, body)))
        else:
            build.append(Full(OBJ_BLOB, body))
        previous = body
    pack = _pack(build)
    tracemalloc.start()
    try:
        result = index_pack(BytesSource(pack), compiled=compiled)
        gc.collect()  # the reference's indexer, its closures and caches
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.compiled is compiled
    assert len(result.objects) == count
    assert result.objects[1].base_oid == result.objects[0].oid
    assert held < count * 100, f"{held / count:.0f} bytes per entry"
