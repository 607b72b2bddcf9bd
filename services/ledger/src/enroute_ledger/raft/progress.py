"""What the leader knows of each follower, and the quorum arithmetic.

A follower's ``Progress`` is in one of three states (etcd's tracker):

1. PROBE: the leader does not know where the logs meet. It sends one
   AppendEntries at a time and waits for the answer (or a heartbeat reply)
   before the next, backing ``next`` off on each rejection (§5.3).
2. REPLICATE: the logs met at ``match``. The leader streams entries without
   waiting, moving ``next`` optimistically, bounded by an inflight window of
   ``inflight_msgs_max`` messages and ``inflight_bytes_max`` bytes.
3. SNAPSHOT: the entries the follower needs were compacted; a snapshot is on
   its way and nothing else is sent until it is reported done or failed.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable

from enroute_core.base.ids import LogIndex, NodeId


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


_NONE_IN_FLIGHT: deque[tuple[LogIndex, int]] = deque(maxlen=0)


class Inflights:
    """Messages sent and not yet acknowledged: (last index, bytes), oldest first.

    The queue is made at the first message: a deque costs some 700 bytes, and
    a node hosts three windows for each of its many mostly idle groups.
    """

    __slots__ = ("_bytes", "_q", "bytes_max", "count_max", "shared")

    _IDLE: dict[tuple[int, int], Inflights] = {}

    def __init__(self, count_max: int, bytes_max: int, *, shared: bool = False) -> None:
        assert count_max > 0 and bytes_max > 0, (count_max, bytes_max)
        self.count_max = count_max
        self.bytes_max = bytes_max
        self._q = _NONE_IN_FLIGHT  # shared and empty; replaced before any append
        self._bytes = 0
        self.shared = shared

    @classmethod
    def idle(cls, count_max: int, bytes_max: int) -> Inflights:
        """The one empty window of these bounds that idle followers share (never added to:
        ``Progress`` swaps in its own window before the first message and back after)."""
        key = (count_max, bytes_max)
        got = cls._IDLE.get(key)
        if got is None:
            got = cls._IDLE[key] = cls(count_max, bytes_max, shared=True)
        return got

    def __len__(self) -> int:
        return len(self._q)

    @property
    def bytes(self) -> int:
        return self._bytes

    def full(self) -> bool:
        return len(self._q) >= self.count_max or self._bytes >= self.bytes_max

    def add(self, index: LogIndex, size_bytes: int) -> None:
        assert not self.shared, "add to the shared idle window"
        assert not self.full(), "add to a full inflight window"
        assert not self._q or self._q[-1][0] < index, (index, self._q[-1])
        if self._q is _NONE_IN_FLIGHT:
            self._q = deque()
        self._q.append((index, size_bytes))
        self._bytes += size_bytes

    def free_le(self, index: LogIndex) -> None:
        q = self._q
        while q and q[0][0] <= index:
            self._bytes -= q.popleft()[1]
        if not q:
            self._q = _NONE_IN_FLIGHT  # an idle window holds no queue

    def free_first_one(self) -> None:
        if self._q:
            self._bytes -= self._q.popleft()[1]

    def reset(self) -> None:
        self._q = _NONE_IN_FLIGHT
        self._bytes = 0


class Progress:
    __slots__ = (
        "appended",
        "blank",
        "inflights",
        "is_learner",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "readmit_index",
        "recent_active",
        "state",
    )

    def __init__(
        self, next_index: LogIndex, inflights: Inflights, *, is_learner: bool = False
    ) -> None:
        self.match = LogIndex(0)
        self.next = next_index
        self.state = ProgressState.PROBE
        self.pending_snapshot = LogIndex(0)
        self.recent_active = False
        self.probe_sent = False
        self.inflights = inflights
        self.is_learner = is_learner
        self.blank = 0  # its last message's blank id: replicate to it, never count it
        self.readmit_index = LogIndex(0)  # where this leader appended its READMIT
        self.appended = False  # sent an append since the last beat (config.quiet_commit)

    def __repr__(self) -> str:
        return (
            f"Progress({self.state.value} match={self.match} next={self.next}"
            f" inflight={len(self.inflights)} snap={self.pending_snapshot})"
        )

    def _reset_state(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = LogIndex(0)
        self.state = state
        self._idle_window()

    def _idle_window(self) -> None:
        """Back to the shared empty window (an idle group holds none of its own)."""
        w = self.inflights
        if not w.shared:
            self.inflights = Inflights.idle(w.count_max, w.bytes_max)

    def free_le(self, index: LogIndex) -> None:
        """Acknowledged up to ``index``: free those messages of the window."""
        self.inflights.free_le(index)
        if not self.inflights:
            self._idle_window()

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            # The snapshot (if it arrived) put the follower at least at pending_snapshot.
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = LogIndex(max(self.match + 1, pending + 1))
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = LogIndex(self.match + 1)

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next = LogIndex(self.match + 1)

    def become_snapshot(self, snapshot_index: LogIndex) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def maybe_update(self, index: LogIndex) -> bool:
        """An acknowledgement up to ``index``; False when it is stale."""
        if index <= self.match:
            return False
        self.match = index
        self.next = LogIndex(max(self.next, index + 1))
        self.probe_sent = False
        return True

    def maybe_decr_to(self, rejected: LogIndex, match_hint: LogIndex) -> bool:
        """A rejection of the message whose previous index was ``rejected``.

        Returns False when the rejection is stale (answers an older message).
        """
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = LogIndex(self.match + 1)
            return True
        if self.next - 1 != rejected:
            return False
        self.next = LogIndex(max(min(rejected, match_hint + 1), self.match + 1))
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True

    def sent_entries(self, last_index: LogIndex, count: int, size_bytes: int) -> None:
        if self.state is ProgressState.REPLICATE:
            if count:
                self.next = LogIndex(last_index + 1)
                w = self.inflights
                if w.shared:
                    w = self.inflights = Inflights(w.count_max, w.bytes_max)
                w.add(last_index, size_bytes)
        elif self.state is ProgressState.PROBE:
            if count:
                self.probe_sent = True
        else:
            raise AssertionError(f"sending entries in state {self.state}")


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


_NO_VOTES: dict[NodeId, bool] = {}  # shared, never written: see record_vote


def quorum_size(voters: int) -> int:
    return voters // 2 + 1


class ProgressTracker:
    """The configuration (voters, learners), each member's Progress, and election tallies.

    ``voters`` and ``learners`` are frozensets, replaced on a change: one set of the
    same members is shared by every group's tracker and ConfState.
    """

    __slots__ = (
        "idle_inflights",
        "inflight_bytes_max",
        "inflight_msgs_max",
        "learners",
        "progress",
        "voters",
        "votes",
    )

    def __init__(self, inflight_msgs_max: int, inflight_bytes_max: int) -> None:
        self.inflight_msgs_max = inflight_msgs_max
        self.inflight_bytes_max = inflight_bytes_max
        self.idle_inflights = Inflights.idle(inflight_msgs_max, inflight_bytes_max)
        self.voters: frozenset[NodeId] = frozenset()
        self.learners: frozenset[NodeId] = frozenset()
        self.progress: dict[NodeId, Progress] = {}
        self.votes: dict[NodeId, bool] = _NO_VOTES

    def new_progress(self, next_index: LogIndex, *, is_learner: bool) -> Progress:
        return Progress(next_index, self.idle_inflights, is_learner=is_learner)

    def is_singleton(self) -> bool:
        return len(self.voters) == 1

    def committed(self) -> LogIndex:
        """The largest index a quorum of voters has matched (§5.3, §5.4.2)."""
        if not self.voters:
            return LogIndex(0)
        # a blank voter's acknowledgements promise nothing (docs/raft.md, lost disks)
        matched = sorted(
            (LogIndex(0) if (p := self.progress[v]).blank else p.match for v in self.voters),
            reverse=True,
        )
        return matched[quorum_size(len(matched)) - 1]

    def quorum_active(self, self_id: NodeId) -> bool:
        """CheckQuorum (thesis §6.2): did a quorum hear from us within the last election timeout?"""
        active = sum(
            1
            for v in self.voters
            if v == self_id or (self.progress[v].recent_active and not self.progress[v].blank)
        )
        return active >= quorum_size(len(self.voters))

    def reset_votes(self) -> None:
        self.votes = _NO_VOTES  # a tally is made at the first vote: most groups never elect

    def record_vote(self, node: NodeId, granted: bool) -> None:
        if self.votes is _NO_VOTES:
            self.votes = {}
        self.votes.setdefault(node, granted)

    def tally(self) -> tuple[int, int, VoteResult]:
        granted = sum(1 for v in self.voters if self.votes.get(v) is True)
        rejected = sum(1 for v in self.voters if self.votes.get(v) is False)
        q = quorum_size(len(self.voters))
        if granted >= q:
            return granted, rejected, VoteResult.WON
        if len(self.voters) - rejected < q:
            return granted, rejected, VoteResult.LOST
        return granted, rejected, VoteResult.PENDING

    def members(self) -> Iterable[NodeId]:
        return sorted(self.progress)
