"""uvicorn's server with a main loop that sleeps: the HTTP servers of gitproto and the ledger.

uvicorn's own main loop wakes every 100 ms to read ``should_exit``, a flag that only
the role itself sets, from its event loop. On an idle role those wakeups were most of
its CPU at rest: a wakeup out of ``epoll_wait`` costs about 0.2 ms of CPU on the
benchmark machine however little it runs (docs/services.md, "The fixed cost of a
request"). This one waits for the flag, and wakes once per ``DATE_HEADER_S`` for the
``Date`` header (RFC 9110 section 6.6.1: an origin server with a clock sends one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import uvicorn

DATE_HEADER_S = 1.0
"""How often the idle main loop wakes to refresh the ``Date`` header (uvicorn: each second)."""


class QuietServer(uvicorn.Server):
    """uvicorn without its 100 ms loop and without its signal capture: the role installs
    its own handlers (its drain), stops the server by setting ``should_exit``, and its
    exit status stays 0."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    async def main_loop(self) -> None:
        # on_tick refreshes the Date header when its counter is a multiple of 10 (once a
        # second in uvicorn's loop), then answers whether to stop
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DATE_HEADER_S):
                    await self._exit.wait()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
