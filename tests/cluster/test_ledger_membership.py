"""Online ledger membership changes under load (docs/raft.md, "Membership changes").

Two clients push and commit without pause while the ledger grows from three
voters to five (``enroute cluster ledger-add``, twice) and shrinks back to three
(``ledger-remove``): first the voter that leads most of the load's groups, then
one more; then one voter is replaced by a new machine (``enroute ledger
replace``) and the disk of a voter added during the drill is wiped
(``ledger-wipe``: it comes back under the id the record gives its address).
Every acknowledged write must be there afterwards and the history checker must
find the ref history linearizable (``cluster_scenario``). CI runs one seed
(about three minutes on a loaded 2-core machine); ENROUTE_SEED=N replays one,
the nightly sweep runs 20.

Its own module, so its own cluster: the voters it removes stay removed.
"""

from __future__ import annotations

import collections
import os
import random
import time
from pathlib import Path

import pytest
from cluster_scenario import NIGHTLY_SEEDS, ops_between, run_scenario

from enroute_testing import cluster_ledger
from enroute_testing.cluster import Cluster
from enroute_testing.workload import Workload, WorkloadConfig

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LOAD = WorkloadConfig(
    seed=0,
    repos=(),
    clients=2,
    duration_s=900.0,  # stopped once the changes are done: load through all of them
    ops_max=5000,
    op_timeout_s=30.0,
    pace_s=0.5,
    mix=(("push", 45), ("api_commit", 20), ("fetch", 15), ("ls_refs", 20)),
)


def drill_seeds() -> list[object]:
    chosen = os.environ.get("ENROUTE_SEED")
    if chosen:
        return [int(chosen)]
    return [1, *(pytest.param(s, marks=pytest.mark.nightly) for s in NIGHTLY_SEEDS)]


def _leaders(c: Cluster, repos: tuple[str, ...]) -> collections.Counter[int]:
    """How many of ``repos``' groups each voter id leads, as a live voter sees it."""
    counts: collections.Counter[int] = collections.Counter()
    for name in cluster_ledger.voter_names(c):
        if name in c.keep_down or not c.members[name].alive():
            continue
        for repo in repos:
            for g in c.ledger_status(name, repo)["raft_groups"]:
                if g["leader"]:
                    counts[int(g["leader"])] += 1
        return counts
    return counts


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", drill_seeds())
def test_ledger_grows_to_five_and_shrinks_back_under_load(
    cluster: Cluster, tmp_path: Path, seed: int
) -> None:
    said: list[str] = []
    removed: list[int] = []

    begun = time.monotonic()

    def say(line: str) -> None:
        said.append(line)
        print(f"[{time.monotonic() - begun:5.0f} s] {line}")

    during: list[float] = []

    def fault(c: Cluster, w: Workload, rng: random.Random) -> None:
        try:
            changes(c, w, rng)
        finally:
            time.sleep(1.0)
            w.stop()

    def changes(c: Cluster, w: Workload, rng: random.Random) -> None:
        time.sleep(1.0 + rng.random())  # writes under way first
        started = time.monotonic()
        during.append(w.history.now())
        for _ in range(2):
            cluster_ledger.ledger_add(c, say)
        voters = [int(i) for i in cluster_ledger.members(c)["record"]["voters"]]
        assert len(voters) == 5, voters
        # computes reach the ledger through the founders they were configured with:
        # keep one founder whatever is removed
        founders = [i for i in voters if i <= 3]
        leads = _leaders(c, w.config.repos)
        order = sorted(voters, key=lambda i: (-leads[i], rng.random()))
        first = next(i for i in order if founders != [i])
        say(f"removing voter {first}, leader of {leads[first]} of {sum(leads.values())} groups")
        cluster_ledger.ledger_remove(c, first, say)
        removed.append(first)
        rest = [i for i in voters if i != first and [f for f in founders if f != first] != [i]]
        second = rng.choice(rest)
        cluster_ledger.ledger_remove(c, second, say)
        removed.append(second)
        # replace one voter by a new machine (a new id), then wipe another one's disk
        voters = [int(i) for i in cluster_ledger.members(c)["record"]["voters"]]
        founders = [i for i in voters if i <= 3]
        old = rng.choice([i for i in voters if founders != [i]])
        cluster_ledger.ledger_replace(c, old, say)
        removed.append(old)
        # the wiped voter is one added here: started blank, it takes its id from the
        # record by its address (test_wipe.py wipes a founder)
        voters = [int(i) for i in cluster_ledger.members(c)["record"]["voters"]]
        cluster_ledger.ledger_wipe(c, rng.choice([i for i in voters if i > 3]), say)
        during.append(w.history.now())
        print(f"membership changes took {time.monotonic() - started:.0f} s")

    workload = run_scenario("membership", cluster, tmp_path, seed, fault, config=LOAD)
    writes = ops_between(workload, ("push", "api_commit"), during[0], during[1])
    print(f"{writes} writes acknowledged while the ledger grew and shrank")
    assert writes >= 4, "the load did not go on through the changes"
    view = cluster_ledger.members_cli(cluster)  # `enroute ledger members --json`
    record = view["record"]
    assert len(record["voters"]) == 3 and record["target"] is None
    assert set(removed) <= {int(i) for i in record["retired"]}
    assert any("groups to change" in line for line in said), said  # progress was shown
    for row in view["members"]:
        assert row["healthy"] and row["off_target"] == 0, row
