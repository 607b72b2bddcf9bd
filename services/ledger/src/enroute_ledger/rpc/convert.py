"""Protobuf <-> domain values; protobuf types stop here (services.md)."""

from __future__ import annotations

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_core.base.ids import Incarnation, LogIndex, NodeId, Term
from enroute_core.state import RepoState
from enroute_proto.gen.enroute.common.v1 import common_pb2
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

from ..multiraft import Batch, GroupId, GroupMessage, Heartbeat, decode_message, encode_message


def state_to_proto(name: str, s: RepoState) -> common_pb2.RepositoryState:
    msg = common_pb2.RepositoryState(
        name=name,
        incarnation=s.incarnation,
        version=s.version,
        deleted=s.deleted,
        head=s.head,
        head_kept=s.head_kept,
    )
    if s.last_push_us is not None:
        msg.last_push_us = s.last_push_us
    return msg


def _group_to_proto(g: GroupId) -> ledger_pb2.RaftGroup:
    return ledger_pb2.RaftGroup(repo=g.repo.decode(), incarnation=int(g.incarnation))


def _group_from_proto(g: ledger_pb2.RaftGroup) -> GroupId:
    if not g.repo or g.incarnation < 1:
        raise InvalidArgument("bad raft group", repo=g.repo, incarnation=g.incarnation)
    return GroupId(g.repo.encode(), Incarnation(g.incarnation))


def _hb_to_proto(h: Heartbeat) -> ledger_pb2.Heartbeat:
    return ledger_pb2.Heartbeat(
        group=_group_to_proto(h.group),
        term=int(h.term),
        commit=int(h.commit),
        context=h.context,
        quiesce=h.quiesce,
    )


def _hb_from_proto(h: ledger_pb2.Heartbeat) -> Heartbeat:
    return Heartbeat(
        _group_from_proto(h.group), Term(h.term), LogIndex(h.commit), h.context, h.quiesce
    )


def _gm_to_proto(m: GroupMessage) -> ledger_pb2.GroupMessage:
    return ledger_pb2.GroupMessage(
        group=_group_to_proto(m.group), message=encode_message(m.message)
    )


def batch_to_proto(b: Batch) -> ledger_pb2.RaftBatch:
    return ledger_pb2.RaftBatch(
        from_node=int(b.from_node),
        to_node=int(b.to_node),
        messages=[
            ledger_pb2.GroupMessage(
                group=_group_to_proto(m.group), message=encode_message(m.message)
            )
            for m in b.messages
        ],
        heartbeats=[_hb_to_proto(h) for h in b.heartbeats],
        heartbeat_responses=[_hb_to_proto(h) for h in b.heartbeat_responses],
    )


def batch_from_proto(p: ledger_pb2.RaftBatch) -> Batch:
    """Raises InvalidArgument or CorruptData(section="raft-message") on a bad batch."""
    try:
        return Batch(
            NodeId(p.from_node),
            NodeId(p.to_node),
            tuple(
                GroupMessage(_group_from_proto(m.group), decode_message(m.message))
                for m in p.messages
            ),
            tuple(_hb_from_proto(h) for h in p.heartbeats),
            tuple(_hb_from_proto(h) for h in p.heartbeat_responses),
        )
    except UnicodeError as e:
        raise CorruptData("raft group name is not text", section="raft-message") from e
