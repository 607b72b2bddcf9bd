"""Git smart HTTP relay against a real gRPC Compute double (docs/rpc.md, "Git streams")."""

from __future__ import annotations

import gzip
import http.client
from typing import Any

import pytest

from enroute_gitproto.githttp import GitHttpLimits, parse_git_request, push_uses_sideband
from enroute_gitproto.routing import rendezvous_order


def request(
    address: str, method: str, target: str, body: bytes | None = None, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            method, target, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()}
        )
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_info_refs_streams_header_and_advertisement(gitproto: Any, computes: Any) -> None:
    status, headers, body = request(
        gitproto.address, "GET", "/team/app.git/info/refs?service=git-upload-pack",
        Git_Protocol="version=2", User_Agent="git/2.45",
    )  # fmt: skip
    assert status == 200, body
    assert headers["content-type"] == "application/x-git-upload-pack-advertisement"
    assert "no-cache" in headers["cache-control"]
    assert headers["expires"].startswith("Fri, 01 Jan 1980")
    assert body == b"c0:InfoRefs:1:version=2:"
    sent = computes[0].fake.headers[-1]
    assert (sent.repo, sent.git_protocol, sent.user_agent) == ("team/app", "version=2", "git/2.45")


def test_url_without_git_suffix_and_receive_pack_service(gitproto: Any, computes: Any) -> None:
    status, headers, body = request(
        gitproto.address, "GET", "/team/app/info/refs?service=git-receive-pack"
    )
    assert status == 200
    assert headers["content-type"] == "application/x-git-receive-pack-advertisement"
    assert body == b"c0:InfoRefs:2::"


@pytest.mark.parametrize("endpoint,rpc", [("git-upload-pack", "UploadPack"),
                                          ("git-receive-pack", "ReceivePack")])  # fmt: skip
def test_post_body_streams_to_compute(
    gitproto: Any, computes: Any, endpoint: str, rpc: str
) -> None:
    payload = bytes(range(256)) * 2000
    status, headers, body = request(gitproto.address, "POST", f"/r.git/{endpoint}", payload)
    assert status == 200
    assert headers["content-type"] == f"application/x-{endpoint}-result"
    service = 1 if endpoint == "git-upload-pack" else 2
    assert body == f"c0:{rpc}:{service}::".encode() + payload
    assert computes[0].fake.headers[-1].content_length_bytes == len(payload)


def test_gzip_request_body_is_inflated(gitproto: Any, computes: Any) -> None:
    payload = b"0032want " + b"a" * 40 + b"\n" * 1000
    status, _, body = request(
        gitproto.address, "POST", "/r.git/git-upload-pack", gzip.compress(payload),
        Content_Encoding="gzip",
    )  # fmt: skip
    assert status == 200
    assert body.endswith(payload)
    assert computes[0].fake.headers[-1].content_encoding == ""
    assert not computes[0].fake.headers[-1].HasField("content_length_bytes")


def test_garbage_gzip_is_an_err_packet(gitproto: Any) -> None:
    """A refused POST is a 200 with one ERR packet: git shows that, not an HTTP body."""
    status, _, body = request(
        gitproto.address, "POST", "/r.git/git-upload-pack", b"not gzip at all",
        Content_Encoding="gzip",
    )  # fmt: skip
    assert status == 200
    assert body[4:8] == b"ERR " and b"gzip" in body


def test_compute_header_sets_content_type(gitproto: Any) -> None:
    status, headers, _ = request(gitproto.address, "POST", "/typed.git/git-upload-pack", b"x")
    assert status == 200
    assert headers["content-type"] == "application/x-custom"


def test_not_found_maps_to_404(gitproto: Any) -> None:
    status, _, body = request(
        gitproto.address, "GET", "/missing.git/info/refs?service=git-upload-pack"
    )
    assert status == 404
    assert b"does not exist" in body


def test_invalid_argument_is_an_err_packet(gitproto: Any) -> None:
    status, _, body = request(gitproto.address, "POST", "/bad.git/git-receive-pack", b"PACK")
    assert status == 200, body
    assert body == b"001fERR pack header is garbage\n"


def test_refusal_of_a_sideband_push_is_band_3() -> None:
    """send-pack demultiplexes a side-band push's answer: an ERR packet would be band 69."""
    first = b"0" * 40 + b" " + b"1" * 40 + b" refs/heads/main\0report-status side-band-64k"
    head = b"%04x" % (len(first) + 4) + first
    assert push_uses_sideband(head)
    assert not push_uses_sideband(head.replace(b"side-band-64k", b"quiet"))
    assert not push_uses_sideband(b"PACK")


def test_error_after_response_started_cuts_the_response(gitproto: Any) -> None:
    with pytest.raises(http.client.IncompleteRead):
        request(gitproto.address, "POST", "/broken.git/git-upload-pack", b"abc")


@pytest.mark.parametrize(
    "path",
    ["//rooted.git/info/refs", "/team//x.git/info/refs", "/team/../x.git/info/refs",
     "/team/./x.git/info/refs", "/.git/info/refs", "/info/refs", "/ctl%01name.git/info/refs",
     "/double.git.git/info/refs", "/" + "n" * 257 + ".git/info/refs"],
)  # fmt: skip
def test_bad_names_are_400(gitproto: Any, path: str) -> None:
    status, _, body = request(gitproto.address, "GET", path + "?service=git-upload-pack")
    assert status == 400, body
    assert b"name" in body


def test_bad_service_and_method(gitproto: Any) -> None:
    assert request(gitproto.address, "GET", "/r.git/info/refs")[0] == 400
    assert request(gitproto.address, "GET", "/r.git/info/refs?service=git-x")[0] == 400
    assert request(gitproto.address, "GET", "/r.git/git-upload-pack")[0] == 400
    assert request(gitproto.address, "GET", "/r.git/objects/info/packs")[0] == 404


def test_parse_git_request_strips_one_git_suffix() -> None:
    call = parse_git_request("POST", "/a/b.git/git-receive-pack", "")
    assert call is not None and (call.repo, call.service) == ("a/b", "git-receive-pack")
    assert parse_git_request("GET", "/a/b.git/HEAD", "") is None


def _name_owned_by(members: list[str], owner: str, prefix: str = "r") -> str:
    for i in range(10_000):
        if rendezvous_order(f"{prefix}{i}", members)[0] == owner:
            return f"{prefix}{i}"
    raise AssertionError("no name found")


def test_failover_replays_body_to_next_compute(
    computes: Any, make_gitproto: Any, unused_address: str
) -> None:
    members = [unused_address, computes[1].address]
    server = make_gitproto(members, anonymous="write")
    name = _name_owned_by(members, unused_address)
    payload = b"x" * 300_000
    status, _, body = request(server.address, "POST", f"/{name}.git/git-receive-pack", payload)
    assert status == 200
    assert body == b"c1:ReceivePack:2::" + payload
    status, _, body = request(
        server.address, "GET", f"/{name}.git/info/refs?service=git-upload-pack"
    )
    assert (status, body) == (200, b"c1:InfoRefs:1::")
    assert server.app.metrics.failovers._value.get() >= 2


def test_no_failover_once_body_is_too_big_to_replay(
    computes: Any, make_gitproto: Any, unused_address: str
) -> None:
    members = [unused_address, computes[1].address]
    server = make_gitproto(members, anonymous="write", limits=GitHttpLimits(replay_bytes_max=10))
    name = _name_owned_by(members, unused_address)
    status, _, _ = request(server.address, "POST", f"/{name}.git/git-upload-pack", b"y" * 5000)
    assert status == 503


def test_rendezvous_routes_each_name_to_its_owner(computes: Any, make_gitproto: Any) -> None:
    members = [computes[0].address, computes[1].address]
    server = make_gitproto(members, anonymous="write")
    for owner, fake in ((members[0], "c0"), (members[1], "c1")):
        name = _name_owned_by(members, owner)
        _, _, body = request(
            server.address, "GET", f"/{name}.git/info/refs?service=git-upload-pack"
        )
        assert body.startswith(fake.encode())


def test_rendezvous_order_is_stable_and_minimal() -> None:
    members = [f"10.0.0.{i}:7100" for i in range(5)]
    names = [f"team/app{i}" for i in range(2000)]
    owners = {n: rendezvous_order(n, members)[0] for n in names}
    counts = {m: sum(1 for o in owners.values() if o == m) for m in members}
    assert all(250 < c < 550 for c in counts.values()), counts
    assert rendezvous_order("x", members) == rendezvous_order("x", list(reversed(members)))
    fewer = members[1:]
    for n in names:
        if owners[n] != members[0]:
            assert rendezvous_order(n, fewer)[0] == owners[n]
