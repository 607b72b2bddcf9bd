"""The repository API RPCs of Compute, against both ledgers."""

from __future__ import annotations

import grpc
import pytest

from enroute_core.base.ids import ZERO_OID, ObjectId
from enroute_core.git.pktline import pkt_text
from enroute_core.protocol.receive import PushCommand, PushRequest, encode_push_request
from enroute_proto import find_error_detail
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc


def _code(exc: grpc.RpcError) -> str:
    detail = find_error_detail(exc.trailing_metadata())  # type: ignore[arg-type]
    return detail.code if detail is not None else "?"


def test_create_get_list_delete_and_refs(compute: object) -> None:
    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(compute.address))  # type: ignore[attr-defined]
    names = ["api/a", "api/b", "api/c"]
    for name in names:
        made = stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=name))
        assert made.created and made.repository.head == b"refs/heads/main"
        assert made.repository.head_kept
    again = stub.CreateRepository(
        compute_pb2.CreateRepositoryRequest(repo="api/a", default_branch=b"dev")
    )
    assert not again.created and again.repository.head == b"refs/heads/main"
    got = stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="api/b")).repository
    assert got.name == "api/b" and not got.HasField("last_push_us")
    seen: list[str] = []
    token = ""
    while True:
        page = stub.ListRepositories(compute_pb2.ListRepositoriesRequest(limit=2, page_token=token))
        seen += [r.name for r in page.repositories]
        token = page.next_page_token
        if not token:
            break
    assert [n for n in seen if n.startswith("api/")] == names
    stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo="api/b"))
    stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo="api/b"))
    with pytest.raises(grpc.RpcError) as info:
        stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="api/b"))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND and _code(info.value) == "not_found"
    with pytest.raises(grpc.RpcError) as info:
        stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="../x"))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(info.value) == "invalid_name"
    refs = list(stub.ListRefs(compute_pb2.ListRefsRequest(repo="api/a")))
    assert [r for m in refs for r in m.refs] == []


def test_git_stream_errors_before_the_body_are_statuses(compute: object) -> None:
    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(compute.address))  # type: ignore[attr-defined]
    header = compute_pb2.GitRequestHeader(repo="nope", service=compute_pb2.GIT_SERVICE_UPLOAD_PACK)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.InfoRefs(iter([compute_pb2.GitRequest(header=header)])))
    assert _code(info.value) == "not_found"
    bad = compute_pb2.GitRequestHeader(repo="x", service=compute_pb2.GIT_SERVICE_RECEIVE_PACK)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.UploadPack(iter([compute_pb2.GitRequest(header=bad)])))
    assert _code(info.value) == "invalid_argument"
    # every Git stream reads its header alike (servicer._git_header): a service, a
    # repository name, and the header first
    serviceless = compute_pb2.GitRequestHeader(repo="x")
    with pytest.raises(grpc.RpcError) as info:
        list(stub.InfoRefs(iter([compute_pb2.GitRequest(header=serviceless)])))
    assert _code(info.value) == "invalid_argument"
    badly_named = compute_pb2.GitRequestHeader(
        repo="../x", service=compute_pb2.GIT_SERVICE_UPLOAD_PACK
    )
    with pytest.raises(grpc.RpcError) as info:  # refused before the body is read
        twice = [compute_pb2.GitRequest(header=badly_named)] * 2
        list(stub.UploadPack(iter(twice)))
    assert _code(info.value) == "invalid_name"
    with pytest.raises(grpc.RpcError) as info:
        list(stub.UploadPack(iter([compute_pb2.GitRequest(body=b"0000")])))
    assert _code(info.value) == "protocol_error"
    # A push whose pack is garbage is answered in Git's form: unpack error and ng.
    oid = ObjectId(bytes(range(1, 21)))
    request = PushRequest((PushCommand(ZERO_OID, oid, b"refs/heads/main"),), (b"report-status",))
    body = encode_push_request(request) + b"PACK garbage"
    header = compute_pb2.GitRequestHeader(repo="junk", service=compute_pb2.GIT_SERVICE_RECEIVE_PACK)
    msgs = [compute_pb2.GitRequest(header=header), compute_pb2.GitRequest(body=body)]
    report = b"".join(r.body for r in stub.ReceivePack(iter(msgs)))
    assert report[4:].startswith(b"unpack unsupported pack version")
    assert pkt_text(b"ng refs/heads/main unpacker error") in report
