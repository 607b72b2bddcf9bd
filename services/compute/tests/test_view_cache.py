"""Views are a cache (issue 19, item 1; docs/fleet.md): a compute evicts idle views and
those over its count or byte budget, ends their subscriptions, and opens them again on
the next request, current.

Against the in-process ledger with a clock that moves only when told; the same
eviction with real processes is ``tests/interop/test_fleet_eviction.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from enroute_compute.fetch import Fetcher
from enroute_compute.host import DEFAULT_HEAD, VIEW_FIXED_BYTES, RepositoryHost
from enroute_compute.ledger_port import BarrierPoint, CreateMode
from enroute_compute.push import Pusher
from enroute_core.base.clock import FixedClock
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_core.state import Commit, LayerKind, RefUpdate
from enroute_core.storage.heap import release_free_heap
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import StoreOptions
from enroute_core.storage.objectstore.file import FileStore
from enroute_testing.local_ledger import LocalLedger
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects

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
async def test_a_maintenance_read_is_not_a_use() -> None:
    """Layer maintenance reads with ``use=False``: its visits (a flush, a sweep minutes
    after the push) must not keep an idle view open."""
    _ledger, host, clock = await hosting(["a"])
    try:
        await host.read("a")
        clock.advance_us(IDLE_MS * 1000 - 1)
        await host.read("a", use=False)
        clock.advance_us(1)
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


# -- an evicted view's stored layers are closed in the layer service --------------------


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def stored_hosting(
    tmp_path: Path,
    names: list[str],
    *,
    disk_budget_bytes: int | None = None,
    node: Path | None = None,
) -> tuple[RepositoryHost, LayerService, dict[str, bytes]]:
    """A host whose pushes all go to stored layers (``inline_max_bytes=0``) over a
    ``file://`` store, each of ``names`` pushed once; answers the host, its layer
    service and each name's tip. Local copies are links unless ``node`` is on another
    filesystem."""
    repo = generate_repo(tmp_path / "src.git", RepoSpec(seed=19, commits=6, files=8, branches=0))
    tip = repo.refs[b"refs/heads/main"].decode()
    pack = pack_objects(repo.path)
    store = FileStore(str(tmp_path / "store"), StoreOptions(fsync=False))
    layers = LayerService(store, node or tmp_path / "node", disk_budget_bytes=disk_budget_bytes)
    clock = FixedClock(now_us=1_000_000)
    # wait_s bounds a view's wait for a version; pushes here run ingest threads, which a
    # loaded CI machine can hold up for seconds
    host = RepositoryHost(LocalLedger(), layers, clock, wait_s=30.0, limits=limits(),
                          inline_max_bytes=0)  # fmt: skip
    line = f"{'0' * 40} {tip} refs/heads/main\x00report-status ofs-delta\n".encode()
    body = pkt_line(line) + FLUSH_PKT + pack
    for name in names:
        report = b"".join([p async for p in Pusher(host).receive_pack(name, _once(body))])
        assert b"ok refs/heads/main" in report, report
        snap = await host.read(name)
        assert [e.kind for e in snap.state.manifest] == [LayerKind.STORED]
    return host, layers, {name: bytes.fromhex(tip) for name in names}


async def clone(
    host: RepositoryHost, name: str, tip: bytes, fetcher: Fetcher | None = None
) -> bytes:
    """The whole answer to a protocol v0 clone of ``name`` (want the tip, done)."""
    want = pkt_line(b"want " + tip.hex().encode() + b" ofs-delta side-band-64k\n")
    body = want + FLUSH_PKT + pkt_line(b"done\n")
    fetcher = fetcher or Fetcher(host)
    return b"".join([c async for c in fetcher.upload_pack(name, "", body)])


@pytest.mark.asyncio
async def test_eviction_closes_the_views_stored_layers(tmp_path: Path) -> None:
    """Seed 004, "Files and tiers" (storage keeps opened layers for reuse) and
    "Metadata is always local" (an open layer's metadata stays in memory): an evicted
    view must not leave its layers open (issue 19, docs/fleet.md), and a re-open opens
    them again from the local copy, loading metadata only."""
    host, layers, tips = await stored_hosting(tmp_path, ["a", "b"])
    try:
        fetcher = Fetcher(host)
        before = await clone(host, "a", tips["a"], fetcher)
        assert b"PACK" in before
        assert layers.layers_open == 2
        assert "a" in fetcher._refs and "a" in fetcher._plans
        gets = layers.stats().gets
        assert isinstance(host.clock, FixedClock)
        host.clock.advance_us(IDLE_MS * 1000)
        assert host.evict(host.clock.now_us()) == 2
        assert layers.layers_open == 0 and layers.stats().layers_closed == 2
        # nothing kept for the evicted views' states either (they are never seen again)
        assert "a" not in fetcher._refs and "a" not in fetcher._plans
        after = await clone(host, "a", tips["a"], fetcher)
        assert after == before, "a clone after the re-open differs"
        assert layers.layers_open == 1  # a's layer again; b's stays closed
        assert layers.stats().gets == gets, "the re-open read the store: the copy is local"
    finally:
        await host.close()
        await layers.close()


@pytest.mark.asyncio
async def test_a_pinned_layer_is_closed_when_its_last_read_ends(tmp_path: Path) -> None:
    host, layers, _tips = await stored_hosting(tmp_path, ["a"])
    try:
        snap = await host.read("a")
        assert isinstance(host.clock, FixedClock)
        with host.pin_reads(snap):
            host._evict(host._repos["a"])  # a read still uses the view (a fetch streaming)
            assert layers.layers_open == 1, "closed under a read that pins it"
            assert snap.view.read(next(iter(snap.state.refs.values())).oid) is not None
        assert layers.layers_open == 0, "the last pin went: the layer must close"
        # a view re-opened while a read pins the old one's layers keeps them open
        snap = await host.read("a")
        with host.pin_reads(snap):
            host._evict(host._repos["a"])
            again = await host.read("a")
        assert (
            layers.layers_open == 1
            and again.view.read(next(iter(again.state.refs.values())).oid) is not None
        )
    finally:
        await host.close()
        await layers.close()


@pytest.mark.asyncio
async def test_under_a_disk_budget_a_closed_layers_copy_goes(tmp_path: Path) -> None:
    """Seed 004, "Disk budget": a closed copy would leave the budget while its bytes
    stay on disk, so it goes with its layer; the re-open is one ranged read of the
    metadata ("Metadata is always local") and serves the same clone."""
    node = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"  # another filesystem: no link
    try:
        host, layers, tips = await stored_hosting(
            tmp_path, ["a"], disk_budget_bytes=64 << 20, node=node
        )
        try:
            before = await clone(host, "a", tips["a"])
            name = next(iter(layers._opening))
            record = layers.catalog.get(name)
            assert record is not None and not record.linked
            assert isinstance(host.clock, FixedClock)
            host.clock.advance_us(IDLE_MS * 1000)
            assert host.evict(host.clock.now_us()) == 1 and layers.layers_open == 0
            assert layers.catalog.get(name) is None
            assert not os.path.exists(layers.path_of(name))
            gets = layers.stats().gets
            assert await clone(host, "a", tips["a"]) == before
            assert layers.stats().gets > gets  # the metadata, then what the clone read
        finally:
            await host.close()
            await layers.close()
    finally:
        shutil.rmtree(node, ignore_errors=True)


@pytest.mark.asyncio
async def test_an_evicted_views_bodies_leave_the_node_caches(tmp_path: Path) -> None:
    """Issue 19: the node's object cache is keyed by a view lineage's scope, so what an
    evicted view put there is never hit again; it went only when the LRU reached it,
    and meanwhile every repository touched kept about 0.5 KiB there (the commits its
    ref advertisement peeled: docs/fleet.md). Eviction takes it out."""
    host, layers, tips = await stored_hosting(tmp_path, ["a", "b"])
    try:
        caches = host.caches
        for name in ("a", "b"):
            await host.ref_snapshot_loaded(await host.read(name))
        peeled = len(caches.objects)
        assert peeled >= 2, "the advertisements peeled nothing into the cache"
        await clone(host, "b", tips["b"])
        cloned = len(caches.objects) + len(caches.entries)
        assert isinstance(host.clock, FixedClock)
        host.clock.advance_us(IDLE_MS * 1000)
        host._touch(host._repos["b"])  # b used now: only a is idle
        assert host.evict(host.clock.now_us()) == 1
        assert len(caches.objects) + len(caches.entries) == cloned - peeled // 2
        host.clock.advance_us(IDLE_MS * 1000)
        assert host.evict(host.clock.now_us()) == 1
        assert (len(caches.objects), len(caches.entries)) == (0, 0)
        assert caches.objects.used_bytes == caches.entries.used_bytes == 0
        # a re-open starts a new lineage: its reads fill the cache again
        await host.ref_snapshot_loaded(await host.read("a"))
        assert len(caches.objects) == peeled // 2
    finally:
        await host.close()
        await layers.close()


@pytest.mark.asyncio
async def test_when_the_last_view_goes_the_free_memory_goes_back_to_the_system() -> None:
    """Issue 19, docs/fleet.md "Measuring": the C allocator keeps freed pages inside its
    heaps, so an idle compute's resident memory depended on where its last large block
    lay. When eviction leaves no view open, the free pages go back (malloc_trim(3))."""
    if release_free_heap() is None:
        pytest.skip("no malloc_trim in this C library")
    _ledger, host, clock = await hosting(["a"])
    try:
        await host.read("a")
        # what the requests used, freed around a few blocks still in use: holes in the
        # heap, which free() alone does not give back (only a free top is trimmed)
        blocks = [bytes(2000) for _ in range(40_000)]
        kept = blocks[::50]
        del blocks
        clock.advance_us(IDLE_MS * 1000)
        for _ in range(50):  # the evictor looks every tenth of the idle time
            await asyncio.sleep(0.05)
            if not host.hosted and host.memory_released_bytes:
                break
        assert host.hosted == () and host.evictions == 1
        assert host.memory_released_bytes >= 16 << 20, host.memory_released_bytes
        assert len(kept) == 800
    finally:
        await host.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("large", [True, False])
async def test_a_large_fetch_gives_its_memory_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, large: bool
) -> None:
    """Issue 25: a fetch whose plan and writing held more than the allocator keeps free on
    its own (``PLAN_OBJECT_BYTES`` a planned object against ``heap_trim_threshold_bytes``)
    is followed by a collection and ``malloc_trim`` once its pack is written, logged (a
    depth-1 clone of the `large` profile left its walk's heap in the compute, into the
    next request's peak); a smaller one is not. The one home of it is
    ``RepositoryHost.release_after``, which a large push uses too."""
    if release_free_heap() is None:
        pytest.skip("no malloc_trim in this C library")
    host, layers, tips = await stored_hosting(tmp_path, ["a"])
    try:
        threshold = 1024 if large else 1 << 30
        host.limits = dataclasses.replace(host.limits, heap_trim_threshold_bytes=threshold)
        with caplog.at_level("INFO", logger="enroute_compute.host"):
            assert b"PACK" in await clone(host, "a", tips["a"])
            await host.close()  # waits for a release in flight
    finally:
        await host.close()
        await layers.close()
    released = [r.getMessage() for r in caplog.records if "after a fetch" in r.getMessage()]
    assert len(released) == (1 if large else 0), released


@pytest.mark.asyncio
async def test_building_a_new_layers_view_gives_its_memory_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25: building the view of a pushed layer (its commit graph's temporaries,
    ``VIEW_OBJECT_BYTES`` a layer object) is followed by a collection and a trim, as a
    push's ingest is; asked while another release runs, a release runs once more after
    it (the push's trim runs while its commit goes to the ledger, before the view is
    built), so each of them is logged."""
    if release_free_heap() is None:
        pytest.skip("no malloc_trim in this C library")
    with caplog.at_level("INFO", logger="enroute_compute.host"):
        host, layers, _tips = await stored_hosting(tmp_path, [])
        try:
            host.limits = dataclasses.replace(host.limits, heap_trim_threshold_bytes=1024)
            repo = generate_repo(tmp_path / "a.git", RepoSpec(seed=3, commits=4, files=4))
            tip = repo.refs[b"refs/heads/main"].decode()
            line = f"{'0' * 40} {tip} refs/heads/main\x00report-status ofs-delta\n".encode()
            body = pkt_line(line) + FLUSH_PKT + pack_objects(repo.path)
            report = b"".join([p async for p in Pusher(host).receive_pack("a", _once(body))])
            assert b"ok refs/heads/main" in report, report
            await host.read("a")
            await host.close()  # waits for the releases in flight
        finally:
            await host.close()
            await layers.close()
    said = [r.getMessage() for r in caplog.records if "free memory back" in r.getMessage()]
    assert any("after a push" in m for m in said), said
    assert any("after a view" in m for m in said), said
