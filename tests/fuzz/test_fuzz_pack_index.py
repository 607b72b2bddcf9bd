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
"""

from __future__ import annotations

import pytest
from fuzzkit import fuzz_settings
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st
from packmodel import KNOWN, KNOWN_OIDS, SEED_MODELS, build, packs

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.packindexer import PackIndexer, PackIndexResult
from enroute_core.git.source import BytesSource
from enroute_core.git.thin import ExternalBaseFn

pytestmark = pytest.mark.fuzz

SMALL = Limits(
    delta_chain_depth_max=2,
    pack_base_cache_bytes_max=64,
    object_bytes_max=4096,
    delta_bytes_max=4096,
    pack_inflate_free_bytes=64,
    pack_objects_max=12,
)
LIMITS = st.sampled_from([Limits(), Limits(pack_base_cache_bytes_max=64), SMALL])

Seen = list[tuple[int, ObjectId, int, bytes]]
Outcome = tuple[PackIndexResult | None, str | None]


def _store(known: frozenset[ObjectId]) -> ExternalBaseFn:
    def lookup(oid: ObjectId) -> tuple[int, bytes] | None:
        return KNOWN[oid] if oid in known else None

    return lookup


def _run(
    pack: bytes, limits: Limits, known: frozenset[ObjectId], compiled: bool
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
        )
        result = indexer._run_compiled() if compiled else indexer.run()
    except EnrouteError as exc:
        return (None, f"{type(exc).__name__}: {exc}"), seen
    return (result, None), seen


def agree(pack: bytes, limits: Limits, known: frozenset[ObjectId]) -> str:
    """Check the property for one input; return how the compiled pass ended."""
    compiled, compiled_seen = _run(pack, limits, known, compiled=True)
    reference, reference_seen = _run(pack, limits, known, compiled=False)
    if compiled == (None, None):
        assert compiled_seen == reference_seen[: len(compiled_seen)]
        return "gave up"
    assert compiled == reference
    assert compiled_seen == reference_seen
    return "indexed" if compiled[1] is None else "raised"


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


@pytest.mark.parametrize("limits", [Limits(), Limits(pack_base_cache_bytes_max=0)])
def test_the_seed_packs_take_the_compiled_pass(limits: Limits) -> None:
    """Real git packs, the writer's packs and the resolution orders (deferred REF bases,
    OFS deltas on them, thin bases): none is left to the reference."""
    for model in SEED_MODELS:
        assert agree(build(model), limits, frozenset(KNOWN_OIDS)) == "indexed", model
