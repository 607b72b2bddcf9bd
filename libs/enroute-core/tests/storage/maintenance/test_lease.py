"""The maintenance lease ``repos/<repo>/maintainer`` by compare-and-swap (issue "Layer
maintenance": leases; seed 001: the lease names a compute and carries over).

Single-client behaviour runs on file://, moto and SeaweedFS. Contention runs
where conditional writes are atomic (SeaweedFS and file://; moto does not
promise it): many computes race for one lease, exactly one wins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from enroute_core.base.errors import CorruptData
from enroute_core.storage.maintenance import (
    Lease,
    acquire_lease,
    read_lease,
    release_lease,
    renew_lease,
)
from enroute_core.storage.objectstore import ObjectStore

pytestmark = pytest.mark.asyncio
StoreFactory = Callable[[str], Awaitable[ObjectStore]]
KEY = "repos/team~app/maintainer"
T0 = 1_700_000_000_000_000
MIN = 60_000_000


@pytest.mark.parametrize("backend", ["file", "moto", "seaweedfs"])
async def test_acquire_hold_renew_expire_take_over(make_store: StoreFactory, backend: str) -> None:
    a, b = await make_store(backend), await make_store(backend)
    held = await acquire_lease(a, KEY, "compute-a", now_us=T0, duration_us=MIN)
    assert held is not None and held.lease == Lease("compute-a", 1, T0, T0 + MIN)
    # Another compute cannot take an unexpired lease.
    assert await acquire_lease(b, KEY, "compute-b", now_us=T0 + MIN - 1, duration_us=MIN) is None
    # The holder renews while it holds it; acquiring again as the holder renews too.
    renewed = await renew_lease(a, KEY, held, now_us=T0 + 30_000_000, duration_us=MIN)
    assert renewed is not None and renewed.lease.expires_us == T0 + 90_000_000
    again = await acquire_lease(a, KEY, "compute-a", now_us=T0 + 40_000_000, duration_us=MIN)
    assert again is not None and again.lease.term == 1 and again.lease.acquired_us == T0
    # A crashed holder: after expiry another compute takes over with the next term.
    late = T0 + 100_000_000 + 1
    taken = await acquire_lease(b, KEY, "compute-b", now_us=late, duration_us=MIN)
    assert taken is not None and taken.lease == Lease("compute-b", 2, late, late + MIN)
    # The old holder's renewal names a write that is gone: it learns it lost the lease.
    assert await renew_lease(a, KEY, again, now_us=late + 1, duration_us=MIN) is None
    assert await release_lease(a, KEY, again, now_us=late + 1) is False
    current = await read_lease(a, KEY)
    assert current is not None and current[0].holder == "compute-b"


@pytest.mark.parametrize("backend", ["file", "moto"])
async def test_release_lets_another_compute_in_at_once(
    make_store: StoreFactory, backend: str
) -> None:
    a, b = await make_store(backend), await make_store(backend)
    held = await acquire_lease(a, KEY, "compute-a", now_us=T0, duration_us=MIN)
    assert held is not None
    assert await release_lease(a, KEY, held, now_us=T0 + 5) is True
    taken = await acquire_lease(b, KEY, "compute-b", now_us=T0 + 5, duration_us=MIN)
    assert taken is not None and taken.lease.term == 2


async def test_held_lease_validity_keeps_a_margin(make_store: StoreFactory) -> None:
    store = await make_store("file")
    held = await acquire_lease(store, KEY, "c", now_us=T0, duration_us=MIN)
    assert held is not None
    assert held.valid(T0 + MIN - 11, margin_us=10)
    assert not held.valid(T0 + MIN - 10, margin_us=10)


async def test_a_corrupt_lease_is_reported_not_taken(make_store: StoreFactory) -> None:
    store = await make_store("file")
    await store.put(KEY, b"garbage")
    with pytest.raises(CorruptData):
        await acquire_lease(store, KEY, "c", now_us=T0, duration_us=MIN)


@pytest.mark.parametrize(("backend", "contenders"), [("file", 8), ("seaweedfs", 4)])
async def test_contenders_for_a_free_or_expired_lease_exactly_one_wins(
    make_store: StoreFactory, backend: str, contenders: int
) -> None:
    stores = [await make_store(backend) for _ in range(contenders)]
    now = T0
    winners_by_round: list[list[str]] = []
    for rnd in range(3):  # free, then expired twice
        barrier = asyncio.Barrier(contenders)

        async def contend(
            i: int, now_us: int = now, barrier: asyncio.Barrier = barrier, rnd: int = rnd
        ) -> str | None:
            await barrier.wait()
            held = await acquire_lease(
                stores[i], KEY, f"compute-{rnd}-{i}", now_us=now_us, duration_us=MIN
            )
            return None if held is None else held.lease.holder

        async with asyncio.timeout(120):
            results = await asyncio.gather(*(contend(i) for i in range(contenders)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, (rnd, results)
        winners_by_round.append(winners)
        current = await read_lease(stores[0], KEY)
        assert current is not None
        assert current[0].holder == winners[0] and current[0].term == rnd + 1
        now += MIN  # the lease expires: the next round takes it over
    assert len(winners_by_round) == 3
