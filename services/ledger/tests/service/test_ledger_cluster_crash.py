"""Three real ledger voters killed at once (SIGKILL) and restarted on the same data dirs."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import grpc

from enroute_core.base.ids import ObjectId
from enroute_core.state import Commit, OutcomeCode, RefUpdate, decode_change, encode_command
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import wait_for_value

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, start_all, start_three  # noqa: E402
from test_ledger_cluster import current_main  # noqa: E402

MAIN = b"refs/heads/main"
COMMITS = 30


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def propose(p: LedgerProc, n: int, have: ObjectId | None, timeout_s: float) -> int:
    cmd = encode_command(Commit(1, (RefUpdate(MAIN, have, oid(n)),), None, n, False))
    resp = p.ledger.Propose(
        ledger_pb2.ProposeRequest(repo="r", incarnation=1, command=cmd), timeout=timeout_s
    )
    change = decode_change(resp.effects)
    assert change.outcome.code is OutcomeCode.OK, change.outcome
    return int(resp.version)


def test_kill_all_three_voters_at_once_keeps_every_acknowledged_commit_once(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """DESIGN "Repository state": an acknowledged commit is in the log of a majority on
    disk, so SIGKILL of every voter loses none; replay applies each entry once (versions
    consecutive, the ref at the last acknowledged value), and the group commits again."""
    nodes = start_three(tmp_path, procs)
    req = ledger_pb2.ActivateRequest(repo="r", create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN)
    created = nodes[0].ledger.Activate(req, timeout=20)
    assert created.created

    versions: list[int] = []
    have: ObjectId | None = None
    for n in range(1, COMMITS + 1):
        versions.append(propose(nodes[n % 3], n, have, 20))
        have = oid(n)
    assert versions == list(range(versions[0], versions[0] + COMMITS)), versions
    last = versions[-1]

    # one more commit in flight while every voter dies: it may land or not, but once
    inflight: list[BaseException | int] = []

    def send() -> None:
        try:
            inflight.append(propose(nodes[1], COMMITS + 1, have, 5))
        except BaseException as e:  # any failure: outcome unknown
            inflight.append(e)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.005)  # the point: the kill lands at an arbitrary stage of that commit
    for p in nodes:
        assert p.proc is not None
        p.proc.kill()  # SIGKILL to all three before waiting for any
    for p in nodes:
        assert p.proc is not None
        p.proc.wait(10)
        p.kill()  # closes the channel
    sender.join(10)
    assert inflight and (isinstance(inflight[0], grpc.RpcError | int)), inflight

    again = [LedgerProc(p.config) for p in nodes]
    start_all(again, procs)
    states = []
    deadline = time.monotonic() + 20
    for p in again:

        def answer(p: LedgerProc = p) -> tuple[ObjectId | None, int] | None:
            try:
                return current_main(p, "r")
            except grpc.RpcError:
                return None  # no leader yet: ask again

        left_s = deadline - time.monotonic()
        states.append(wait_for_value(answer, left_s, "the group comes back", poll_s=0.1))
    assert len(set(states)) == 1, states
    cur, version = states[0]
    if isinstance(inflight[0], int):  # acknowledged before the kill: must be there
        assert (cur, version) == (oid(COMMITS + 1), last + 1)
    else:
        assert (cur, version) in ((oid(COMMITS), last), (oid(COMMITS + 1), last + 1))

    # the group accepts new commits, each applied once
    nxt = COMMITS + 2
    assert propose(again[0], nxt, cur, 20) == version + 1
    assert propose(again[2], nxt + 1, oid(nxt), 20) == version + 2
    for p in again:
        assert current_main(p, "r") == (oid(nxt + 1), version + 2)
