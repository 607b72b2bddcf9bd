"""enroute_core.discovery against an HTTP server on 127.0.0.1 that speaks the Kubernetes API
(enroute_testing.kubeapi: EndpointSlices list and watch, 410 Gone after compaction),
through the real ``kubernetes`` client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kubernetes.aio.client  # imported once here: it takes seconds, not a test budget
import kubernetes.aio.watch  # noqa: F401
import pytest
import pytest_asyncio

from enroute_core.discovery import (
    EndpointSliceSource,
    StaticMembers,
    follow,
    members_of,
    slice_members,
)
from enroute_testing.kubeapi import NS, SERVICE, FakeApiServer, endpoint_slice
from enroute_testing.waiting import until


@pytest_asyncio.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _next(it: AsyncIterator[frozenset[str]], timeout_s: float = 15.0) -> frozenset[str]:
    return await asyncio.wait_for(anext(it), timeout_s)


def _source(api: FakeApiServer, **kw: Any) -> EndpointSliceSource:
    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0.01)

    return EndpointSliceSource(
        SERVICE, NS, "grpc", api_url=api.url, watch_timeout_s=kw.pop("watch_timeout_s", 5),
        sleep=no_sleep, **kw,
    )  # fmt: skip


def test_slice_members_reads_ready_endpoints_of_the_named_port() -> None:
    s = endpoint_slice("a", {"10.0.0.1": True, "10.0.0.2": False, "10.0.0.3": None}, port=7001)
    assert slice_members(s, "grpc") == {"10.0.0.1:7001", "10.0.0.3:7001"}
    assert slice_members(s, "") == {"10.0.0.1:9100", "10.0.0.3:9100"}
    assert slice_members(s, "missing") == set()
    v6 = endpoint_slice("b", {"fd00::1": True})
    assert members_of([s, v6], "grpc") == {"10.0.0.1:7001", "10.0.0.3:7001", "[fd00::1]:7000"}
    assert slice_members({"metadata": {"name": "x"}}, "grpc") == set()


@pytest.mark.asyncio
async def test_static_members_yield_once() -> None:
    seen = [m async for m in StaticMembers(("a:1", "b:2")).updates()]
    assert seen == [frozenset({"a:1", "b:2"})]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_list_then_watch_follows_adds_removes_and_readiness(api: FakeApiServer) -> None:
    api.put(endpoint_slice("ledger-abc", {"10.0.0.1": True, "10.0.0.2": False}))
    api.put(endpoint_slice("other-svc", {"10.9.9.9": True}, service="something-else"))
    source = _source(api)
    it = source.updates()
    try:
        assert await _next(it) == {"10.0.0.1:7000"}  # not-ready 10.0.0.2 excluded
        assert api.lists == 1
        # an endpoint becomes ready: the watch, not a new list, brings it
        api.put(endpoint_slice("ledger-abc", {"10.0.0.1": True, "10.0.0.2": True}))
        assert await _next(it) == {"10.0.0.1:7000", "10.0.0.2:7000"}
        # a second slice of the same Service adds a member
        api.put(endpoint_slice("ledger-def", {"10.0.0.3": True}))
        assert await _next(it) == {"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}
        # an endpoint removed, then a slice deleted
        api.put(endpoint_slice("ledger-abc", {"10.0.0.2": True}))
        assert await _next(it) == {"10.0.0.2:7000", "10.0.0.3:7000"}
        api.delete("ledger-def")
        assert await _next(it) == {"10.0.0.2:7000"}
        # a change to another Service's slice yields nothing
        api.put(endpoint_slice("other-svc", {"10.9.9.8": True}, service="something-else"))
        api.put(endpoint_slice("ledger-abc", {"10.0.0.2": True, "10.0.0.4": None}))
        assert await _next(it) == {"10.0.0.2:7000", "10.0.0.4:7000"}
        assert api.lists == 1
        assert api.watches[0] == "102"  # watched from the list's resourceVersion
    finally:
        await it.aclose()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_410_gone_lists_again(api: FakeApiServer) -> None:
    api.put(endpoint_slice("ledger-abc", {"10.0.0.1": True}))
    source = _source(api, watch_timeout_s=1)
    it = source.updates()
    try:
        assert await _next(it) == {"10.0.0.1:7000"}
        # while the watch is renewed, its version is compacted away and a change lands
        api.put(endpoint_slice("ledger-abc", {"10.0.0.1": True, "10.0.0.5": True}))
        assert await _next(it) == {"10.0.0.1:7000", "10.0.0.5:7000"}
        api.compact()
        api.put(endpoint_slice("ledger-abc", {"10.0.0.6": True}))
        api.compact()  # the event above is gone too: only a fresh list can see it
        assert await _next(it, 20.0) == {"10.0.0.6:7000"}
        assert source.stats.gone >= 1
        assert api.lists >= 2
    finally:
        await it.aclose()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_errors_back_off_then_recover(api: FakeApiServer) -> None:
    api.put(endpoint_slice("ledger-abc", {"10.0.0.1": True}))
    api.fail_next_lists = 2
    sleeps: list[float] = []

    async def record(delay: float) -> None:
        sleeps.append(delay)
        await asyncio.sleep(0.01)

    source = EndpointSliceSource(
        SERVICE, NS, "grpc", api_url=api.url, watch_timeout_s=5, backoff_s_min=0.25, sleep=record
    )
    it = source.updates()
    try:
        assert await _next(it) == {"10.0.0.1:7000"}
        assert sleeps == [0.25, 0.5]  # doubling backoff
        assert source.stats.errors == 2
    finally:
        await it.aclose()


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_follow_applies_sets_and_skips_empty(api: FakeApiServer) -> None:
    api.put(endpoint_slice("ledger-abc", {"10.0.0.2": True, "10.0.0.1": True}))
    applied: list[tuple[str, ...]] = []
    task = asyncio.create_task(follow(_source(api).updates(), applied.append))
    try:
        await until(lambda: applied, 10, "the first set applied")
        api.put(endpoint_slice("ledger-abc", {"10.0.0.1": False}))  # nobody ready
        api.put(endpoint_slice("ledger-abc", {"10.0.0.3": True}))
        await until(lambda: len(applied) >= 2, 10, "the second set applied")
        assert applied == [("10.0.0.1:7000", "10.0.0.2:7000"), ("10.0.0.3:7000",)]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
