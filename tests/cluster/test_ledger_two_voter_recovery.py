"""Two-voter recovery drill (docs/raft.md, "Recovering a two-voter ledger"; issue 21).

Two clients push and commit without pause. The ledger is shrunk to two voters
(``enroute cluster ledger-remove 3``), then voter 2's disk is wiped
(``ledger-wipe 2``): it comes back blank, and no group of the repositories that
existed has a quorum, so writes stall. ``enroute cluster ledger-replace 2
--recover-from 1`` (``enroute ledger replace 2 ADDRESS --recover-from 1``: voter
1's consent) has voter 1 take every group over alone and a new machine join
under a new id. Every acknowledged write must be there afterwards and the history
checker must find the ref history linearizable (``cluster_scenario``); the record
ends with voters {1, new} and ids 2 and 3 retired for good, and the survivor,
restarted, still has the members {1, new} in every group (they come from its log).

Its own module, so its own cluster: the voters it removes stay removed.
CI runs one seed; ENROUTE_SEED=N replays one.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from cluster_scenario import ops_between, run_scenario

from enroute_testing import cluster_ledger
from enroute_testing.cluster import Cluster
from enroute_testing.waiting import wait_until
from enroute_testing.workload import Workload, WorkloadConfig

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LOAD = WorkloadConfig(
    seed=0,
    repos=(),
    clients=2,
    duration_s=600.0,  # stopped once the recovery is done
    ops_max=3000,
    op_timeout_s=30.0,
    pace_s=0.5,
    mix=(("push", 45), ("api_commit", 20), ("fetch", 15), ("ls_refs", 20)),
)
RECOVERY_TIMEOUT_S = 300.0
"""The recovery of the drill's few groups takes seconds; a skipped force never ends."""


def _blank(c: Cluster, node: int) -> int:
    rows = [m for m in cluster_ledger.members(c)["members"] if m["id"] == node]
    return int(rows[0].get("blank") or 0) if rows else 0


@pytest.mark.timeout(900)
def test_wiped_voter_of_two_is_recovered_under_load(cluster: Cluster, tmp_path: Path) -> None:
    seed = int(os.environ.get("ENROUTE_SEED", "1"))
    during: list[float] = []
    said: list[str] = []
    kept: dict[str, int] = {}

    def say(line: str) -> None:
        said.append(line)
        print(line)

    def fault(c: Cluster, w: Workload, rng: random.Random) -> None:
        try:
            drill(c, w, rng)
        finally:
            time.sleep(5.0)  # writes on the recovered ledger
            w.stop()

    def drill(c: Cluster, w: Workload, rng: random.Random) -> None:
        time.sleep(1.0 + rng.random())  # writes under way first
        cluster_ledger.ledger_remove(c, 3, say)
        time.sleep(1.0 + rng.random())
        cluster_ledger.ledger_wipe(c, 2, say)
        wait_until(lambda: _blank(c, 2) > 0, 60, "the wiped voter reports its blank groups")
        started = time.monotonic()
        during.append(w.history.now())
        name = cluster_ledger.ledger_replace(
            c, 2, say, recover_from=1, timeout_s=RECOVERY_TIMEOUT_S
        )
        kept["new"] = cluster_ledger.id_of(c, name)
        during.append(w.history.now())
        print(f"recovered in {time.monotonic() - started:.0f} s")

    workload = run_scenario("recover2", cluster, tmp_path, seed, fault, config=LOAD)
    after = ops_between(workload, ("push", "api_commit"), during[1], float("inf"))
    print(f"{after} writes acknowledged after the recovery")
    assert after >= 1, "nothing was written on the recovered ledger"
    new = kept["new"]
    record = cluster_ledger.members(cluster)["record"]
    assert sorted(int(i) for i in record["voters"]) == [1, new], record
    assert record["target"] is None and "recovery" not in record
    assert {2, 3} <= {int(i) for i in record["retired"]}
    assert any(line.startswith("epoch ") and "recover:" in line for line in said), said
    # the members come from the survivor's log: the same after a restart
    cluster.restart("ledger-1")
    for repo in workload.config.repos:
        groups = cluster.ledger_status("ledger-1", repo)["raft_groups"]
        assert groups and all(g["voters"] == [1, new] for g in groups), groups
