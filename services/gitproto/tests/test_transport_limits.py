"""Transport bounds of gitproto against a gRPC Compute double (docs/access-control.md,
"Hostile transport input"): each hostile input is refused with the status the
client sees, the compute's call is released, and the node serves afterwards."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from enroute_core.base.errors import LimitExceeded
from enroute_gitproto.app import TransportLimits
from enroute_gitproto.githttp import GitHttpLimits, PktLineCounter
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.waiting import wait_until

PUSH = "/team/app.git/git-receive-pack"
FETCH = "/team/app.git/git-upload-pack"


class RecordingCompute(compute_pb2_grpc.ComputeServicer):
    """Counts calls started, ended and answered.

    A cancelled call can look like an ended request stream to a servicer for
    a moment (the stream's end and its cancellation arrive separately), so
    "answered" counts only calls whose answer was taken by the client: the
    servicer resumes after its ``yield`` only then.
    """

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0
        self.answered = 0
        self.lock = threading.Lock()

    def _git(self, requests: Iterator[compute_pb2.GitRequest], context: Any) -> Any:
        with self.lock:
            self.started += 1

        def done() -> None:
            with self.lock:
                self.ended += 1

        if not context.add_callback(done):  # cancelled before the handler ran
            done()
        next(requests)
        body = b"".join(r.body for r in requests)
        yield compute_pb2.GitResponse(body=b"ok:" + str(len(body)).encode())
        with self.lock:
            self.answered += 1

    def released(self) -> bool:
        """Every call has ended; the ones not answered were cancelled by gitproto."""
        with self.lock:
            return self.ended == self.started

    def InfoRefs(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
        yield from self._git(request_iterator, context)

    def UploadPack(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
        yield from self._git(request_iterator, context)

    def ReceivePack(self, request_iterator: Any, context: Any) -> Any:  # noqa: N802
        yield from self._git(request_iterator, context)


@pytest.fixture
def recording() -> Iterator[tuple[RecordingCompute, str]]:
    fake = RecordingCompute()  # type: ignore[abstract]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    compute_pb2_grpc.add_ComputeServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(0).wait()


def start(make_gitproto: Any, member: str, **limits: Any) -> Any:
    git = {k: v for k, v in limits.items() if k in GitHttpLimits.__dataclass_fields__}
    every = {k: v for k, v in limits.items() if k in TransportLimits.__dataclass_fields__}
    return make_gitproto([member], anonymous="write", limits=GitHttpLimits(**git),
                         transport=TransportLimits(**every))  # fmt: skip


Response = tuple[int, dict[str, str], bytes]


def request(address: str, method: str, target: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> Response:  # fmt: skip
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def open_raw(address: str, target: str, length: int, first: bytes = b"") -> socket.socket:
    """A POST whose headers promise ``length`` body bytes, of which only ``first`` are sent."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.sendall(
        f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
        "Content-Type: application/x-git-receive-pack-request\r\n\r\n".encode()
        + first
    )
    return sock


def read_response(sock: socket.socket, data: bytes = b"") -> tuple[int, bytes]:
    """Status and raw bytes of one response with a Content-Length, read to its end."""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        rest += chunk
    return int(head.split(b" ", 2)[1]), head + b"\r\n\r\n" + rest


def still_serves(address: str, fake: RecordingCompute) -> None:
    status, _, body = request(address, "POST", PUSH, b"0000")
    assert (status, body) == (200, b"ok:4")
    assert request(address, "GET", "/readyz")[0] == 200


# --- pkt-line counting (gitprotocol-common, "pkt-line Format") ---


def _pkts(*payloads: bytes) -> bytes:
    return b"".join(b"0000" if p == b"" else b"%04x" % (len(p) + 4) + p for p in payloads)


def test_pkt_counter_whole_and_byte_by_byte() -> None:
    body = _pkts(b"want " + b"a" * 40 + b"\n", *[b"have " + b"b" * 40 + b"\n"] * 9, b"", b"done")
    whole = PktLineCounter(100, stop_at_flush=False)
    whole.feed(body)
    split = PktLineCounter(100, stop_at_flush=False)
    for i in range(len(body)):
        split.feed(body[i : i + 1])
    assert whole.lines == split.lines == 12
    with pytest.raises(LimitExceeded) as caught:
        PktLineCounter(11, stop_at_flush=False).feed(body)
    assert caught.value.limit == "negotiation_pkt_lines_max"


def test_pkt_counter_stops_at_push_flush_and_bad_framing() -> None:
    pack = b"PACK" + b"\xff" * 5000  # not pkt-lines: never counted
    push = PktLineCounter(3, stop_at_flush=True)
    push.feed(_pkts(b"a" * 10, b"b" * 10, b"") + pack)
    assert (push.lines, push.active) == (3, False)
    bad = PktLineCounter(3, stop_at_flush=False)
    bad.feed(b"00zz" + b"0004" * 10)
    assert (bad.lines, bad.active) == (0, False)  # the protocol layer refuses the framing


# --- T1: body size ---


def test_content_length_over_limit_is_413_before_reading(
    recording: tuple[RecordingCompute, str], make_gitproto: Any
) -> None:
    fake, member = recording
    server = start(make_gitproto, member, body_bytes_max=1000)
    sock = open_raw(server.address, PUSH, 10**12)  # a terabyte promised, nothing sent
    status, raw = read_response(sock)
    sock.close()
    assert status == 413 and b"transport.git_body_max" in raw
    assert fake.started == 0  # no compute was asked
    still_serves(server.address, fake)


def test_streamed_body_over_limit_is_413(
    recording: tuple[RecordingCompute, str], make_gitproto: Any
) -> None:
    fake, member = recording
    server = start(make_gitproto, member, body_bytes_max=100_000)

    def chunks() -> Iterator[bytes]:
        for _ in range(50):
            yield b"x" * 10_000

    status, _, body = request(server.address, "POST", PUSH, chunks())  # type: ignore[arg-type]
    assert status == 200 and body[4:8] == b"ERR " and b"body_bytes_max" in body  # git shows it
    wait_until(fake.released, 10, "the compute's call is over: it holds nothing")
    assert fake.answered == 0
    still_serves(server.address, fake)


# --- T2: gzip bombs ---


def test_gzip_bomb_is_413(recording: tuple[RecordingCompute, str], make_gitproto: Any) -> None:
    fake, member = recording
    server = start(make_gitproto, member, gzip_ratio_max=20, gzip_slack_bytes=64 * 1024)
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), 9)  # ~64 KiB that inflate to 64 MiB
    assert len(bomb) < 100_000
    status, _, body = request(server.address, "POST", FETCH, bomb,
                              {"Content-Encoding": "gzip"})  # fmt: skip
    assert status == 200 and body[4:8] == b"ERR " and b"transport.gzip_ratio_max" in body
    wait_until(fake.released, 10, "the compute call released")
    assert fake.answered == 0
    normal = gzip.compress(_pkts(b"command=ls-refs\n", b""))
    status, _, body = request(server.address, "POST", FETCH, normal, {"Content-Encoding": "gzip"})
    assert (status, body) == (200, b"ok:24")
    still_serves(server.address, fake)


# --- T3: pkt-lines in negotiation ---


def test_too_many_pkt_lines_is_413(
    recording: tuple[RecordingCompute, str], make_gitproto: Any
) -> None:
    fake, member = recording
    server = start(make_gitproto, member, negotiation_pkt_lines_max=1000)
    haves = _pkts(*[b"have " + b"c" * 40 + b"\n"] * 1500, b"done")
    status, _, body = request(server.address, "POST", FETCH, haves)
    assert status == 200 and body[4:8] == b"ERR "
    assert b"transport.negotiation_pkt_lines_max" in body
    wait_until(fake.released, 10, "the compute call released")
    assert fake.answered == 0
    still_serves(server.address, fake)


# --- T4, T5: concurrency per node and per repository ---


def test_node_concurrency_is_503_with_retry_after(
    recording: tuple[RecordingCompute, str], make_gitproto: Any
) -> None:
    fake, member = recording
    server = start(make_gitproto, member, requests_max=2, retry_after_s=7.0)
    held = [open_raw(server.address, f"/r{i}.git/git-receive-pack", 100, b"0") for i in range(2)]
    wait_until(lambda: server.app.admission.total == 2, 10, "two admissions")
    status, headers, body = request(server.address, "POST", "/other.git/git-receive-pack", b"")
    assert status == 503 and headers["retry-after"] == "7"
    assert b"transport.requests_max" in body
    status, headers, body = request(server.address, "GET", "/api/v1/repos/x")
    assert status == 503 and b"transport.requests_max" in body  # the API too
    assert request(server.address, "GET", "/healthz")[0] == 200  # probes are exempt
    for sock in held:
        sock.close()
    wait_until(lambda: server.app.admission.total == 0, 10, "no admission")
    still_serves(server.address, fake)


def test_repository_concurrency_is_503(
    recording: tuple[RecordingCompute, str], make_gitproto: Any
) -> None:
    fake, member = recording
    server = start(make_gitproto, member, repo_requests_max=1)
    held = open_raw(server.address, PUSH, 100, b"0")
    wait_until(
        lambda: server.app.admission.by_repo.get("team/app") == 1,
        10,
        "one admission of team/app",
    )
    status, headers, body = request(server.address, "POST", FETCH, b"0000")
    assert status == 503 and "retry-after" in headers and b"repo_requests_max" in body
    status, _, _ = request(server.address, "POST", "/team/other.git/git-upload-pack", b"0000")
    assert status == 200  # another repository is served
    held.close()
    wait_until(lambda: server.app.admission.by_repo == {}, 10, "no admission of any repository")
    still_serves(server.address, fake)


# --- T6, T7: slow-loris bodies and the total time ---


def test_slow_loris_body_is_cut_and_compute_released(
    recording: tuple[RecordingCompute, str], make_gitproto: Any
) -> None:
    fake, member = recording
    server = start(make_gitproto, member, body_idle_timeout_s=0.5)
    sock = open_raw(server.address, PUSH, 1000, b"0032")  # 4 of 1000 bytes, then silence
    started = time.monotonic()
    status, raw = read_response(sock)
    sock.close()
    assert status == 504 and b"transport.body_idle_timeout" in raw
    assert 0.4 < time.monotonic() - started < 10
    wait_until(fake.released, 10, "the compute's call is over: it holds nothing")
    assert fake.answered == 0
    wait_until(lambda: server.app.admission.total == 0, 10, "no admission")
    still_serves(server.address, fake)


def test_request_timeout_cuts_a_trickling_body(
    recording: tuple[RecordingCompute, str], make_gitproto: Any
) -> None:
    fake, member = recording
    # 2 s, not 1: the same bound applies to still_serves' request below, which a loaded
    # CI machine (the fleet test beside it) took over 1 s to answer once
    server = start(make_gitproto, member, body_idle_timeout_s=5.0, request_timeout_s=2.0)
    sock = open_raw(server.address, PUSH, 1000, b"0")
    started = time.monotonic()
    sock.settimeout(0.2)
    raw = b""
    for _ in range(50):  # one byte every 0.2 s: never idle, never done
        try:
            raw += sock.recv(65536)
            break
        except TimeoutError:
            sock.sendall(b"0")
    sock.settimeout(10)
    status, raw = read_response(sock, raw)
    sock.close()
    assert status == 504 and b"transport.request_timeout" in raw
    assert 1.9 < time.monotonic() - started < 7
    wait_until(fake.released, 10, "the compute call released")
    assert fake.answered == 0
    still_serves(server.address, fake)


# --- T8: API bodies ---


def test_api_body_limits(recording: tuple[RecordingCompute, str], make_gitproto: Any) -> None:
    fake, member = recording
    server = start(make_gitproto, member, api_body_bytes_max=1000)
    sock = open_raw(server.address, "/api/v1/repos", 10**9)
    status, raw = read_response(sock)
    sock.close()
    assert status == 413 and b"transport.api_body_max" in raw and b'"limit_exceeded"' in raw

    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b" " * 500

    status, _, body = request(server.address, "POST", "/api/v1/repos", chunks())  # type: ignore[arg-type]
    assert status == 413 and b"limit_exceeded" in body
    still_serves(server.address, fake)
