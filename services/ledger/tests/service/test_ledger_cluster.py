"""Three real ledger voters over RaftTransport; kill -9 the leader during commits."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import grpc

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Commit,
    OutcomeCode,
    RefUpdate,
    RepoState,
    decode_change,
    decode_state,
    encode_command,
)
from enroute_core.state.names import state_key
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import wait_for_value, wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, error_code, start_three  # noqa: E402
from test_ledger_service import read_object  # noqa: E402

MAIN = b"refs/heads/main"
COMMITS = 30
DEADLINE_S = 40.0


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def leader_of(p: LedgerProc, repo: str) -> int | None:
    with urllib.request.urlopen(f"http://{p.http_addr}/status?repo={repo}", timeout=5) as r:
        st = json.loads(r.read())
    for g in st["raft_groups"]:
        if g["repo"] == repo and not g["deleted"]:
            return g["leader"]  # type: ignore[no-any-return]
    return None


def subscribed(p: LedgerProc, repo: str, timeout_s: float = 3.0) -> tuple[RepoState, int]:
    """The state a new subscriber starts from, after a barrier, and the bytes of the
    inline layers sent before it."""
    p.ledger.Barrier(ledger_pb2.BarrierRequest(repo=repo), timeout=timeout_s)
    call = p.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo=repo), timeout=timeout_s)
    inline = 0
    data = b""
    try:
        for ev in call:
            if ev.HasField("inline_layer"):
                inline += len(ev.inline_layer.data)
                continue
            data += ev.snapshot.data
            if ev.snapshot.last:
                break
    finally:
        call.cancel()
    return decode_state(data), inline


def agreed_leader(nodes: list[LedgerProc], repo: str) -> int | None:
    """The leader every voter names for ``repo``'s group, or None while they differ."""
    leads = {leader_of(n, repo) for n in nodes}
    return leads.pop() if len(leads) == 1 else None


def current_main(p: LedgerProc, repo: str) -> tuple[ObjectId | None, int]:
    st, _ = subscribed(p, repo)
    v = st.refs.get(MAIN)
    return (None if v is None else v.oid), st.version


def test_three_voters_survive_leader_kill_without_losing_or_repeating_commits(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes = start_three(tmp_path, procs)
    req = ledger_pb2.ActivateRequest(repo="r", create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN)
    assert nodes[0].ledger.Activate(req, timeout=20).created

    # every voter hosts the group and agrees on the leader
    lead = wait_for_value(lambda: agreed_leader(nodes, "r"), 10, "one leader of r on every voter")
    victim = nodes[lead - 1]
    clients = [n for n in nodes if n is not victim]

    acked: list[tuple[int, int]] = []  # (n, version) of acknowledged commits
    have: ObjectId | None = None
    n = 1
    killed = False
    stop_at = time.monotonic() + DEADLINE_S
    while n <= COMMITS:
        assert time.monotonic() < stop_at, f"stuck at commit {n}"
        if n == COMMITS // 3 and not killed:
            victim.kill()  # SIGKILL: no clean shutdown
            killed = True
        client = clients[n % 2]
        cmd = encode_command(Commit(1, (RefUpdate(MAIN, have, oid(n)),), None, n, False))
        try:
            resp = client.ledger.Propose(
                ledger_pb2.ProposeRequest(repo="r", incarnation=1, command=cmd), timeout=3
            )
        except grpc.RpcError:
            # outcome unknown: re-read through a barrier before retrying (docs/rpc.md)
            try:
                cur, version = current_main(client, "r")
            except grpc.RpcError:
                time.sleep(0.1)
                continue
            if cur == oid(n):
                acked.append((n, version))
                have, n = oid(n), n + 1
            continue
        change = decode_change(resp.effects)
        assert change.outcome.code is OutcomeCode.OK, change.outcome
        acked.append((n, resp.version))
        have, n = oid(n), n + 1

    assert killed
    assert [a for a, _ in acked] == list(range(1, COMMITS + 1))
    versions = [v for _, v in acked]
    assert versions == sorted(set(versions)), "a version repeated or went back"
    # nothing lost, nothing applied twice: both survivors hold the last commit, and the
    # version counts exactly one applied entry per commit after creation (version 1)
    for c in clients:
        cur, version = current_main(c, "r")
        assert cur == oid(COMMITS)
        assert version == versions[-1]
    assert versions[-1] >= COMMITS + 1


def hosted(p: LedgerProc, repo: str) -> list[tuple[int, bool]]:
    with urllib.request.urlopen(f"http://{p.http_addr}/status?repo={repo}", timeout=5) as r:
        st = json.loads(r.read())
    return [(g["incarnation"], g["deleted"]) for g in st["raft_groups"] if g["repo"] == repo]


def test_seed001_lagging_voter_drops_ended_incarnation_at_startup_and_never_rejoins_it(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """Seed 001, "Why a lagging voter can never write again": a voter that was down keeps
    E untombstoned; at startup it drops E once the object store says that E is deleted or
    superseded, and it never joins an ended incarnation again."""
    nodes = start_three(tmp_path, procs)
    req = ledger_pb2.ActivateRequest(repo="r", create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN)
    assert nodes[0].ledger.Activate(req, timeout=20).state.incarnation == 1
    wait_until(lambda: hosted(nodes[2], "r") == [(1, False)], 10, "the third voter joins")
    assert nodes[2].stop() == 0  # the lagging voter: down through the deletion

    dr = nodes[0].ledger.Delete(ledger_pb2.DeleteRequest(repo="r"), timeout=20)
    assert dr.state.deleted
    again = nodes[1].ledger.Activate(req, timeout=20)
    assert again.created and again.state.incarnation == 2

    lagging = LedgerProc(nodes[2].config).start()
    procs.append(lagging)
    # dropped at startup, before the node said it is ready
    assert (1, False) not in hosted(lagging, "r")

    def on_the_new_incarnation() -> bool:
        groups = hosted(lagging, "r")
        assert (1, False) not in groups, "rejoined the ended incarnation"
        return groups == [(2, False)]

    wait_until(on_the_new_incarnation, 10, "the lagging voter hosts incarnation 2 alone")
    # the lagging voter serves E + 1 and refuses commands for E
    cmd1 = encode_command(Commit(1, (RefUpdate(MAIN, None, oid(1)),), None, 1, False))
    try:
        lagging.ledger.Propose(
            ledger_pb2.ProposeRequest(repo="r", incarnation=1, command=cmd1), timeout=10
        )
        raise AssertionError("a command for the ended incarnation was accepted")
    except grpc.RpcError as e:
        assert error_code(e) == "incarnation_ended"
    cmd2 = encode_command(Commit(2, (RefUpdate(MAIN, None, oid(2)),), None, 1, False))
    resp = lagging.ledger.Propose(
        ledger_pb2.ProposeRequest(repo="r", incarnation=2, command=cmd2), timeout=10
    )
    assert decode_change(resp.effects).outcome.code is OutcomeCode.OK


def test_follower_behind_a_truncated_log_catches_up_by_snapshot(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """DESIGN, "Freezing the ledger": after checkpoints truncate the log, a voter that
    was down catches up from the leader by snapshot."""
    store = tmp_path / "store"
    nodes = start_three(tmp_path, procs, checkpoint_entries=2)
    req = ledger_pb2.ActivateRequest(repo="r", create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN)
    nodes[0].ledger.Activate(req, timeout=20)
    wait_until(lambda: hosted(nodes[2], "r") == [(1, False)], 10, "the third voter joins")
    assert nodes[2].stop() == 0
    have = None
    for n in range(1, 11):
        cmd = encode_command(Commit(1, (RefUpdate(MAIN, have, oid(n)),), None, n, False))
        resp = nodes[n % 2].ledger.Propose(
            ledger_pb2.ProposeRequest(repo="r", incarnation=1, command=cmd), timeout=10
        )
        assert decode_change(resp.effects).outcome.code is OutcomeCode.OK
        have = oid(n)
    last = resp.version
    wait_until(
        lambda: decode_state(read_object(store, state_key("r"))).version >= last - 1,
        10,
        "a checkpoint of the last commits",
    )

    back = LedgerProc(nodes[2].config).start()
    procs.append(back)
    cur, version = current_main(back, "r")
    assert (cur, version) == (oid(10), last)
    with urllib.request.urlopen(f"http://{back.http_addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "enroute_ledger_snapshots_applied_total 0" not in text
    assert "enroute_ledger_snapshots_applied_total" in text
