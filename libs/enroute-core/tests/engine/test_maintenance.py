"""One repository's maintenance on a file:// store (issue "Layer maintenance";
seed 001, "Reclaiming layer files"): the lease gates the work, the sweep and
trash reclamation read the repository state, and a flush goes from the plan
through the merge to ``replace_layers``.

Scenario of the issue's acceptance: delete a repository with stored layers;
after the retention its files and trash marker are gone; re-create the name,
push, delete again: nothing of either incarnation is left, and nothing of the
live one is ever deleted.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from enroute_core.base.errors import PreconditionFailed
from enroute_core.base.ids import LogIndex
from enroute_core.engine.compaction import Stretch
from enroute_core.engine.maintenance import (
    MaintenanceSettings,
    RepoMaintainer,
    merge_stretch,
    names_with_trash,
)
from enroute_core.engine.view import View
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import encode_entry_header
from enroute_core.git.source import BytesSource
from enroute_core.state import OutcomeCode, RepoState, apply
from enroute_core.state.codec import encode_state
from enroute_core.state.model import LayerEntry as ManifestEntry
from enroute_core.state.model import LayerKind as ManifestKind
from enroute_core.state.names import layers_prefix, state_key, trash_key
from enroute_core.storage.layer import Kind, LayerEntry, LayerReader, write_layer
from enroute_core.storage.maintenance import TrashMarker, list_layer_files
from enroute_core.storage.objectstore import ObjectStore, StoreOptions, open_store
from enroute_testing.pushed import inline_entry

REPO = "team/app"
T0 = 1_700_000_000_000_000
HOUR = 3_600_000_000
W = 4
SETTINGS = MaintenanceSettings(
    lease_duration_us=60_000_000, lease_margin_us=5_000_000, sweep_retention_us=HOUR
)


def stored(gen: int, n: int, first_id: int) -> ManifestEntry:
    return ManifestEntry(
        kind=ManifestKind.STORED,
        first_id=first_id,
        id_count=1,
        object_count=1,
        upload_gen=gen,
        file_size=100,
        meta_size=50,
        root=n.to_bytes(32, "big"),
        pin=LogIndex(0),
    )


def live(incarnation: int, manifest: tuple[ManifestEntry, ...], upload_gen: int) -> RepoState:
    return RepoState(
        incarnation=incarnation,
        version=10,
        head=b"refs/heads/main",
        manifest=manifest,
        next_id=max((e.end_id for e in manifest), default=0),
        upload_gen=upload_gen,
        upload_window=W,
    )


def deleted(incarnation: int, upload_gen: int) -> RepoState:
    return RepoState(
        incarnation=incarnation, deleted=True, version=20, upload_gen=upload_gen, upload_window=W
    )


async def upload(store: ObjectStore, *entries: ManifestEntry) -> None:
    for e in entries:
        assert e.key is not None
        await store.put(layers_prefix(REPO) + e.key, b"layer")


async def files(store: ObjectStore) -> set[str]:
    found, _ = await list_layer_files(store, layers_prefix(REPO))
    return {f.name for f in found}


async def delete_incarnation(store: ObjectStore, state: RepoState, now: int) -> None:
    """What the ledger does (seed 001, "Deletion" step 2): marker, then the state object."""
    marker = TrashMarker(state.incarnation, state.upload_gen, now)
    await store.put(trash_key(REPO, state.incarnation), marker.encode())
    await store.put(state_key(REPO), encode_state(deleted(state.incarnation, state.upload_gen)))


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    opened = open_store(f"file://{tmp_path}/store", StoreOptions())
    yield opened
    await opened.close()


@pytest.mark.asyncio
async def test_only_the_lease_holder_maintains(store: ObjectStore) -> None:
    a = RepoMaintainer(store, REPO, "compute-a", SETTINGS)
    b = RepoMaintainer(store, REPO, "compute-b", SETTINGS)
    assert await a.acquire(T0) and not await b.acquire(T0 + 1)
    with pytest.raises(PreconditionFailed):
        await b.sweep(live(1, (), 1), T0 + 1)
    await a.sweep(live(1, (), 1), T0 + 1)
    # The holder stops acting a margin before expiry; after it, b takes over.
    assert a.holds(T0 + 54_999_999) and not a.holds(T0 + 55_000_000)
    assert await b.acquire(T0 + 60_000_000) and b.held is not None
    assert b.held.lease.term == 2
    assert not await a.acquire(T0 + 60_000_001)
    await b.release(T0 + 60_000_002)
    assert await a.acquire(T0 + 60_000_003)


@pytest.mark.asyncio
async def test_seed001_delete_recreate_delete_leaves_nothing_and_spares_the_live(
    store: ObjectStore,
) -> None:
    m = RepoMaintainer(store, REPO, "compute-a", SETTINGS)
    now = T0
    # Incarnation 1: three stored layers, the first replaced by a compaction (gen 3).
    e1 = [stored(1, 1, 0), stored(2, 2, 1), stored(3, 3, 2)]
    await upload(store, *e1)
    s1 = live(1, (e1[2],), 3)
    await store.put(state_key(REPO), encode_state(s1))
    assert await m.acquire(now)
    await m.sweep(s1, now)
    assert await files(store) == {e.key for e in e1}  # all still in the window (gen > -1)
    await delete_incarnation(store, s1, now)
    # Incarnation 2 claims gen 3 + W + 1 and pushes; its files must survive everything.
    start = 3 + W + 1
    e2 = [stored(start, 10, 0), stored(start + 1, 11, 1)]
    await upload(store, *e2)
    s2 = live(2, tuple(e2), start + 1)
    await store.put(state_key(REPO), encode_state(s2))
    keep2 = {e.key for e in e2}
    removed_at: list[int] = []
    for step in range(4):
        now += HOUR // 2
        assert await m.acquire(now)
        report = await m.reclaim_trash(now)
        if report.markers_removed:
            removed_at.append(step)
        await m.sweep(s2, now)
        assert keep2 <= await files(store), step
    assert removed_at == [1]  # the retention counts from the marker's time
    assert await files(store) == keep2
    assert (await store.list("trash/", limit=10)).items == ()
    # Delete incarnation 2: after the retention nothing of either is left.
    await delete_incarnation(store, s2, now)
    now += HOUR
    assert await m.acquire(now)
    report = await m.reclaim_trash(now)
    assert report.markers_removed == (2,)
    assert await files(store) == set()
    assert (await store.list("trash/", limit=10)).items == ()


@pytest.mark.asyncio
async def test_trash_waits_while_the_state_object_shows_the_incarnation_live(
    store: ObjectStore,
) -> None:
    m = RepoMaintainer(store, REPO, "compute-a", SETTINGS)
    e1 = [stored(1, 1, 0)]
    await upload(store, *e1)
    s1 = live(1, tuple(e1), 1)
    await store.put(state_key(REPO), encode_state(s1))
    await store.put(trash_key(REPO, 1), TrashMarker(1, 1, T0).encode())  # crash before swap
    assert await m.acquire(T0 + 2 * HOUR)
    report = await m.reclaim_trash(T0 + 2 * HOUR)
    assert report.waiting == (1,) and report.deleted == ()
    assert await files(store) == {e1[0].key}


def blob_layer(bodies: list[bytes]) -> tuple[bytes, ManifestEntry, LayerReader]:
    entries = [
        LayerEntry(
            object_id(ObjectType.BLOB, b),
            Kind.BLOB,
            encode_entry_header(3, len(b)) + zlib.compress(b),
            len(b),
            None,
            0,
        )
        for b in bodies
    ]
    data, sealed = write_layer(entries)
    reader = LayerReader.open(BytesSource(data), meta_size=sealed.meta_size)
    return data, inline_entry(sealed, 0, 1), reader


def test_flush_from_plan_to_replace_layers() -> None:
    """The loop's flush: plan on the manifest, merge the stretch of the view, commit."""
    layers = []
    first = 0
    for n in range(3):
        _, entry, reader = blob_layer([b"blob %d" % n, b"shared"])
        entry = ManifestEntry(
            entry.kind, first, entry.id_count, entry.object_count, 0,
            entry.file_size, entry.meta_size, entry.root, LogIndex(n + 1),
        )  # fmt: skip
        layers.append((entry, reader))
        first = entry.end_id
    state = live(1, tuple(e for e, _ in layers), 0)
    state = RepoState(**{**{f: getattr(state, f) for f in state.__slots__}, "next_id": first})
    m = RepoMaintainer(open_store("file:///nonexistent"), REPO, "compute-a", SETTINGS)
    stretch = m.next_merge(state)
    assert stretch == Stretch(0, 3)
    parts: list[bytes] = []
    merged = merge_stretch(View(layers), stretch, parts.append)
    assert merged.dropped == 2 and merged.id_count == 6
    result = apply(state, merged.replace_command(1, upload_gen=0), log_index=50)
    assert result.outcome.code is OutcomeCode.OK, result.outcome
    assert result.state.pins() == ()
    assert m.next_merge(result.state) is None


@pytest.mark.asyncio
async def test_names_with_trash_lists_each_name_once(store: ObjectStore) -> None:
    for name, e in [("team/app", 1), ("team/app", 2), ("solo", 1)]:
        await store.put(trash_key(name, e), TrashMarker(e, e, T0).encode())
    await store.put("trash/solo/not/a/marker", b"x")
    await store.put("trash/bad!name/0000000000000001", b"x")
    assert await names_with_trash(store) == ["solo", "team/app"]
