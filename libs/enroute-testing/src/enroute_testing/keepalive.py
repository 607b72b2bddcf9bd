"""A push's response timed packet by packet on the wire: the keepalive drills.

Issue 23's acceptance asks for "a push with a keepalive gap measured at most
5 s on a pack of at least 200 MB" (docs/protocol.md, "Progress"). A small
HTTP client (h11) posts a whole receive-pack body, then timestamps each
side-band packet of the answer; the gaps between them, from the end of the
body on, are what a proxy's read timeout would see. ``tests/interop`` runs
it against ``enroute dev``, ``tests/cluster`` through the local cluster.
"""

from __future__ import annotations

import itertools
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import h11

from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_testing.gitcli import run_git

ZERO = "0" * 40
GIT_TIMEOUT_S = 900.0
"""Building the drill's 200 MB pack (fast-import, pack-objects) on a loaded two-core
machine took more than 120 s."""
DRILL_PACK_BYTES_MIN = 200_000_000
DRILL_BLOBS = 200_000
"""Small files in the drill's pack: their count keeps ingest busy, as the big files'
bytes keep the body long."""


def packets(buffer: bytearray) -> Iterator[bytes]:
    """Whole pkt-lines taken off the front of ``buffer`` (the response is side-band)."""
    while len(buffer) >= 4:
        size = int(buffer[:4], 16)
        if size == 0:
            del buffer[:4]
            yield FLUSH_PKT
            continue
        if len(buffer) < size:
            return
        packet = bytes(buffer[:size])
        del buffer[:size]
        yield packet


def timed_push(url: str, body: bytes, timeout_s: float = 120.0) -> list[tuple[float, bytes]]:
    """POST ``body`` to ``url``/git-receive-pack; each response packet with its time after
    the body was sent (seconds)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    conn = h11.Connection(h11.CLIENT)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
    request = h11.Request(
        method="POST",
        target=parts.path + "/git-receive-pack",
        headers=[
            ("Host", parts.netloc),
            ("Content-Type", "application/x-git-receive-pack-request"),
            ("Accept", "application/x-git-receive-pack-result"),
            ("Content-Length", str(len(body))),
        ],
    )
    sock.sendall(
        conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
    )
    sent = time.monotonic()
    timed: list[tuple[float, bytes]] = []
    buffer = bytearray()
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
                continue
            if isinstance(event, h11.Response):
                assert event.status_code == 200, event
            elif isinstance(event, h11.Data):
                now = time.monotonic() - sent
                buffer.extend(event.data)
                timed.extend((now, p) for p in packets(buffer))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return timed
    finally:
        sock.close()


def gaps_after_body(timed: list[tuple[float, bytes]]) -> list[float]:
    """The silences of the answer: from the body's end to the first packet, then between."""
    times = [0.0] + [t for t, _ in timed]
    return [b - a for a, b in itertools.pairwise(times)]


def push_body(src: Path, home: Path, caps: str) -> bytes:
    """The receive-pack request creating ``main`` of ``src``: command, flush, whole pack."""
    tip = run_git(["rev-parse", "main"], cwd=src, home=home).decode().strip()
    pack = run_git(["pack-objects", "--revs", "--stdout", "-q"], cwd=src, home=home,
                   input=b"main\n", timeout_s=GIT_TIMEOUT_S)  # fmt: skip
    command = f"{ZERO} {tip} refs/heads/main\0{caps} object-format=sha1 agent=test".encode()
    return pkt_line(command) + FLUSH_PKT + pack


def busy_source(path: Path, home: Path, blobs: int, seed: int, big_bytes: int = 0) -> None:
    """A commit of ``blobs`` small distinct files in directories of 1000, written by
    ``git fast-import``: a pack whose ingest takes seconds for its object count; and
    incompressible 4 MiB files of ``big_bytes`` in all."""
    run_git(["init", "-q", "-b", "main", str(path)], cwd=path.parent, home=home)
    rng = random.Random(seed)
    stream = bytearray(b"commit refs/heads/main\ncommitter t <t@t> 0 +0000\ndata 4\nbig\n")
    for i in range(blobs):
        data = b"%d %x\n" % (i, rng.getrandbits(64))
        stream += b"M 100644 inline d%04d/f%04d\ndata %d\n%s\n" % (
            i // 1000,
            i % 1000,
            len(data),
            data,
        )
    for i in range(big_bytes // (4 << 20)):
        data = rng.randbytes(4 << 20)
        stream += b"M 100644 inline big%04d.bin\ndata %d\n%s\n" % (i, len(data), data)
    run_git(["fast-import", "--quiet"], cwd=path, home=home, input=bytes(stream),
            timeout_s=GIT_TIMEOUT_S)  # fmt: skip


def drill_body(src: Path, home: Path, seed: int) -> bytes:
    """The drill's request: a pack of at least 200 MB, progress on (as from a terminal)."""
    busy_source(src, home, DRILL_BLOBS, seed, big_bytes=200 << 20)
    body = push_body(src, home, "report-status side-band-64k")
    assert len(body) >= DRILL_PACK_BYTES_MIN, len(body)
    return body
