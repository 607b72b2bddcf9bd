"""Quiescence with the ledger's own timing: a heartbeat due on every tick
(``heartbeat_ticks=1``, the runtime's default) must not keep idle groups awake.

Randomised tests print their seed; replay with ENROUTE_SEED=<n>.
"""

from __future__ import annotations

import os

import pytest
from mrsim import Cluster, group_ids

from enroute_core.base.ids import NodeId
from enroute_ledger.multiraft import MultiRaft, MultiRaftConfig
from enroute_ledger.raft import ConfState, MemoryStorage, RaftConfig

N1 = NodeId(1)


@pytest.fixture
def seed() -> int:
    s = int(os.environ.get("ENROUTE_SEED", "11"))
    print(f"seed={s}")
    return s


@pytest.mark.parametrize("heartbeat", [1, 2, 3])
def test_idle_groups_quiesce_whatever_the_heartbeat_interval(seed: int, heartbeat: int) -> None:
    c = Cluster(3, 60, seed, heartbeat=heartbeat)
    c.run_until(c.all_led, 300)
    c.commit_all(c.groups[:30], b"x", 200)
    c.run_until(c.all_quiet, 100)
    before = {n: (mr.stats.group_ticks, mr.stats.heartbeats_out) for n, mr in c.nodes.items()}
    for _ in range(20):
        c.run_round()
        assert all(b.is_empty for b in c.queue)
    assert {n: (mr.stats.group_ticks, mr.stats.heartbeats_out) for n, mr in c.nodes.items()} == (
        before
    )
    c.commit_all(c.groups[-1:], b"y", 100)
    c.run_until(c.all_quiet, 100)
    c.check_applied_prefixes()


def test_single_voter_groups_quiesce_with_a_heartbeat_every_tick() -> None:
    def factory(_g: object, voters: frozenset[NodeId]) -> MemoryStorage:
        return MemoryStorage(conf_state=ConfState(voters))

    mr = MultiRaft(N1, [], factory, MultiRaftConfig(RaftConfig(N1, heartbeat_ticks=1)))
    for g in group_ids(500):
        mr.create_group(g, [N1])
        mr.campaign(g)
    for _ in range(5):
        mr.tick()
        while mr.has_ready():
            nr = mr.ready()
            for gr in nr.groups:
                st = mr.storage(gr.group)
                assert isinstance(st, MemoryStorage)
                st.append(gr.ready.entries)
                if gr.ready.hard_state is not None:
                    st.set_hard_state(gr.ready.hard_state)
            mr.advance(nr)
    assert mr.active_count() == 0
    ticks = mr.stats.group_ticks
    for _ in range(50):
        mr.tick()
    assert mr.stats.group_ticks == ticks
