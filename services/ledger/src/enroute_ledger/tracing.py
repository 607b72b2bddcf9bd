"""Where a commit's time goes, by phase (docs/raft.md, "Commit latency and throughput").

The driver tells this object when it took a Ready, when that Ready's writes
were durable and when it applied an entry; a proposal of this node is traced
from the moment it is taken to its answer, and a follower's appends from their
arrival to durable. The sums are exported as metrics (``http.RUNTIME_COUNTERS``,
``trace.*``). Pure: every time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .machine import entry_rid
from .multiraft import GroupId
from .raft.types import Entry


@dataclass(slots=True)
class Phases:
    """When one proposal passed each phase on its proposer; 0.0 = not yet."""

    proposed: float
    ready: float = 0.0
    """The Ready that appends its entry here was taken."""
    persisted: float = 0.0
    """That Ready's writes were durable here."""
    committed: float = 0.0
    """The Ready that brings it committed was taken."""
    applied: float = 0.0


class CommitTrace:
    """Sums of seconds and counts per phase; class-level zeros until counted."""

    commits_traced = 0
    """Proposals answered here whose every phase was timed."""
    phase_queue_s = 0.0
    """Proposed until the Ready that appends the entry here was taken."""
    phase_persist_s = 0.0
    """That Ready taken until its writes were durable here (batch, store round, fsync)."""
    phase_replicate_s = 0.0
    """Durable here until the Ready that brings the entry committed was taken."""
    phase_apply_s = 0.0
    """That Ready taken until the entry was applied."""
    phase_answer_s = 0.0
    """Applied until the proposer's call returned."""
    follower_appends = 0
    """Group appends received from a leader and made durable here."""
    follower_queue_s = 0.0
    """Append received until the Ready holding it was taken."""
    follower_persist_s = 0.0
    """That Ready taken until durable (the acknowledgement is sent next)."""

    def __init__(self) -> None:
        self._open: dict[bytes, Phases] = {}
        self._arrivals: dict[GroupId, float] = {}
        self.ready_t = 0.0
        """When the Ready being worked off was taken."""

    @property
    def tracing(self) -> bool:
        return bool(self._open)

    def begin(self, rid: bytes, now: float) -> None:
        """A proposal of this node was taken (its first copy counts)."""
        if rid not in self._open:
            self._open[rid] = Phases(now)

    def forget(self, rid: bytes) -> None:
        self._open.pop(rid, None)

    def arrived(self, group: GroupId, now: float) -> None:
        """A leader's append for ``group`` arrived (the first one since its last Ready)."""
        if group not in self._arrivals:
            self._arrivals[group] = now

    def appended(self, entries: Iterable[Entry]) -> list[Phases]:
        """Mark the proposals of this node whose entries the Ready taken now appends."""
        out: list[Phases] = []
        traces = self._open
        for e in entries:
            tr = traces.get(entry_rid(e.data))
            if tr is not None and not tr.ready:
                tr.ready = self.ready_t
                out.append(tr)
        return out

    def persisted(self, traced: list[Phases] | None, groups: Iterable[GroupId], now: float) -> None:
        """A Ready's writes are durable: its proposals' and its followers' appends."""
        for tr in traced or ():
            tr.persisted = now
        arrivals = self._arrivals
        if not arrivals:
            return
        t_ready = self.ready_t
        for gid in groups:
            t = arrivals.get(gid)
            if t is not None and t <= t_ready:  # later: for the next Ready
                del arrivals[gid]
                self.follower_appends += 1
                self.follower_queue_s += t_ready - t
                self.follower_persist_s += now - t_ready

    def applied(self, rid: bytes, now: float) -> None:
        """The proposal ``rid`` of this node applied (its first copy)."""
        tr = self._open.get(rid)
        if tr is not None:
            tr.committed = self.ready_t
            tr.applied = now

    def answered(self, rid: bytes, now: float) -> None:
        """The proposal ``rid`` is answered: add its phases to the sums."""
        tr = self._open.pop(rid, None)
        if tr is None or not (tr.ready and tr.persisted and tr.committed and tr.applied):
            return
        self.commits_traced += 1
        self.phase_queue_s += tr.ready - tr.proposed
        self.phase_persist_s += tr.persisted - tr.ready
        self.phase_replicate_s += max(0.0, tr.committed - tr.persisted)
        self.phase_apply_s += tr.applied - tr.committed
        self.phase_answer_s += now - tr.applied
