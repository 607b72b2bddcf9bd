"""Connection bounds of gitproto's HTTP server (connections.py; docs/access-control.md,
"Connections"; issue 24, items 5 and 7): header timeout, header size, per-client
connection and request caps, and room for new clients when the node is full.

Raw sockets against gitproto served by uvicorn (conftest ``Gitproto``), so every
byte and every segment boundary is the test's choice. Sources other than
127.0.0.1 are other loopback addresses (127.0.0.2, ...), which Linux routes to lo.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from enroute_gitproto.app import TransportLimits
from enroute_gitproto.connections import head_bytes
from enroute_testing.waiting import wait_until

GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"


def connect(address: str, source: str = "127.0.0.1") -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (10 s at most)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body, the connection left open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))  # fmt: skip
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response else 0


def is_closed(sock: socket.socket, wait_s: float = 5.0) -> bool:
    sock.settimeout(wait_s)
    try:
        return sock.recv(65536) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except ConnectionResetError:
        return True


@pytest.fixture
def served(computes: Any, make_gitproto: Callable[..., Any]) -> Callable[..., Any]:
    def start(**limits: Any) -> Any:
        return make_gitproto([computes[0].address], anonymous="write",
                             transport=TransportLimits(**limits))  # fmt: skip

    return start


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_head_size_counts_the_request_line_and_fields() -> None:
    import h11

    request = h11.Request(method="GET", target="/x", headers=[("Host", "a"), ("X-Y", "zz")])
    assert head_bytes(request) == len(b"GET /x HTTP/1.1\r\nhost: a\r\nx-y: zz\r\n\r\n")


@pytest.mark.parametrize("pieces", [1, 40], ids=["one-segment", "in-pieces"])
def test_head_over_the_bound_is_431(served: Any, sockets: list[Any], pieces: int) -> None:
    """The issue's finding: a 32 KiB head in one segment was accepted (h11 bounds only an
    incomplete head). Now 431, sent whole or in pieces; 15 KiB still passes."""
    server = served(header_bytes_max=16 * 1024)
    big = GET + b"X-Big: " + b"a" * (32 * 1024) + b"\r\n\r\n"
    sock = connect(server.address)
    sockets.append(sock)
    step = -(-len(big) // pieces)
    for start in range(0, len(big), step):
        try:
            sock.sendall(big[start : start + step])
        except (BrokenPipeError, ConnectionResetError):
            break  # closed after the 431 while pieces were still going
        if pieces > 1:
            time.sleep(0.005)  # the point: a head that arrives in slow pieces
    answer = read_all(sock)
    assert status_of(answer) == 431, answer[:200]
    assert b"(transport.header_max)" in answer
    ok = connect(server.address)
    sockets.append(ok)
    ok.sendall(GET + b"X-Big: " + b"a" * (15 * 1024) + b"\r\nConnection: close\r\n\r\n")
    assert status_of(read_all(ok)) == 200
    closed = server.app.connections.status()["closed"]
    assert closed["header_bytes_max"] == 1


def test_pipelined_big_head_is_431_after_the_first_answer(served: Any, sockets: list[Any]) -> None:
    server = served(header_bytes_max=4096)
    sock = connect(server.address)
    sockets.append(sock)
    sock.sendall(GET + b"\r\n" + GET + b"X-Big: " + b"b" * 8192 + b"\r\n\r\n")
    answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 431" in answer


def test_header_timeout_closes_slow_and_silent_connections(served: Any, sockets: list[Any]) -> None:
    server = served(header_timeout_s=0.5)
    slow, silent, used = (connect(server.address) for _ in range(3))
    sockets.extend([slow, silent, used])
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost")  # and nothing more
    used.sendall(GET + b"\r\n")
    assert status_of(read_response(used)) == 200  # then idle on keep-alive
    started = time.monotonic()
    answer = read_all(slow)
    assert status_of(answer) == 408 and b"(transport.header_timeout)" in answer
    assert 0.3 < time.monotonic() - started < 5
    assert read_all(silent) == b""  # nothing was asked: closed without an answer
    assert is_closed(used)
    assert server.app.connections.status()["closed"]["header_timeout"] == 3
    assert server.app.connections.status()["open"] == 0


def test_a_steady_client_is_not_cut_by_the_header_timeout(served: Any, sockets: list[Any]) -> None:
    """The timer is per request head: a keep-alive connection making request after request
    for longer than the timeout is never cut."""
    server = served(header_timeout_s=0.4)
    sock = connect(server.address)
    sockets.append(sock)
    for _ in range(8):
        sock.sendall(GET + b"\r\n")
        assert status_of(read_response(sock)) == 200
        time.sleep(0.1)  # the point: requests spread over longer than the header timeout


def test_per_client_connection_cap(served: Any, sockets: list[Any]) -> None:
    server = served(client_connections_max=3)
    held = [connect(server.address) for _ in range(3)]
    sockets.extend(held)
    fourth = connect(server.address)
    sockets.append(fourth)
    answer = read_all(fourth)
    assert status_of(answer) == 503 and b"(transport.client_connections_max)" in answer
    assert b"retry-after: 5" in answer.lower()
    other = connect(server.address, source="127.0.0.2")  # another client is served
    sockets.append(other)
    other.sendall(GET + b"Connection: close\r\n\r\n")
    assert status_of(read_all(other)) == 200
    held[0].close()
    wait_until(
        lambda: server.app.connections.by_client.get("127.0.0.1", 0) < 3,
        5,
        "the server notices the closed connection",
    )
    again = connect(server.address)
    sockets.append(again)
    again.sendall(GET + b"Connection: close\r\n\r\n")
    assert status_of(read_all(again)) == 200


def _hold_request(address: str, source: str = "127.0.0.1") -> socket.socket:
    """A request in flight: an API POST whose promised body never comes."""
    sock = connect(address, source)
    sock.sendall(b"POST /api/v1/repos HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    return sock


def test_full_node_closes_the_longest_waiting_connection(served: Any, sockets: list[Any]) -> None:
    """1,100 idle connections used to make every request 503. Now a new connection takes the
    place of the one that has waited longest for a request head; only when every connection
    is busy with a request is the new one refused."""
    server = served(connections_max=4, client_connections_max=0)
    idle = [connect(server.address) for _ in range(4)]
    sockets.extend(idle)
    wait_until(lambda: server.app.connections.open == 4, 5, "4 connections open")
    fresh = connect(server.address)
    sockets.append(fresh)
    fresh.sendall(GET + b"Connection: close\r\n\r\n")
    assert status_of(read_all(fresh)) == 200
    assert is_closed(idle[0]) and not is_closed(idle[1], 0.2)
    busy = [_hold_request(server.address) for _ in range(4)]
    sockets.extend(busy)
    wait_until(
        lambda: server.app.metrics.in_flight_count == 4,
        5,
        "server.app.metrics.in_flight_count == 4",
    )
    refused = connect(server.address)
    sockets.append(refused)
    answer = read_all(refused)
    assert status_of(answer) == 503 and b"all busy (transport.connections_max)" in answer
    closed = server.app.connections.status()["closed"]
    assert closed["evicted"] == 4 and closed["connections_max"] == 1


def test_per_client_request_cap(served: Any, sockets: list[Any]) -> None:
    server = served(client_requests_max=2, body_idle_timeout_s=30)
    sockets.extend(_hold_request(server.address) for _ in range(2))
    wait_until(
        lambda: server.app.metrics.in_flight_count == 2,
        5,
        "server.app.metrics.in_flight_count == 2",
    )
    third = connect(server.address)
    sockets.append(third)
    third.sendall(b"GET /api/v1/repos HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = read_all(third)
    assert status_of(answer) == 503 and b"(transport.client_requests_max)" in answer
    assert b"retry-after: 5" in answer.lower()
    other = connect(server.address, source="127.0.0.2")
    sockets.append(other)
    other.sendall(b"GET /api/v1/repos HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(read_all(other)) == 200


def test_status_and_metrics_show_connections(served: Any, sockets: list[Any]) -> None:
    server = served(client_connections_max=1)
    sockets.append(connect(server.address, source="127.0.0.3"))
    refused = connect(server.address, source="127.0.0.3")
    sockets.append(refused)
    read_all(refused)
    probe = connect(server.ops_address)  # the operator port: not a Git connection, not counted
    sockets.append(probe)
    probe.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    body = read_all(probe).partition(b"\r\n\r\n")[2]
    section = json.loads(body)["connections"]
    assert section["open"] == 1 and section["clients"] == 1
    assert section["closed"] == {"client_connections_max": 1}
    metrics = connect(server.ops_address)
    sockets.append(metrics)
    metrics.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = read_all(metrics).decode()
    assert 'enroute_gitproto_connections_closed_total{reason="client_connections_max"} 1.0' in text
    assert "enroute_gitproto_connections_open 1.0" in text
