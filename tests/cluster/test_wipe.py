"""A ledger voter loses its disk (data directory wiped) and comes back empty.

Its own module, so its own cluster: if the wiped voter cannot rejoin, the
scenario keeps it down and checks the other two go on, and no other scenario
runs on a degraded cluster.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import replace
from pathlib import Path

import pytest
from cluster_scenario import run_scenario, seeds

from enroute_testing.cluster import LEDGERS, Cluster, readyz
from enroute_testing.waiting import WaitTimeout, wait_until
from enroute_testing.workload import Workload, WorkloadConfig

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LOAD = WorkloadConfig(seed=0, repos=(), clients=4, duration_s=8.0, ops_max=120, op_timeout_s=20.0)
REJOIN_S = 20.0
outcomes: dict[int, str] = {}


@pytest.mark.parametrize("seed", seeds())
def test_voter_disk_wiped(cluster: Cluster, tmp_path: Path, seed: int) -> None:
    def fault(c: Cluster, w: Workload, rng: random.Random) -> None:
        time.sleep(1.0 + rng.random())
        leader = c.leader_of(w.config.repos[0])
        followers = [v for v in LEDGERS if v != leader and c.members[v].alive()]
        # a voter that failed to rejoin before is the one wiped again (never a second one)
        victim = next(iter(c.keep_down), None) or rng.choice(followers or list(LEDGERS))
        print(f"wiping {victim} (leader {leader})")
        c.wipe(victim)
        time.sleep(1.0 + rng.random())
        c.restart(victim, wait=False)
        # REJOIN_S counts from the process serving: under load, starting it can take longer
        with contextlib.suppress(RuntimeError, TimeoutError):
            c.wait_ready(victim)
        with contextlib.suppress(WaitTimeout):  # judged below: rejoined, or kept down
            wait_until(
                lambda: not c.members[victim].alive() or readyz(c.members[victim].http, 1.0) == 200,
                REJOIN_S,
                f"{victim} ready again or gone",
                poll_s=0.2,
            )
        if c.members[victim].alive() and readyz(c.members[victim].http, 1.0) == 200:
            outcomes[seed] = f"{victim} rejoined"
            c.keep_down.discard(victim)
        else:
            outcomes[seed] = f"{victim} did not rejoin: {c.members[victim].log_tail()[-600:]}"
            c.kill(victim)
            c.keep_down.add(victim)  # the majority must go on without it
            print(outcomes[seed])

    workload = run_scenario("wipe", cluster, tmp_path, seed, fault, config=replace(LOAD))
    print(f"wipe outcome (seed {seed}): {outcomes.get(seed)}")
    victim = outcomes.get(seed, "").split(" ", 1)[0]
    if victim and victim not in cluster.keep_down:
        _assert_caught_up(cluster, victim, workload.config.repos)


def _assert_caught_up(cluster: Cluster, victim: str, repos: tuple[str, ...]) -> None:
    """The rejoined voter holds every repository's group at the version the others have."""

    def versions(name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for repo in repos:
            for g in cluster.ledger_status(name, repo)["raft_groups"]:
                out[g["repo"]] = max(out.get(g["repo"], 0), int(g["version"]))
        return out

    seen: list[tuple[dict[str, int], dict[str, int]]] = []

    def caught_up() -> bool:
        others = [versions(v) for v in LEDGERS if v != victim and v not in cluster.keep_down]
        mine = versions(victim)
        best = {r: max(o.get(r, 0) for o in others) for r in repos}
        seen.append((mine, best))
        return all(mine.get(r, 0) >= best[r] for r in repos)

    wait_until(
        caught_up,
        REJOIN_S,
        f"{victim} at the others' versions",
        poll_s=0.5,
        explain=lambda: f"{victim} vs the others: {seen[-1]}",
    )
