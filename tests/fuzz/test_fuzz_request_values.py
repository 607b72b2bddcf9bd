"""Fuzz target: the VALUES of upload-pack and receive-pack arguments, parsed and served.

A client's numbers drive loops and allocations: ``deepen <n>``, ``deepen-since <t>``,
``filter tree:<n>``, ``filter blob:limit=<n>``, the number of wants, haves, shallow
lines, capabilities, server and push options (gitprotocol-v2 "fetch";
gitprotocol-pack "Packfile Negotiation", "Reference Update Request"). Each value is
drawn from the edges (0, 1, 2^31-1, 2^63, 2^64-1, 2^64+1, negative, 21 digits, units,
non-numeric), each count from just under and just over its bound, and each request is
carried to the end: parsed, its wants checked, its pack planned and written over a
real view (a history with tags on blobs and trees, from the git CLI). Every request
finishes within :data:`REQUEST_S` seconds, or is refused with a typed error whose Git
form (``ERR``) names what was wrong; nothing else escapes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fuzzkit import fuzz_settings, typed_errors
from hypothesis import event as tally
from hypothesis import example, given
from hypothesis import strategies as st

from enroute_core.base.errors import (
    EnrouteError,
    InvalidArgument,
    InvalidPktLine,
    InvalidRefName,
    LimitExceeded,
    MissingObject,
    ProtocolError,
)
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.base.limits import Limits
from enroute_core.engine import serve
from enroute_core.engine.view import View
from enroute_core.git.pktline import DELIM_PKT, FLUSH_PKT, NEED_DATA, pkt_text
from enroute_core.protocol import fetch as pfetch
from enroute_core.protocol.errors import fatal_error_bytes
from enroute_core.protocol.receive import PushRequest, ReceivePack
from enroute_testing.pushed import push_layer
from enroute_testing.tagged import tagged_history

pytestmark = pytest.mark.fuzz

REQUEST_S = 3.0
"""A request's whole run (parse, checks, plan, pack) on this small history."""
ALLOWED = (
    ProtocolError, InvalidPktLine, LimitExceeded, InvalidRefName, InvalidArgument, MissingObject,
)  # fmt: skip
EDGES = [0, 1, 2, 7, 2**31 - 1, 2**31, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1,
         2**64, 2**64 + 1, 10**20 - 1, 10**20, 10**21]  # fmt: skip
ODD = [b"", b"-1", b"-9223372036854775808", b"x", b"1e9", b"0x10", b" 1", b"1 ", b"+1",
       b"007", b"1k", b"1K", b"3m", b"2g", b"1t", b"1kk", b"k", b"0" * 25 + b"1",
       "\u0661".encode(), b"1.5"]  # fmt: skip
SMALL = Limits(
    protocol_wants_max=4,
    protocol_haves_max=3,
    protocol_shallows_max=2,
    protocol_deepen_nots_max=1,
    protocol_capabilities_max=4,
    protocol_server_options_max=2,
    protocol_push_commands_max=3,
    protocol_push_options_max=2,
)
LIMITS = st.sampled_from([Limits(), SMALL])
History = tuple[View, dict[bytes, ObjectId], list[ObjectId]]


@st.composite
def numbers(draw: st.DrawFn) -> bytes:
    """A number as a client might write it: an edge, any integer, or not a number."""
    kind = draw(st.sampled_from(["edge", "edge", "any", "odd", "negative"]))
    if kind == "edge":
        return b"%d" % draw(st.sampled_from(EDGES))
    if kind == "any":
        return b"%d" % draw(st.integers(0, 2**70))
    if kind == "negative":
        return b"%d" % -draw(st.sampled_from(EDGES[1:]))
    return draw(st.sampled_from(ODD))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    path: Path = tmp_path_factory.mktemp("values") / "src.git"
    refs = {n.encode(): oid_from_hex(v) for n, v in tagged_history(path).items()}
    layer = push_layer(path, [], 0, revs=["--all"], exclude=[], tips=list(refs.values()))
    view = View([layer])
    return view, refs, [view.oid_of_id(i) for i in range(view.end_id)]


@st.composite
def fetch_args(draw: st.DrawFn, objects: list[ObjectId], limits: Limits) -> list[bytes]:
    """Argument lines of one fetch: wants of any kind and count, and numbers everywhere."""
    stranger = ObjectId(b"\xee" * 20)
    pool = [*objects, stranger]
    most = limits.protocol_wants_max
    count = draw(st.sampled_from([1, 1, 2, 3, most, most + 1]))
    count = min(count, len(pool)) if limits is not SMALL else count
    wants = draw(st.lists(st.sampled_from(pool), min_size=count, max_size=count))
    if limits is SMALL and count > len(set(wants)):  # over the bound: distinct wants
        wants = [ObjectId(b"%020d" % i) for i in range(count)]
    args = [b"want " + w.hex().encode() for w in wants]
    if draw(st.booleans()):
        args.append(b"want " + wants[0].hex().encode())  # a repeat counts once
    for _ in range(draw(st.integers(0, limits.protocol_shallows_max + 1))):
        args.append(b"shallow " + draw(st.sampled_from(pool)).hex().encode())
    choice = draw(st.sampled_from(["none", "deepen", "since", "not", "relative"]))
    if choice in ("deepen", "relative"):
        args.append(b"deepen " + draw(numbers()))
    if choice == "relative":
        args.append(b"deepen-relative")
    if choice == "since":
        args.append(b"deepen-since " + draw(numbers()))
    if choice == "not":
        args.append(b"deepen-not " + draw(st.sampled_from([b"main", b"refs/tags/key", b"nope"])))
    spec = draw(st.sampled_from([None, b"tree:", b"blob:limit=", b"blob:none"]))
    if spec is not None:
        args.append(b"filter " + spec + (draw(numbers()) if spec != b"blob:none" else b""))
    for _ in range(draw(st.integers(0, 2))):
        args.append(b"have " + draw(st.sampled_from(pool)).hex().encode())
    args.extend(draw(st.lists(st.sampled_from([b"thin-pack", b"ofs-delta", b"include-tag"]))))
    args.append(b"done")
    return args


def _serve(
    view: View,
    refs: dict[bytes, ObjectId],
    request: pfetch.FetchRequest | pfetch.UploadRequestV0,
    haves: tuple[ObjectId, ...],
) -> int:
    """What the compute does with a parsed request (enroute_compute.fetch): the wants
    checked, deepen-not resolved, the pack planned and written. Returns its size."""
    tips = None if isinstance(request, pfetch.FetchRequest) else list(refs.values())
    serve.check_wants(view, request.wants, tips=tips)
    deepen_not = []
    for name in request.deepen.not_refs:
        found = [refs[r % name] for r in (b"%s", b"refs/heads/%s", b"refs/tags/%s") if r % name
                 in refs]  # fmt: skip
        if len(found) != 1:
            raise ProtocolError(f"unknown deepen-not: {name!r}")
        deepen_not.append(found[0])
    spec = request.filter
    engine_filter: serve.FetchFilter | None = None
    if isinstance(spec, pfetch.BlobNone):
        engine_filter = serve.BlobNone()
    elif isinstance(spec, pfetch.BlobLimit):
        engine_filter = serve.BlobLimit(spec.bytes_max)
    elif isinstance(spec, pfetch.TreeDepth):
        engine_filter = serve.TreeDepth(spec.depth)
    plan = serve.plan_fetch(
        view,
        request.wants,
        haves,
        filter=engine_filter,
        include_tag=list(refs.values()),
        deepen=request.deepen.depth,
        deepen_relative=request.deepen.relative,
        deepen_since=request.deepen.since,
        deepen_not=deepen_not,
        client_shallow=request.deepen.shallows,
    )
    size = [0]
    serve.write_pack(view, plan, lambda piece: size.__setitem__(0, size[0] + len(piece)))
    return size[0]


def _run(action: Any) -> str:
    """``action`` within the time bound; a typed error must have a Git form."""
    started = time.monotonic()
    with typed_errors(*ALLOWED) as caught:
        action()
    took = time.monotonic() - started
    assert took < REQUEST_S, f"a request took {took:.2f} s"
    if caught:
        error: EnrouteError = caught[0]
        assert fatal_error_bytes(error, response_started=False, sideband=False).startswith(b"0")
        assert error.message, "a refusal says why"
        return type(error).__name__
    return "served"


@fuzz_settings(60)
@given(data=st.data(), limits=LIMITS, caps=st.sampled_from([0, 0, 1, 2, 3, 5, 256, 257]))
@example(data=None, limits=Limits(), caps=0)
def test_upload_pack_v2_values(history: History, data: Any, limits: Limits, caps: int) -> None:
    view, refs, objects = history
    if data is None:  # the finding itself: tree:2^64-1 on a whole clone
        args = [b"want " + v.hex().encode() for v in refs.values()]
        args += [b"filter tree:18446744073709551615", b"done"]
    else:
        args = data.draw(fetch_args(objects, limits))
    options = [b"server-option=%d" % i for i in range(caps)]
    body = pkt_text(b"command=fetch") + b"".join(map(pkt_text, [b"agent=x", *options]))
    body += DELIM_PKT + b"".join(map(pkt_text, args)) + FLUSH_PKT

    def action() -> None:
        conv = pfetch.UploadPackV2(limits=limits, wants_max=pfetch.wants_max(limits, len(refs)))
        conv.feed(body)
        conv.feed_eof()
        event = conv.next_event()
        assert isinstance(event, pfetch.FetchCommand)
        request = event.request
        haves = tuple(h for h in request.haves if view.contains(h))
        _serve(view, refs, request, haves)

    tally(f"v2: {_run(action)}")


@fuzz_settings(60)
@given(data=st.data(), limits=LIMITS, caps=st.sampled_from([0, 1, 4, 5, 256, 257]))
def test_upload_pack_v0_values(history: History, data: Any, limits: Limits, caps: int) -> None:
    view, refs, objects = history
    args = data.draw(fetch_args(objects, limits))
    wants = [a for a in args if a.startswith(b"want ")]
    rest = [a for a in args if not a.startswith((b"want ", b"have ", b"done"))]
    haves = [a for a in args if a.startswith(b"have ")]
    capabilities = [b"multi_ack_detailed", b"side-band-64k", b"ofs-delta", b"agent=git/2.39"]
    capabilities += [b"x%d" % i for i in range(max(0, caps - len(capabilities)))]
    first = wants[0] + b" " + b" ".join(capabilities[:caps]) if caps else wants[0]
    body = b"".join(map(pkt_text, [first, *wants[1:], *rest])) + FLUSH_PKT
    body += b"".join(map(pkt_text, haves)) + pkt_text(b"done")

    def action() -> None:
        conv = pfetch.UploadPackV0(limits=limits, wants_max=pfetch.wants_max(limits, len(refs)))
        conv.feed(body)
        conv.feed_eof()
        events = []
        while (event := conv.next_event()) is not NEED_DATA:
            events.append(event)
            if isinstance(event, pfetch.RequestEnd):
                break
        want_list = events[0]
        assert isinstance(want_list, pfetch.WantList)
        had = tuple(
            h
            for e in events
            if isinstance(e, pfetch.HaveBatch)
            for h in e.haves
            if view.contains(h)
        )
        _serve(view, refs, want_list.request, had)

    tally(f"v0: {_run(action)}")


@fuzz_settings(150)
@given(
    limits=LIMITS,
    commands=st.integers(0, 4),
    shallows=st.integers(0, 3),
    options=st.lists(st.one_of(numbers(), st.binary(max_size=40)), max_size=4),
    caps=st.lists(
        st.one_of(
            st.sampled_from(
                [
                    b"report-status",
                    b"side-band-64k",
                    b"atomic",
                    b"push-options",
                    b"quiet",
                    b"ofs-delta",
                ]
            ),
            numbers().map(lambda n: b"agent=" + n),
        ),
        max_size=300,
    ),
    number=numbers(),
)
def test_receive_pack_values(  # noqa: PLR0917 (one argument per drawn value)
    limits: Limits,
    commands: int,
    shallows: int,
    options: list[bytes],
    caps: list[bytes],
    number: bytes,
) -> None:
    """Push commands, shallow lines, capabilities and push options of any count and value;
    a number where an oid or a ref goes is a malformed command, refused by name."""
    zero, some = b"0" * 40, b"ab" * 20
    lines = [b"shallow " + some for _ in range(shallows)]
    for i in range(commands):
        line = zero + b" " + some + b" refs/heads/b%d" % i
        if i == 0:
            line += b"\x00" + b" ".join(caps)
        lines.append(line)
    if commands and number[:1] == b"1":
        lines.append(number + b" " + some + b" refs/heads/" + number)
    body = b"".join(map(pkt_text, lines)) + FLUSH_PKT
    if commands and b"push-options" in caps:
        body += b"".join(pkt_text(o) for o in options if o) + FLUSH_PKT
    body += b"PACK\x00\x00\x00\x02\x00\x00\x00\x00"

    def action() -> None:
        conv = ReceivePack(limits=limits)
        conv.feed(body)
        conv.feed_eof()
        while (event := conv.next_event()) is not NEED_DATA:
            if isinstance(event, PushRequest):
                assert len(event.commands) <= limits.protocol_push_commands_max
                assert len(event.push_options) <= limits.protocol_push_options_max
                assert len(event.capabilities) <= limits.protocol_capabilities_max
            if type(event).__name__ == "PushEnd":
                break

    tally(f"receive: {_run(action)}")
