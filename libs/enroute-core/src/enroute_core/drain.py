"""The drain of a gRPC server on SIGTERM: count the calls in flight, refuse new ones.

docs/reliability.md, "Graceful drain": a compute or a ledger that is told to
stop turns this switch, every new call of the services it guards is refused
with a retryable error (UNAVAILABLE: the caller moves to another member), and
the process waits, for at most its grace period, until the calls it had taken
have ended. One home for the count and the switch; each role decides which
calls go through it (the compute: every Git call; the ledger: the calls of
computes, never the Raft traffic its peers need to take its leadership).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from enroute_core.base.errors import Unavailable


class Drain:
    """Calls in flight and the switch that refuses new ones."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def refusal(self) -> Unavailable:
        """What a call that arrives while draining is answered (retryable elsewhere)."""
        return Unavailable(f"{self.role} is stopping; try another member", role=self.role)

    def enter(self) -> None:
        """Count one call in; refused (:meth:`refusal`) once draining."""
        if self.draining:
            raise self.refusal()
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        assert self.in_flight > 0, "leave without enter"
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """``with drain.call(): ...``: one call counted from start to end."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def start(self) -> None:
        """Refuse new calls from now on."""
        self.draining = True

    async def drained(self, timeout_s: float) -> bool:
        """Refuse new calls; True when the ones in flight ended within ``timeout_s``."""
        self.start()
        try:
            await asyncio.wait_for(self._idle.wait(), max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True
