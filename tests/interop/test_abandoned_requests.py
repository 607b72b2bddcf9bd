"""A request's work ends with the request (issue 24, finding 6), against a real `enroute dev`.

Clients that go away mid-clone or mid-push: gitproto sees the disconnect (ASGI
``http.disconnect``) and cancels the compute's call; the compute's handler is
cancelled, tells the worker thread (a pack being written, an ingest) to stop
(``enroute_compute.work``), frees its pins and scratch files and logs one line.
Before, a clone kept writing its whole pack to nobody and a push kept ingesting
(and landed); a shutdown with requests stuck logged a traceback per request.

The requests are raw HTTP (gitprotocol-http, "Smart Service git-upload-pack" and
"git-receive-pack"; gitprotocol-v2 "fetch"), so the client can stop at any byte.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.packwrite import PackWriter
from enroute_core.git.pktline import DELIM_PKT, FLUSH_PKT, pkt_line
from enroute_testing.devserver import DevServer, role_log, running_dev
from enroute_testing.procmem import MiB, memory, role_pid
from enroute_testing.ready import latest_ready
from enroute_testing.waiting import wait_until

pytestmark = pytest.mark.slow

ZERO = b"0" * 40
IDENT = b"A U Thor <author@example.com> 1700000000 +0000"
OBJECTS = 60_000
"""Blobs in each pack: ingesting one, or writing one to a clone, takes about a second."""
ROUNDS = 100
"""Abandoned clones, and as many abandoned pushes (half whole, half cut in their body)."""
SETTLE_S = 15.0
"""How long the node may take to end all their work once the last client has gone."""
RSS_GROWTH_BYTES_MAX = 192 * MiB
"""The compute's resident memory after the rounds, over its baseline after one clone and
one push that ended; work that outlived its request held a pack plan or an ingest each."""
STUCK = 8
STUCK_CLONE_BYTES = 64 * MiB
"""A blob in the stuck clones' repository: more than the socket buffers between a client
that reads nothing and gitproto, and between gitproto and the compute, hold."""


def _pack(seed: int, large_bytes: int = 0) -> tuple[bytes, bytes]:
    """A pack of one commit, one tree and ``OBJECTS`` small blobs (and one incompressible
    blob of ``large_bytes``, from a fixed seed); and the commit's hex id."""
    blobs = [b"blob %d of pack %d\n" % (i, seed) for i in range(OBJECTS)]
    if large_bytes:
        blobs.append(random.Random(seed).randbytes(large_bytes))
    oids = [object_id(ObjectType.BLOB, b) for b in blobs]
    tree = b"".join(b"100644 f%06d\0" % i + bytes(oid) for i, oid in enumerate(oids))
    tree_oid = object_id(ObjectType.TREE, tree)
    commit = b"tree %s\nauthor %s\ncommitter %s\n\npack %d\n" % (
        bytes(tree_oid).hex().encode(), IDENT, IDENT, seed
    )  # fmt: skip
    chunks: list[bytes] = []
    writer = PackWriter(chunks.append)
    writer.header(len(blobs) + 2)
    writer.add_full(1, commit)
    writer.add_full(2, tree)
    for body in blobs:
        writer.add_full(3, body)
    writer.finish()
    return b"".join(chunks), bytes(object_id(ObjectType.COMMIT, commit)).hex().encode()


def _push_body(pack: bytes, new: bytes) -> bytes:
    command = ZERO + b" " + new + b" refs/heads/main\0report-status\n"
    return pkt_line(command) + FLUSH_PKT + pack


def _fetch_body(want: bytes) -> bytes:
    return (
        pkt_line(b"command=fetch\n")
        + DELIM_PKT
        + pkt_line(b"ofs-delta\n")
        + pkt_line(b"want " + want + b"\n")
        + pkt_line(b"done\n")
        + FLUSH_PKT
    )


def _head(path: str, body: bytes, service: str, v2: bool = False) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: enroute",
        f"Content-Type: application/x-{service}-request",
        f"Content-Length: {len(body)}",
    ]
    if v2:
        lines.append("Git-Protocol: version=2")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _fetch_request(repo: str, want: bytes) -> bytes:
    body = _fetch_body(want)
    return _head(f"/{repo}.git/git-upload-pack", body, "git-upload-pack", v2=True) + body


def _push_request(repo: str, body: bytes) -> bytes:
    return _head(f"/{repo}.git/git-receive-pack", body, "git-receive-pack")


def _connect(dev: DevServer) -> socket.socket:
    host, port = dev.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def _post(dev: DevServer, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    host, port = dev.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        assert response.status == 200, response.status
        return response.read()
    finally:
        conn.close()


def _status(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "/status", timeout=10) as response:
        found: dict[str, object] = json.loads(response.read())
    return found


def _compute_url(dev: DevServer) -> str:
    log = role_log(dev.log_path.parent, "compute")
    return "http://" + latest_ready(log, "compute")["http"]


def _in_flight(dev: DevServer, compute_url: str) -> tuple[object, object]:
    return (
        _status(dev.ops_url)["requests_in_flight"],
        _status(compute_url)["git_calls_in_flight"],
    )


def _settle(dev: DevServer, compute_url: str) -> float:
    """Seconds until no request is in flight on gitproto or the compute (fails past SETTLE_S)."""
    started = time.monotonic()
    wait_until(
        lambda: _in_flight(dev, compute_url) == (0, 0),
        SETTLE_S,
        "no request in flight on gitproto or the compute",
        poll_s=0.1,
        explain=lambda: _in_flight(dev, compute_url),
    )
    return time.monotonic() - started


def _logs(dev: DevServer) -> dict[str, str]:
    logs = dev.log_path.parent / "data" / "logs"
    return {p.name: p.read_text(errors="replace") for p in sorted(logs.glob("*.log"))}


def _refs(dev: DevServer, repo: str) -> bytes:
    host, port = dev.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", f"/{repo}.git/info/refs?service=git-upload-pack")
        response = conn.getresponse()
        body = response.read()
        return body if response.status == 200 else b""
    finally:
        conn.close()


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    with running_dev(tmp_path_factory.mktemp("enroute-abandoned")) as server:
        yield server


@pytest.fixture(scope="module")
def seeded(dev: DevServer) -> tuple[bytes, bytes]:
    """The repository ``big`` (a clone of it is expensive), and a pack for the pushes."""
    pack, commit = _pack(0)
    headers = {"Content-Type": "application/x-git-receive-pack-request"}
    reply = _post(dev, "/big.git/git-receive-pack", _push_body(pack, commit), headers)
    assert b"ok refs/heads/main" in reply, reply
    other, other_commit = _pack(1)
    return commit, _push_body(other, other_commit)


def test_abandoned_clones_and_pushes_end_their_work(
    dev: DevServer, seeded: tuple[bytes, bytes]
) -> None:
    want, push = seeded
    compute_url = _compute_url(dev)
    compute = role_pid(dev.pid, "compute")
    # The baseline: one clone and one push that ran to their end.
    with _connect(dev) as whole:
        whole.sendall(_fetch_request("big", want))
        while whole.recv(1 << 16):
            pass
    headers = {"Content-Type": "application/x-git-receive-pack-request"}
    assert b"ok refs/heads/main" in _post(dev, "/warm.git/git-receive-pack", push, headers)
    _settle(dev, compute_url)
    baseline = memory(compute).rss_bytes

    started = time.monotonic()
    for i in range(ROUNDS):
        with _connect(dev) as clone:  # gone after the first bytes of the answer
            clone.sendall(_fetch_request("big", want))
            assert clone.recv(1)
        with _connect(dev) as pusher:  # gone with the whole body sent, or half of it
            sent = push if i % 2 == 0 else push[: len(push) // 2]
            pusher.sendall(_push_request(f"gone{i}", push) + sent)
    loop_s = time.monotonic() - started
    settled_s = _settle(dev, compute_url)
    after = memory(compute)
    print(
        f"{ROUNDS} abandoned clones and pushes in {loop_s:.1f} s, settled {settled_s:.1f} s "
        f"later; compute resident {baseline // MiB} MiB -> {after.rss_bytes // MiB} MiB "
        f"(peak {after.peak_bytes // MiB} MiB)"
    )
    assert after.rss_bytes - baseline < RSS_GROWTH_BYTES_MAX
    landed = [i for i in range(0, ROUNDS, 2) if b"refs/heads/main" in _refs(dev, f"gone{i}")]
    assert len(landed) <= ROUNDS // 20, f"pushes whose client had gone landed: {landed}"
    logs = _logs(dev)
    for name, text in logs.items():
        assert "Traceback" not in text, f"{name}:\n{text[-4000:]}"
        assert "never retrieved" not in text, name
    ended = logs["compute.log"].count("ended with its request")
    assert ended >= ROUNDS, f"only {ended} calls logged their end"


def test_shutdown_with_requests_stuck_logs_no_traceback(
    tmp_path: Path, seeded: tuple[bytes, bytes], dev: DevServer
) -> None:
    """SIGTERM while clones wait for a client that reads nothing and pushes wait for the
    rest of their body: each request is cut with one line (DESIGN "Processes": the
    compute drains, then stops), and no role logs a traceback or a CancelledError."""
    _, push = seeded
    pack, want = _pack(0, STUCK_CLONE_BYTES)
    stuck: list[socket.socket] = []
    try:
        with running_dev(tmp_path) as node:
            headers = {"Content-Type": "application/x-git-receive-pack-request"}
            _post(node, "/big.git/git-receive-pack", _push_body(pack, want), headers)
            for i in range(STUCK):
                clone = _connect(node)
                clone.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                clone.sendall(_fetch_request("big", want))
                pusher = _connect(node)
                pusher.sendall(_push_request(f"stuck{i}", push) + push[: len(push) // 2])
                stuck += [clone, pusher]
            compute_url = _compute_url(node)
            wait_until(
                lambda: _in_flight(node, compute_url) == (2 * STUCK, 2 * STUCK),
                SETTLE_S,
                "every stuck request in flight",
                poll_s=0.1,
                explain=lambda: _in_flight(node, compute_url),
            )
        logs = _logs(node)
    finally:
        for sock in stuck:
            sock.close()
    for name, text in logs.items():
        assert "Traceback" not in text, f"{name}:\n{text[-4000:]}"
        assert "CancelledError" not in text, f"{name}:\n{text[-4000:]}"
    cut = logs["gitproto.log"].count("request cut by shutdown")
    assert cut == 2 * STUCK, logs["gitproto.log"] + logs["compute.log"]


def test_an_answer_may_take_longer_than_the_body_idle_timeout(
    tmp_path: Path, seeded: tuple[bytes, bytes]
) -> None:
    """gitproto watches for the client's disconnect once the body is in, through the
    receiver that bounds a body's idle time (`transport.body_idle_timeout`): the bound is
    for bodies, so a push whose ingest, or a clone whose pack, takes longer still ends."""
    _, push = seeded
    pushed = push[4 + 41 : 4 + 81]  # the command's new value (pkt-line: length, old, SP, new)
    idle_s = 0.2
    with running_dev(tmp_path, {"transport": {"body_idle_timeout": f"{idle_s}s"}}) as node:
        headers = {"Content-Type": "application/x-git-receive-pack-request"}
        started = time.monotonic()
        reply = _post(node, "/slow.git/git-receive-pack", push, headers)
        push_s = time.monotonic() - started
        assert b"ok refs/heads/main" in reply, reply
        headers = {
            "Content-Type": "application/x-git-upload-pack-request",
            "Git-Protocol": "version=2",
        }
        answer = _post(node, "/slow.git/git-upload-pack", _fetch_body(pushed), headers)
        assert b"packfile\n" in answer and answer.endswith(b"0000"), answer[-200:]
        assert "Traceback" not in _logs(node)["gitproto.log"]
    assert push_s > idle_s, f"the push took {push_s:.2f} s: the bound was not reached"
