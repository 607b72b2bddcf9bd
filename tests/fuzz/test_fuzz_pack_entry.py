"""Fuzz target: the compiled pack entry reader (``enroute_native.pack_entry``) in the scanner.

gitformat-pack, "Pack file entry"; docs/native.md. ``PackScanner`` reads the
usual entry through ``inflate_entry`` and everything else itself. Inputs: the
packs of ``test_fuzz_pack`` (real and written packs mutated as entry lists,
lying size headers, huge sizes, bad types and bases, cut or padded streams,
re-framed with a right or wrong trailer), small scan windows so that streams
cross them, and small limits. Property: the scanner with the compiled path and
the scanner without it (the reference) yield the same entries and end the same
way: both complete, or both raise the same typed error with the same message.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

import pytest
from fuzzkit import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from packmodel import SEED_MODELS, build, edge_cases, entry_header, packs

import enroute_core.git.pack as pack_module
from enroute_core.base.errors import EnrouteError
from enroute_core.base.limits import Limits
from enroute_core.git.pack import iter_entries
from enroute_core.git.source import BytesSource

pytestmark = pytest.mark.fuzz

LIMITS = st.sampled_from(
    [Limits(), Limits(object_bytes_max=4096, delta_bytes_max=512, pack_inflate_free_bytes=64)]
)
WINDOWS = st.sampled_from([pack_module.SCAN_WINDOW_BYTES, 64, 97, 4096])


def _agree(pack: bytes, limits: Limits, window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _scan(pack, limits, window)
    with monkeypatch.context() as m:
        m.setattr(pack_module, "inflate_entry", lambda *args: None)
        reference = _scan(pack, limits, window)
    assert compiled == reference


def _scan(pack: bytes, limits: Limits, window: int) -> tuple[list[object], str | None]:
    seen: list[object] = []
    try:
        for entry in iter_entries(BytesSource(pack), limits, window):
            seen.append(entry)
    except EnrouteError as exc:
        return seen, f"{type(exc).__name__}: {exc}"
    return seen, None


@fuzz_settings(300)
@given(pack=packs(), limits=LIMITS, window=WINDOWS)
def test_the_compiled_entry_reader_changes_nothing(
    pack: bytes, limits: Limits, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _agree(pack, limits, window, monkeypatch)


@pytest.mark.parametrize("window", [pack_module.SCAN_WINDOW_BYTES, 64, 97])
def test_the_compiled_entry_reader_leaves_every_edge_to_the_scanner(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Directed, not drawn: lying sizes (one off, zero, past 56 and 64 bits), cut,
    damaged and padded streams, bad types and OFS bases, at the first, a middle
    and the last entry of every seed pack, whole and cut at every 7th byte."""
    small = Limits(object_bytes_max=4096, delta_bytes_max=512, pack_inflate_free_bytes=64)
    for model in SEED_MODELS:
        last = len(model.entries) - 1
        for index in sorted({0, last // 2, last}):
            for case in edge_cases(model, index):
                pack = build(case)
                for limits in (Limits(), small):
                    _agree(pack, limits, window, monkeypatch)
        whole = build(model)
        for cut in range(12, len(whole), 7):
            _agree(whole[:cut], Limits(), window, monkeypatch)


@pytest.mark.parametrize("distance", [b"\x00", b"\x0c", b"\x0d", b"\x80\x00", b"\xff" * 11])
def test_the_compiled_entry_reader_leaves_odd_ofs_distances_to_the_scanner(
    distance: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OFS distances packmodel never writes: zero, to the pack header, too long."""
    body = b"blob body"
    full = entry_header(3, len(body)) + zlib.compress(body)
    delta = b"\x09\x09\x90\x09"  # copy the whole base
    ofs = entry_header(6, len(delta)) + distance + zlib.compress(delta)
    raw = b"PACK" + struct.pack(">II", 2, 2) + full + ofs
    _agree(raw + hashlib.sha1(raw).digest(), Limits(), pack_module.SCAN_WINDOW_BYTES, monkeypatch)
