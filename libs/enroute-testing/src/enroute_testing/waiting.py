"""Waiting on a condition with a bound, the one way tests wait for another process or task.

A fixed ``time.sleep`` either waits too long on an idle machine or too little on a loaded
one; a poll of the condition itself ends as soon as it holds and, past its bound, fails
naming what it waited for (TigerBeetle's "a limit on every loop"; STYLE.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

POLL_S = 0.02
"""Between two looks at the condition: short beside every bound the tests use."""


class WaitTimeout(AssertionError):
    """The condition did not hold within its bound; the message names it."""


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str,
    *,
    poll_s: float = POLL_S,
    explain: Callable[[], object] | None = None,
) -> None:
    """Return once ``predicate()`` is true; raise ``WaitTimeout`` naming ``what`` (and what
    ``explain()`` says then, a log tail say) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            more = "" if explain is None else f"\n{explain()}"
            raise WaitTimeout(f"not within {timeout_s:.1f} s: {what}{more}")
        time.sleep(poll_s)


def wait_for_value(
    get: Callable[[], _T | None],
    timeout_s: float,
    what: str,
    *,
    poll_s: float = POLL_S,
    explain: Callable[[], object] | None = None,
) -> _T:
    """The first answer of ``get()`` that is not None (the leader all agree on, say);
    ``WaitTimeout`` naming ``what`` after ``timeout_s``."""
    found: list[_T] = []

    def answered() -> bool:
        value = get()
        if value is not None:
            found.append(value)
        return value is not None

    wait_until(answered, timeout_s, what, poll_s=poll_s, explain=explain)
    return found[-1]


async def until(
    predicate: Callable[[], object], timeout_s: float, what: str, *, poll_s: float = POLL_S
) -> None:
    """``wait_until`` for a test running on the event loop: other tasks run between looks."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"not within {timeout_s:.1f} s: {what}")
        await asyncio.sleep(poll_s)
