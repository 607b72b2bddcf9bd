"""A gitproto that gets SIGTERM finishes the clone it is serving (issue 23, item 3).

`enroute dev` holds a repository with a 24 MB incompressible blob. A fetch of
it is read slowly (a small receive buffer, a pause per read) so that its pack
takes several seconds to deliver; once its first megabyte is in, the gitproto
process gets SIGTERM. It must close its listening socket at once (new
connections are refused), yet deliver the whole pack (its SHA-1 trailer
checked, as index-pack does) for longer than the fixed 5 s it used to allow,
within ``transport.shutdown_grace``, then exit with status 0.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest

from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.waiting import wait_until

pytestmark = [pytest.mark.interop, pytest.mark.slow]

BLOB_BYTES = 24 * 1024 * 1024
READ_BYTES = 32 * 1024
READ_PAUSE_S = 0.01
TERM_AFTER_BYTES = 1024 * 1024
OLD_FIXED_GRACE_S = 5.0


class SlowConnection(http.client.HTTPConnection):
    """A client whose small receive window keeps the server's pack from piling up here."""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READ_BYTES)
        sock.settimeout(self.timeout)
        sock.connect((self.host, self.port))
        self.sock = sock


def gitproto_pid(dev_pid: int) -> int:
    children = Path(f"/proc/{dev_pid}/task/{dev_pid}/children").read_text().split()
    for child in children:
        if b"enroute_gitproto" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError(f"no gitproto among {children}")


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.timeout(300)
def test_sigterm_lets_a_clone_in_flight_finish(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    (src / "big.bin").write_bytes(random.Random(23).randbytes(BLOB_BYTES))
    run_git(["add", "."], cwd=src)
    run_git(["commit", "-q", "-m", "big"], cwd=src)
    tip = run_git(["rev-parse", "HEAD"], cwd=src).decode().strip()
    root = tmp_path / "dev"
    root.mkdir()
    config = {"transport": {"shutdown_grace": "120s"}}
    with running_dev(root, config) as dev:
        run_git(["push", "-q", f"{dev.url}/drain.git", "main"], cwd=src, timeout_s=180)
        pid = gitproto_pid(dev.pid)
        host, port = dev.address.split(":")
        conn = SlowConnection(host, int(port), timeout=60)
        body = f"0032want {tip}\n".encode() + b"0000" + b"0009done\n"
        conn.request("POST", "/drain.git/git-upload-pack", body,
                     {"Content-Type": "application/x-git-upload-pack-request"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200
        got = bytearray()
        termed_at = None
        while chunk := response.read(READ_BYTES):
            got += chunk
            if termed_at is None and len(got) >= TERM_AFTER_BYTES:
                os.kill(pid, signal.SIGTERM)
                termed_at = time.monotonic()
                wait_until(
                    lambda: refused(host, int(port)),
                    5,
                    "a stopping gitproto refuses new connections",
                    poll_s=0.05,
                )
            time.sleep(READ_PAUSE_S)
        assert termed_at is not None, f"the answer ended after {len(got)} bytes"
        served_after_s = time.monotonic() - termed_at
        conn.close()
        wait_until(
            lambda: not Path(f"/proc/{pid}").exists(),
            30,
            "gitproto exits after its drain",
            poll_s=0.1,
        )
    assert got[:8] == b"0008NAK\n"
    pack = bytes(got[8:])
    assert pack[:4] == b"PACK" and len(pack) > BLOB_BYTES
    assert hashlib.sha1(pack[:-20]).digest() == pack[-20:], "the pack was cut short"
    assert served_after_s > OLD_FIXED_GRACE_S, (
        f"the pack ended {served_after_s:.1f} s after SIGTERM: too fast to show the drain"
    )
    log = (root / "data" / "logs" / "gitproto.log").read_text()
    assert "stopping: no new requests; 1 in flight" in log, log[-2000:]
    assert "gitproto exited with status 0" in (root / "enroute.log").read_text()
