"""The RPC contract: the committed stubs are current, complete and work with real gRPC.

DESIGN.md, "External interfaces": the services and methods named there, stubs
committed and checked (STYLE rule 10); docs/rpc.md for the semantics pinned
here (presence of optional fields, the error trailer).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

import enroute_proto
from enroute_proto.gen.enroute.common.v1 import common_pb2
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = PACKAGE_ROOT / "scripts"
PROTO_DIR = PACKAGE_ROOT / "proto"
GEN_DIR = PACKAGE_ROOT / "src" / "enroute_proto" / "gen"

LEDGER_METHODS = {
    "Activate",
    "Describe",
    "List",
    "Delete",
    "Propose",
    "ProposeStream",  # issue 21, item 4: many proposals on one call
    "Subscribe",
    "Follow",  # issue 19: many subscriptions on one stream per compute and member
    "Barrier",
}
COMPUTE_METHODS = {
    "UploadPack",
    "ReceivePack",
    "InfoRefs",
    "CreateRepository",
    "GetRepository",
    "ListRepositories",
    "DeleteRepository",
    "ListRefs",
    "CreateCommit",
}
OID = bytes(range(20))
SourcePath = tuple[int, ...]


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"enroute_proto_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check() -> ModuleType:
    return _load_script("check")


# -- the committed stubs -------------------------------------------------------


def test_every_generated_module_imports_under_the_package() -> None:
    modules = [
        "enroute_proto.gen.enroute.common.v1.common_pb2",
        "enroute_proto.gen.enroute.common.v1.common_pb2_grpc",
        "enroute_proto.gen.enroute.ledger.v1.ledger_pb2",
        "enroute_proto.gen.enroute.ledger.v1.ledger_pb2_grpc",
        "enroute_proto.gen.enroute.compute.v1.compute_pb2",
        "enroute_proto.gen.enroute.compute.v1.compute_pb2_grpc",
    ]
    for name in modules:
        assert importlib.import_module(name).__name__ == name
    # No top-level "enroute" package leaks out of the generated code.
    assert "enroute" not in sys.modules
    # Classes record the module they really live in (pickling, repr).
    assert ledger_pb2.ProposeRequest.__module__ == ledger_pb2.__name__
    assert common_pb2.RepositoryState.__module__ == common_pb2.__name__


def test_generated_files_are_marked_and_typed() -> None:
    files = sorted(p for p in GEN_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    names = {p.relative_to(GEN_DIR).as_posix() for p in files}
    for area in ("common", "ledger", "compute"):
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
            assert f"enroute/{area}/v1/{area}{suffix}" in names
    for path in files:
        head = path.read_text(encoding="utf-8")[:400]
        assert "DO NOT EDIT" in head or "Do not edit" in head, path


def test_the_check_passes_on_the_committed_stubs() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "check.py")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "current" in done.stdout


def test_the_check_reports_a_changed_byte_a_missing_and_an_extra_file(
    check: ModuleType, tmp_path: Path
) -> None:
    copy = tmp_path / "gen"
    shutil.copytree(GEN_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))

    target = copy / "enroute" / "ledger" / "v1" / "ledger_pb2.pyi"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    (copy / "enroute" / "compute" / "v1" / "compute_pb2_grpc.py").unlink()
    (copy / "enroute" / "stray_pb2.py").write_text("# hand-made\n")

    found = "".join(check.differences(copy))
    assert "generated/enroute/ledger/v1/ledger_pb2.pyi" in found
    assert "missing from the committed stubs: enroute/compute/v1/compute_pb2_grpc.py" in found
    assert "not produced by generation (stale or hand-made): enroute/stray_pb2.py" in found


def test_the_check_reports_a_changed_proto_source(check: ModuleType, tmp_path: Path) -> None:
    protos = tmp_path / "proto"
    shutil.copytree(PROTO_DIR, protos)
    source = protos / "enroute" / "common" / "v1" / "common.proto"
    text = source.read_text(encoding="utf-8")
    source.write_text(text.replace("string code = 1;", "string code = 9;"), encoding="utf-8")
    found = "".join(check.differences(GEN_DIR, protos))
    assert "common_pb2.py" in found


# -- the contract --------------------------------------------------------------


def _methods(file: FileDescriptor, service: str) -> dict[str, tuple[bool, bool]]:
    """Method name -> (client streams, server streams)."""
    return {
        m.name: (m.client_streaming, m.server_streaming)
        for m in file.services_by_name[service].methods
    }


def test_the_ledger_has_the_methods_design_names() -> None:
    methods = _methods(ledger_pb2.DESCRIPTOR, "Ledger")
    assert set(methods) == LEDGER_METHODS
    assert methods["Subscribe"] == (False, True)
    assert methods["ProposeStream"] == (True, True)
    assert methods["Follow"] == (True, True)
    for name in LEDGER_METHODS - {"Subscribe", "ProposeStream", "Follow"}:
        assert methods[name] == (False, False), name
    transport = _methods(ledger_pb2.DESCRIPTOR, "RaftTransport")
    assert transport == {"Send": (True, False), "SendSnapshot": (True, False)}
    for name in LEDGER_METHODS:
        assert callable(getattr(ledger_pb2_grpc.LedgerServicer, name))


def test_the_compute_has_the_methods_design_names() -> None:
    methods = _methods(compute_pb2.DESCRIPTOR, "Compute")
    assert set(methods) == COMPUTE_METHODS
    for name in ("UploadPack", "ReceivePack", "InfoRefs"):
        assert methods[name] == (True, True), name
    assert methods["ListRefs"] == (False, True)
    for name in COMPUTE_METHODS - {"UploadPack", "ReceivePack", "InfoRefs", "ListRefs"}:
        assert methods[name] == (False, False), name
    for name in COMPUTE_METHODS:
        assert callable(getattr(compute_pb2_grpc.ComputeServicer, name))


def test_package_names_and_service_paths() -> None:
    assert common_pb2.DESCRIPTOR.package == "enroute.common.v1"
    assert ledger_pb2.DESCRIPTOR.package == "enroute.ledger.v1"
    assert compute_pb2.DESCRIPTOR.package == "enroute.compute.v1"
    assert ledger_pb2.DESCRIPTOR.name == "enroute/ledger/v1/ledger.proto"
    assert compute_pb2.DESCRIPTOR.services_by_name["Compute"].full_name == (
        "enroute.compute.v1.Compute"
    )


def _source_infos() -> list[descriptor_pb2.FileDescriptorProto]:
    data = _load_script("generate").descriptor_set(PROTO_DIR)
    return list(descriptor_pb2.FileDescriptorSet.FromString(data).file)


def _commented_paths(file: descriptor_pb2.FileDescriptorProto) -> set[SourcePath]:
    return {
        tuple(loc.path) for loc in file.source_code_info.location if loc.leading_comments.strip()
    }


def _documentable(file: descriptor_pb2.FileDescriptorProto) -> Iterator[tuple[SourcePath, str]]:
    """Source paths of every message, field, oneof, enum, value, service and method.

    FileDescriptorProto field numbers: message_type 4, enum_type 5, service 6;
    DescriptorProto: field 2, oneof_decl 8; EnumDescriptorProto: value 2;
    ServiceDescriptorProto: method 2.
    """
    for i, msg in enumerate(file.message_type):
        assert not msg.nested_type and not msg.enum_type, "keep messages flat"
        yield (4, i), msg.name
        for j, field in enumerate(msg.field):
            yield (4, i, 2, j), f"{msg.name}.{field.name}"
        for k, oneof in enumerate(msg.oneof_decl):
            if not oneof.name.startswith("_"):  # not the synthetic oneof of an `optional`
                yield (4, i, 8, k), f"{msg.name}.{oneof.name}"
    for i, enum in enumerate(file.enum_type):
        yield (5, i), enum.name
        for j, value in enumerate(enum.value):
            yield (5, i, 2, j), f"{enum.name}.{value.name}"
    for i, service in enumerate(file.service):
        yield (6, i), service.name
        for j, method in enumerate(service.method):
            yield (6, i, 2, j), f"{service.name}.{method.name}"


def test_every_message_field_enum_and_method_has_a_comment() -> None:
    files = _source_infos()
    assert {f.name for f in files} == {
        "enroute/common/v1/common.proto",
        "enroute/ledger/v1/ledger.proto",
        "enroute/compute/v1/compute.proto",
    }
    missing = [
        f"{file.name}: {name}"
        for file in files
        for path, name in _documentable(file)
        if path not in _commented_paths(file)
    ]
    assert missing == []


# -- messages ------------------------------------------------------------------


def test_create_commit_round_trip_keeps_presence() -> None:
    request = compute_pb2.CreateCommitRequest(
        repo="team/app",
        branch=b"main",
        expected_oid=OID,
        message=b"subject\n\nbody \xff\n",
        author=compute_pb2.Signature(name=b"A U Thor", email=b"a@example.com", time_us=-1),
        changes=[
            compute_pb2.FileChange(path=b"src/a.py", content=b"", mode=0o100755),
            compute_pb2.FileChange(path=b"gone.txt"),
        ],
    )
    wire = request.SerializeToString(deterministic=True)
    back = compute_pb2.CreateCommitRequest.FromString(wire)
    assert back == request
    assert back.SerializeToString(deterministic=True) == wire
    assert back.HasField("expected_oid") and back.expected_oid == OID
    assert not back.HasField("committer")
    assert back.author.HasField("time_us") and back.author.time_us == -1
    assert not back.author.HasField("tz_offset_minutes")
    # Empty content is a present, empty file; no content deletes the path.
    assert back.changes[0].HasField("content") and back.changes[0].content == b""
    assert not back.changes[1].HasField("content") and not back.changes[1].HasField("mode")


def test_an_absent_expected_oid_differs_from_an_empty_one() -> None:
    unborn = compute_pb2.CreateCommitRequest(repo="r", branch=b"main")
    empty = compute_pb2.CreateCommitRequest(repo="r", branch=b"main", expected_oid=b"")
    assert unborn.SerializeToString() != empty.SerializeToString()
    assert not compute_pb2.CreateCommitRequest.FromString(unborn.SerializeToString()).HasField(
        "expected_oid"
    )
    assert compute_pb2.CreateCommitRequest.FromString(empty.SerializeToString()).HasField(
        "expected_oid"
    )


def test_repository_state_last_push_presence_and_large_numbers() -> None:
    never = common_pb2.RepositoryState(name="a", incarnation=1, head=b"refs/heads/main")
    assert not common_pb2.RepositoryState.FromString(never.SerializeToString()).HasField(
        "last_push_us"
    )
    epoch = common_pb2.RepositoryState(name="a", last_push_us=0, version=2**64 - 1)
    back = common_pb2.RepositoryState.FromString(epoch.SerializeToString())
    assert back.HasField("last_push_us") and back.last_push_us == 0
    assert back.version == 2**64 - 1


def test_subscribe_and_raft_batch_round_trip() -> None:
    events = [
        ledger_pb2.SubscribeResponse(
            snapshot=ledger_pb2.SnapshotPart(incarnation=2, version=7, data=b"\x00" * 5, last=True)
        ),
        ledger_pb2.SubscribeResponse(
            changes=ledger_pb2.ChangeBatch(changes=[ledger_pb2.Change(version=8, effects=b"e8")])
        ),
    ]
    kinds = [
        ledger_pb2.SubscribeResponse.FromString(e.SerializeToString()).WhichOneof("event")
        for e in events
    ]
    assert kinds == ["snapshot", "changes"]
    group = ledger_pb2.RaftGroup(repo="team/app", incarnation=3)
    batch = ledger_pb2.RaftBatch(
        from_node=1,
        to_node=2,
        messages=[ledger_pb2.GroupMessage(group=group, message=b"\x01raft")],
        heartbeats=[ledger_pb2.Heartbeat(group=group, term=5, commit=9, quiesce=True)],
        heartbeat_responses=[ledger_pb2.Heartbeat(group=group, term=5, context=b"ctx")],
    )
    assert ledger_pb2.RaftBatch.FromString(batch.SerializeToString()) == batch


def test_follow_requests_and_events_round_trip() -> None:
    """docs/rpc.md, "Follow": one op per request; events tagged with the follow's id."""
    ops = [
        ledger_pb2.FollowRequest(
            follow=ledger_pb2.Follow(id=7, repo="team/app", incarnation=2, after_version=2**64 - 1)
        ),
        ledger_pb2.FollowRequest(unfollow=ledger_pb2.Unfollow(id=7)),
    ]
    back = [ledger_pb2.FollowRequest.FromString(o.SerializeToString()) for o in ops]
    assert back == ops
    assert [b.WhichOneof("op") for b in back] == ["follow", "unfollow"]
    detail = enroute_proto.ErrorDetail(
        code="not_found", message="no such incarnation here", details_json="{}"
    )
    resp = ledger_pb2.FollowResponse(
        events=[
            ledger_pb2.FollowEvent(id=1, inline_layer=ledger_pb2.InlineLayer(root=b"r", data=b"d")),
            ledger_pb2.FollowEvent(
                id=1, snapshot=ledger_pb2.SnapshotPart(incarnation=1, version=3, last=True)
            ),
            ledger_pb2.FollowEvent(
                id=2, changes=ledger_pb2.ChangeBatch(changes=[ledger_pb2.Change(version=9)])
            ),
            ledger_pb2.FollowEvent(id=2, ended=ledger_pb2.FollowEnded()),
            ledger_pb2.FollowEvent(id=3, ended=ledger_pb2.FollowEnded(status=5, detail=detail)),
        ]
    )
    got = ledger_pb2.FollowResponse.FromString(resp.SerializeToString())
    assert got == resp
    assert [e.WhichOneof("event") for e in got.events] == [
        "inline_layer",
        "snapshot",
        "changes",
        "ended",
        "ended",
    ]
    # an OK end carries no detail: the compute tells "follow again" from an error by it
    assert not got.events[3].ended.HasField("detail")
    assert got.events[4].ended.detail.code == "not_found"


def test_error_detail_metadata_round_trip() -> None:
    metadata = enroute_proto.error_detail_metadata(
        "stale_ref", "refs/heads/main moved", '{"current_oid": null}'
    )
    detail = enroute_proto.find_error_detail([("other", "x"), *metadata])
    assert detail is not None
    assert (detail.code, detail.message, detail.details_json) == (
        "stale_ref",
        "refs/heads/main moved",
        '{"current_oid": null}',
    )
    assert enroute_proto.find_error_detail(None) is None
    assert enroute_proto.find_error_detail([("other", b"x")]) is None
    assert enroute_proto.find_error_detail([(enroute_proto.ERROR_DETAIL_KEY, b"\xff")]) is None


# -- real gRPC -----------------------------------------------------------------


class EchoCompute(compute_pb2_grpc.ComputeServicer):
    """Echoes Git request bodies back; answers GetRepository or NOT_FOUND with a detail."""

    def UploadPack(  # noqa: N802 (the generated method name)
        self, request_iterator: Iterator[compute_pb2.GitRequest], context: grpc.ServicerContext
    ) -> Iterator[compute_pb2.GitResponse]:
        first = next(request_iterator)
        assert first.WhichOneof("part") == "header"
        yield compute_pb2.GitResponse(
            header=compute_pb2.GitResponseHeader(
                content_type="application/x-git-upload-pack-result", http_status=200
            )
        )
        for request in request_iterator:
            yield compute_pb2.GitResponse(body=first.header.repo.encode() + b":" + request.body)

    def GetRepository(  # noqa: N802
        self, request: compute_pb2.GetRepositoryRequest, context: grpc.ServicerContext
    ) -> compute_pb2.GetRepositoryResponse:
        if request.repo == "missing":
            context.set_trailing_metadata(
                enroute_proto.error_detail_metadata("not_found", "no such repository", "{}")
            )
            context.abort(grpc.StatusCode.NOT_FOUND, "no such repository")
        return compute_pb2.GetRepositoryResponse(
            repository=common_pb2.RepositoryState(
                name=request.repo, incarnation=1, version=3, head=b"refs/heads/main"
            )
        )


def _git_requests(repo: str, chunks: list[bytes]) -> Iterator[compute_pb2.GitRequest]:
    yield compute_pb2.GitRequest(
        header=compute_pb2.GitRequestHeader(
            repo=repo,
            service=compute_pb2.GIT_SERVICE_UPLOAD_PACK,
            git_protocol="version=2",
            content_length_bytes=sum(len(c) for c in chunks),
        )
    )
    for chunk in chunks:
        yield compute_pb2.GitRequest(body=chunk)


@pytest.fixture()
def sync_server() -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    # The fake implements only what the tests call; mypy-protobuf's servicer is
    # abstract so that a production servicer cannot miss a method.
    servicer = EchoCompute()  # type: ignore[abstract]
    compute_pb2_grpc.add_ComputeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None).wait(5)


def test_real_grpc_unary_and_bidirectional_stream(sync_server: int) -> None:
    chunks = [b"0000", b"\x00\xff" * 40_000, b""]
    with grpc.insecure_channel(f"127.0.0.1:{sync_server}") as channel:
        stub = compute_pb2_grpc.ComputeStub(channel)

        reply = stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="team/app"), timeout=10)
        assert reply.repository.name == "team/app"
        assert reply.repository.head == b"refs/heads/main"

        responses = list(stub.UploadPack(_git_requests("team/app", chunks), timeout=10))
        assert responses[0].header.content_type == "application/x-git-upload-pack-result"
        assert [r.body for r in responses[1:]] == [b"team/app:" + c for c in chunks]


def test_real_grpc_error_carries_the_detail_trailer(sync_server: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{sync_server}") as channel:
        stub = compute_pb2_grpc.ComputeStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="missing"), timeout=10)
        error = caught.value
        assert isinstance(error, grpc.Call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        detail = enroute_proto.find_error_detail(error.trailing_metadata())
        assert detail is not None and detail.code == "not_found"


class AsyncEchoCompute(compute_pb2_grpc.ComputeServicer):
    """The same echo on grpc.aio, as the services run it."""

    async def ReceivePack(  # noqa: N802
        self,
        request_iterator: AsyncIterator[compute_pb2.GitRequest],
        context: grpc.aio.ServicerContext[compute_pb2.GitRequest, compute_pb2.GitResponse],
    ) -> AsyncIterator[compute_pb2.GitResponse]:
        async for request in request_iterator:
            if request.WhichOneof("part") == "body":
                yield compute_pb2.GitResponse(body=request.body[::-1])


def test_real_grpc_aio_bidirectional_stream() -> None:
    async def scenario() -> list[bytes]:
        server = grpc.aio.server()
        servicer = AsyncEchoCompute()  # type: ignore[abstract]
        compute_pb2_grpc.add_ComputeServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = compute_pb2_grpc.ComputeStub(channel)
                call = stub.ReceivePack(_git_requests("r", [b"abc", b"de"]), timeout=10)
                return [r.body async for r in call]
        finally:
            await server.stop(None)

    result: list[list[bytes]] = []
    # Run on a thread of its own so an event loop of the test runner cannot interfere.
    thread = threading.Thread(target=lambda: result.append(asyncio.run(scenario())))
    thread.start()
    thread.join(30)
    assert result == [[b"cba", b"ed"]]
