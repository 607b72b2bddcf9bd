"""Work in worker threads that ends with the request it is for (issue 24, finding 6).

A push's ingest and a fetch's pack writing run in threads, so the event loop keeps
serving. When the request goes (the client disconnects and gitproto cancels the
call, the call's deadline passes, gitproto cuts the body, or the compute shuts
down), gRPC cancels the handler's task; the thread cannot be cancelled from
outside, so it is told: the handler sets a :class:`threading.Event` and the
thread, which checks it between reads of the pack, writes of the layer and pieces
of the answer, raises :class:`Abandoned` and unwinds. The handler waits for it
(the thread uses the request's scratch files and pinned layers, which the handler
frees as it unwinds) and takes its outcome, so nothing is left to report
"exception was never retrieved".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from enroute_core.git.source import ByteSource

T = TypeVar("T")


class Abandoned(Exception):
    """Raised in a worker thread whose request has gone; never reaches a client."""


def check(cancelled: threading.Event) -> None:
    """Raise :class:`Abandoned` once ``cancelled`` is set."""
    if cancelled.is_set():
        raise Abandoned


class CancellableSource:
    """A :class:`ByteSource` that stops its reader once the request has gone: the
    indexer reads a pack a window at a time, and later steps one entry a time."""

    __slots__ = ("_cancelled", "_source")

    def __init__(self, source: ByteSource, cancelled: threading.Event) -> None:
        self._source = source
        self._cancelled = cancelled

    @property
    def size(self) -> int:
        return self._source.size

    def read_at(self, offset: int, length: int) -> bytes:
        check(self._cancelled)
        return self._source.read_at(offset, length)


def cancellable_sink(
    sink: Callable[[bytes], object], cancelled: threading.Event
) -> Callable[[bytes], None]:
    """``sink`` that raises :class:`Abandoned` instead of writing once the request has gone."""

    def write(data: bytes) -> None:
        check(cancelled)
        sink(data)

    return write


async def to_thread_to_end(
    fn: Callable[[], T], cancelled: threading.Event, executor: Executor | None = None
) -> T:
    """``fn`` in a worker thread of ``executor`` (asyncio's default pool when None), in
    the caller's context (request id); a cancelled caller sets ``cancelled`` and waits
    for it.

    The thread reads and writes the caller's scratch files, which the caller
    closes when it unwinds: closing them under a running thread could let it
    write through a descriptor number the process has reused. Its outcome, an
    :class:`Abandoned` most likely, is taken and dropped: the caller's
    cancellation is what goes on.
    """
    context = contextvars.copy_context()
    task = asyncio.ensure_future(
        asyncio.get_running_loop().run_in_executor(executor, context.run, fn)
    )
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        cancelled.set()
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # taken: the request is gone, and so is what it would have said
        raise


class PeerGoneFilter(logging.Filter):
    """grpc's log of a servicer's write that failed because its caller had gone, as one line.

    When the caller's stream is reset (gitproto cancelled the call, or stopped) while a
    handler is writing, the failed write can be seen before the cancellation is; grpc
    then logs ``ExecuteBatchError raised in core by servicer method`` with a traceback
    (``_handle_exceptions`` in grpc's ``aio/server.pyx.pxi``). The handler's work is
    cancelled either way; an operator needs to know that a call ended early, not where.
    """

    PREFIX = "ExecuteBatchError raised in core by servicer method"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self.PREFIX):
            record.msg = f"{message}: its caller went away while its answer was written"
            record.args = None
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return True
