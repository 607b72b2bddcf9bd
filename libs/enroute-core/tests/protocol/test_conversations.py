"""Conversations: chunked feeding, corruption, bad input, bounds, round trips, errors.

Cites gitprotocol-v2 "ls-refs"/"fetch", gitprotocol-pack "Packfile Negotiation"
and "Reference Update Request", gitprotocol-capabilities "multi_ack_detailed".
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import (
    InvalidPktLine,
    InvalidRefName,
    LimitExceeded,
    NotFound,
    ProtocolError,
    StaleRef,
)
from enroute_core.base.ids import ZERO_OID, ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import FLUSH_PKT, pkt_text
from enroute_core.protocol.errors import fatal_error_bytes
from enroute_core.protocol.fetch import (
    BlobLimit,
    BlobNone,
    Deepen,
    FetchCommand,
    FetchRequest,
    HaveBatch,
    LsRefsCommand,
    TreeDepth,
    UploadPackV0,
    UploadPackV2,
    UploadRequestV0,
    WantList,
    encode_fetch_request,
    encode_upload_request_v0,
    encode_v0_acks,
    parse_filter,
)
from enroute_core.protocol.lsrefs import LsRefsRequest, encode_ls_refs_request
from enroute_core.protocol.receive import (
    PushCommand,
    PushReport,
    PushRequest,
    ReceivePack,
    encode_push_request,
    encode_report,
    refused,
)

Drive = Callable[..., list[Any]]
DATA = Path(__file__).resolve().parent / "testdata"
TYPED = (ProtocolError, InvalidPktLine, InvalidRefName, LimitExceeded)
VECTORS: list[tuple[str, Callable[[], Any]]] = [
    ("ls-refs.req", UploadPackV2),
    ("clone-v2.req", UploadPackV2),
    ("fetch-v2.req", UploadPackV2),
    ("clone-v0.req", UploadPackV0),
    ("fetch-v0.req", UploadPackV0),
    ("push.req", ReceivePack),
]
A = ObjectId(bytes(range(20)))
B = ObjectId(bytes(range(20, 40)))
C = ObjectId(bytes(range(40, 60)))


def _seed() -> int:
    seed = int(os.environ.get("ENROUTE_SEED", random.SystemRandom().randrange(2**32)))
    print(f"ENROUTE_SEED={seed}")
    return seed


@pytest.mark.parametrize(("name", "make"), VECTORS, ids=[v[0] for v in VECTORS])
def test_byte_by_byte_equals_whole(drive: Drive, name: str, make: Callable[[], Any]) -> None:
    data = (DATA / name).read_bytes()
    whole = drive(make(), data)
    assert drive(make(), data, 1) == whole
    rng = random.Random(_seed())
    assert drive(make(), data, rng.randrange(2, 64)) == whole


@pytest.mark.parametrize(("name", "make"), VECTORS, ids=[v[0] for v in VECTORS])
def test_corruption_gives_only_typed_errors(
    drive: Drive, name: str, make: Callable[[], Any]
) -> None:
    data = (DATA / name).read_bytes()
    rng = random.Random(_seed())
    cases = [data[:cut] for cut in range(len(data))]
    for _ in range(300):
        pos = rng.randrange(len(data))
        cases.append(data[:pos] + bytes([data[pos] ^ (1 << rng.randrange(8))]) + data[pos + 1 :])
    for case in cases:
        with contextlib.suppress(*TYPED):
            drive(make(), case)


def test_trailing_data_after_v0_done_is_refused(drive: Drive) -> None:
    data = (DATA / "fetch-v0.req").read_bytes()
    with pytest.raises(ProtocolError):
        drive(UploadPackV0(), data + pkt_text(b"have " + b"a" * 40))


def test_error_state_stays() -> None:
    conv = UploadPackV2()
    conv.feed(pkt_text(b"command=bogus") + FLUSH_PKT)
    with pytest.raises(ProtocolError) as first:
        conv.next_event()
    with pytest.raises(ProtocolError) as again:
        conv.next_event()
    assert again.value is first.value and conv.failed
    with pytest.raises(ProtocolError):
        conv.feed(b"0000")


def _v2(args: list[bytes], command: bytes = b"fetch") -> bytes:
    head = pkt_text(b"command=" + command) + pkt_text(b"object-format=sha1") + b"0001"
    return head + b"".join(pkt_text(a) for a in args) + FLUSH_PKT


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (_v2([b"want 1234"]), ProtocolError),
        (_v2([b"want " + b"G" * 40]), ProtocolError),
        (_v2([b"frobnicate"]), ProtocolError),
        (_v2([b"filter sparse:oid=abc"]), ProtocolError),
        (_v2([b"filter combine:blob:none+tree:0"]), ProtocolError),
        (_v2([b"packfile-uris https"]), ProtocolError),
        (_v2([b"deepen 1", b"deepen-since 5"]), ProtocolError),
        (_v2([b"deepen 0"]), ProtocolError),
        (_v2([b"want-ref refs/heads/a..b"]), InvalidRefName),
        (_v2([b"symrefs"], b"object-info"), ProtocolError),
        (_v2([b"peel", b"bogus"], b"ls-refs"), ProtocolError),
        (pkt_text(b"command=fetch") + pkt_text(b"object-format=sha256") + FLUSH_PKT, ProtocolError),
        (pkt_text(b"command=fetch") + pkt_text(b"frob=1") + FLUSH_PKT, ProtocolError),
        (pkt_text(b"hello"), ProtocolError),
        (b"00zzgarbage", InvalidPktLine),
        (pkt_text(b"command=fetch") + b"0002", ProtocolError),
    ],
)
def test_v2_bad_input(drive: Drive, body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        drive(UploadPackV2(), body)


def test_too_many_wants_and_prefixes(drive: Drive) -> None:
    limits = Limits(protocol_wants_max=2, protocol_ref_prefixes_max=1)
    wants = [b"want " + c * 40 for c in (b"a", b"b", b"c")]
    with pytest.raises(LimitExceeded) as exc:
        drive(UploadPackV2(limits=limits), _v2(wants))
    assert exc.value.limit == "protocol_wants_max"
    assert "distinct wants" in exc.value.message
    assert len(drive(UploadPackV2(limits=limits), _v2(wants[:2]))) == 2
    # Repeated wants count once (git sends one per ref, and refs share values).
    assert len(drive(UploadPackV2(limits=limits), _v2(wants[:1] * 5))) == 2
    # The repository's ref count raises the bound (protocol.fetch.wants_max).
    assert len(drive(UploadPackV2(limits=limits, wants_max=3), _v2(wants))) == 2
    with pytest.raises(LimitExceeded):
        drive(UploadPackV2(limits=limits), _v2([b"ref-prefix a", b"ref-prefix b"], b"ls-refs"))
    v0 = encode_upload_request_v0(UploadRequestV0((A, B, C), (b"ofs-delta",)))
    with pytest.raises(LimitExceeded):
        drive(UploadPackV0(limits=limits), v0)
    drive(UploadPackV0(limits=limits, wants_max=3), v0)
    drive(UploadPackV0(limits=limits), encode_upload_request_v0(UploadRequestV0((A, A, A))))
    few = Limits(protocol_haves_max=1)
    with pytest.raises(LimitExceeded):
        drive(UploadPackV0(limits=few), encode_upload_request_v0(UploadRequestV0((A,)), (A, B)))


def test_filters() -> None:
    assert parse_filter(b"blob:none") == BlobNone()
    assert parse_filter(b"blob:limit=10") == BlobLimit(10)
    assert parse_filter(b"blob:limit=2k") == BlobLimit(2048)
    assert parse_filter(b"blob:limit=1M") == BlobLimit(1 << 20)
    assert parse_filter(b"blob:limit=3g") == BlobLimit(3 << 30)
    assert parse_filter(b"tree:0") == TreeDepth(0)
    for bad in (b"blob:limit=", b"blob:limit=k", b"blob:limit=-1", b"tree:x", b"object:type=tag"):
        with pytest.raises(ProtocolError):
            parse_filter(bad)


def _cmd(old: bytes, new: bytes, ref: bytes) -> bytes:
    return old + b" " + new + b" " + ref


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        ([_cmd(b"0" * 40, b"1" * 39, b"refs/heads/x")], ProtocolError),
        ([_cmd(b"0" * 40, b"X" * 40, b"refs/heads/x")], ProtocolError),
        ([b"0" * 40 + b"-" + b"1" * 40 + b" refs/heads/x"], ProtocolError),
        ([b"push-cert\x00report-status"], ProtocolError),
        ([_cmd(b"0" * 40, b"1" * 40, b"refs/heads/x"), b"shallow " + b"1" * 40], ProtocolError),
    ],
)
def test_push_bad_input(drive: Drive, lines: list[bytes], error: type[Exception]) -> None:
    body = b"".join(pkt_text(x) for x in lines) + FLUSH_PKT + b"PACK"
    with pytest.raises(error):
        drive(ReceivePack(), body)


def test_push_bounds_and_pack_rules(drive: Drive) -> None:
    cmd = PushCommand(ZERO_OID, A, b"refs/heads/a")
    many = PushRequest((cmd, cmd, cmd), (b"report-status",))
    with pytest.raises(LimitExceeded):
        drive(ReceivePack(limits=Limits(protocol_push_commands_max=2)), encode_push_request(many))
    opts = PushRequest((cmd,), (b"push-options",), push_options=(b"a", b"b"))
    with pytest.raises(LimitExceeded):
        limits = Limits(protocol_push_options_max=1)
        drive(ReceivePack(limits=limits), encode_push_request(opts) + b"PACK")
    with pytest.raises(ProtocolError):  # an update with no pack
        drive(ReceivePack(), encode_push_request(many))
    delete = PushRequest((PushCommand(A, ZERO_OID, b"refs/heads/a"),), (b"delete-refs",))
    events = drive(ReceivePack(), encode_push_request(delete))
    assert events[0] == delete and events[-1].pack_bytes == 0
    assert [type(e).__name__ for e in drive(ReceivePack(), b"")] == ["PushEnd"]
    with pytest.raises(ProtocolError):
        drive(ReceivePack(), FLUSH_PKT + b"PACK")


def test_report_forms() -> None:
    request = PushRequest((), (b"report-status",))
    report = PushReport(
        b"index-pack failed", (refused(b"refs/heads/a", StaleRef("stale: refs/heads/a moved")),)
    )
    assert encode_report(report, request) == (
        pkt_text(b"unpack index-pack failed")
        + pkt_text(b"ng refs/heads/a stale: refs/heads/a moved")
        + FLUSH_PKT
    )
    assert encode_report(report, PushRequest((), ())) == b""
    with pytest.raises(AssertionError):
        refused(b"refs/heads/a", NotFound("gone"))


def test_fatal_error_forms() -> None:
    exc = ProtocolError("bad\nthing")
    assert fatal_error_bytes(exc, response_started=False, sideband=True) == pkt_text(
        b"ERR bad thing"
    )
    assert fatal_error_bytes(exc, response_started=True, sideband=True) == b"000f\x03bad thing\n"


def _req(caps: tuple[bytes, ...] = (b"multi_ack_detailed",)) -> UploadRequestV0:
    return UploadRequestV0((A,), caps)


def test_v0_acks_nak_without_common() -> None:
    acks = encode_v0_acks(_req(), HaveBatch((A,), done=False), frozenset(), ready=False)
    assert acks.data == pkt_text(b"NAK") and not acks.send_pack
    done = encode_v0_acks(_req(), HaveBatch((A,), done=True), frozenset(), ready=False)
    assert done.data == pkt_text(b"NAK") and done.send_pack


def test_v0_acks_ready_with_no_done() -> None:
    hexa = A.hex().encode()
    req = _req((b"multi_ack_detailed", b"no-done"))
    acks = encode_v0_acks(req, HaveBatch((A,), done=False), frozenset({A}), ready=True)
    assert acks.data == b"".join(
        pkt_text(x)
        for x in (b"ACK " + hexa + b" common", b"ACK " + hexa + b" ready", b"NAK", b"ACK " + hexa)
    )
    assert acks.send_pack
    plain = encode_v0_acks(_req(()), HaveBatch((A, B), done=True), frozenset({A, B}), ready=True)
    assert plain.data == pkt_text(b"ACK " + hexa)


# -- round trips -------------------------------------------------------------------

_FIXTURE = [HealthCheck.function_scoped_fixture]
oids = st.binary(min_size=20, max_size=20).map(ObjectId)
words = st.lists(st.integers(0x21, 0x7E), min_size=1, max_size=12).map(bytes)
refs = st.lists(st.sampled_from([b"main", b"dev", b"v1.0", b"a-b"]), min_size=1, max_size=3).map(
    lambda parts: b"refs/heads/" + b"/".join(parts)
)
filters = st.one_of(
    st.none(),
    st.just(BlobNone()),
    st.integers(0, 2**40).map(BlobLimit),
    st.integers(0, 50).map(TreeDepth),
)


@st.composite
def deepens(draw: st.DrawFn) -> Deepen:
    kind = draw(st.sampled_from(["none", "depth", "since"]))
    return Deepen(
        shallows=tuple(draw(st.lists(oids, max_size=3))),
        depth=draw(st.integers(1, 2**31 - 1)) if kind == "depth" else None,
        since=draw(st.integers(0, 2**40)) if kind == "since" else None,
        not_refs=tuple(draw(st.lists(refs, max_size=2))) if kind == "since" else (),
        relative=draw(st.booleans()),
    )


def _one(drive: Drive, conv: Any, body: bytes) -> Any:
    return drive(conv, body)[0]


@settings(max_examples=60, deadline=None, suppress_health_check=_FIXTURE)
@given(
    wants=st.lists(oids, max_size=4, unique=True),  # repeated wants are read once
    want_refs=st.lists(refs, max_size=2),
    haves=st.lists(oids, max_size=4),
    flags=st.lists(st.booleans(), min_size=7, max_size=7),
    deepen=deepens(),
    spec=filters,
    options=st.lists(words, max_size=2),
)
def test_fetch_request_round_trip(  # noqa: PLR0917
    drive: Drive,
    wants: list[ObjectId],
    want_refs: list[bytes],
    haves: list[ObjectId],
    flags: list[bool],
    deepen: Deepen,
    spec: Any,
    options: list[bytes],
) -> None:
    request = FetchRequest(
        tuple(wants),
        tuple(want_refs),
        tuple(haves),
        *flags,
        deepen=deepen,
        filter=spec,
        agent=b"enroute/0.1.0",
        server_options=tuple(options),
    )
    event = _one(drive, UploadPackV2(), encode_fetch_request(request))
    assert event == FetchCommand(request)


@settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURE)
@given(st.booleans(), st.booleans(), st.booleans(), st.lists(words, max_size=4))
def test_ls_refs_request_round_trip(
    drive: Drive, a: bool, b: bool, c: bool, prefixes: list[bytes]
) -> None:
    request = LsRefsRequest(a, b, c, tuple(prefixes), agent=b"x/1")
    assert _one(drive, UploadPackV2(), encode_ls_refs_request(request)) == LsRefsCommand(request)


@settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURE)
@given(
    st.lists(oids, min_size=1, max_size=4, unique=True),
    st.lists(words, max_size=4),
    deepens(),
    filters,
    st.lists(oids, max_size=4),
    st.booleans(),
)
def test_upload_request_v0_round_trip(  # noqa: PLR0917
    drive: Drive,
    wants: list[ObjectId],
    caps: list[bytes],
    deepen: Deepen,
    spec: Any,
    haves: list[ObjectId],
    done: bool,
) -> None:
    request = UploadRequestV0(
        tuple(wants),
        tuple(caps),
        deepen.__class__(deepen.shallows, deepen.depth, deepen.since, deepen.not_refs, False),
        spec,
    )
    events = drive(UploadPackV0(), encode_upload_request_v0(request, haves, done=done))
    assert events[0] == WantList(request)
    assert events[1] == HaveBatch(tuple(haves), done)


@settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURE)
@given(
    st.lists(st.tuples(oids, oids, refs), min_size=1, max_size=4),
    st.lists(words, max_size=4),
    st.lists(oids, max_size=2),
    st.lists(words, max_size=3),
    st.binary(min_size=1, max_size=64),
)
def test_push_request_round_trip(  # noqa: PLR0917
    drive: Drive,
    cmds: list[tuple[ObjectId, ObjectId, bytes]],
    caps: list[bytes],
    shallows: list[ObjectId],
    options: list[bytes],
    pack: bytes,
) -> None:
    caps = [*caps, b"push-options"]
    request = PushRequest(
        tuple(PushCommand(*c) for c in cmds), tuple(caps), tuple(shallows), tuple(options)
    )
    events = drive(ReceivePack(), encode_push_request(request) + pack)
    assert events[0] == request
    assert events[1].data == pack
