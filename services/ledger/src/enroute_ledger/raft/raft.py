"""The Raft state machine: one node's view, moved only by ``tick()`` and ``step()``.

Control flow follows etcd's raft: ``step`` applies the term rules every
message obeys (§5.1), answers votes (§5.2, §5.4.1) and hands everything else
to the role's handler: ``_step_leader``, ``_step_candidate`` (also the
pre-candidate of §9.6) or ``_step_follower``. Outputs accumulate in ``msgs``
and ``read_states``; ``RawNode`` packs them into a Ready.

Beyond the paper this implements the thesis extensions etcd has: PreVote
(§9.6), CheckQuorum with the leader lease on votes (§6.2, §4.2.3), ReadIndex
(§6.4), leadership transfer (§3.10), single-server membership changes
applied when committed (§4.1, with etcd's pending-conf-index rule),
snapshots (§5), fast log backtracking (§5.3), pipelined replication with a
bounded inflight window, and quiescence for idle groups.
"""

from __future__ import annotations

import dataclasses
import enum

from enroute_core.base.errors import CorruptData, InvalidArgument, ProposalDropped
from enroute_core.base.ids import LogIndex, NodeId, Term

from .config import RaftConfig, RandomSource
from .errors import (
    Compacted,
    DropReason,
    SnapshotTemporarilyUnavailable,
    dropped,
)
from .log import RaftLog
from .progress import (
    Progress,
    ProgressState,
    ProgressTracker,
    VoteResult,
    quorum_size,
)
from .readonly import ReadOnly
from .storage import Storage
from .types import (
    EMPTY_HARD_STATE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Hibernation,
    Message,
    MessageType,
    ReadState,
    Role,
    Snapshot,
    SoftState,
    entries_size_bytes,
    payload_size_bytes,
)

MT = MessageType
TRANSFER_CONTEXT = b"enroute.raft.transfer"
"""Context of a vote request that a leadership transfer forces through leases (§3.10)."""

_NO_ENTRIES: tuple[Entry, ...] = ()
_NO_PROGRESS: dict[NodeId, Progress] = {}  # a non-leader's: shared, never written
_ZERO_INDEX = LogIndex(0)
_ZERO_TERM = Term(0)


class CampaignType(enum.Enum):
    PRE_ELECTION = "pre_election"
    ELECTION = "election"
    TRANSFER = "transfer"


class Raft:
    # slots: a node hosts one Raft per repository, mostly idle (a __dict__ is ~1 KiB)
    __slots__ = (
        "_rand",
        "blank",
        "config",
        "election_elapsed",
        "heartbeat_elapsed",
        "id",
        "lead",
        "lead_transferee",
        "log",
        "msgs",
        "pending_conf_index",
        "pending_read_msgs",
        "quiesced",
        "randomized_election_timeout",
        "read_only",
        "read_states",
        "role",
        "term",
        "tracker",
        "uncommitted_bytes",
        "vote",
    )

    def __init__(self, config: RaftConfig, storage: Storage, rand: RandomSource) -> None:
        self.id = config.id
        self.config = config
        self._rand = rand
        self.log = RaftLog(storage, config.applying_bytes_max)
        hs, cs = storage.initial_state()
        self.tracker = ProgressTracker(config.inflight_msgs_max, config.inflight_bytes_max)
        self._apply_conf_state(cs)

        self.term = _ZERO_TERM
        self.vote: NodeId | None = None
        self.lead: NodeId | None = None
        self.role = Role.FOLLOWER
        self.msgs: list[Message] = []
        self.read_states: list[ReadState] = []
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = config.election_ticks
        self.lead_transferee: NodeId | None = None
        self.pending_conf_index = _ZERO_INDEX
        self.uncommitted_bytes = 0
        self.read_only = ReadOnly()
        self.pending_read_msgs: list[Message] = []
        self.quiesced = False
        # non-zero until a READMIT naming it applies: no vote, no campaign (lost disks)
        self.blank = config.blank

        if hs != EMPTY_HARD_STATE:
            self._load_state(hs)
        if config.applied > 0:
            if config.applied > self.log.committed:
                raise InvalidArgument(
                    "applied index past the commit index",
                    applied=config.applied,
                    committed=self.log.committed,
                )
            self.log.applied_to(config.applied)
        self.become_follower(self.term, None)

    # -- views ------------------------------------------------------------------

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def soft_state(self) -> SoftState:
        return SoftState(self.lead, self.role)

    def conf_state(self) -> ConfState:
        return ConfState(self.tracker.voters, self.tracker.learners)

    def promotable(self) -> bool:
        """May this node campaign: a voter, not in the middle of installing a snapshot."""
        return (
            self.id in self.tracker.voters
            and not self.blank
            and not self.log.has_pending_snapshot()
        )

    def _load_state(self, hs: HardState) -> None:
        if hs.commit > self.log.last_index():
            raise CorruptData(
                "hard state commit past the stored log",
                section="raft hard state",
                commit=hs.commit,
                last_index=self.log.last_index(),
            )
        # A commit-only hard state need not be synced (Ready.must_sync), so after a crash
        # it may lag the snapshot; the snapshot's index is committed all the same.
        self.log.committed = LogIndex(max(hs.commit, self.log.committed))
        self.term = hs.term
        self.vote = hs.vote

    # -- role changes -------------------------------------------------------------

    def _reset(self, term: Term) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.lead = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = self.config.election_ticks + self._rand.randrange(
            self.config.election_ticks
        )
        self.lead_transferee = None
        self.tracker.reset_votes()
        # only a leader tracks its followers: the others hold no Progress at all (an
        # idle node hosts thousands of groups and leads a third of them)
        self.tracker.progress = _NO_PROGRESS
        self.pending_conf_index = _ZERO_INDEX
        self.uncommitted_bytes = 0
        self.read_only = ReadOnly()
        self.pending_read_msgs = []
        self.quiesced = False

    def become_follower(self, term: Term, lead: NodeId | None) -> None:
        self._reset(term)
        self.lead = lead
        self.role = Role.FOLLOWER

    def become_pre_candidate(self) -> None:
        """§9.6: a pre-candidate asks for votes without raising its term or dropping its vote."""
        assert self.role is not Role.LEADER, "leader cannot become pre-candidate"
        self.tracker.reset_votes()
        self.lead = None
        self.role = Role.PRE_CANDIDATE
        self.quiesced = False

    def become_candidate(self) -> None:
        assert self.role is not Role.LEADER, "leader cannot become candidate"
        self._reset(Term(self.term + 1))
        self.vote = self.id
        self.role = Role.CANDIDATE

    def become_leader(self) -> None:
        assert self.role is not Role.FOLLOWER, "follower cannot become leader directly"
        self._reset(self.term)
        self.lead = self.id
        self.role = Role.LEADER
        tr = self.tracker
        last = self.log.last_index()
        tr.progress = {
            n: tr.new_progress(LogIndex(last + 1), is_learner=n in tr.learners)
            for n in sorted(tr.voters | tr.learners)
        }
        me = tr.progress[self.id]
        me.match = last
        me.become_replicate()
        me.recent_active = True
        # Any conf change in the log may still be unapplied: wait for it (etcd's rule).
        self.pending_conf_index = self.log.last_index()
        # §8: an empty entry of the new term commits everything before it (§5.4.2).
        ok = self._append_entries((Entry(self.term, _ZERO_INDEX),))
        assert ok, "the empty entry of a new leader is never refused"

    # -- time ------------------------------------------------------------------------

    def tick(self) -> None:
        if self.quiesced:
            return  # a quiet group keeps no time; see docs/raft.md, quiescence
        if self.role is Role.LEADER:
            self._tick_heartbeat()
        else:
            self._tick_election()

    def times_out_next_tick(self) -> bool:
        """Whether the next tick ends this follower's or candidate's election timeout (it
        campaigns, or pokes the voters as a blank one): what a multi-Raft node budgets."""
        return (
            not self.quiesced
            and self.role is not Role.LEADER
            and self.election_elapsed + 1 >= self.randomized_election_timeout
        )

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if self.blank:
            if self.election_elapsed >= self.randomized_election_timeout:
                self.election_elapsed = 0
                self._poke_voters()
            return
        if self.promotable() and self.election_elapsed >= self.randomized_election_timeout:
            self.election_elapsed = 0
            self.step(Message(MT.HUP, self.id, self.id))

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.config.election_ticks:
            self.election_elapsed = 0
            if self.config.check_quorum:
                self.step(Message(MT.CHECK_QUORUM, self.id, self.id))
            if self.role is Role.LEADER and self.lead_transferee is not None:
                self.lead_transferee = None  # §3.10: abort after an election timeout
        if self.role is not Role.LEADER:
            return
        if self.heartbeat_elapsed >= self.config.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self.step(Message(MT.BEAT, self.id, self.id))

    # -- the one entry point -------------------------------------------------------------

    def step(self, m: Message) -> None:
        """Apply one message; raises ProposalDropped for a refused local proposal or read."""
        if m.term == 0:
            pass  # local message, or a proposal or read forwarded without a term
        elif m.term > self.term:
            if m.type is MT.VOTE or m.type is MT.PRE_VOTE:
                forced = m.context == TRANSFER_CONTEXT
                in_lease = (
                    self.config.check_quorum
                    and self.lead is not None
                    and self.election_elapsed < self.config.election_ticks
                )
                if in_lease and not forced:
                    # Thesis §4.2.3: within the minimum election timeout of hearing from a
                    # leader, neither update the term nor grant the vote.
                    return
            if m.type is MT.PRE_VOTE or (m.type is MT.PRE_VOTE_RESP and not m.reject):
                pass  # §9.6: pre-votes never change terms
            elif m.type is MT.APP or m.type is MT.HEARTBEAT or m.type is MT.SNAP:
                self.become_follower(m.term, m.from_)
            elif m.type is MT.VOTE:
                # Figure 2: only a granted vote restarts the election timer. A candidate we
                # refuse (its log is behind) must not keep us from ever campaigning.
                elapsed = self.election_elapsed
                self.become_follower(m.term, None)
                self.election_elapsed = elapsed
            else:
                self.become_follower(m.term, None)
        elif m.term < self.term:
            self._step_stale(m)
            return

        if m.from_ != self.id:
            self._note_blank(m)
        t = m.type
        if t is MT.HUP:
            kind = CampaignType.PRE_ELECTION if self.config.pre_vote else CampaignType.ELECTION
            self._hup(kind)
        elif t is MT.VOTE or t is MT.PRE_VOTE:
            self._handle_vote_request(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _note_blank(self, m: Message) -> None:
        """Track whether a peer is blank (docs/raft.md, "A voter that lost its disk").

        A peer that turns blank lost the log its progress describes: forget its match
        and find where the logs meet again, as for a new follower.
        """
        pr = self.tracker.progress.get(m.from_)
        if pr is None or pr.blank == m.blank:
            return
        pr.blank = m.blank
        if not m.blank:
            return
        pr.match = _ZERO_INDEX
        pr.readmit_index = _ZERO_INDEX
        pr.become_probe()
        pr.next = LogIndex(self.log.last_index() + 1)
        if self.role is Role.LEADER:
            self._maybe_send_append(m.from_, pr, send_if_empty=True)

    def _poke_voters(self) -> None:
        """A blank node that hears no leader never campaigns: it tells every voter it is
        blank instead, so a quiet leader wakes and catches it up. Term 0 (like a forwarded
        proposal) lets the note pass every term check and moves no one's term."""
        for v in sorted(self.tracker.voters):
            if v != self.id:
                self.msgs.append(
                    Message(MT.HEARTBEAT_RESP, v, self.id, _ZERO_TERM, blank=self.blank)
                )

    def _maybe_readmit(self, node: NodeId, pr: Progress) -> None:
        """Append a READMIT for a blank voter that holds the committed log.

        Its acknowledgements count again once it applied the READMIT: by then every
        entry committed before it is in its log, and its term is at least the term of
        the leader that committed the READMIT without it (docs/raft.md).
        """
        if (
            not pr.blank
            or pr.readmit_index
            or node not in self.tracker.voters
            or pr.match < self.log.committed
            or self.pending_conf_index > self.log.applied
            or self.lead_transferee is not None
        ):
            return
        cc = ConfChange(ConfChangeType.READMIT, node, pr.blank.to_bytes(8, "big"))
        ent = Entry(self.term, _ZERO_INDEX, EntryType.CONF_CHANGE, cc.encode())
        if not self._append_entries((ent,)):
            return
        self.pending_conf_index = self.log.last_index()
        pr.readmit_index = self.log.last_index()
        self._bcast_append()

    def _step_stale(self, m: Message) -> None:
        if (self.config.check_quorum or self.config.pre_vote) and (
            m.type is MT.HEARTBEAT or m.type is MT.APP
        ):
            # A leader cut off and then healed would otherwise never learn the new term:
            # with leases or pre-votes nobody else raises it for it.
            self._send(MT.APP_RESP, m.from_)
        elif m.type is MT.PRE_VOTE:
            self._send(MT.PRE_VOTE_RESP, m.from_, reject=True)

    def _handle_vote_request(self, m: Message) -> None:
        """§5.2 one vote per term, first come first served; §5.4.1 the election restriction."""
        can_vote = (
            self.vote == m.from_
            or (self.vote is None and self.lead is None)
            or (m.type is MT.PRE_VOTE and m.term > self.term)
        )
        resp = MT.VOTE_RESP if m.type is MT.VOTE else MT.PRE_VOTE_RESP
        # a blank node may have voted in this term before it lost its disk
        if can_vote and not self.blank and self.log.is_up_to_date(m.index, m.log_term):
            # Answer in the term of the request: a pre-vote grant must reach the pre-candidate.
            self._send(resp, m.from_, term=m.term)
            if m.type is MT.VOTE:
                self.election_elapsed = 0
                self.vote = m.from_
        else:
            self._send(resp, m.from_, reject=True)

    # -- elections -------------------------------------------------------------------------

    def _hup(self, kind: CampaignType) -> None:
        if self.role is Role.LEADER:
            return
        if not self.promotable():
            return
        if self._has_unapplied_conf_change():
            # Our configuration may be stale until those apply (etcd's rule).
            return
        self._campaign(kind)

    def _has_unapplied_conf_change(self) -> bool:
        lo = LogIndex(max(self.log.applied + 1, self.log.first_index()))
        if lo > self.log.committed:
            return False
        ents = self.log.slice(lo, LogIndex(self.log.committed + 1), 1 << 62)
        return any(e.type is EntryType.CONF_CHANGE for e in ents)

    def _campaign(self, kind: CampaignType) -> None:
        if kind is CampaignType.PRE_ELECTION:
            self.become_pre_candidate()
            vote_type = MT.PRE_VOTE
            term = Term(self.term + 1)
        else:
            self.become_candidate()
            vote_type = MT.VOTE
            term = self.term
        if self._poll(self.id, True) is VoteResult.WON:
            # A single-voter configuration wins on its own vote.
            if kind is CampaignType.PRE_ELECTION:
                self._campaign(CampaignType.ELECTION)
            else:
                self.become_leader()
            return
        ctx = TRANSFER_CONTEXT if kind is CampaignType.TRANSFER else b""
        last, last_term = self.log.last_index(), self.log.last_term()
        for v in sorted(self.tracker.voters):
            if v != self.id:
                self._send(vote_type, v, term=term, index=last, log_term=last_term, context=ctx)

    def _poll(self, node: NodeId, granted: bool) -> VoteResult:
        self.tracker.record_vote(node, granted)
        return self.tracker.tally()[2]

    # -- leader -------------------------------------------------------------------------------

    def _step_leader(self, m: Message) -> None:
        t = m.type
        if t is MT.BEAT:
            self._bcast_heartbeat()
            return
        if t is MT.CHECK_QUORUM:
            if not self.tracker.quorum_active(self.id):
                self.become_follower(self.term, None)
                return
            for node, each in self.tracker.progress.items():
                each.recent_active = node == self.id
            return
        if t is MT.PROP:
            self._propose(m)
            return
        if t is MT.READ_INDEX:
            self._leader_read_index(m)
            return

        pr = self.tracker.progress.get(m.from_)
        if pr is None:
            return
        if t is MT.APP_RESP:
            self._handle_append_response(m, pr)
        elif t is MT.HEARTBEAT_RESP:
            self._handle_heartbeat_response(m, pr)
        elif t is MT.SNAP_STATUS:
            if pr.state is not ProgressState.SNAPSHOT:
                return
            if m.reject:
                pr.pending_snapshot = _ZERO_INDEX  # resume from match, not from the snapshot
            pr.become_probe()
            pr.probe_sent = True  # wait for a heartbeat reply before probing again
        elif t is MT.UNREACHABLE:
            if pr.state is ProgressState.REPLICATE:
                pr.become_probe()
        elif t is MT.TRANSFER_LEADER:
            self._handle_transfer_leader(m, pr)

    def _propose(self, m: Message) -> None:
        assert m.entries, "empty proposal"
        if self.id not in self.tracker.progress:
            raise dropped(DropReason.NOT_A_MEMBER)
        if self.lead_transferee is not None:
            raise dropped(DropReason.TRANSFERRING, transferee=self.lead_transferee)
        conf_at = [i for i, e in enumerate(m.entries) if e.type is EntryType.CONF_CHANGE]
        if conf_at:
            if len(conf_at) > 1 or self.pending_conf_index > self.log.applied:
                # §4.1: one change at a time; the previous one must have applied.
                raise dropped(DropReason.CONF_CHANGE_PENDING, pending=self.pending_conf_index)
            if self.log.term_or_zero(self.log.committed) != self.term:
                # Ongaro's fix of single-server changes (raft-dev, 2015): a new leader
                # first commits an entry of its own term, so no change of an earlier
                # term that it does not hold can still commit beside its own.
                raise dropped(DropReason.CONF_CHANGE_PENDING, pending=self.log.committed)
            self._check_conf_change(m.entries[conf_at[0]].data)
        if not self._append_entries(m.entries):
            raise dropped(DropReason.UNCOMMITTED_BYTES, uncommitted_bytes=self.uncommitted_bytes)
        if conf_at:
            first = self.log.last_index() - len(m.entries) + 1
            self.pending_conf_index = LogIndex(first + conf_at[0])
        self._bcast_append()

    def _check_conf_change(self, data: bytes) -> None:
        try:
            cc = ConfChange.decode(data)
        except InvalidArgument as e:
            raise dropped(DropReason.INVALID_CONF_CHANGE, error=e.message) from None
        voters = set(self.tracker.voters)
        if cc.type is ConfChangeType.READMIT:
            if cc.node_id not in voters or len(cc.context) != 8:
                raise dropped(DropReason.INVALID_CONF_CHANGE, error="readmit of a non-voter")
            return
        if cc.type is ConfChangeType.ADD_NODE:
            voters.add(cc.node_id)
        else:
            voters.discard(cc.node_id)
        if not voters:
            raise dropped(DropReason.INVALID_CONF_CHANGE, error="would leave no voter")

    def _append_entries(self, entries: tuple[Entry, ...]) -> bool:
        size = payload_size_bytes(entries)
        if (
            self.uncommitted_bytes > 0
            and size > 0
            and self.uncommitted_bytes + size > self.config.uncommitted_bytes_max
        ):
            return False
        self.uncommitted_bytes += size
        li = self.log.last_index()
        term = self.term
        ents = [Entry(term, LogIndex(li + 1 + i), e.type, e.data) for i, e in enumerate(entries)]
        li = self.log.append(ents)
        self.tracker.progress[self.id].maybe_update(li)
        self._maybe_commit()
        return True

    def reduce_uncommitted_bytes(self, committed: tuple[Entry, ...]) -> None:
        if self.uncommitted_bytes:
            self.uncommitted_bytes = max(0, self.uncommitted_bytes - payload_size_bytes(committed))

    def _maybe_commit(self) -> bool:
        if self.log.maybe_commit(self.tracker.committed(), self.term):
            self._release_pending_reads()
            return True
        return False

    def _committed_entry_in_current_term(self) -> bool:
        return self.log.term_or_zero(self.log.committed) == self.term

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        if m.reject:
            # §5.3 with the optimisation the paper sketches: skip a whole term per round trip.
            next_probe = m.reject_hint
            if m.log_term > 0:
                next_probe, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decr_to(m.index, next_probe):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._maybe_send_append(m.from_, pr, send_if_empty=True)
            return

        was_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= self.log.first_index():
            pr.become_probe()
            pr.become_replicate()
        elif pr.state is ProgressState.REPLICATE:
            pr.free_le(m.index)

        if pr.blank:
            self._maybe_readmit(m.from_, pr)
        if self._maybe_commit():
            if self.config.quiet_commit:
                # followers learn the index from the next append, beat or quiesce
                # heartbeat (the group quiesces once the last of them acknowledged)
                self._send_appends_with_entries()
            else:
                self._bcast_append()
        elif was_paused:
            self._maybe_send_append(m.from_, pr, send_if_empty=True)
        # The window may have room for several messages now (pipelining).
        while self._maybe_send_append(m.from_, pr, send_if_empty=False):
            pass
        if m.from_ == self.lead_transferee and pr.match == self.log.last_index():
            self._send(MT.TIMEOUT_NOW, m.from_)

    def _handle_heartbeat_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        pr.probe_sent = False
        if pr.state is ProgressState.REPLICATE and pr.inflights.full():
            # An append may have been lost; free one slot so replication can find out.
            pr.inflights.free_first_one()
        if pr.match < self.log.last_index() or pr.state is ProgressState.PROBE:
            self._maybe_send_append(m.from_, pr, send_if_empty=True)
        if pr.blank:
            self._maybe_readmit(m.from_, pr)  # an idle group readmits on heartbeats
            return
        if not m.context:
            return
        acks = self.read_only.recv_ack(m.from_, m.context)
        if acks is None:
            return
        voters = self.tracker.voters
        if sum(1 for a in acks if a in voters) < quorum_size(len(voters)):
            return
        for req in self.read_only.advance(m.context):
            self._respond_read(req.request, req.index)

    def _handle_transfer_leader(self, m: Message, pr: Progress) -> None:
        """§3.10: bring the target up to date, then tell it to start an election at once."""
        if pr.is_learner or pr.blank:
            return
        target = m.from_
        if self.lead_transferee is not None:
            if self.lead_transferee == target:
                return
            self.lead_transferee = None
        if target == self.id:
            return
        self.election_elapsed = 0  # the transfer must finish within one election timeout
        self.lead_transferee = target
        if pr.match == self.log.last_index():
            self._send(MT.TIMEOUT_NOW, target)
        else:
            self._maybe_send_append(target, pr, send_if_empty=True)

    # -- reads ---------------------------------------------------------------------------------

    def _leader_read_index(self, m: Message) -> None:
        """Thesis §6.4: record the commit index, confirm leadership, then release the read."""
        if self.tracker.is_singleton():
            self._respond_read(m, self.log.committed)
            return
        waiting = len(self.read_only) + len(self.pending_read_msgs)
        if waiting >= self.config.pending_reads_max:
            raise dropped(DropReason.PENDING_READS, waiting=waiting)
        if not self._committed_entry_in_current_term():
            # §6.4 step 1: until the leader commits in its term its commit index may be stale.
            self.pending_read_msgs.append(m)
            return
        self._start_read(m)

    def _start_read(self, m: Message) -> None:
        self.read_only.add_request(self.log.committed, m)
        self.read_only.recv_ack(self.id, m.context)
        self._bcast_heartbeat(m.context)

    def _release_pending_reads(self) -> None:
        if not self.pending_read_msgs or not self._committed_entry_in_current_term():
            return
        msgs, self.pending_read_msgs = self.pending_read_msgs, []
        for m in msgs:
            self._start_read(m)

    def _respond_read(self, req: Message, index: LogIndex) -> None:
        if req.from_ == self.id:
            self.read_states.append(ReadState(index, req.context))
        else:
            self._send(MT.READ_INDEX_RESP, req.from_, index=index, context=req.context)

    # -- replication -------------------------------------------------------------------------------

    def _bcast_append(self) -> None:
        for node, pr in self.tracker.progress.items():
            if node != self.id:
                self._maybe_send_append(node, pr, send_if_empty=True)

    def _send_appends_with_entries(self) -> None:
        for node, pr in self.tracker.progress.items():
            if node != self.id:
                self._maybe_send_append(node, pr, send_if_empty=False)

    def _maybe_send_append(self, to: NodeId, pr: Progress, *, send_if_empty: bool) -> bool:
        if pr.is_paused():
            return False
        prev = LogIndex(pr.next - 1)
        try:
            prev_term = self.log.term(prev)
            ents = self.log.entries_from(pr.next, self.config.msg_bytes_max)
        except Compacted:
            return self._send_snapshot(to, pr)
        if not ents and not send_if_empty:
            return False
        self._send(
            MT.APP,
            to,
            index=prev,
            log_term=prev_term,
            entries=tuple(ents),
            commit=self.log.committed,
        )
        pr.appended = True
        if ents:
            pr.sent_entries(ents[-1].index, len(ents), entries_size_bytes(ents))
        return True

    def _send_snapshot(self, to: NodeId, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # do not ship a snapshot to a node that may be down
        try:
            snap = self.log.snapshot()
        except SnapshotTemporarilyUnavailable:
            return False
        assert not snap.is_empty, "log compacted without a snapshot"
        pr.become_snapshot(snap.index)
        pr.readmit_index = _ZERO_INDEX  # the snapshot may cover a READMIT it never applies
        self._send(MT.SNAP, to, snapshot=snap)
        return True

    def _bcast_heartbeat(self, context: bytes | None = None) -> None:
        ctx = self.read_only.last_context() if context is None else context
        # a beat tells a follower nothing an append since the previous beat did not: it
        # resets the same election timer, and a lost append is found by the next beat
        skip = context is None and not ctx and self.config.quiet_commit
        for node, pr in self.tracker.progress.items():
            if node != self.id:
                if skip and pr.appended:
                    pr.appended = False
                    continue
                pr.appended = False
                # Never tell a follower to commit past what it is known to hold.
                commit = LogIndex(min(pr.match, self.log.committed))
                self._send(MT.HEARTBEAT, node, commit=commit, context=ctx)

    # -- candidate and follower ---------------------------------------------------------------

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        my_resp = MT.PRE_VOTE_RESP if self.role is Role.PRE_CANDIDATE else MT.VOTE_RESP
        if t is MT.PROP or t is MT.READ_INDEX:
            raise dropped(DropReason.NO_LEADER)
        if t is MT.APP:
            self.become_follower(m.term, m.from_)  # §5.2: a leader of our term exists
            self._handle_append(m)
        elif t is MT.HEARTBEAT:
            self.become_follower(m.term, m.from_)
            self._handle_heartbeat(m)
        elif t is MT.SNAP:
            self.become_follower(m.term, m.from_)
            self._handle_snapshot(m)
        elif t is my_resp:
            result = self._poll(m.from_, not m.reject and not m.blank)
            if result is VoteResult.WON:
                if self.role is Role.PRE_CANDIDATE:
                    self._campaign(CampaignType.ELECTION)
                else:
                    self.become_leader()
                    self._bcast_append()
            elif result is VoteResult.LOST:
                self.become_follower(self.term, None)

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t is MT.PROP or t is MT.READ_INDEX:
            if self.lead is None:
                raise dropped(DropReason.NO_LEADER)
            self.msgs.append(dataclasses.replace(m, to=self.lead))
        elif t is MT.APP:
            self.election_elapsed = 0
            self.lead = m.from_
            self._handle_append(m)
        elif t is MT.HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.from_
            self._handle_heartbeat(m)
        elif t is MT.SNAP:
            self.election_elapsed = 0
            self.lead = m.from_
            self._handle_snapshot(m)
        elif t is MT.TRANSFER_LEADER:
            if self.lead is not None:
                self.msgs.append(dataclasses.replace(m, to=self.lead))
        elif t is MT.TIMEOUT_NOW:
            self._hup(CampaignType.TRANSFER)
        elif t is MT.READ_INDEX_RESP:
            self.read_states.append(ReadState(m.index, m.context))

    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self._send(MT.APP_RESP, m.from_, index=self.log.committed)
            return
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._send(MT.APP_RESP, m.from_, index=last_new)
            return
        hint = LogIndex(min(m.index, self.log.last_index()))
        hint, hint_term = self.log.find_conflict_by_term(hint, m.log_term)
        self._send(
            MT.APP_RESP, m.from_, index=m.index, reject=True, reject_hint=hint, log_term=hint_term
        )

    def _handle_heartbeat(self, m: Message) -> None:
        if self.blank:
            # the leader's idea of our log predates the loss until it hears we are blank
            self.log.commit_to(LogIndex(min(m.commit, self.log.last_index())))
        else:
            self.log.commit_to(m.commit)
        if m.quiesce and self.log.committed == self.log.last_index() == m.commit:
            # Nothing to answer: the leader knows we hold everything, and an answer
            # would only wake it up again.
            self.quiesced = True
            return
        self._send(MT.HEARTBEAT_RESP, m.from_, context=m.context)

    def _handle_snapshot(self, m: Message) -> None:
        assert m.snapshot is not None, "snapshot message without a snapshot"
        if self._restore(m.snapshot):
            self._send(MT.APP_RESP, m.from_, index=self.log.last_index())
        else:
            self._send(MT.APP_RESP, m.from_, index=self.log.committed)

    def _restore(self, snap: Snapshot) -> bool:
        """Install a leader's snapshot unless our log already holds what it covers (§7)."""
        if snap.index <= self.log.committed:
            return False
        assert self.role is Role.FOLLOWER, "only a follower restores a snapshot"
        if self.log.match_term(snap.index, snap.term):
            # §7: "If the follower receives a snapshot that describes a prefix of its log,
            # log entries covered by the snapshot are deleted but entries following it are
            # retained": we just move commit forward and keep the log.
            self.log.commit_to(snap.index)
            return False
        self.log.restore(snap)
        self._apply_conf_state(snap.metadata.conf_state)
        return True

    # -- membership --------------------------------------------------------------------------------

    def _apply_conf_state(self, cs: ConfState) -> None:
        tr = self.tracker
        tr.voters = cs.voters  # frozensets, shared with the ConfState (and across groups)
        tr.learners = cs.learners
        # a follower's configuration changes only here (init, snapshot): no Progress
        tr.progress = _NO_PROGRESS

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Apply a committed single-server change (§4.1; applied when committed, as etcd does)."""
        tr = self.tracker
        node = cc.node_id
        if cc.type is ConfChangeType.READMIT:
            if node == self.id and self.blank and cc.context == self.blank.to_bytes(8, "big"):
                self.blank = 0
            return self.conf_state()
        if cc.type is ConfChangeType.ADD_NODE:
            tr.learners = tr.learners - {node}
            tr.voters = tr.voters | {node}
            if self.role is Role.LEADER:
                self._ensure_progress(node, is_learner=False)
        elif cc.type is ConfChangeType.ADD_LEARNER:
            tr.voters = tr.voters - {node}
            tr.learners = tr.learners | {node}
            if self.role is Role.LEADER:
                self._ensure_progress(node, is_learner=True)
        else:
            tr.voters = tr.voters - {node}
            tr.learners = tr.learners - {node}
            if self.role is Role.LEADER:
                tr.progress.pop(node, None)
        cs = self.conf_state()
        if self.role is not Role.LEADER:
            return cs
        if self.id not in tr.voters:
            self.become_follower(self.term, None)  # removed or demoted: step down
            return cs
        if self.lead_transferee is not None and self.lead_transferee not in tr.voters:
            self.lead_transferee = None
        if self._maybe_commit():
            self._bcast_append()  # the quorum may have shrunk
        else:
            for n, pr in tr.progress.items():
                if n != self.id:
                    self._maybe_send_append(n, pr, send_if_empty=False)
        return cs

    def force_remove(self, node: NodeId) -> bool:
        """Two-voter recovery (docs/raft.md, "Recovering a two-voter ledger"): lead the
        configuration without ``node`` alone and append the REMOVE that makes it the log's.

        Only for the configuration ``{self, node}``. With two voters every committed
        entry is on both, so this node holds all of them; its new term is above every
        term in which either node led, so from the appended REMOVE on its log is more
        up to date than any log ``node`` holds (§5.4.1) and ``node`` never wins this
        node's vote again: no quorum of ``{self, node}`` forms after this. The REMOVE
        commits on this node's vote alone and, applied, makes the forced configuration
        the log's own; a restart before that undoes the force (the members come from the
        log), so the caller forces again, and a second REMOVE applies as a no-op.
        False, doing nothing, when this node may not: another configuration, blank (it
        lost committed entries), a snapshot or a committed conf change still to apply.
        """
        tr = self.tracker
        if node == self.id or tr.voters != frozenset((self.id, node)) or tr.learners:
            return False
        if not self.promotable() or self._has_unapplied_conf_change():
            return False
        if self.role is Role.LEADER:
            self.become_follower(self.term, None)
        tr.voters = frozenset((self.id,))
        self._campaign(CampaignType.ELECTION)
        assert self.role is Role.LEADER, "a single voter wins on its own vote"
        cc = ConfChange(ConfChangeType.REMOVE_NODE, node)
        ok = self._append_entries(
            (Entry(self.term, _ZERO_INDEX, EntryType.CONF_CHANGE, cc.encode()),)
        )
        assert ok, "a new leader's first entries are never refused"
        self.pending_conf_index = self.log.last_index()
        return True

    def _ensure_progress(self, node: NodeId, *, is_learner: bool) -> None:
        pr = self.tracker.progress.get(node)
        if pr is not None:
            pr.is_learner = is_learner
            return
        pr = self.tracker.new_progress(LogIndex(self.log.last_index() + 1), is_learner=is_learner)
        pr.recent_active = True  # give it an election timeout before CheckQuorum counts it
        self.tracker.progress[node] = pr

    # -- quiescence ---------------------------------------------------------------------------

    def is_idle(self) -> bool:
        """A leader with nothing to do: every member holds and knows the whole log."""
        if self.role is not Role.LEADER or self.lead_transferee is not None:
            return False
        if self.msgs or self.pending_read_msgs or len(self.read_only):
            return False
        last = self.log.last_index()
        if self.log.committed != last or self.log.unstable.entries:
            return False
        if self.pending_conf_index > self.log.applied:
            return False
        # a blank voter keeps the group awake until it is readmitted and says so
        return all(pr.match == last and not pr.blank for pr in self.tracker.progress.values())

    def wakes(self, m: Message) -> bool:
        """Whether a message from a peer ends quiescence; echoes of the quiet state do not.

        A heartbeat or append of our own leader that brings nothing new (one sent
        just before the quiesce heartbeat and delivered after it, or a duplicate)
        is answered without waking up; so are the leader's stale acknowledgements.
        """
        if m.type is MT.HEARTBEAT and m.quiesce:
            return False
        if m.blank:
            return True
        if m.type is MT.HEARTBEAT or m.type is MT.APP:
            if m.term != self.term or m.from_ != self.lead or m.context:
                return True
            if m.commit > self.log.committed:
                return True
            if m.type is MT.HEARTBEAT:
                return False
            last = m.entries[-1] if m.entries else None
            if last is None:
                return not self.log.match_term(m.index, m.log_term)
            return not self.log.match_term(last.index, last.term)
        if self.role is not Role.LEADER:
            return True
        if m.type is MT.HEARTBEAT_RESP:
            return bool(m.context)
        if m.type is MT.APP_RESP and not m.reject:
            pr = self.tracker.progress.get(m.from_)
            return pr is None or m.index > pr.match
        return True

    def unquiesce(self) -> None:
        if not self.quiesced:
            return
        self.quiesced = False
        if self.role is Role.LEADER:
            # Followers did not answer while quiet: give them a full election timeout
            # to show activity before CheckQuorum counts them.
            self.election_elapsed = 0
            self.heartbeat_elapsed = 0

    def quiesce(self) -> bool:
        if not self.is_idle():
            return False
        self.quiesced = True
        for node in self.tracker.progress:
            if node != self.id:
                self._send(MT.HEARTBEAT, node, commit=self.log.committed, quiesce=True)
        return True

    # -- hibernation (docs/raft.md, "Hibernation") ---------------------------------------------

    def can_hibernate(self) -> bool:
        """Quiet with nothing volatile worth keeping: all it knows is durable and applied.

        The caller must also have persisted every Ready handed out (no Ready outstanding).
        """
        if not self.quiesced or self.blank or self.msgs or self.read_states:
            return False
        if self.pending_read_msgs or len(self.read_only) or self.lead_transferee is not None:
            return False
        log = self.log
        if log.unstable.entries or log.unstable.snapshot is not None:
            return False
        if not log.applied == log.committed == log.last_index():
            return False
        if self.role is Role.LEADER:
            return self.is_idle()
        return self.role is Role.FOLLOWER and self.lead is not None

    def hibernation(self) -> Hibernation:
        assert self.can_hibernate(), "hibernating a node that holds volatile work"
        last = self.log.last_index()
        assert self.lead is not None
        return Hibernation(
            self.term,
            self.vote,
            last,
            self.log.term(last),
            self.lead,
            self.tracker.voters,
            self.tracker.learners,
        )

    def wake_from(self, h: Hibernation) -> bool:
        """Take back the quiet role ``h`` describes; call it on a node just built from storage.

        Built like a restart, the node already holds its durable hard state. The
        commit index ``h`` knew is taken when the log still holds that entry (a
        commit index alone may not have reached the disk yet). The role (the quiet
        leader of its term, or the quiet follower of a known leader) comes back only
        when the durable term and vote are the ones it hibernated with and the log
        ends where it did: it never votes or leads with less than its disk says.
        False: it stays a plain follower that keeps time, as after a restart.
        """
        log = self.log
        tr = self.tracker
        # the members as applied when it slept (conf changes after the snapshot, which a
        # woken group's driver does not apply again), whether or not the role comes back
        tr.voters, tr.learners = h.voters, h.learners
        if log.last_index() >= h.commit and log.term_or_zero(h.commit) == h.last_term:
            log.commit_to(LogIndex(max(h.commit, log.committed)))
            log.applied_to(h.commit)
        if self.term != h.term or self.vote != h.vote or log.last_index() != h.commit:
            return False
        if log.committed != h.commit or log.applied != h.commit:
            return False
        if h.lead != self.id:
            self.become_follower(self.term, h.lead)
            self.quiesced = True
            return True
        if self.id not in h.voters:
            return False
        # the leader of this term it was (at most one per term), with every member
        # known to hold the whole log (it was idle); probing re-checks that cheaply
        self._reset(self.term)
        self.lead = self.id
        self.role = Role.LEADER
        nxt = LogIndex(h.commit + 1)
        tr.progress = {
            n: tr.new_progress(nxt, is_learner=n in h.learners)
            for n in sorted(h.voters | h.learners)
        }
        for pr in tr.progress.values():
            pr.match = h.commit
            pr.recent_active = True
        tr.progress[self.id].become_replicate()
        self.pending_conf_index = h.commit
        self.quiesced = True
        return True

    # -- output ------------------------------------------------------------------------------------

    def _send(
        self,
        type_: MessageType,
        to: NodeId,
        *,
        term: Term | None = None,
        log_term: Term = _ZERO_TERM,
        index: LogIndex = _ZERO_INDEX,
        entries: tuple[Entry, ...] = _NO_ENTRIES,
        commit: LogIndex = _ZERO_INDEX,
        snapshot: Snapshot | None = None,
        reject: bool = False,
        reject_hint: LogIndex = _ZERO_INDEX,
        context: bytes = b"",
        quiesce: bool = False,
    ) -> None:
        self.msgs.append(
            Message(
                type_,
                to,
                self.id,
                self.term if term is None else term,
                log_term,
                index,
                entries,
                commit,
                snapshot,
                reject,
                reject_hint,
                context,
                quiesce,
                self.blank,
            )
        )


__all__ = ["TRANSFER_CONTEXT", "CampaignType", "ProposalDropped", "Raft"]
