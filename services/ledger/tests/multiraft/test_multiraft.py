"""MultiRaft (DESIGN.md, Processes: multi-Raft; docs/raft.md duty 12) in a seeded simulation.

Randomised tests print their seed; replay with ENROUTE_SEED=<n>.
"""

from __future__ import annotations

import os

import pytest
from mrsim import Cluster, group_ids

from enroute_core.base.errors import AlreadyExists, InvalidArgument, NotFound
from enroute_core.base.ids import NodeId, Term
from enroute_ledger.multiraft import Batch, GroupMessage, Heartbeat, MultiRaft, MultiRaftConfig
from enroute_ledger.raft import ConfState, MemoryStorage, Message, MessageType, RaftConfig, Role
from enroute_ledger.raft.rawnode import RawNode

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


@pytest.fixture
def seed() -> int:
    s = int(os.environ.get("ENROUTE_SEED", "7"))
    print(f"seed={s}")
    return s


def test_elect_commit_coalesce_and_quiesce(seed: int) -> None:
    c = Cluster(3, 300, seed)
    c.run_until(c.all_led, 300)
    c.commit_all(c.groups[:200], b"a", 200)
    c.run_until(c.all_quiet, 300)
    # One batch per node pair per Ready, however many groups: heartbeats are coalesced.
    assert c.uncoalesced_heartbeats == 0
    assert c.heartbeats_in_batch_max >= 50
    assert sum(mr.stats.batches_out for mr in c.nodes.values()) <= 6 * c.rounds
    # A tick of an all-quiet cluster: no group ticks, only empty liveness beats.
    before = {n: mr.stats.group_ticks for n, mr in c.nodes.items()}
    for _ in range(5):
        c.run_round()
        assert set(c.round_pairs.values()) <= {1}
        assert all(b.is_empty for b in c.queue)
    assert {n: mr.stats.group_ticks for n, mr in c.nodes.items()} == before
    # A proposal wakes its group, commits, and the group goes quiet again.
    c.commit_all(c.groups[-1:], b"b", 100)
    c.run_until(c.all_quiet, 100)
    c.check_applied_prefixes()
    assert c.leader_of_term


def test_failover_and_leader_spread(seed: int) -> None:
    c = Cluster(3, 600, seed)
    for g in c.groups:
        c.nodes[N1].campaign(g)  # node 1 leads everything at first
    c.run_until(c.all_led, 200)
    assert c.nodes[N1].leader_counts()[N1] > 500

    def spread(nodes: list[NodeId], fair: int) -> bool:
        counts = c.nodes[nodes[0]].leader_counts()
        return c.all_led() and all(counts[n] <= fair + 1 for n in nodes)

    c.run_until(lambda: spread([N1, N2, N3], 200) and c.all_quiet(), 600)
    assert sum(mr.stats.transfers for mr in c.nodes.values()) >= 150
    led_by_3 = [g for g in c.groups if c.leader(g, N1) == N3]
    assert led_by_3
    # Node 3 goes silent: its quiet groups wake on nodes 1 and 2 and elect there.
    c.cut.add(N3)
    c.run_until(c.all_led, 300)
    assert all(c.leader(g, N1) in (N1, N2) for g in led_by_3)
    assert c.nodes[N1].stats.nodes_down == 1
    c.commit_all(led_by_3[:100] + c.groups[:50], b"c", 200)
    c.run_until(lambda: spread([N1, N2], 300), 300)
    c.check_applied_prefixes()


def test_codec_on_the_wire(seed: int) -> None:
    c = Cluster(3, 200, seed + 1, use_codec=True)
    c.run_until(c.all_led, 300)
    c.commit_all(c.groups, b"d", 200)
    c.check_applied_prefixes()


def _single_node(n_groups: int) -> MultiRaft:
    def factory(_g: object, voters: frozenset[NodeId]) -> MemoryStorage:
        return MemoryStorage(conf_state=ConfState(voters))

    cfg = MultiRaftConfig(RaftConfig(N1, election_ticks=10, heartbeat_ticks=2))
    mr = MultiRaft(N1, [], factory, cfg)
    for g in group_ids(n_groups):
        mr.create_group(g, [N1])
    return mr


def _drive(mr: MultiRaft) -> None:
    mr.tick()
    if mr.has_ready():
        nr = mr.ready()
        for gr in nr.groups:
            st = mr.storage(gr.group)
            assert isinstance(st, MemoryStorage)
            st.append(gr.ready.entries)
            if gr.ready.hard_state is not None:
                st.set_hard_state(gr.ready.hard_state)
        mr.advance(nr)


def test_ten_thousand_idle_groups_cost_nothing_per_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    mr = _single_node(10_000)
    for g in mr.groups():
        mr.campaign(g)
    _drive(mr)  # every group awake: one core tick each
    for _ in range(5):
        _drive(mr)
    assert mr.active_count() == 0
    calls = 0
    real_tick = RawNode.tick

    def counting_tick(self: RawNode) -> None:
        nonlocal calls
        calls += 1
        real_tick(self)

    monkeypatch.setattr(RawNode, "tick", counting_tick)
    ticks_before = mr.stats.group_ticks
    for _ in range(100):
        mr.tick()
    assert calls == 0 and mr.stats.group_ticks == ticks_before
    assert not mr.has_ready()
    mr.propose(group_ids(1)[0], b"wake")
    mr.tick()
    assert calls == 1 and mr.active_count() == 1


def test_unreachable_node_wakes_only_its_quiet_groups(seed: int) -> None:
    c = Cluster(3, 60, seed)
    c.run_until(lambda: c.all_led() and c.all_quiet(), 400)
    mr = c.nodes[N1]
    led_by_2 = sum(c.leader(g, N1) == N2 for g in c.groups)
    assert led_by_2 > 0
    mr.report_node_unreachable(N2)
    assert mr.active_count() == led_by_2
    assert not mr.is_alive(N2)
    with pytest.raises(InvalidArgument):
        mr.report_node_unreachable(NodeId(9))


def test_batches_checked_and_heartbeats_expanded(seed: int) -> None:
    c = Cluster(3, 5, seed)
    c.run_until(c.all_led, 300)
    mr = c.nodes[N1]
    g = c.groups[0]
    mr.step(Batch(N2, N3, heartbeats=(Heartbeat(g, Term(99)),)))  # not for us
    assert mr.stats.batches_dropped == 1
    assert mr.raw_node(g).raft.term < 99
    forged = Message(MessageType.APP, N1, N3, Term(99))
    mr.step(Batch(N2, N1, messages=(GroupMessage(g, forged),)))  # from_ disagrees
    assert mr.stats.messages_dropped == 1
    mr.step(Batch(N2, N1, heartbeats=(Heartbeat(g, Term(99), quiesce=False),)))
    r = mr.raw_node(g).raft
    assert (r.term, r.lead, r.role) == (99, N2, Role.FOLLOWER)


def test_group_lifecycle_errors() -> None:
    mr = _single_node(2)
    g0, g1 = group_ids(2)
    with pytest.raises(AlreadyExists):
        mr.create_group(g0, [N1])
    mr.drop_group(g1)
    with pytest.raises(NotFound):
        mr.propose(g1, b"x")
    assert list(mr.groups()) == [g0]
    with pytest.raises(InvalidArgument):
        MultiRaftConfig(RaftConfig(N1), transfers_per_tick_max=0)
