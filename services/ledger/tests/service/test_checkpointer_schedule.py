"""The checkpointer works from the runtime's change events, never from a scan of every
hosted group (DESIGN, "Freezing the ledger"; docs/raft.md, "The ledger runtime's loop")."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, cast

from enroute_core.state import RepoState
from enroute_ledger.checkpoints import QUIET_TRIES_MAX, Checkpointer
from enroute_ledger.lifecycle import Lifecycle, StateObject
from enroute_testing.waiting import until


def live(version: int) -> RepoState:
    return RepoState(incarnation=1, version=version, upload_window=1, head=b"refs/heads/main")


@dataclass
class FakeLog:
    """As the group's in-memory log: its first index follows the compactions."""

    compacted: int = 0

    def first_index(self) -> int:
        return self.compacted + 1


@dataclass(eq=False)
class FakeGroup:
    repo: str
    incarnation: int = 1
    state: RepoState = field(default_factory=lambda: live(1))
    applied: int = 1
    born: bool = True
    dropped: bool = False
    mem: FakeLog = field(default_factory=FakeLog)

    @property
    def version(self) -> int:
        """As ``Group.version``: the applied state's version (no wake)."""
        return self.state.version

    @property
    def deleted(self) -> bool:
        """As ``Group.deleted`` (no wake)."""
        return self.state.deleted


class FakeRuntime:
    def __init__(self, groups: list[FakeGroup]) -> None:
        self.groups = {g.repo: g for g in groups}
        self.on_group_changed: Any = None
        self.may_sleep: Any = None
        self.leader_checks = 0
        self.leading = True
        self.compacted: list[tuple[str, int]] = []
        self.lands = True
        """The compaction reaches the group's log at once (the runtime's lands a round
        later: False keeps the log as it was)."""

    def is_leader(self, g: FakeGroup) -> bool:
        self.leader_checks += 1
        return self.leading

    def drop(self, g: FakeGroup) -> None:
        g.dropped = True

    def compact(self, g: FakeGroup, st: RepoState, index: int) -> None:
        self.compacted.append((g.repo, st.version))
        if self.lands:
            g.mem.compacted = index


class FakeStore:
    def __init__(self) -> None:
        self.puts: list[str] = []

    async def put(self, key: str, data: bytes, **_: object) -> None:
        self.puts.append(key)


class FakeLifecycle:
    def __init__(self, rt: FakeRuntime) -> None:
        self.rt = rt
        self.store = FakeStore()
        self.reads = 0
        self.object = live(1)  # what the state object holds (the leader's checkpoint)

    async def read_object(self, repo: str) -> StateObject | None:
        self.reads += 1
        return StateObject(self.object, "etag")


def bump(g: FakeGroup, versions: int) -> None:
    g.state = live(g.state.version + versions)
    g.applied += versions


def test_idle_groups_cost_no_checks_and_changes_are_checkpointed_by_both_rules() -> None:
    groups = [FakeGroup(f"r{i}") for i in range(5000)]
    rt = FakeRuntime(groups)
    lc = FakeLifecycle(rt)
    cp = Checkpointer(
        cast(Lifecycle, lc), every_entries=10, interval_s=0.3, clock=time.monotonic, poll_s=0.05
    )
    assert rt.on_group_changed == cp.changed

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(cp.run())
        try:
            # thousands of hosted groups and nothing applied: nothing is looked at
            await asyncio.sleep(0.3)  # the point: time in which nothing may be looked at
            assert cp.checks == 0 and rt.leader_checks == 0 and lc.reads == 0
            # the entries rule: due at once
            busy, slow = groups[0], groups[1]
            bump(busy, 12)
            cp.changed(busy)  # as the runtime calls it after an apply
            # the interval rule: below the entries rule, due after interval_s
            bump(slow, 2)
            cp.changed(slow)
            t0 = time.monotonic()
            await until(lambda: lc.store.puts, 2, "the busy group's checkpoint", poll_s=0.01)
            assert lc.store.puts[:1] == ["repos/r0/state"]
            assert rt.compacted[:1] == [("r0", 13)]
            await until(
                lambda: len(lc.store.puts) >= 2,
                3 - (time.monotonic() - t0),
                "the slow group's checkpoint",
                poll_s=0.01,
            )
            waited = time.monotonic() - t0
            assert lc.store.puts == ["repos/r0/state", "repos/r1/state"]
            assert waited >= 0.25, waited
            # done: the two groups are quiet again, and so is the checkpointer
            checks = cp.checks
            await asyncio.sleep(0.5)  # the point: a quiet time with no check
            assert cp.checks == checks
            assert rt.leader_checks < 20
            # and an interval after its checkpoint a settled group costs nothing here
            # (issue 19: no mark per group ever led, no timer per group)
            assert not cp._tracked and not cp._wheel and not cp._now
        finally:
            cp.stop()
            await asyncio.wait_for(task, 2)

    asyncio.run(scenario())


def test_entries_count_from_the_last_checkpoint_before_its_compaction_lands() -> None:
    """A checkpoint's compaction reaches the group's log a round later; entries applied
    meanwhile are counted from the checkpoint, not from the log's older start, so a
    busy group is not checkpointed twice for one batch of entries."""
    g = FakeGroup("r0")
    rt = FakeRuntime([g])
    rt.lands = False
    lc = FakeLifecycle(rt)
    cp = Checkpointer(
        cast(Lifecycle, lc), every_entries=10, interval_s=30.0, clock=time.monotonic, poll_s=0.05
    )

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(cp.run())
        try:
            bump(g, 12)
            cp.changed(g)
            await until(lambda: lc.store.puts, 2, "the entries rule's checkpoint", poll_s=0.01)
            assert rt.compacted == [("r0", 13)] and g.mem.first_index() == 1
            bump(g, 5)  # 17 past the log's start, 5 past the checkpoint
            cp.changed(g)
            await asyncio.sleep(0.2)  # the point: no second checkpoint for these 5
            assert lc.store.puts == ["repos/r0/state"] and lc.reads == 1
            bump(g, 5)  # 10 past the checkpoint: due
            cp.changed(g)
            await until(lambda: len(lc.store.puts) == 2, 2, "the next checkpoint", poll_s=0.01)
            assert rt.compacted == [("r0", 13), ("r0", 23)]
        finally:
            cp.stop()
            await asyncio.wait_for(task, 2)

    asyncio.run(scenario())


def test_a_follower_compacts_its_copy_once_the_object_holds_its_state() -> None:
    """A follower never writes the object, and its log used to be compacted never: a
    group with more entries past its compaction point than a wake replays then never
    hibernated there (issue 19). It looks an interval after a change and compacts to
    its applied state once the leader's checkpoint holds it, then forgets the group."""
    g = FakeGroup("r0")
    rt = FakeRuntime([g])
    rt.leading = False
    lc = FakeLifecycle(rt)
    cp = Checkpointer(
        cast(Lifecycle, lc), every_entries=10, interval_s=0.2, clock=time.monotonic, poll_s=0.05
    )

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(cp.run())
        try:
            bump(g, 80)  # past the entries rule too: that one is the leader's
            cp.changed(g)
            assert not cp._now
            # an interval on, the object is older than the follower's state: no compaction
            await until(lambda: lc.reads >= 1, 2, "the follower's first look", poll_s=0.01)
            assert rt.compacted == [] and g in cp._tracked
            lc.object = live(81)  # the leader's checkpoint lands
            await until(lambda: rt.compacted, 2, "the follower's compaction", poll_s=0.01)
            assert rt.compacted == [("r0", 81)] and g.mem.first_index() == 82
            assert lc.store.puts == [] and cp.written == 0 and cp.followed == 1
            await until(lambda: not cp._tracked, 2, "the settled group forgotten", poll_s=0.01)
            assert not cp._wheel and not cp._now
        finally:
            cp.stop()
            await asyncio.wait_for(task, 2)

    asyncio.run(scenario())


def test_a_quiet_group_is_settled_before_it_sleeps() -> None:
    """A group about to hibernate with a change its object may not hold is settled
    first (checkpoints.py, "Quiet groups"): the leader checkpoints it and a follower
    looks at once, not an interval later, when the group would have to be woken for
    it (issue 19: the pushes of five minutes before kept 94 groups awake on every voter
    of an idle 10,000-repository fleet). The sleep is refused until then, at most
    ``QUIET_TRIES_MAX`` times."""
    lead, follow = FakeGroup("r0"), FakeGroup("r1")
    lead.mem.compacted = follow.mem.compacted = 1  # checkpointed where they stand
    rt = FakeRuntime([lead, follow])
    lc = FakeLifecycle(rt)
    cp = Checkpointer(
        cast(Lifecycle, lc), every_entries=100, interval_s=300.0, clock=time.monotonic
    )
    assert rt.may_sleep == cp.settled

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(cp.run())
        try:
            assert cp.settled(lead)  # nothing past its checkpoint: it may sleep
            bump(lead, 3)
            cp.changed(lead)
            assert not cp.settled(lead)  # the multi-Raft layer asks: not yet
            await until(lambda: lc.store.puts, 2, "the quiet group's checkpoint", poll_s=0.01)
            assert lc.store.puts == ["repos/r0/state"] and rt.compacted == [("r0", 4)]
            assert cp.settled(lead) and not cp._quiet
            # a follower: its looks find the object older until the leader's swap lands
            rt.leading = False
            bump(follow, 3)
            cp.changed(follow)
            assert not cp.settled(follow)
            await until(lambda: lc.reads >= 2, 2, "the follower's look", poll_s=0.01)
            assert rt.compacted == [("r0", 4)]
            assert not cp.settled(follow)
            lc.object = live(4)
            await until(lambda: len(rt.compacted) == 2, 2, "the follower's compaction")
            assert rt.compacted[1] == ("r1", 4) and cp.settled(follow)
            # a group that cannot be settled sleeps after QUIET_TRIES_MAX refusals
            bump(follow, 1)
            cp.changed(follow)
            for _ in range(QUIET_TRIES_MAX):
                reads = lc.reads
                assert not cp.settled(follow)
                assert not cp.settled(follow)  # its look under way: not another try
                await until(lambda r=reads: lc.reads > r, 2, "the next look", poll_s=0.01)
                await until(lambda: cp._busy is None, 2, "the look done", poll_s=0.01)
            assert cp.settled(follow) and not cp._quiet
            assert lc.store.puts == ["repos/r0/state"]  # a follower never writes
        finally:
            cp.stop()
            await asyncio.wait_for(task, 2)

    asyncio.run(scenario())
