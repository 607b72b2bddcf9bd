"""An idle voter gives its free C heap back (enroute_ledger.heaptrim, issue 19).

The policy, on the multi-Raft nodes of a seeded simulation: nothing is due while a
group is awake or too few have hibernated since the last trim; once enough did and
none is awake, the trim runs once and waits for the next hibernations. And the trim
itself, glibc's ``malloc_trim``: free blocks left between live ones in the C heap
(bytes objects over pymalloc's 512 bytes come from malloc) leave the resident set.
"""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
from mrsim import Cluster

from enroute_core.base.ids import NodeId
from enroute_core.storage.heap import malloc_trim, resident_bytes
from enroute_ledger.heaptrim import HeapTrimmer

N1 = NodeId(1)


def test_due_once_enough_groups_hibernated_and_none_is_awake() -> None:
    c = Cluster(3, 12, 5, hibernate_after=3)
    mr = c.nodes[N1]
    trimmed: list[int] = []
    t = HeapTrimmer(mr, after_groups=10, trim=lambda: trimmed.append(1), poll_s=0.01)
    assert t.due() == 0  # nothing hibernated yet
    c.run_until(c.all_led, 300)
    c.run_until(lambda: c.all_quiet() and mr.hibernated_count() == 12, 400)
    assert t.due() == 12
    asyncio.run(t.trim_now(t.due()))
    assert trimmed == [1] and t.trims == 1
    assert t.due() == 0, "nothing hibernated since"
    c.commit_all(c.groups[:4], b"w", 200)  # wakes 4: fewer than 10 hibernate again
    c.run_until(lambda: c.all_quiet() and mr.hibernated_count() == 12, 400)
    assert mr.stats.hibernated - t._seen == 4 and t.due() == 0
    t.after_groups = 3  # enough now, but not while a group is awake
    assert t.due() == 4
    mr.wake(c.groups[0])
    assert mr.hibernated_count() == 11 and t.due() == 0


def test_run_trims_after_a_burst_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    c = Cluster(3, 12, 7, hibernate_after=3)
    mr = c.nodes[N1]
    c.run_until(c.all_led, 300)
    c.run_until(lambda: c.all_quiet() and mr.hibernated_count() == 12, 400)
    t = HeapTrimmer(mr, after_groups=10, trim=malloc_trim(), poll_s=0.01)
    t._seen = 0  # as if it started before the groups were made

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(t.run())
        for _ in range(200):
            if t.trims:
                break
            await asyncio.sleep(0.01)
        t.stop()
        await asyncio.wait_for(task, 5)

    with caplog.at_level(logging.INFO, logger="enroute.ledger.heap"):
        asyncio.run(main())
    assert t.trims == 1
    assert any("returned" in r.message and "12 groups" in r.message for r in caplog.records)


def test_a_disabled_trimmer_returns_at_once() -> None:
    c = Cluster(3, 1, 3, hibernate_after=3)
    t = HeapTrimmer(c.nodes[N1], after_groups=0, trim=malloc_trim())
    asyncio.run(asyncio.wait_for(t.run(), 5))
    assert t.trims == 0


@pytest.mark.skipif(malloc_trim() is None, reason="not glibc")
def test_malloc_trim_returns_free_blocks_between_live_ones() -> None:
    trim = malloc_trim()
    assert trim is not None
    # 64 MiB in 64 KiB blocks from malloc (under its 128 KiB mmap threshold), every
    # other one freed: none at the heap's top, so glibc keeps them resident until trimmed
    blocks = [os.urandom(1) * 65536 for _ in range(1024)]
    del blocks[::2]
    resident = resident_bytes()
    trim()
    released = resident - resident_bytes()
    assert released > 16 * (1 << 20), released
    del blocks
