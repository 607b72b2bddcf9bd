"""Idle groups go quiet in real ledger processes (DESIGN.md, Processes: multi-Raft;
docs/raft.md duty 12): three voters hosting many repositories, once nothing is
proposed, tick no group, send no per-group message and wake only for the
node-level liveness beat; a proposal wakes one group and it goes quiet again."""

from __future__ import annotations

import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from enroute_core.state import OutcomeCode, decode_change
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, start_three  # noqa: E402
from test_ledger_service import MAIN, commit, oid  # noqa: E402

REPOS = 24
QUIET_DEADLINE_S = 20.0
WINDOW_S = 1.0
TICK_S = 0.02  # conftest's tick_interval


def metrics(p: LedgerProc) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{p.http_addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            out[name.removeprefix("enroute_ledger_")] = float(value)
    return out


def all_quiet(nodes: list[LedgerProc]) -> bool:
    ms = [metrics(n) for n in nodes]
    return all(m["groups"] == REPOS and m["groups_active"] == 0 for m in ms)


def test_idle_groups_quiesce_in_real_processes(tmp_path: Path, procs: list[LedgerProc]) -> None:
    nodes = start_three(tmp_path, procs)

    def create(k: int) -> int:
        req = ledger_pb2.ActivateRequest(
            repo=f"idle/{k:03d}", create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN
        )
        resp = nodes[k % 3].ledger.Activate(req, timeout=20)
        return int(resp.state.incarnation)

    with ThreadPoolExecutor(8) as ex:
        assert list(ex.map(create, range(REPOS))) == [1] * REPOS

    wait_until(
        lambda: all_quiet(nodes),
        QUIET_DEADLINE_S,
        "every group quiet",
        poll_s=0.1,
        explain=lambda: [metrics(n)["groups_active"] for n in nodes],
    )
    # Followers learn the leader's commit from its quiesce heartbeat and then stop; the
    # window opens once the last heartbeat's reply is in: two looks 0.2 s apart in which
    # no node sent a Raft message or persisted.
    looks: list[list[tuple[float, float]]] = []

    def settled() -> bool:
        ms = [metrics(n) for n in nodes]
        looks.append([(m["raft_messages_out_total"], m["persist_rounds_total"]) for m in ms])
        return len(looks) >= 2 and looks[-1] == looks[-2]

    wait_until(settled, QUIET_DEADLINE_S, "no Raft traffic between two looks", poll_s=0.2)

    before = [metrics(n) for n in nodes]
    time.sleep(WINDOW_S)  # the point: an idle window in which nothing may tick
    after = [metrics(n) for n in nodes]
    ticks = WINDOW_S / TICK_S
    for b, a in zip(before, after, strict=True):
        assert a["raft_group_ticks_total"] == b["raft_group_ticks_total"]
        assert a["raft_messages_out_total"] == b["raft_messages_out_total"]
        assert a["raft_heartbeats_out_total"] == b["raft_heartbeats_out_total"]
        assert a["persist_rounds_total"] == b["persist_rounds_total"]
        # only node-level liveness beats, far fewer than one per tick and peer
        beats = a["raft_batches_out_total"] - b["raft_batches_out_total"]
        assert beats == a["raft_beats_out_total"] - b["raft_beats_out_total"]
        assert beats <= 2 * ticks / 2

    # a proposal wakes its group only, which commits and goes quiet again
    p = nodes[0]
    resp = p.ledger.Propose(
        ledger_pb2.ProposeRequest(
            repo="idle/000", incarnation=1, command=commit(1, MAIN, None, oid(1))
        ),
        timeout=10,
    )
    assert decode_change(resp.effects).outcome.code is OutcomeCode.OK
    woke = sum(metrics(n)["raft_group_ticks_total"] for n in nodes) - sum(
        m["raft_group_ticks_total"] for m in after
    )
    wait_until(lambda: all_quiet(nodes), QUIET_DEADLINE_S, "quiet again after the proposal")
    assert woke < REPOS, "a proposal to one group ticked the others"
