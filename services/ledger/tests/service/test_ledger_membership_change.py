"""Online membership changes on real voters (docs/raft.md, "Membership changes").

Three voters grow to five and shrink back to three, the leader of a group among
the removed, while two clients commit without pause. Every acknowledged commit is
there afterwards (each commit compares and swaps the ref from the previous one, so
the final ref names the last one only if every earlier one applied, once), every
group of every survivor has the final members, and a removed voter refuses to
start again under its retired id.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from enroute_core.base.ids import ObjectId
from enroute_core.state import Commit, OutcomeCode, RefUpdate, decode_change, encode_command
from enroute_ledger.membership_client import LedgerAdmin
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, free_port, start_all, write_config  # noqa: E402
from test_ledger_cluster import current_main, leader_of  # noqa: E402

MAIN = b"refs/heads/main"
REPOS = ("r0", "r1", "r2", "r3")
CHANGE_TIMEOUT_S = 120.0


def oid(repo: int, n: int) -> ObjectId:
    return ObjectId(bytes([repo]) + n.to_bytes(19, "big"))


class Client(threading.Thread):
    """Commits to its repositories one after another until stopped, through any live voter."""

    def __init__(self, repos: list[int], voters: list[LedgerProc], seed: int) -> None:
        super().__init__(daemon=True)
        self.repos = repos
        self.voters = voters  # shared: the test swaps members in and out
        self.rng = random.Random(seed)
        self.acked: dict[int, int] = dict.fromkeys(repos, 0)
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            r = self.rng.choice(self.repos)
            n = self.acked[r] + 1
            have = oid(r, n - 1) if n > 1 else None
            cmd = encode_command(Commit(1, (RefUpdate(MAIN, have, oid(r, n)),), None, n, False))
            live = [v for v in list(self.voters) if v.channel is not None]
            if not live:
                time.sleep(0.05)
                continue
            voter = self.rng.choice(live)
            try:
                resp = voter.ledger.Propose(
                    ledger_pb2.ProposeRequest(repo=REPOS[r], incarnation=1, command=cmd),
                    timeout=5,
                )
            except (grpc.RpcError, ValueError, AssertionError):
                # outcome unknown (or the voter left): read the ref before going on
                try:
                    cur, _ = current_main(voter, REPOS[r])
                except (grpc.RpcError, ValueError, AssertionError):
                    time.sleep(0.1)
                    continue
                if cur == oid(r, n):
                    self.acked[r] = n
                continue
            change = decode_change(resp.effects)
            if change.outcome.code is not OutcomeCode.OK:
                # an earlier attempt whose outcome was unknown (timed out, then applied
                # after the read above) makes this one's old value stale: it is acked
                with contextlib.suppress(grpc.RpcError, ValueError, AssertionError):
                    if current_main(voter, REPOS[r])[0] == oid(r, n):
                        self.acked[r] = n
                        continue
                self.errors.append(f"{REPOS[r]} commit {n}: {change.outcome}")
                self.stop.set()
                return
            self.acked[r] = n


def start_under_commits(
    nodes: dict[int, LedgerProc], procs: list[LedgerProc], seed: int
) -> tuple[list[LedgerProc], list[Client]]:
    """Start ``nodes``, create ``REPOS`` through voter 1, and start two clients that commit
    to them without pause (two repositories each): the load the membership tests change
    the ledger under. The live nodes (a list the tests edit as voters come and go) and
    the clients."""
    start_all(list(nodes.values()), procs)
    for repo in REPOS:
        req = ledger_pb2.ActivateRequest(
            repo=repo, create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN
        )
        assert nodes[1].ledger.Activate(req, timeout=20).created
    live = list(nodes.values())
    clients = [Client([0, 1], live, seed), Client([2, 3], live, seed + 1)]
    for c in clients:
        c.start()
    return live, clients


def _wait_groups(node: LedgerProc, voters: list[int], deadline: float) -> None:
    for repo in REPOS:
        while True:
            rows = node.status(repo)["raft_groups"]
            assert isinstance(rows, list)
            if rows and rows[0]["voters"] == voters:
                break
            assert time.monotonic() < deadline, f"{repo} on {node.grpc_addr}: {rows}"
            time.sleep(0.2)


@pytest.mark.slow
def test_grow_three_to_five_and_shrink_back_under_commits(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    seed = int(os.environ.get("ENROUTE_SEED", "1"))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    store = tmp_path / "store"
    ports = [free_port() for _ in range(5)]
    addrs = [f"127.0.0.1:{p}" for p in ports]

    def config(i: int, members: list[str]) -> Path:
        return write_config(
            tmp_path / f"l{i}.yaml",
            node_id=i,
            data=tmp_path / f"d{i}",
            store=store,
            grpc_port=ports[i - 1],
            members=tuple(members),
        )

    nodes = {i: LedgerProc(config(i, addrs[:3])) for i in (1, 2, 3)}
    live, clients = start_under_commits(nodes, procs, seed)
    said: list[str] = []
    admin = LedgerAdmin(nodes[1].http_addr, None)

    # grow: 3 -> 4 -> 5, each new voter started once its change is open
    for new in (4, 5):
        nid = admin.begin_add(addrs[new - 1])
        assert nid == new  # ids come from the record, one after the other
        nodes[new] = LedgerProc(config(new, addrs[:new]))
        start_all([nodes[new]], procs)
        live.append(nodes[new])
        admin.finish(said.append, timeout_s=CHANGE_TIMEOUT_S)
    assert admin.begin_add(addrs[4]) == 5  # idempotent: the same address, the same voter
    deadline = time.monotonic() + CHANGE_TIMEOUT_S
    for i in (1, 5):
        _wait_groups(nodes[i], [1, 2, 3, 4, 5], deadline)

    # shrink: remove the leader of a group, then one more voter
    first = leader_of(nodes[2], REPOS[rng.randrange(len(REPOS))]) or 1
    second = rng.choice([i for i in (1, 2, 3, 4, 5) if i != first])
    gone = []
    keeper = next(i for i in nodes if i not in (first, second))
    admin = LedgerAdmin(nodes[keeper].http_addr, None)
    for victim in (first, second):
        admin.remove(victim, said.append)
        live.remove(nodes[victim])
        nodes[victim].stop()
        gone.append(victim)
    stays = sorted(i for i in nodes if i not in gone)
    time.sleep(1.0)  # some commits on the final members
    assert all(c.is_alive() for c in clients), [c.errors for c in clients]
    for c in clients:
        c.stop.set()
    for c in clients:
        c.join(30)
        assert not c.errors, c.errors

    # nothing acknowledged is lost: each ref is at its last acknowledged commit (or one
    # whose answer was lost, which the chain of compare-and-swaps also proves)
    acked = {r: n for c in clients for r, n in c.acked.items()}
    assert all(n >= 3 for n in acked.values()), acked
    deadline = time.monotonic() + CHANGE_TIMEOUT_S
    for i in stays:
        _wait_groups(nodes[i], stays, deadline)
        for r, n in acked.items():
            cur, _ = current_main(nodes[i], REPOS[r])
            assert cur in (oid(r, n), oid(r, n + 1)), (i, REPOS[r], n, cur)
    view = admin.members()
    assert view["record"]["voters"] == {str(i): addrs[i - 1] for i in stays}
    assert sorted(view["record"]["retired"]) == sorted(gone)
    assert any("groups to change" in line for line in said), said  # progress was shown

    # a removed voter never comes back under its id
    back = LedgerProc(nodes[first].config).spawn()
    procs.append(back)
    assert back.proc is not None
    assert back.proc.wait(60) == 2
    assert "its id is never used again" in "".join(back.stderr)
