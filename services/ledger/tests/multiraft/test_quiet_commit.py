"""Quiet commits in the multi-Raft layer (docs/raft.md, "Quiet commits").

An idle leader quiesces at its next Ready, not at the next tick, and its groups run
the core with ``quiet_commit``: one commit on a quiet group of three voters costs six
Raft messages (two appends, two acknowledgements, two quiesce heartbeats that carry
the commit), where etcd's flow with a tick during the commit costs fourteen. Those
messages were most of a commit's CPU under load (bench.ledger, docs/benchmarks.md).

Randomised tests print their seed; replay with ENROUTE_SEED=<n>.
"""

from __future__ import annotations

import os

import pytest
from mrsim import Cluster

from enroute_ledger.multiraft import Batch


@pytest.fixture
def seed() -> int:
    s = int(os.environ.get("ENROUTE_SEED", "5"))
    print(f"seed={s}")
    return s


def _items(queue: list[Batch]) -> int:
    return sum(len(b.messages) + len(b.heartbeats) + len(b.heartbeat_responses) for b in queue)


def _one_commit(c: Cluster, tick_at: int) -> int:
    """Messages and heartbeats one commit on the quiet first group sends until every
    member applied it and the group is quiet again; a tick after round ``tick_at``."""
    g = c.groups[0]
    assert c.propose(g, b"x")
    sent = 0
    for i in range(12):
        c.run_round(tick=i == tick_at)
        sent += _items(c.queue)
    assert c.holds(g, b"x", c.ids)
    c.run_round()  # followers leave the awake set on a tick
    sent += _items(c.queue)
    assert c.all_quiet()
    return sent


@pytest.mark.parametrize("tick_at", [None, 0, 1, 2])
def test_a_commit_on_a_quiet_group_costs_six_messages(seed: int, tick_at: int | None) -> None:
    costs = {}
    for quiet in (True, False):
        c = Cluster(3, 1, seed, heartbeat=1, quiet_commit=quiet)
        c.run_until(lambda c=c: c.all_led() and c.all_quiet(), 300)
        costs[quiet] = _one_commit(c, -1 if tick_at is None else tick_at)
        c.check_applied_prefixes()
    assert costs[True] == 6, costs
    assert costs[False] >= 10, costs  # the flag is what saves them


def test_groups_under_steady_load_commit_everywhere_and_go_quiet(seed: int) -> None:
    c = Cluster(3, 40, seed, heartbeat=1)
    c.run_until(c.all_led, 300)
    for k in range(5):
        c.commit_all(c.groups, b"k%d-" % k, 300)
    c.run_until(c.all_quiet, 100)
    c.check_applied_prefixes()
    for g in c.groups:
        # every member's commit index reached the last entry: learned without appends
        commits = {c.nodes[n].commit_of(g) for n in c.ids}
        assert len(commits) == 1, (g, commits)


def test_a_follower_learns_the_commit_while_the_group_cannot_quiesce(seed: int) -> None:
    c = Cluster(3, 1, seed, heartbeat=1)
    c.run_until(lambda: c.all_led() and c.all_quiet(), 300)
    g = c.groups[0]
    lead = c.leader(g, c.ids[0])
    assert lead is not None
    down, up = (n for n in c.ids if n != lead)
    c.cut.add(down)
    assert c.propose(g, b"x")
    c.run_until(lambda: c.holds(g, b"x", [lead, up]), 6)
