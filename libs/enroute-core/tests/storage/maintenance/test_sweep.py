"""The layer sweep and trash reclamation (issue "Layer maintenance", items 3 and 4;
seed 001, "Reclaiming layer files"; DESIGN "Repository state": the upload window)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.storage.maintenance import (
    LayerFile,
    SweepRecord,
    TrashMarker,
    list_layer_files,
    plan_sweep,
    read_sweep_record,
    reclaim_trash,
    sweep_layers,
)
from enroute_core.storage.objectstore import ObjectStore

StoreFactory = Callable[[str], Awaitable[ObjectStore]]
LAYERS = "repos/app/layers/"
RECORD = "repos/app/sweep"
TRASH = "trash/app/"
T0 = 1_700_000_000_000_000
HOUR = 3_600_000_000


def lf(gen: int, n: int) -> LayerFile:
    return LayerFile(gen, n.to_bytes(16, "big"))


async def put_files(store: ObjectStore, *files: LayerFile) -> None:
    for f in files:
        await store.put(LAYERS + f.name, b"layer %d" % f.gen)


async def names(store: ObjectStore) -> set[str]:
    files, _ = await list_layer_files(store, LAYERS)
    return {f.name for f in files}


# -- the plan (pure) --------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    st.sets(st.tuples(st.integers(0, 40), st.integers(0, 3)), max_size=30),
    st.data(),
    st.integers(0, 40),
    st.lists(st.integers(0, 2 * HOUR), min_size=1, max_size=5),
)
def test_sweep_plan_deletes_only_unnamed_files_out_of_the_window_after_retention(
    files: set[tuple[int, int]], data: st.DataObject, gen_max: int, steps: list[int]
) -> None:
    listed = [lf(g, n) for g, n in files]
    named: set[str] = set()
    if listed:
        named = {f.name for f in data.draw(st.sets(st.sampled_from(listed)))}
    record = SweepRecord()
    now = T0
    first_seen: dict[LayerFile, int] = {}
    for step in steps:
        now += step
        plan = plan_sweep(
            record, listed, named, sweepable_gen_max=gen_max, now_us=now, retention_us=HOUR
        )
        for f in listed:
            if f.name not in named and f.gen <= gen_max:
                first_seen.setdefault(f, now)
        for f in plan.delete:
            assert f.name not in named and f.gen <= gen_max
            assert now - first_seen[f] >= HOUR
        for e in plan.record.entries:
            assert e.file.name not in named and e.file.gen <= gen_max
            assert e.seen_us == first_seen[e.file]
        listed = [f for f in listed if f not in plan.delete]
        record = plan.record
    assert not any(now - first_seen[e.file] >= HOUR for e in record.entries)


# -- against stores ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["file", "moto"])
async def test_sweep_records_then_deletes_after_the_retention(
    make_store: StoreFactory, backend: str
) -> None:
    store = await make_store(backend)
    named, replaced, in_window, old = lf(5, 1), lf(6, 2), lf(9, 3), lf(2, 4)
    await put_files(store, named, replaced, in_window, old)
    await store.put(LAYERS + "stray.tmp", b"x")
    keep = {named.name}

    async def sweep(now: int) -> tuple[str, ...]:
        report = await sweep_layers(
            store,
            layers_prefix=LAYERS,
            record_key=RECORD,
            named=keep,
            sweepable_gen_max=7,
            now_us=now,
            retention_us=HOUR,
        )
        assert report.other_keys == 1 and report.kept_in_window == 1
        return report.deleted

    assert await sweep(T0) == ()
    record, _ = await read_sweep_record(store, RECORD)
    assert [(e.file, e.seen_us) for e in record.entries] == [(old, T0), (replaced, T0)]
    assert await sweep(T0 + HOUR - 1) == ()
    deleted = await sweep(T0 + HOUR)
    assert sorted(deleted) == sorted([old.name, replaced.name])
    assert await names(store) == {named.name, in_window.name}
    record, _ = await read_sweep_record(store, RECORD)
    assert record.entries == () and record.updated_us == T0 + HOUR
    assert await store.head(LAYERS + "stray.tmp") is not None


@pytest.mark.asyncio
async def test_sweep_record_carries_over_to_the_next_incarnation(
    make_store: StoreFactory,
) -> None:
    """Seed 001, "Created again": the new incarnation's sweep finds the files of E
    unnamed and below its window, and deletes them like any other file; the record
    written under E only delays deletions."""
    store = await make_store("file")
    last_gen_e, window = 10, 4
    files_e = [lf(g, g) for g in range(1, last_gen_e + 1)]
    await put_files(store, *files_e)
    # Under E: the manifest names the newest two; the window holds gens 7..10.
    named_e = {files_e[-1].name, files_e[-2].name}
    await sweep_layers(
        store, layers_prefix=LAYERS, record_key=RECORD, named=named_e,
        sweepable_gen_max=last_gen_e - window, now_us=T0, retention_us=HOUR,
    )  # fmt: skip
    # E + 1 starts at upload_gen last + W + 1 with an empty manifest, then pushes.
    start = last_gen_e + window + 1
    live = [lf(start, 100), lf(start + 1, 101)]
    await put_files(store, *live)
    args = {"layers_prefix": LAYERS, "record_key": RECORD, "retention_us": HOUR}
    report = await sweep_layers(
        store, named={f.name for f in live}, sweepable_gen_max=start + 1 - window,
        now_us=T0 + HOUR // 2, **args,
    )  # fmt: skip
    assert report.deleted == ()
    report = await sweep_layers(
        store, named={f.name for f in live}, sweepable_gen_max=start + 1 - window,
        now_us=T0 + HOUR, **args,
    )  # fmt: skip
    # Gens 1..6 were recorded under E at T0; 7..10 were first seen under E + 1.
    assert sorted(report.deleted) == sorted(f.name for f in files_e[:6])
    report = await sweep_layers(
        store, named={f.name for f in live}, sweepable_gen_max=start + 1 - window,
        now_us=T0 + 2 * HOUR, **args,
    )  # fmt: skip
    assert sorted(report.deleted) == sorted(f.name for f in files_e[6:])
    assert await names(store) == {f.name for f in live}


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["file", "moto"])
async def test_trash_is_reclaimed_after_retention_once_the_state_object_shows_the_deletion(
    make_store: StoreFactory, backend: str
) -> None:
    store = await make_store(backend)
    gone = [lf(g, g) for g in (1, 3, 8)]
    live = [lf(20, 20)]  # E + 1's files: above E's last generation plus the window
    await put_files(store, *gone, *live)
    marker = TrashMarker(incarnation=1, last_upload_gen=8, time_us=T0)
    await store.put(TRASH + f"{1:016x}", marker.encode())
    deleted_in_state = False

    async def ended(incarnation: int) -> bool:
        assert incarnation == 1
        return deleted_in_state

    async def reclaim(now: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
        r = await reclaim_trash(
            store, trash_prefix=TRASH, layers_prefix=LAYERS, ended=ended, now_us=now,
            retention_us=HOUR,
        )  # fmt: skip
        return r.waiting, r.markers_removed, r.deleted

    # The marker is written before the state object is swapped (seed 001, step 2).
    assert await reclaim(T0 + 2 * HOUR) == ((1,), (), ())
    deleted_in_state = True
    assert await reclaim(T0 + HOUR - 1) == ((), (), ())
    waiting, removed, deleted = await reclaim(T0 + HOUR)
    assert waiting == () and removed == (1,)
    assert sorted(deleted) == sorted(f.name for f in gone)
    assert await names(store) == {live[0].name}
    assert (await store.list(TRASH, limit=10)).items == ()
