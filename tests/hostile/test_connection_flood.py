"""2,000 slow-header and 2,000 idle connections against a real `enroute dev`, and git still
clones (issue 24, item 6; docs/access-control.md, "Connections").

Before: uvicorn held every connection until it completed a request head, and
its ``limit_concurrency`` counted them all, so 1,100 connections that each
sent part of a head made every request 503. Now the connection that has
waited longest for a head makes room for a new one (``transport.connections_max``),
one address holds at most ``transport.client_connections_max`` connections,
and the header timeout closes the rest in time.

The flood comes from 20 other loopback addresses (127.0.1.1-20, which Linux
routes to lo), 200 connections each, slow and idle addresses in turn: under the
per-client cap, so the node
bound has to do the work; the header timeout is set long (120 s) so that it
does not. One more address opens 400 at once to meet the per-client cap.
The git client clones from 127.0.0.1 while the flood is held, three times,
with the slow connections trickling a byte between clones.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.devserver import DevServer, running_dev
from enroute_testing.gitcli import git_env

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

SLOW = 2000
IDLE = 2000
PER_ADDRESS = 200
BURST = 400
FDS_NEEDED = SLOW + IDLE + BURST + 3000  # the test's sockets, gitproto's, git's and margins
CLIENT_CONNECTIONS_MAX = 256
CLONE_S_MAX = 60.0


@pytest.fixture(scope="module")
def fds() -> Iterator[None]:
    """Raise the soft fd limit to the hard one (the roles inherit it), or skip."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FDS_NEEDED:
        pytest.skip(f"needs {FDS_NEEDED} open files, the hard limit (ulimit -Hn) is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def dev(fds: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    config = {"transport": {"header_timeout": "120s"}}
    with running_dev(tmp_path_factory.mktemp("enroute-flood"), config) as server:
        yield server


def git(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=cwd, env=git_env(home), capture_output=True,
                          timeout=CLONE_S_MAX, check=False)  # fmt: skip


def flood(address: str, sources: list[str], per_source: int, first: bytes) -> list[socket.socket]:
    """``per_source`` connections from each source address, each sending ``first``."""
    host, port = address.rsplit(":", 1)
    opened = []
    for source in sources:
        for _ in range(per_source):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.bind((source, 0))
            sock.connect((host, int(port)))
            if first:
                sock.sendall(first)
            sock.setblocking(False)
            opened.append(sock)
    return opened


def trickle(socks: list[socket.socket]) -> int:
    """One more header byte on each slow connection; how many the server still holds."""
    alive = 0
    for sock in socks:
        try:
            if sock.recv(1) == b"":
                continue  # closed by the server: evicted
        except BlockingIOError:
            pass  # open, nothing to read
        except OSError:
            continue
        try:
            sock.send(b"a")
            alive += 1
        except OSError:
            pass
    return alive


def status(url: str) -> dict[str, object]:
    """gitproto's /status, on its operator port (listen.ops)."""
    with urllib.request.urlopen(f"{url}/status", timeout=30) as response:
        found: dict[str, object] = json.loads(response.read())
        return found


def test_slow_and_idle_floods_do_not_stop_clones(dev: DevServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    src = tmp_path / "src"
    assert git(["init", "-q", "-b", "main", str(src)], tmp_path, home).returncode == 0
    (src / "README").write_text("hello\n")
    assert git(["add", "README"], src, home).returncode == 0
    assert git(["commit", "-q", "-m", "one"], src, home).returncode == 0
    url = f"{dev.url}/flood/repo.git"
    pushed = git(["push", "-q", url, "main"], src, home)
    assert pushed.returncode == 0, pushed.stderr

    socks: list[socket.socket] = []
    try:
        slow_sources = [f"127.0.1.{i}" for i in range(1, 11)]
        idle_sources = [f"127.0.1.{i}" for i in range(11, 21)]
        head = b"GET /flood/repo.git/info/refs?service=git-upload-pack HTTP/1.1\r\nX-Slow: "
        slow: list[socket.socket] = []
        for slow_source, idle_source in zip(slow_sources, idle_sources, strict=True):
            slow += flood(dev.address, [slow_source], PER_ADDRESS, head)
            socks += slow[-PER_ADDRESS:]
            socks += flood(dev.address, [idle_source], PER_ADDRESS, b"")
        assert len(socks) == SLOW + IDLE
        burst = flood(dev.address, ["127.0.2.1"], BURST, b"")
        socks += burst
        for round_ in range(3):
            started = time.monotonic()
            done = git(["clone", "-q", url, str(tmp_path / f"clone{round_}")], tmp_path, home)
            took = time.monotonic() - started
            assert done.returncode == 0, done.stderr.decode(errors="replace")
            assert (tmp_path / f"clone{round_}" / "README").read_text() == "hello\n"
            held = trickle(slow)
            print(f"clone {round_}: {took:.2f} s; slow-header connections still held: {held}")
            assert held > 100  # the clone was served while the node held slow-header ones
        seen = status(dev.ops_url)["connections"]
        assert isinstance(seen, dict)
        print(f"/status connections: {seen}")
        assert seen["open"] <= 1024  # transport.connections_max
        closed = seen["closed"]
        assert closed["evicted"] >= SLOW + IDLE - 1024
        assert closed["client_connections_max"] >= BURST - CLIENT_CONNECTIONS_MAX
    finally:
        for sock in socks:
            sock.close()
    done = git(["clone", "-q", url, str(tmp_path / "after")], tmp_path, home)
    assert done.returncode == 0, done.stderr
