"""upload-pack keepalives while a fetch's pack is planned (issue 23, item 2; docs/protocol.md).

git's upload-pack sends ``0005\\x01`` (an empty pack packet; upload-pack.c
``create_pack_file``) when pack-objects has said nothing for
``uploadpack.keepAlive`` seconds, so that a long count is not a silence a
proxy's read timeout cuts. Here the plan plays pack-objects' count: its
thread is slowed (``PLAN_DELAY_S``, more than ``KEEPALIVE_S``), and the answer
must carry keepalives after the ``packfile`` header (v2) or the ``NAK`` (v0
with side-band) and before the first pack byte; the real git CLI must clone
through them (v2 and v0), and the clone be fsck-clean.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_compute import fetch
from enroute_compute.push import KEEPALIVE_S
from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import RepoSpec, generate_repo

pytestmark = pytest.mark.interop

PLAN_DELAY_S = KEEPALIVE_S * 2 + 0.5
REPO = "team/slowplan"


@pytest.fixture
def slow_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = fetch.Fetcher._planned

    async def slowed(self: fetch.Fetcher, *args: Any) -> Any:
        await asyncio.sleep(PLAN_DELAY_S)
        return await planned(self, *args)

    monkeypatch.setattr(fetch.Fetcher, "_planned", slowed)


@pytest.fixture
def url(compute: object, git_bridge: Callable[[str], ThreadingHTTPServer]) -> str:
    server = git_bridge(compute.address)  # type: ignore[attr-defined]
    return f"http://127.0.0.1:{server.server_address[1]}"


def packets(data: bytes) -> Iterator[bytes]:
    at = 0
    while at < len(data):
        size = int(data[at : at + 4], 16)
        yield data[at : at + max(size, 4)]
        at += max(size, 4)


def upload_pack(address: str, body: bytes, protocol: str) -> bytes:
    header = compute_pb2.GitRequestHeader(repo=REPO, git_protocol=protocol)
    requests = [compute_pb2.GitRequest(header=header), compute_pb2.GitRequest(body=body)]
    with grpc.insecure_channel(address) as channel:
        stub = compute_pb2_grpc.ComputeStub(channel)
        answer = stub.UploadPack(iter(requests), timeout=60)
        return b"".join(r.body for r in answer if r.WhichOneof("part") == "body")


def after(answer: list[bytes], marker: bytes) -> tuple[int, bytes]:
    """Keepalives between ``marker`` and the first pack data, and the demuxed pack."""
    start = answer.index(marker) + 1
    keepalives = 0
    pack = bytearray()
    for p in answer[start:]:
        if p == fetch.UPLOAD_KEEPALIVE and not pack:
            keepalives += 1
        elif p[4:5] == b"\x01":
            pack += p[5:]
    return keepalives, bytes(pack)


@pytest.mark.slow
def test_a_slow_plan_sends_keepalives_before_the_pack(
    url: str, compute: Any, tmp_path: Path, slow_plans: None
) -> None:
    source = generate_repo(tmp_path / "source.git", RepoSpec(seed=23, commits=5, files=5))
    run_git(["push", "--mirror", f"{url}/{REPO}.git"], cwd=source.path)
    tip = run_git(["rev-parse", "main"], cwd=source.path).decode().strip()
    want = pkt_line(f"want {tip}\n".encode())

    v2 = upload_pack(compute.address,
                     pkt_line(b"command=fetch\n") + b"0001" + want + pkt_line(b"done\n")
                     + FLUSH_PKT, "version=2")  # fmt: skip
    keepalives, pack = after(list(packets(v2)), pkt_line(b"packfile\n"))
    assert keepalives >= 1, v2[:200]
    assert pack[:4] == b"PACK" and hashlib.sha1(pack[:-20]).digest() == pack[-20:]

    v0 = upload_pack(compute.address,
                     pkt_line(f"want {tip} side-band-64k ofs-delta\n".encode()) + FLUSH_PKT
                     + pkt_line(b"done\n"), "")  # fmt: skip
    keepalives, pack = after(list(packets(v0)), pkt_line(b"NAK\n"))
    assert keepalives >= 1, v0[:200]
    assert pack[:4] == b"PACK" and hashlib.sha1(pack[:-20]).digest() == pack[-20:]

    for version in ("2", "0"):  # git reads through them as through upload-pack's own
        dest = tmp_path / f"clone-v{version}"
        run_git(["-c", f"protocol.version={version}", "clone", "-q", f"{url}/{REPO}.git",
                 str(dest)], cwd=tmp_path)  # fmt: skip
        run_git(["fsck", "--strict", "--no-progress"], cwd=dest)
        assert run_git(["rev-parse", "HEAD"], cwd=dest).decode().strip() == tip
