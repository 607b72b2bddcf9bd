"""RawNode: the caller's handle on one Raft node (etcd's ``RawNode``).

The caller owns every side effect. It calls ``tick()`` on its clock,
``step(m)`` for each message received, and the proposal methods for client
requests; then, whenever ``has_ready()``, it takes ``ready()``, does the
duties of docs/raft.md in order (persist, send, apply) and calls
``advance(rd)``. One Ready is outstanding at a time; ``tick``, ``step`` and
proposals may be called while it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from enroute_core.base.errors import InvalidArgument, ProposalDropped
from enroute_core.base.ids import LogIndex, NodeId, Term

from .config import RaftConfig, RandomSource, SplitMix64
from .progress import ProgressState
from .raft import Raft
from .storage import Storage
from .types import (
    EMPTY_HARD_STATE,
    LOCAL_MESSAGES,
    RESPONSE_MESSAGES,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Hibernation,
    Message,
    MessageType,
    Ready,
    Role,
    SoftState,
)

_ZERO_TERM = Term(0)
_ZERO_INDEX = LogIndex(0)


@dataclass(frozen=True, slots=True)
class ProgressView:
    match: LogIndex
    next: LogIndex
    state: ProgressState
    recent_active: bool
    is_learner: bool


@dataclass(frozen=True, slots=True)
class Status:
    id: NodeId
    hard_state: HardState
    soft_state: SoftState
    applied: LogIndex
    lead_transferee: NodeId | None
    progress: dict[NodeId, ProgressView]
    """Filled on the leader only."""


class RawNode:
    __slots__ = ("_outstanding", "_prev_hard", "_prev_soft", "raft")

    def __init__(
        self, config: RaftConfig, storage: Storage, rand: RandomSource | None = None
    ) -> None:
        self.raft = Raft(config, storage, rand if rand is not None else SplitMix64(config.id))
        self._prev_soft = self.raft.soft_state()
        self._prev_hard = self.raft.hard_state()
        self._outstanding = False

    @property
    def id(self) -> NodeId:
        return self.raft.id

    # -- inputs -------------------------------------------------------------------------

    def tick(self) -> None:
        """Advance logical time by one tick (a no-op while quiesced)."""
        self.raft.tick()

    def campaign(self) -> None:
        """Start an election now (pre-vote first when configured)."""
        self.raft.unquiesce()
        self.raft.step(Message(MessageType.HUP, self.id, self.id))

    def propose(self, data: bytes) -> None:
        """Propose one normal entry; raises ProposalDropped when it cannot be taken."""
        self.propose_batch((data,))

    def propose_batch(self, datas: Sequence[bytes]) -> None:
        """Propose several entries as one message: they travel and append together."""
        if not datas:
            raise InvalidArgument("empty proposal")
        ents = tuple(Entry(_ZERO_TERM, _ZERO_INDEX, EntryType.NORMAL, d) for d in datas)
        self.raft.unquiesce()
        self.raft.step(Message(MessageType.PROP, self.id, self.id, entries=ents))

    def propose_conf_change(self, cc: ConfChange) -> None:
        ent = Entry(_ZERO_TERM, _ZERO_INDEX, EntryType.CONF_CHANGE, cc.encode())
        self.raft.unquiesce()
        self.raft.step(Message(MessageType.PROP, self.id, self.id, entries=(ent,)))

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point; a ReadState with ``context`` follows in a Ready.

        ``context`` must be unique among reads in flight. The read may be dropped
        without an answer (leader change, lost message): callers retry after a timeout.
        """
        if not context:
            raise InvalidArgument("read_index needs a non-empty context")
        self.raft.unquiesce()
        self.raft.step(Message(MessageType.READ_INDEX, self.id, self.id, context=context))

    def transfer_leader(self, to: NodeId) -> None:
        """Ask the leader (this node or, forwarded, another) to hand leadership to ``to``."""
        self.raft.unquiesce()
        self.raft.step(Message(MessageType.TRANSFER_LEADER, self.id, to))

    def step(self, m: Message) -> None:
        """Take a message from a peer."""
        if m.type in LOCAL_MESSAGES:
            raise InvalidArgument("local message type from the network", type=m.type.value)
        if m.to != self.id:
            raise InvalidArgument("message for another node", to=m.to, me=self.id)
        tr = self.raft.tracker
        if m.type in RESPONSE_MESSAGES and m.from_ not in tr.voters and m.from_ not in tr.learners:
            return  # an answer from a node that is not (or no longer) a member
        if self.raft.quiesced and self.raft.wakes(m):
            self.raft.unquiesce()
        # A forwarded proposal or read that is refused: its sender times out and retries.
        with contextlib.suppress(ProposalDropped):
            self.raft.step(m)

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed conf change entry; call it for every one, in log order."""
        return self.raft.apply_conf_change(cc)

    def force_remove(self, node: NodeId) -> bool:
        """Two-voter recovery: lead without ``node`` alone (``Raft.force_remove``)."""
        self.raft.unquiesce()
        return self.raft.force_remove(node)

    def report_unreachable(self, node: NodeId) -> None:
        self.raft.step(Message(MessageType.UNREACHABLE, self.id, node))

    def report_snapshot(self, node: NodeId, *, ok: bool) -> None:
        """After sending a SNAP message: whether the transport delivered it."""
        self.raft.step(Message(MessageType.SNAP_STATUS, self.id, node, reject=not ok))

    # -- quiescence --------------------------------------------------------------------------

    @property
    def quiesced(self) -> bool:
        return self.raft.quiesced

    def is_idle(self) -> bool:
        return self.raft.is_idle()

    def quiesce(self) -> bool:
        """On an idle leader: stop keeping time and tell followers to; False if not idle."""
        return self.raft.quiesce()

    def unquiesce(self) -> None:
        """Resume keeping time (the driver suspects the leader, or has work)."""
        self.raft.unquiesce()

    # -- hibernation -------------------------------------------------------------------------

    def hibernation(self) -> Hibernation | None:
        """What this node keeps if the caller frees it now; None while it holds volatile work."""
        if self._outstanding or not self.raft.can_hibernate():
            return None
        return self.raft.hibernation()

    def wake_from(self, h: Hibernation) -> bool:
        """Take back the quiet state ``h`` on a node just built from the durable storage.

        True: it is the quiet leader or follower it was, and reports no change. False: a
        follower that keeps time (the caller ticks it); its first Ready reports the role
        change from the one ``h`` held. See ``Raft.wake_from``.
        """
        quiet = self.raft.wake_from(h)
        role = Role.LEADER if h.lead == self.raft.id else Role.FOLLOWER
        self._prev_soft = SoftState(h.lead, role)
        if quiet:
            self._prev_hard = self.raft.hard_state()
        return quiet

    # -- output ------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        """Whether ``ready()`` has anything; cheap enough to call after every input."""
        if self._outstanding:
            return False
        r = self.raft
        log = r.log
        if r.msgs or r.read_states or log.unstable.entries or log.unstable.snapshot is not None:
            return True
        if log.committed > log.applied and log.has_next_committed_entries():
            return True
        soft, hard = self._prev_soft, self._prev_hard
        if r.lead != soft.lead or r.role is not soft.role:
            return True
        return r.term != hard.term or r.vote != hard.vote or log.committed != hard.commit

    def ready(self) -> Ready:
        assert not self._outstanding, "ready() again before advance()"
        r = self.raft
        soft = r.soft_state()
        hs = r.hard_state()
        soft_out = soft if soft != self._prev_soft else None
        hs_out = hs if hs not in (self._prev_hard, EMPTY_HARD_STATE) else None
        entries = r.log.unstable_entries()
        snapshot = r.log.unstable.snapshot
        # A commit index alone may be lost in a crash: it is learned again.
        must_sync = (
            bool(entries)
            or snapshot is not None
            or (
                hs_out is not None
                and (hs.term != self._prev_hard.term or hs.vote != self._prev_hard.vote)
            )
        )
        rd = Ready(
            soft_state=soft_out,
            hard_state=hs_out,
            entries=entries,
            snapshot=snapshot,
            committed_entries=tuple(r.log.next_committed_entries()),
            messages=tuple(r.msgs),
            read_states=tuple(r.read_states),
            must_sync=must_sync,
        )
        r.msgs = []
        r.read_states = []
        self._prev_soft = soft
        if hs_out is not None:
            self._prev_hard = hs
        self._outstanding = True
        return rd

    def advance(self, rd: Ready) -> None:
        """The caller has persisted, sent and applied ``rd``."""
        assert self._outstanding, "advance() without ready()"
        log = self.raft.log
        if rd.snapshot is not None:
            log.stable_snap_to(rd.snapshot.index)
            log.applied_to(rd.snapshot.index)
        if rd.entries:
            last = rd.entries[-1]
            log.stable_to(last.index, last.term)
        if rd.committed_entries:
            log.applied_to(rd.committed_entries[-1].index)
            self.raft.reduce_uncommitted_bytes(rd.committed_entries)
        self._outstanding = False

    def status(self) -> Status:
        r = self.raft
        progress: dict[NodeId, ProgressView] = {}
        if r.role.value == "leader":
            progress = {
                n: ProgressView(p.match, p.next, p.state, p.recent_active, p.is_learner)
                for n, p in r.tracker.progress.items()
            }
        return Status(
            r.id, r.hard_state(), r.soft_state(), r.log.applied, r.lead_transferee, progress
        )
