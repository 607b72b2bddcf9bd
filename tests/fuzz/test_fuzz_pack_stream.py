"""Fuzz target: a pack indexed while it arrives ends as the whole pack's index ends.

docs/ingest.md, "Speed" (streaming); git's ``index-pack --stdin`` reads its input
as it parses it (builtin/index-pack.c, ``fill()``) and judges the trailer at the
end. Inputs: the packs of ``test_fuzz_pack`` (real and written packs mutated as
entry lists: lying sizes, cut or padded streams, stray bytes, bad trailers) and
the limits of ``test_fuzz_pack_index``, fed to a
:class:`~enroute_core.storage.growing.GrowingSpool` in pieces of drawn sizes by a
writer thread. Property: :func:`index_pack` over the growing pack answers what
it answers over the whole pack, the same result or the same typed error; the
compiled pass may give up where it did not (it bounds the deltas' declared
results by the bytes read so far), and the reference then judges the whole pack.
"""

from __future__ import annotations

import threading

import pytest
from fuzzkit import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from packmodel import KNOWN, SEED_MODELS, build, packs
from test_fuzz_pack_index import LIMITS

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.packindexer import PackIndexResult, index_pack
from enroute_core.git.source import ByteSource, BytesSource
from enroute_core.storage.growing import GrowingSpool

pytestmark = pytest.mark.fuzz


def _lookup(oid: ObjectId) -> tuple[int, bytes] | None:
    return KNOWN.get(oid)


def _index(source: ByteSource, limits: Limits) -> PackIndexResult | str:
    try:
        result = index_pack(source, limits=limits, external_base=_lookup)
    except EnrouteError as exc:
        return f"{type(exc).__name__}: {exc}"
    return result


def _streamed(pack: bytes, limits: Limits, piece_bytes: int) -> PackIndexResult | str:
    spool = BytesSource(pack)  # read only below what was reported grown
    source = GrowingSpool(spool)

    def feed() -> None:
        for at in range(piece_bytes, len(pack) + piece_bytes, piece_bytes):
            source.grew(min(at, len(pack)))
        source.end()

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        return _index(source, limits)
    finally:
        writer.join()


def _same(whole: PackIndexResult | str, streamed: PackIndexResult | str) -> None:
    if isinstance(whole, str) or isinstance(streamed, str):
        assert streamed == whole
        return
    # which pass ran may differ (the streamed compiled pass may leave a pack to the reference)
    assert streamed.objects == whole.objects
    assert (streamed.header, streamed.external_bases, streamed.checksum) == (
        whole.header, whole.external_bases, whole.checksum,
    )  # fmt: skip


@fuzz_settings(300)
@given(pack=packs(), limits=LIMITS, piece_bytes=st.integers(1, 5000))
def test_a_growing_pack_indexes_as_the_whole_pack(
    pack: bytes, limits: Limits, piece_bytes: int
) -> None:
    _same(_index(BytesSource(pack), limits), _streamed(pack, limits, piece_bytes))


def test_the_seed_packs_index_streamed_by_the_compiled_pass() -> None:
    for model in SEED_MODELS:
        pack = build(model)
        streamed = _streamed(pack, Limits(), 777)
        assert not isinstance(streamed, str) and streamed.compiled, model
        _same(_index(BytesSource(pack), Limits()), streamed)
