"""Group commit: one writer thread turns queued batches into as few fsyncs as it can.

The runtime submits a batch and awaits its future (``asyncio.wrap_future``), so
its event loop never blocks on a disk. Batches that queue up while a write is
in flight go into the next round together, bounded by
``ledger_commit_batches_max`` batches and ``ledger_commit_bytes_max`` bytes.

Failure is sticky: once a round fails on an I/O error, every pending and later
batch fails with ``Unavailable`` (after a failed fsync the kernel may have
dropped dirty pages, so nothing written since the last good fsync can be
trusted; PostgreSQL's "fsyncgate"). Reopening the store recovers from disk.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from enroute_core.base.errors import LimitExceeded, Unavailable
from enroute_core.base.limits import Limits

from .api import WriteBatch

RoundFn = Callable[[Sequence[WriteBatch]], Sequence[BaseException | None]]


class Committer:
    def __init__(
        self,
        name: str,
        limits: Limits,
        run_round: RoundFn,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._limits = limits
        self._clock = clock
        self.round_seconds = 0.0
        """Time spent in write rounds (each one fsync); 0 unless a clock was given."""
        self.queue_seconds = 0.0
        """Time batches waited between submit and the start of their round (with a clock)."""
        self._run_round = run_round
        self._queue: deque[tuple[WriteBatch, Future[None], float]] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._failure: BaseException | None = None
        self.rounds = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def submit(self, batch: WriteBatch) -> Future[None]:
        assert not batch.submitted, "a batch is committed once"
        fut: Future[None] = Future()
        with self._cond:
            if self._closing:
                raise Unavailable("ledger store is closed", reason="closed")
            if self._failure is not None:
                raise self._failed()
            if len(self._queue) >= self._limits.ledger_queue_batches_max:
                raise LimitExceeded(
                    "ledger_queue_batches_max", len(self._queue) + 1,
                    self._limits.ledger_queue_batches_max,
                )  # fmt: skip
            batch.submitted = True
            self._queue.append((batch, fut, self._clock() if self._clock is not None else 0.0))
            self._cond.notify()
        return fut

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def _failed(self) -> Unavailable:
        err = Unavailable(
            "ledger store failed; reopen it", reason="store_failed", cause=repr(self._failure)
        )
        err.__cause__ = self._failure
        return err

    def _take(self) -> list[tuple[WriteBatch, Future[None], float]] | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            taken = [self._queue.popleft()]
            size = taken[0][0].size_bytes
            while self._queue and len(taken) < self._limits.ledger_commit_batches_max:
                nxt = self._queue[0][0].size_bytes
                if size + nxt > self._limits.ledger_commit_bytes_max:
                    break
                size += nxt
                taken.append(self._queue.popleft())
            return taken

    def _loop(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            if self._failure is not None:
                for _, fut, _ in taken:
                    fut.set_exception(self._failed())
                continue
            t = self._clock() if self._clock is not None else 0.0
            if self._clock is not None:
                self.queue_seconds += sum(t - queued for _, _, queued in taken)
            try:
                results = self._run_round([b for b, _, _ in taken])
            except BaseException as e:  # an I/O error, or a bug: either way, stop writing
                self._failure = e
                for _, fut, _ in taken:
                    fut.set_exception(self._failed())
                continue
            self.rounds += 1
            if self._clock is not None:
                self.round_seconds += self._clock() - t
            assert len(results) == len(taken)
            for (_, fut, _), res in zip(taken, results, strict=True):
                if res is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(res)
