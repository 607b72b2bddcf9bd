"""Work in threads ends with its request (enroute_compute.work; issue 24, finding 6)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pytest

from enroute_compute.work import (
    Abandoned,
    CancellableSource,
    PeerGoneFilter,
    cancellable_sink,
    to_thread_to_end,
)
from enroute_core.git.source import BytesSource
from enroute_testing.waiting import until


def test_a_cancelled_caller_stops_the_thread_and_takes_its_outcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The thread sees the flag at its next read, raises Abandoned and ends; the caller
    waits for it, stays cancelled, and no "exception was never retrieved" is logged."""
    gone = threading.Event()
    reading = threading.Event()
    source = CancellableSource(BytesSource(b"pack" * 1000), gone)
    reads: list[int] = []

    def work() -> None:
        offset = 0
        while True:  # a reader that ends only when its request goes
            source.read_at(offset % 4000, 4)
            reads.append(offset)
            reading.set()
            offset += 4

    async def run() -> None:
        task = asyncio.ensure_future(to_thread_to_end(work, gone))
        await until(reading.is_set, 10, "the work reads", poll_s=0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(run())
        gc.collect()  # an unretrieved exception is reported when its task is collected
    assert gone.is_set()
    assert reads, "the thread never read"
    assert "never retrieved" not in caplog.text


def test_an_uncancelled_caller_gets_the_result_or_the_error() -> None:
    gone = threading.Event()
    assert asyncio.run(to_thread_to_end(lambda: 7, gone)) == 7

    def fail() -> None:
        raise ValueError("bad pack")

    with pytest.raises(ValueError, match="bad pack"):
        asyncio.run(to_thread_to_end(fail, gone))
    assert not gone.is_set()


def test_reads_and_writes_stop_once_the_request_has_gone() -> None:
    gone = threading.Event()
    source = CancellableSource(BytesSource(b"abcdef"), gone)
    written: list[bytes] = []
    sink = cancellable_sink(written.append, gone)
    assert source.size == 6 and source.read_at(1, 2) == b"bc"
    sink(b"x")
    gone.set()
    with pytest.raises(Abandoned):
        source.read_at(0, 1)
    with pytest.raises(Abandoned):
        sink(b"y")
    assert written == [b"x"]


def test_grpc_failed_write_of_a_gone_caller_is_one_line() -> None:
    """grpc's aio server logs a write that failed under a reset stream with its traceback
    (``_handle_exceptions``, ``ExecuteBatchError raised in core by servicer method``)."""
    record = logging.LogRecord(
        "grpc._cython.cygrpc",
        logging.ERROR,
        __file__,
        1,
        "ExecuteBatchError raised in core by servicer method [%s]",
        ("/enroute.compute.v1.Compute/UploadPack",),
        (RuntimeError, RuntimeError("Failed execute_batch"), None),
    )
    assert PeerGoneFilter().filter(record)
    assert record.levelno == logging.INFO and record.exc_info is None
    assert record.getMessage().endswith("its caller went away while its answer was written")
    other = logging.LogRecord("grpc", logging.ERROR, __file__, 1, "other", None, None)
    assert PeerGoneFilter().filter(other) and other.levelno == logging.ERROR
