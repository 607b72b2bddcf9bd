"""The frame every cluster scenario shares: seeded load, a fault, healing, the checker."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from enroute_testing.cluster import Cluster
from enroute_testing.history import Record, rejected_but_applied
from enroute_testing.workload import (
    Workload,
    WorkloadConfig,
    check,
    dump,
    log_reliability,
    reliability_line,
    summary,
)

CI_SEEDS = (1, 2, 3)
NIGHTLY_SEEDS = tuple(range(1001, 1021))


def seeds() -> list[object]:
    """ENROUTE_SEED=N runs that seed alone; otherwise 3 seeds in CI and 20 in nightly."""
    chosen = os.environ.get("ENROUTE_SEED")
    if chosen:
        return [int(chosen)]
    return [*CI_SEEDS, *(pytest.param(s, marks=pytest.mark.nightly) for s in NIGHTLY_SEEDS)]


def nightly(seed: int) -> bool:
    return seed in NIGHTLY_SEEDS


Fault = Callable[[Cluster, Workload, random.Random], None]


def run_scenario(
    name: str,
    cluster: Cluster,
    tmp_path: Path,
    seed: int,
    fault: Fault,
    *,
    config: WorkloadConfig | None = None,
    repos: int = 2,
) -> Workload:
    """Load the cluster, inject ``fault`` from this thread meanwhile, heal, then check.

    Every failure fails: writes answered "rejected" that a later read shows applied
    (docs/reliability.md "Failures found") are no longer a known failure since writes
    carry request ids (docs/rpc.md, "Request ids"). With ENROUTE_RELIABILITY_LOG=FILE
    every checked run appends its counts to FILE (docs/reliability.md, "Results").
    """
    print(f"scenario {name}: ENROUTE_SEED={seed}")
    started = time.monotonic()
    cluster.ensure_running()
    base = config or WorkloadConfig(seed=seed, repos=())
    names = tuple(f"{name}-{seed}-{i}" for i in range(repos))
    workload = Workload(cluster.url, tmp_path / "work", replace(base, seed=seed, repos=names))
    rng = random.Random(seed)
    workload.start()
    try:
        fault(cluster, workload, rng)
    finally:
        cluster.heal()
        workload.join()
    cluster.ensure_running()
    report = check(workload, tmp_path / "final")
    stats = summary(workload)
    print(json.dumps(stats))
    log_reliability(reliability_line(name, seed, workload, report, time.monotonic() - started))
    dump(workload, tmp_path / "history.jsonl")  # also for the scenario's own assertions
    if not report.ok:
        wrong = rejected_but_applied(workload.history.records)
        if wrong:
            print(f"{len(wrong)} writes answered 'rejected' were applied, e.g. {wrong[0]!r}")
        logs = "\n".join(f"--- {m.name}\n{m.log_tail()[-1500:]}" for m in cluster.members.values())
        pytest.fail(
            f"scenario {name} failed with ENROUTE_SEED={seed}\n"
            f"{report.explain(workload.history.records)}\n"
            f"history: {tmp_path / 'history.jsonl'}\n{logs}",
            pytrace=False,
        )
    return workload


def wait_open(workload: Workload, kinds: tuple[str, ...], timeout_s: float = 10.0) -> Record | None:
    """An operation of ``kinds`` in flight right now (None if none came in ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for rec in reversed(workload.history.records):
            if rec.kind in kinds and not rec.how:
                return rec
        time.sleep(0.01)
    return None


def wait_written(workload: Workload, repos: tuple[str, ...], timeout_s: float) -> bool:
    """Wait until every repository in ``repos`` has an acknowledged write (False: timed out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and workload.running():
        done = {
            r.repo
            for r in workload.history.records
            if r.kind in ("push", "api_commit") and r.how == "ok" and r.output is True
        }
        if done.issuperset(repos):
            return True
        time.sleep(0.05)
    return False


def ops_between(workload: Workload, kinds: tuple[str, ...], start_s: float, end_s: float,
                how: str = "ok") -> int:  # fmt: skip
    """Operations of ``kinds`` that began and ended inside [start_s, end_s] with ``how``."""
    return sum(
        1
        for r in workload.history.records
        if r.kind in kinds and r.how == how and start_s <= r.call_s and r.ret_s <= end_s
    )


def compute_of(cluster: Cluster, repo: str) -> str:
    """The compute gitproto routes ``repo`` to first (rendezvous over its configured members)."""
    from enroute_gitproto.routing import rendezvous_order

    members = list(cluster.config_of("gitproto")["compute"]["members"])
    first = rendezvous_order(repo, members)[0]
    return ("compute-1", "compute-2")[members.index(first)]
