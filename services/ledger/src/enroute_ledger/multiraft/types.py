"""Values the multi-Raft layer takes in and hands out (DESIGN.md, Processes: multi-Raft).

``Batch`` mirrors ``RaftBatch`` of ledger.proto (RaftTransport) with Raft
messages still decoded; ``rpc/convert.py`` turns one into the other, encoding
each message with :mod:`.codec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import Incarnation, LogIndex, NodeId, Term

from ..raft.types import Message, Ready

_ZERO_INDEX = LogIndex(0)


class GroupId(tuple[bytes, Incarnation]):
    """One repository incarnation: its own Raft group on every ledger voter.

    A checked ``(repo, incarnation)`` tuple: hashing and comparing stay in C, and
    every message, tick and Ready looks groups up in several dicts.
    """

    __slots__ = ()

    def __new__(cls, repo: bytes, incarnation: Incarnation) -> GroupId:
        if not repo or incarnation < 0:
            raise InvalidArgument("bad group id", repo=repo, incarnation=incarnation)
        return tuple.__new__(cls, (repo, incarnation))

    @property
    def repo(self) -> bytes:
        return self[0]

    @property
    def incarnation(self) -> Incarnation:
        return self[1]

    def __repr__(self) -> str:
        return f"GroupId(repo={self[0]!r}, incarnation={self[1]})"

    def __getnewargs__(self) -> tuple[bytes, Incarnation]:
        return (self[0], self[1])


@dataclass(frozen=True, slots=True)
class GroupMessage:
    group: GroupId
    message: Message


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A coalesced heartbeat (or response) of one group; from and to are the batch's nodes."""

    group: GroupId
    term: Term
    commit: LogIndex = _ZERO_INDEX
    context: bytes = b""
    quiesce: bool = False


@dataclass(frozen=True, slots=True)
class Batch:
    """All Raft traffic of one Ready from one node to another; empty = a liveness beat."""

    from_node: NodeId
    to_node: NodeId
    messages: tuple[GroupMessage, ...] = ()
    heartbeats: tuple[Heartbeat, ...] = ()
    heartbeat_responses: tuple[Heartbeat, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.messages or self.heartbeats or self.heartbeat_responses)


@dataclass(frozen=True, slots=True)
class GroupReady:
    group: GroupId
    ready: Ready


@dataclass(frozen=True, slots=True)
class NodeReady:
    """Work of every group at once, so one fsync covers all their writes.

    The driver persists every group's snapshot, entries and hard state (one
    sync if ``must_sync``), then sends ``batches``, then applies each group's
    committed entries and serves its read states (docs/raft.md, duty 5), then
    calls ``MultiRaft.advance``.
    """

    groups: tuple[GroupReady, ...]
    batches: tuple[Batch, ...]
    must_sync: bool
