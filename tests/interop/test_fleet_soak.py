"""Ephemeral repositories do not fill the ledger's disk (issue 19, item 5), on `enroute dev`.

CI creates and deletes repositories all day: each cycle here creates one through
the API, pushes a small commit with git (its 8 KiB layer is inline: the log entry
holds its bytes and the state pins it) and deletes it. Seed 001 keeps a deleted
incarnation hosted until its name is created again, so every name stays on the
voter as a tombstone; its log is compacted to that tombstone at once
(checkpoints.py), and the pinned entries go with it. The checkpointer used to
stop at a deleted state object, and every deleted repository's whole log stayed.

The cycles take their names in turn from ``NAMES`` (100): the first 100 make each
name once and leave it a tombstone; from then on every create claims the next
incarnation of a deleted name, and the voter drops the one before (seed 001). The
issue's acceptance is checked as it is written: the ledger's disk use at the end is
within 10% of its use after the first 100 cycles, both as the bytes of the data
directory's files (what `du` shows) and as the bytes the store's pages in use hold
(page count less free pages, read-only while it runs, with two pages of slack;
the files' size is a high-water mark: SQLite reuses free pages and a WAL of about
4 MiB). A name never
created again keeps its tombstone (seed 001, "Limits"): over the first 100 cycles
the pages in use may grow by at most ``TOMBSTONE_BYTES_MAX`` a name after the first
ten (a kept log grows by more than the 8 KiB pushed).

``ENROUTE_SOAK_CYCLES`` sets the count (CI: 200; the issue's soak, under
``nightly``: 2,000).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest

from enroute_testing.devserver import DevServer, running_dev
from enroute_testing.gitcli import run_git

pytestmark = [pytest.mark.interop, pytest.mark.slow]

CYCLES = int(os.environ.get("ENROUTE_SOAK_CYCLES", "200"))
NIGHTLY_CYCLES = 2000
SEED = int(os.environ.get("ENROUTE_SEED", "19"))
TOMBSTONE_BYTES_MAX = 1024
NAMES = 100
DISK_GROWTH_MAX = 0.10
"""The issue's acceptance: disk use at the end within 10% of its use after 100 cycles."""
PAGES_SLACK_BYTES = 8192
"""Two SQLite pages beyond that for the pages in use: after 100 cycles the store uses
some 64 KiB, of which a b-tree split alone is 6% (a kept log would be 8 KiB a cycle)."""
BLOB_BYTES = 8 * 1024  # below the inline layer limit: the push lands in the log


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def live_bytes(path: Path) -> int:
    """Bytes of the pages the voter's store uses (its WAL included), read-only."""
    db = next(path.rglob("ledger.sqlite"))
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        pages = c.execute("PRAGMA page_count").fetchone()[0]
        free = c.execute("PRAGMA freelist_count").fetchone()[0]
        size = c.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def api(dev: DevServer, method: str, target: str, body: object = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        dev.url + target, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return int(r.status)


def cycles(dev: DevServer, work: Path, rng: random.Random, start: int, stop: int) -> None:
    for k in range(start, stop):
        name = f"soak/r{k % NAMES:05d}"
        assert api(dev, "POST", "/api/v1/repos", {"name": name}) == 201
        # a root commit of its own: every push is one small, inline layer
        run_git(["checkout", "-q", "--orphan", f"c{k}"], cwd=work)
        (work / "blob.bin").write_bytes(rng.randbytes(BLOB_BYTES))
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"cycle {k}"], cwd=work)
        run_git(["push", "-q", f"{dev.url}/{name}.git", f"c{k}:main"], cwd=work)
        assert api(dev, "DELETE", f"/api/v1/repos/{name}") == 204


def settled(ledger_dir: Path) -> tuple[int, int]:
    """(bytes in use, bytes of files) once the checkpointer has caught up (a deleted
    group is compacted right after its tombstone applies; give it a moment)."""
    time.sleep(2.0)
    return live_bytes(ledger_dir), disk_bytes(ledger_dir)


@pytest.mark.timeout(3600)
def test_create_push_delete_cycles_keep_the_voter_s_disk_flat(tmp_path: Path) -> None:
    soak(tmp_path, CYCLES)


@pytest.mark.nightly
@pytest.mark.timeout(4 * 3600)
def test_the_soak_of_two_thousand_cycles(tmp_path: Path) -> None:
    soak(tmp_path, NIGHTLY_CYCLES)


def soak(tmp_path: Path, count: int) -> None:
    assert count > NAMES
    print(f"ENROUTE_SEED={SEED} cycles={count}")
    rng = random.Random(SEED)
    work = tmp_path / "work"
    run_git(["init", "-q", "-b", "main", str(work)], cwd=tmp_path)
    (tmp_path / "dev").mkdir()
    warm = NAMES // 10
    with running_dev(tmp_path / "dev") as dev:
        ledger_dir = tmp_path / "dev" / "data" / "ledger"
        t0 = time.monotonic()
        cycles(dev, work, rng, 0, warm)
        base = settled(ledger_dir)
        cycles(dev, work, rng, warm, NAMES)
        early = settled(ledger_dir)
        cycles(dev, work, rng, NAMES, count)
        late = settled(ledger_dir)
        spent = time.monotonic() - t0
    tombstone = (early[0] - base[0]) / (NAMES - warm)
    in_use, files = late[0] / early[0] - 1, late[1] / early[1] - 1
    print(
        f"ledger store after {NAMES} cycles: {early[0]:,} bytes in use, {early[1]:,} of "
        f"files ({tombstone:,.0f} in use per new name after {warm}); after {count}: "
        f"{late[0]:,} in use ({in_use:+.1%}), {late[1]:,} of files ({files:+.1%}); "
        f"{spent:.0f} s, {spent / count:.2f} s a cycle"
    )
    assert tombstone <= TOMBSTONE_BYTES_MAX, f"{tombstone:.0f} bytes kept per deleted repository"
    assert files <= DISK_GROWTH_MAX, f"the ledger's files grew {files:+.1%} after {NAMES} cycles"
    assert late[0] <= early[0] * (1 + DISK_GROWTH_MAX) + PAGES_SLACK_BYTES, (
        f"the store's pages in use grew {in_use:+.1%}"
    )
