"""A group this voter hosts: its identity, applied state and waiters.

The driver (:mod:`enroute_ledger.runtime`) owns every ``Group``; the replicated
part (state, history, request id window, born) is what
:class:`enroute_ledger.machine.GroupMachine` reads and writes. A hibernated group
(docs/raft.md, "Hibernation") keeps a summary of its state and is rebuilt from the
durable log when something reads the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from enroute_core.state import MISSING, RepoState

from .machine import Done
from .multiraft import GroupId
from .raft.storage import MemoryStorage

if TYPE_CHECKING:
    from .client import Proposal, Ticket

_Summary = tuple[int, bool, bytes, bool, "int | None"]
"""What a hibernated group keeps of its state for listings: version, deleted, head,
head_kept, last_push_us."""
_HEADS: dict[bytes, bytes] = {}
"""One bytes object per HEAD name among hibernated groups (most say refs/heads/main)."""
_HEADS_MAX = 1024


def _summary_of(st: RepoState) -> _Summary:
    head = _HEADS.get(st.head)
    if head is None:
        head = st.head
        if len(_HEADS) < _HEADS_MAX:
            _HEADS[head] = head
    return (st.version, st.deleted, head, st.head_kept, st.last_push_us)


class _Live:
    """What an awake group holds beyond its identity; a hibernated group holds none."""

    __slots__ = (
        "done",
        "done_order",
        "history",
        "mem",
        "proposals",
        "reads",
        "state",
        "waiters",
    )

    def __init__(self, mem: MemoryStorage) -> None:
        self.mem = mem
        self.state: RepoState = MISSING
        # (version, Change) applied here, oldest first, at most HISTORY_MAX (a list: an
        # idle group keeps one or two, and an empty deque alone costs some 700 bytes)
        self.history: list[tuple[int, bytes]] = []
        # request id -> its apply, for ids in the dedup window (and a few older ones)
        self.done: dict[bytes, Done] = {}
        # the same records in log order, from the snapshot's window to the applied index
        self.done_order: list[Done] = []
        # the driver answers these as it applies (enroute_ledger.client)
        self.proposals: dict[bytes, Proposal] = {}
        self.reads: dict[bytes, Ticket[int]] = {}
        self.waiters: list[tuple[int, Ticket[None]]] = []


class Group:
    """One hosted incarnation: its Raft view, applied state and waiters.

    Hibernated (docs/raft.md, "Hibernation"), it keeps only ``gid``, ``born``,
    ``applied``, ``dropped`` and a summary of its state for listings; reading
    ``mem``, ``state``, ``history``, ``done``, ``done_order``, ``proposals``,
    ``reads`` or ``waiters`` rebuilds it first from the durable log (``_waker``).
    """

    __slots__ = ("_changed", "_live", "_waker", "applied", "born", "dropped", "followers", "gid")

    def __init__(
        self,
        gid: GroupId,
        mem: MemoryStorage,
        *,
        applied: int = 1,
        waker: Callable[[Group], None] | None = None,
    ) -> None:
        self.gid = gid
        self.born = False
        self.applied = applied
        self.dropped = False
        self._waker = waker
        self._changed: asyncio.Event | None = None
        self.followers: list[Callable[[], None]] | None = None
        """Called at every change: the Follow cursors of this group (enroute_ledger.follow)
        mark their stream due, instead of a task per follow waiting on ``changed``."""
        self._live: _Live | _Summary = _Live(mem)

    def _awake(self, mem: MemoryStorage) -> None:
        self._live = _Live(mem)

    def _sleep(self) -> None:
        """Keep the summary only; everything else is rebuilt from the log on wake."""
        live = self._live
        assert isinstance(live, _Live)
        self._live = _summary_of(live.state)

    @property
    def hibernated(self) -> bool:
        return not isinstance(self._live, _Live)

    def _awake_live(self) -> _Live:
        live = self._live
        if not isinstance(live, _Live):
            assert self._waker is not None, "a hibernated group without a waker"
            self._waker(self)
            live = self._live
            assert isinstance(live, _Live), "the waker left the group hibernated"
        return live

    def _held(self) -> _Live | None:
        """The awake part, or None when hibernated (never wakes)."""
        live = self._live
        return live if isinstance(live, _Live) else None

    @property
    def mem(self) -> MemoryStorage:
        return self._awake_live().mem

    @property
    def state(self) -> RepoState:
        return self._awake_live().state

    @state.setter
    def state(self, value: RepoState) -> None:
        self._awake_live().state = value

    @property
    def history(self) -> list[tuple[int, bytes]]:
        return self._awake_live().history

    @property
    def done(self) -> dict[bytes, Done]:
        return self._awake_live().done

    @done.setter
    def done(self, value: dict[bytes, Done]) -> None:
        self._awake_live().done = value

    @property
    def done_order(self) -> list[Done]:
        return self._awake_live().done_order

    @done_order.setter
    def done_order(self, value: list[Done]) -> None:
        self._awake_live().done_order = value

    @property
    def proposals(self) -> dict[bytes, Proposal]:
        return self._awake_live().proposals

    @property
    def reads(self) -> dict[bytes, Ticket[int]]:
        return self._awake_live().reads

    @property
    def waiters(self) -> list[tuple[int, Ticket[None]]]:
        return self._awake_live().waiters

    @waiters.setter
    def waiters(self, value: list[tuple[int, Ticket[None]]]) -> None:
        self._awake_live().waiters = value

    @property
    def version(self) -> int:
        """The applied state's version, without waking a hibernated group."""
        live = self._live
        return live.state.version if isinstance(live, _Live) else live[0]

    @property
    def deleted(self) -> bool:
        """Whether the applied state is deleted, without waking a hibernated group."""
        live = self._live
        return live.state.deleted if isinstance(live, _Live) else live[1]

    def listing(self) -> RepoState:
        """The state as a listing shows it, without waking a hibernated group: the
        applied state, or for a hibernated one a RepoState with only the listed fields
        (incarnation, version, deleted, head, head_kept, last_push_us) filled in."""
        live = self._live
        if isinstance(live, _Live):
            return live.state
        version, deleted, head, head_kept, last_push_us = live
        return RepoState(
            incarnation=self.incarnation,
            deleted=deleted,
            version=version,
            head=head,
            head_kept=head_kept,
            last_push_us=last_push_us,
        )

    @property
    def repo(self) -> str:
        return self.gid.repo.decode()

    @property
    def incarnation(self) -> int:
        return int(self.gid.incarnation)

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change; made on demand, so a group nobody waits on holds none."""
        ev = self._changed
        if ev is None:
            ev = self._changed = asyncio.Event()
        return ev

    def notify(self) -> None:
        ev, self._changed = self._changed, None
        if ev is not None:
            ev.set()
        for due in self.followers or ():
            due()
