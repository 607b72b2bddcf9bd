"""The HTTP server loop of gitproto and the ledger at rest (docs/services.md, "The fixed
cost of a request").

uvicorn's own main loop wakes every 100 ms to read ``should_exit``; theirs waits on it,
waking once per ``DATE_HEADER_S`` for the ``Date`` header (RFC 9110 section 6.6.1: an
origin server with a clock sends one), and still stops as soon as it is told to.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import uvicorn

from enroute_core.asgi_server import DATE_HEADER_S, QuietServer


class _Counted(QuietServer):
    ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _date_of(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head = await reader.read()
    writer.close()
    dates = [line for line in head.split(b"\r\n") if line.lower().startswith(b"date:")]
    assert len(dates) == 1, head
    return dates[0]


def test_idle_loop_wakes_per_date_refresh_and_stops_when_told() -> None:
    async def main() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = _Counted(uvicorn.Config(_app, lifespan="off", log_config=None, ws="none"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        first = await _date_of(port)
        ticks = server.ticks
        await asyncio.sleep(3 * DATE_HEADER_S)
        # uvicorn's loop: 30 ticks in 3 s; this one: 3 (a loaded machine may add one)
        assert server.ticks - ticks <= 4, server.ticks - ticks
        assert await _date_of(port) != first  # the Date header still follows the clock
        began = time.monotonic()
        server.should_exit = True
        await asyncio.wait_for(task, 5)
        assert time.monotonic() - began < 0.5 * DATE_HEADER_S  # woken, not at the next refresh

    asyncio.run(main())
