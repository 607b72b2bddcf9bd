"""Compare-and-swap under contention: no lost update, exactly one winner a round.

DESIGN, "Object store layout": state objects change only by compare-and-swap;
the file:// store gives the same guarantees with a lock plus rename, across
processes too. Run on SeaweedFS (atomic conditional writes) and file://; moto
does not promise atomicity, so it is left out here.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from enroute_core.base.errors import PreconditionFailed
from enroute_core.storage.objectstore import FileStore, ObjectStore, StoreOptions

pytestmark = pytest.mark.asyncio
StoreFactory = Callable[..., Awaitable[ObjectStore]]
ROUNDS = 10
# SeaweedFS 4.48 serialises conditional writes of a key with a cluster lock whose
# waiters poll about once a second: each round can cost whole seconds there
TASKS = {"file": 8, "seaweedfs": 4}


def value_of(data: bytes) -> int:
    return int(data.split(b":")[0])


async def contend(stores: list[ObjectStore], key: str, tasks: int) -> list[int]:
    """``tasks`` writers, ROUNDS rounds: all read, then all try ``if_match``; winners per round.

    Each writer writes bytes of its own (``value:writer``), so no two writes
    are equal and an ETag names one write.
    """
    await stores[0].put(key, b"0:init", if_none_match=True)
    read_barrier = asyncio.Barrier(tasks)
    write_barrier = asyncio.Barrier(tasks)
    wins = [0] * ROUNDS

    async def writer(i: int) -> None:
        store = stores[i % len(stores)]
        for r in range(ROUNDS):
            await read_barrier.wait()
            data, etag = await store.get_with_etag(key)
            await write_barrier.wait()  # nobody writes before everyone has read
            try:
                await store.put(key, b"%d:%d" % (value_of(data) + 1, i), if_match=etag)
                wins[r] += 1
            except PreconditionFailed:
                pass

    async with asyncio.timeout(150), asyncio.TaskGroup() as group:
        for i in range(tasks):
            group.create_task(writer(i))
    return wins


@pytest.mark.parametrize("backend", ["file", pytest.param("seaweedfs", marks=pytest.mark.slow)])
async def test_contended_cas_has_one_winner_a_round(backend: str, make_store: StoreFactory) -> None:
    # two stores on one backend: for file:// that is two locks, so flock must hold
    stores = [await make_store(backend), await make_store(backend)]
    wins = await contend(stores, "repos/counter/state", TASKS[backend])
    assert wins == [1] * ROUNDS
    data, _ = await stores[1].get_with_etag("repos/counter/state")
    assert value_of(data) == ROUNDS == sum(wins)


WORKER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from enroute_core.base.errors import PreconditionFailed
    from enroute_core.storage.objectstore import FileStore

    root, key, me, other = sys.argv[1:5]
    count = int(sys.argv[5])

    async def main() -> None:
        store = FileStore(root)
        open(os.path.join(root, "ready-" + me), "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(root, "ready-" + other)):
            assert time.monotonic() < deadline, "the other process never started"
            await asyncio.sleep(0.005)
        won = lost = 0
        for _ in range(count * 50):
            if won == count:
                break
            data, etag = await store.get_with_etag(key)
            value = int(data.split(b":")[0])
            try:
                await store.put(key, b"%d:%s" % (value + 1, me.encode()), if_match=etag)
                won += 1
            except PreconditionFailed:
                lost += 1
        print(won, lost)

    asyncio.run(main())
    """
)


async def test_cas_across_two_processes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = FileStore(root)
    await store.put("repos/shared/state", b"0:init", if_none_match=True)
    count = 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), "repos/shared/state", me, other, str(count)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for me, other in (("a", "b"), ("b", "a"))
    ]
    results = []
    for proc in procs:
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, err.decode()
        results.append([int(x) for x in out.split()])
    assert [won for won, _ in results] == [count, count]
    data, _ = await store.get_with_etag("repos/shared/state")
    assert value_of(data) == 2 * count  # no lost update
    assert sum(lost for _, lost in results) > 0, "the processes never contended"
    # the lock files and no temporary files are all that is left besides the object
    leftovers = [n for n in os.listdir(root / "repos" / "shared") if n.startswith(".tmp")]
    assert leftovers == []


async def test_lock_timeout_is_typed(tmp_path: Path) -> None:
    import fcntl

    from enroute_core.base.errors import Timeout
    from enroute_core.storage.objectstore.file import STORE_DIR, _stripe

    store = FileStore(tmp_path, StoreOptions(lock_timeout_ms=100))
    await store.put("k", b"v")
    lock_path = tmp_path / STORE_DIR / "locks" / f"{_stripe('k'):02d}"
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(Timeout):
            await store.put("k", b"w", if_match='"whatever"')
    finally:
        os.close(fd)
    assert await store.get("k") == b"v"
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp")] == []
