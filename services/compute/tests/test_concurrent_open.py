"""Concurrent first reads of one repository (seed 001, "Compute nodes"; DESIGN "Read path").

A repository is registered before its first state arrives from the ledger; a
second reader that found it then must wait for that state instead of taking the
empty placeholder for another incarnation, dropping the view and making the
first reader answer "not found" for a repository that exists.
"""

from __future__ import annotations

import asyncio

import pytest

from enroute_compute.host import DEFAULT_HEAD, RepositoryHost
from enroute_compute.ledger_port import CreateMode
from enroute_compute.main import SystemClock
from enroute_testing.local_ledger import LocalLedger


@pytest.mark.asyncio
async def test_concurrent_first_reads_all_see_the_repository() -> None:
    ledger = LocalLedger()
    await ledger.activate("r", CreateMode.EXPLICIT, DEFAULT_HEAD)
    host = RepositoryHost(ledger, None, SystemClock(), wait_s=5.0)
    try:
        snaps = await asyncio.gather(*(host.read("r") for _ in range(8)))
        assert all(s.state.exists and s.state.incarnation >= 1 for s in snaps)
    finally:
        await host.close()
