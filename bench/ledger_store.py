"""Ledger store benchmark (``enroute_ledger.storage.SqliteStore``), fsync on every commit.

Cases, each run several times for a fixed time on a fresh directory under the
system temp dir:

1. one group, one 200-byte entry and a hard state per batch, commit after commit;
2. 1,000 groups, one 200-byte entry and a hard state each per batch (group
   commit: one fsync for all of them), with checkpoints: every group records
   a snapshot and compacts its log every 100 entries (staggered);
3. 1,000 single-group batches submitted at once, repeatedly: the committer
   coalesces what queues up into as few rounds (fsyncs) as it can;
4. recovery: open a store holding 200,000 entries of 1,000 groups;
5. the log table's layout, in raw SQLite: a rowid table in arrival order with a
   ``(gid, idx)`` index against a ``WITHOUT ROWID`` table keyed by ``(gid, idx)``.

The segment-log candidate it was chosen against, and its figures, are in
docs/ledger-storage.md. Writes its section to docs/benchmarks.md (section
"ledger-store"). Usage: ``python -m bench.ledger_store [--seconds S] [--repeats N]``
from the checkout root; about a minute.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.report import write_section
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft.types import ConfState, Entry, HardState, SnapshotMetadata
from enroute_ledger.storage import SqliteStore
from enroute_ledger.storage.api import GroupId, WriteBatch

PAYLOAD = bytes(range(200))
GROUPS_MANY = 1000
CHECKPOINT_ENTRIES = 100
BATCHES_MAX = 1_000_000
RECOVERY_ENTRIES_PER_GROUP = 200
_MANY = [GroupId(b"bench/repo-%04d" % i, 1) for i in range(GROUPS_MANY)]


@dataclass(frozen=True)
class Result:
    batches: int
    entries: int
    seconds: float
    latencies_s: tuple[float, ...]
    rounds: int

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds


Step = Callable[[SqliteStore, int], tuple[int, int, float]]


def _run(seconds: float, step: Step) -> Result:
    work = Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    try:
        store = SqliteStore.open(work)
        lat: list[float] = []
        batches = entries = 0
        start = time.perf_counter()
        for n in range(1, BATCHES_MAX):
            if time.perf_counter() - start >= seconds:
                break
            b, e, latency = step(store, n)
            batches += b
            entries += e
            lat.append(latency)
        elapsed = time.perf_counter() - start
        rounds = store.rounds
        store.close()
        return Result(batches, entries, elapsed, tuple(lat), rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _hs(n: int) -> HardState:
    return HardState(Term(1), NodeId(1), LogIndex(n))


def _one_group(store: SqliteStore, n: int) -> tuple[int, int, float]:
    g = GroupId(b"bench/one", 1)
    b = WriteBatch()
    b.append(g, [Entry(Term(1), LogIndex(n), data=PAYLOAD)])
    b.set_hard_state(g, _hs(n))
    t = time.perf_counter()
    store.commit(b)
    return 1, 1, time.perf_counter() - t


def _many_groups_batch(n: int, checkpoints: bool) -> WriteBatch:
    b = WriteBatch()
    for i, g in enumerate(_MANY):
        b.append(g, [Entry(Term(1), LogIndex(n), data=PAYLOAD)])
        b.set_hard_state(g, _hs(n))
        if checkpoints and (n + i) % CHECKPOINT_ENTRIES == 0 and n > 10:
            b.set_snapshot(g, SnapshotMetadata(LogIndex(n - 5), Term(1), ConfState()))
            b.compact(g, LogIndex(n - 5))
    return b


def _many_groups(store: SqliteStore, n: int) -> tuple[int, int, float]:
    b = _many_groups_batch(n, checkpoints=True)
    t = time.perf_counter()
    store.commit(b)
    return 1, len(_MANY), time.perf_counter() - t


def _many_submits(store: SqliteStore, n: int) -> tuple[int, int, float]:
    futures = []
    t = time.perf_counter()
    for g in _MANY:
        b = WriteBatch()
        b.append(g, [Entry(Term(1), LogIndex(n), data=PAYLOAD)])
        b.set_hard_state(g, _hs(n))
        futures.append(store.submit(b))
    for f in futures:
        f.result()
    return len(_MANY), len(_MANY), time.perf_counter() - t


CASES: list[tuple[str, Step]] = [
    ("1 group, 1 x 200 B entry + hard state per batch", _one_group),
    ("1,000 groups x 1 x 200 B entry + hard state per batch, checkpoints", _many_groups),
    ("1,000 one-group batches submitted at once (coalesced)", _many_submits),
]


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def _row(title: str, runs: list[Result]) -> str:
    tput = sorted(r.entries_per_s for r in runs)
    lat = [x for r in runs for x in r.latencies_s]
    per_round = sum(r.batches for r in runs) / max(1, sum(r.rounds for r in runs))
    return (
        f"| {title} | {statistics.median(r.batches_per_s for r in runs):,.0f} "
        f"| {statistics.median(tput):,.0f} ({tput[0]:,.0f}-{tput[-1]:,.0f}) "
        f"| {_pct(lat, 0.5) * 1e3:.2f} | {_pct(lat, 0.99) * 1e3:.2f} | {per_round:.1f} |"
    )


def bench_recovery(repeats: int) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="ledger-bench-recovery-"))
    try:
        store = SqliteStore.open(work)
        for n in range(1, RECOVERY_ENTRIES_PER_GROUP + 1):
            store.commit(_many_groups_batch(n, checkpoints=False))
        store.close()
        size = sum(f.stat().st_size for f in work.iterdir())
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            store = SqliteStore.open(work)
            times.append(time.perf_counter() - t)
            store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = RECOVERY_ENTRIES_PER_GROUP * GROUPS_MANY
    return [
        "### Recovery",
        "",
        f"Open a store holding {total:,} entries of {GROUPS_MANY:,} groups "
        f"({size / 1e6:.0f} MB on disk), until it answers: "
        f"{statistics.median(times) * 1e3:.0f} ms median of {repeats} "
        f"(min {min(times) * 1e3:.0f}, max {max(times) * 1e3:.0f}).",
        "",
    ]


def _raw_layout(rowid: bool, batches: int) -> float:
    """Batches/s of raw 1,000-group inserts plus hard-state updates, one transaction each."""
    work = Path(tempfile.mkdtemp(prefix="ledger-bench-layout-"))
    try:
        conn = sqlite3.connect(work / "t.sqlite", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        if rowid:
            conn.execute("CREATE TABLE log(id INTEGER PRIMARY KEY, g, idx, term, type, data, crc)")
            conn.execute("CREATE UNIQUE INDEX li ON log(g, idx)")
            insert = "INSERT INTO log(g, idx, term, type, data, crc) VALUES (?, ?, ?, ?, ?, ?)"
        else:
            conn.execute(
                "CREATE TABLE log(g, idx, term, type, data, crc, PRIMARY KEY(g, idx)) WITHOUT ROWID"
            )
            insert = "INSERT INTO log(g, idx, term, type, data, crc) VALUES (?, ?, ?, ?, ?, ?)"
        conn.execute("CREATE TABLE hs(g INTEGER PRIMARY KEY, term, vote, cmt)")
        conn.executemany("INSERT INTO hs VALUES (?, 0, 0, 0)", [(g,) for g in range(GROUPS_MANY)])
        start = time.perf_counter()
        for n in range(1, batches + 1):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(insert, [(g, n, 1, 0, PAYLOAD, 0) for g in range(GROUPS_MANY)])
            conn.executemany(
                "UPDATE hs SET term = 1, vote = 1, cmt = ? WHERE g = ?",
                [(n, g) for g in range(GROUPS_MANY)],
            )
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        conn.close()
        return batches / elapsed
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_layout(batches: int) -> list[str]:
    rowid = _raw_layout(True, batches)
    keyed = _raw_layout(False, batches)
    return [
        "### Log table layout (raw SQLite)",
        "",
        f"{batches} transactions of 1,000 groups x 1 x 200 B entry plus 1,000 hard-state "
        "updates each, `executemany`, WAL and `synchronous=FULL`:",
        "",
        "| layout | batches/s |",
        "|---|---|",
        f"| rowid table in arrival order + unique `(gid, idx)` index (used) | {rowid:,.1f} |",
        f"| `WITHOUT ROWID` table keyed by `(gid, idx)` | {keyed:,.1f} |",
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0, help="per run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case")
    args = ap.parse_args()
    lines = [
        f"`SqliteStore` (WAL, `synchronous=FULL`). Each case runs {args.repeats} times for "
        f"{args.seconds:g} s on a fresh directory under the system temp dir. Entries/s: "
        "median (min-max) of the runs. Latency: wall time of one `commit` (for the "
        "coalesced case: of one wave of 1,000 submits), pooled over the runs. Batches "
        "per fsync shows the group commit.",
        "",
        "| case | batches/s | entries/s | p50 ms | p99 ms | batches per fsync |",
        "|---|---|---|---|---|---|",
    ]
    for title, step in CASES:
        runs = [_run(args.seconds, step) for _ in range(args.repeats)]
        lines.append(_row(title, runs))
        print(lines[-1], flush=True)
    lines.append("")
    lines += bench_recovery(args.repeats)
    print(lines[-2], flush=True)
    lines += bench_layout(batches=60)
    print("\n".join(lines[-3:]), flush=True)
    write_section("ledger-store", lines)


if __name__ == "__main__":
    main()
