"""Real ledger processes on 127.0.0.1 for service tests; always killed in teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from enroute_testing import ledgers
from enroute_testing.ledgers import (  # noqa: F401 - the tests import these from here
    LedgerProc,
    error_code,
    free_port,
    start_all,
)
from enroute_testing.waiting import wait_until


def fast_timing(checkpoint_entries: int = 10_000) -> dict[str, object]:
    """The ledger keys of the fast Raft timing these tests use (a tick of 20 ms)."""
    return {
        "tick_interval": "20ms",
        "election_ticks": 10,
        "checkpoint_entries": checkpoint_entries,
    }


def start_three(
    work: Path, started: list[LedgerProc], *, checkpoint_entries: int = 10_000
) -> list[LedgerProc]:
    """``enroute_testing.ledgers.start_three`` with the fast timing: voters 1-3 with configs
    ``work/l{n}.yaml``, data ``work/d{n}`` and the store ``work/store``."""
    return ledgers.start_three(work, started, ledger=fast_timing(checkpoint_entries))


def write_config(
    path: Path,
    *,
    node_id: int,
    data: Path,
    store: Path,
    grpc_port: int = 0,
    members: tuple[str, ...] = (),
    checkpoint_entries: int = 10_000,
) -> Path:
    """A ledger config with the fast Raft timing these tests use."""
    return ledgers.write_config(
        path,
        node_id=node_id,
        data=data,
        store=store,
        grpc_port=grpc_port,
        members=members,
        ledger=fast_timing(checkpoint_entries),
    )


@pytest.fixture
def procs() -> Iterator[list[LedgerProc]]:
    started: list[LedgerProc] = []
    yield started
    for p in started:
        p.kill()


def wait_for(cond: Callable[[], object], timeout_s: float = 10.0) -> None:
    """``enroute_testing.waiting.wait_until`` under the name older tests here call."""
    wait_until(cond, timeout_s, "the condition of the test")
