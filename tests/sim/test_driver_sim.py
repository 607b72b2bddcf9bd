"""Seeded simulation of the ledger's real driver (docs/raft.md, "Simulation").

Each schedule runs three (every eighth, five) real ``Runtime`` voters hosting two
groups over a simulated store, network and clock (driver_sim.py): crashes that
lose unsynced writes or not, restarts, wiped disks that come back blank and are
readmitted, partitions, loss, duplication, reordering, leadership transfers,
compactions and snapshot transfers, membership changes (a new voter added to
every group, then one removed), repositories deleted and created again (the old
incarnation dropped everywhere), and hibernation. Every client call goes through
the driver's client API (enroute_ledger.client): re-proposals under one request
id, deadlines and answers are the production code's. Safety is checked after every
step, liveness when the faults stop, and the clients' CAS history must be
linearizable.

CI runs seeds 0..999. A failure names its seed; replay it alone with
``ENROUTE_SEED=<n> pytest tests/sim/test_driver_sim.py -k replay``. A larger sweep
runs with ``ENROUTE_SIM_SCHEDULES=20000`` (marked slow).

The planted bugs below (each a ``Runtime`` subclass that breaks one rule of the
Ready contract, its machine's id window, or its client API's request ids) must
each be found within those 1,000 CI schedules.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
from driver_sim import DriverSim, SimFailure, SimReport, params_for, run_seed

from enroute_core.state import apply, decode_command, encode_change
from enroute_ledger.client import Client, Proposal
from enroute_ledger.machine import (
    COMMAND,
    ID_BYTES,
    Applied,
    Done,
    GroupMachine,
    MachineState,
    entry_rid,
)
from enroute_ledger.multiraft import Batch, GroupReady, NodeReady
from enroute_ledger.raft import ConfChange, ConfChangeType, EntryType
from enroute_ledger.runtime import Group, ReadyRound, Runtime

SCHEDULES = 1000
CHUNK = 100
SEED_BASE = int(os.environ.get("ENROUTE_SIM_SEED_BASE", "0"))


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    """The runtimes log every readmission and refused entry; thousands per chunk."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _run_range(seeds: range, runtime: type[Runtime] = Runtime) -> Iterator[SimReport]:
    failures: list[str] = []
    for seed in seeds:
        try:
            yield run_seed(seed, params_for, runtime)
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
    print(run_seed(seed))


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
        sim = DriverSim(77, params_for(77))
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
        "snapshot_sent",
        "snapshots_applied",
        "wipe",
        "readmit",
        "conf_change",
        "conf_applied",
        "hibernations",
        "wakes",
        "hibernated_all",
        "early_sent",
        "repropose",
        "duplicates_skipped",
        "op_ok",
        "op_info",
        "op_fail",
        "recreated",
        "dropped",
    ):
        assert totals.get(what, 0) > 0, (what, totals)


# -- planted driver bugs: each must be found within the CI schedules ----------------------


class SendsBeforePersisting(Runtime):
    """Sends everything of a Ready before its writes are durable: votes and
    acknowledgements too, not only the leader's appends that ``_send_early`` allows.

    Found as two leaders of one term, a committed entry that changes, or, first in
    the CI seeds, the core's own check (etcd's "tocommit is out of range"): a
    follower told a commit index past the log it kept, since it acknowledged
    entries that its crash then lost."""

    def _send_early(
        self, live: list[tuple[GroupReady, Group | None]], batches: tuple[Batch, ...]
    ) -> tuple[Batch, ...]:
        assert self.transport is not None
        for b in batches:
            self.transport.send(b)
        return ()


class AppliesBeforeCommit(Runtime):
    """Applies the entries a Ready appends before they are committed."""

    def _apply_durable(self, live: list[tuple[GroupReady, Group | None]]) -> None:
        super()._apply_durable(live)
        for gr, g in live:
            if g is None or g.dropped or gr.ready.snapshot is not None:
                continue
            for e in gr.ready.entries:
                if e.index > g.applied and e.type is EntryType.NORMAL:
                    self._apply_entry(g, e)


class DropsReadmit(Runtime):
    """Drops a committed READMIT instead of applying it: a wiped voter stays blank."""

    def _apply_conf_change(self, g: Group, cc: ConfChange) -> None:
        if cc.type is ConfChangeType.READMIT:
            return
        super()._apply_conf_change(g, cc)


class _NoWindow(GroupMachine):
    def duplicate(self, g: MachineState, rid: bytes, index: int) -> Done | None:
        return None


class ForgetsAppliedIds(Runtime):
    """Its machine forgets the request id window: a re-proposed or duplicated entry
    applies again (docs/raft.md, "Applying each id once")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.machine = _NoWindow(self.machine.window)


class _NewIdOnRetry(Client):
    def _take(self, p: Proposal, g: Group, now: float) -> float:
        if p.attempt:  # a copy goes under a fresh id: the window cannot know it
            g.proposals.pop(p.rid, None)
            p.rid = self.request_id()
            p.entry = p.entry[:1] + p.rid + p.entry[1 + ID_BYTES :]
            g.proposals[p.rid] = p
        return super()._take(p, g, now)


class RetriesUnderANewId(Runtime):
    """Its client API proposes a lost-looking entry again under a new request id (the
    pure half, enroute_ledger.client): a copy of an applied commit applies again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client.__class__ = _NewIdOnRetry


class AnswersBeforeApply(Runtime):
    """Answers a proposal as soon as its entry is appended here, with what applying it
    to the state of now would give: an answer ahead of the log (an entry a crash or a
    new leader then loses was acknowledged; the real apply may differ)."""

    def begin_ready(self, nr: NodeReady) -> ReadyRound:
        rnd = super().begin_ready(nr)
        for gr, g in rnd.live:
            if g is None or g.dropped or g.hibernated:
                continue
            for e in gr.ready.entries:
                p = g.proposals.get(entry_rid(e.data))
                if p is None or p.done or e.data[:1] != COMMAND:
                    continue
                cmd = decode_command(e.data[1 + ID_BYTES :])
                res = apply(g.state, cmd, log_index=int(e.index))
                change = encode_change(res.change)
                p.set(Applied(res.state.version, change, res.change.outcome, res.state))
        return rnd


def _first_failure(runtime: type[Runtime]) -> tuple[int, str]:
    for seed in range(SEED_BASE, SEED_BASE + SCHEDULES):
        try:
            run_seed(seed, params_for, runtime)
        except SimFailure as e:
            return seed, str(e)
    return -1, ""


@pytest.mark.parametrize(
    ("bug", "finding"),
    [
        (
            SendsBeforePersisting,
            ("election safety", "committed entry", "leader completeness", "commit past the log"),
        ),
        (AppliesBeforeCommit, ("state machine safety", "linearizable", "disagree")),
        (DropsReadmit, ("never readmitted",)),
        (ForgetsAppliedIds, ("applied twice", "repeat an id", "linearizable")),
        (RetriesUnderANewId, ("applied twice", "linearizable")),
        (AnswersBeforeApply, ("linearizable",)),
    ],
    ids=[
        "send-before-persist",
        "apply-before-commit",
        "drop-readmit",
        "forget-applied-ids",
        "retry-under-new-id",
        "answer-before-apply",
    ],
)
def test_finds_a_planted_driver_bug(bug: type[Runtime], finding: tuple[str, ...]) -> None:
    seed, failure = _first_failure(bug)
    print(f"{bug.__name__}: first found by seed {seed}")
    assert seed >= 0, f"{bug.__name__} not found in {SCHEDULES} schedules"
    assert any(f in failure for f in finding), failure
