"""Golden vectors from real git 2.39 (``testdata/make_protocol_vectors.py``).

Requests captured from real clients are parsed and re-encoded to the same
bytes; our responses for the same repository state are compared with what
git's own server sent (gitprotocol-pack "Reference Discovery", gitprotocol-v2
"ls-refs" and "fetch", gitprotocol-pack "Report Status").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from enroute_core.base.ids import oid_from_hex
from enroute_core.git.pktline import Data, iter_pkt_lines, strip_lf
from enroute_core.git.sideband import PackData, demux_payload
from enroute_core.protocol._common import Ref, RefSnapshot
from enroute_core.protocol.advertise import (
    encode_v0_advertisement,
    encode_v2_capabilities,
    service_preamble,
)
from enroute_core.protocol.fetch import (
    BlobNone,
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
    encode_fetch_request,
    encode_pack_data,
    encode_upload_request_v0,
    encode_v0_acks,
)
from enroute_core.protocol.lsrefs import encode_ls_refs_request, encode_ls_refs_response
from enroute_core.protocol.receive import (
    PackChunk,
    PushEnd,
    PushReport,
    PushRequest,
    ReceivePack,
    encode_push_request,
    encode_report,
)

Drive = Callable[..., list[Any]]
DATA = Path(__file__).resolve().parent / "testdata"
GIT_AGENT = b"git/2.39.5"


def _read(name: str) -> bytes:
    return (DATA / name).read_bytes()


def _snapshot() -> RefSnapshot:
    peeled: dict[bytes, bytes] = {}
    plain: dict[bytes, bytes] = {}
    for line in _read("refs.txt").splitlines():
        hexid, name = line.split(b" ")
        if name.endswith(b"^{}"):
            peeled[name[:-3]] = hexid
        elif name != b"HEAD":
            plain[name] = hexid
    refs = tuple(
        Ref(
            name,
            oid_from_hex(plain[name]),
            oid_from_hex(peeled[name]) if name in peeled else None,
        )
        for name in sorted(plain)
    )
    return RefSnapshot(refs, head=b"refs/heads/main")


def _ref_lines(advertisement: bytes) -> list[bytes]:
    """Payloads with the capability list cut off: the bytes the protocol fixes."""
    return [
        p.payload.split(b"\x00")[0].rstrip(b"\n")
        for p in iter_pkt_lines(advertisement)
        if isinstance(p, Data)
    ]


def _packets(data: bytes) -> list[object]:
    """Packets with text LFs dropped: git's fetch-pack writes some lines without one."""
    return [Data(strip_lf(p.payload)) if isinstance(p, Data) else p for p in iter_pkt_lines(data)]


def _wants_once(packets: list[object]) -> list[object]:
    """git's packets with each repeated ``want`` line left out: git sends one per ref
    (HEAD and its branch share a value), and the server reads a want once."""
    seen: set[bytes] = set()
    out: list[object] = []
    for p in packets:
        if isinstance(p, Data) and p.payload.startswith(b"want "):
            oid = p.payload[5:45]
            if oid in seen:
                continue
            seen.add(oid)
        out.append(p)
    return out


def _band_one(data: bytes) -> bytes:
    parts = [demux_payload(p.payload) for p in iter_pkt_lines(data) if isinstance(p, Data)]
    assert all(isinstance(p, PackData) for p in parts)
    return b"".join(p.data for p in parts if isinstance(p, PackData))


def _oid(text: str) -> bytes:
    return oid_from_hex(text)


def test_v0_upload_pack_advertisement_ref_lines_match_git() -> None:
    ours = encode_v0_advertisement(_snapshot(), "git-upload-pack", smart_http=False)
    theirs = _read("upload-pack-v0.adv")
    assert _ref_lines(ours) == _ref_lines(theirs)
    assert ours.endswith(b"0000") and theirs.endswith(b"0000")
    first = next(iter(iter_pkt_lines(ours)))
    assert isinstance(first, Data)
    assert b"symref=HEAD:refs/heads/main" in first.payload.split(b"\x00")[1]


def test_v0_receive_pack_advertisement_ref_lines_match_git() -> None:
    ours = encode_v0_advertisement(_snapshot(), "git-receive-pack", smart_http=False)
    assert _ref_lines(ours) == _ref_lines(_read("receive-pack-v0.adv"))


def test_empty_receive_pack_advertisement_matches_git() -> None:
    empty = RefSnapshot((), head=b"refs/heads/main")
    ours = encode_v0_advertisement(empty, "git-receive-pack", smart_http=False)
    theirs = _read("empty-receive-pack-v0.adv")
    assert _ref_lines(ours) == _ref_lines(theirs)
    # The same capability list as git (push-options is off in that repository).
    ours_caps = ours.split(b"\x00")[1].split(b"\n")[0].split(b" ")
    theirs_caps = theirs.split(b"\x00")[1].split(b"\n")[0].split(b" ")
    assert [c for c in ours_caps if c not in (b"push-options",) and not c.startswith(b"agent")] == [
        c for c in theirs_caps if not c.startswith(b"agent")
    ]
    upload = encode_v0_advertisement(empty, "git-upload-pack", smart_http=False)
    assert _ref_lines(upload) == [b"0" * 40 + b" capabilities^{}"]


def test_smart_http_preamble() -> None:
    assert service_preamble("git-upload-pack") == b"001e# service=git-upload-pack\n0000"
    adv = encode_v0_advertisement(_snapshot(), "git-receive-pack", version1=True)
    assert adv.startswith(b"001f# service=git-receive-pack\n0000000eversion 1\n")


def test_v2_capabilities_match_git_byte_for_byte() -> None:
    ours = encode_v2_capabilities(agent=GIT_AGENT, object_info=True)
    assert ours == _read("upload-pack-v2.adv")


def test_ls_refs_request_and_response_match_git(drive: Drive) -> None:
    events = drive(UploadPackV2(), _read("ls-refs.req"))
    assert isinstance(events[0], LsRefsCommand)
    assert isinstance(events[-1], SessionEnd)
    request = events[0].request
    assert request.peel and request.symrefs and request.unborn
    assert request.ref_prefixes == (b"HEAD", b"refs/heads/", b"refs/tags/")
    assert encode_ls_refs_request(request) == _read("ls-refs.req")
    assert encode_ls_refs_response(request, _snapshot()) == _read("ls-refs.resp")


def _fetch_part(request: bytes) -> bytes:
    return request[request.index(b"0011command=fetch") :]


def _head_of(response: bytes) -> bytes:
    return response[: response.index(b"packfile\n") + len(b"packfile\n")]


def test_v2_shallow_filtered_clone_matches_git(drive: Drive) -> None:
    body = _read("clone-v2.req")
    events = drive(UploadPackV2(), body)
    assert [type(e) for e in events] == [LsRefsCommand, FetchCommand, SessionEnd]
    fetch = events[1]
    assert isinstance(fetch, FetchCommand)
    request = fetch.request
    tip = _oid("6f228b42b4d3a45af8bf20ffab1dadb9257ec4e9")
    assert request.wants == (tip,) and request.done  # git wants it twice (HEAD and main)
    assert request.deepen.depth == 1 and request.filter == BlobNone()
    assert request.thin_pack and request.no_progress and request.include_tag and request.ofs_delta
    assert request.agent == GIT_AGENT
    assert _packets(encode_fetch_request(request)) == _wants_once(_packets(_fetch_part(body)))
    response = _read("clone-v2.resp")
    head = encode_fetch_head(request, FetchReply(shallow=(tip,)))
    assert head == _head_of(response)


def test_v2_fetch_with_haves_matches_git(drive: Drive) -> None:
    events = drive(UploadPackV2(), _read("fetch-v2.req"))
    fetch = events[1]
    assert isinstance(fetch, FetchCommand)
    request = fetch.request
    assert not request.done and len(request.haves) == 2
    sent = _packets(_fetch_part(_read("fetch-v2.req")))
    assert _packets(encode_fetch_request(request)) == _wants_once(sent)
    response = _read("fetch-v2.resp")
    head = encode_fetch_head(request, FetchReply(common=request.haves, ready=True))
    assert head == _head_of(response)
    # The pack part: git cuts it where pack-objects' writes fell; the bands carry the same pack.
    rest = response[len(head) :]
    pack = _band_one(rest)
    assert pack.startswith(b"PACK") and rest.endswith(b"0000")
    assert _band_one(encode_pack_data(pack) + b"0000") == pack


def test_v0_clone_and_fetch_requests_round_trip(drive: Drive) -> None:
    for name in ("clone-v0.req", "fetch-v0.req"):
        body = _read(name)
        events = drive(UploadPackV0(), body)
        wants, batch, end = events
        assert isinstance(wants, WantList) and isinstance(batch, HaveBatch)
        assert isinstance(end, RequestEnd) and batch.done
        encoded = encode_upload_request_v0(wants.request, batch.haves, done=True)
        assert _packets(encoded) == _wants_once(_packets(body))


def test_v0_acks_match_git(drive: Drive) -> None:
    events = drive(UploadPackV0(), _read("fetch-v0.req"))
    wants, batch = events[0], events[1]
    assert isinstance(wants, WantList) and isinstance(batch, HaveBatch)
    acks = encode_v0_acks(wants.request, batch, frozenset(batch.haves), ready=True)
    response = _read("fetch-v0.resp")
    assert acks.send_pack
    assert response.startswith(acks.data)
    assert response[len(acks.data) : len(acks.data) + 5] == b"00fa\x01"


def test_push_request_and_report_match_git(drive: Drive) -> None:
    body = _read("push.req")
    events = drive(ReceivePack(), body)
    request = events[0]
    assert isinstance(request, PushRequest)
    assert [c.ref for c in request.commands] == [
        b"refs/heads/feature",
        b"refs/heads/main",
        b"refs/heads/topic",
    ]
    assert request.commands[0].is_delete and request.commands[2].is_create
    assert request.push_options == (b"ci.skip",)
    assert request.has(b"atomic") and request.has(b"report-status-v2")
    pack = b"".join(e.data for e in events if isinstance(e, PackChunk))
    assert pack.startswith(b"PACK")
    assert isinstance(events[-1], PushEnd) and events[-1].pack_bytes == len(pack)
    assert encode_push_request(request) + pack == body
    report = PushReport(None, tuple(_ok(c.ref) for c in request.commands))
    assert encode_report(report, request) == _read("push.resp")


def _ok(ref: bytes):  # type: ignore[no-untyped-def]
    from enroute_core.protocol.receive import RefStatus

    return RefStatus(ref)


def test_demux_of_pack_data_is_band_one() -> None:
    framed = encode_pack_data(b"x" * 70000)
    parts = [demux_payload(p.payload) for p in iter_pkt_lines(framed) if isinstance(p, Data)]
    assert all(isinstance(p, PackData) for p in parts) and len(parts) == 2
