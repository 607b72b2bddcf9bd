"""A walk of the view that stops when the request it plans for has gone.

Planning a fetch (``serve.plan_fetch``, ``serve.plan_shallow``) runs in a worker
thread and walks as many commits as the client's wants, haves and deepen
arguments reach. A thread cannot be cancelled from outside, so when the request
goes (the client disconnects, gitproto cancels the call, a deadline passes) the
caller sets the :class:`threading.Event` it gave the walk, and the walk, which
checks it at each commit it steps through, raises :class:`WalkAbandoned` and
unwinds. The compute's pack writer and ingest do the same at their reads and
writes (``enroute_compute/work.py``).

The event travels in a context variable, set by :func:`abandoned_when` around
the walk in its own thread, so the engine's walks take no extra argument.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

_CANCELLED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "enroute_walk_cancelled", default=None
)


class WalkAbandoned(Exception):
    """Raised inside a walk whose request has gone; never reaches a client."""


@contextlib.contextmanager
def abandoned_when(cancelled: threading.Event) -> Iterator[None]:
    """Walks run in this block (in this thread) stop once ``cancelled`` is set."""
    token = _CANCELLED.set(cancelled)
    try:
        yield
    finally:
        _CANCELLED.reset(token)


def check_walk() -> None:
    """Raise :class:`WalkAbandoned` when the walk's request has gone."""
    cancelled = _CANCELLED.get()
    if cancelled is not None and cancelled.is_set():
        raise WalkAbandoned
