"""Protobuf <-> the compute's own values; protobuf types stop here (services.md)."""

from __future__ import annotations

from enroute_compute.commits import CommitRequest, FileChange, Signature
from enroute_compute.ledger_port import CreateMode, RepoSummary
from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import OID_BYTES, ObjectId
from enroute_core.state import RefValue
from enroute_proto.gen.enroute.common.v1 import common_pb2
from enroute_proto.gen.enroute.compute.v1 import compute_pb2
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

CREATE_MODES: dict[CreateMode, ledger_pb2.CreateMode.ValueType] = {
    CreateMode.NONE: ledger_pb2.CREATE_MODE_UNSPECIFIED,
    CreateMode.EXPLICIT: ledger_pb2.CREATE_MODE_EXPLICIT,
    CreateMode.IMPLICIT: ledger_pb2.CREATE_MODE_IMPLICIT,
}


def summary_from_pb(msg: common_pb2.RepositoryState) -> RepoSummary:
    return RepoSummary(
        name=msg.name,
        incarnation=msg.incarnation,
        version=msg.version,
        deleted=msg.deleted,
        head=msg.head,
        head_kept=msg.head_kept,
        last_push_us=msg.last_push_us if msg.HasField("last_push_us") else None,
    )


def summary_to_pb(s: RepoSummary) -> common_pb2.RepositoryState:
    msg = common_pb2.RepositoryState(
        name=s.name,
        incarnation=s.incarnation,
        version=s.version,
        deleted=s.deleted,
        head=s.head,
        head_kept=s.head_kept,
    )
    if s.last_push_us is not None:
        msg.last_push_us = s.last_push_us
    return msg


def ref_to_pb(name: bytes, value: RefValue) -> common_pb2.Ref:
    return common_pb2.Ref(name=name, oid=value.oid, set_time_us=value.set_time_us)


def _signature(msg: compute_pb2.Signature) -> Signature:
    return Signature(
        name=msg.name,
        email=msg.email,
        time_us=msg.time_us if msg.HasField("time_us") else None,
        tz_offset_minutes=msg.tz_offset_minutes if msg.HasField("tz_offset_minutes") else 0,
    )


def commit_request_from_pb(msg: compute_pb2.CreateCommitRequest) -> CommitRequest:
    """A CreateCommit call as the host takes it; absent fields as the proto comments say."""
    expected: ObjectId | None = None
    if msg.HasField("expected_oid"):
        if len(msg.expected_oid) != OID_BYTES:
            raise InvalidArgument("expected_oid must be 20 bytes", field="expected_oid")
        expected = ObjectId(msg.expected_oid)
    if not msg.HasField("author"):
        raise InvalidArgument("a commit needs an author", field="author")
    return CommitRequest(
        repo=msg.repo,
        branch=msg.branch,
        expected_oid=expected,
        message=msg.message,
        author=_signature(msg.author),
        committer=_signature(msg.committer) if msg.HasField("committer") else None,
        changes=tuple(
            FileChange(
                path=c.path,
                content=c.content if c.HasField("content") else None,
                mode=c.mode if c.HasField("mode") else None,
            )
            for c in msg.changes
        ),
    )
