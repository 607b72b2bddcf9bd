"""The member's side of Ledger.Follow in one in-process voter (enroute_ledger.follow).

docs/rpc.md, "Follow"; docs/fleet.md, "One stream per compute and member": a large
snapshot leaves in parts with other follows' changes between them, so one repository
cannot hold the others back; a follow parked on an idle group does not wake it; an
ended follow leaves nothing on its group. Small parts and messages here stand for
the 1 MiB ones, so a state of tens of KiB is "large".
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from memnet import until

from enroute_core.base.ids import NodeId, ObjectId
from enroute_core.state import Commit, RefUpdate, encode_command
from enroute_core.storage.objectstore.file import FileStore
from enroute_ledger.follow import ChangesOut, EndOut, FollowStream, PartOut, Piece
from enroute_ledger.lifecycle import Lifecycle
from enroute_ledger.logstore import open_log_store
from enroute_ledger.runtime import Runtime, RuntimeConfig

WAIT_S = 60.0
PART_BYTES = 2048


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


async def voter(tmp_path: Path, body: object) -> None:
    loop = asyncio.get_running_loop()
    store = open_log_store(tmp_path / "log")
    cfg = RuntimeConfig(node_id=NodeId(1), peers=(), tick_interval_s=0.02, hibernate_after_s=0.2)
    rt = Runtime(cfg, store, clock=loop.time, nonce=os.urandom(8), seed=1)
    lc = Lifecycle(rt, FileStore(tmp_path / "objects"), upload_window=64, wall_clock_us=lambda: 0)
    task = loop.create_task(rt.run())
    try:
        assert callable(body)
        await body(lc)
    finally:
        rt.stop()
        await asyncio.wait_for(task, WAIT_S)
        store.close()


async def commit(lc: Lifecycle, repo: str, first: int, refs: int) -> int:
    updates = tuple(
        RefUpdate(b"refs/heads/branch-%06d" % n, None, oid(n + 1))
        for n in range(first, first + refs)
    )
    return (await lc.propose(repo, 1, encode_command(Commit(1, updates, None, 1, False)))).version


def test_a_large_snapshot_leaves_in_parts_between_other_follows_changes(
    tmp_path: Path,
) -> None:
    async def body(lc: Lifecycle) -> None:
        for name in ("big", "small"):
            await lc.activate(name, True, b"refs/heads/main")
        for i in range(8):  # about 40 KiB of refs: some 20 parts of 2 KiB
            await commit(lc, "big", i * 100, 100)
        stream = FollowStream(lc, message_bytes=PART_BYTES, part_bytes=PART_BYTES)
        small_at = lc.rt.by_repo["small"].version
        stream.follow(1, "small", 1, small_at)  # parked: nothing to send
        stream.follow(2, "big", 1, 0)  # a snapshot
        seen: list[tuple[int, Piece]] = []
        seen += await asyncio.wait_for(stream.next_batch(), WAIT_S)
        assert [i for i, _ in seen] == [2], seen  # the first part of big's snapshot
        # a change to the small repository while big's snapshot is on its way
        v = await commit(lc, "small", 0, 1)
        while not any(isinstance(p, PartOut) and p.last for _, p in seen):
            seen += await asyncio.wait_for(stream.next_batch(), WAIT_S)
        parts = [k for k, (i, p) in enumerate(seen) if i == 2 and isinstance(p, PartOut)]
        changes = [k for k, (i, p) in enumerate(seen) if i == 1]
        assert len(parts) >= 10, len(parts)
        # the small one's change went out between big's parts, not after all of them
        assert changes and parts[0] < changes[0] < parts[-1], (changes, parts)
        change = seen[changes[0]][1]
        assert isinstance(change, ChangesOut) and [c[0] for c in change.changes] == [v]
        # the parts still make big's checkpoint in order
        assert [p.last for _, p in seen if isinstance(p, PartOut)].count(True) == 1
        stream.close()
        assert lc.rt.subscriptions == lc.rt.subscriptions_ended

    asyncio.run(voter(tmp_path, body))


def test_a_parked_follow_leaves_its_group_asleep_and_an_ended_one_leaves_nothing(
    tmp_path: Path,
) -> None:
    async def body(lc: Lifecycle) -> None:
        rt = lc.rt
        await lc.activate("idle", True, b"refs/heads/main")
        g = rt.by_repo["idle"]
        await until(lambda: g.hibernated)
        stream = FollowStream(lc)
        stream.follow(7, "idle", 1, g.version)  # the compute's version: nothing to send
        woken = rt.wakes
        pending = asyncio.ensure_future(stream.next_batch())
        await asyncio.sleep(0.5)
        assert not pending.done() and g.hibernated and rt.wakes == woken
        assert g.followers is not None and len(g.followers) == 1
        # the next change wakes it and reaches the follow
        v = await commit(lc, "idle", 0, 1)
        got = await asyncio.wait_for(pending, WAIT_S)
        assert [(i, [c[0] for c in p.changes]) for i, p in got if isinstance(p, ChangesOut)] == [
            (7, [v])
        ]
        stream.unfollow(7)
        assert g.followers is None  # nothing of the follow stays on the group
        # a follow of an incarnation the member does not have ends with the error
        stream.follow(8, "idle", 5, 0)
        got = await asyncio.wait_for(stream.next_batch(), WAIT_S)
        [(i, end)] = got
        assert i == 8 and isinstance(end, EndOut) and end.error is not None
        assert end.error.code == "not_found"
        assert stream.cursors == {}
        stream.close()
        assert rt.subscriptions == rt.subscriptions_ended

    asyncio.run(voter(tmp_path, body))
