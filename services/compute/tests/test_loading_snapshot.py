"""A push ingested against a view whose layer is not local (seed 004, "Machines": ingest
loads the bases of the thin pack and every snapshot delta base before reading them).

The repository's layer is opened remotely (a ``file://`` store on another
filesystem, so no link) under a one-chunk disk budget: only its metadata is
local. A thin pack of a new commit, whose deltas name bases in that layer, is
ingested against the view: read directly, the first base fails with
``NotLocal``; through :class:`LoadingSnapshot` the bases are loaded (with their
chains) and ingest succeeds, and every pin goes once it is released.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from enroute_compute.host import LoadingSnapshot, RepositoryHost
from enroute_compute.main import SystemClock
from enroute_compute.push import Pusher
from enroute_core.base.errors import NotLocal
from enroute_core.base.ids import LogIndex, ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_core.engine.ingest import ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT
from enroute_core.engine.view import View
from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_core.git.source import BytesSource
from enroute_core.state.model import LayerEntry, LayerKind
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import StoreOptions
from enroute_core.storage.objectstore.file import FileStore
from enroute_testing.gitcli import run_git
from enroute_testing.local_ledger import LocalLedger
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path("/dev/shm") / f"enroute-{uuid.uuid4().hex}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.asyncio
async def test_a_thin_push_loads_its_bases_first(tmp_path: Path, shm_dir: Path) -> None:
    spec = RepoSpec(seed=7, commits=30, files=30, file_bytes=60_000, binary_files=2, branches=0)
    repo = generate_repo(tmp_path / "r.git", spec)
    old = repo.refs[b"refs/heads/main"].decode()
    base = ingest_pack(
        BytesSource(pack_objects(repo.path)),
        [ObjectId(bytes.fromhex(v.decode())) for v in set(repo.refs.values())],
        EMPTY_SNAPSHOT,
        fsck=None,
    )
    assert base.data is not None and base.sealed is not None
    sealed = base.sealed
    assert sealed.file_size > 2 * CHUNK_BYTES
    # a new commit that edits every text file a little: its blobs delta against the layer's
    work = tmp_path / "work"
    run_git(["clone", "-q", str(repo.path), str(work)], cwd=tmp_path)
    for path in sorted(work.rglob("*")):
        plain = path.is_file() and not path.is_symlink() and path.suffix != ".bin"
        if plain and ".git" not in path.parts:
            path.write_bytes(path.read_bytes() + b"one more line\n")
    run_git(["-c", "user.name=T", "-c", "user.email=t@example.com",
             "commit", "-q", "-am", "edit"], cwd=work)  # fmt: skip
    new = run_git(["rev-parse", "HEAD"], cwd=work).decode().strip()
    thin = pack_objects(work, thin=True, ofs_delta=False, revs=(new,), exclude=(old,))

    store = FileStore(str(shm_dir), StoreOptions(fsync=False))
    await store.put("L/base", base.data)
    svc = LayerService(store, tmp_path / "node", disk_budget_bytes=CHUNK_BYTES)
    opened = await svc.open_layer("r", "L/base", sealed.file_size, sealed.meta_size)
    assert not opened.linked
    entry = LayerEntry(
        kind=LayerKind.STORED, first_id=0, id_count=sealed.id_count,
        object_count=sealed.object_count, upload_gen=1, file_size=sealed.file_size,
        meta_size=sealed.meta_size, root=sealed.root, pin=LogIndex(0),
    )  # fmt: skip
    view = View([(entry, opened.reader)])
    tips = [ObjectId(bytes.fromhex(new))]
    with pytest.raises(NotLocal):  # nothing loaded: the first base read fails
        await asyncio.to_thread(ingest_pack, BytesSource(thin), tips, view, fsck=None)
    snapshot = LoadingSnapshot(view, svc, asyncio.get_running_loop(), DEFAULT_LIMITS)
    try:
        result = await asyncio.to_thread(ingest_pack, BytesSource(thin), tips, snapshot, fsck=None)
    finally:
        snapshot.release()
    assert result.sealed is not None and result.sealed.object_count > 0
    assert snapshot.rounds >= 1
    assert svc.loaded_chunks["push"] >= 1
    disk = svc.stats().disk_budget
    assert disk is not None
    data_end = sealed.file_size - sealed.meta_size
    assert disk.pinned_bytes == sealed.file_size - (data_end - data_end % CHUNK_BYTES)
    await svc.close()


def _push_body(ref: bytes, old: str, new: str, pack: bytes) -> bytes:
    line = f"{old} {new} ".encode() + ref + b"\x00report-status ofs-delta\n"
    return pkt_line(line) + FLUSH_PKT + pack


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_ingests_never_hold_the_threads_their_loads_need(
    tmp_path: Path, shm_dir: Path
) -> None:
    """An ingest that waits for its loads runs on the push's own threads (push._INGESTS).

    Loads write their chunks on asyncio's default pool. Here that pool has one
    thread, as if every other thread of it were held: a thin push to a compute
    whose copy of the repository's layer holds only metadata (a new node under a
    one-chunk budget) must still load its bases and land. With the ingest on the
    default pool (before), it held the only thread while its load waited for it:
    the push never ended (this test timed out).
    """
    spec = RepoSpec(seed=7, commits=30, files=30, file_bytes=60_000, binary_files=2, branches=0)
    repo = generate_repo(tmp_path / "r.git", spec)
    old = repo.refs[b"refs/heads/main"].decode()
    work = tmp_path / "work"
    run_git(["clone", "-q", str(repo.path), str(work)], cwd=tmp_path)
    for path in sorted(work.rglob("*")):
        plain = path.is_file() and not path.is_symlink() and path.suffix != ".bin"
        if plain and ".git" not in path.parts:
            path.write_bytes(path.read_bytes() + b"one more line\n")
    run_git(["-c", "user.name=T", "-c", "user.email=t@example.com",
             "commit", "-q", "-am", "edit"], cwd=work)  # fmt: skip
    new = run_git(["rev-parse", "HEAD"], cwd=work).decode().strip()
    thin = pack_objects(work, thin=True, ofs_delta=False, revs=(new,), exclude=(old,))
    ledger = LocalLedger()
    store = FileStore(str(shm_dir), StoreOptions(fsync=False))

    async def push(node: str, body: bytes) -> tuple[bytes, int]:
        """The report, and the chunks the push loaded."""
        layers = LayerService(store, tmp_path / node, disk_budget_bytes=CHUNK_BYTES)
        host = RepositoryHost(ledger, layers, SystemClock(), inline_max_bytes=1024)
        try:
            out = b"".join([p async for p in Pusher(host).receive_pack("r", _once(body))])
            return out, layers.loaded_chunks["push"]
        finally:
            await host.close()
            await layers.close()

    first, _ = await push("node-1", _push_body(b"refs/heads/main", "0" * 40, old,
                                            pack_objects(repo.path)))  # fmt: skip
    assert b"unpack ok" in first and b"ok refs/heads/main" in first, first
    loop = asyncio.get_running_loop()
    one = ThreadPoolExecutor(1, thread_name_prefix="default")
    loop.set_default_executor(one)
    report, loaded = await push("node-2", _push_body(b"refs/heads/main", old, new, thin))
    assert b"unpack ok" in report and b"ok refs/heads/main" in report, report
    assert loaded >= 1, "the thin push loaded nothing: the test proves nothing"
