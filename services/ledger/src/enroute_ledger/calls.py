"""The driver's client API as coroutines: the asyncio half of :mod:`enroute_ledger.client`.

Each call opens a tracker of :class:`enroute_ledger.client.Client`, polls it
with the clock, and between polls waits on the group's change event (set by an
apply, a leader learned here, a drop, or the tracker's own answer) or until the
time the tracker named. What a proposal does is decided in the pure half, which
the seeded simulation polls the same way; nothing here decides anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING

from enroute_core.base.errors import NotFound, Timeout

from .client import ReadBarrier, Ticket
from .machine import Applied

if TYPE_CHECKING:
    from .client import Proposal
    from .group import Group
    from .runtime import Runtime

AWAIT_CHECK_S = 1.0
"""A waiting call looks at its group's view at least this often, changes or not."""


async def _until(rt: Runtime, g: Group, at: float) -> None:
    """Wait for ``g``'s next change, or until ``at`` (at most AWAIT_CHECK_S).

    Woken by the group's change, not by every tick: a call waiting out a slow round
    under load costs no CPU per tick.
    """
    rt.wake()
    wait_s = min(AWAIT_CHECK_S, at - rt.clock())
    if wait_s <= 0:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s):  # no task per wait, unlike wait_for
            await g.changed.wait()


async def propose(rt: Runtime, g: Group, entry: bytes, rid: bytes, timeout_s: float) -> Applied:
    """Append ``entry`` and wait until it applied here (docs/rpc.md, Propose)."""
    client = rt.client
    p: Proposal = client.open(g, entry, rid, rt.clock() + timeout_s)
    try:
        while True:
            at = client.poll(p, g, rt.clock())
            if p.done:
                break
            await _until(rt, g, at)
        if p.error is None:
            rt.trace.answered(rid, rt.clock())
        return p.result()
    finally:
        client.close(p, g)


async def barrier(rt: Runtime, g: Group, timeout_s: float) -> None:
    """ReadIndex (DESIGN, "Read path"): learn the leader's commit index, wait to apply it."""
    client = rt.client
    b: ReadBarrier = client.open_read(g, rt.clock() + timeout_s)
    try:
        while True:
            at = client.poll_read(b, g, rt.clock())
            if b.done:
                return b.result()
            await _until(rt, g, at)
    finally:
        client.close_read(b, g)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_applied(rt: Runtime, g: Group, index: int, timeout_s: float) -> None:
    """Wait until ``g`` applied ``index`` here."""
    if g.applied >= index:
        return
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ticket: Ticket[None] = Ticket()
    ticket.waker = functools.partial(_resolve, fut)
    g.waiters.append((index, ticket))
    try:
        await asyncio.wait_for(fut, timeout_s)
    except TimeoutError:
        raise Timeout("not applied in time", index=index) from None
    ticket.result()


async def wait_born(rt: Runtime, g: Group, timeout_s: float) -> None:
    """Wait until ``g``'s genesis applied here."""
    deadline = rt.clock() + timeout_s
    while not g.born:
        if g.dropped:
            raise NotFound("incarnation no longer hosted", repo=g.repo)
        ev = g.changed
        remaining = deadline - rt.clock()
        if remaining <= 0:
            raise Timeout("incarnation not started in time", repo=g.repo)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), remaining)
