"""Idle groups leave memory and disk even when followed or deleted (issue 19).

docs/raft.md, "Parked subscriptions": a compute's subscription to an idle group
does not keep its Raft objects and applied state awake; the next write wakes
the group and reaches the subscriber. Seed 001, "Deletion", with
checkpoints.py: a deleted repository's log is compacted to its tombstone at
once (the checkpointer used to stop at a state object that said deleted).
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from pathlib import Path

import grpc
import pytest

from enroute_core.base.ids import LogIndex
from enroute_core.state import decode_state
from enroute_ledger.logstore import open_log_store
from enroute_ledger.machine import decode_snapshot
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing import ledgers

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, start_three, wait_for  # noqa: E402
from test_ledger_idle import metrics  # noqa: E402
from test_ledger_service import MAIN, T, commit, create, oid, propose  # noqa: E402


def start(tmp_path: Path, procs: list[LedgerProc]) -> LedgerProc:
    cfg = ledgers.write_config(
        tmp_path / "l.yaml",
        node_id=1,
        data=tmp_path / "data",
        store=tmp_path / "store",
        ledger={"tick_interval": "20ms", "election_ticks": 10, "hibernate_after": "0.3s"},
    )
    p = LedgerProc(cfg).start()
    procs.append(p)
    return p


def test_a_followed_idle_group_hibernates_and_the_next_write_reaches_its_subscriber(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    p = start(tmp_path, procs)
    for repo in ("followed", "quiet"):
        assert create(p, repo).state.version == 1
    v1 = propose(p, "followed", 1, commit(1, MAIN, None, oid(1))).version

    events: queue.Queue[ledger_pb2.SubscribeResponse] = queue.Queue()
    call = p.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo="followed"), timeout=60)

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled at the end
            for ev in call:
                events.put(ev)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        first = events.get(timeout=T)
        assert first.WhichOneof("event") == "snapshot"
        assert decode_state(first.snapshot.data).version == v1
        # both groups hibernate, the followed one too (it used to stay awake while
        # anybody listened to its change event)
        wait_for(lambda: metrics(p).get("groups_hibernated") == 2, 15)
        woken = metrics(p).get("group_wakes_total", 0.0)

        v2 = propose(p, "followed", 1, commit(1, MAIN, oid(1), oid(2))).version
        ev = events.get(timeout=T)
        assert ev.WhichOneof("event") == "changes"
        assert [c.version for c in ev.changes.changes] == [v2]
        assert metrics(p).get("group_wakes_total", 0.0) > woken
        # parked again once idle, and the next change still arrives
        wait_for(lambda: metrics(p).get("groups_hibernated") == 2, 15)
        v3 = propose(p, "followed", 1, commit(1, MAIN, oid(2), oid(3))).version
        ev = events.get(timeout=T)
        assert [c.version for c in ev.changes.changes] == [v3]
    finally:
        call.cancel()
        reader.join(5)


def test_a_deleted_repository_s_log_is_compacted_to_its_tombstone_at_once(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    p = start(tmp_path, procs)
    assert create(p, "gone").state.version == 1
    have = None
    for n in range(1, 6):
        propose(p, "gone", 1, commit(1, MAIN, have, oid(n)))
        have = oid(n)
    before = metrics(p).get("log_compactions_total", 0.0)
    # checkpoint_entries (10,000) and checkpoint_interval (300 s) are far: only the
    # tombstone rule compacts here
    p.ledger.Delete(ledger_pb2.DeleteRequest(repo="gone"), timeout=T)
    wait_for(lambda: metrics(p).get("log_compactions_total", 0.0) > before, 10)
    # still hosted (seed 001): the name answers deleted, and a create claims E + 1
    d = p.ledger.Describe(ledger_pb2.DescribeRequest(repo="gone"), timeout=T)
    assert d.state.deleted and d.state.incarnation == 1
    assert create(p, "gone").state.incarnation == 2


@pytest.mark.slow
def test_every_voter_keeps_no_log_of_a_deleted_group_beyond_its_tombstone(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """Followers too: only the leader checkpoints, but each voter's disk holds the log.

    A voter ends in one of three ways, all with no entry of the group left on its
    disk: it compacts its own log to the tombstone (it applied the entries); it
    installs the leader's snapshot at the tombstone (it lagged past the leader's
    compaction: its log is replaced, nothing to compact); or it never hosts the group
    (its join read the state object after the delete's swap: seed 001, a node never
    joins an ended incarnation). The check is the disk itself, read after the voters
    stop; a count of compactions alone missed the last two (it was an xfail).
    """
    nodes = start_three(tmp_path, procs)
    p = nodes[0]
    assert create(p, "gone").state.version == 1
    have = None
    for n in range(1, 4):
        propose(p, "gone", 1, commit(1, MAIN, have, oid(n)))
        have = oid(n)
    keys = ("log_compactions_total", "snapshots_applied_total")
    before = [[metrics(n).get(k, 0.0) for k in keys] for n in nodes]
    p.ledger.Delete(ledger_pb2.DeleteRequest(repo="gone"), timeout=T)

    def settled(node: LedgerProc, was: list[float]) -> bool:
        m = metrics(node)
        if any(m.get(k, 0.0) > w for k, w in zip(keys, was, strict=True)):
            return True  # compacted, or installed the leader's tombstone snapshot
        hosted = node.status(repo="gone")["raft_groups"]
        assert isinstance(hosted, list)
        return not hosted  # never joined, and never will: the object says deleted

    wait_for(lambda: all(settled(n, w) for n, w in zip(nodes, before, strict=True)))
    for n in nodes:
        assert n.stop() == 0
    for i in range(1, 4):
        assert log_left(tmp_path / f"d{i}" / "log", "gone") == [], f"voter {i}"


def log_left(path: Path, repo: str) -> list[str]:
    """What voter's store at ``path`` still holds of ``repo``'s groups beyond a deleted
    snapshot: entries after it that hold anything, kept (pinned) entries, or a snapshot
    that is not the tombstone. Empty: the group is gone or holds its tombstone snapshot alone."""
    store = open_log_store(path)
    try:
        out: list[str] = []
        for sg in store.groups():
            if sg.repo != repo.encode():
                continue
            snap = store.snapshot_meta(sg).index
            last, kept = store.last_index(sg), store.kept_indexes(sg)
            after = store.entries(sg, LogIndex(snap + 1), LogIndex(last + 1), 1 << 30)
            # an election's empty entry may follow the tombstone (the SIGTERM of stop()
            # hands the leadership over): it holds nothing
            held = [int(e.index) for e in after if e.data]
            state, _ = decode_snapshot(store.state_get(sg, b"snapshot") or b"")
            if held or kept or state is None or not state.deleted:
                deleted = None if state is None else state.deleted
                out.append(f"{sg}: snapshot {snap} entries {held} kept {sorted(kept)} "
                           f"deleted {deleted}")  # fmt: skip
        return out
    finally:
        store.close()
