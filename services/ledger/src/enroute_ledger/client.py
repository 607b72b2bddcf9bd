"""The driver's client API, its pure half: what a proposal or a read barrier does next.

Raft may lose a taken proposal without a word (docs/raft.md, duty 9: a forward
dropped, a leader deposed before it replicated), and a ReadIndex request may go
unanswered (duty 11). So a proposal here is a small state machine that the
caller polls with the time: propose, wait for the apply while this node's view
of the group (term, leader) holds, propose the same bytes again when it changed
or nothing applied them within a retry interval, until a deadline; the id
window (:mod:`enroute_ledger.machine`) makes every copy after the first a no-op
answered with the first one's result. A read barrier asks for the leader's
commit index, asks again when no answer came, then waits for the apply.

No asyncio and no clock: the coroutines that Lifecycle awaits
(:mod:`enroute_ledger.calls`) poll these between waits on the group's change
event, and the seeded simulation (tests/sim/driver_sim.py) polls the same
objects step by step, so the proposals of its schedules take this code path.
The driver answers them as it applies (:class:`Ticket`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from enroute_core.base.errors import (
    EnrouteError,
    NotFound,
    ProposalDropped,
    Timeout,
    Unavailable,
)

from .machine import Applied, GroupMachine
from .multiraft import MultiRaft

if TYPE_CHECKING:
    from .group import Group
    from .tracing import CommitTrace

T = TypeVar("T")

PROPOSE_RETRY_MAX_S = 4.0
"""Longest wait for an apply before the same entry is proposed again."""
PROPOSE_ATTEMPTS_MAX = 1000
"""Proposals of one entry at most, whatever the deadline (each waits for a change of view
or a retry interval first)."""
DROPPED_RETRY_FIRST_S = 0.01
"""A proposal Raft refused at once (no leader known) is tried again after this, doubling."""
DROPPED_RETRY_MAX_S = 0.2
READ_ASK_AGAIN_S = 1.0
"""A ReadIndex request with no answer within this is asked again under a new context."""


class Ticket(Generic[T]):
    """Where the driver answers one waiter: a value or an error, once.

    ``waker`` (the group's ``notify`` for the coroutines) is called when it is answered;
    the simulation polls ``done`` instead.
    """

    __slots__ = ("done", "error", "value", "waker")

    def __init__(self) -> None:
        self.done = False
        self.value: T | None = None
        self.error: EnrouteError | None = None
        self.waker: Callable[[], None] | None = None

    def set(self, value: T) -> None:
        if not self.done:
            self.done, self.value = True, value
            self._wake()

    def fail(self, error: EnrouteError) -> None:
        if not self.done:
            self.done, self.error = True, error
            self._wake()

    def _wake(self) -> None:
        if self.waker is not None:
            self.waker()

    def result(self) -> T:
        """The answer; raises the error. Only once ``done``."""
        assert self.done, "asked for the result of an open ticket"
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class Proposal(Ticket[Applied]):
    """One proposal's life on this node (see the module docstring)."""

    __slots__ = (
        "attempt",
        "deadline",
        "dropped_delay",
        "entry",
        "leading",
        "resend_at",
        "retry_at",
        "retry_s",
        "rid",
        "view",
    )

    def __init__(self, rid: bytes, entry: bytes, deadline: float, retry_s: float) -> None:
        super().__init__()
        self.rid = rid
        self.entry = entry
        self.deadline = deadline
        self.retry_s = retry_s
        self.attempt = 0
        self.view: tuple[int, int | None] | None = None
        """(term, leader) when the entry was last taken; None: to propose (again)."""
        self.leading = False
        self.resend_at = 0.0
        self.retry_at = 0.0
        self.dropped_delay = DROPPED_RETRY_FIRST_S


class ReadBarrier(Ticket[None]):
    """One ReadIndex barrier: answered once this node applied the leader's commit index."""

    __slots__ = ("ask_until", "ctx", "deadline", "dropped_delay", "index", "read", "retry_at")

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline
        self.ctx = b""
        self.read: Ticket[int] | None = None
        self.index: int | None = None
        self.ask_until = 0.0
        self.retry_at = 0.0
        self.dropped_delay = DROPPED_RETRY_FIRST_S


def _gone(g: Group) -> NotFound:
    return NotFound("incarnation no longer hosted", repo=g.repo, incarnation=g.incarnation)


def _lost() -> Timeout:
    return Timeout("proposal not applied in time; outcome unknown")


class Client:
    """Opens, polls and closes proposals and read barriers of one node's groups."""

    proposals_total = 0
    reproposals = 0
    """Proposals sent again under the same request id (docs/raft.md, Re-proposal)."""

    def __init__(
        self,
        mr: MultiRaft,
        machine: GroupMachine,
        trace: CommitTrace,
        *,
        node_id: int,
        nonce: bytes,
        retry_s: float,
    ) -> None:
        self.mr, self.machine, self.trace = mr, machine, trace
        self._node_id = node_id
        self._retry_s = retry_s
        self._nonce = nonce[:8].ljust(8, b"\0")
        self._ids = itertools.count(1)

    def request_id(self) -> bytes:
        """A fresh request id: this process's nonce and a counter (16 bytes)."""
        return self._nonce + next(self._ids).to_bytes(8, "big")

    def view(self, g: Group) -> tuple[int, int | None]:
        """This node's (term, leader) of ``g``: a change means a taken entry may be lost."""
        lead = self.mr.lead_of(g.gid)
        return self.mr.term_of(g.gid), (None if lead is None else int(lead))

    # -- proposals --------------------------------------------------------------------------

    def open(self, g: Group, entry: bytes, rid: bytes, deadline: float) -> Proposal:
        """Track ``entry`` under ``rid``; the driver answers it when an entry of ``rid``
        applies (a newer call with the same id takes the place of an older one)."""
        p = Proposal(rid, entry, deadline, self._retry_s)
        p.waker = g.notify
        g.proposals[rid] = p
        self.proposals_total += 1
        return p

    def close(self, p: Proposal, g: Group) -> None:
        """The caller is done with ``p``, answered or not."""
        if not g.hibernated and g.proposals.get(p.rid) is p:
            del g.proposals[p.rid]
        self.trace.forget(p.rid)

    def poll(self, p: Proposal, g: Group, now: float) -> float:
        """Move ``p`` on at ``now``: answered from the window, (re)proposed, or failed.

        Returns when to poll again at the latest (a change of the group may make it
        sooner); ``p.done`` once answered. While this node leads the group in the term
        it took the entry in, the entry is in its own log, which a leader never
        truncates: only a change of view can lose it, so no timer re-proposes it.
        """
        if p.done:
            return now
        if g.dropped:
            p.fail(_gone(g))
            return now
        first = self.machine.duplicate(g, p.rid, g.applied + 1)
        if first is not None:  # applied meanwhile (also a caller's retry, or a snapshot)
            p.set(self.machine.answer(g, first))
            return now
        if p.view is not None:
            if now >= p.deadline:
                p.fail(_lost())
                return now
            if self.view(g) == p.view and (p.leading or now < p.resend_at):
                return p.deadline if p.leading else min(p.resend_at, p.deadline)
            self._again(p)
            if p.done:
                return now
        if now < p.retry_at:
            return p.retry_at
        return self._take(p, g, now)

    def _again(self, p: Proposal) -> None:
        """The entry may be lost: propose the same bytes again, under the same id."""
        p.view = None
        p.attempt += 1
        p.retry_s = min(p.retry_s * 2, PROPOSE_RETRY_MAX_S)
        p.dropped_delay = DROPPED_RETRY_FIRST_S
        if p.attempt >= PROPOSE_ATTEMPTS_MAX:
            p.fail(_lost())
            return
        self.reproposals += 1

    def _take(self, p: Proposal, g: Group, now: float) -> float:
        try:
            self.mr.propose(g.gid, p.entry)
        except ProposalDropped as e:
            if now + p.dropped_delay >= p.deadline:
                # nothing was appended on the first attempt; later, an earlier copy may be
                p.fail(
                    Unavailable(f"no leader for {g.repo}: {e.message}", **e.details)
                    if not p.attempt
                    else _lost()
                )
                return now
            p.retry_at = now + p.dropped_delay
            p.dropped_delay = min(p.dropped_delay * 2, DROPPED_RETRY_MAX_S)
            return p.retry_at
        p.view = self.view(g)
        p.leading = p.view[1] == self._node_id
        p.resend_at = now + p.retry_s
        self.trace.begin(p.rid, now)
        return p.deadline if p.leading else min(p.resend_at, p.deadline)

    # -- read barriers (DESIGN, "Read path") ------------------------------------------------

    def open_read(self, g: Group, deadline: float) -> ReadBarrier:
        b = ReadBarrier(deadline)
        b.waker = g.notify
        return b

    def close_read(self, b: ReadBarrier, g: Group) -> None:
        if g.hibernated:
            return
        if b.read is not None and g.reads.get(b.ctx) is b.read:
            del g.reads[b.ctx]
        if b.index is not None and not b.done:
            g.waiters = [(i, t) for i, t in g.waiters if t is not b]

    def poll_read(self, b: ReadBarrier, g: Group, now: float) -> float:
        """Move ``b`` on at ``now``: ask for the read index (again), then wait to apply it."""
        if b.done:
            return now
        if g.dropped:
            b.fail(_gone(g))
            return now
        if now >= b.deadline:
            b.fail(Timeout("read barrier timed out"))
            return now
        if b.index is not None:
            return b.deadline  # in g.waiters: the apply answers it
        read = b.read
        if read is not None and read.done:
            if read.error is not None:
                b.fail(read.error)
                return now
            index = read.result()
            g.reads.pop(b.ctx, None)
            if g.applied >= index:
                b.set(None)
                return now
            b.index = index
            g.waiters.append((index, b))
            return b.deadline
        if read is not None and now < b.ask_until:
            return min(b.ask_until, b.deadline)
        if now < b.retry_at:
            return b.retry_at
        return self._ask(b, g, now)

    def _ask(self, b: ReadBarrier, g: Group, now: float) -> float:
        if b.ctx:
            g.reads.pop(b.ctx, None)  # an answer to the old context is not waited for
        b.ctx, b.read = self.request_id(), None
        try:
            self.mr.read_index(g.gid, b.ctx)
        except ProposalDropped as e:
            if now + b.dropped_delay >= b.deadline:
                b.fail(Unavailable(f"no leader for {g.repo}: {e.message}", **e.details))
                return now
            b.retry_at = now + b.dropped_delay
            b.dropped_delay = min(b.dropped_delay * 2, DROPPED_RETRY_MAX_S)
            return b.retry_at  # asked nothing: the next poll asks again
        # answered by a later Ready's read states, never by this call
        b.read = Ticket()
        b.read.waker = g.notify
        g.reads[b.ctx] = b.read
        b.dropped_delay = DROPPED_RETRY_FIRST_S
        b.ask_until = now + READ_ASK_AGAIN_S
        return min(b.ask_until, b.deadline)
