"""pkt-line framing: gitprotocol-common "pkt-line Format", gitprotocol-v2 "Packet-Line Framing".

Every parser case runs whole, byte by byte, split at every point and with
trailing data (h11's ``tr()``). Randomised tests print their seed and replay
with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import EnrouteError, InvalidPktLine, LimitExceeded
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import (
    DELIM_PKT,
    FLUSH_PKT,
    NEED_DATA,
    PKT_LINE_BYTES_MAX,
    PKT_PAYLOAD_BYTES_MAX,
    RESPONSE_END_PKT,
    Data,
    Delim,
    EndOfStream,
    Flush,
    PktEvent,
    PktLineReader,
    PktPacket,
    ResponseEnd,
    encode_event,
    err_message,
    err_pkt,
    iter_pkt_lines,
    pkt_line,
    pkt_text,
    strip_lf,
)

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
END = EndOfStream()


def _rng() -> random.Random:
    print(f"ENROUTE_SEED={SEED}")
    return random.Random(SEED)


# -- a small harness: feed chunks, drain between feeds, stop at EndOfStream ----


def _drain(reader: PktLineReader, out: list[PktEvent]) -> None:
    while True:
        event = reader.next_event()
        if event is NEED_DATA:
            return
        out.append(event)
        if isinstance(event, EndOfStream):
            return


def decode_chunks(chunks: Iterable[bytes], limits: Limits | None = None) -> list[PktEvent]:
    reader = PktLineReader(limits=limits or Limits())
    out: list[PktEvent] = []
    for chunk in chunks:
        reader.feed(chunk)
        _drain(reader, out)
    reader.feed_eof()
    _drain(reader, out)
    return out


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


TRAILING = b"PACK\x00\x00\x00\x02trailing"


def tr(data: bytes, expected: Sequence[PktPacket]) -> None:
    """Decode ``data`` every way a stream can arrive; all must give ``expected``."""
    want = [*expected, END]
    assert decode_chunks([data]) == want
    assert decode_chunks([data[i : i + 1] for i in range(len(data))]) == want
    for i in range(len(data) + 1):
        assert decode_chunks([data[:i], data[i:]]) == want, i
    # Trailing data: the reader stops exactly after the last packet, whole or byte by byte.
    for chunks in ([data + TRAILING], [bytes([b]) for b in data + TRAILING]):
        reader = PktLineReader()
        got: list[PktEvent] = []
        for chunk in chunks:
            reader.feed(chunk)
            while len(got) < len(expected):
                event = reader.next_event()
                if event is NEED_DATA:
                    break
                got.append(event)
        assert got == list(expected)
        assert reader.take_trailing_data() == TRAILING
        assert reader.buffered_bytes == 0


# -- golden vectors -----------------------------------------------------------

# gitprotocol-common, "pkt-line Format", the examples table, plus the specials.
GOLDEN: list[tuple[bytes, list[PktPacket]]] = [
    (b"0006a\n", [Data(b"a\n")]),
    (b"0005a", [Data(b"a")]),
    (b"000bfoobar\n", [Data(b"foobar\n")]),
    (b"0004", [Data(b"")]),
    (b"0000", [Flush()]),
    (b"0001", [Delim()]),
    (b"0002", [ResponseEnd()]),
    (b"", []),
    # git's reader takes upper-case hex too (the ABNF names lower case only).
    (b"000Afoobar", [Data(b"foobar")]),
    (b"000bFOOBAR\n0000", [Data(b"FOOBAR\n"), Flush()]),
]

# A v2 ls-refs request and a v0 ref advertisement, as git sends them.
OID = b"115c1b429d1ce562a3db8f7faa775641c8ba1c3d"
GOOD_STREAM = (
    b"0014command=ls-refs\n"
    b"0014agent=git/2.39.5"
    b"0001"
    b"0009peel\n"
    b"000csymrefs\n"
    b"001bref-prefix refs/heads/\n"
    b"0000"
    b"001e# service=git-upload-pack\n"
    b"0000"
    b"005c" + OID + b" HEAD\x00side-band-64k symref=HEAD:refs/heads/main\n"
    b"003d" + OID + b" refs/heads/main\n"
    b"0004"
    b"0008\x00\x01\xff\n"
    b"0000"
    b"0002"
)
GOOD_EVENTS: list[PktPacket] = [
    Data(b"command=ls-refs\n"),
    Data(b"agent=git/2.39.5"),
    Delim(),
    Data(b"peel\n"),
    Data(b"symrefs\n"),
    Data(b"ref-prefix refs/heads/\n"),
    Flush(),
    Data(b"# service=git-upload-pack\n"),
    Flush(),
    Data(OID + b" HEAD\x00side-band-64k symref=HEAD:refs/heads/main\n"),
    Data(OID + b" refs/heads/main\n"),
    Data(b""),
    Data(b"\x00\x01\xff\n"),
    Flush(),
    ResponseEnd(),
]
# Offsets at which the stream may end cleanly.
GOOD_BOUNDARIES = {0}
for _event in GOOD_EVENTS:
    GOOD_BOUNDARIES.add(max(GOOD_BOUNDARIES) + len(encode_event(_event)))


@pytest.mark.parametrize(("wire", "events"), GOLDEN, ids=[repr(w) for w, _ in GOLDEN])
def test_golden_vectors_decode_every_way(wire: bytes, events: list[PktPacket]) -> None:
    tr(wire, events)


def test_golden_stream_decodes_every_way() -> None:
    tr(GOOD_STREAM, GOOD_EVENTS)
    assert b"".join(encode_event(e) for e in GOOD_EVENTS) == GOOD_STREAM
    assert max(GOOD_BOUNDARIES) == len(GOOD_STREAM)


def test_golden_vectors_encode() -> None:
    assert pkt_line(b"a\n") == b"0006a\n"
    assert pkt_line(b"a") == b"0005a"
    assert pkt_line(b"foobar\n") == b"000bfoobar\n"
    assert pkt_line(b"") == b"0004"
    assert pkt_line(memoryview(b"xfoobar")[1:]) == b"000afoobar"
    assert pkt_text(b"a") == b"0006a\n"
    assert pkt_text(b"foobar") == b"000bfoobar\n"
    assert err_pkt(b"bad thing") == b"0012ERR bad thing\n"
    assert (FLUSH_PKT, DELIM_PKT, RESPONSE_END_PKT) == (b"0000", b"0001", b"0002")
    assert [encode_event(e) for e in (Flush(), Delim(), ResponseEnd(), Data(b"a"))] == [
        b"0000",
        b"0001",
        b"0002",
        b"0005a",
    ]


def test_encode_limit_is_65516_bytes_of_payload() -> None:
    assert PKT_PAYLOAD_BYTES_MAX == 65516 and PKT_LINE_BYTES_MAX == 65520
    biggest = pkt_line(b"x" * 65516)
    assert biggest[:4] == b"fff0" and len(biggest) == 65520
    assert list(iter_pkt_lines(biggest)) == [Data(b"x" * 65516)]
    with pytest.raises(LimitExceeded) as info:
        pkt_line(b"x" * 65517)
    assert info.value.details["value"] == 65517
    with pytest.raises(LimitExceeded):
        pkt_text(b"x" * 65516)


def test_text_helpers() -> None:
    assert strip_lf(b"a\n") == b"a"
    assert strip_lf(b"a") == b"a"
    assert strip_lf(b"a\n\n") == b"a\n"
    assert strip_lf(b"") == b""
    assert err_message(b"ERR no such repository\n") == b"no such repository"
    assert err_message(b"ERR x") == b"x"
    assert err_message(b"ERRx\n") is None
    assert err_message(b"0000ERR x") is None
    [event] = iter_pkt_lines(err_pkt(b"access denied"))
    assert isinstance(event, Data) and err_message(event.payload) == b"access denied"


# -- bad lengths and the error state --------------------------------------------

BAD_HEADERS = [
    b"0003",
    b"000g",
    b"-001",
    b"+005a",
    b" 005a",
    b"0x05",
    b"00_5a",
    b"\x00\x00\x00\x00",
    b"PACK",
    b"\xff005",
    b"000\n",
]


@pytest.mark.parametrize("wire", BAD_HEADERS, ids=repr)
def test_bad_length_fails_at_the_header(wire: bytes) -> None:
    reader = PktLineReader()
    reader.feed(wire[:4])  # no EOF, no payload: the header alone decides
    with pytest.raises(InvalidPktLine):
        reader.next_event()
    assert reader.failed


@pytest.mark.parametrize("wire", BAD_HEADERS, ids=repr)
def test_bad_length_after_good_packets(wire: bytes) -> None:
    events: list[PktPacket] = []
    with pytest.raises(InvalidPktLine) as info:
        events.extend(iter_pkt_lines(b"0006a\n0000" + wire + b"0000"))
    assert events == [Data(b"a\n"), Flush()]
    assert info.value.details["offset"] == 10


def test_error_state_stays() -> None:
    reader = PktLineReader()
    reader.feed(b"0005a0003")
    assert reader.next_event() == Data(b"a")
    with pytest.raises(InvalidPktLine) as first:
        reader.next_event()
    for call in (
        reader.next_event,
        reader.feed_eof,
        reader.take_trailing_data,
        lambda: reader.feed(b"0000"),
        lambda: reader.feed(b""),
    ):
        with pytest.raises(InvalidPktLine) as again:
            call()
        assert again.value is first.value
    assert reader.failed


@pytest.mark.parametrize("cut", [b"0", b"00", b"000", b"0006", b"0006a", b"fff0" + b"x" * 100])
def test_truncated_final_packet(cut: bytes) -> None:
    reader = PktLineReader()
    reader.feed(b"0000" + cut)
    assert reader.next_event() == Flush()
    assert reader.next_event() is NEED_DATA  # without EOF it waits
    reader.feed_eof()
    with pytest.raises(InvalidPktLine) as info:
        reader.next_event()
    assert info.value.details["offset"] == 4
    with pytest.raises(InvalidPktLine):
        reader.next_event()


def test_end_of_stream_repeats() -> None:
    reader = PktLineReader()
    reader.feed_eof()
    reader.feed_eof()
    assert reader.next_event() == END
    assert reader.next_event() == END
    with pytest.raises(AssertionError):
        reader.feed(b"0000")


def test_limit_from_limits() -> None:
    small = Limits(pkt_line_bytes_max=10)
    assert decode_chunks([b"000afoobar"], small) == [Data(b"foobar"), END]
    reader = PktLineReader(limits=small)
    reader.feed(b"000b")  # the header alone is enough to refuse
    with pytest.raises(LimitExceeded) as info:
        reader.next_event()
    assert info.value.limit == "pkt_line_bytes_max"
    assert (info.value.details["value"], info.value.details["maximum"]) == (11, 10)
    assert info.value.details["offset"] == 0
    with pytest.raises(LimitExceeded):
        reader.feed(b"foobar\n")
    # The default allows 65520 and no more.
    with pytest.raises(LimitExceeded):
        list(iter_pkt_lines(b"fff1" + b"x" * 65517))
    with pytest.raises(LimitExceeded):
        list(iter_pkt_lines(b"ffff"))


def test_iter_pkt_lines_fails_where_the_bad_packet_is() -> None:
    it = iter_pkt_lines(b"0005a000")
    assert next(it) == Data(b"a")
    with pytest.raises(InvalidPktLine):
        next(it)


# -- bounded buffer, large streams --------------------------------------------


def test_buffer_is_bounded_for_any_chunking() -> None:
    rng = _rng()
    payloads = [bytes([i]) * rng.choice([0, 1, 995, 65515, 65516]) for i in range(40)]
    stream = b"".join(pkt_line(p) for p in payloads) + FLUSH_PKT
    maximum = PKT_LINE_BYTES_MAX
    for chunk_size in (1, 3, 4093, 65519, 65521, 200_003, rng.randrange(1, 100_000)):
        if chunk_size == 1 and len(stream) > 300_000:
            stream_used = stream[:300_000]
        else:
            stream_used = stream
        reader = PktLineReader()
        got: list[PktEvent] = []
        for start in range(0, len(stream_used), chunk_size):
            chunk = stream_used[start : start + chunk_size]
            reader.feed(chunk)
            # What the contract promises: under one maximal packet plus the chunk,
            # and the physical buffer under twice that.
            assert reader.buffered_bytes < maximum + len(chunk)
            assert len(reader._buf) < 2 * maximum + len(chunk)
            _drain(reader, got)
            assert reader.buffered_bytes < maximum
        if stream_used is stream:
            reader.feed_eof()
            _drain(reader, got)
            assert got == [*(Data(p) for p in payloads), Flush(), END]


def test_feeding_without_draining_is_refused() -> None:
    reader = PktLineReader()
    reader.feed(pkt_line(b"x" * 65516))
    with pytest.raises(AssertionError):
        reader.feed(b"0000")


# -- properties ---------------------------------------------------------------

packets = st.lists(
    st.one_of(
        st.binary(max_size=300).map(Data),
        st.builds(
            lambda size, byte: Data(bytes([byte]) * size),
            st.integers(min_value=60_000, max_value=PKT_PAYLOAD_BYTES_MAX),
            st.integers(min_value=0, max_value=255),
        ),
        st.sampled_from([Flush(), Delim(), ResponseEnd()]),
    ),
    max_size=12,
)


@hypothesis_seed(SEED)
@settings(max_examples=200, deadline=None)
@given(items=packets, cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_round_trip_under_any_chunking(items: list[PktPacket], cuts: list[int]) -> None:
    print(f"ENROUTE_SEED={SEED}")
    wire = b"".join(encode_event(e) for e in items)
    assert decode_chunks(split_at(wire, cuts)) == [*items, END]


@hypothesis_seed(SEED)
@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=2000))
def test_encoding_matches_dulwich(payload: bytes) -> None:
    from dulwich.protocol import pkt_line as dulwich_pkt_line

    assert pkt_line(payload) == dulwich_pkt_line(payload)
    assert dulwich_pkt_line(None) == FLUSH_PKT


# -- corruption ---------------------------------------------------------------


def _decode_or_typed_error(wire: bytes) -> tuple[list[PktEvent], EnrouteError | None]:
    reader = PktLineReader()
    out: list[PktEvent] = []
    try:
        reader.feed(wire)
        reader.feed_eof()
        _drain(reader, out)
    except (InvalidPktLine, LimitExceeded) as exc:
        assert reader.failed
        with pytest.raises(type(exc)):
            reader.next_event()
        return out, exc
    return out, None


def _same_up_to_hex_case(ours: bytes, theirs: bytes) -> bool:
    if len(ours) != len(theirs):
        return False
    return all(
        a == b or (chr(a) in "abcdef" and chr(b) == chr(a).upper())
        for a, b in zip(ours, theirs, strict=True)
    )


def test_every_prefix_cut_fails_only_with_invalid_pkt_line() -> None:
    for cut in range(len(GOOD_STREAM) + 1):
        events, error = _decode_or_typed_error(GOOD_STREAM[:cut])
        if cut in GOOD_BOUNDARIES:
            assert error is None, cut
            assert events[-1] == END
            assert events[:-1] == GOOD_EVENTS[: len(events) - 1]
        else:
            assert isinstance(error, InvalidPktLine), cut
            assert events == GOOD_EVENTS[: len(events)]


def test_every_byte_flip_gives_events_or_the_typed_error() -> None:
    rng = _rng()
    outcomes = {"ok": 0, "error": 0}
    for pos in range(len(GOOD_STREAM)):
        values = {0, 0x30, 0x66, 0x46, 0x67, 0xFF, GOOD_STREAM[pos] ^ 1, rng.randrange(256)}
        for value in values - {GOOD_STREAM[pos]}:
            wire = GOOD_STREAM[:pos] + bytes([value]) + GOOD_STREAM[pos + 1 :]
            events, error = _decode_or_typed_error(wire)
            outcomes["error" if error else "ok"] += 1
            if error is None:
                assert events[-1] == END
                # What decodes re-encodes to the corrupted bytes, up to the case of hex.
                again = b"".join(
                    encode_event(e) for e in events[:-1] if not isinstance(e, EndOfStream)
                )
                assert _same_up_to_hex_case(again, wire), pos
    assert outcomes["ok"] > 0 and outcomes["error"] > 0


# -- interop with git ---------------------------------------------------------


def _git(args: list[str], cwd: Path, home: Path, env: dict[str, str] | None = None) -> bytes:
    from enroute_testing.gitcli import git_env

    full_env = git_env(home)
    full_env.update(env or {})
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=full_env, capture_output=True, timeout=60, check=True
    )
    return done.stdout


def _fixture_repo(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "repo"
    _git(["init", "-q", "-b", "main", str(repo)], tmp_path, home)
    (repo / "f").write_bytes(b"hello\n")
    _git(["add", "f"], repo, home)
    _git(["commit", "-q", "-m", "one"], repo, home)
    _git(["tag", "-a", "v1", "-m", "tag"], repo, home)
    _git(["branch", "side"], repo, home)
    return repo, home


@pytest.mark.interop
def test_git_v0_ref_advertisement_parses(tmp_path: Path) -> None:
    repo, home = _fixture_repo(tmp_path)
    wire = _git(["upload-pack", "--advertise-refs", "."], repo, home)
    events = decode_chunks([wire[i : i + 7] for i in range(0, len(wire), 7)])
    assert events[-2:] == [Flush(), END]
    lines = [strip_lf(e.payload) for e in events[:-2] if isinstance(e, Data)]
    assert len(lines) == len(events) - 2
    first, caps = lines[0].split(b"\x00")
    assert b"side-band-64k" in caps.split(b" ")
    listed = [first, *lines[1:]]
    expected = [
        _git(["rev-parse", name], repo, home).strip() + b" " + name.encode()
        for name in ("HEAD", "refs/heads/main", "refs/heads/side", "refs/tags/v1")
    ]
    expected.append(b"%s refs/tags/v1^{}" % _git(["rev-parse", "v1^{}"], repo, home).strip())
    assert listed == expected
    assert b"".join(encode_event(e) for e in events if not isinstance(e, EndOfStream)) == wire


@pytest.mark.interop
def test_git_v2_capability_advertisement_parses(tmp_path: Path) -> None:
    repo, home = _fixture_repo(tmp_path)
    wire = _git(["upload-pack", "--advertise-refs", "."], repo, home, {"GIT_PROTOCOL": "version=2"})
    events = list(iter_pkt_lines(wire))
    assert events[0] == Data(b"version 2\n")
    assert events[-1] == Flush()
    keys = {strip_lf(e.payload).split(b"=")[0] for e in events[1:-1] if isinstance(e, Data)}
    assert {b"ls-refs", b"fetch"} <= keys
