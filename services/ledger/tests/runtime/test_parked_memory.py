"""What a repository a compute followed and stopped following costs a voter (issue 19).

docs/fleet.md, "Views are a cache": a compute ends the Subscribe stream of a view it
evicts, and the group hibernates as any idle group. The stream's change event must
go with the stream: parked on, it stayed on the hibernated group (an
``asyncio.Event`` and its waiter deque, some 0.8 KiB) until the group's next change,
the largest part of what an idle repository still cost the voter serving the
computes. One in-process voter creates N repositories as a request does
(``Lifecycle.activate``), a subscription parks on each and ends; tracemalloc counts
what the repositories added, per repository, once every group hibernated and the
checkpointer (a short interval here) compacted each and forgot it: the steady state
of an idle repository. ``ENROUTE_MEMORY_GROUPS`` changes N.
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
from enroute_core.storage.objectstore.file import FileStore
from enroute_ledger.checkpoints import Checkpointer
from enroute_ledger.lifecycle import ChangeOut, Lifecycle, SnapshotOut
from enroute_ledger.logstore import open_log_store
from enroute_ledger.runtime import Runtime, RuntimeConfig

GROUPS = int(os.environ.get("ENROUTE_MEMORY_GROUPS", "300"))
BYTES_PER_GROUP_MAX = 1300
"""Measured 1,105 to 1,248 bytes at 300 repositories (964 at 1,000; the object store's
striped locks and the maps' tables weigh more at 300; asyncio's waiters still alive when
the snapshot is taken move it by up to about 80 bytes a group from run to run: 1,161 in a
full run under load), checkpointed and compacted. Of it: the
store's shape 112 (its terms one int, its hard state three fields), the Raft
hibernation record 88, the runtime's group 88 and listing summary 80, the id 64, the
snapshot's metadata 56, the name 56 and its bytes 40, and a dict entry each in four
maps (a single voter keeps no set of the groups it leads).
Before (issue 19): a checkpointer mark per group ever led (117 bytes), a terms array
(64 to 112), a HardState (56) and three more map entries (the store's row keys, the
Raft leaders of sleeping groups, the groups led); 1,790 with the parked stream's event
left on each group."""
CHECKPOINT_INTERVAL_S = 0.5
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
        cp = Checkpointer(
            lc, every_entries=10_000, interval_s=CHECKPOINT_INTERVAL_S, clock=loop.time
        )
        cp_task = loop.create_task(cp.run())
        try:

            async def create(name: str) -> None:
                await lc.activate(name, True, b"refs/heads/main")

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
            # every repository checkpointed (its log compacted) and forgotten by the
            # checkpointer, every group asleep
            await until(lambda: not cp._tracked and not cp._wheel, WAIT_S)
            await until(lambda: rt.mr.hibernated_count() == total, WAIT_S)
            assert rt.compactions >= total
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
            cp.stop()
            rt.stop()
            await asyncio.wait_for(asyncio.gather(task, cp_task), WAIT_S)
            store.close()

    per_group = asyncio.run(main())
    print(f"{per_group} bytes per followed, then idle group ({GROUPS} groups)")
    assert per_group <= BYTES_PER_GROUP_MAX
