"""Freezing the ledger: the leader checkpoints each group into its state object.

DESIGN, "Freezing the ledger": every ``ledger.checkpoint_entries`` applied
entries or ``ledger.checkpoint_interval``, whichever comes first, the leader
of a group writes the repository state into ``repos/<repo>/state`` by
compare-and-swap over the object it read, and only when that object is older
(same incarnation, lower version, live). A deleted state is finished as the
delete does (seed 001: "Every checkpoint of a deleted state does the same"):
trash marker, then the swap. A state object that names a later incarnation
ends the group here (seed 001: drop a superseded incarnation). A deleted state
is due at once, and its log is compacted to the tombstone even when the delete
already swapped it into the object, and a follower compacts its copy too
(nothing to write: the leader checkpoints): the group stays hosted until the
name is created again (seed 001), holding its snapshot row alone.

Restoring a node with no log is in ``Lifecycle._host_live``: a hosted group
that nobody starts gets a genesis entry carrying the state object's checkpoint.

The work is driven by the runtime's ``on_group_changed`` (an apply, or a
leadership gained), never by a scan of every hosted group: a group that
changed is checked at once for the entries rule and put on a timer for the
interval rule, so thousands of idle groups cost nothing here.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from enroute_core.base.errors import EnrouteError, PreconditionFailed
from enroute_core.state import encode_state
from enroute_core.state.names import state_key

from .lifecycle import Lifecycle
from .runtime import Group

log = logging.getLogger("enroute.ledger.checkpoints")


@dataclass(slots=True)
class _Mark:
    version: int = 0
    at: float = 0.0
    timed: bool = False  # on the interval heap


class Checkpointer:
    def __init__(
        self,
        lifecycle: Lifecycle,
        *,
        every_entries: int,
        interval_s: float,
        clock: Callable[[], float],
        poll_s: float = 0.2,
    ) -> None:
        self.lc = lifecycle
        self.rt = lifecycle.rt
        self.every_entries = every_entries
        self.interval_s = interval_s
        self.clock = clock
        self.poll_s = min(poll_s, interval_s) if interval_s > 0 else poll_s
        self._marks: dict[Group, _Mark] = {}
        self._now: dict[Group, None] = {}  # due by the entries rule, or to retry
        self._timers: list[tuple[float, int, Group]] = []  # (mark.at + interval, seq, group)
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.written = 0
        self.checks = 0
        self._stopping = False
        self.rt.on_group_changed = self.changed

    def changed(self, g: Group) -> None:
        """The runtime applied to ``g``, made it leader or dropped it: schedule what is due."""
        if g.dropped:
            self._marks.pop(g, None)
            return
        if not g.born:
            return
        if not self.rt.is_leader(g):
            if g.deleted:
                self._compact_tombstone(g)
            return
        mark = self._marks.get(g)
        if mark is None:
            mark = self._marks[g] = _Mark(at=self.clock())
        if g.version <= mark.version:
            return
        if g.version - mark.version >= self.every_entries or g.deleted:
            # a tombstone is the group's last entry: checkpoint and compact it at once,
            # so a deleted repository's log (and the entries its inline layers pinned)
            # leaves the disk now, not an interval later
            self._now[g] = None
            self._wake.set()
        elif not mark.timed and self.interval_s > 0:
            mark.timed = True
            heapq.heappush(self._timers, (mark.at + self.interval_s, next(self._seq), g))

    def _compact_tombstone(self, g: Group) -> None:
        """A follower's deleted group: its log goes to the tombstone at once. Nothing
        is written to the object (the leader does that), and nothing follows a
        tombstone in the log but elections' empty entries, so the applied state is the
        tombstone and no pin holds an entry back."""
        mark = self._marks.setdefault(g, _Mark())
        if g.version > mark.version:
            mark.version = g.version
            self.rt.compact(g, g.state, g.applied)

    def due(self, g: Group, now: float) -> bool:
        if not g.born or g.dropped or not self.rt.is_leader(g):
            return False
        mark = self._marks.setdefault(g, _Mark(at=now))
        if g.version <= mark.version:  # g.version: a hibernated group is not woken for it
            return False
        # versions count applied entries (rule version.every_entry), so they measure entries
        # since the last checkpoint without a counter that a concurrent apply could skew
        return (
            g.version - mark.version >= self.every_entries
            or now - mark.at >= self.interval_s
            or g.deleted  # the tombstone rule of ``changed``
        )

    async def checkpoint(self, g: Group) -> bool:
        """One CAS attempt at the group's applied state; True when the object now has it."""
        st, index = g.state, g.applied  # consistent: both change only in one apply step
        mark = self._marks.setdefault(g, _Mark())
        obj = await self.lc.read_object(g.repo)
        if obj is not None and obj.state.incarnation > g.incarnation:
            self.rt.drop(g)
            return False
        if (
            obj is not None
            and obj.state.incarnation == g.incarnation
            and (obj.state.deleted or obj.state.version >= st.version)
        ):
            mark.version, mark.at = max(obj.state.version, mark.version), self.clock()
            if obj.state.version < st.version:
                return False
            # the object holds this state (the delete's own swap, or a checkpoint that
            # won the race): the log up to it can go all the same; a deleted state has
            # no pins, so its log compacts to the tombstone alone
            self.rt.compact(g, st, index)
            return True
        if obj is None:
            return False  # the claim writes the object first; never create it here
        if st.deleted:
            await self.lc.finish_deletion(g.repo, st)
        else:
            try:
                await self.lc.store.put(state_key(g.repo), encode_state(st), if_match=obj.etag)
            except PreconditionFailed:
                return False  # changed meanwhile: try again next round
        mark.version, mark.at = st.version, self.clock()
        self.rt.compact(g, st, index)
        self.written += 1
        return True

    def _take_due(self, now: float) -> list[Group]:
        work = list(self._now)
        self._now.clear()
        while self._timers and self._timers[0][0] <= now:
            _, _, g = heapq.heappop(self._timers)
            mark = self._marks.get(g)
            if mark is not None:
                mark.timed = False
            work.append(g)
        return work

    async def run(self) -> None:
        while not self._stopping:
            now = self.clock()
            for g in self._take_due(now):
                self.checks += 1
                if g.dropped:
                    self._marks.pop(g, None)
                    continue
                if self.due(g, now):
                    try:
                        done = await self.checkpoint(g)
                    except EnrouteError as e:
                        log.warning("checkpoint of %s/%s failed: %s", g.repo, g.incarnation, e)
                        done = False
                    if not done and not g.dropped:
                        self._retry(g)
                        continue
                self.changed(g)  # not due yet, or more applied meanwhile: the timer again
            if self._now:
                continue  # due by the entries rule while a checkpoint was written
            delay = None if not self._timers else max(0.0, self._timers[0][0] - self.clock())
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    def _retry(self, g: Group) -> None:
        mark = self._marks.get(g)
        if mark is None or mark.timed:
            return
        mark.timed = True
        heapq.heappush(self._timers, (self.clock() + self.poll_s, next(self._seq), g))

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
