"""The crash test's writer (run as a child process) and the checks of what survived.

Batch ``n`` appends entry ``n`` to each of three groups, sets their hard
states' commit to ``n`` and writes state rows naming ``n``; every 25th batch
checkpoints and compacts with a pin. Everything is a pure function of ``n``, so
the store after any crash must equal the result of batches ``1..M`` for one
``M``: nothing partial (atomicity per batch) and ``M`` at least the last batch
whose commit the child reported (durability).

Usage (child): ``python crashwork.py DIR``; prints ``ready M`` once open,
then the number of each batch whose commit returned, one per line.
"""

from __future__ import annotations

import hashlib
import sys
from collections import deque
from concurrent.futures import Future
from pathlib import Path

from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft.types import ConfState, Entry, EntryType, HardState, SnapshotMetadata
from enroute_ledger.storage import SqliteStore
from enroute_ledger.storage.api import GroupId, WriteBatch

GROUPS = (GroupId(b"crash/a", 1), GroupId(b"crash/b", 1), GroupId(b"crash/c", 2))
INFLIGHT_MAX = 4
BATCHES_MAX = 200_000


def open_store(path: Path) -> SqliteStore:
    return SqliteStore.open(path)


def term_of(index: int) -> int:
    return 1 + index // 50


def payload(n: int, i: int) -> bytes:
    return hashlib.sha256(b"%d/%d" % (n, i)).digest() * (1 + (n * 7 + i) % 9)


def pin_of(n: int) -> int | None:
    """The index pinned once batch ``n`` checkpointed: 12 below the last multiple of 50."""
    p = (n // 50) * 50 - 12
    return p if p >= 1 else None


def checkpoint(n: int) -> tuple[int, int] | None:
    """(snapshot index, compaction index) after batches ``1..n``."""
    c = (n // 25) * 25
    return None if c == 0 else (c - 5, c - 10)


def make_batch(n: int) -> WriteBatch:
    b = WriteBatch()
    for i, g in enumerate(GROUPS):
        b.append(g, [Entry(Term(term_of(n)), LogIndex(n), EntryType.NORMAL, payload(n, i))])
        b.set_hard_state(g, HardState(Term(term_of(n)), NodeId(1), LogIndex(n)))
        if n % 25 == 0:
            snap, upto = n - 5, n - 10
            b.set_snapshot(g, SnapshotMetadata(LogIndex(snap), Term(term_of(snap)), ConfState()))
            pin = pin_of(n)
            keep = [LogIndex(pin)] if pin is not None and pin <= upto else []
            b.compact(g, LogIndex(upto), keep)
    b.put_state(GROUPS[0], b"last", b"%d" % n)
    b.put_state(GROUPS[0], b"k%d" % (n % 7), b"%d" % n)
    return b


def check(store: SqliteStore, m: int) -> None:
    """The store holds exactly batches ``1..m``."""
    assert store.groups() == sorted(GROUPS)
    cp = checkpoint(m)
    base = 0 if cp is None else cp[1]
    for i, g in enumerate(GROUPS):
        assert store.last_index(g) == m, (g, store.last_index(g), m)
        assert store.first_index(g) == base + 1
        assert store.hard_state(g) == HardState(Term(term_of(m)), NodeId(1), LogIndex(m))
        got = store.entries(g, LogIndex(base + 1), LogIndex(m + 1), 1 << 40)
        assert [e.data for e in got] == [payload(n, i) for n in range(base + 1, m + 1)]
        assert [e.term for e in got] == [term_of(n) for n in range(base + 1, m + 1)]
        if cp is not None:
            assert store.snapshot_meta(g).index == cp[0]
            pin = pin_of(m)
            if pin is not None and pin <= base:
                assert store.kept_indexes(g) == {pin}
                assert store.entry(g, LogIndex(pin)).data == payload(pin, i)
    rows = dict(store.state_rows(GROUPS[0]))
    assert rows.pop(b"last") == b"%d" % m
    want = {b"k%d" % (n % 7): b"%d" % n for n in range(max(1, m - 6), m + 1)}
    assert rows == want


def last_batch(store: SqliteStore) -> int:
    return store.last_index(GROUPS[0]) if store.has_group(GROUPS[0]) else 0


def main(path: str) -> None:
    store = open_store(Path(path))
    m = last_batch(store)
    print(f"ready {m}", flush=True)
    inflight: deque[tuple[int, Future[None]]] = deque()
    for n in range(m + 1, m + BATCHES_MAX):
        inflight.append((n, store.submit(make_batch(n))))
        if len(inflight) >= INFLIGHT_MAX:
            done, fut = inflight.popleft()
            fut.result()
            print(done, flush=True)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
