"""Protobuf <-> the compute's own values; protobuf types stop here (services.md)."""

from __future__ import annotations

from enroute_compute.ledger_port import CreateMode, RepoSummary
from enroute_core.state import RefValue
from enroute_proto.gen.enroute.common.v1 import common_pb2
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
