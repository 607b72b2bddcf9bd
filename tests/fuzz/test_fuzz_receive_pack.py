"""Fuzz target: the receive-pack state machine (push commands, options, pack hand-over).

gitprotocol-pack, "Reference Update Request and Packfile Transfer", "Report
Status"; gitprotocol-capabilities, "push-options", "report-status-v2". Inputs:
the real push git sent (``libs/enroute-core/tests/protocol/testdata/push.req``,
commands, a push option and a pack), mutated packet by packet and byte by
byte, plus raw bytes, fed in arbitrary chunks. The conversation must end in a
typed error or in a request the server can answer: the report built for it
(some refs ok, some refused through the error table) must parse as pkt-lines
(inside band 1 when side-band-64k was asked for). Chunked feeding must give
the same request, the same pack bytes and the same error as feeding whole.
"""

from __future__ import annotations

from typing import Any

import pytest
from fuzzkit import (
    PROTOCOL_DATA,
    chunkings,
    fuzz_bytes,
    fuzz_settings,
    pkt_sequences,
    pkt_stream,
    typed_errors,
)
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidPktLine, InvalidRefName, LimitExceeded, ProtocolError
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import NEED_DATA, Data, Flush, iter_pkt_lines
from enroute_core.git.sideband import PackData, demux_payload
from enroute_core.protocol.errors import fatal_error_bytes
from enroute_core.protocol.receive import (
    PackChunk,
    PushEnd,
    PushReport,
    PushRequest,
    ReceivePack,
    RefOption,
    RefStatus,
    encode_report,
    refused,
)

pytestmark = pytest.mark.fuzz

ALLOWED = (ProtocolError, InvalidPktLine, LimitExceeded, InvalidRefName)
PUSH = (PROTOCOL_DATA / "push.req").read_bytes()
OLD = b"f5dd66e46e9b1aac70de089b2b50cda112de21bf"
ZERO = b"0" * 40
LINES = [
    OLD + b" " + ZERO + b" refs/heads/gone",
    ZERO + b" " + OLD + b" refs/heads/new\x00report-status side-band-64k push-options",
    ZERO + b" " + OLD + b" refs/heads/new\x00report-status-v2 " + b"x " * 400,
    ZERO + b" " + OLD + b" refs/heads/a..b", ZERO + b" " + OLD + b" HEAD",
    ZERO + b" " + OLD + b"refs/heads/x", ZERO + OLD + b" refs/heads/x", OLD[:20],
    b"shallow " + OLD, b"shallow " + OLD[:10], b"push-cert\x00", b"ci.skip", b"",
    b"\x00", b"PACK\x00\x00\x00\x02\x00\x00\x00\x00",
]  # fmt: skip
SMALL = Limits(
    protocol_push_commands_max=2,
    protocol_push_options_max=1,
    protocol_shallows_max=1,
    protocol_capabilities_max=5,
    ref_name_bytes_max=16,
)


def _report_parses(request: PushRequest, draw: st.DrawFn) -> None:
    statuses = []
    for command in request.commands:
        if draw(st.booleans()):
            statuses.append(refused(command.ref, InvalidRefName("refused here")))
        else:
            statuses.append(
                RefStatus(
                    command.ref,
                    options=(RefOption(b"refname", command.ref), RefOption(b"forced-update")),
                )
            )
    unpack = draw(st.sampled_from([None, b"index-pack failed"]))
    body = encode_report(PushReport(unpack, tuple(statuses)), request)
    packets = list(iter_pkt_lines(body))
    if not request.has(b"side-band-64k") or not body:
        return
    assert isinstance(packets[-1], Flush)
    inner = b""
    for packet in packets[:-1]:
        assert isinstance(packet, Data)
        band = demux_payload(packet.payload)
        assert isinstance(band, PackData)
        inner += band.data
    list(iter_pkt_lines(inner))


def _run(pieces: list[bytes], limits: Limits, draw: st.DrawFn) -> tuple[Any, ...]:
    conversation = ReceivePack(limits=limits)
    request: PushRequest | None = None
    pack = b""
    end: PushEnd | None = None
    with typed_errors(*ALLOWED) as caught:
        for piece in [*pieces, None]:
            if piece is None:
                conversation.feed_eof()
            else:
                conversation.feed(piece)
            for _ in range(len(PUSH) + sum(map(len, pieces)) + 4):
                event = conversation.next_event()
                if event is NEED_DATA:
                    assert piece is not None, "waiting after EOF"
                    break
                if isinstance(event, PushRequest):
                    assert request is None, "two requests"
                    request = event
                    _report_parses(event, draw)
                elif isinstance(event, PackChunk):
                    assert request is not None and event.data
                    pack += event.data
                else:
                    assert isinstance(event, PushEnd) and event.pack_bytes == len(pack)
                    end = event
                    break
            if end is not None:
                break
        assert end is not None
    tally(f"ends in {type(caught[0]).__name__ if caught else 'PushEnd'}")
    if caught:
        started, sideband = draw(st.booleans()), draw(st.booleans())
        packets = list(
            iter_pkt_lines(
                fatal_error_bytes(caught[0], response_started=started, sideband=sideband)
            )
        )
        assert len(packets) == 1
        with pytest.raises(type(caught[0])):
            conversation.next_event()
        return request, pack, (type(caught[0]).__name__, caught[0].message)
    return request, pack, end


@fuzz_settings(500)
@given(
    data=st.one_of(
        pkt_stream([PUSH], LINES),
        pkt_stream([PUSH], LINES),
        pkt_sequences(LINES),
        fuzz_bytes([PUSH]),
    ),
    limits=st.sampled_from([Limits(), Limits(), SMALL]),
    draws=st.data(),
)
def test_receive_pack(data: bytes, limits: Limits, draws: st.DataObject) -> None:
    whole = _run([data], limits, draws.draw)
    assert _run(draws.draw(chunkings(data)), limits, draws.draw) == whole
