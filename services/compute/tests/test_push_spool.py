"""The push path spools the pack and builds the layer in scratch (docs/ingest.md, "The path").

Seed 004, "Storage service": scratch holds "spooled request bodies, and layer
builders" for one operation, and "a finished layer is sealed ... in a scratch
file that publishing moves into place". Checked here with a real
:class:`LayerService` over a ``file://`` store and the in-process ledger: a
stored layer is published from its file, an inline one read back from it, a
bad pack is refused, and no scratch file outlives its push.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from enroute_compute import host as host_module
from enroute_compute import push
from enroute_compute.host import RepositoryHost
from enroute_compute.main import SystemClock
from enroute_compute.push import Pusher
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_core.storage.heap import release_free_heap
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import open_store
from enroute_testing.local_ledger import LocalLedger
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects

pytestmark = pytest.mark.interop


def _request(refs: dict[bytes, bytes], pack: bytes) -> bytes:
    lines = []
    for i, (ref, oid) in enumerate(sorted(refs.items())):
        line = b"0" * 40 + b" " + oid + b" " + ref
        if i == 0:
            line += b"\x00report-status ofs-delta"
        lines.append(pkt_line(line + b"\n"))
    return b"".join(lines) + FLUSH_PKT + pack


async def _chunks(data: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _push(tmp: Path, body: bytes, *, inline_max: int, limits: Limits | None = None) -> tuple[
    bytes, RepositoryHost
]:  # fmt: skip
    async def run() -> tuple[bytes, RepositoryHost]:
        layers = LayerService(open_store(f"file://{tmp / 'store'}"), tmp / "compute")
        host = RepositoryHost(
            LocalLedger(),
            layers,
            SystemClock(),
            inline_max_bytes=inline_max,
            limits=limits or Limits(),
        )
        try:
            out = b"".join([part async for part in Pusher(host).receive_pack("r", _chunks(body))])
        finally:
            await host.close()
            await layers.close()
        return out, host

    return asyncio.run(run())


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[bytes, bytes], bytes]:
    spec = RepoSpec(seed=5, commits=30, files=20, annotated_tags=0, lightweight_tags=0)
    made = generate_repo(tmp_path_factory.mktemp("src") / "r.git", spec)
    refs = {r: o for r, o in made.refs.items() if r.startswith(b"refs/heads/")}
    return refs, pack_objects(made.path)


def _scratch(tmp: Path) -> list[str]:
    """The push's scratch files left. ``link-*`` is the layer service's (a local copy
    linked in by the view's follower); one can be left when the host closes while the
    link runs in its thread, which is the layer service's to clean, not the push's."""
    return sorted(
        p.name for p in (tmp / "compute" / "scratch").iterdir() if not p.name.startswith("link-")
    )


def test_stored_layer_is_published_from_its_scratch_file(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes]
) -> None:
    refs, pack = repo
    report, _ = _push(tmp_path, _request(refs, pack), inline_max=1024)
    assert b"unpack ok" in report and b"ng " not in report
    assert _scratch(tmp_path) == []
    (stored,) = (tmp_path / "store").rglob("*.layer*")
    (copy,) = (p for p in (tmp_path / "compute" / "copies").rglob("*") if p.is_file())
    assert copy.read_bytes() == stored.read_bytes()
    assert copy.stat().st_size > 1024


def test_inline_layer_is_read_back_from_its_scratch_file(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes]
) -> None:
    refs, pack = repo
    report, _ = _push(tmp_path, _request(refs, pack), inline_max=64 * 1024 * 1024)
    assert b"unpack ok" in report and b"ng " not in report
    assert _scratch(tmp_path) == []
    assert list((tmp_path / "store").rglob("*.layer*")) == []


def test_bad_pack_is_refused_and_leaves_no_scratch(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes]
) -> None:
    refs, pack = repo
    broken = bytearray(pack)
    broken[len(pack) // 2] ^= 0xFF
    report, _ = _push(tmp_path, _request(refs, bytes(broken)), inline_max=1024)
    assert b"unpack " in report and b"unpack ok" not in report
    assert _scratch(tmp_path) == []


def test_pack_over_the_bound_is_refused_while_spooling(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes]
) -> None:
    """Refused in the report once the body is read to its end (git shows ``error: remote
    unpack failed: <reason>``), the spool cut at the bound."""
    refs, pack = repo
    report, _ = _push(
        tmp_path,
        _request(refs, pack),
        inline_max=1024,
        limits=Limits(ingest_pack_bytes_max=len(pack) // 2),
    )
    assert b"unpack the pack is over the limit of %d bytes" % (len(pack) // 2) in report
    assert b"unpacker error" in report and b"ok refs/" not in report
    assert _scratch(tmp_path) == []


def test_cycle_collection_is_paused_during_ingest_only() -> None:
    assert gc.isenabled()
    inside = push._without_cycle_collection(gc.isenabled)
    assert inside is False and gc.isenabled()
    nested = push._without_cycle_collection(
        lambda: (push._without_cycle_collection(gc.isenabled), gc.isenabled())
    )
    assert nested == (False, False) and gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        push._without_cycle_collection(lambda: 1 // 0)
    assert gc.isenabled()
    gc.disable()
    try:
        push._without_cycle_collection(lambda: None)
        assert not gc.isenabled()  # someone else's pause stays theirs
    finally:
        gc.enable()


def test_trees_spill_to_scratch_and_the_file_goes_with_the_push(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """A cache smaller than the push's trees: they go to a ``trees-*`` scratch file
    (docs/ingest.md, "The large profile"), the push logs how much, and the file is
    removed when ingest ends, like the spool and the layer's."""
    refs, pack = repo
    made: list[str] = []
    scratch = Pusher._scratch

    def noted(self: Pusher, prefix: str) -> object:
        made.append(prefix)
        return scratch(self, prefix)

    small = Limits(ingest_body_cache_bytes_max=8 * 1024)
    with pytest.MonkeyPatch.context() as patch, caplog.at_level("INFO", logger=push.__name__):
        patch.setattr(Pusher, "_scratch", noted)
        report, _ = _push(tmp_path, _request(refs, pack), inline_max=1024, limits=small)
    assert b"unpack ok" in report and b"ng " not in report
    assert made.count("trees") == 1
    assert any("spilled" in r.getMessage() for r in caplog.records)
    assert _scratch(tmp_path) == []


@pytest.mark.parametrize("large", [True, False])
def test_a_large_push_gives_its_memory_back(
    tmp_path: Path,
    repo: tuple[dict[bytes, bytes], bytes],
    caplog: pytest.LogCaptureFixture,
    large: bool,
) -> None:
    """Issue 25, item 3: an ingest whose state (``INGEST_OBJECT_BYTES`` an object) is more
    than the allocator keeps free on its own (``heap_trim_threshold_bytes``) is followed by
    a collection and ``malloc_trim`` once it is gone, logged (the 504,433-object push of
    the `large` profile left about 150 MiB in the compute otherwise, docs/ingest.md); a
    smaller one is not."""
    if release_free_heap() is None:
        pytest.skip("no malloc_trim in this C library")
    refs, pack = repo
    limits = Limits(heap_trim_threshold_bytes=1024 if large else 1 << 30)
    with caplog.at_level("INFO", logger=host_module.__name__):
        report, _ = _push(tmp_path, _request(refs, pack), inline_max=1024, limits=limits)
    assert b"unpack ok" in report and b"ng " not in report
    released = [r.getMessage() for r in caplog.records if "after a push" in r.getMessage()]
    assert len(released) == (1 if large else 0), released
