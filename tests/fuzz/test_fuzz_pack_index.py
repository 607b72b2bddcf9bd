"""Fuzz target: the compiled pack indexer (``enroute_native.pack_index``) against the reference.

gitformat-pack, "Deltified representation"; docs/native.md. ``PackIndexer``
runs the compiled pass first and the Python reference when it gives up.
Inputs: the packs of ``test_fuzz_pack`` (real and written packs mutated as
entry lists: lying sizes, bad types and bases, cut or padded streams, deltas
that do not apply, REF bases known, unknown or later in the pack), stores that
hold some of the thin bases, and small limits (a cache of 64 bytes, so bases
are rebuilt; chains of depth 2). Property: the compiled pass either gives up
having shown ``on_object`` a prefix of what the reference shows, or ends as
the reference ends: the same objects, the same ``on_object`` calls in the same
order and the same thin bases, or the same typed error with the same message.
Each input runs the compiled pass in the calling thread alone (``threads=1``) and
with worker threads applying deltas and hashing (``THREADS``): the property holds
for both, and when both end they end alike.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import pytest
from fuzzkit import fuzz_settings, peak_allocation
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st
from packmodel import (
    KNOWN,
    KNOWN_OIDS,
    SEED_MODELS,
    SMALL_LIMITS,
    Entry,
    PackModel,
    build,
    edge_cases,
    packs,
)

from enroute_core.base.errors import EnrouteError, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.delta import create_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import OBJ_OFS_DELTA, OBJ_REF_DELTA, SCAN_WINDOW_BYTES
from enroute_core.git.packindexer import PackIndexer, PackIndexResult
from enroute_core.git.source import BytesSource
from enroute_core.git.thin import ExternalBaseFn

pytestmark = pytest.mark.fuzz

SMALL = replace(SMALL_LIMITS, pack_inflate_free_bytes=64)  # the zlib-bomb rule reached too
# The delta expansion bound (charge_delta) reached too: deltas may declare the pack's size.
EXPANSION = Limits(pack_delta_expansion_free_bytes=0, pack_delta_expansion_ratio_max=1)
# Blobs over 64 bytes streamed, not held (hashed as they inflate; a delta on one rebuilds
# it): with the zlib-bomb rule reached too, and with no cache.
STREAMED = Limits(pack_stream_threshold_bytes=64)
SMALL_STREAMED = replace(SMALL, pack_stream_threshold_bytes=64)
LIMITS = st.sampled_from(
    [
        Limits(),
        Limits(pack_base_cache_bytes_max=64),
        SMALL,
        EXPANSION,
        STREAMED,
        SMALL_STREAMED,
        replace(STREAMED, pack_base_cache_bytes_max=0),
    ]
)

THREADS = 4  # more workers than the CI machine's cores: they take turns, and wait on each other
Seen = list[tuple[int, ObjectId, int, bytes | None]]
Outcome = tuple[PackIndexResult | None, str | None]


def _store(known: frozenset[ObjectId]) -> ExternalBaseFn:
    def lookup(oid: ObjectId) -> tuple[int, bytes] | None:
        return KNOWN[oid] if oid in known else None

    return lookup


def _run(
    pack: bytes, limits: Limits, known: frozenset[ObjectId], compiled: bool, threads: int = 1
) -> tuple[Outcome, Seen]:
    """(result, None), (None, error) or, for a compiled pass that gave up, (None, None);
    with the ``on_object`` calls it made."""
    seen: Seen = []
    try:
        indexer = PackIndexer(
            BytesSource(pack),
            limits=limits,
            external_base=_store(known),
            on_object=lambda *call: seen.append(call),
            compiled=compiled,
            threads=threads,
        )
        result = indexer._run_compiled() if compiled else indexer.run()
    except EnrouteError as exc:
        return (None, f"{type(exc).__name__}: {exc}"), seen
    if result is not None and not compiled:
        assert not result.compiled
        result = replace(result, compiled=True)  # the one field that says which pass ran
    return (result, None), seen


def agree(pack: bytes, limits: Limits, known: frozenset[ObjectId]) -> str:
    """Check the property for one input, with one thread and with :data:`THREADS`; return how
    the one-thread compiled pass ended."""
    reference, reference_seen = _run(pack, limits, known, compiled=False)
    ends = []
    for threads in (1, THREADS):
        compiled, compiled_seen = _run(pack, limits, known, compiled=True, threads=threads)
        if compiled == (None, None):
            assert compiled_seen == reference_seen[: len(compiled_seen)], threads
            ends.append("gave up")
            continue
        assert compiled == reference, threads
        assert compiled_seen == reference_seen, threads
        ends.append("indexed" if compiled[1] is None else "raised")
    # A threaded pass reads ahead: it may give up on a later entry before an earlier one's
    # on_object raises (the reference then raises it); otherwise it ends as the one thread.
    assert ends[1] == ends[0] or (ends[0] == "raised" and ends[1] == "gave up"), ends
    return ends[0]


@fuzz_settings(500)
@given(
    pack=packs(),
    limits=LIMITS,
    known=st.just(frozenset(KNOWN_OIDS)) | st.frozensets(st.sampled_from(KNOWN_OIDS)),
)
def test_the_compiled_indexer_changes_nothing(
    pack: bytes, limits: Limits, known: frozenset[ObjectId]
) -> None:
    tally(f"compiled pass: {agree(pack, limits, known)}")


@pytest.mark.parametrize(
    "limits",
    [Limits(), Limits(pack_base_cache_bytes_max=0), STREAMED],
    ids=["default", "no cache", "streamed"],
)
def test_the_seed_packs_take_the_compiled_pass(limits: Limits) -> None:
    """Real git packs, the writer's packs and the resolution orders (deferred REF bases,
    OFS deltas on them, thin bases): none is left to the reference."""
    for model in SEED_MODELS:
        assert agree(build(model), limits, frozenset(KNOWN_OIDS)) == "indexed", model


def test_the_compiled_indexer_leaves_every_edge_to_the_reference() -> None:
    """Directed, not drawn: packmodel's edge cases (lying sizes, cut, damaged and padded
    streams, bad types, OFS bases off their entry) at the first, a middle and the last
    entry of every seed pack, and every seed pack cut at every 7th byte."""
    known = frozenset(KNOWN_OIDS)
    for model in SEED_MODELS:
        last = len(model.entries) - 1
        for index in sorted({0, last // 2, last}):
            for case in edge_cases(model, index):
                for limits in (Limits(), SMALL, SMALL_STREAMED):
                    agree(build(case), limits, known)
        whole = build(model)
        for cut in range(12, len(whole), 7):
            agree(whole[:cut], Limits(), known)


def test_the_zlib_bomb_rule_at_its_boundary() -> None:
    """Past ``pack_inflate_free_bytes`` an entry inflates to at most ``ratio`` times the
    deflated bytes fed: at the bound it is indexed, one byte over it the reference refuses."""
    body = bytes(3000) + b"tail"
    fed = len(zlib.compress(body))
    pack = build(PackModel((Entry(3, body),)))
    for ratio, stream in ((1, 1 << 30), (3, 1 << 30), (1, 0), (3, 0)):  # held, then streamed
        free = len(body) - ratio * fed
        at_bound = Limits(
            pack_inflate_free_bytes=free, pack_inflate_ratio_max=ratio,
            pack_stream_threshold_bytes=stream,
        )  # fmt: skip
        assert agree(pack, at_bound, frozenset()) == "indexed"
        over = replace(at_bound, pack_inflate_free_bytes=free - 1)
        assert agree(pack, over, frozenset()) != "indexed"
        with pytest.raises(LimitExceeded):
            PackIndexer(BytesSource(pack), limits=over, compiled=False).run()


def test_a_ref_base_held_twice_is_its_first_copy() -> None:
    """An object in the pack twice (whole, then as a delta): a REF_DELTA on it takes the
    first copy, as the reference's by-oid table does, so its depth is 1, not 2."""
    x, y = b"x body\n" * 40, b"y body\n" * 40
    z = x + b"z\n"
    x_oid = object_id(ObjectType.BLOB, x)
    model = PackModel(
        (
            Entry(3, x),
            Entry(3, y),
            Entry(OBJ_OFS_DELTA, create_delta(y, x), base_index=1, base_body=y),
            Entry(OBJ_REF_DELTA, create_delta(x, z), base_oid=x_oid, base_body=x),
        )
    )
    assert agree(build(model), Limits(), frozenset()) == "indexed"
    result = PackIndexer(BytesSource(build(model)))._run_compiled()
    assert result is not None
    assert [o.depth for o in result.objects] == [0, 0, 1, 1]


def test_deltas_waiting_on_one_base_resolve_in_pack_order() -> None:
    """Three REF_DELTAs before their base: the reference settles them first to last once
    it arrives, and ``on_object`` sees them in that order."""
    x = b"base body\n" * 50
    targets = [x + b"one\n", x + b"two\n", x + b"three\n"]
    x_oid = object_id(ObjectType.BLOB, x)
    waiting = tuple(
        Entry(OBJ_REF_DELTA, create_delta(x, t), base_oid=x_oid, base_body=x) for t in targets
    )
    on_first = create_delta(targets[0], x + b"four\n")
    child = Entry(OBJ_OFS_DELTA, on_first, base_index=0, base_body=targets[0])
    model = PackModel((*waiting, child, Entry(3, x)))
    assert agree(build(model), Limits(), frozenset()) == "indexed"


def test_a_delta_on_an_entry_that_waited_comes_in_pack_order() -> None:
    """A REF_DELTA waits for its base; the base arrives, then an unrelated entry, then an
    OFS_DELTA on the entry that waited. The reference resolves the waiting one when its base
    arrives, so the OFS_DELTA is applied at its own place, after the unrelated entry: a
    threaded pass must deliver what it queued before it decides the OFS_DELTA waits."""
    x = b"base body\n" * 50
    waited = x + b"one\n"
    x_oid = object_id(ObjectType.BLOB, x)
    model = PackModel(
        (
            Entry(OBJ_REF_DELTA, create_delta(x, waited), base_oid=x_oid, base_body=x),
            Entry(3, x),
            Entry(3, b"unrelated\n" * 30),
            Entry(OBJ_OFS_DELTA, create_delta(waited, waited + b"two\n"), base_index=0,
                  base_body=waited),
        )
    )  # fmt: skip
    assert agree(build(model), Limits(), frozenset()) == "indexed"


def test_entries_over_their_bound_are_left_to_the_reference() -> None:
    """A whole entry over ``object_bytes_max``, a delta over ``delta_bytes_max``: the
    reference refuses them before inflating, so the compiled pass must not index them."""
    big = bytes(range(256)) * 20
    over_object = PackModel((Entry(3, big),))
    over_delta = PackModel(
        (Entry(3, b"small"), Entry(OBJ_OFS_DELTA, create_delta(b"small", big), base_index=0))
    )
    limits = Limits(object_bytes_max=len(big) - 1, delta_bytes_max=64)
    for model in (over_object, over_delta):
        assert agree(build(model), limits, frozenset()) == "gave up"


def test_the_base_cache_holds_its_bound() -> None:
    """Fifty distinct 128 KiB objects through a 128 KiB cache: at its peak the pass holds
    the scan window (twice while it slides), the cache and the objects in flight, not all
    fifty bodies (6.4 MB)."""
    rng = random.Random(7)
    size = 128 * 1024
    pack = build(PackModel(tuple(Entry(3, rng.randbytes(size)) for _ in range(50))))
    limits = Limits(pack_base_cache_bytes_max=size)
    bound = 2 * SCAN_WINDOW_BYTES + size + 3 * size + 64 * 1024
    with peak_allocation(bound):
        assert PackIndexer(BytesSource(pack), limits=limits)._run_compiled() is not None
