"""Views are a cache (issue 19, item 1; docs/fleet.md): a compute evicts idle views and
those over its count or byte budget, ends their subscriptions, and opens them again on
the next request, current.

Against the in-process ledger with a clock that moves only when told; the same
eviction with real processes is ``tests/interop/test_fleet_eviction.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from enroute_compute.host import DEFAULT_HEAD, VIEW_FIXED_BYTES, RepositoryHost
from enroute_compute.ledger_port import BarrierPoint, CreateMode
from enroute_compute.local_ledger import LocalLedger
from enroute_core.base.clock import FixedClock
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.state import Commit, RefUpdate

IDLE_MS = 1000


def limits(**over: int) -> Limits:
    return dataclasses.replace(DEFAULT_LIMITS, view_idle_ms_max=IDLE_MS, **over)


async def hosting(names: list[str], **over: int) -> tuple[LocalLedger, RepositoryHost, FixedClock]:
    ledger = LocalLedger()
    for name in names:
        await ledger.activate(name, CreateMode.EXPLICIT, DEFAULT_HEAD)
    clock = FixedClock(now_us=1_000_000)
    host = RepositoryHost(ledger, None, clock, wait_s=5.0, limits=limits(**over))
    return ledger, host, clock


async def set_ref(ledger: LocalLedger, name: str, ref: bytes, fill: int) -> int:
    """A commit moving ``ref`` straight on the ledger (another compute's push)."""
    state = (await ledger.describe(name)).incarnation
    old = ledger._repos[name].state.refs.get(ref)
    update = RefUpdate(ref, old.oid if old else None, ObjectId(bytes([fill]) * 20))
    got = await ledger.propose(name, state, Commit(state, (update,), None, 1, is_push=True))
    return got.version


async def settle() -> None:
    """Let cancelled followers and notifications run."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_an_idle_view_is_evicted_and_reopened_current() -> None:
    ledger, host, clock = await hosting(["a", "b"])
    try:
        await host.read("a")
        await host.read("b")
        assert host.hosted == ("a", "b") and host.view_bytes == 2 * VIEW_FIXED_BYTES
        clock.advance_us(IDLE_MS * 1000 - 1)
        assert host.evict(clock.now_us()) == 0  # not idle long enough
        await host.read("b")  # b used again: a stays the least recently used
        clock.advance_us(1)
        assert host.evict(clock.now_us()) == 1
        assert list(host.hosted) == ["b"] and host.view_bytes == VIEW_FIXED_BYTES
        await settle()
        # a changed while nobody followed it: the re-opened view must show it
        version = await set_ref(ledger, "a", b"refs/heads/main", 7)
        snap = await host.read("a")
        assert snap.state.version == version
        assert snap.state.refs[b"refs/heads/main"].oid == ObjectId(b"\x07" * 20)
        assert (host.evictions, host.reopens) == (1, 1)
        # and it follows again: a later change reaches the view without a barrier
        version = await set_ref(ledger, "a", b"refs/heads/main", 8)
        await host.wait_applied("a", version)
        peeked = host.peek("a")
        assert peeked is not None and peeked.state.version == version
    finally:
        await host.close()


@pytest.mark.asyncio
async def test_the_least_recently_used_go_over_the_count_budget() -> None:
    _ledger, host, _clock = await hosting(["a", "b", "c"], views_open_max=2)
    try:
        await host.read("a")
        await host.read("b")
        await host.read("a")  # b is now the least recently used
        await host.read("c")  # one over: b goes, c (just opened) stays
        assert host.hosted == ("a", "c") and host.evictions == 1
    finally:
        await host.close()


@pytest.mark.asyncio
async def test_views_over_the_byte_budget_go() -> None:
    _ledger, host, _clock = await hosting(["a", "b", "c"], views_bytes_max=2 * VIEW_FIXED_BYTES)
    try:
        for name in ("a", "b", "c"):
            await host.read(name)
        assert host.hosted == ("b", "c") and host.view_bytes <= 2 * VIEW_FIXED_BYTES
    finally:
        await host.close()


@pytest.mark.asyncio
async def test_a_view_in_use_is_not_evicted() -> None:
    _ledger, host, clock = await hosting(["a"])
    try:
        snap = await host.read("a")
        clock.advance_us(10 * IDLE_MS * 1000)
        with host.pin_reads(snap):  # a fetch or push reading it
            assert host.evict(clock.now_us()) == 0
        clock.advance_us(IDLE_MS * 1000)  # the use counted as a use
        assert host.evict(clock.now_us()) == 1
    finally:
        await host.close()


@pytest.mark.asyncio
async def test_a_read_waiting_on_an_evicted_view_opens_it_again() -> None:
    ledger, host, _clock = await hosting(["a"], views_open_max=1)
    try:
        await host.read("a")
        await settle()
        # the view is evicted between the read's barrier and its wait: the read must
        # not answer "not found" nor from the stopped view
        ledger_barrier = ledger.barrier

        async def barrier_then_evict(name: str) -> BarrierPoint:
            point = await ledger_barrier(name)
            ledger.barrier = ledger_barrier  # type: ignore[method-assign]
            host._evict(host._repos[name])
            return point

        ledger.barrier = barrier_then_evict  # type: ignore[method-assign]
        version = await set_ref(ledger, "a", b"refs/heads/x", 3)
        snap = await host.read("a")
        assert snap.state.version == version and host.reopens == 1
    finally:
        await host.close()
