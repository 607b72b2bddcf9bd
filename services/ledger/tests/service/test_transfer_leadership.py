"""POST /transfer-leadership on real ledger processes: the preStop hook of a rolling upgrade.

Raft §3.10 (leadership transfer): the leader brings the target up to date,
then tells it to campaign at once; the hook asks it for every group the node
leads and answers when they have moved (or its timeout ran out).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing import ledgers
from enroute_testing.ledgers import LedgerProc
from enroute_testing.waiting import wait_until

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from conftest import fast_timing, write_config  # noqa: E402

MAIN = b"refs/heads/main"
REPOS = 2
"""Whichever node takes both groups stays within leader spreading's fair share
(ceil(2 / 3) + slack 1 = 2): spreading may hand groups back to a drained node that is
still up (docs/observability.md, "Rolling upgrades"), and with 4 groups it did whenever
the drain left one node leading 4 (leaders 2/2/0 or 3/1/0 before it, as a loaded
machine's elections can leave them)."""


def status(p: LedgerProc) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{p.http_addr}/status", timeout=10) as r:
        st: dict[str, object] = json.loads(r.read())
    return st


def leaders(p: LedgerProc) -> dict[str, int | None]:
    groups = status(p)["raft_groups"]
    assert isinstance(groups, list)
    return {g["repo"]: g["leader"] for g in groups}


def post(p: LedgerProc, path: str) -> tuple[int, dict[str, int]]:
    req = urllib.request.Request(f"http://{p.http_addr}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_transfer_leadership_moves_every_group_away(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    # awake groups only: a hibernated one is left asleep (test_shutdown_hibernated.py)
    nodes = ledgers.start_three(tmp_path, procs, ledger=fast_timing() | {"hibernate_after": 0})
    for k in range(REPOS):
        req = ledger_pb2.ActivateRequest(
            repo=f"roll/{k}", create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN
        )
        nodes[0].ledger.Activate(req, timeout=30)  # its activator usually leads a group

    def settled() -> bool:
        views = [leaders(n) for n in nodes]
        return all(len(v) == REPOS and None not in v.values() for v in views)

    wait_until(settled, 20.0, "a leader of every group on every node")
    by_node = {n: int(status(nodes[n])["groups_leading"]) for n in range(3)}  # type: ignore[call-overload]
    source = max(by_node, key=lambda n: by_node[n])
    assert by_node[source] >= 1
    me = int(status(nodes[source])["node_id"])  # type: ignore[call-overload]

    code, answer = post(nodes[source], "/transfer-leadership?timeout=15")
    assert code == 200
    assert answer["led"] == by_node[source]
    assert answer["moved"] == answer["led"] and answer["still_leading"] == 0, answer
    assert answer["no_target"] == 0
    assert status(nodes[source])["groups_leading"] == 0
    # the others agree on new leaders that are not the drained node
    others = [n for i, n in enumerate(nodes) if i != source]

    seen: list[object] = []

    def agreed() -> bool:
        views = [leaders(n) for n in others]
        seen[:] = [views, [status(n)["groups_leading"] for n in nodes]]
        return all(v.values() and me not in v.values() and None not in v.values() for v in views)

    wait_until(
        agreed,
        10.0,
        f"the others agree on leaders other than the drained {me}",
        explain=lambda: f"before {by_node}, {answer}, now {seen}",
    )
    # the ledger still answers through the drained node (any member answers any call)
    resp = nodes[source].ledger.Describe(ledger_pb2.DescribeRequest(repo="roll/0"), timeout=20)
    assert resp.state.incarnation == 1


def test_transfer_leadership_is_post_only_and_noop_without_leadership(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    cfg = write_config(tmp_path / "l.yaml", node_id=1, data=tmp_path / "d", store=tmp_path / "s")
    p = LedgerProc(cfg).start()
    procs.append(p)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{p.http_addr}/transfer-leadership", timeout=10)
    assert e.value.code == 405
    t0 = time.monotonic()
    code, answer = post(p, "/transfer-leadership?timeout=1")
    assert code == 200 and answer["led"] == 0 and answer["still_leading"] == 0
    assert time.monotonic() - t0 < 5
