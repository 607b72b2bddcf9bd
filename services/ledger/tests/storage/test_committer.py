"""Group commit: queued batches share a round; a failed round fails every later write."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from storemodel import entry, open_store

from enroute_core.base.errors import LimitExceeded, Unavailable
from enroute_core.base.limits import Limits
from enroute_ledger.storage.api import GroupId, WriteBatch
from enroute_ledger.storage.committer import Committer


class _Gate:
    """A round function that holds its first round until released and records each round."""

    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.rounds: list[int] = []
        self.fail = fail

    def __call__(self, batches: Sequence[WriteBatch]) -> list[BaseException | None]:
        self.started.set()
        assert self.release.wait(10)
        self.rounds.append(len(batches))
        if self.fail:
            raise OSError(5, "EIO on fsync")
        return [None] * len(batches)


def _batch(n: int) -> WriteBatch:
    b = WriteBatch()
    b.put_state(GroupId(b"r", 1), b"k", b"%d" % n)
    return b


def test_batches_queued_during_a_round_share_the_next() -> None:
    gate = _Gate()
    c = Committer("t", Limits(), gate)
    first = c.submit(_batch(0))
    assert gate.started.wait(10)
    rest = [c.submit(_batch(n)) for n in range(1, 11)]
    gate.release.set()
    for f in [first, *rest]:
        f.result(10)
    assert gate.rounds == [1, 10]
    c.close()


def test_round_size_is_bounded() -> None:
    gate = _Gate()
    c = Committer("t", Limits(ledger_commit_batches_max=4), gate)
    first = c.submit(_batch(0))
    assert gate.started.wait(10)
    rest = [c.submit(_batch(n)) for n in range(1, 11)]
    gate.release.set()
    for f in [first, *rest]:
        f.result(10)
    assert gate.rounds == [1, 4, 4, 2]
    c.close()


def test_failure_is_sticky() -> None:
    gate = _Gate(fail=True)
    c = Committer("t", Limits(), gate)
    f = c.submit(_batch(0))
    gate.release.set()
    with pytest.raises(Unavailable) as err:
        f.result(10)
    assert isinstance(err.value.__cause__, OSError)
    with pytest.raises(Unavailable):
        c.submit(_batch(1))
    c.close()
    assert gate.rounds == [1]


def test_queue_is_bounded_and_batches_commit_once() -> None:
    gate = _Gate()
    c = Committer("t", Limits(ledger_queue_batches_max=2), gate)
    b0 = _batch(0)
    first = c.submit(b0)
    assert gate.started.wait(10)
    c.submit(_batch(1))
    c.submit(_batch(2))
    with pytest.raises(LimitExceeded):
        c.submit(_batch(3))
    with pytest.raises(AssertionError):
        c.submit(b0)
    gate.release.set()
    first.result(10)
    c.close()
    with pytest.raises(Unavailable):
        c.submit(_batch(5))


def test_store_coalesces_concurrent_submits(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    groups = [GroupId(b"repo%d" % i, 1) for i in range(50)]
    futures = []
    for n in range(1, 201):
        b = WriteBatch()
        g = groups[n % 50]
        b.append(g, [entry((n - 1) // 50 + 1, 1, b"%d" % n)])
        futures.append(s.submit(b))
    for f in futures:
        f.result(30)
    assert s.rounds < 100, s.rounds
    assert all(s.last_index(g) == 4 for g in groups)
    s.close()
