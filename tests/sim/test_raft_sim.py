"""Seeded simulation of the Raft core (docs/raft.md, "Simulation").

Each schedule runs a small cluster through loss, duplication, reordering,
partitions, crashes (with and without losing unsynced writes), restarts,
leadership transfers, compaction, membership changes, quiescence and
hibernation (a quiet node rebuilt from its synced log and record). Safety
(Figure 3 of the Raft paper) is checked after every step, liveness when the
faults stop, and the clients' CAS history must be linearizable.

CI runs seeds 0..999. A failure names its seed; replay it alone with
``ENROUTE_SEED=<n> pytest tests/sim/test_raft_sim.py -k replay``. A larger
sweep runs with ``ENROUTE_SIM_SCHEDULES=20000`` (marked slow).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from raft_sim import Sim, SimFailure, SimParams, SimReport, params_for, run_seed

from enroute_ledger.raft import log as raft_log
from enroute_ledger.raft import raft as raft_core

SCHEDULES = 1000
CHUNK = 50
SEED_BASE = int(os.environ.get("ENROUTE_SIM_SEED_BASE", "0"))


def _run_range(seeds: range, make: Callable[[int], SimParams] = params_for) -> Iterator[SimReport]:
    failures: list[str] = []
    for seed in seeds:
        try:
            yield run_seed(seed, make)
        except SimFailure as e:
            failures.append(str(e))
    assert not failures, f"{len(failures)} of {len(seeds)} schedules failed; first:\n{failures[0]}"


@pytest.mark.parametrize("chunk", range(SCHEDULES // CHUNK))
def test_schedules(chunk: int) -> None:
    lo = SEED_BASE + chunk * CHUNK
    for _ in _run_range(range(lo, lo + CHUNK)):
        pass


def test_replay() -> None:
    seed = int(os.environ.get("ENROUTE_SEED", "4242"))
    print(f"ENROUTE_SEED={seed}")
    report = run_seed(seed)
    print(report)


@pytest.mark.slow
@pytest.mark.skipif(
    "ENROUTE_SIM_SCHEDULES" not in os.environ, reason="set ENROUTE_SIM_SCHEDULES=<n> to sweep"
)
def test_sweep() -> None:
    n = int(os.environ["ENROUTE_SIM_SCHEDULES"])
    for _ in _run_range(range(1_000_000 + SEED_BASE, 1_000_000 + SEED_BASE + n)):
        pass


def test_a_seed_replays_exactly() -> None:
    def one() -> tuple[list[str], dict[str, int], list[object]]:
        sim = Sim(77, params_for(77))
        sim.run()
        return sim.trace, sim.stats, list(sim.history.operations())

    assert one() == one()


def test_schedules_exercise_every_fault() -> None:
    totals: dict[str, int] = {}
    for report in _run_range(range(0, 60)):
        for k, v in report.stats.items():
            totals[k] = totals.get(k, 0) + v
    for what in (
        "lost",
        "duplicated",
        "partition",
        "crash",
        "crash_lossy",
        "transfer",
        "compact",
        "snapshot_delivered",
        "conf_change",
        "conf_applied",
        "quiesce",
        "read_states",
        "op_ok",
        "op_info",
        "op_fail",
        "wipe",
        "readmit",
    ):
        assert totals.get(what, 0) > 0, (what, totals)


def wipe_heavy(seed: int) -> SimParams:
    """Every restart that may wipe does: one lost disk after another, each readmitted."""
    on = seed % 2 == 0
    return SimParams(
        wipes=True, wipe_chance=1.0, membership_changes=False, check_quorum=on, pre_vote=on
    )


def test_wiped_disks_lose_no_committed_entry() -> None:
    """docs/raft.md, "A voter that lost its disk": blank voters neither vote nor count
    until readmitted, so Leader Completeness and linearizability hold through wipes."""
    totals: dict[str, int] = {}
    for report in _run_range(range(SEED_BASE + 5000, SEED_BASE + 5100), wipe_heavy):
        for k, v in report.stats.items():
            totals[k] = totals.get(k, 0) + v
    assert totals.get("wipe", 0) >= 50 and totals.get("readmit", 0) >= 40, totals


# -- the harness finds planted bugs ------------------------------------------------------------


def _first_failure(seeds: range, make: Callable[[int], SimParams] = params_for) -> str:
    for seed in seeds:
        try:
            run_seed(seed, make)
        except SimFailure as e:
            return str(e)
    return ""


def test_finds_a_broken_election_restriction(monkeypatch: pytest.MonkeyPatch) -> None:
    """§5.4.1: without the up-to-date check a stale node wins and committed entries vanish."""
    monkeypatch.setattr(raft_log.RaftLog, "is_up_to_date", lambda self, i, t: True)
    failure = _first_failure(range(200))
    assert "leader completeness" in failure or "differs" in failure, failure


def test_finds_double_voting(monkeypatch: pytest.MonkeyPatch) -> None:
    """§5.2: a node that forgets its vote lets two leaders win one term."""
    original = raft_core.Raft._handle_vote_request

    def forgetful(self: raft_core.Raft, m: object) -> None:
        self.vote = None
        self.lead = None
        original(self, m)  # type: ignore[arg-type]

    monkeypatch.setattr(raft_core.Raft, "_handle_vote_request", forgetful)
    assert _first_failure(range(200))


def test_finds_a_driver_that_sends_before_persisting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contract duty 2: a message may leave only after its Ready's writes are synced."""
    original = Sim._take_ready

    def eager(self: Sim, node: object) -> None:
        original(self, node)  # type: ignore[arg-type]
        rd = node.inflight  # type: ignore[attr-defined]
        if rd is not None and rd.messages:
            for m in rd.messages:
                self._send(m)
            node.inflight = type(rd)(  # type: ignore[attr-defined]
                rd.soft_state,
                rd.hard_state,
                rd.entries,
                rd.snapshot,
                rd.committed_entries,
                (),
                rd.read_states,
                rd.must_sync,
            )

    monkeypatch.setattr(Sim, "_take_ready", eager)
    assert _first_failure(range(200))


def test_finds_a_blank_voter_that_votes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wiped voter that votes with a blank memory elects a leader without a committed
    entry (docs/raft.md, "A voter that lost its disk")."""
    original = raft_core.Raft._handle_vote_request

    def votes_anyway(self: raft_core.Raft, m: object) -> None:
        blank, self.blank = self.blank, 0
        try:
            original(self, m)  # type: ignore[arg-type]
        finally:
            self.blank = blank

    monkeypatch.setattr(raft_core.Raft, "_handle_vote_request", votes_anyway)
    failure = _first_failure(range(5000, 5200), wipe_heavy)
    assert "leader completeness" in failure or "differs" in failure, failure
