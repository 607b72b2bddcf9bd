"""The state codec: golden vectors, round trips, strict decoding and corruption.

Commands, checkpoints, changes and ref values. STYLE rule 3: golden vectors
from a committed generator (``testdata/make_state_vectors.py``), a round-trip
property, decoding whole, byte by byte (every prefix) and with trailing data,
and a corruption test that flips each byte and cuts each prefix of every
vector and proves only the typed error escapes. Randomised parts print their
seed (``ENROUTE_SEED=<n>``).
"""

from __future__ import annotations

import importlib.util
import os
import random
import secrets
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType, ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData, InvalidArgument, LimitExceeded
from enroute_core.base.ids import LogIndex, ObjectId
from enroute_core.base.limits import Limits
from enroute_core.state import (
    Activate,
    Change,
    Command,
    Commit,
    Delete,
    LayerEntry,
    LayerKind,
    NewLayer,
    PlacedLayer,
    RefUpdate,
    RefValue,
    ReplaceLayers,
    RepoState,
    decode_change,
    decode_command,
    decode_ref_value,
    decode_state,
    encode_change,
    encode_command,
    encode_ref_value,
    encode_state,
)

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))
TESTDATA = Path(__file__).resolve().parent / "testdata"


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_state_vectors", TESTDATA / "make_state_vectors.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
VECTORS: dict[str, bytes] = {
    path.stem: path.read_bytes() for path in sorted(TESTDATA.glob("*.bin"))
}


def _decoder(name: str) -> Callable[[bytes], object]:
    if name.startswith("change"):
        return decode_change
    if name.startswith("checkpoint"):
        return decode_state
    if name == "ref-value":
        return decode_ref_value
    return decode_command


def _reencode(value: object) -> bytes:
    if isinstance(value, RepoState):
        return encode_state(value)
    if isinstance(value, RefValue):
        return encode_ref_value(value)
    if isinstance(value, Change):
        return encode_change(value)
    return encode_command(value)  # type: ignore[arg-type]


# -- golden vectors ---------------------------------------------------------------------------


def test_golden_vectors_are_current() -> None:
    assert set(VECTORS) == set(GEN.vectors()), "regenerate: make_state_vectors.py"
    for name, data in GEN.vectors().items():
        assert VECTORS[name] == data, f"{name}.bin differs from what the encoder writes"


def test_golden_vectors_decode_to_their_values() -> None:
    for name, cmd in GEN.commands().items():
        assert decode_command(VECTORS[name]) == cmd
    for name, state in GEN.states().items():
        assert decode_state(VECTORS[name]) == state
    for name, change in GEN.changes().items():
        assert decode_change(VECTORS[name]) == change
    assert decode_ref_value(VECTORS["ref-value"]) == RefValue(GEN.A, GEN.T0)


def test_delete_vector_byte_layout() -> None:
    """The layout of docs/formats/state.md, field by field."""
    data = VECTORS["delete"]
    assert data[:4] == b"ENRC" and data[4] == 1 and data[5] == 4  # magic, format, kind
    assert data[6:8] == b"\0\0" and struct.unpack(">Q", data[8:16]) == (8,)
    assert struct.unpack(">Q", data[16:24]) == (1,)  # incarnation
    assert struct.unpack(">I", data[24:]) == (zlib.crc32(data[:24]),)
    assert data.hex() == "454e52430104000000000000000000080000000000000001074128bf"


def test_ref_value_is_oid_then_eight_byte_time() -> None:
    """Seed 001, "Ref update times": the time follows the oid in the value (8 bytes)."""
    data = VECTORS["ref-value"]
    assert len(data) == 28 and data[:20] == GEN.A
    assert int.from_bytes(data[20:], "big") == GEN.T0


def test_checkpoint_header_and_refs_in_byte_order() -> None:
    state = GEN.states()["checkpoint-live"]
    data = VECTORS["checkpoint-live"]
    assert data[:6] == b"ENRS\x01\x01"
    refs_at = 16 + 45 + 2 + len(state.head)  # frame header, fixed fields, head
    assert int.from_bytes(data[refs_at : refs_at + 4], "big") == len(state.refs) >= 2
    names = sorted(state.refs)
    positions = [data.index(name, refs_at) for name in names]
    assert positions == sorted(positions)
    for name in names:
        value = state.refs[name]
        at = data.index(name, refs_at) + len(name)
        assert data[at : at + 28] == encode_ref_value(value)


# -- strict decoding: whole, every prefix, trailing data ----------------------------------------


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_every_prefix_and_trailing_data_is_corrupt(name: str) -> None:
    decode = _decoder(name)
    data = VECTORS[name]
    decode(data)
    for cut in range(len(data)):
        with pytest.raises(CorruptData):
            decode(data[:cut])
    for extra in (b"\0", b"x" * 9):
        with pytest.raises(CorruptData):
            decode(data + extra)


@pytest.mark.parametrize("name", sorted(n for n in VECTORS if n != "ref-value"))
def test_corruption_flip_each_byte_only_corrupt_data(name: str) -> None:
    """Every framed vector; a ref value has no checksum of its own (the state store's
    pages carry theirs), so any 28 bytes with a non-zero oid and a time below 2**63 are one."""
    decode = _decoder(name)
    data = VECTORS[name]
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[i] ^= mask
            with pytest.raises(CorruptData):
                decode(bytes(bad))


def _with_crc(body_mutated: bytearray) -> bytes:
    body_mutated[-4:] = struct.pack(">I", zlib.crc32(body_mutated[:-4]))
    return bytes(body_mutated)


@pytest.mark.parametrize("name", sorted(n for n in VECTORS if n != "ref-value"))
def test_corruption_with_a_valid_crc_raises_only_typed_errors(name: str) -> None:
    """Past the crc, every field is still checked: a changed byte with a recomputed crc
    decodes to a valid value that re-encodes to the same bytes, or raises a typed error."""
    decode = _decoder(name)
    allowed: tuple[type[Exception], ...] = (CorruptData, LimitExceeded)
    if not name.startswith(("checkpoint", "change")):
        allowed = (*allowed, InvalidArgument)
    data = VECTORS[name]
    rng = random.Random(SEED)
    decoded_ok = 0
    for i in range(16, len(data) - 4):
        for value in {data[i] ^ 0x01, data[i] ^ 0x80, 0x00, 0xFF, rng.randrange(256)}:
            bad = bytearray(data)
            bad[i] = value
            try:
                decoded = decode(_with_crc(bad))
            except allowed:
                continue
            decoded_ok += 1
            assert _reencode(decoded) == _with_crc(bad), (i, value)  # one value, one encoding
    assert decoded_ok > 0


def test_ref_value_rejects_wrong_length_zero_oid_and_huge_time() -> None:
    with pytest.raises(CorruptData):
        decode_ref_value(b"\x01" * 27)
    with pytest.raises(CorruptData):
        decode_ref_value(b"\0" * 28)
    with pytest.raises(CorruptData):
        decode_ref_value(b"\x01" * 20 + b"\xff" * 8)


# -- specific refusals ------------------------------------------------------------------------


def _reframe(data: bytes, body: bytes) -> bytes:
    header = data[:8] + struct.pack(">Q", len(body))
    out = bytearray(header + body + b"\0\0\0\0")
    return _with_crc(out)


def test_unknown_format_version_and_kind_are_corrupt() -> None:
    data = VECTORS["delete"]
    for offset, value in ((4, 2), (5, 9), (6, 1)):
        bad = bytearray(data)
        bad[offset] = value
        with pytest.raises(CorruptData) as info:
            decode_command(_with_crc(bad))
        assert info.value.section == "header"
    with pytest.raises(CorruptData) as info:
        decode_state(data)
    assert info.value.section == "header"  # a command is not a checkpoint


def test_checkpoint_with_unsorted_refs_is_corrupt() -> None:
    state = GEN.states()["checkpoint-live"]
    data = bytearray(VECTORS["checkpoint-live"])
    first, second = sorted(state.refs)
    assert len(first) == len(second)
    i, j = data.index(first), data.index(second)
    data[i : i + len(first)], data[j : j + len(second)] = second, first
    with pytest.raises(CorruptData) as info:
        decode_state(_with_crc(data))
    assert info.value.section == "refs"


def test_checkpoint_breaking_an_invariant_is_corrupt() -> None:
    state = GEN.states()["checkpoint-live"]
    data = VECTORS["checkpoint-live"]
    # next_id is at body offset 1 + 8 * 3 + 4 = 29; below the manifest's end it breaks it
    body = bytearray(data[16:-4])
    body[29:37] = struct.pack(">Q", state.next_id - 1)
    with pytest.raises(CorruptData) as info:
        decode_state(_reframe(data, bytes(body)))
    assert info.value.section == "invariants"


def test_command_with_zero_oid_is_invalid_argument() -> None:
    cmd = Commit(1, (RefUpdate(b"refs/heads/main", None, ObjectId(b"\x01" * 20)),), None, 5, True)
    data = bytearray(encode_command(cmd))
    at = data.index(b"\x01" * 20)
    data[at : at + 20] = b"\0" * 20
    with pytest.raises(InvalidArgument):
        decode_command(_with_crc(data))
    with pytest.raises(InvalidArgument):
        encode_command(
            Commit(1, (RefUpdate(b"refs/x", None, ObjectId(b"\0" * 20)),), None, 5, True)
        )


def test_limits_bound_frames_and_counts_on_both_sides() -> None:
    small = Limits(state_ref_updates_max=1, state_command_bytes_max=64)
    two = Commit(
        1,
        (RefUpdate(b"refs/heads/a", None, GEN.A), RefUpdate(b"refs/heads/b", None, GEN.B)),
        None,
        5,
        True,
    )
    with pytest.raises(LimitExceeded):
        encode_command(two, limits=small)
    with pytest.raises(LimitExceeded):
        decode_command(encode_command(two), limits=small)
    with pytest.raises(LimitExceeded):
        decode_command(VECTORS["commit-push-inline"], limits=Limits(state_command_bytes_max=64))
    with pytest.raises(LimitExceeded):
        decode_state(VECTORS["checkpoint-live"], limits=Limits(state_refs_max=1))
    with pytest.raises(LimitExceeded):
        decode_state(VECTORS["checkpoint-live"], limits=Limits(state_layers_max=1))


# -- round trips ------------------------------------------------------------------------------

_oids = st.binary(min_size=20, max_size=20).filter(lambda b: b != b"\0" * 20).map(ObjectId)
_roots = st.binary(min_size=32, max_size=32)
_u63 = st.integers(0, 2**63 - 1)


@st.composite
def _new_layers(draw: st.DrawFn) -> NewLayer:
    count = draw(st.integers(1, 2**32))
    meta = draw(st.integers(0, 50))
    if draw(st.booleans()):
        data = draw(st.binary(min_size=max(meta, 1), max_size=64))
        return NewLayer(LayerKind.INLINE, count, len(data), meta, draw(_roots), data=data)
    size = draw(st.integers(max(meta, 1), 2**64 - 1))
    return NewLayer(
        LayerKind.STORED, count, size, meta, draw(_roots), draw(st.integers(0, 2**64 - 1))
    )


@st.composite
def _commands(draw: st.DrawFn) -> Command:
    kind = draw(st.sampled_from(["activate", "commit", "replace", "delete"]))
    inc = draw(st.integers(1, 2**64 - 1))
    if kind == "activate":
        head = draw(st.none() | st.binary(max_size=80))
        return Activate(draw(st.booleans()), head, draw(st.integers(1, 2**32 - 1)))
    if kind == "delete":
        return Delete(inc)
    if kind == "commit":
        names = draw(st.lists(st.binary(max_size=40), unique=True, max_size=5))
        updates = tuple(
            RefUpdate(n, draw(st.none() | _oids), draw(st.none() | _oids)) for n in names
        )
        layer = draw(st.none() | _new_layers())
        return Commit(inc, updates, layer, draw(_u63), draw(st.booleans()), draw(st.booleans()))
    outputs = []
    for _ in range(draw(st.integers(0, 3))):
        layer = draw(_new_layers())
        first = draw(st.integers(0, 2**32 - 1))
        count = draw(st.integers(min(layer.object_count, 2**32 - first), 2**32 - first))
        if layer.object_count > count:
            continue
        outputs.append(PlacedLayer(first, count, layer))
    roots = tuple(draw(st.lists(_roots, min_size=1, max_size=4)))
    return ReplaceLayers(inc, draw(st.integers(0, 2**32 - 1)), roots, tuple(outputs))


@hypothesis_seed(SEED)
@settings(max_examples=300, deadline=None)
@given(_commands())
def test_round_trip_every_command(cmd: Command) -> None:
    data = encode_command(cmd)
    assert decode_command(data) == cmd
    assert encode_command(decode_command(data)) == data


@hypothesis_seed(SEED)
@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([b"refs/heads/main", b"refs/heads/x/y", b"refs/tags/v1.0", b"refs/z"]),
        st.builds(RefValue, _oids, _u63),
    ),
    st.lists(st.tuples(st.integers(1, 1000), st.booleans(), _roots), max_size=5),
    st.none() | _u63,
)
def test_round_trip_live_checkpoints(
    refs: dict[bytes, RefValue], layers: list[tuple[int, bool, bytes]], last_push: int | None
) -> None:
    manifest = []
    next_id = 7
    for count, is_inline, root in layers:
        kind = LayerKind.INLINE if is_inline else LayerKind.STORED
        gen, pin = (0, LogIndex(next_id)) if is_inline else (next_id % 90, LogIndex(0))
        manifest.append(LayerEntry(kind, next_id, count + 3, count, gen, 99, 9, root, pin))
        next_id += count + 5
    state = RepoState(
        incarnation=3,
        version=40,
        head=b"refs/heads/main",
        head_kept=bool(len(refs) % 2),
        refs=MappingProxyType(dict(reversed(list(refs.items())))),
        manifest=tuple(manifest),
        next_id=next_id,
        upload_gen=100,
        upload_window=64,
        last_push_us=last_push,
    )
    data = encode_state(state)
    assert decode_state(data) == state
    assert encode_state(decode_state(data)) == data
