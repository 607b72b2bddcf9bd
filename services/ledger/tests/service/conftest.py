"""Real ledger processes on 127.0.0.1 for service tests; always killed in teardown."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing import ledgers
from enroute_testing.ledgers import (  # noqa: F401 - the tests import these from here
    LedgerProc,
    error_code,
    free_port,
    start_all,
)


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
    timing: dict[str, object] = {
        "tick_interval": "20ms",
        "election_ticks": 10,
        "checkpoint_entries": checkpoint_entries,
    }
    return ledgers.write_config(
        path,
        node_id=node_id,
        data=data,
        store=store,
        grpc_port=grpc_port,
        members=members,
        ledger=timing,
    )


@pytest.fixture
def procs() -> Iterator[list[LedgerProc]]:
    started: list[LedgerProc] = []
    yield started
    for p in started:
        p.kill()


def wait_for(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")
