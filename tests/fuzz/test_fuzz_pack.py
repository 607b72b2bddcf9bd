"""Fuzz target: the pack reader and indexer (``enroute_core.git.pack``, ``packindexer``).

gitformat-pack, "pack-*.pack files have the following format", "Deltified
representation"; git-index-pack ``--fix-thin``. Inputs: real packs from
``git pack-objects`` and packs our writer makes, mutated as entry lists
(bodies and deltas changed, size headers that lie, huge declared sizes, types
0..7, OFS bases anywhere, REF bases known, unknown or in the pack, streams
cut or padded, entries dropped, repeated or swapped, header count and version
changed) and re-framed with a correct or a wrong trailer; byte mutations with
and without a fixed trailer; raw bytes. Thin-pack bases come from a store
that holds some of the objects. Properties: ``index_pack``, ``iter_entries``
and ``read_entry_at`` raise only ``InvalidPack``, ``InvalidDelta``,
``LimitExceeded`` or ``MissingObject``; each finishes within the deadline; a
successful index agrees with the objects the store would hash; peak memory
stays bounded whatever sizes the headers declare.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from fuzzkit import fuzz_settings, peak_allocation, typed_errors
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st
from packmodel import (
    HUGE_SIZES,
    KNOWN,
    KNOWN_OIDS,
    SEED_MODELS,
    SMALL_LIMITS,
    PackModel,
    build,
    packs,
)

from enroute_core.base.errors import InvalidDelta, InvalidPack, LimitExceeded, MissingObject
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.delta import encode_varint
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import OBJ_OFS_DELTA, iter_entries, read_entry_at
from enroute_core.git.packindexer import index_pack
from enroute_core.git.source import BytesSource
from enroute_core.git.thin import ExternalBaseFn

pytestmark = pytest.mark.fuzz

ALLOWED = (InvalidPack, InvalidDelta, LimitExceeded, MissingObject)
SMALL = SMALL_LIMITS
LIMITS = st.sampled_from([Limits(), Limits(), SMALL])
MEMORY_BOUND_BYTES = 8 * 1024 * 1024


def _store(known: frozenset[ObjectId]) -> ExternalBaseFn:
    def lookup(oid: ObjectId) -> tuple[int, bytes] | None:
        return KNOWN[oid] if oid in known else None

    return lookup


@fuzz_settings(800)
@given(
    pack=packs(),
    limits=LIMITS,
    known=st.just(frozenset(KNOWN_OIDS)) | st.frozensets(st.sampled_from(KNOWN_OIDS)),
)
def test_index_pack(pack: bytes, limits: Limits, known: frozenset[ObjectId]) -> None:
    seen: list[tuple[ObjectId, int, bytes]] = []
    with typed_errors(*ALLOWED) as caught:
        result = index_pack(
            BytesSource(pack),
            limits=limits,
            external_base=_store(known),
            on_object=lambda i, oid, t, body: seen.append((oid, t, body)),
        )
    tally(f"index_pack: {type(caught[0]).__name__ if caught else 'indexed'}")
    if caught:
        return
    for oid, type_num, body in seen:
        assert object_id(ObjectType(type_num), body) == oid
    assert len(result.objects) == result.header.count
    assert set(result.external_bases) <= known


@fuzz_settings(400)
@given(pack=packs(), limits=LIMITS, offsets=st.lists(st.integers(0, 1200), max_size=4))
def test_entries_and_random_reads(pack: bytes, limits: Limits, offsets: list[int]) -> None:
    source = BytesSource(pack)
    with typed_errors(*ALLOWED):
        for entry in iter_entries(source, limits, window_bytes=64):
            assert len(entry.data) == entry.header.size
            offsets.append(entry.offset)
    for offset in offsets:
        with typed_errors(*ALLOWED):
            entry = read_entry_at(source, offset, limits)
            assert len(entry.data) == entry.header.size


@st.composite
def _huge_models(draw: st.DrawFn) -> PackModel:
    """An entry (full or delta) whose header, or delta header, declares a huge size."""
    model = draw(st.sampled_from(SEED_MODELS))
    entries = list(model.entries)
    i = draw(st.integers(0, len(entries) - 1))
    e = entries[i]
    huge = draw(st.sampled_from(HUGE_SIZES))
    if draw(st.booleans()) or e.type_num < OBJ_OFS_DELTA:
        entries[i] = replace(e, declared=huge)
    else:  # a delta whose own header (base size right) promises a huge target
        src = (
            e.base_body if e.base_body is not None else KNOWN[draw(st.sampled_from(KNOWN_OIDS))][1]
        )
        copies = b"\x90\x00" * draw(st.integers(1, 8))  # copy 0x10000 bytes from offset 0
        entries[i] = replace(e, data=encode_varint(len(src)) + encode_varint(huge) + copies)
    return PackModel(tuple(entries))


@fuzz_settings(100)
@given(model=_huge_models())
def test_declared_huge_sizes_stay_in_memory_bounds(model: PackModel) -> None:
    pack = build(model)
    with peak_allocation(MEMORY_BOUND_BYTES), typed_errors(*ALLOWED):
        index_pack(BytesSource(pack), external_base=_store(frozenset(KNOWN_OIDS)))
