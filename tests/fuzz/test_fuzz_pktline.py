"""Fuzz target: pkt-line decoding and the side-band demultiplexer.

gitprotocol-common, "pkt-line Format"; gitprotocol-capabilities, "side-band,
side-band-64k". Inputs are real request and response streams
(``libs/enroute-core/tests/protocol/testdata``) mutated packet by packet and
byte by byte, plus raw bytes, fed whole and in arbitrary chunks. Properties:

1. only ``InvalidPktLine`` / ``LimitExceeded`` escape, and the reader stays failed;
2. chunked feeding gives the same events and the same error as feeding whole;
3. the unconsumed buffer stays under the pkt-line bound plus the last chunk;
4. re-encoding the decoded events gives back the bytes that were consumed.
"""

from __future__ import annotations

import pytest
from fuzzkit import (
    PROTOCOL_DATA,
    chunkings,
    fuzz_bytes,
    fuzz_settings,
    pkt_stream,
    typed_errors,
)
from hypothesis import example, given
from hypothesis import strategies as st

from enroute_core.base.errors import EnrouteError, InvalidPktLine, LimitExceeded
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import NEED_DATA, EndOfStream, PktLineReader, encode_event
from enroute_core.git.sideband import PackData, Progress, RemoteError, SidebandDemux

pytestmark = pytest.mark.fuzz

SEEDS = [p.read_bytes() for p in sorted(PROTOCOL_DATA.glob("*.re[qs]*"))] + [
    p.read_bytes() for p in sorted(PROTOCOL_DATA.glob("*.adv"))
]
STREAMS = st.one_of(pkt_stream(SEEDS), pkt_stream(SEEDS), fuzz_bytes(SEEDS))
LIMITS = st.sampled_from([Limits(), Limits(pkt_line_bytes_max=4), Limits(pkt_line_bytes_max=100)])


def _drive(
    reader: PktLineReader | SidebandDemux, pieces: list[bytes], max_bytes: int
) -> tuple[list[object], EnrouteError | None]:
    events: list[object] = []
    with typed_errors(InvalidPktLine, LimitExceeded) as caught:
        for piece in pieces:
            reader.feed(piece)
            while (event := reader.next_event()) is not NEED_DATA:
                events.append(event)
            assert reader.buffered_bytes < max_bytes + len(piece)
        reader.feed_eof()
        while not isinstance(event := reader.next_event(), EndOfStream):
            assert event is not NEED_DATA, "waiting after EOF"
            events.append(event)
        events.append(event)
    error = caught[0] if caught else None
    if error is not None:
        with pytest.raises(type(error)):
            reader.next_event()
    return events, error


def _signature(error: EnrouteError | None) -> tuple[str, str] | None:
    return None if error is None else (type(error).__name__, error.message)


@fuzz_settings(400)
@given(data=STREAMS, limits=LIMITS, cut=st.data())
@example(data=b"0000", limits=Limits(), cut=None)
@example(data=b"fff1" + b"x" * 65517, limits=Limits(), cut=None)
@example(data=b"0003", limits=Limits(), cut=None)
@example(data=b"000A\x00\x00\x00\x00\x00\x00", limits=Limits(), cut=None)  # uppercase hex
def test_pkt_line_reader(data: bytes, limits: Limits, cut: st.DataObject | None) -> None:
    pieces = [data] if cut is None else cut.draw(chunkings(data))
    whole, whole_error = _drive(PktLineReader(limits=limits), [data], limits.pkt_line_bytes_max)
    events, error = _drive(PktLineReader(limits=limits), pieces, limits.pkt_line_bytes_max)
    assert (events, _signature(error)) == (whole, _signature(whole_error))
    # Re-encoding gives back the consumed bytes (the reader takes uppercase hex too).
    pos = 0
    for event in events:
        if isinstance(event, EndOfStream):
            continue
        wire = encode_event(event)
        assert data[pos : pos + 4].lower() == wire[:4]
        assert data[pos + 4 : pos + len(wire)] == wire[4:]
        pos += len(wire)
    if error is None:
        assert pos == len(data)


@fuzz_settings(300)
@given(data=STREAMS, sideband_all=st.booleans(), switch_at=st.integers(0, 8), cut=st.data())
def test_sideband_demux(
    data: bytes, sideband_all: bool, switch_at: int, cut: st.DataObject
) -> None:
    pieces = cut.draw(chunkings(data))
    demux = SidebandDemux(sideband_all=sideband_all)
    seen = 0
    with typed_errors(InvalidPktLine, LimitExceeded):
        for piece in pieces:
            demux.feed(piece)
            while (event := demux.next_event()) is not NEED_DATA:
                seen += 1
                if seen == switch_at:
                    demux.begin_sideband()
                if isinstance(event, (PackData, Progress, RemoteError)):
                    assert demux.sideband
            assert demux.buffered_bytes < Limits().pkt_line_bytes_max + len(piece)
        demux.feed_eof()
        for _ in range(len(data) + 2):
            if isinstance(demux.next_event(), EndOfStream):
                break
        else:
            raise AssertionError("no end of stream after EOF")
