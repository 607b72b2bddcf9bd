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

A follower compacts its copy of a live group as well, once the object holds the
state it applied: it tracks a changed group as the leader does, and when the
timer fires it reads the object (never writes it) and compacts to its applied
index if the object holds that version, else looks again an interval later. A
follower's log is otherwise never compacted: it grows without end, and a group
with more than ``runtime.HIBERNATE_REPLAY_MAX`` entries past its compaction point
never hibernates there (issue 19: the 10,000-repository run's groups awake on
both followers and asleep on their leader). That costs a follower one read of
the object per changed group and interval, as the leader's checkpoint does.

Quiet groups: a group about to hibernate with applied entries past its last
checkpoint is settled first, while its state is still in memory: its leader
checkpoints it now and a follower looks whether the object holds it (the
runtime's ``may_sleep`` hook refuses the sleep until then, and the multi-Raft
layer asks again ``hibernate_after`` later). The interval rule alone let a
repository pushed once and then left idle sleep with its change unsettled, and
an interval later every voter woke it to checkpoint or to look: in the
10,000-repository run, the pushes of five minutes before kept 94 groups awake on
every voter and cost each about 10% of a core of state-object calls while the
fleet was idle (issue 19). Settling on quiet makes the same calls (a leader's read
and swap, a follower's read) seconds after the push instead, and the group then
sleeps with nothing to replay. A group that cannot be settled in
``QUIET_TRIES_MAX`` asks (the object store failing, a leader that never writes)
sleeps all the same, and the interval rule stays its fallback.

Restoring a node with no log is in ``Lifecycle._host_live``: a hosted group
that nobody starts gets a genesis entry carrying the state object's checkpoint.

The work is driven by the runtime's ``on_group_changed`` (an apply, or a
leadership gained), never by a scan of every hosted group: a group that
changed is checked at once for the entries rule and put on a timer for the
interval rule, so thousands of idle groups cost nothing here.

Nothing is kept for a settled group (issue 19: an idle repository costs a voter
almost nothing). Entries are counted in log indexes from the group's compaction
point, which every checkpoint moves to the index it wrote: ``g.applied`` minus the
index its in-memory log starts after (versions advance once per applied entry,
rule version.every_entry, so this is the entries rule; an election's empty entry
counts too, and a checkpoint that finds the object current only compacts). A group
is tracked from its first change past that point, or from a checkpoint, until its
timer fires: the index last checkpointed (the log may not show it yet: compaction
lands a round later) and a place in a coarse timer wheel, one list per
``1/TIMER_SLOTS`` of the interval (a deadline is rounded up, never down), instead
of a mark per group ever led here and one heap entry per timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable

from enroute_core.base.errors import EnrouteError, PreconditionFailed
from enroute_core.state import RepoState, encode_state
from enroute_core.state.names import state_key

from .group import Group
from .lifecycle import Lifecycle

log = logging.getLogger("enroute.ledger.checkpoints")

TIMER_SLOTS = 64
"""Slots of the timer wheel per checkpoint interval: a group's deadline is rounded up
to the next slot (at most 1/64 of the interval late, 4.7 s of the default 300 s), and
every group whose deadline falls in a slot shares one list and one deadline object."""


QUIET_TRIES_MAX = 5
"""Hibernation attempts a quiet group's settling may refuse (one every
``ledger.hibernate_after`` seconds, 3 s by default): a follower's first look often
comes before its leader's swap, so it takes two."""


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
        # the time a tracked group waits for its next look: without an interval rule,
        # only the wait for its compaction to land before it is forgotten
        self._wait_s = interval_s if interval_s > 0 else self.poll_s
        self._slot_s = self._wait_s / TIMER_SLOTS
        self._tracked: dict[Group, int] = {}
        """Group -> the log index it was last checkpointed (or compacted) at, for the
        groups with a change since, or checkpointed within the last interval; each
        has one entry in ``_wheel``."""
        self._wheel: deque[tuple[float, list[Group]]] = deque()
        """(deadline, groups) in deadline order: a group joins the last slot when it
        starts being tracked, so deadlines never go back."""
        self._now: dict[Group, None] = {}  # due by the entries rule, or a tombstone
        self._retries: list[tuple[float, int, Group]] = []  # failed checkpoints: rare
        self._retrying: dict[Group, None] = {}
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self.written = 0
        self.checks = 0
        self.followed = 0  # a follower's copies compacted to a state the object holds
        self._stopping = False
        self._quiet: dict[Group, int] = {}  # quiet groups being settled: refusals so far
        self._busy: Group | None = None  # the group whose checkpoint or look is awaited
        self.rt.on_group_changed = self.changed
        self.rt.may_sleep = self.settled

    def changed(self, g: Group) -> None:
        """The runtime applied to ``g``, made it leader or dropped it: schedule what is due."""
        if g.dropped:
            self._forget(g)
            return
        if not g.born:
            return
        base = self._base(g)
        if g.applied <= base:
            return  # nothing past the last checkpoint
        if not self.rt.is_leader(g):
            if g.deleted:
                self._compact_tombstone(g)
            elif self.interval_s > 0:
                self._track(g, base)  # compacted once the leader's checkpoint holds it
            return
        if g.applied - base >= self.every_entries or g.deleted:
            # a tombstone is the group's last entry: checkpoint and compact it at once,
            # so a deleted repository's log (and the entries its inline layers pinned)
            # leaves the disk now, not an interval later
            self._now[g] = None
            self._wake.set()
        self._track(g, base)

    def settled(self, g: Group) -> bool:
        """Whether ``g`` may hibernate: its state object holds what it applied, or it
        was given ``QUIET_TRIES_MAX`` chances to (module docstring, "Quiet groups")."""
        if self.interval_s <= 0 or not g.born or g.deleted or g.applied <= self._base(g):
            self._quiet.pop(g, None)
            return True
        if g is self._busy or g in self._now:
            return False  # its checkpoint or look is under way: not another try
        tries = self._quiet.get(g, 0)
        if tries >= QUIET_TRIES_MAX:
            del self._quiet[g]
            log.info("%s/%s sleeps unsettled after %d tries", g.repo, g.incarnation, tries)
            return True
        self._quiet[g] = tries + 1
        self._now[g] = None  # a leader checkpoints it, a follower looks at the object
        self._wake.set()
        return False

    def _base(self, g: Group) -> int:
        """The index the group was last checkpointed or compacted at. An untracked group
        is read from its log, which a change or a leadership gain has just woken."""
        base = self._tracked.get(g)
        return int(g.mem.first_index()) - 1 if base is None else base

    def _track(self, g: Group, base: int) -> None:
        if g in self._tracked:
            self._tracked[g] = base
            return
        self._tracked[g] = base
        # rounded up to the wheel's next slot: never early, and every group of a slot
        # shares the slot's deadline and list
        deadline = (math.floor((self.clock() + self._wait_s) / self._slot_s) + 1) * self._slot_s
        wheel = self._wheel
        if wheel and wheel[-1][0] >= deadline:
            wheel[-1][1].append(g)
            return
        if not wheel:
            self._wake.set()  # the loop sleeps without a deadline
        wheel.append((deadline, [g]))

    def _forget(self, g: Group) -> None:
        self._tracked.pop(g, None)
        self._quiet.pop(g, None)
        self._now.pop(g, None)
        self._retrying.pop(g, None)

    def _compact_tombstone(self, g: Group) -> None:
        """A follower's deleted group: its log goes to the tombstone at once. Nothing
        is written to the object (the leader does that), and nothing follows a
        tombstone in the log but elections' empty entries, so the applied state is the
        tombstone and no pin holds an entry back. Tracked until its timer, so the
        compaction is asked for once."""
        self.rt.compact(g, g.state, g.applied)
        self._track(g, g.applied)

    async def checkpoint(self, g: Group) -> bool:
        """One CAS attempt at the group's applied state; True when the object now has it."""
        st, index = g.state, g.applied  # consistent: both change only in one apply step
        obj = await self.lc.read_object(g.repo)
        if obj is not None and obj.state.incarnation > g.incarnation:
            self.rt.drop(g)
            return False
        if (
            obj is not None
            and obj.state.incarnation == g.incarnation
            and (obj.state.deleted or obj.state.version >= st.version)
        ):
            if not _holds(obj.state, st):
                return False
            # the object holds this state (the delete's own swap, or a checkpoint that
            # won the race): the log up to it can go all the same; a deleted state has
            # no pins, so its log compacts to the tombstone alone
            self._compacted(g, st, index)
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
        self._compacted(g, st, index)
        self.written += 1
        return True

    async def follow(self, g: Group) -> bool:
        """A follower's copy: compacted to its applied index once the object holds that
        state (the leader's checkpoint); nothing is written. True when compacted."""
        st, index = g.state, g.applied
        obj = await self.lc.read_object(g.repo)
        if obj is not None and obj.state.incarnation > g.incarnation:
            self._forget(g)  # superseded: its leader drops it, nothing to wait for
            return False
        if obj is None or g.dropped or not _holds(obj.state, st):
            return False  # still tracked: looked at again an interval later
        self._compacted(g, st, index)
        self.followed += 1
        return True

    def _compacted(self, g: Group, st: RepoState, index: int) -> None:
        self.rt.compact(g, st, index)
        if not g.dropped:
            self._track(g, index)

    def _take_due(self, now: float) -> list[Group]:
        work = dict(self._now)
        self._now.clear()
        wheel = self._wheel
        while wheel and wheel[0][0] <= now:
            _, slot = wheel.popleft()
            for g in slot:
                base = self._tracked.pop(g, None)
                if base is None:
                    continue  # forgotten meanwhile
                if g.dropped or self.interval_s <= 0 or g.applied <= base:
                    # settled: nothing is kept for it any more (without an interval
                    # rule, a change is counted again from its log, where the
                    # compaction has landed by now)
                    continue
                # a change the object may not hold, an interval old: due (a leader
                # checkpoints, a follower looks whether the object holds it), and
                # tracked for one more interval from the checkpoint or the look
                self._track(g, base)
                work[g] = None
        while self._retries and self._retries[0][0] <= now:
            _, _, g = heapq.heappop(self._retries)
            if self._retrying.pop(g, None) is not None:
                work[g] = None
        return list(work)

    def due(self, g: Group) -> bool:
        """Led here, with an applied entry past its last checkpoint."""
        return g.born and not g.dropped and self.rt.is_leader(g) and g.applied > self._base(g)

    async def run(self) -> None:
        while not self._stopping:
            for g in self._take_due(self.clock()):
                self.checks += 1
                self._busy = g
                if g.dropped:
                    self._forget(g)
                    continue
                if not self.rt.is_leader(g):
                    if g.born and not g.deleted:
                        await self._follow_logged(g)
                    continue
                if not self.due(g):
                    continue
                try:
                    done = await self.checkpoint(g)
                except EnrouteError as e:
                    log.warning("checkpoint of %s/%s failed: %s", g.repo, g.incarnation, e)
                    done = False
                if not done and not g.dropped:
                    self._retry(g)
            self._busy = None
            if self._now:
                continue  # due by the entries rule while a checkpoint was written
            due = [t[0][0] for t in (self._wheel, self._retries) if t]
            delay = max(0.0, min(due) - self.clock()) if due else None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _follow_logged(self, g: Group) -> None:
        try:
            await self.follow(g)
        except EnrouteError as e:
            log.warning("follower compaction of %s/%s failed: %s", g.repo, g.incarnation, e)

    def _retry(self, g: Group) -> None:
        if g in self._retrying:
            return
        self._retrying[g] = None
        heapq.heappush(self._retries, (self.clock() + self.poll_s, next(self._seq), g))

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()


def _holds(obj: RepoState, st: RepoState) -> bool:
    """Whether the object's state holds ``st``: the same incarnation, at its version or
    later (a later one was applied after it, so the log up to ``st`` may go)."""
    return obj.incarnation == st.incarnation and obj.version >= st.version
