"""A loopback HTTP proxy that injects faults between a client and an S3 endpoint.

The client talks to the proxy as if it were the endpoint; the proxy forwards
each request unchanged (the ``Host`` header too, so SigV4 signatures still
verify) and answers with the server's reply, except where a rule says
otherwise. Faults, each applied to a bounded number of matching requests:

* ``STATUS``: answer with an S3 error (503 SlowDown by default) without forwarding.
* ``DELAY``: hold the request ``delay_s`` before forwarding; if the client
  gives up meanwhile, the request is dropped and never reaches the server.
* ``DELAY_RESPONSE``: forward (the server applies the request), then hold the
  answer ``delay_s``: the client times out on a request that did happen.
* ``TRUNCATE``: send the head with the full Content-Length, then part of the
  body, then close the connection.
* ``FLIP``: XOR one byte of the response body.
* ``FLIP_REQUEST``: XOR one byte of the request body before forwarding.
* ``RESET``: close the connection without an answer.

The proxy runs its own asyncio loop in a daemon thread, so synchronous and
asynchronous tests can use it alike. Every buffer and wait has a bound.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

HEAD_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 256 * 1024 * 1024
RULE_TIMES_MAX = 10_000
DELAY_S_MAX = 60.0
_NO_BODY_STATUSES = frozenset({204, 304})


class FaultKind(enum.Enum):
    STATUS = "status"
    DELAY = "delay"
    DELAY_RESPONSE = "delay_response"
    TRUNCATE = "truncate"
    FLIP = "flip"
    FLIP_REQUEST = "flip_request"
    RESET = "reset"


@dataclass(frozen=True, slots=True)
class FaultRule:
    """Apply ``kind`` to matching requests number ``skip + 1`` to ``skip + times``.

    A request matches when its method equals ``method`` (if given), its path
    contains ``path_contains`` and its query contains ``query_contains``.
    """

    kind: FaultKind
    method: str | None = None
    path_contains: str | None = None
    query_contains: str | None = None
    skip: int = 0
    times: int = 1
    status: int = 503
    code: str = "SlowDown"
    delay_s: float = 0.0
    keep_bytes: int | None = None  # TRUNCATE: body bytes sent (default: half)
    flip_offset: int | None = None  # FLIP*: body offset (default: the middle)
    flip_mask: int = 0x01

    def __post_init__(self) -> None:
        assert 0 <= self.skip <= RULE_TIMES_MAX, self.skip
        assert 1 <= self.times <= RULE_TIMES_MAX, self.times
        assert 0.0 <= self.delay_s <= DELAY_S_MAX, self.delay_s
        assert 1 <= self.flip_mask <= 0xFF, self.flip_mask
        assert 400 <= self.status <= 599, self.status


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request the proxy saw, the status its client got (None: no answer) and the fault."""

    method: str
    target: str
    status: int | None
    fault: FaultKind | None


@dataclass(slots=True)
class _Armed:
    rule: FaultRule
    seen: int = 0


@dataclass(slots=True)
class _Message:
    start_line: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    raw_body: bytes = b""  # as received (chunked framing kept), for forwarding requests

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


@dataclass(slots=True)
class _Upstream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used: bool = False


@dataclass(slots=True)
class _Conn:
    upstream: _Upstream | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class _ServerThread:
    """An asyncio TCP server on its own loop in a daemon thread: start, stop, ``with``.

    Subclasses give ``_accept`` and may bound reads (``_read_limit``) or cut their
    connections before the pending tasks are cancelled (``_on_stopping``).
    """

    _thread_name = "proxy"
    _read_limit = 2**16

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self.port = port
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._start_error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()
        if not self._ready.wait(10.0):
            raise TimeoutError(f"{self._thread_name} did not start")
        if self._start_error is not None:
            raise self._start_error

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            assert not self._thread.is_alive(), f"{self._thread_name} thread did not stop"
            self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:
            self._start_error = e
            self._ready.set()
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(
            self._accept, self._host, self.port, limit=self._read_limit
        )
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        async with server:
            await self._stopping.wait()
            server.close()
            self._on_stopping()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5.0)

    def _on_stopping(self) -> None:
        pass

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class FaultProxy(_ServerThread):
    """``with FaultProxy(host, port) as proxy: ... proxy.url ... proxy.add(rule)``."""

    _thread_name = "fault-proxy"
    _read_limit = HEAD_BYTES_MAX

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        host: str = "127.0.0.1",
        connections_max: int = 64,
        io_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(host, 0)
        self._upstream = (upstream_host, upstream_port)
        self._connections_max = connections_max
        self._io_timeout_s = io_timeout_s
        self._lock = threading.Lock()
        self._rules: list[_Armed] = []
        self._log: list[Exchange] = []

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    # -- control, from any thread

    def add(self, *rules: FaultRule) -> None:
        with self._lock:
            self._rules.extend(_Armed(r) for r in rules)

    def clear(self) -> None:
        """Drop every rule (the log stays)."""
        with self._lock:
            self._rules.clear()

    def reset(self) -> None:
        """Drop every rule and forget every exchange."""
        with self._lock:
            self._rules.clear()
            self._log.clear()

    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return list(self._log)

    def faults(self, kind: FaultKind | None = None) -> int:
        """How many faults were injected (of ``kind``, or of any kind)."""
        with self._lock:
            return sum(1 for e in self._log if e.fault is not None and kind in (None, e.fault))

    @contextmanager
    def rules(self, *rules: FaultRule) -> Iterator[Self]:
        """The rules for the length of a ``with`` block, then none."""
        self.add(*rules)
        try:
            yield self
        finally:
            self.clear()

    # -- the loop thread

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._tasks) >= self._connections_max:
            writer.transport.abort()
            return
        self._tasks.add(task)
        conn = _Conn()
        try:
            while await self._one_exchange(reader, writer, conn):
                pass
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except TimeoutError:
            pass
        except ValueError:
            pass  # a malformed message: drop the connection
        finally:
            self._tasks.discard(task)
            writer.transport.abort()
            if conn.upstream is not None:
                conn.upstream.writer.transport.abort()

    def _match(self, method: str, target: str) -> FaultRule | None:
        path, _, query = target.partition("?")
        chosen: FaultRule | None = None
        with self._lock:
            for armed in self._rules:
                r = armed.rule
                if r.method is not None and r.method != method:
                    continue
                if r.path_contains is not None and r.path_contains not in path:
                    continue
                if r.query_contains is not None and r.query_contains not in query:
                    continue
                armed.seen += 1
                if chosen is None and r.skip < armed.seen <= r.skip + r.times:
                    chosen = r
        return chosen

    def _record(
        self, method: str, target: str, status: int | None, fault: FaultRule | None
    ) -> None:
        with self._lock:
            self._log.append(
                Exchange(method, target, status, None if fault is None else fault.kind)
            )

    async def _one_exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn
    ) -> bool:
        """Serve one request; False when the client connection must end."""
        request = await _read_request(reader, writer)
        if request is None:
            return False
        method, target, _ = request.start_line.decode("latin-1").split(" ", 2)
        rule = self._match(method, target)
        kind = None if rule is None else rule.kind
        if rule is not None and kind is FaultKind.RESET:
            self._record(method, target, None, rule)
            return False
        if rule is not None and kind is FaultKind.STATUS:
            self._record(method, target, rule.status, rule)
            writer.write(_error_reply(rule, method))
            await writer.drain()
            return False
        if rule is not None and kind is FaultKind.DELAY and await _client_left(reader, rule):
            self._record(method, target, None, rule)
            return False
        chunked = request.header(b"transfer-encoding") is not None
        if rule is not None and kind is FaultKind.FLIP_REQUEST and request.body and not chunked:
            request.raw_body = _flip(request.raw_body, rule)
        async with asyncio.timeout(self._io_timeout_s):
            reply, upstream_closes = await self._forward(conn, request, method)
        if upstream_closes and conn.upstream is not None:
            conn.upstream.writer.transport.abort()
            conn.upstream = None
        if (
            rule is not None
            and kind is FaultKind.DELAY_RESPONSE
            and await _client_left(reader, rule)
        ):
            self._record(method, target, None, rule)
            return False
        status = int(reply.start_line.split(b" ", 2)[1])
        has_body = method != "HEAD" and status not in _NO_BODY_STATUSES
        body = reply.body
        if rule is not None and kind is FaultKind.FLIP and body:
            body = _flip(body, rule)
        closing = rule is not None and kind is FaultKind.TRUNCATE
        self._record(method, target, status, rule)  # before the client can see the reply
        writer.write(_reply_head(reply, status, has_body, len(body), closing))
        if closing and rule is not None:
            keep = len(body) // 2 if rule.keep_bytes is None else min(rule.keep_bytes, len(body))
            writer.write(body[:keep])
        elif has_body:
            writer.write(body)
        await writer.drain()
        return not closing

    async def _forward(self, conn: _Conn, request: _Message, method: str) -> tuple[_Message, bool]:
        wire = _request_wire(request)
        for attempt in range(2):
            if conn.upstream is None:
                r, w = await asyncio.open_connection(*self._upstream, limit=HEAD_BYTES_MAX)
                conn.upstream = _Upstream(r, w)
            up = conn.upstream
            reused = up.used
            up.used = True
            try:
                up.writer.write(wire)
                await up.writer.drain()
                return await _read_reply(up.reader, method)
            except (OSError, asyncio.IncompleteReadError) as e:
                up.writer.transport.abort()
                conn.upstream = None
                # a kept-alive connection the server closed while idle: send once more
                partial = getattr(e, "partial", b"")
                if not (reused and attempt == 0 and not partial):
                    raise
        raise AssertionError("unreachable")


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> _Message | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial.strip() == b"":
            return None
        raise
    start_line, headers = _parse_head(head)
    message = _Message(start_line, [(k, v) for k, v in headers if k.lower() != b"expect"])
    if (message_expect := _get(headers, b"expect")) and message_expect.lower() == b"100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if (_get(headers, b"transfer-encoding") or b"").lower() == b"chunked":
        message.raw_body, message.body = await _read_chunked(reader)
    else:
        length = int(_get(headers, b"content-length") or b"0")
        if not 0 <= length <= BODY_BYTES_MAX:
            raise ValueError("request body over the proxy bound")
        message.body = message.raw_body = await reader.readexactly(length)
    return message


async def _read_reply(reader: asyncio.StreamReader, method: str) -> tuple[_Message, bool]:
    """The final reply (interim 1xx skipped) and whether the server closes the connection."""
    for _ in range(16):
        head = await reader.readuntil(b"\r\n\r\n")
        start_line, headers = _parse_head(head)
        status = int(start_line.split(b" ", 2)[1])
        if status >= 200:
            break
    else:
        raise ValueError("too many interim replies")
    reply = _Message(start_line, headers)
    closes = (_get(headers, b"connection") or b"").lower() == b"close" or start_line.startswith(
        b"HTTP/1.0"
    )
    if method == "HEAD" or status in _NO_BODY_STATUSES or 100 <= status < 200:
        return reply, closes
    if (_get(headers, b"transfer-encoding") or b"").lower() == b"chunked":
        _, reply.body = await _read_chunked(reader)
    elif (length_raw := _get(headers, b"content-length")) is not None:
        length = int(length_raw)
        if not 0 <= length <= BODY_BYTES_MAX:
            raise ValueError("reply body over the proxy bound")
        reply.body = await reader.readexactly(length)
    else:
        reply.body = await _read_to_eof(reader)
        closes = True
    return reply, closes


async def _read_chunked(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    raw = bytearray()
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        raw += size_line
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers, then the empty line
                line = await reader.readuntil(b"\r\n")
                raw += line
                if line == b"\r\n":
                    return bytes(raw), bytes(body)
                if len(raw) > BODY_BYTES_MAX:
                    raise ValueError("chunked trailers over the proxy bound")
        if len(body) + size > BODY_BYTES_MAX:
            raise ValueError("chunked body over the proxy bound")
        chunk = await reader.readexactly(size + 2)
        raw += chunk
        body += chunk[:-2]


async def _read_to_eof(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while block := await reader.read(1 << 16):
        out += block
        if len(out) > BODY_BYTES_MAX:
            raise ValueError("reply body over the proxy bound")
    return bytes(out)


async def _client_left(reader: asyncio.StreamReader, rule: FaultRule) -> bool:
    """Wait ``rule.delay_s``; True if the client closed its connection meanwhile."""
    try:
        data = await asyncio.wait_for(reader.read(1), rule.delay_s)
    except TimeoutError:
        return False
    if data:
        raise ValueError("client sent bytes before its answer")
    return True


def _parse_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError("malformed header line")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _get(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _request_wire(request: _Message) -> bytes:
    lines = [request.start_line, *(k + b": " + v for k, v in request.headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + request.raw_body


_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})


def _reply_head(reply: _Message, status: int, has_body: bool, length: int, closing: bool) -> bytes:
    reason = reply.start_line.split(b" ", 2)[2] if reply.start_line.count(b" ") >= 2 else b""
    lines = [b"HTTP/1.1 %d %s" % (status, reason)]
    for key, value in reply.headers:
        low = key.lower()
        if low in _HOP or (has_body and low == b"content-length"):
            continue
        lines.append(key + b": " + value)
    if has_body:
        lines.append(b"Content-Length: %d" % length)
    if closing:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _error_reply(rule: FaultRule, method: str) -> bytes:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>'
        + rule.code.encode("ascii")
        + b"</Code><Message>injected by the fault proxy</Message>"
        + b"<RequestId>fault-proxy</RequestId></Error>"
    )
    head = [
        b"HTTP/1.1 %d Injected" % rule.status,
        b"Content-Type: application/xml",
        b"Content-Length: %d" % len(body),
        b"Connection: close",
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + (b"" if method == "HEAD" else body)


def _flip(body: bytes, rule: FaultRule) -> bytes:
    offset = len(body) // 2 if rule.flip_offset is None else rule.flip_offset % len(body)
    out = bytearray(body)
    out[offset] ^= rule.flip_mask
    return bytes(out)


# -- a byte-level TCP proxy (gRPC between processes: HTTP/2 cannot be edited per request)


class LinkMode(enum.Enum):
    """What a :class:`TcpProxy` does with the bytes of its connections."""

    PASS = "pass"
    DROP = "drop"
    """Connections stay open and new ones are accepted, but every byte is discarded:
    a partition where packets vanish and only timeouts tell."""
    DELAY = "delay"
    """Each chunk is held ``delay_s`` before it is forwarded (order kept)."""
    CUT = "cut"
    """Every connection is reset and new ones are refused: a partition that is seen at once."""
    DROP_REPLIES = "drop_replies"
    """Bytes to the server pass, bytes back are discarded: requests take effect, answers vanish."""


class TcpProxy(_ServerThread):
    """``with TcpProxy(host, port) as link: ... link.address ... link.set(LinkMode.CUT)``.

    A byte pipe with a switch: :meth:`set` changes the mode of every current
    and future connection. Like :class:`FaultProxy` it runs its own asyncio
    loop in a daemon thread; reads are bounded by ``chunk_bytes`` and the
    number of connections by ``connections_max``.
    """

    _thread_name = "tcp-proxy"

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        connections_max: int = 256,
        chunk_bytes: int = 64 * 1024,
    ) -> None:
        super().__init__(host, port)
        self._upstream = (upstream_host, upstream_port)
        self._connections_max = connections_max
        self._chunk_bytes = chunk_bytes
        self._mode = LinkMode.PASS
        self._delay_s = 0.0
        self._lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections_seen = 0

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    @property
    def mode(self) -> LinkMode:
        with self._lock:
            return self._mode

    def set(self, mode: LinkMode, delay_s: float = 0.0) -> None:
        """Switch every connection to ``mode``; CUT also resets the open ones."""
        assert 0.0 <= delay_s <= DELAY_S_MAX, delay_s
        with self._lock:
            self._mode = mode
            self._delay_s = delay_s
        loop = self._loop
        if mode is LinkMode.CUT and loop is not None and not loop.is_closed():
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(self._abort_all)

    def heal(self) -> None:
        self.set(LinkMode.PASS)

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def _on_stopping(self) -> None:
        self._abort_all()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections_seen += 1
        if self.mode is LinkMode.CUT or len(self._writers) >= 2 * self._connections_max:
            writer.transport.abort()
            return
        self._tasks.add(task)
        self._writers.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, upstream = await asyncio.wait_for(
                asyncio.open_connection(*self._upstream), 10.0
            )
            up_writer = upstream
            self._writers.add(upstream)
            await asyncio.gather(
                self._pump(reader, upstream, False), self._pump(up_reader, writer, True)
            )
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            for w in (writer, up_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool
    ) -> None:
        while True:
            data = await reader.read(self._chunk_bytes)
            if not data:
                # a close passes on as a close: the bytes still buffered here are
                # delivered first (a reset would drop the end of a response that the
                # server sent just before closing, e.g. a draining gitproto's)
                writer.close()
                return
            with self._lock:
                mode, delay_s = self._mode, self._delay_s
            if mode is LinkMode.CUT:
                writer.transport.abort()
                return
            if mode is LinkMode.DROP or (mode is LinkMode.DROP_REPLIES and replies):
                continue
            if mode is LinkMode.DELAY and delay_s > 0:
                await asyncio.sleep(delay_s)
            writer.write(data)
            await writer.drain()
