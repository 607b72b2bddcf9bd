"""Connection hygiene of the HTTP server: header timeout, header size, connection caps.

uvicorn (with h11, the HTTP/1.1 parser gitproto runs) has no header-read
timeout: a connection that sends part of a request head, or nothing at all,
is held for ever, and its ``limit_concurrency`` counts such connections, so
1,100 of them made every request 503 (issue 24, item 5). h11's own bound
(``max_incomplete_event_size``) only applies while a head is incomplete: a
32 KiB head in one segment passed. This module is a thin subclass of
uvicorn's ``H11Protocol`` that adds, per connection (docs/access-control.md,
"Connections"):

- a **header timeout**: armed when the connection opens and whenever h11
  starts a new request cycle on it (keep-alive), stopped by the request's
  head; on expiry the connection is closed (``408`` when part of a head came);
- a **header size** bound on the request line plus header fields, checked on
  the parsed head whatever the segmentation (``431``), with h11's incomplete
  bound set to the same value;
- a **per-client-address** bound on open connections (``503`` at once);
- the **node** bound ``connections_max``: when it is reached, the connection
  that has waited longest for a request head (idle or slow) is closed to make
  room; only when every connection is busy with a request is the new one
  refused (``503``). So idle and slow-header connections can never shut
  working clients out, whatever their number.

Requests in flight per client address are bounded by the app's admission
(``app.Admission``); this module deals with connections only.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

log = logging.getLogger(__name__)

LINGER_S = 2.0
"""After an error answer, how long the rest of what the client sends is read and dropped
before the socket closes: closing with unread bytes would send a reset, and the client
could lose the answer (nginx's lingering close)."""
LOG_INTERVAL_S = 10.0
"""Closes of one reason are logged at most this often (a count says how many)."""


def raw_response(status: int, message: str, retry_after_s: float | None = None) -> bytes:
    """A whole ``Connection: close`` plain-text response, for a connection h11 is not
    answering (refused before its request, or cut while sending its head)."""
    body = (message + "\n").encode()
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "content-type: text/plain; charset=utf-8",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after_s is not None:
        lines.append(f"retry-after: {max(1, round(retry_after_s))}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def head_bytes(request: h11.Request) -> int:
    """The size of a parsed request head: request line and header fields as sent,
    without optional whitespace (``METHOD SP target SP HTTP/x.y CRLF``, ``name: value CRLF``
    per field, final CRLF)."""
    size = len(request.method) + len(request.target) + 12
    for name, value in request.headers.raw_items():
        size += len(name) + len(value) + 4
    return size + 2


class Connections:
    """Every open connection of one server: per client address, and those waiting for a
    request head, oldest first. One event loop, so no lock."""

    def __init__(
        self,
        *,
        connections_max: int,
        client_connections_max: int,
        header_timeout_s: float,
        header_bytes_max: int,
        retry_after_s: float = 5.0,
        on_close: Callable[[str], None] | None = None,
    ) -> None:
        self.connections_max = connections_max
        self.client_connections_max = client_connections_max
        self.header_timeout_s = header_timeout_s
        self.header_bytes_max = header_bytes_max
        self.retry_after_s = retry_after_s
        self.on_close = on_close
        """Called with the reason of every connection this module closes (a metric)."""
        self.open = 0
        self.by_client: dict[str, int] = {}
        self.waiting: dict[GuardedH11Protocol, None] = {}
        self.closed: dict[str, int] = {}
        self._logged: dict[str, tuple[float, int]] = {}

    def join(self, conn: GuardedH11Protocol) -> str | None:
        """Count a new connection, closing the longest-waiting one if the node is full;
        the refusal message when the new one may not stay."""
        host = conn.host
        cap = self.client_connections_max
        if cap and self.by_client.get(host, 0) >= cap:
            return self.note(
                "client_connections_max", host,
                f"client {host} has its limit of {cap} connections open "
                "(transport.client_connections_max); retry later",
            )  # fmt: skip
        if self.open >= self.connections_max:
            oldest = next(iter(self.waiting), None)
            if oldest is None:
                return self.note(
                    "connections_max", host,
                    f"this node has its limit of {self.connections_max} connections open, all "
                    "busy (transport.connections_max); retry later",
                )  # fmt: skip
            oldest.cut("evicted", None, f"the node has its limit of {self.connections_max} "
                       "connections open (transport.connections_max): the one waiting longest "
                       "for a request head is closed")  # fmt: skip
        self.open += 1
        self.by_client[host] = self.by_client.get(host, 0) + 1
        conn.counted = True
        return None

    def leave(self, conn: GuardedH11Protocol) -> None:
        self.waiting.pop(conn, None)
        if not conn.counted:
            return
        conn.counted = False
        self.open -= 1
        left = self.by_client[conn.host] - 1
        if left:
            self.by_client[conn.host] = left
        else:
            del self.by_client[conn.host]

    def note(self, reason: str, host: str, message: str) -> str:
        """Count a close; log it, at most once per LOG_INTERVAL_S per reason."""
        self.closed[reason] = self.closed.get(reason, 0) + 1
        if self.on_close is not None:
            self.on_close(reason)
        now = time.monotonic()
        last, unlogged = self._logged.get(reason, (-LOG_INTERVAL_S, 0))
        if now - last >= LOG_INTERVAL_S:
            more = f" (and {unlogged} more since the last such line)" if unlogged else ""
            log.warning("connection closed: remote=%s reason=%s: %s%s", host, reason, message,
                        more)  # fmt: skip
            self._logged[reason] = (now, 0)
        else:
            self._logged[reason] = (last, unlogged + 1)
        return message

    def status(self) -> dict[str, object]:
        """The ``connections`` section of ``/status``."""
        return {
            "open": self.open,
            "waiting_for_headers": len(self.waiting),
            "clients": len(self.by_client),
            "closed": dict(sorted(self.closed.items())),
        }


class _CheckedConnection(h11.Connection):
    """h11's connection that tells its protocol when a request head arrives (or is too
    large) and when a new request cycle starts."""

    def __init__(self, owner: GuardedH11Protocol, incomplete_bytes_max: int) -> None:
        super().__init__(h11.SERVER, incomplete_bytes_max)
        self.owner = owner

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as error:
            if error.error_status_hint != 431:
                raise  # uvicorn answers 400
            self.owner.head_too_large(None)
            return h11.NEED_DATA
        if isinstance(event, h11.Request) and not self.owner.head_arrived(event):
            return h11.NEED_DATA  # refused: the connection is closing
        return event

    def start_next_cycle(self) -> None:
        super().start_next_cycle()
        self.owner.await_head()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the bounds of :class:`Connections` (module docstring).

    ``bounds`` is a class attribute: :func:`guarded_protocol` makes one
    subclass per server, which uvicorn instantiates per connection.
    """

    bounds: Connections
    """(uvicorn's own ``self.connections`` is the server's set of protocols.)"""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn = _CheckedConnection(self, self.bounds.header_bytes_max)
        self.host = "-"
        self.counted = False
        self._timer: asyncio.TimerHandle | None = None
        self._head_started = False
        self._lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.host = self.client[0] if self.client else "-"
        refused = self.bounds.join(self)
        if refused is not None:
            self._answer_and_close(raw_response(503, refused, self.bounds.retry_after_s))
            return
        self.await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self.bounds.leave(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # answered and closing: dropped
        if self._timer is not None:
            self._head_started = True
        super().data_received(data)

    def await_head(self) -> None:
        """A request cycle begins: its head must come within the header timeout."""
        if self.transport.is_closing() or not self.counted:
            return
        self._stop_timer()
        self._head_started = False
        self.bounds.waiting[self] = None
        self._timer = self.loop.call_later(self.bounds.header_timeout_s, self._timed_out)

    def head_arrived(self, request: h11.Request) -> bool:
        """The request head is parsed: stop waiting; False when it is over the size bound."""
        self._stop_timer()
        self.bounds.waiting.pop(self, None)
        size = head_bytes(request)
        if size > self.bounds.header_bytes_max:
            self.head_too_large(size)
            return False
        return True

    def head_too_large(self, size: int | None) -> None:
        maximum = self.bounds.header_bytes_max
        shown = f"of {size} bytes " if size is not None else ""
        message = f"the request head {shown}is over {maximum} bytes (transport.header_max)"
        self.cut("header_bytes_max", 431, message)

    def _timed_out(self) -> None:
        self._timer = None
        timeout_s = self.bounds.header_timeout_s
        status = 408 if self._head_started else None
        message = f"no complete request head within {timeout_s:g} s (transport.header_timeout)"
        self.cut("header_timeout", status, message)

    def cut(self, reason: str, status: int | None, message: str) -> None:
        """Close this connection for ``reason``, answering ``status`` first when given."""
        self._stop_timer()
        self.bounds.leave(self)
        if self.transport.is_closing():
            return
        self.bounds.note(reason, self.host, message)
        if status is None:
            self.transport.close()
        else:
            self._answer_and_close(raw_response(status, message))

    def _answer_and_close(self, answer: bytes) -> None:
        """Send ``answer``, then read and drop for LINGER_S before closing (module docstring
        of LINGER_S: an immediate close could reset the connection before it is read)."""
        self.transport.write(answer)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = True
        self.transport.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def guarded_protocol(connections: Connections) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn runs for one server (``uvicorn.Config(http=...)``)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"bounds": connections})
