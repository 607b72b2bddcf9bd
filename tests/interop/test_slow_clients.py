"""Clients that stop reading their packs do not stall the rest of a compute.

A pack writer waits on its client: when the client reads nothing, the writer
blocks once the buffers between them are full. Writers have a thread pool of
their own (``compute.pack_writers``); on asyncio's default pool (a few
threads) a handful of stalled clones would hold every thread, and planning,
pushes (ingest runs in a thread) and layer loads would wait behind them.

Real ``enroute dev`` and real git; the stalled clients are raw HTTP requests
that send a v2 fetch and never read the answer.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import run_git

pytestmark = [pytest.mark.interop, pytest.mark.slow]

STALLED = 12
"""More than asyncio's default pool has threads on any CI machine (min(32, cores + 4))."""
BLOB_BYTES = 8 << 20
BLOBS = 5
"""40 MiB of incompressible data: more than every buffer between a writer and its client."""


def _pkt(payload: bytes) -> bytes:
    return b"%04x" % (len(payload) + 4) + payload


def _big_repo(path: Path) -> str:
    run_git(["init", "-q", "--bare", str(path)], cwd=path.parent)
    rng = random.Random(7)
    lines = []
    for i in range(BLOBS):
        oid = run_git(["hash-object", "-w", "--stdin"], cwd=path, input=rng.randbytes(BLOB_BYTES))
        lines.append(b"100644 blob " + oid.strip() + b"\tblob%d" % i)
    tree = run_git(["mktree"], cwd=path, input=b"\n".join(lines) + b"\n").decode().strip()
    commit = run_git(["commit-tree", tree, "-m", "big"], cwd=path).decode().strip()
    run_git(["update-ref", "refs/heads/main", commit], cwd=path)
    return commit


def _stalled_fetch(address: str, repo: str, want: str) -> socket.socket:
    """A v2 fetch of ``want`` whose answer is never read."""
    host, port = address.rsplit(":", 1)
    body = (
        _pkt(b"command=fetch\n")
        + b"0001"
        + _pkt(b"want %s\n" % want.encode())
        + _pkt(b"done\n")
        + b"0000"
    )
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(
        f"POST /{repo}/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/x-git-upload-pack-request\r\n"
        f"Git-Protocol: version=2\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[tuple[str, list[socket.socket]]]:
    (tmp_path / "dev").mkdir()
    with running_dev(tmp_path / "dev") as dev:
        big = tmp_path / "big.git"
        big.mkdir()
        want = _big_repo(big)
        run_git(["push", "-q", f"{dev.url}/big.git", "main"], cwd=big)
        socks = [_stalled_fetch(dev.address, "big.git", want) for _ in range(STALLED)]
        try:
            yield dev.url, socks
        finally:
            for sock in socks:
                sock.close()


def test_stalled_clones_leave_pushes_and_clones_going(
    stalled: tuple[str, list[socket.socket]], tmp_path: Path
) -> None:
    url, socks = stalled
    time.sleep(3.0)  # the writers fill every buffer and block
    for sock in socks:  # each stalled request got its answer started: a writer runs for it
        assert sock.recv(12, socket.MSG_PEEK).startswith(b"HTTP/1.1 200")
    small = tmp_path / "small.git"
    small.mkdir()
    run_git(["init", "-q", "--bare", str(small)], cwd=tmp_path)
    tree = run_git(["mktree"], cwd=small, input=b"").decode().strip()
    commit = run_git(["commit-tree", tree, "-m", "small"], cwd=small).decode().strip()
    run_git(["update-ref", "refs/heads/main", commit], cwd=small)
    started = time.monotonic()
    run_git(["push", "-q", f"{url}/small.git", "main"], cwd=small, timeout_s=30)
    clone = tmp_path / "clone.git"
    run_git(["clone", "-q", "--bare", f"{url}/small.git", str(clone)], cwd=tmp_path, timeout_s=30)
    assert run_git(["rev-parse", "main"], cwd=clone).decode().strip() == commit
    assert time.monotonic() - started < 30
