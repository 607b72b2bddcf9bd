"""Values the Raft core takes in and hands out.

Every value is a frozen slotted dataclass: the core never mutates a message
or an entry after creating it, so the caller may keep, queue or send them
without copying. ``None`` stands for "no node" where etcd uses 0.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId, Term

ZERO_TERM = Term(0)
ZERO_INDEX = LogIndex(0)

ENTRY_OVERHEAD_BYTES = 24
"""What an entry costs beyond its payload when sizing messages and windows."""


class EntryType(enum.Enum):
    NORMAL = 0
    CONF_CHANGE = 1


@dataclass(frozen=True, slots=True)
class Entry:
    term: Term
    index: LogIndex
    type: EntryType = EntryType.NORMAL
    data: bytes = b""

    @property
    def size_bytes(self) -> int:
        return len(self.data) + ENTRY_OVERHEAD_BYTES


def entries_size_bytes(entries: tuple[Entry, ...] | list[Entry]) -> int:
    return sum(len(e.data) for e in entries) + ENTRY_OVERHEAD_BYTES * len(entries)


def payload_size_bytes(entries: tuple[Entry, ...] | list[Entry]) -> int:
    """Only the data: the unit of the leader's uncommitted-bytes bound."""
    return sum(len(e.data) for e in entries)


class MessageType(enum.Enum):
    # local only: never on the wire
    HUP = "hup"
    BEAT = "beat"
    CHECK_QUORUM = "check_quorum"
    UNREACHABLE = "unreachable"
    SNAP_STATUS = "snap_status"
    # client requests, forwarded to the leader
    PROP = "prop"
    READ_INDEX = "read_index"
    READ_INDEX_RESP = "read_index_resp"
    TRANSFER_LEADER = "transfer_leader"
    # peer to peer
    APP = "app"
    APP_RESP = "app_resp"
    VOTE = "vote"
    VOTE_RESP = "vote_resp"
    PRE_VOTE = "pre_vote"
    PRE_VOTE_RESP = "pre_vote_resp"
    SNAP = "snap"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_RESP = "heartbeat_resp"
    TIMEOUT_NOW = "timeout_now"


LOCAL_MESSAGES = frozenset(
    {
        MessageType.HUP,
        MessageType.BEAT,
        MessageType.CHECK_QUORUM,
        MessageType.UNREACHABLE,
        MessageType.SNAP_STATUS,
    }
)
RESPONSE_MESSAGES = frozenset(
    {
        MessageType.APP_RESP,
        MessageType.VOTE_RESP,
        MessageType.PRE_VOTE_RESP,
        MessageType.HEARTBEAT_RESP,
        MessageType.UNREACHABLE,
        MessageType.SNAP_STATUS,
        MessageType.READ_INDEX_RESP,
    }
)


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class ConfState:
    voters: frozenset[NodeId] = frozenset()
    learners: frozenset[NodeId] = frozenset()

    def __post_init__(self) -> None:
        if self.voters & self.learners:
            raise InvalidArgument("a node is both voter and learner", both=sorted(self.voters))


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    index: LogIndex = ZERO_INDEX
    term: Term = ZERO_TERM
    conf_state: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The application's state at ``metadata.index``; ``data`` is opaque to the core."""

    metadata: SnapshotMetadata = field(default_factory=SnapshotMetadata)
    data: bytes = b""

    @property
    def index(self) -> LogIndex:
        return self.metadata.index

    @property
    def term(self) -> Term:
        return self.metadata.term

    @property
    def is_empty(self) -> bool:
        return self.metadata.index == 0


EMPTY_SNAPSHOT = Snapshot()


@dataclass(frozen=True, slots=True)
class Message:
    type: MessageType
    to: NodeId
    from_: NodeId
    term: Term = ZERO_TERM
    log_term: Term = ZERO_TERM
    index: LogIndex = ZERO_INDEX
    entries: tuple[Entry, ...] = ()
    commit: LogIndex = ZERO_INDEX
    snapshot: Snapshot | None = None
    reject: bool = False
    reject_hint: LogIndex = ZERO_INDEX
    context: bytes = b""
    quiesce: bool = False
    """On a HEARTBEAT: the leader is idle and the follower may stop ticking."""
    blank: int = 0
    """Non-zero: the sender is a blank voter and this its blank id (docs/raft.md, "A
    voter that lost its disk"); the message moves replication along, never a quorum."""


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message of the same Ready leaves (§5.1, Figure 2)."""

    term: Term = ZERO_TERM
    vote: NodeId | None = None
    commit: LogIndex = ZERO_INDEX


EMPTY_HARD_STATE = HardState()


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile, for the caller's information only: never persisted."""

    lead: NodeId | None
    role: Role


@dataclass(frozen=True, slots=True)
class ReadState:
    """Reads tagged ``context`` may be served once this node has applied ``index``."""

    index: LogIndex
    context: bytes


@dataclass(frozen=True, slots=True)
class Hibernation:
    """All a quiet node keeps while its Raft objects are gone (docs/raft.md, hibernation).

    Taken only when everything it knows is durable and applied: ``commit`` is also its
    last and applied index. ``lead`` is itself on a leader. The durable hard state wins
    over this on wake (``Raft.wake_from``).
    """

    term: Term
    vote: NodeId | None
    commit: LogIndex
    last_term: Term
    lead: NodeId
    voters: frozenset[NodeId]
    learners: frozenset[NodeId]


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the caller; see docs/raft.md for the order of duties."""

    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    committed_entries: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    must_sync: bool = False


class ConfChangeType(enum.Enum):
    ADD_NODE = 0
    REMOVE_NODE = 1
    ADD_LEARNER = 2
    READMIT = 3
    """A blank voter holds the log again: it counts from the moment it applies this.
    The context is its blank id (u64 big-endian), so a READMIT of an earlier life of the
    same node, still in the log, readmits nobody."""


_CC_MAGIC = b"CC1"
_CC_HEAD = struct.Struct(">3sBQ")


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A single-server membership change (§4.1 of the thesis; §6 of the paper)."""

    type: ConfChangeType
    node_id: NodeId
    context: bytes = b""

    def encode(self) -> bytes:
        """Layout: ``CC1`` (3 bytes), type (u8), node id (u64 big-endian), context."""
        return _CC_HEAD.pack(_CC_MAGIC, self.type.value, self.node_id) + self.context

    @classmethod
    def decode(cls, data: bytes) -> ConfChange:
        if len(data) < _CC_HEAD.size:
            raise InvalidArgument("conf change too short", length=len(data))
        magic, kind, node = _CC_HEAD.unpack_from(data)
        if magic != _CC_MAGIC:
            raise InvalidArgument("not a conf change", magic=magic.hex())
        try:
            cc_type = ConfChangeType(kind)
        except ValueError:
            raise InvalidArgument("unknown conf change type", type=kind) from None
        if node == 0:
            raise InvalidArgument("conf change names node 0")
        return cls(cc_type, NodeId(node), bytes(data[_CC_HEAD.size :]))

    def applied_to(self, cs: ConfState) -> ConfState:
        """The members after this change (``Raft.apply_conf_change`` on the tracker)."""
        n = self.node_id
        if self.type is ConfChangeType.ADD_NODE:
            return ConfState(cs.voters | {n}, cs.learners - {n})
        if self.type is ConfChangeType.ADD_LEARNER:
            return ConfState(cs.voters - {n}, cs.learners | {n})
        if self.type is ConfChangeType.REMOVE_NODE:
            return ConfState(cs.voters - {n}, cs.learners - {n})
        return cs  # READMIT changes nobody's membership
