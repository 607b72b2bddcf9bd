"""The runtime's tick loop after a stall (docs/raft.md, "Elections under CPU starvation").

A ledger process starved of CPU (a loaded machine, a GC pause, a long Ready
round) runs its tick loop late. Ticks it missed must not all land at once, nor
two back to back before the transport has stepped the batches that came in
meanwhile: each tick advances every follower's election clock, and a follower
pushed over its timeout by time it did not run campaigns against a leader that
was heartbeating all along. A fake clock makes the stall exact.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from enroute_core.base.ids import NodeId
from enroute_ledger.logstore import open_log_store
from enroute_ledger.runtime import Runtime, RuntimeConfig

INTERVAL_S = 0.02


def test_a_late_loop_ticks_once_for_a_stall_then_waits_an_interval(tmp_path: Path) -> None:
    async def main() -> list[int]:
        now = [100.0]
        store = open_log_store(tmp_path / "log")
        cfg = RuntimeConfig(node_id=NodeId(1), peers=(), tick_interval_s=INTERVAL_S)
        rt = Runtime(cfg, store, clock=lambda: now[0], nonce=os.urandom(8), seed=1)
        task = asyncio.get_running_loop().create_task(rt.run())
        seen: list[int] = []
        try:
            await asyncio.sleep(0.05)  # the clock stands still: no tick is due
            seen.append(rt.mr._ticks)
            now[0] += 10 * INTERVAL_S  # a stall of ten intervals
            rt.wake()
            await asyncio.sleep(0.1)  # the loop runs freely; the clock stands still
            seen.append(rt.mr._ticks)
            now[0] += INTERVAL_S * 0.99  # not yet a whole interval after the late tick
            rt.wake()
            await asyncio.sleep(0.1)
            seen.append(rt.mr._ticks)
            now[0] += INTERVAL_S * 0.02  # now it is
            rt.wake()
            await asyncio.sleep(0.1)
            seen.append(rt.mr._ticks)
        finally:
            rt.stop()
            await asyncio.wait_for(task, 30)
            store.close()
        return seen

    assert asyncio.run(main()) == [0, 1, 1, 2]
