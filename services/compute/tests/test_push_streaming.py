"""A push's ingest starts at its pack's first chunk (docs/ingest.md, "Speed"), as
``git index-pack --stdin`` indexes what ``pack-objects`` sends while it sends it.

Checked with a real :class:`LayerService` over a ``file://`` store, the in-process
ledger and packs from real ``git pack-objects``: a streamed push stores the very
layer and answers the very report an unstreamed one does, its ingest had read into
the pack before the last chunk came, a body over the bound or cut by its client
leaves no ingest and no scratch, the receive deadline cuts a slow one off (it
ingests once its body is in), and no more than ``ingest_streams_max`` stream at once.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from enroute_compute import push
from enroute_compute.host import RepositoryHost
from enroute_compute.main import SystemClock
from enroute_compute.push import Pusher
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import open_store
from enroute_testing.local_ledger import LocalLedger
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects

pytestmark = pytest.mark.interop

CHUNK = 16 * 1024
STREAMED = re.compile(r"streamed ingest had read (\d+) of the pack's (\d+) bytes")


def _request(refs: dict[bytes, bytes], pack: bytes, caps: bytes = b"report-status") -> bytes:
    lines = []
    for i, (ref, oid) in enumerate(sorted(refs.items())):
        line = b"0" * 40 + b" " + oid + b" " + ref
        if i == 0:
            line += b"\x00" + caps + b" ofs-delta"
        lines.append(pkt_line(line + b"\n"))
    return b"".join(lines) + FLUSH_PKT + pack


async def _slowly(
    data: bytes, pause_s: float = 0.002, stop: int | None = None
) -> AsyncIterator[bytes]:
    """The body in pieces with a pause before each (``stop``: the client goes there)."""
    end = len(data) if stop is None else stop
    for i in range(0, end, CHUNK):
        await asyncio.sleep(pause_s)
        yield data[i : min(i + CHUNK, end)]
    if stop is not None:
        raise ConnectionResetError("the client went")


class _Node:
    def __init__(self, tmp: Path, limits: Limits) -> None:
        self.tmp = tmp
        self.layers = LayerService(open_store(f"file://{tmp / 'store'}"), tmp / "compute")
        self.host = RepositoryHost(
            LocalLedger(), self.layers, SystemClock(), inline_max_bytes=1024, limits=limits
        )
        self.pusher = Pusher(self.host)

    async def push(self, name: str, body: AsyncIterator[bytes]) -> bytes:
        return b"".join([part async for part in self.pusher.receive_pack(name, body)])

    async def close(self) -> None:
        await self.host.close()
        await self.layers.close()

    def layer_files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted((self.tmp / "store").rglob("*.layer*"))}

    def scratch(self) -> list[str]:
        found = (self.tmp / "compute" / "scratch").iterdir()
        return sorted(p.name for p in found if not p.name.startswith("link-"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[bytes, bytes], bytes]:
    spec = RepoSpec(seed=9, commits=120, files=60, file_bytes=3000, annotated_tags=2,
                    binary_files=2, large_file_bytes=400_000)  # fmt: skip
    made = generate_repo(tmp_path_factory.mktemp("src") / "r.git", spec)
    refs = {r: o for r, o in made.refs.items() if r.startswith(b"refs/heads/")}
    return refs, pack_objects(made.path)


def _run(tmp: Path, limits: Limits, body: bytes, caplog: pytest.LogCaptureFixture) -> tuple[
    bytes, dict[str, bytes], list[str]
]:  # fmt: skip
    async def run() -> tuple[bytes, dict[str, bytes], list[str]]:
        node = _Node(tmp, limits)
        try:
            report = await node.push("r", _slowly(body))
        finally:
            await node.close()
        return report, node.layer_files(), node.scratch()

    with caplog.at_level(logging.INFO, logger=push.__name__):
        return asyncio.run(run())


def _done_lines(report: bytes) -> list[bytes]:
    """The progress lines that end a step (band 2), in order: what does not depend on time."""
    return [line for line in re.split(rb"[\r\n]", report) if line.endswith(b"done.")]


def test_a_streamed_push_stores_the_layer_an_unstreamed_one_does(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    refs, pack = repo
    for caps in (b"report-status", b"report-status side-band-64k"):
        body = _request(refs, pack, caps)
        tag = caps.replace(b" ", b"_").decode()
        caplog.clear()
        off = _run(tmp_path / f"off-{tag}", Limits(ingest_streams_max=0), body, caplog)
        assert not STREAMED.search(caplog.text)
        caplog.clear()
        on = _run(tmp_path / f"on-{tag}", Limits(), body, caplog)
        found = STREAMED.search(caplog.text)
        assert found, "the push did not stream"
        read, size = int(found[1]), int(found[2])
        assert size == len(pack)
        assert read >= len(pack) // 4, f"no overlap: {read} of {size} bytes read at the end"
        assert b"unpack ok" in on[0] and b"ok refs/heads/main" in on[0]
        assert on[1] == off[1] and on[1], "the streamed push stored another layer"
        assert on[2] == off[2] == []
        if b"side-band" in caps:
            assert _done_lines(on[0]) == _done_lines(off[0])
            assert b"Receiving pack" in _done_lines(on[0])[0]
        else:
            assert on[0] == off[0]


def test_a_body_over_the_bound_stops_its_streamed_ingest(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    refs, pack = repo
    limits = Limits(ingest_pack_bytes_max=len(pack) // 2)
    report, layers, scratch = _run(tmp_path, limits, _request(refs, pack), caplog)
    assert b"unpack the pack is over the limit of %d bytes" % (len(pack) // 2) in report
    assert b"ok refs/" not in report and layers == {} and scratch == []


def test_a_client_gone_mid_body_leaves_no_ingest_and_no_scratch(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes]
) -> None:
    """The body's fault stays the receive loop's: the push fails with the client's error
    (not an indexing one), its ingest thread ends, nothing is stored or left in scratch."""
    refs, pack = repo
    body = _request(refs, pack)

    async def run() -> None:
        node = _Node(tmp_path, Limits())
        try:
            with pytest.raises(ConnectionResetError):
                await node.push("r", _slowly(body, stop=len(body) // 2))
            assert node.pusher.streams == 0
            # the same compute takes the next push of it whole
            report = await node.push("r", _slowly(body))
            assert b"unpack ok" in report and b"ng " not in report
        finally:
            await node.close()
        assert node.scratch() == []

    asyncio.run(run())


def test_the_receive_deadline_cuts_a_slow_sender_off(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """Its slot is free at the deadline (a log line says so); the push lands once its body
    is in, ingested as unstreamed."""
    refs, pack = repo
    body = _request(refs, pack)

    async def run() -> bytes:
        node = _Node(tmp_path, Limits(ingest_stream_receive_ms_max=200))
        try:
            pushing = asyncio.ensure_future(node.push("r", _slowly(body, pause_s=0.08)))
            seen = []  # the streamed ingests running, every 10 ms while the body arrives
            for _ in range(300):  # the body takes about 6 s to arrive
                await asyncio.sleep(0.01)
                seen.append(node.pusher.streams)
                if seen[-1] == 0 and 1 in seen:
                    break
            assert 1 in seen, "the push did not stream"
            assert seen[-1] == 0, "the slow sender still holds its ingest slot"
            assert not pushing.done(), "the body was in before the deadline freed the slot"
            return await pushing
        finally:
            await node.close()

    with caplog.at_level(logging.INFO, logger=push.__name__):
        report = asyncio.run(run())
    assert "streamed ingest cut off after 0 s" in caplog.text
    assert "ingest_stream_receive_ms_max" in caplog.text
    assert b"unpack ok" in report and b"ng " not in report
    assert not STREAMED.search(caplog.text)


def test_no_more_than_ingest_streams_max_stream_at_once(
    tmp_path: Path, repo: tuple[dict[bytes, bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    refs, pack = repo
    body = _request(refs, pack)

    async def run() -> list[bytes]:
        node = _Node(tmp_path, Limits(ingest_streams_max=2))
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, node.pusher.streams)
                await asyncio.sleep(0.001)

        watcher = asyncio.ensure_future(watch())
        try:
            pushes = [node.push(f"r{i}", _slowly(body, pause_s=0.01)) for i in range(4)]
            reports = await asyncio.gather(*pushes)
        finally:
            watcher.cancel()
            await node.close()
        assert most == 2
        assert node.pusher.streams == 0
        return reports

    with caplog.at_level(logging.INFO, logger=push.__name__):
        reports = asyncio.run(run())
    assert all(b"unpack ok" in r and b"ng " not in r for r in reports)
    assert len(STREAMED.findall(caplog.text)) == 2
