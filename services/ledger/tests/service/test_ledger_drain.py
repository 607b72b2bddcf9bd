"""A voter's drain on SIGTERM (docs/reliability.md, "Graceful drain"; issue 23, item 3).

Three real voters. The leader of a repository's group takes a proposal it
cannot commit yet (both followers paused with SIGSTOP), then gets SIGTERM. While
it drains it must refuse a new proposal with UNAVAILABLE and say it is
stopping (the compute's client then asks another member under the same
request id, docs/rpc.md "Propose"), stay up for the proposal it took, and,
once the followers are back, hand its leadership over (Raft §3.10), answer
that proposal as applied, and exit 0 well within ``ledger.drain_grace``.
Without the drain the process stopped its server at once: the taken
proposal was cancelled and the new one met a closed port.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, wait_for  # noqa: E402
from test_ledger_request_id import commit, oid  # noqa: E402
from test_ledger_service import create  # noqa: E402

from enroute_testing.ledgers import start_three  # noqa: E402

REPO = "r/x"
DRAIN_GRACE_S = 30.0
HOLD_S = 1.0
"""How long the taken proposal waits on the paused followers before SIGTERM, and the
drain before they are resumed."""


def propose(p: LedgerProc, cmd: bytes, rid: bytes, timeout_s: float) -> int:
    req = ledger_pb2.ProposeRequest(repo=REPO, incarnation=1, command=cmd, request_id=rid)
    resp: ledger_pb2.ProposeResponse = p.ledger.Propose(req, timeout=timeout_s)
    return int(resp.version)


def leader_id(p: LedgerProc) -> int | None:
    groups = p.status(REPO)["raft_groups"]
    assert isinstance(groups, list)
    leaders = {g["leader"] for g in groups if g["leader"]}
    return int(leaders.pop()) if len(leaders) == 1 else None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_draining_voter_refuses_new_proposals_and_finishes_the_taken_one(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes = start_three(tmp_path, procs, ledger={"drain_grace": f"{DRAIN_GRACE_S:.0f}s"})
    create(nodes[0], REPO)
    wait_for(lambda: all(leader_id(n) is not None for n in nodes), 20.0)
    lead = nodes[leader_id(nodes[0]) - 1]  # type: ignore[operator]
    followers = [n for n in nodes if n is not lead]
    taken: list[object] = []

    def take() -> None:
        try:
            taken.append(propose(lead, commit(None, oid(1)), b"t" * 16, DRAIN_GRACE_S))
        except grpc.RpcError as error:
            taken.append(error)

    for f in followers:
        os.kill(f.pid, signal.SIGSTOP)
    try:
        worker = threading.Thread(target=take, daemon=True)
        worker.start()
        time.sleep(HOLD_S)
        assert not taken, f"committed without a follower: {taken}"
        assert lead.proc is not None
        lead.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "stopping: new proposals refused" in "".join(lead.stderr), 10.0)
        with pytest.raises(grpc.RpcError) as refused:
            propose(lead, commit(oid(1), oid(2)), b"n" * 16, 10.0)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        assert "ledger is stopping" in str(refused.value.details()), refused.value
        time.sleep(HOLD_S)
        assert lead.proc.poll() is None, "the voter left before its taken proposal ended"
    finally:
        for f in followers:
            os.kill(f.pid, signal.SIGCONT)
    worker.join(DRAIN_GRACE_S)
    assert taken and isinstance(taken[0], int), f"the taken proposal: {taken}"
    started = time.monotonic()
    assert lead.proc.wait(DRAIN_GRACE_S) == 0
    log = "".join(lead.stderr)
    assert "drained: " in log, log[-3000:]
    assert "still open after ledger.drain_grace" not in log
    print(f"exited {time.monotonic() - started:.1f} s after the taken proposal was answered")
    # the others lead the group now and hold the proposal's write
    survivors = followers
    ids = {int(str(s.status()["node_id"])) for s in survivors}
    wait_for(lambda: all(leader_id(n) in ids for n in survivors), 20.0)
    state = survivors[0].ledger.Describe(ledger_pb2.DescribeRequest(repo=REPO), timeout=20)
    assert state.state.version == taken[0]
