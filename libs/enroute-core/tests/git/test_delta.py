"""Git deltas: gitformat-pack.txt, "Deltified representation".

Golden vectors are worked out by hand below (docs/formats/delta.md walks
through one). Round trips are property tests; the corruption tests flip bytes
and cut every prefix of good deltas and prove only ``InvalidDelta`` escapes,
from both the compiled and the Python apply. The interop tests check our apply
on deltas real git wrote, and real git on deltas we wrote. Randomised tests
print their seed and replay with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from dulwich._pack import apply_delta as dulwich_compiled_apply
from dulwich.pack import _apply_delta_py as dulwich_python_apply
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidDelta, LimitExceeded
from enroute_core.base.limits import Limits
from enroute_core.git import delta as delta_module
from enroute_core.git.delta import (
    apply_delta,
    apply_delta_py,
    create_delta,
    delta_sizes,
    encode_varint,
    read_varint,
)
from enroute_core.git.pack import OBJ_BLOB, PACK_HEADER_BYTES
from enroute_core.git.packindexer import PackIndexer
from enroute_core.git.packwrite import PackWriter
from enroute_core.git.source import BytesSource
from enroute_testing.gitcli import GitFailed, run_git

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))

Apply = Callable[[bytes, bytes], bytes]


def _compiled_path(base: bytes, delta: bytes) -> bytes:
    """The compiled routine behind our checks, whatever size the output is."""
    return delta_module._apply_compiled(
        base, delta, *delta_module._check_header(base, delta, Limits())
    )


def _in_a_pack(base: bytes, delta: bytes) -> bytes:
    """The compiled pack indexer's own apply (enroute_native.pack_index): the base as a
    blob and the delta as an OFS_DELTA on it. Where the pass gives up, the reference
    must refuse the delta, and its error is what this raises."""
    chunks: list[bytes] = []
    writer = PackWriter(chunks.append)
    writer.header(2)
    writer.add_full(OBJ_BLOB, base)
    writer.add_ofs_delta(PACK_HEADER_BYTES, delta)
    writer.finish()
    bodies: list[bytes] = []
    indexer = PackIndexer(
        BytesSource(b"".join(chunks)), on_object=lambda _i, _oid, _t, body: bodies.append(body)
    )
    if indexer._run_compiled() is None:
        apply_delta_py(base, delta)
        raise AssertionError("the compiled pass gave up on a delta the reference applies")
    return bodies[1]


APPLIES: dict[str, Apply] = {
    "apply_delta": apply_delta,
    "python": apply_delta_py,
    "compiled": _compiled_path,
    "pack-index": _in_a_pack,
}


def _dulwich_apply(base: bytes, delta: bytes) -> bytes:
    return b"".join(dulwich_compiled_apply(base, delta))


def _text(rng: random.Random, size: int) -> bytes:
    """Word soup with newlines: compresses and deltas like source code does."""
    words = [rng.randbytes(rng.randint(1, 6)).hex().encode() for _ in range(300)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + (b"\n" if rng.random() < 0.1 else b" ")
    return bytes(out[:size])


def _edit(rng: random.Random, data: bytes, count: int) -> bytes:
    """Random deletes, inserts and overwrites, as a commit makes them."""
    out = bytearray(data)
    for _ in range(count):
        at = rng.randrange(len(out) + 1)
        kind = rng.randrange(3)
        if kind == 0:
            del out[at : at + rng.randint(1, 40)]
        elif kind == 1:
            out[at:at] = rng.randbytes(rng.randint(1, 60))
        else:
            out[at : at + 10] = rng.randbytes(10)
    return bytes(out)


# -- golden vectors ------------------------------------------------------------

HELLO = b"hello world"
BYTES_512 = bytes(range(256)) * 2

# (name, base, delta, target), each delta worked out by hand.
GOLDEN_APPLY = [
    (
        "copy-insert-copy-insert",
        HELLO,
        # sizes 11, 13; copy off 0 len 5; insert ", "; copy off 6 len 5; insert "!"
        bytes.fromhex("0b0d") + b"\x90\x05" + b"\x02, " + b"\x91\x06\x05" + b"\x01!",
        b"hello, world!",
    ),
    (
        "offset-byte-1-only",
        BYTES_512,
        # sizes 512, 256; 0xa2 = copy, offset byte 1 (0x01), length byte 1 (0x01)
        bytes.fromhex("8004 8002") + bytes.fromhex("a2 01 01"),
        bytes(range(256)),
    ),
    (
        "length-0-means-0x10000",
        bytes(0x10000),
        # sizes 65536, 65536; 0x80 = copy with no bytes: offset 0, length 0x10000
        bytes.fromhex("808004 808004 80"),
        bytes(0x10000),
    ),
    (
        "three-length-bytes",
        bytes(range(256)) * 257,
        # sizes 65792, 65537; 0xf0 = copy, length bytes 0, 1, 2 = 01 00 01
        bytes.fromhex("808204 818004 f0010001"),
        (bytes(range(256)) * 257)[:0x10001],
    ),
    ("insert-only-from-empty-base", b"", bytes.fromhex("00 03 03") + b"abc", b"abc"),
    # git wants 4 bytes at least: the size 0 written in three bytes
    ("empty-to-empty", b"", bytes.fromhex("00 808000"), b""),
    ("empty-target", HELLO, bytes.fromhex("0b 808000"), b""),
]


@pytest.mark.parametrize("impl", APPLIES.values(), ids=APPLIES.keys())
@pytest.mark.parametrize(
    ("base", "delta", "target"),
    [case[1:] for case in GOLDEN_APPLY],
    ids=[case[0] for case in GOLDEN_APPLY],
)
def test_apply_golden(impl: Apply, base: bytes, delta: bytes, target: bytes) -> None:
    assert impl(base, delta) == target
    assert _dulwich_apply(base, delta) == target


Z = 0x20005  # zero bytes: two whole 0x10000 copies and a tail

GOLDEN_CREATE = [
    ("identical", bytes(range(64)), bytes(range(64)), bytes.fromhex("4040 9040")),
    (
        # the hit at target offset 8 (base block 16) extends 6 bytes back, 18 on
        "extend-both-ways",
        bytes(range(64)),
        b"ab" + bytes(range(10, 50)) + b"cd",
        bytes.fromhex("402c") + b"\x02ab" + bytes.fromhex("910a28") + b"\x02cd",
    ),
    (
        # copies are cut at 0x10000 as git cuts them; 0x10000 is written with no bytes
        "long-copy",
        bytes(Z),
        bytes(Z),
        bytes.fromhex("858008 858008") + bytes.fromhex("80 8401 940205"),
    ),
    (
        "inserts-of-127",
        b"",
        b"x" * 300,
        bytes.fromhex("00ac02") + b"\x7f" + b"x" * 127 + b"\x7f" + b"x" * 127 + b"\x2e" + b"x" * 46,
    ),
    ("short-base-is-not-indexed", HELLO, b"hello", bytes.fromhex("0b05") + b"\x05hello"),
    ("empty-target-padded", HELLO, b"", bytes.fromhex("0b 808000")),
    ("empty-both-padded", b"", b"", bytes.fromhex("00 808000")),
    ("empty-target-no-pad-needed", bytes(0x4000), b"", bytes.fromhex("808001 00")),
]


@pytest.mark.parametrize(
    ("base", "target", "delta"),
    [case[1:] for case in GOLDEN_CREATE],
    ids=[case[0] for case in GOLDEN_CREATE],
)
def test_create_golden(base: bytes, target: bytes, delta: bytes) -> None:
    assert create_delta(base, target) == delta
    assert apply_delta(base, delta) == target


@pytest.mark.parametrize(
    ("value", "raw"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (0x20005, b"\x85\x80\x08"),
        (2**64 - 1, None),
    ],
)
def test_varint_golden(value: int, raw: bytes | None) -> None:
    encoded = encode_varint(value)
    if raw is not None:
        assert encoded == raw
    assert read_varint(encoded + b"tail", 0) == (value, len(encoded))
    for cut in range(len(encoded)):
        with pytest.raises(InvalidDelta):
            read_varint(encoded[:cut], 0)


def test_varint_longer_than_64_bits_is_refused() -> None:
    with pytest.raises(InvalidDelta, match="too long"):
        read_varint(b"\xff" * 10 + b"\x01", 0)
    for impl in APPLIES.values():
        with pytest.raises(InvalidDelta, match="too long"):
            impl(b"", b"\x00" + b"\xff" * 10 + b"\x01")


def test_delta_sizes() -> None:
    assert delta_sizes(bytes.fromhex("858008 0b 90")) == (0x20005, 11, 4)


# -- round trips -----------------------------------------------------------------


def _check_round_trip(base: bytes, target: bytes) -> bytes:
    delta = create_delta(base, target)
    for impl in APPLIES.values():
        assert impl(base, delta) == target
    assert _dulwich_apply(base, delta) == target
    assert b"".join(dulwich_python_apply(base, delta)) == target
    return delta


@settings(max_examples=300, deadline=None)
@hypothesis_seed(SEED)
@given(st.binary(max_size=600), st.binary(max_size=600))
def test_round_trip_any_pair(base: bytes, target: bytes) -> None:
    _check_round_trip(base, target)


@settings(max_examples=150, deadline=None)
@hypothesis_seed(SEED)
@given(
    st.binary(max_size=3000),
    st.lists(
        st.tuples(st.integers(0, 2), st.floats(0, 1), st.binary(max_size=80), st.integers(0, 80)),
        max_size=8,
    ),
    st.integers(1, 4),
)
def test_round_trip_edited(
    base: bytes, edits: list[tuple[int, float, bytes, int]], reps: int
) -> None:
    base = base * reps  # repeats give blocks that occur more than once
    target = bytearray(base)
    for kind, where, payload, size in edits:
        at = int(where * len(target))
        if kind == 0:
            del target[at : at + size]
        elif kind == 1:
            target[at:at] = payload
        else:
            target[at : at + len(payload)] = payload
    _check_round_trip(base, bytes(target))


def test_round_trip_seeded_text() -> None:
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    for _ in range(30):
        base = _text(rng, rng.randint(0, 20_000))
        target = _edit(rng, base, rng.randint(0, 20)) if rng.random() < 0.8 else _text(rng, 999)
        _check_round_trip(base, target)


def test_similar_inputs_give_small_deltas() -> None:
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    base = _text(rng, 256 * 1024)
    target = _edit(rng, base, 10)
    delta = _check_round_trip(base, target)
    # ten edits of at most 60 new bytes each, plus their copy and insert ops
    assert len(delta) < 1200, len(delta)
    assert len(_check_round_trip(base, base)) < 60
    moved = base[100_000:] + base[:100_000]
    assert len(_check_round_trip(base, moved)) < 60


def test_dissimilar_inputs_cost_little_more_than_the_target() -> None:
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    base, target = rng.randbytes(100_000), rng.randbytes(100_000)
    delta = _check_round_trip(base, target)
    # one insert op per 127 literal bytes, nothing else
    assert len(delta) <= len(target) + len(target) // 127 + 1 + 8


@settings(max_examples=150, deadline=None)
@hypothesis_seed(SEED)
@given(st.binary(max_size=1500), st.binary(max_size=1500), st.integers(0, 1600))
def test_max_delta_bytes_is_exact(base: bytes, target: bytes, budget: int) -> None:
    full = create_delta(base, target)
    assert create_delta(base, target, max_delta_bytes=len(full)) == full
    assert create_delta(base, target, max_delta_bytes=len(full) - 1) is None
    bounded = create_delta(base, target, max_delta_bytes=budget)
    assert bounded == (full if len(full) <= budget else None)


def test_max_delta_bytes_gives_up_early_on_dissimilar_data() -> None:
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    base, target = rng.randbytes(300_000), rng.randbytes(300_000)
    assert create_delta(base, target, max_delta_bytes=1000) is None
    edited = _edit(rng, base, 3)
    assert create_delta(base, edited, max_delta_bytes=1000) == create_delta(base, edited)


def test_buffers_are_accepted() -> None:
    rng = random.Random(SEED)
    base = _text(rng, 5000)
    target = _edit(rng, base, 5)
    delta = create_delta(memoryview(base), bytearray(target))
    assert delta == create_delta(base, target)
    for impl in (apply_delta, apply_delta_py):
        assert impl(memoryview(base), memoryview(delta)) == target
        assert impl(bytearray(base), bytearray(delta)) == target
        assert impl(memoryview(b"x" + base)[1:], memoryview(delta)) == target


def test_large_sparse_delta_takes_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Few long copies into a large output: the join is faster (docs/delta-apply.md)."""
    rng = random.Random(SEED)
    base = rng.randbytes(2 << 20)
    target = _edit(rng, base, 4)
    delta = create_delta(base, target)
    assert apply_delta(base, delta) == target == _compiled_path(base, delta)

    def refuse(*_args: object) -> bytes:
        raise AssertionError("compiled path taken")

    monkeypatch.setattr(delta_module, "_apply_compiled", refuse)
    assert apply_delta(base, delta) == target
    with pytest.raises(AssertionError, match="compiled path"):
        apply_delta(b"hello", bytes.fromhex("0505 9005"))


# -- refusals and corruption ---------------------------------------------------


def _corruption_vectors() -> list[tuple[str, bytes, bytes]]:
    rng = random.Random(1234)  # fixed: these are vectors, not a random test
    text = _text(rng, 3000)
    big = bytes(range(256)) * 300
    vectors = [(name, base, delta) for name, base, delta, _target in GOLDEN_APPLY[:4]]
    vectors.append(("created-text", text, create_delta(text, _edit(rng, text, 6))))
    vectors.append(("created-large-offsets", big, create_delta(big, big[70_000:] + big[:5000])))
    return vectors


CORRUPTION = _corruption_vectors()


def _outcome(impl: Apply, base: bytes, delta: bytes) -> bytes | None:
    """The output, or None for InvalidDelta; anything else escapes and fails."""
    try:
        return impl(base, delta)
    except InvalidDelta:
        return None


@pytest.mark.parametrize(
    ("base", "delta"), [v[1:] for v in CORRUPTION], ids=[v[0] for v in CORRUPTION]
)
def test_every_prefix_is_refused(base: bytes, delta: bytes) -> None:
    for cut in range(len(delta)):
        for impl in APPLIES.values():
            with pytest.raises(InvalidDelta):
                impl(base, delta[:cut])


@pytest.mark.parametrize(
    ("base", "delta"), [v[1:] for v in CORRUPTION], ids=[v[0] for v in CORRUPTION]
)
def test_every_flipped_byte_gives_invalid_delta_or_agreement(base: bytes, delta: bytes) -> None:
    for at in range(len(delta)):
        for mask in (0x01, 0x10, 0x80, 0xFF):
            bad = delta[:at] + bytes([delta[at] ^ mask]) + delta[at + 1 :]
            outcomes = {name: _outcome(impl, base, bad) for name, impl in APPLIES.items()}
            assert len(set(outcomes.values())) == 1, (at, mask, outcomes)
            try:
                oracle: bytes | None = _dulwich_apply(base, bad)
            except Exception:
                oracle = None
            assert outcomes["python"] == oracle, (at, mask)


@pytest.mark.parametrize(
    ("base", "delta"), [v[1:] for v in CORRUPTION], ids=[v[0] for v in CORRUPTION]
)
def test_trailing_data_is_refused(base: bytes, delta: bytes) -> None:
    for tail in (b"\x00", b"\x01x", b"\x90\x01", b"\x80"):
        for impl in APPLIES.values():
            with pytest.raises(InvalidDelta):
                impl(base, delta + tail)


@pytest.mark.parametrize("impl", APPLIES.values(), ids=APPLIES.keys())
@pytest.mark.parametrize(
    ("base", "delta", "match"),
    [
        (HELLO[:10], bytes.fromhex("0b05 9005"), "base of 11"),
        # git's DELTA_SIZE_MIN: shorter deltas are refused, even of empty targets
        (HELLO, bytes.fromhex("0b00"), "shorter than"),
        (b"", bytes.fromhex("0000"), "shorter than"),
        (b"", bytes.fromhex("000101"), "shorter than"),
        (HELLO, bytes.fromhex("0b05 9005 00"), "opcode 0"),
        # copy off 7 len 5 ends at 12, past the 11 bytes of the base
        (HELLO, bytes.fromhex("0b05 910705"), "past the end"),
        (HELLO, bytes.fromhex("0b05 9105"), "truncated"),
        (HELLO, bytes.fromhex("0b05 9100"), "truncated"),
        (HELLO, bytes.fromhex("0b05 05") + b"hell", "truncated"),
        (HELLO, bytes.fromhex("0b04 9005"), "more bytes"),
        (HELLO, bytes.fromhex("0b06 9005"), "wrote 5"),
        # a complete delta, then a copy that reads past the base
        (HELLO, bytes.fromhex("0b05 9005 910705"), "past the end"),
    ],
)
def test_bad_instructions(impl: Apply, base: bytes, delta: bytes, match: str) -> None:
    with pytest.raises(InvalidDelta) as raised:
        impl(base, delta)
    if impl is apply_delta_py:  # the compiled routine words its errors its own way
        assert raised.match(match)


@pytest.mark.parametrize("impl", APPLIES.values(), ids=APPLIES.keys())
def test_header_that_promises_too_much_is_refused_before_any_work(impl: Apply) -> None:
    # 2**40 bytes from four instruction bytes: refused from the header alone
    delta = b"\x05" + encode_varint(2**40) + b"\x90\x05\x90\x05"
    with pytest.raises(InvalidDelta, match="more than it can write"):
        impl(HELLO[:5], delta)


def test_output_over_the_object_limit() -> None:
    limits = Limits(object_bytes_max=12)
    delta = bytes.fromhex("0b0d") + b"\x90\x05" + b"\x02, " + b"\x91\x06\x05" + b"\x01!"
    for impl in (apply_delta, apply_delta_py):
        with pytest.raises(LimitExceeded):
            impl(HELLO, delta, limits=limits)
        assert impl(HELLO, delta, limits=Limits(object_bytes_max=13)) == b"hello, world!"


@settings(max_examples=400, deadline=None)
@hypothesis_seed(SEED)
@given(st.binary(max_size=40), st.binary(max_size=40))
def test_random_deltas_only_raise_invalid_delta(base: bytes, body: bytes) -> None:
    for dst_size in (0, len(base), 17):
        delta = encode_varint(len(base)) + encode_varint(dst_size) + body
        outcomes = {name: _outcome(impl, base, delta) for name, impl in APPLIES.items()}
        assert len(set(outcomes.values())) == 1, outcomes


# -- interop with git ----------------------------------------------------------


def _git(args: list[str], cwd: Path, stdin: bytes = b"") -> bytes:
    return run_git(args, cwd=cwd, home=cwd, input=stdin)


def _blob_id(data: bytes) -> bytes:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).digest()


@pytest.mark.interop
def test_apply_matches_dulwich_on_deltas_git_wrote(tmp_path: Path) -> None:
    """Deltas from `git repack -adf`, applied by us and by dulwich."""
    from dulwich.object_format import SHA1
    from dulwich.pack import PackData

    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(["init", "-q"], repo)
    text = _text(rng, 120_000)
    binary = rng.randbytes(150_000)
    for step in range(6):
        text = _edit(rng, text, 12)
        binary = _edit(rng, binary, 4)
        (repo / "text").write_bytes(text)
        (repo / "binary").write_bytes(binary)
        _git(["add", "text", "binary"], repo)
        _git(["commit", "-q", "-m", f"step {step}"], repo)
    _git(["repack", "-adfq", "--window=10", "--depth=4"], repo)
    pack_path = next((repo / ".git/objects/pack").glob("*.pack"))
    listed = _git(["show-index"], repo, (pack_path.with_suffix(".idx")).read_bytes())
    ids = {bytes.fromhex(line.split()[1].decode()) for line in listed.splitlines()}

    names = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}
    resolved: dict[int, tuple[int, bytes]] = {}
    deltas = 0
    with PackData(str(pack_path), object_format=SHA1) as pack:
        for entry in pack.iter_unpacked():
            data = b"".join(entry.decomp_chunks)
            if entry.pack_type_num == 6:
                type_num, base = resolved[entry.offset - entry.delta_base]
                target = apply_delta(base, data)
                assert target == apply_delta_py(base, data) == _dulwich_apply(base, data)
                deltas += 1
            else:
                assert entry.pack_type_num in names
                type_num, target = entry.pack_type_num, data
            resolved[entry.offset] = (type_num, target)
            header = names[type_num] + b" %d\x00" % len(target)
            assert hashlib.sha1(header + target).digest() in ids
    assert deltas >= 8, deltas


def _pack_entry_header(type_num: int, size: int) -> bytes:
    """gitformat-pack.txt: 3-bit type, size in 4 + 7n bits (test-local writer)."""
    out = bytearray()
    byte = (type_num << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def _index_pack(repo: Path, pairs: list[tuple[bytes, bytes]], deltas: list[bytes]) -> set[bytes]:
    """Write bases whole and each delta as a REF_DELTA; return the ids git indexed."""
    bases = {_blob_id(base): base for base, _target in pairs}
    entries = [_pack_entry_header(3, len(base)) + zlib.compress(base) for base in bases.values()]
    for (base, _target), delta in zip(pairs, deltas, strict=True):
        entries.append(_pack_entry_header(7, len(delta)) + _blob_id(base) + zlib.compress(delta))
    body = b"PACK" + struct.pack(">II", 2, len(entries)) + b"".join(entries)
    repo.mkdir()
    _git(["init", "-q", "--bare"], repo)
    _git(["index-pack", "--stdin", "--strict"], repo, body + hashlib.sha1(body).digest())
    index = next((repo / "objects/pack").glob("*.idx")).read_bytes()
    return {
        bytes.fromhex(line.split()[1].decode())
        for line in _git(["show-index"], repo, index).splitlines()
    }


@pytest.mark.interop
def test_git_accepts_deltas_we_wrote(tmp_path: Path) -> None:
    """Hand-made packs of bases and REF_DELTAs go through `git index-pack`."""
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    text = _text(rng, 200_000)
    big = rng.randbytes(300_000)
    pairs = [
        (text, _edit(rng, text, 20)),
        (big, _edit(rng, big, 5)),
        (big, big[150_000:] + big[:150_000]),
        (text, text[:5000]),
        (b"short", rng.randbytes(1000)),
        (big[:1000], big[:1000] * 70),  # copies from offsets past 0xffff
        (b"", b"only inserts"),
    ]
    repo = tmp_path / "similar"
    indexed = _index_pack(repo, pairs, [create_delta(base, target) for base, target in pairs])
    for _base, target in pairs:
        assert _blob_id(target) in indexed
        assert _git(["cat-file", "blob", _blob_id(target).hex()], repo) == target


@pytest.mark.interop
@pytest.mark.parametrize("base", [b"tiny", bytes(20_000)], ids=["padded", "unpadded"])
def test_git_applies_our_delta_to_an_empty_target(tmp_path: Path, base: bytes) -> None:
    """patch-delta.c wants 4 bytes even for an empty target; ours has them.

    (git's object-info path still refuses a delta whose result is empty, so
    pack writers store the empty blob whole: this checks the codec only.)
    """
    delta = create_delta(base, b"")
    assert len(delta) == 4
    assert _blob_id(b"") in _index_pack(tmp_path / "repo", [(base, b"")], [delta])


@pytest.mark.interop
def test_git_refuses_what_we_refuse(tmp_path: Path) -> None:
    short = bytes.fromhex("0400")  # base "tiny", empty target, 2 bytes
    with pytest.raises(InvalidDelta):
        apply_delta(b"tiny", short)
    with pytest.raises(GitFailed, match="failed to apply delta"):
        _index_pack(tmp_path / "repo", [(b"tiny", b"")], [short])
