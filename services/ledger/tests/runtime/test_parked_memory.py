"""What a repository a compute followed and stopped following costs a voter (issue 19).

docs/fleet.md, "Views are a cache": a compute ends the Subscribe stream of a view it
evicts, and the group hibernates as any idle group. The stream's change event must
go with the stream: parked on, it stayed on the hibernated group (an
``asyncio.Event`` and its waiter deque, some 0.8 KiB) until the group's next change,
the largest part of what an idle repository still cost the voter serving the
computes. One in-process voter hosts N groups, a subscription parks on each and
ends; tracemalloc counts what the groups added, per group, after they hibernate.
``ENROUTE_MEMORY_GROUPS`` changes N.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import tracemalloc
from pathlib import Path

from memnet import until

from enroute_core.base.ids import NodeId
from enroute_core.state import MISSING, Activate
from enroute_core.storage.objectstore.file import FileStore
from enroute_ledger.lifecycle import ChangeOut, Lifecycle, SnapshotOut
from enroute_ledger.logstore import open_log_store
from enroute_ledger.machine import genesis_entry
from enroute_ledger.runtime import Runtime, RuntimeConfig

GROUPS = int(os.environ.get("ENROUTE_MEMORY_GROUPS", "300"))
BYTES_PER_GROUP_MAX = 1200
"""Measured about 1,110 bytes at 300 groups; 1,300 before the store's shared empty
``kept``, the one id object for Raft and store, and the one copy of the name (the bound
is between the two, so that regression shows); 1,790 with the parked stream's event
left on each group."""
WAIT_S = 120.0


async def _follow_then_stop(lc: Lifecycle, repo: str) -> None:
    """One compute's view of ``repo``: its snapshot, parked for the next change, then
    evicted (the servicer cancels the task that runs the stream)."""
    parked = asyncio.Event()
    first: list[SnapshotOut | ChangeOut] = []

    async def stream() -> None:
        async for ev in lc.subscribe(repo, 0, 0):
            first.append(ev)
            parked.set()

    task = asyncio.ensure_future(stream())
    await asyncio.wait_for(parked.wait(), WAIT_S)
    await asyncio.sleep(0)  # the generator is parked on the group's change event now
    assert isinstance(first[0], SnapshotOut)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_an_ended_subscription_leaves_nothing_on_its_hibernated_group(tmp_path: Path) -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        store = open_log_store(tmp_path / "log")
        cfg = RuntimeConfig(
            node_id=NodeId(1), peers=(), tick_interval_s=0.02, hibernate_after_s=0.2
        )
        rt = Runtime(cfg, store, clock=loop.time, nonce=os.urandom(8), seed=1)
        lc = Lifecycle(rt, FileStore(tmp_path / "objects"), upload_window=64,
                       wall_clock_us=lambda: 0)  # fmt: skip
        task = loop.create_task(rt.run())
        try:

            async def create(name: str) -> None:
                g = await rt.host(name, 1, campaign=True)
                rid = rt.request_id()
                act = Activate(create=True, head=b"refs/heads/main", upload_window=64)
                await rt.propose(g, genesis_entry(rid, MISSING, act), rid, WAIT_S)
                lc._remember(name)

            for i in range(10):  # one-time allocations out of the count
                await create(f"warm{i}")
                await _follow_then_stop(lc, f"warm{i}")
            gc.collect()
            tracemalloc.start(1)
            before = tracemalloc.take_snapshot()
            # made in the count, as a request's decoded name is: a voter keeps one copy
            names = [f"r{i:06d}" for i in range(GROUPS)]
            for lo in range(0, GROUPS, 25):
                await asyncio.gather(*(create(n) for n in names[lo : lo + 25]))
                await asyncio.gather(*(_follow_then_stop(lc, n) for n in names[lo : lo + 25]))
            assert rt.subscriptions - rt.subscriptions_ended == 0
            total = GROUPS + 10
            await until(lambda: rt.mr.hibernated_count() == total, WAIT_S)
            del names
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            # the direct check: no group keeps the change event of a stream that ended
            assert [g.repo for g in rt.groups.values() if g._changed is not None] == []
            diff = after.compare_to(before, "lineno")
            for stat in diff[:12]:
                print(stat)
            return sum(s.size_diff for s in diff) // GROUPS
        finally:
            rt.stop()
            await asyncio.wait_for(task, WAIT_S)
            store.close()

    per_group = asyncio.run(main())
    print(f"{per_group} bytes per followed, then idle group ({GROUPS} groups)")
    assert per_group <= BYTES_PER_GROUP_MAX
