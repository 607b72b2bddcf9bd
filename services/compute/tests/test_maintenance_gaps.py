"""Layer maintenance on one compute (issue "Layer maintenance"; docs/maintenance.md):

* local copies of layers that left the manifest are deleted, with their catalog records,
  once no read pins them and the retention has passed;
* a merge that keeps failing backs its repository off instead of running every pass;
* two pushes that carry the same objects into two layers (ingested against one snapshot,
  as concurrent pushes are) are compacted into one copy of each object, and a clone of
  the result is fsck-clean.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import threading
import uuid
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import enroute_compute.maintainer as maintainer_module
import enroute_compute.push as push_module
from enroute_compute.maintainer import Maintainer, MaintainerConfig
from enroute_core.base.clock import FixedClock
from enroute_core.base.errors import CorruptData
from enroute_core.engine.compaction import plan
from enroute_core.engine.maintenance import MaintenanceSettings
from enroute_core.state import LayerKind
from enroute_core.state.names import layer_key, storage_segment
from enroute_core.storage.catalog import CopyRecord
from enroute_core.storage.layer.format import layer_key_name
from enroute_core.storage.objectstore import open_store
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import list_refs

pytestmark = pytest.mark.interop

SEED = int(os.environ.get("ENROUTE_SEED", "11"))


def _on_loop(compute: Any, make: Callable[[], Any]) -> Any:
    async def run() -> Any:
        result = make()
        if asyncio.iscoroutine(result):
            result = await result
        return result

    return asyncio.run_coroutine_threadsafe(run(), compute.loop).result(120)


GONE = layer_key_name(7, b"\x5a" * 32)


def _maintainer(
    compute: Any, tmp_path: Path, *, retention_s: float, clock: Any = None
) -> Maintainer:
    store = open_store(f"file://{tmp_path / 'store'}")
    config = MaintainerConfig(
        interval_s=0.0,  # passes run only when the test asks
        sweep_interval_us=0,
        settings=MaintenanceSettings(sweep_retention_us=int(retention_s * 1e6)),
    )
    return _on_loop(
        compute,
        lambda: Maintainer(compute.host, store, "compute-a", clock or compute.host.clock, config),
    )


def _work(url: str, name: str, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    run_git(["init", "-q", "-b", "main", str(work)], cwd=tmp_path)
    (work / "README").write_text("gaps\n")
    run_git(["add", "."], cwd=work)
    run_git(["commit", "-q", "-m", "initial"], cwd=work)
    run_git(["push", "-q", f"{url}/{name}.git", "main"], cwd=work)
    return work


def _stored_pushes(compute: Any, url: str, name: str, work: Path, count: int) -> None:
    """``count`` pushes of 40 KiB of random bytes each: stored layers (inline_max 16 KiB).

    A push answers before the compute's view applies it (``Pusher``, "read-your-writes"),
    so they end with a read behind a barrier: a maintainer started next starts from a
    view that holds every push, and the last push's state cannot arrive during its first
    pass, where it is a change and brings a second visit."""
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    for i in range(count):
        (work / f"blob{i}.bin").write_bytes(rng.randbytes(40 * 1024))
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"blob {i}"], cwd=work)
        run_git(["push", "-q", f"{url}/{name}.git", "main"], cwd=work)
    _on_loop(compute, lambda: compute.host.read(name))


def _copy_path(compute: Any, name: str, key: str) -> Path:
    layers = compute.host.layers
    return Path(layers.path_of(layers.name_of(storage_segment(name), layer_key(name, key))))


def _stored(compute: Any, name: str) -> list[Any]:
    state = _on_loop(compute, lambda: compute.host.read(name)).state
    return [e for e in state.manifest if e.kind is LayerKind.STORED and e.key is not None]


def _clone_fsck(url: str, name: str, tmp_path: Path, dest: str) -> Path:
    clone = tmp_path / dest
    run_git(["clone", "-q", "--mirror", f"{url}/{name}.git", str(clone)], cwd=tmp_path)
    run_git(["fsck", "--strict", "--no-progress"], cwd=clone)
    return clone


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_local_copies_of_merged_layers_go_once_unpinned_and_past_the_retention(
    compute: Any, git_bridge: Callable[[str], ThreadingHTTPServer], tmp_path: Path
) -> None:
    name = f"copies-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _work(url, name, tmp_path)
    _stored_pushes(compute, url, name, work, 3)
    before = _stored(compute, name)
    assert len(before) == 3
    paths = [_copy_path(compute, name, e.key) for e in before]
    assert all(p.exists() for p in paths)
    catalog = compute.host.layers.catalog
    recorded = set(catalog.names())

    # A read in flight pins the old layers: the merge swaps them, their copies stay.
    snap = _on_loop(compute, lambda: compute.host.read(name))
    pinned = compute.host.pin_reads(snap)
    _on_loop(compute, pinned.__enter__)
    m = _maintainer(compute, tmp_path, retention_s=0.0)
    _on_loop(compute, m.run_once)
    after = _stored(compute, name)
    assert m.counters.merges >= 1 and len(after) < len(before), (before, after)
    gone = [e for e in before if e.root not in {a.root for a in after}]
    assert gone and all(_copy_path(compute, name, e.key).exists() for e in gone)
    assert m.counters.local_copies_deleted == 0
    _on_loop(compute, lambda: pinned.__exit__(None, None, None))

    # Unpinned, retention 0: the next pass deletes the files and their catalog records.
    _on_loop(compute, m.run_once)
    for e in gone:
        assert not _copy_path(compute, name, e.key).exists(), e.key
    assert m.counters.local_copies_deleted == len(gone)
    assert m.status()["local_copies_deleted"] == len(gone)
    names_now = set(catalog.names())
    assert len(recorded - names_now) == len(gone)
    for e in after:  # the live layers keep their copies
        assert _copy_path(compute, name, e.key).exists()
    clone = _clone_fsck(url, name, tmp_path, "clone.git")
    assert list_refs(clone)[b"refs/heads/main"] == run_git(["rev-parse", "HEAD"], cwd=work).strip()


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_local_copies_stay_until_the_retention_has_passed(
    compute: Any, git_bridge: Callable[[str], ThreadingHTTPServer], tmp_path: Path
) -> None:
    name = f"keep-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _work(url, name, tmp_path)
    _stored_pushes(compute, url, name, work, 3)
    before = _stored(compute, name)
    m = _maintainer(compute, tmp_path, retention_s=3600.0)
    _on_loop(compute, m.run_once)
    _on_loop(compute, m.run_once)
    assert m.counters.merges >= 1
    assert all(_copy_path(compute, name, e.key).exists() for e in before)
    assert m.counters.local_copies_deleted == 0 and compute.host.retired_copies >= 1


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_a_failing_merge_backs_its_repository_off(
    compute: Any,
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"backoff-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _work(url, name, tmp_path)
    _stored_pushes(compute, url, name, work, 2)
    calls: list[int] = []

    def broken(*args: object, **kwargs: object) -> object:
        calls.append(1)
        raise CorruptData("a source layer does not read", section="merge")

    monkeypatch.setattr(maintainer_module, "merge_stretch", broken)
    clock = FixedClock(now_us=10**15)
    store = open_store(f"file://{tmp_path / 'store'}")
    config = MaintainerConfig(interval_s=1.0, sweep_interval_us=0)
    m = _on_loop(compute, lambda: Maintainer(compute.host, store, "compute-a", clock, config))
    _on_loop(compute, m.run_once)
    assert len(calls) == 1 and m.counters.merge_failures == 1
    assert m.backoff[name].failures == 1
    visits = m.counters.visits
    for _ in range(3):  # within the backoff, nothing changed: not even visited (issue 19)
        _on_loop(compute, m.run_once)
    assert len(calls) == 1 and m.counters.visits == visits
    clock.advance_us(2_000_001)  # past interval * 2**1
    _on_loop(compute, m.run_once)
    assert len(calls) == 2 and m.backoff[name].failures == 2
    clock.advance_us(2_000_001)  # not yet past interval * 2**2
    _on_loop(compute, m.run_once)
    assert len(calls) == 2
    monkeypatch.undo()
    clock.advance_us(2_000_001)
    _on_loop(compute, m.run_once)
    assert name not in m.backoff and m.counters.merges >= 1
    assert plan(_on_loop(compute, lambda: compute.host.read(name)).state.manifest) is None
    _on_loop(compute, m.stop)


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_two_pushes_of_the_same_objects_compact_to_one_copy_and_clone_fsck_clean(
    compute: Any,
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"dups-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _work(url, name, tmp_path)
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    (work / "shared.bin").write_bytes(rng.randbytes(40 * 1024))
    (work / "notes.txt").write_text("the same objects, pushed twice\n")
    run_git(["add", "."], cwd=work)
    run_git(["commit", "-q", "-m", "shared"], cwd=work)
    tip = run_git(["rev-parse", "HEAD"], cwd=work).strip().decode()

    # Both ingests start from the same snapshot, as concurrent pushes do: neither sees
    # the other's objects, so each stores all of them.
    both = threading.Barrier(2, timeout=60)
    real_ingest = push_module.ingest_pack

    def ingest_together(*args: Any, **kwargs: Any) -> Any:
        both.wait()
        return real_ingest(*args, **kwargs)

    monkeypatch.setattr(push_module, "ingest_pack", ingest_together)
    failures: list[BaseException] = []

    def push(branch: str) -> None:
        try:
            run_git(["push", "-q", f"{url}/{name}.git", f"HEAD:refs/heads/{branch}"], cwd=work)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=push, args=(b,)) for b in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    monkeypatch.undo()
    assert not failures, failures
    manifest = _on_loop(compute, lambda: compute.host.read(name)).state.manifest
    pushed = manifest[-2:]
    assert pushed[0].object_count == pushed[1].object_count >= 4  # commit, tree, 2 blobs
    objects_before = sum(e.object_count for e in manifest)
    _clone_fsck(url, name, tmp_path, "before.git")  # both copies served side by side

    m = _maintainer(compute, tmp_path, retention_s=3600.0)
    for _ in range(4):
        _on_loop(compute, m.run_once)
        if plan(_on_loop(compute, lambda: compute.host.read(name)).state.manifest) is None:
            break
    after = _on_loop(compute, lambda: compute.host.read(name)).state.manifest
    assert m.counters.dropped_duplicates == pushed[1].object_count
    assert sum(e.object_count for e in after) == objects_before - pushed[1].object_count
    clone = _clone_fsck(url, name, tmp_path, "clone.git")
    refs = list_refs(clone)
    assert refs[b"refs/heads/one"] == refs[b"refs/heads/two"] == tip.encode()
    count = run_git(["count-objects", "-v"], cwd=clone).decode()
    assert "in-pack: " in count
    assert (
        run_git(["cat-file", "blob", "one:shared.bin"], cwd=clone)
        == (work / "shared.bin").read_bytes()
    )


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_a_merge_that_does_not_cover_its_run_is_never_proposed(
    compute: Any,
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"cover-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _work(url, name, tmp_path)
    _stored_pushes(compute, url, name, work, 2)
    before = _on_loop(compute, lambda: compute.host.read(name)).state
    real = maintainer_module.merge_stretch

    def lossy(*args: Any, **kwargs: Any) -> Any:
        merged = real(*args, **kwargs)
        return dataclasses.replace(merged, id_count=merged.id_count - 1)  # loses the last id

    monkeypatch.setattr(maintainer_module, "merge_stretch", lossy)
    m = _maintainer(compute, tmp_path, retention_s=3600.0)
    layers_dir = tmp_path / "store" / "repos" / name / "layers"
    files = sorted(layers_dir.iterdir())
    _on_loop(compute, m.run_once)
    after = _on_loop(compute, lambda: compute.host.read(name)).state
    assert m.counters.merge_failures == 1 and m.counters.merges == 0
    assert after.version == before.version and after.manifest == before.manifest
    assert sorted(layers_dir.iterdir()) == files  # nothing was uploaded either


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_copies_a_previous_run_left_behind_are_deleted_once_the_repository_is_hosted(
    compute: Any, git_bridge: Callable[[str], ThreadingHTTPServer], tmp_path: Path
) -> None:
    name = f"leftover-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = _work(url, name, tmp_path)
    _stored_pushes(compute, url, name, work, 1)
    layers = compute.host.layers
    catalog = layers.catalog
    live = _stored(compute, name)
    live_names = {layers.name_of(storage_segment(name), layer_key(name, e.key)) for e in live}

    def left_by_a_previous_run(segment: str, key: str) -> Path:
        """A copy file and a catalog record as a run that crashed would have left them."""
        copy_name = layers.name_of(segment, key)
        path = Path(layers.path_of(copy_name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 4096)
        with catalog._lock:
            catalog._set_locked(CopyRecord(copy_name, 4096, b"\x01", False, "before"))
        return path

    stale = left_by_a_previous_run(storage_segment(name), layer_key(name, GONE))
    other = left_by_a_previous_run("elsewhere", "repos/elsewhere/layers/0001-x.layer")
    for copy_name in live_names:  # a live layer's record from the previous run stays
        rec = catalog.get(copy_name)
        with catalog._lock:
            catalog._set_locked(dataclasses.replace(rec, writer="before"))
    m = _maintainer(compute, tmp_path, retention_s=3600.0)
    _on_loop(compute, m.run_once)
    assert (
        not stale.exists()
        and catalog.get(layers.name_of(storage_segment(name), layer_key(name, GONE))) is None
    )
    assert other.exists(), "a repository not hosted here keeps its copies"
    assert all(catalog.get(n) is not None for n in live_names)
    assert all(Path(layers.path_of(n)).exists() for n in live_names)
    assert m.counters.local_copies_deleted == 1
    _clone_fsck(url, name, tmp_path, "clone.git")
