"""Fuzz target: the fetch side's sans-IO state machines, v2 and v0/v1 upload-pack.

gitprotocol-v2, "Command Request", "ls-refs", "fetch"; gitprotocol-pack,
"Packfile Negotiation". Inputs: the real requests git sent
(``libs/enroute-core/tests/protocol/testdata/*.req``), mutated packet by packet
(dropped, repeated, swapped, special packets, arbitrary argument lines) and
byte by byte, plus raw bytes, fed in arbitrary chunks. Every conversation must
end in a typed error or in events the server can answer: each event is
answered with the real encoders and the answer must parse as pkt-lines; each
error is turned into its Git form (``ERR`` or band 3), which must parse too.
Chunked feeding must give the same events and error as feeding whole.
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
from hypothesis import example, given
from hypothesis import strategies as st

from enroute_core.base.errors import (
    EnrouteError,
    InvalidPktLine,
    InvalidRefName,
    LimitExceeded,
    ProtocolError,
)
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import NEED_DATA, Data, iter_pkt_lines
from enroute_core.git.sideband import RemoteError, demux_payload
from enroute_core.protocol._common import Ref, RefSnapshot
from enroute_core.protocol.errors import fatal_error_bytes
from enroute_core.protocol.fetch import (
    FetchCommand,
    FetchReply,
    HaveBatch,
    LsRefsCommand,
    RequestEnd,
    SessionEnd,
    UploadPackV0,
    UploadPackV2,
    WantList,
    encode_fetch_head,
    encode_pack_data,
    encode_progress,
    encode_shallow_update,
    encode_v0_acks,
    sends_pack,
)
from enroute_core.protocol.lsrefs import encode_ls_refs_response

pytestmark = pytest.mark.fuzz

ALLOWED = (ProtocolError, InvalidPktLine, LimitExceeded, InvalidRefName)
V2_SEEDS = [
    (PROTOCOL_DATA / n).read_bytes() for n in ("clone-v2.req", "fetch-v2.req", "ls-refs.req")
]
V0_SEEDS = [(PROTOCOL_DATA / n).read_bytes() for n in ("clone-v0.req", "fetch-v0.req")]

OID = b"6f228b42b4d3a45af8bf20ffab1dadb9257ec4e9"
LINES = [
    b"command=fetch", b"command=ls-refs", b"command=object-info", b"command=", b"agent=x",
    b"server-option=a", b"object-format=sha1", b"object-format=sha256", b"session-id=1",
    b"want " + OID, b"want " + OID.upper(), b"want " + OID[:39], b"have " + OID, b"have ",
    b"done", b"want-ref refs/heads/main", b"want-ref HEAD", b"want-ref refs/heads/a..b",
    b"shallow " + OID, b"deepen 1", b"deepen 0", b"deepen -1", b"deepen 99999999999999999999999",
    b"deepen-since 0", b"deepen-since x", b"deepen-not refs/heads/main", b"deepen-not a b",
    b"deepen-relative", b"filter blob:none", b"filter blob:limit=1k", b"filter blob:limit=",
    b"filter blob:limit=k", b"filter tree:0", b"filter tree:", b"filter sparse:oid=x",
    b"sideband-all", b"wait-for-done", b"thin-pack", b"no-progress", b"include-tag",
    b"ofs-delta", b"packfile-uris https", b"peel", b"symrefs", b"unborn", b"ref-prefix ",
    b"ref-prefix refs/heads/", b"want " + OID + b" multi_ack_detailed side-band-64k no-done",
    b"want " + OID + b" side-band", b"want " + OID + b" " + b"x " * 300, b"ERR no",
]  # fmt: skip

SNAPSHOT = RefSnapshot(
    (
        Ref(b"refs/heads/main", oid_from_hex(OID)),
        Ref(b"refs/tags/v1", ObjectId(b"\x01" * 20), ObjectId(b"\x02" * 20)),
    ),
    head=b"refs/heads/main",
)
SMALL = Limits(
    protocol_wants_max=8,
    protocol_haves_max=3,
    protocol_shallows_max=2,
    protocol_deepen_nots_max=1,
    protocol_ref_prefixes_max=2,
    protocol_capabilities_max=4,
    protocol_server_options_max=1,
    pkt_line_bytes_max=200,
)
LIMITS = st.sampled_from([Limits(), Limits(), Limits(), SMALL])


def _parses(data: bytes) -> list[Any]:
    """A valid answer: whole pkt-lines, nothing left over."""
    return list(iter_pkt_lines(data))


def _check_error_form(exc: EnrouteError, started: bool, sideband: bool) -> None:
    packets = _parses(fatal_error_bytes(exc, response_started=started, sideband=sideband))
    assert len(packets) == 1 and isinstance(packets[0], Data)
    if started and sideband:
        assert isinstance(demux_payload(packets[0].payload), RemoteError)
    else:
        assert packets[0].payload.startswith(b"ERR ")


def _answer_v2(event: Any, draw: st.DrawFn) -> None:
    if isinstance(event, LsRefsCommand):
        out = _parses(encode_ls_refs_response(event.request, SNAPSHOT))
        assert out and not isinstance(out[-1], Data)
    elif isinstance(event, FetchCommand):
        request = event.request
        reply = FetchReply(
            common=request.haves[: draw(st.integers(0, 3))],
            ready=draw(st.booleans()),
            shallow=request.deepen.shallows[:1],
            unshallow=request.deepen.shallows[1:2],
            wanted_refs=tuple((oid_from_hex(OID), name) for name in request.want_refs),
        )
        _parses(encode_fetch_head(request, reply))
        if sends_pack(request, reply):
            _parses(encode_pack_data(b"PACK" + bytes(70000)) + encode_progress(b"counting\r"))


def _run(make: Any, pieces: list[bytes], answer: Any, draw: st.DrawFn) -> tuple[list[Any], Any]:
    conversation = make()
    events: list[Any] = []
    with typed_errors(*ALLOWED) as caught:
        done = False
        for piece in pieces:
            conversation.feed(piece)
            if done:  # gitprotocol-v2: bytes after the end of the session are ignored
                assert isinstance(conversation.next_event(), SessionEnd)
                continue
            while (event := conversation.next_event()) is not NEED_DATA:
                events.append(event)
                answer(event, draw)
                done = isinstance(event, (SessionEnd, RequestEnd))
                if done:
                    break
        if not done:
            conversation.feed_eof()
            for _ in range(sum(map(len, pieces)) + 2):
                event = conversation.next_event()
                assert event is not NEED_DATA, "waiting after EOF"
                events.append(event)
                answer(event, draw)
                if isinstance(event, (SessionEnd, RequestEnd)):
                    break
            else:
                raise AssertionError("no terminal event after EOF")
    tally(f"ends in {type(caught[0]).__name__ if caught else 'events'}, {len(events)} events")
    if caught:
        _check_error_form(caught[0], draw(st.booleans()), draw(st.booleans()))
        with pytest.raises(type(caught[0])):
            conversation.next_event()
        return events, (type(caught[0]).__name__, caught[0].message)
    return events, None


@fuzz_settings(400)
@given(
    data=st.one_of(
        pkt_stream(V2_SEEDS, LINES),
        pkt_stream(V2_SEEDS, LINES),
        pkt_sequences(LINES),
        fuzz_bytes(V2_SEEDS),
    ),
    limits=LIMITS,
    draws=st.data(),
)
@example(data=b"0014command=ls-refs\n0000", limits=Limits(), draws=None)
# Regression (docs/fuzzing.md): bytes fed after SessionEnd tripped the reader's buffer assert.
@example(data=b"0014command=ls-refs\n00000000" + b"x" * 70_000, limits=Limits(), draws=None)
@example(data=b"0011command=fetch0001000cdeepen 1000a" + b"done0000", limits=Limits(), draws=None)
def test_upload_pack_v2(data: bytes, limits: Limits, draws: st.DataObject | None) -> None:
    # The explicit examples answer with the smallest choices (0 and False).
    draw = draws.draw if draws is not None else (lambda _strategy: 0)
    pieces = (
        draws.draw(chunkings(data))
        if draws is not None
        else [data[i : i + 4096] for i in range(0, len(data), 4096)]
    )
    whole = _run(lambda: UploadPackV2(limits=limits), [data], _answer_v2, draw)
    assert _run(lambda: UploadPackV2(limits=limits), pieces, _answer_v2, draw) == whole


class _V0Answer:
    """Answers v0 events in order, as the server does: acks per have batch."""

    def __init__(self) -> None:
        self.request: Any = None

    def __call__(self, event: Any, draw: st.DrawFn) -> None:
        if isinstance(event, WantList):
            self.request = event.request
            assert event.request.sideband_max in (None, 995, 65515)
            if event.request.deepen.deepening:
                _parses(encode_shallow_update(event.request.deepen.shallows, ()))
        elif isinstance(event, HaveBatch):
            assert self.request is not None, "haves before the want list"
            common = frozenset(event.haves[: draw(st.integers(0, 3))])
            acks = encode_v0_acks(self.request, event, common, ready=draw(st.booleans()))
            _parses(acks.data)


@fuzz_settings(400)
@given(
    data=st.one_of(
        pkt_stream(V0_SEEDS, LINES),
        pkt_stream(V0_SEEDS, LINES),
        pkt_sequences(LINES),
        fuzz_bytes(V0_SEEDS),
    ),
    limits=LIMITS,
    draws=st.data(),
)
def test_upload_pack_v0(data: bytes, limits: Limits, draws: st.DataObject) -> None:
    pieces = draws.draw(chunkings(data))
    whole = _run(lambda: UploadPackV0(limits=limits), [data], _V0Answer(), draws.draw)
    assert _run(lambda: UploadPackV0(limits=limits), pieces, _V0Answer(), draws.draw) == whole
