"""Seed 004, "Never waiting on the object store", Machines, and "Disk budget", Pins.

A real machine (resolve the full bodies of objects through their delta chains)
runs over two layers built from a real git pack: full entries in one layer,
REF_DELTA entries in another, so chains cross layers. The layers are opened
remotely with no local copy (a file:// store on another filesystem: no links)
under a disk budget smaller than the data.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.base.errors import NotLocal
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import MiB
from enroute_core.git.delta import apply_delta
from enroute_core.git.packindexer import index_pack
from enroute_core.git.source import BytesSource
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.layer import Kind, LayerEntry, SealedLayer, write_layer
from enroute_core.storage.layer.reader import LayerReader
from enroute_core.storage.layers import LayerService, OpenLayer
from enroute_core.storage.machines import (
    MachineContext,
    Progress,
    Ticket,
    chain_of,
    drive,
    entry_ticket,
)
from enroute_core.storage.objectstore import StoreOptions
from enroute_core.storage.objectstore.file import FileStore
from enroute_core.storage.pool import Intent
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects

KIND_OF_TYPE = {2: Kind.TREE, 3: Kind.BLOB}
REF_DELTA = 7


class ThreadRecordingStore(FileStore):
    """Records the thread and range of every GET: only the loader may issue them."""

    gets: list[tuple[int, str, int, int]]

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        self.gets.append((threading.get_ident(), key, start or 0, end or -1))
        return await super().get(key, start=start, end=end)


def payload_of(entry: bytes) -> tuple[int, bytes]:
    """(pack type, inflated payload) of a stored entry (gitformat-pack, "Object entries")."""
    type_num = (entry[0] >> 4) & 7
    pos = 1
    while entry[pos - 1] & 0x80:
        pos += 1
    if type_num == REF_DELTA:
        pos += 20
    return type_num, zlib.decompress(entry[pos:])


@pytest.fixture(scope="module")
def pack_layers(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[tuple[bytes, SealedLayer], tuple[bytes, SealedLayer], dict[bytes, bytes]]:
    """(full layer, delta layer, oid -> body) from a generated repository's REF_DELTA pack."""
    work = tmp_path_factory.mktemp("repo")
    spec = RepoSpec(seed=4, commits=40, files=30, file_bytes=60_000, binary_files=2)
    repo = generate_repo(work / "r.git", spec)
    pack = pack_objects(repo.path, ofs_delta=False)
    bodies: dict[bytes, bytes] = {}
    res = index_pack(BytesSource(pack), on_object=lambda _i, o, _t, b: bodies.__setitem__(o, b))
    objs = [o for o in res.objects if o.type_num in KIND_OF_TYPE]
    full = sorted((o for o in objs if o.depth == 0), key=lambda o: (o.type_num, o.offset))
    deltas = sorted((o for o in objs if o.depth), key=lambda o: (o.type_num, o.depth, o.offset))
    assert deltas and all(o.entry_type == REF_DELTA for o in deltas)

    def entry(o: object) -> LayerEntry:
        info = o  # PackObjectInfo
        raw = pack[info.offset : info.offset + info.size_in_pack]  # type: ignore[attr-defined]
        return LayerEntry(
            info.oid,  # type: ignore[attr-defined]
            KIND_OF_TYPE[info.type_num],  # type: ignore[attr-defined]
            raw,
            info.object_size,  # type: ignore[attr-defined]
            info.base_oid,  # type: ignore[attr-defined]
            info.depth,  # type: ignore[attr-defined]
        )

    return (
        write_layer([entry(o) for o in full]),
        write_layer([entry(o) for o in deltas]),
        {o.oid: bodies[o.oid] for o in objs},
    )


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


class BodyMachine:
    """Resolves full bodies; parks each object with its whole chain, reads only local bytes."""

    def __init__(self, items: list[tuple[OpenLayer, int]], layers: list[OpenLayer]) -> None:
        self.items = items
        self.layers = layers
        self.bodies: dict[int, bytes] = {}
        self.computed: dict[int, int] = {}
        self.threads: set[int] = set()
        self.handed: list[object] = []
        self.started = False

    def lookup(self, oid: ObjectId) -> tuple[LayerReader, int] | None:
        for layer in self.layers:
            i = layer.reader.lookup(oid)
            if i is not None:
                return layer.reader, i
        return None

    def _resolve(self, item: int) -> None:
        layer, i = self.items[item]
        chain = chain_of(layer.reader, i, self.lookup)
        _, body = payload_of(chain[-1][0].entry_bytes(chain[-1][1], Intent.POINT))
        for reader, j in reversed(chain[:-1]):
            _, delta = payload_of(reader.entry_bytes(j, Intent.POINT))
            body = apply_delta(body, delta)
        self.bodies[item] = body
        self.computed[item] = self.computed.get(item, 0) + 1

    def run(self, ctx: MachineContext) -> Progress:
        self.threads.add(threading.get_ident())
        for r in ctx.resumed:
            assert isinstance(r.ticket.item, int)
            self._resolve(r.ticket.item)
            self.handed.append(r.pins)
            r.pins.release()  # read: the bytes may go now
        tickets: list[Ticket] = []
        if not self.started:
            self.started = True
            for n, (layer, i) in enumerate(self.items):
                try:
                    self._resolve(n)  # whatever is local already
                except NotLocal:
                    tickets.append(entry_ticket(n, [(layer.reader, i)], self.lookup))
        return Progress(done=len(self.bodies) == len(self.items), tickets=tuple(tickets))


@pytest.mark.interop
@pytest.mark.asyncio
async def test_machine_resolves_chains_under_a_small_budget(
    pack_layers: tuple[tuple[bytes, SealedLayer], tuple[bytes, SealedLayer], dict[bytes, bytes]],
    tmp_path: Path,
    shm_dir: Path,
) -> None:
    (full_data, full_sealed), (delta_data, delta_sealed), bodies = pack_layers
    store = ThreadRecordingStore(str(shm_dir), StoreOptions(fsync=False))
    store.gets = []
    await store.put("L/full", full_data)
    await store.put("L/delta", delta_data)
    total = full_sealed.file_size + delta_sealed.file_size
    budget = MiB  # smaller than the data, which spans several chunks
    assert total > 3 * budget
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=budget)
    full = await svc.open_layer("r", "L/full", full_sealed.file_size, full_sealed.meta_size)
    delta = await svc.open_layer("r", "L/delta", delta_sealed.file_size, delta_sealed.meta_size)
    assert not full.linked and not delta.linked
    meta_gets = len(store.gets)
    items = [(delta, i) for i in range(delta.reader.object_count)]
    items += [(full, i) for i in range(0, full.reader.object_count, 7)]
    machine = BodyMachine(items, [full, delta])
    loop_thread = threading.get_ident()

    stats = await drive(machine, svc)

    expected = [bodies[lay.reader.record(i).oid] for lay, i in items]
    assert [machine.bodies[n] for n in range(len(items))] == expected
    assert set(machine.computed.values()) == {1}  # nothing redone
    # items whose chains sit in the (pinned, local) metadata chunk need no ticket
    assert stats.resumed == stats.tickets and 0 < stats.tickets <= len(items)
    assert loop_thread not in machine.threads  # the machine runs on the blocking pool
    assert {t for t, *_ in store.gets} == {loop_thread}  # only the loader issues GETs
    # each chunk fetched once, however many chains share it
    fetched = [
        (key, c)
        for _, key, s, e in store.gets[meta_gets:]
        for c in range(s // CHUNK_BYTES, -(-e // CHUNK_BYTES))
    ]
    assert len(fetched) == len(set(fetched)) == svc.stats().chunks_fetched
    # pins went to the machine and it released them; then the budget evicted down
    assert machine.handed and not any(p.held for p in machine.handed)  # type: ignore[attr-defined]
    disk = svc.stats().disk_budget
    assert disk is not None
    meta_bytes = sum(
        min(CHUNK_BYTES, lay.copy.size - c * CHUNK_BYTES)
        for lay in (full, delta)
        for c in range(lay.reader.data_end // CHUNK_BYTES, lay.copy.chunk_count)
    )
    assert disk.pinned_bytes == meta_bytes
    assert disk.evictions > 0 and disk.present_bytes <= max(budget, meta_bytes)
    await svc.close()


class EventMachine:
    """Two tickets: the first waits for an event the machine fires when it resumes the second."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.first: asyncio.Future[None] = loop.create_future()
        self.seen: list[object] = []

    def run(self, ctx: MachineContext) -> Progress:
        for r in ctx.resumed:
            self.seen.append(r.ticket.item)
            if r.ticket.item == "second":
                self.loop.call_soon_threadsafe(self.first.set_result, None)
        if ctx.run == 0:
            return Progress(
                done=False,
                tickets=(
                    Ticket("first", events=(self.first,)),
                    Ticket("second", events=(_tick(),)),
                ),
            )
        return Progress(done=len(self.seen) == 2)


async def _tick() -> None:
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_ticket_resumes_without_waiting_for_the_others(
    tmp_path: Path, shm_dir: Path
) -> None:
    store = FileStore(str(shm_dir), StoreOptions(fsync=False))
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=MiB)
    machine = EventMachine(asyncio.get_running_loop())
    stats = await asyncio.wait_for(drive(machine, svc), 5)  # waiting for all would deadlock
    assert machine.seen == ["second", "first"] and stats.resume_order == [1, 0]
    await svc.close()


class FailingMachine:
    def __init__(self, layer: OpenLayer) -> None:
        self.layer = layer

    def run(self, ctx: MachineContext) -> Progress:
        ticket = entry_ticket("x", [(self.layer.reader, 0)], lambda _o: None, events=(_boom(),))
        return Progress(done=False, tickets=(ticket,))


async def _boom() -> None:
    await asyncio.sleep(0.01)
    raise RuntimeError("replay group failed")


@pytest.mark.interop
@pytest.mark.asyncio
async def test_a_failed_wait_fails_the_drive_and_releases_pins(
    pack_layers: tuple[tuple[bytes, SealedLayer], tuple[bytes, SealedLayer], dict[bytes, bytes]],
    tmp_path: Path,
    shm_dir: Path,
) -> None:
    (full_data, full_sealed), _, _ = pack_layers
    store = FileStore(str(shm_dir), StoreOptions(fsync=False))
    await store.put("L/full", full_data)
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=MiB)
    full = await svc.open_layer("r", "L/full", full_sealed.file_size, full_sealed.meta_size)
    disk = svc.stats().disk_budget
    assert disk is not None
    pinned_at_open = disk.pinned_bytes
    with pytest.raises(RuntimeError, match="replay group failed"):
        await drive(FailingMachine(full), svc)
    disk = svc.stats().disk_budget
    assert disk is not None and disk.pinned_bytes == pinned_at_open
    await svc.close()
