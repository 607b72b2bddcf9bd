"""An abandoned read stops its walk (issue "Bounded work", item 3: a request's work ends
with the request; engine/cancel.py).

``RepositoryHost.run_read`` runs a fetch's planning in a worker thread. When the
task awaiting it is cancelled (gitproto cancelled the call: the client went), it
sets the walk's event, and the walk in the thread, which checks it at each commit
and tree, stops. The step here stands for a walk that would go on for long.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from enroute_compute.host import RepositoryHost
from enroute_compute.main import SystemClock
from enroute_core.engine.cancel import WalkAbandoned, check_walk
from enroute_core.engine.view import View
from enroute_testing.local_ledger import LocalLedger

WAIT_S = 10.0


@pytest.mark.asyncio
async def test_a_cancelled_read_stops_its_walk() -> None:
    host = RepositoryHost(LocalLedger(), None, SystemClock(), wait_s=5.0)
    started, stopped = threading.Event(), threading.Event()
    steps = 0

    def endless_walk() -> None:
        nonlocal steps
        started.set()
        ends = time.monotonic() + 3 * WAIT_S  # ends by itself, so a failure does not hang
        try:
            while time.monotonic() < ends:
                check_walk()
                steps += 1
                stopped.wait(0.001)
        except WalkAbandoned:
            stopped.set()
            raise

    try:
        task = asyncio.ensure_future(host.run_read(View(()), endless_walk, kind="plan"))
        assert await asyncio.to_thread(started.wait, WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(stopped.wait, WAIT_S), "the walk outlived its request"
        assert steps > 0
    finally:
        await host.close()
