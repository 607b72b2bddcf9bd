"""Side-band mux and demux: gitprotocol-capabilities "side-band, side-band-64k",
gitprotocol-v2 "fetch" (sideband-all).

Randomised tests print their seed and replay with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidPktLine, LimitExceeded
from enroute_core.git.pktline import (
    DELIM_PKT,
    FLUSH_PKT,
    NEED_DATA,
    RESPONSE_END_PKT,
    Data,
    Delim,
    EndOfStream,
    Flush,
    ResponseEnd,
    encode_event,
    iter_pkt_lines,
    pkt_line,
    pkt_text,
)
from enroute_core.git.sideband import (
    SIDEBAND_64K_DATA_BYTES_MAX,
    SIDEBAND_DATA_BYTES_MAX,
    DemuxEvent,
    PackData,
    Progress,
    RemoteError,
    SidebandDemux,
    demux_payload,
    sideband_mux,
    sideband_parts,
    sideband_pkt,
)

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
END = EndOfStream()


def _rng() -> random.Random:
    print(f"ENROUTE_SEED={SEED}")
    return random.Random(SEED)


def _drain(demux: SidebandDemux, out: list[DemuxEvent]) -> None:
    while True:
        event = demux.next_event()
        if event is NEED_DATA:
            return
        out.append(event)
        if isinstance(event, EndOfStream):
            return


def demux_chunks(chunks: Iterable[bytes], *, sideband_all: bool = True) -> list[DemuxEvent]:
    demux = SidebandDemux(sideband_all=sideband_all)
    out: list[DemuxEvent] = []
    for chunk in chunks:
        demux.feed(chunk)
        _drain(demux, out)
    demux.feed_eof()
    _drain(demux, out)
    return out


def every_way(wire: bytes, expected: list[DemuxEvent]) -> None:
    want = [*expected, END]
    assert demux_chunks([wire]) == want
    assert demux_chunks([wire[i : i + 1] for i in range(len(wire))]) == want
    for i in range(len(wire) + 1):
        assert demux_chunks([wire[:i], wire[i:]]) == want, i


# -- golden vectors -----------------------------------------------------------

# Shaped like git upload-pack's side-band-64k output (progress ends in CR or LF).
GOLDEN_SIDEBAND = (
    b"0023\x02Enumerating objects: 3, done.\n"
    b"0022\x02Counting objects:  33% (1/3)\r"
    b"0005\x02"
    b"0011\x01PACK\x00\x00\x00\x02\x00\x00\x00\x03"
    b"0016\x03fatal: disk full\n"
    b"0000"
)
GOLDEN_EVENTS: list[DemuxEvent] = [
    Progress(b"Enumerating objects: 3, done.\n"),
    Progress(b"Counting objects:  33% (1/3)\r"),
    Progress(b""),
    PackData(b"PACK\x00\x00\x00\x02\x00\x00\x00\x03"),
    RemoteError(b"fatal: disk full\n"),
    Flush(),
]

# A v2 fetch response under sideband-all: every data-pkt has a band, specials pass.
GOLDEN_SIDEBAND_ALL = (
    b"0015\x01acknowledgments\n0009\x01NAK\n0001000e\x01packfile\n0005\x02000a\x01PACK\x0000000002"
)
GOLDEN_ALL_EVENTS: list[DemuxEvent] = [
    PackData(b"acknowledgments\n"),
    PackData(b"NAK\n"),
    Delim(),
    PackData(b"packfile\n"),
    Progress(b""),
    PackData(b"PACK\x00"),
    Flush(),
    ResponseEnd(),
]


def test_golden_sideband_stream() -> None:
    every_way(GOLDEN_SIDEBAND, GOLDEN_EVENTS)


def test_golden_sideband_all_stream() -> None:
    every_way(GOLDEN_SIDEBAND_ALL, GOLDEN_ALL_EVENTS)


def test_golden_encode() -> None:
    assert sideband_pkt(2, b"") == b"0005\x02"  # the sideband-all keepalive
    assert sideband_pkt(1, b"PACK") == b"0009\x01PACK"
    assert sideband_pkt(3, b"fatal: disk full\n") == b"0016\x03fatal: disk full\n"
    assert list(sideband_mux(2, b"Counting objects:  33% (1/3)\r", max_payload=995)) == [
        b"0022\x02Counting objects:  33% (1/3)\r"
    ]


def test_packet_size_limits_match_git() -> None:
    # git's send_sideband: at most packet_max - 5 data bytes, packet_max 1000 or 65520.
    assert (SIDEBAND_DATA_BYTES_MAX, SIDEBAND_64K_DATA_BYTES_MAX) == (995, 65515)
    small = list(sideband_mux(1, b"x" * 2000, max_payload=SIDEBAND_DATA_BYTES_MAX))
    assert small == [b"03e8\x01" + b"x" * 995, b"03e8\x01" + b"x" * 995, b"000f\x01" + b"x" * 10]
    big = list(sideband_mux(1, bytes(range(256)) * 300, max_payload=SIDEBAND_64K_DATA_BYTES_MAX))
    assert [p[:5] for p in big] == [b"fff0\x01", b"2c1a\x01"]
    assert [len(p) for p in big] == [65520, 0x2C1A]
    assert b"".join(p[5:] for p in big) == bytes(range(256)) * 300
    assert list(sideband_mux(1, b"", max_payload=995)) == []
    with pytest.raises(LimitExceeded):
        sideband_pkt(1, b"x" * 65516)


@pytest.mark.parametrize("band", [0, 4, 255, -1])
def test_encoding_a_bad_band_is_a_caller_bug(band: int) -> None:
    with pytest.raises(AssertionError):
        sideband_pkt(band, b"x")
    with pytest.raises(AssertionError):
        list(sideband_mux(band, b"x", max_payload=995))


@pytest.mark.parametrize("max_payload", [0, -1, 65516])
def test_mux_refuses_an_impossible_packet_size(max_payload: int) -> None:
    with pytest.raises(AssertionError):
        list(sideband_mux(1, b"x", max_payload=max_payload))


# -- demux errors and modes ---------------------------------------------------


def test_demux_payload() -> None:
    assert demux_payload(b"\x01abc") == PackData(b"abc")
    assert demux_payload(b"\x02") == Progress(b"")
    assert demux_payload(b"\x03boom\n") == RemoteError(b"boom\n")
    with pytest.raises(InvalidPktLine):
        demux_payload(b"")


@pytest.mark.parametrize("band", [0, 4, 5, 0x31, 0x7F, 0xFF])
def test_bad_band_fails_and_stays_failed(band: int) -> None:
    demux = SidebandDemux(sideband_all=True)
    demux.feed(sideband_pkt(2, b"hi") + pkt_line(bytes([band]) + b"x") + sideband_pkt(1, b"y"))
    assert demux.next_event() == Progress(b"hi")
    with pytest.raises(InvalidPktLine) as first:
        demux.next_event()
    assert first.value.details["band"] == band
    for call in (
        demux.next_event,
        demux.feed_eof,
        demux.begin_sideband,
        demux.take_trailing_data,
        lambda: demux.feed(b"0000"),
    ):
        with pytest.raises(InvalidPktLine) as again:
            call()
        assert again.value is first.value


def test_empty_data_pkt_has_no_band() -> None:
    with pytest.raises(InvalidPktLine):
        demux_chunks([b"0004"])
    # Outside side-band it is only an empty line.
    assert demux_chunks([b"0004"], sideband_all=False) == [Data(b""), END]


def test_v0_plain_lines_then_sideband() -> None:
    # upload-pack v0: "NAK" is a plain pkt-line; the pack follows multiplexed.
    wire = pkt_text(b"NAK") + sideband_pkt(2, b"Counting\r") + sideband_pkt(1, b"PACK") + FLUSH_PKT
    demux = SidebandDemux()
    assert not demux.sideband
    demux.feed(wire)
    assert demux.next_event() == Data(b"NAK\n")
    demux.begin_sideband()
    assert demux.sideband
    out: list[DemuxEvent] = []
    demux.feed_eof()
    _drain(demux, out)
    assert out == [Progress(b"Counting\r"), PackData(b"PACK"), Flush(), END]


def test_pkt_line_errors_pass_through() -> None:
    with pytest.raises(InvalidPktLine):
        demux_chunks([b"0003"])
    with pytest.raises(InvalidPktLine):
        demux_chunks([b"0009\x01PA"])  # truncated at EOF
    with pytest.raises(LimitExceeded):
        demux_chunks([b"fff1"])


def test_trailing_data_after_the_flush() -> None:
    demux = SidebandDemux(sideband_all=True)
    demux.feed(sideband_pkt(1, b"unpack ok\n") + FLUSH_PKT + b"tail")
    assert demux.next_event() == PackData(b"unpack ok\n")
    assert demux.next_event() == Flush()
    assert demux.take_trailing_data() == b"tail"
    assert demux.buffered_bytes == 0


# -- properties ---------------------------------------------------------------

band_writes = st.lists(
    st.tuples(st.sampled_from([1, 2, 3]), st.binary(max_size=3000)),
    max_size=10,
)
specials = st.sampled_from([FLUSH_PKT, DELIM_PKT, RESPONSE_END_PKT])


@hypothesis_seed(SEED)
@settings(max_examples=200, deadline=None)
@given(
    writes=band_writes,
    max_payload=st.sampled_from([1, 7, SIDEBAND_DATA_BYTES_MAX, SIDEBAND_64K_DATA_BYTES_MAX]),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    trailer=specials,
)
def test_mux_then_demux_returns_each_band(
    writes: list[tuple[int, bytes]], max_payload: int, cuts: list[int], trailer: bytes
) -> None:
    print(f"ENROUTE_SEED={SEED}")
    wire = b"".join(b"".join(sideband_mux(b, d, max_payload=max_payload)) for b, d in writes)
    wire += trailer
    points = [0, *sorted(c % (len(wire) + 1) for c in cuts), len(wire)]
    events = demux_chunks([wire[a:b] for a, b in itertools.pairwise(points)])
    assert events[-1] == END
    got: dict[int, bytes] = {1: b"", 2: b"", 3: b""}
    kinds = {PackData: 1, Progress: 2, RemoteError: 3}
    packets = 0
    for event in events[:-2]:
        if isinstance(event, PackData):
            got[1] += event.data
        elif isinstance(event, Progress | RemoteError):
            got[kinds[type(event)]] += event.message
        else:
            pytest.fail(f"unexpected {event!r}")
        packets += 1
    assert events[-2] in (Flush(), Delim(), ResponseEnd())
    for band in (1, 2, 3):
        assert got[band] == b"".join(d for b, d in writes if b == band)
    assert packets == sum(-(-len(d) // max_payload) for _, d in writes)


# -- corruption ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "events"),
    [(GOLDEN_SIDEBAND, GOLDEN_EVENTS), (GOLDEN_SIDEBAND_ALL, GOLDEN_ALL_EVENTS)],
    ids=["side-band", "sideband-all"],
)
def test_corruption_gives_only_typed_errors(wire: bytes, events: list[DemuxEvent]) -> None:
    rng = _rng()
    boundaries = set(
        itertools.accumulate((len(encode_event(p)) for p in iter_pkt_lines(wire)), initial=0)
    )
    for cut in range(len(wire) + 1):
        try:
            got = demux_chunks([wire[:cut]])
        except InvalidPktLine:
            assert cut not in boundaries, cut
            continue
        assert cut in boundaries, cut
        assert got == [*events[: len(got) - 1], END], cut
    errors = 0
    for pos in range(len(wire)):
        for value in {0, 4, 0xFF, wire[pos] ^ 1, rng.randrange(256)} - {wire[pos]}:
            try:
                demux_chunks([wire[:pos] + bytes([value]) + wire[pos + 1 :]])
            except (InvalidPktLine, LimitExceeded):
                errors += 1
    assert errors > 0


# -- interop with git ---------------------------------------------------------


def _git(args: list[str], cwd: Path, home: Path, stdin: bytes = b"") -> bytes:
    from enroute_testing.gitcli import git_env

    done = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(home), input=stdin, capture_output=True,
        timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


@pytest.mark.interop
@pytest.mark.parametrize("capability", ["side-band-64k", "side-band"])
def test_git_upload_pack_sideband_demuxes_to_a_valid_pack(tmp_path: Path, capability: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "repo"
    _git(["init", "-q", "-b", "main", str(repo)], tmp_path, home)
    rng = _rng()
    # Incompressible content so the pack spans many side-band packets.
    (repo / "blob").write_bytes(rng.randbytes(150_000))
    _git(["add", "blob"], repo, home)
    _git(["commit", "-q", "-m", "one"], repo, home)
    oid = _git(["rev-parse", "HEAD"], repo, home).strip()

    request = pkt_text(b"want " + oid + b" " + capability.encode()) + FLUSH_PKT
    request += pkt_text(b"done")
    wire = _git(["upload-pack", "--stateless-rpc", "."], repo, home, request)

    demux = SidebandDemux()
    demux.feed(wire[:8])
    assert demux.next_event() == Data(b"NAK\n")
    demux.begin_sideband()
    out: list[DemuxEvent] = []
    for start in range(8, len(wire), 4096):
        demux.feed(wire[start : start + 4096])
        _drain(demux, out)
    demux.feed_eof()
    _drain(demux, out)

    assert out[-2:] == [Flush(), END]
    assert not [e for e in out if isinstance(e, RemoteError)]
    pack_packets = [e.data for e in out if isinstance(e, PackData)]
    limit = SIDEBAND_64K_DATA_BYTES_MAX if capability == "side-band-64k" else 995
    assert max(len(p) for p in pack_packets) <= limit
    if capability == "side-band":
        # git fills side-band packets to 1000 bytes: 995 of data, not 999.
        assert max(len(p) for p in pack_packets) == SIDEBAND_DATA_BYTES_MAX
    assert len(pack_packets) > 1
    pack = b"".join(pack_packets)
    assert pack[:4] == b"PACK"
    assert struct.unpack(">II", pack[4:12]) == (2, 3)  # commit, tree, blob
    assert hashlib.sha1(pack[:-20]).digest() == pack[-20:]


def test_sideband_parts_join_to_the_mux_packets() -> None:
    """The pack writer frames a piece as header and payload views joined once (issue 25):
    the same bytes as the packets of sideband_mux, payloads not copied."""
    data = bytearray(bytes(range(256)) * 700)  # 179,200 bytes: two full packets and a part
    for max_payload in (SIDEBAND_64K_DATA_BYTES_MAX, SIDEBAND_DATA_BYTES_MAX, 1):
        piece = data[:3000] if max_payload == 1 else data
        parts = sideband_parts(1, piece, max_payload=max_payload)
        assert b"".join(parts) == b"".join(sideband_mux(1, piece, max_payload=max_payload))
    parts = sideband_parts(1, data, max_payload=SIDEBAND_64K_DATA_BYTES_MAX)
    assert [len(p) for p in parts] == [5, 65515, 5, 65515, 5, 179_200 - 2 * 65515]
    assert all(isinstance(p, memoryview) for p in parts[1::2])  # views of data, not copies
    assert sideband_parts(1, b"", max_payload=995) == []
