"""The Clock seam: no ambient time below ``main.py`` (STYLE rule 7)."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now_us(self) -> int:
        """Wall-clock time in microseconds since the Unix epoch (for stamps)."""
        ...

    def monotonic_ns(self) -> int:
        """A monotonic reading in nanoseconds (for timeouts and latencies)."""
        ...


class FixedClock:
    """A clock that moves only when told; for deterministic tests and simulation."""

    def __init__(self, now_us: int = 0, monotonic_ns: int = 0) -> None:
        self._now_us = now_us
        self._monotonic_ns = monotonic_ns

    def now_us(self) -> int:
        return self._now_us

    def monotonic_ns(self) -> int:
        return self._monotonic_ns

    def advance_us(self, delta_us: int) -> None:
        assert delta_us >= 0, delta_us
        self._now_us += delta_us
        self._monotonic_ns += delta_us * 1000
