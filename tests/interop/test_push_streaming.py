"""A push indexed while its pack arrives, through a real `enroute dev` (docs/ingest.md,
"Speed"): git's ``index-pack --stdin`` reads what ``pack-objects`` sends as it sends it
(builtin/index-pack.c, ``fill()``); the compute's ingest starts at the pack's first chunk.

Real ``git push`` and ``git clone``; the paced and the cut bodies are raw HTTP
(gitprotocol-http, "Smart Service git-receive-pack") so the client sets every pause:
a body that arrives in pieces is read before its last piece, a client that goes
mid-body leaves no ref, no scratch and no indexing error, and one slower than the
receive deadline is cut off (a log line) and lands once its body is in.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_testing.devserver import DevServer, role_log, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects
from enroute_testing.waiting import wait_until

pytestmark = [pytest.mark.interop, pytest.mark.slow]

DEADLINE_MS = 4000
"""``limits.ingest_stream_receive_ms_max`` here: the paced push sends in well under it."""
STREAMED = re.compile(r"push to (\S+): streamed ingest had read (\d+) of the pack's (\d+) bytes")
SPEC = RepoSpec(seed=31, commits=150, files=80, file_bytes=3000, binary_files=2,
                large_file_bytes=300_000)  # fmt: skip


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    config = {"limits": {"ingest_stream_receive_ms_max": DEADLINE_MS}}
    with running_dev(tmp_path_factory.mktemp("enroute-streaming"), config) as server:
        yield server


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, bytes]:
    """The source repository, its pack, and the push body of its main branch."""
    made = generate_repo(tmp_path_factory.mktemp("src") / "r.git", SPEC)
    main = made.refs[b"refs/heads/main"]
    pack = pack_objects(made.path, revs=["main"])
    command = b"0" * 40 + b" " + main + b" refs/heads/main\0report-status\n"
    return made.path, pack, pkt_line(command) + FLUSH_PKT + pack


def _compute_log(dev: DevServer) -> str:
    return role_log(dev.log_path.parent, "compute")


def _streamed(dev: DevServer, repo: str) -> tuple[int, int] | None:
    found = [m for m in STREAMED.finditer(_compute_log(dev)) if m[1] == repo]
    return (int(found[-1][2]), int(found[-1][3])) if found else None


def _send(dev: DevServer, repo: str, body: bytes, *, pieces: int, pause_s: float,
          stop: int | None = None) -> bytes:  # fmt: skip
    """POST ``body`` in ``pieces`` with ``pause_s`` between them; the reply (the client
    goes without one at ``stop``)."""
    host, port = dev.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=120)
    try:
        sock.sendall(
            f"POST /{repo}.git/git-receive-pack HTTP/1.1\r\nHost: enroute\r\n"
            "Content-Type: application/x-git-receive-pack-request\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        end = len(body) if stop is None else stop
        step = -(-end // pieces)
        for at in range(0, end, step):
            sock.sendall(body[at : min(at + step, end)])
            time.sleep(pause_s)
        if stop is not None:
            return b""
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply
    finally:
        sock.close()


def _refs(dev: DevServer, repo: str, cwd: Path) -> str:
    return run_git(["ls-remote", f"{dev.url}/{repo}.git"], cwd=cwd).decode()


def _scratch(dev: DevServer) -> list[str]:
    data = dev.log_path.parent / "data"
    return sorted(
        str(p.relative_to(data))
        for p in data.rglob("scratch/*")
        if p.is_file() and not p.name.startswith("link-")
    )


def test_git_push_streams_and_clones_back(
    dev: DevServer, source: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    path, _, _ = source
    run_git(
        [
            "push",
            "-q",
            f"{dev.url}/cli.git",
            "refs/heads/*:refs/heads/*",
            "refs/tags/*:refs/tags/*",
        ],
        cwd=path,
    )
    assert _streamed(dev, "cli") is not None, "git's push did not stream"
    clone = tmp_path / "clone.git"
    run_git(["clone", "-q", "--bare", f"{dev.url}/cli.git", str(clone)], cwd=tmp_path)
    run_git(["fsck", "--strict"], cwd=clone)
    mine = run_git(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=path)
    theirs = run_git(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=clone)
    assert theirs == mine


def test_a_paced_body_is_indexed_before_its_last_piece(
    dev: DevServer, source: tuple[Path, bytes, bytes]
) -> None:
    _, pack, body = source
    reply = _send(dev, "paced", body, pieces=20, pause_s=0.03)
    assert b"unpack ok" in reply and b"ok refs/heads/main" in reply, reply[-300:]
    found = _streamed(dev, "paced")
    assert found is not None
    read, size = found
    assert size == len(pack)
    # 19 of the 20 pieces (0.03 s apart) were in before the last: the ingest had read into them
    assert read >= len(pack) // 4, f"read {read} of {size} bytes when the last byte came"


def test_a_client_gone_mid_body_leaves_nothing(
    dev: DevServer, source: tuple[Path, bytes, bytes], tmp_path: Path
) -> None:
    _, _, body = source
    _send(dev, "gone", body, pieces=10, pause_s=0.05, stop=len(body) * 6 // 10)
    wait_until(
        lambda: _scratch(dev) == [], 30.0, "no scratch file left", explain=lambda: _scratch(dev)
    )
    assert _refs(dev, "gone", tmp_path) == ""
    log = _compute_log(dev)
    assert "Traceback" not in log
    assert not re.search(r"gone.*(invalid_pack|unpacker error|truncated)", log)
    reply = _send(dev, "gone", body, pieces=2, pause_s=0.0)
    assert b"ok refs/heads/main" in reply


def test_a_sender_slower_than_the_deadline_is_cut_off_and_lands(
    dev: DevServer, source: tuple[Path, bytes, bytes]
) -> None:
    _, _, body = source
    pieces = 8
    reply = _send(dev, "slow", body, pieces=pieces, pause_s=2 * DEADLINE_MS / 1000 / pieces)
    assert b"unpack ok" in reply and b"ok refs/heads/main" in reply, reply[-300:]
    log = _compute_log(dev)
    assert re.search(r"push to slow: streamed ingest cut off after \d+ s", log)
    assert "limits.ingest_stream_receive_ms_max" in log
    assert _streamed(dev, "slow") is None
