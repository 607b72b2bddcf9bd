"""Hibernation in the multi-Raft layer (docs/raft.md, "Hibernation"), in a seeded simulation.

Quiet groups give up their Raft objects; a proposal, a message, a peer going
down or coming back wakes them from the durable log, and nothing is lost or
applied twice. Randomised tests print their seed; replay with ENROUTE_SEED=<n>.
"""

from __future__ import annotations

import contextlib
import os

import pytest
from mrsim import Cluster

from enroute_core.base.errors import NotFound, ProposalDropped
from enroute_core.base.ids import Incarnation, NodeId
from enroute_ledger.multiraft import GroupId, MultiRaft, MultiRaftConfig
from enroute_ledger.raft import ConfState, MemoryStorage, RaftConfig

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)
GROUPS = 120


@pytest.fixture
def seed() -> int:
    s = int(os.environ.get("ENROUTE_SEED", "11"))
    print(f"seed={s}")
    return s


def all_asleep(c: Cluster, n: int = GROUPS) -> bool:
    return all(c.nodes[x].hibernated_count() == n for x in c.live())


def test_quiet_groups_hibernate_and_wake_for_work(seed: int) -> None:
    c = Cluster(3, GROUPS, seed, hibernate_after=5)
    c.run_until(c.all_led, 300)
    c.commit_all(c.groups, b"a", 300)
    c.run_until(lambda: c.all_quiet() and all_asleep(c), 300)
    for mr in c.nodes.values():
        assert not mr._nodes, "hibernated groups keep no RawNode"
        assert mr.group_count() == GROUPS
    # views answer without waking anything
    woken_asleep = [mr.stats.woken for mr in c.nodes.values()]
    leads = {g: c.leader(g, N1) for g in c.groups}
    assert all(lead is not None for lead in leads.values())
    assert sum(c.nodes[N1].is_leader(g) for g in c.groups) == c.nodes[N1].leader_counts()[N1]
    assert [mr.stats.woken for mr in c.nodes.values()] == woken_asleep
    # a proposal wakes its group on the leader, which wakes the followers by message
    woken_before = sum(mr.stats.woken for mr in c.nodes.values())
    c.commit_all(c.groups[:10], b"b", 200)
    woken = sum(mr.stats.woken for mr in c.nodes.values()) - woken_before
    assert 10 <= woken <= 30, woken
    c.check_applied_prefixes()
    # the woken groups keep their leaders (they came back in their roles) and sleep again
    assert all(c.leader(g, N2) == leads[g] for g in c.groups)
    c.run_until(lambda: c.all_quiet() and all_asleep(c), 300)


def test_a_peer_down_leaves_its_hibernated_groups_asleep_until_work_wakes_them(
    seed: int,
) -> None:
    """docs/raft.md, "A leader down or stopped": a voter that stops (or fails) while
    leading thousands of hibernated groups must not make its peers wake them all; a
    group woken for work finds its leader down, keeps time and elects (Raft §5.2)."""
    c = Cluster(3, GROUPS, seed + 1, hibernate_after=5)
    c.run_until(c.all_led, 300)
    c.commit_all(c.groups, b"a", 300)
    c.run_until(lambda: c.all_quiet() and all_asleep(c), 400)
    led_by_3 = [g for g in c.groups if c.leader(g, N1) == N3]
    assert led_by_3
    c.cut.add(N3)
    c.run_until(lambda: not c.nodes[N1].is_alive(N3) and not c.nodes[N2].is_alive(N3), 400)
    woken = [c.nodes[n].stats.woken for n in (N1, N2)]
    for _ in range(4 * 10):  # four election timeouts: nothing to elect for
        c.run_round()
    assert [c.nodes[n].stats.woken for n in (N1, N2)] == woken
    assert all(c.nodes[n].hibernated_count() == GROUPS for n in (N1, N2))
    assert not c.all_led()
    # work on a survivor wakes each group there (a proposal forwarded to the dead
    # leader is lost; the client retries), and the woken groups elect
    for g in led_by_3:
        with contextlib.suppress(ProposalDropped):
            c.nodes[N1].propose(g, b"wake")
    c.run_until(c.all_led, 400)
    assert all(c.leader(g, N1) in (N1, N2) for g in led_by_3)
    c.commit_all(led_by_3, b"c", 300)
    c.check_applied_prefixes()
    # node 3 comes back: it is caught up, and everything goes back to sleep
    c.cut.clear()
    c.run_until(lambda: c.holds(led_by_3[0], b"c" + led_by_3[0].repo, c.ids), 300)
    c.run_until(lambda: c.all_quiet() and all_asleep(c), 600)
    c.check_applied_prefixes()


def test_drop_and_unknown_groups_with_hibernation() -> None:
    c = Cluster(3, 4, 3, hibernate_after=3)
    c.run_until(c.all_led, 300)
    c.run_until(lambda: all_asleep(c, 4), 300)
    mr = c.nodes[N1]
    g = c.groups[0]
    assert mr.is_hibernated(g)
    mr.drop_group(g)
    assert not mr.is_hibernated(g) and mr.group_count() == 3
    with pytest.raises(NotFound):
        mr.raw_node(g)
    # a message for a dropped group is dropped, not woken
    assert mr.lead_of(g) is None and mr.term_of(g) == -1 and mr.commit_of(g) == -1


def lead_truth(c: Cluster, mr: MultiRaft) -> dict[NodeId, int]:
    """Groups led by each node as ``mr`` sees them, from its views that never wake."""
    counts = dict.fromkeys(c.ids, 0)
    for g in c.groups:
        lead = mr.lead_of(g)
        if lead is not None:
            counts[lead] += 1
    return counts


def test_a_sleeping_group_is_counted_by_its_record_alone() -> None:
    """Leader counts (scenario 4) cover every hosted group, asleep or not, but a sleeping
    group has no entry in the map of awake groups' leaders: its record names its leader
    (issue 19: one dict entry less per idle repository). Waking and dropping groups,
    asleep or awake, keep the counts exact."""
    c = Cluster(3, 12, 5, hibernate_after=3)
    c.run_until(c.all_led, 300)
    c.run_until(lambda: c.all_quiet() and all_asleep(c, 12), 300)
    for mr in c.nodes.values():
        assert not mr._lead
        assert mr.leader_counts() == lead_truth(c, mr)
    c.commit_all(c.groups[:4], b"w", 200)  # wakes them
    for mr in c.nodes.values():
        assert mr.leader_counts() == lead_truth(c, mr)
    mr = c.nodes[N1]
    asleep = next(g for g in c.groups if mr.is_hibernated(g))
    mr.drop_group(asleep)
    awake = next(g for g in c.groups[:4] if not mr.is_hibernated(g))
    mr.drop_group(awake)
    assert mr.leader_counts() == lead_truth(c, mr)
    assert sum(mr.leader_counts().values()) == 10
    c.run_until(lambda: c.nodes[N2].hibernated_count() == 12, 400)
    for mr in c.nodes.values():
        assert not mr._lead
        assert mr.leader_counts() == lead_truth(c, mr)


def test_a_woken_group_never_has_less_than_its_durable_hard_state() -> None:
    """The disk's term moved on (as after a vote persisted elsewhere in the driver):
    the woken node takes the durable term and keeps time instead of its old role."""
    c = Cluster(3, 2, 5, hibernate_after=3)
    c.run_until(c.all_led, 300)
    c.run_until(lambda: all_asleep(c, 2), 300)
    g = c.groups[0]
    lead = c.leader(g, N1)
    assert lead is not None
    follower = next(n for n in c.ids if n != lead)
    mr = c.nodes[follower]
    h = mr._sleeping[g]
    st = c.storages[(follower, g)]
    st.set_hard_state(type(st.hard_state)(h.term + 1, None, st.hard_state.commit))
    node = mr.raw_node(g)  # wakes
    assert node.raft.term == h.term + 1
    assert not node.quiesced and node.raft.lead is None
    assert mr.active_count() >= 1  # it keeps time again
    c.run_until(c.all_led, 300)


def test_leader_spread_counts_hibernated_groups() -> None:
    """The fair share of leader spreading (scenario 4) is over every hosted group, asleep
    or not: 4 groups on 3 nodes allow 2 + slack 1 each. Node 1 hands its 2 groups to
    node 2 (the preStop hook of a rolling upgrade); node 2 then leads 3, within its
    share, and keeps them. Counting awake groups only (the 2 just moved plus whatever
    woke), node 2 judged 3 too many and handed one back to the drained node 1."""
    c = Cluster(3, 4, 7, hibernate_after=5)
    for g, n in zip(c.groups, (N1, N1, N2, N3), strict=True):
        c.nodes[n].campaign(g)
    c.run_until(c.all_led, 300)
    assert c.nodes[N1].leader_counts() == {N1: 2, N2: 1, N3: 1}
    c.run_until(lambda: c.all_quiet() and all_asleep(c, 4), 300)
    for g in c.groups[:2]:
        c.nodes[N1].transfer_leader(g, N2)
    c.run_until(lambda: c.all_led() and c.nodes[N2].leader_counts()[N2] == 3, 300)
    for _ in range(300):  # long enough for several spreading passes and a hibernation
        c.run_round()
        assert c.nodes[N2].leader_counts()[N1] == 0, "a group went back to the drained node"
    assert c.all_led()


def test_config_checks_hibernation_fields() -> None:
    from enroute_core.base.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        MultiRaftConfig(RaftConfig(N1), hibernate_after_ticks=-1)
    with pytest.raises(InvalidArgument):
        MultiRaftConfig(RaftConfig(N1), hibernations_per_tick_max=0)
    mr = MultiRaft(
        N1,
        [N1],
        lambda g, vs: MemoryStorage(conf_state=ConfState(vs)),
        MultiRaftConfig(RaftConfig(N1), hibernate_after_ticks=1),
    )
    gid = GroupId(b"solo", Incarnation(1))
    mr.create_group(gid, [N1])
    for _ in range(30):  # no hooks: groups never hibernate
        mr.tick()
        if mr.has_ready():
            mr.advance(mr.ready())
    assert mr.hibernated_count() == 0


def test_a_voter_without_peers_keeps_no_set_of_the_groups_it_leads() -> None:
    """Only peers need the groups a voter leads (spreading, a peer down or back), so a
    single voter keeps no such set (issue 19: a map entry per idle repository); its
    first peer brings it back, awake and sleeping groups alike, and its last peer's
    removal empties it."""
    c = Cluster(1, 6, 4, hibernate_after=3)
    mr = c.nodes[N1]
    c.run_until(c.all_led, 300)
    c.run_until(lambda: mr.hibernated_count() == 6, 400)
    assert not mr._led and mr.leader_counts() == {N1: 6}
    mr.wake(c.groups[0])
    mr.set_peers([N2])
    assert set(mr._led) == set(c.groups)
    assert mr.leader_counts()[N1] == 6
    mr.set_peers([])
    assert not mr._led and mr.leader_counts()[N1] == 6
