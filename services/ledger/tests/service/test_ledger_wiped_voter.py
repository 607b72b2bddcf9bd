"""A voter whose data directory was wiped rejoins blank (docs/raft.md, "A voter that lost
its disk"), on three real ledger processes.

Scenario: three voters commit to three repositories; one voter is killed (SIGKILL),
its data directory deleted, and restarted under the same id. It must come back
blank: caught up by the others and readmitted by a READMIT committed without it.
Then another voter is killed: the two left (one of them the wiped one) still hold
every acknowledged commit, and commit again.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import grpc

from enroute_core.base.ids import ObjectId
from enroute_core.state import Commit, OutcomeCode, RefUpdate, decode_change, encode_command
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import wait_for_value, wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, start_three  # noqa: E402
from test_ledger_cluster import current_main  # noqa: E402

MAIN = b"refs/heads/main"
REPOS = ("w0", "w1", "w2")
COMMITS = 12


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def propose(p: LedgerProc, repo: str, n: int, have: ObjectId | None, timeout_s: float) -> int:
    cmd = encode_command(Commit(1, (RefUpdate(MAIN, have, oid(n)),), None, n, False))
    resp = p.ledger.Propose(
        ledger_pb2.ProposeRequest(repo=repo, incarnation=1, command=cmd), timeout=timeout_s
    )
    change = decode_change(resp.effects)
    assert change.outcome.code is OutcomeCode.OK, change.outcome
    return int(resp.version)


def read_main(p: LedgerProc, repo: str, deadline: float) -> tuple[ObjectId | None, int]:
    def answer() -> tuple[ObjectId | None, int] | None:
        try:
            return current_main(p, repo)
        except grpc.RpcError:
            return None  # no leader yet: ask again

    bound_s = deadline - time.monotonic()
    return wait_for_value(answer, bound_s, f"{repo} readable on {p.grpc_addr}", poll_s=0.1)


def test_wiped_voter_rejoins_blank_and_a_second_loss_keeps_every_commit(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes = start_three(tmp_path, procs)
    acked: dict[str, tuple[ObjectId, int]] = {}
    for repo in REPOS:
        req = ledger_pb2.ActivateRequest(
            repo=repo, create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN
        )
        assert nodes[0].ledger.Activate(req, timeout=20).created
        have: ObjectId | None = None
        for n in range(1, COMMITS + 1):
            version = propose(nodes[n % 3], repo, n, have, 20)
            have = oid(n)
            acked[repo] = (have, version)

    # voter 2 loses its disk
    wiped = nodes[1]
    assert wiped.proc is not None
    wiped.proc.kill()
    wiped.proc.wait(10)
    wiped.kill()
    shutil.rmtree(tmp_path / "d2")  # its data dir (start_three)
    # the others commit meanwhile (a quorum of two without it)
    for repo in REPOS:
        have, _ = acked[repo]
        n = COMMITS + 1
        acked[repo] = (oid(n), propose(nodes[0], repo, n, have, 20))

    t0 = time.monotonic()
    back = LedgerProc(wiped.config).start()
    procs.append(back)
    assert (tmp_path / "d2" / "blank-repos").exists(), "a wiped start must know it is blank"
    # it is caught up and readmitted in every group, by a quorum of the other two

    def readmitted() -> bool:
        assert back.proc is not None and back.proc.poll() is None, "".join(back.stderr)
        return all(f"readmitted to {repo}/1" in "".join(back.stderr) for repo in REPOS)

    wait_until(
        readmitted,
        60,
        "the wiped voter is readmitted to every group",
        poll_s=0.1,
        explain=lambda: "".join(back.stderr)[-3000:],
    )
    print(f"readmitted everywhere {time.monotonic() - t0:.1f} s after the restart")
    for repo in REPOS:
        assert read_main(back, repo, time.monotonic() + 20) == acked[repo]

    # then voter 1 is lost too: voters 2 (wiped, readmitted) and 3 keep every commit
    first = nodes[0]
    assert first.proc is not None
    first.proc.kill()
    first.proc.wait(10)
    first.kill()
    third = nodes[2]
    deadline = time.monotonic() + 30
    for repo in REPOS:
        assert read_main(back, repo, deadline) == acked[repo], repo
        assert read_main(third, repo, deadline) == acked[repo], repo
    # and commit again, each applied once
    for repo in REPOS:
        have, version = acked[repo]
        got = None
        while got is None:
            try:
                got = propose(back, repo, 100, have, 10)
            except grpc.RpcError:
                assert time.monotonic() < deadline, repo
        assert got == version + 1
        assert read_main(third, repo, deadline) == (oid(100), version + 1)
