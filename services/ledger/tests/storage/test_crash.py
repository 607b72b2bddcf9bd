"""Crash safety: SIGKILL a writing process at random points, reopen, check every batch.

Each acknowledged batch (its commit returned and the child said so before it
died) is present in full; nothing of a batch is visible without the rest of it.
Several kills in a row hit the same directory, so recovery of a recovered store
is exercised too. Seeded: ``ENROUTE_SEED=``.
"""

from __future__ import annotations

import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from crashwork import check, last_batch, open_store
from storemodel import seed_from_env

KILLS = 6
CHILD = Path(__file__).resolve().parent / "crashwork.py"


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, "child did not answer in time"
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = proc.stdout.read1(1)  # type: ignore[attr-defined]
            assert chunk, "child exited early"
            line += chunk
    return line


def test_sigkill_loses_no_acknowledged_batch(tmp_path: Path) -> None:
    rng = random.Random(seed_from_env(20260))
    acked = 0
    for attempt in range(KILLS):
        proc = subprocess.Popen([sys.executable, str(CHILD), str(tmp_path)], stdout=subprocess.PIPE)
        try:
            ready = _read_line(proc, 60).split()
            assert ready[0] == b"ready" and int(ready[1]) >= acked
            time.sleep(rng.uniform(0.02, 0.3))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        lines = out.split(b"\n")[:-1]  # the last piece may be cut mid-line
        if lines:
            acked = max(acked, int(lines[-1]))
        store = open_store(tmp_path)
        try:
            m = last_batch(store)
            assert m >= acked, (attempt, m, acked)
            check(store, m)
        finally:
            store.close()
    assert acked > 0
