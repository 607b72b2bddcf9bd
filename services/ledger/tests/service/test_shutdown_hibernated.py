"""A voter that stops leaves the hibernated groups it leads asleep (docs/raft.md,
"A leader down or stopped").

Issue 19: on SIGTERM a voter hands every group it leads to another voter
(Raft §3.10) so a rolling restart costs no election; a hibernated group was
woken for that, here and on the target, which at fleet scale woke thousands
of idle groups at every restart. A hibernated group has nothing waiting: it is
left asleep, its followers do not wake it when the stopped voter goes down,
and the first write that needs it wakes it on a survivor, where it elects.
"""

from __future__ import annotations

import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from enroute_testing import ledgers
from enroute_testing.waiting import wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, fast_timing  # noqa: E402
from test_ledger_hibernation import propose_until_ok, rid  # noqa: E402
from test_ledger_idle import metrics  # noqa: E402
from test_ledger_service import MAIN, commit, create, oid  # noqa: E402

REPOS = 24
DEADLINE_S = 30.0


def name(k: int) -> str:
    return f"sleep/{k:02d}"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_stopping_voter_leaves_its_hibernated_groups_asleep_and_they_serve_writes(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    timing = fast_timing() | {"hibernate_after": "0.3s"}
    nodes = ledgers.start_three(tmp_path, procs, ledger=timing)
    with ThreadPoolExecutor(6) as ex:
        list(ex.map(lambda k: create(nodes[k % 3], name(k)), range(REPOS)))
    for k in range(REPOS):
        propose_until_ok(nodes[k % 3], name(k), commit(1, MAIN, None, oid(1)), rid("one", k))
    wait_until(
        lambda: all(metrics(n)["groups_hibernated"] == REPOS for n in nodes),
        DEADLINE_S,
        "every group hibernated on every voter",
        poll_s=0.2,
        explain=lambda: [metrics(n)["groups_hibernated"] for n in nodes],
    )
    leading = [int(metrics(n)["groups_leading"]) for n in nodes]
    stopping = max(range(3), key=lambda i: leading[i])
    assert leading[stopping] >= 1, leading
    survivors = [n for i, n in enumerate(nodes) if i != stopping]
    wakes = [metrics(n)["group_wakes_total"] for n in survivors]

    assert nodes[stopping].stop() == 0
    drained = re.search(r"drained: led=(\d+) asleep=(\d+)", "".join(nodes[stopping].stderr))
    assert drained is not None, "".join(nodes[stopping].stderr)[-2000:]
    # nothing was awake to hand over; every group it led stayed asleep
    assert (int(drained[1]), int(drained[2])) == (0, leading[stopping])

    # the survivors notice the voter gone (liveness: one election timeout, 0.2 s here)
    # and wake nothing for it
    time.sleep(2.0)
    assert [metrics(n)["group_wakes_total"] for n in survivors] == wakes
    assert all(metrics(n)["groups_hibernated"] == REPOS for n in survivors)

    # every repository takes a write through a survivor: the groups the stopped voter
    # led wake there, elect, and commit
    t0 = time.monotonic()
    for k in range(REPOS):
        cmd = commit(1, MAIN, oid(1), oid(2))
        propose_until_ok(survivors[k % 2], name(k), cmd, rid("two", k))
    elapsed = time.monotonic() - t0
    print(f"a write to each of {REPOS} repositories after the stop: {elapsed:.1f} s")
