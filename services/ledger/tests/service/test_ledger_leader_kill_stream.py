"""kill -9 of the leader during a stream of concurrent commits: no acknowledged commit is
lost, none applies twice, and the calls in flight end well before their deadline.

docs/rpc.md, Propose: a member proposes a lost entry again (same request id) when the
group's leader or term changes, and the replicated id window applies it once.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Change,
    Commit,
    Outcome,
    OutcomeCode,
    RefStatus,
    RefUpdate,
    decode_change,
    decode_state,
    encode_command,
)
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import wait_for_value, wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, error_code, start_three  # noqa: E402
from test_ledger_cluster import agreed_leader  # noqa: E402

MAIN = b"refs/heads/main"
COUNTER = b"refs/heads/counter"
CAS_WORKERS = 3
DISTINCT_WORKERS = 3
CALLS_PER_WORKER = 30
KILL_AFTER_ACKED = 24
CALL_TIMEOUT_S = 10.0
IN_FLIGHT_DONE_S = 5.0
"""A call in flight at the kill must end within this: half its deadline."""
RUN_LIMIT_S = 90.0


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


@dataclass
class Call:
    worker: int
    marker: bytes
    node: int
    start: float
    end: float = 0.0
    result: str = ""  # "ok", "stale", or the error code of a failed call


class Stream:
    """Shared by the worker threads: the call log, the kill switch, the live nodes."""

    def __init__(self, nodes: list[LedgerProc]) -> None:
        self.nodes = nodes
        self.dead: int | None = None
        self.killed_at = 0.0
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self.stop_at = time.monotonic() + RUN_LIMIT_S

    def acked(self) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c.result == "ok")

    def target(self, turn: int) -> int:
        live = [i for i in range(len(self.nodes)) if i != self.dead]
        return live[turn % len(live)]

    def propose(self, worker: int, marker: bytes, node: int, cmd: bytes) -> tuple[Call, Change]:
        call = Call(worker, marker, node, time.monotonic())
        with self.lock:
            self.calls.append(call)
        change = Change(Outcome(OutcomeCode.INVALID_ARGUMENT, "no answer"))
        try:
            stub = self.nodes[node].ledger
            resp = stub.Propose(
                ledger_pb2.ProposeRequest(repo="r", incarnation=1, command=cmd),
                timeout=CALL_TIMEOUT_S,
            )
            change = decode_change(resp.effects)
            call.result = "ok" if change.outcome.code is OutcomeCode.OK else "stale"
        except grpc.RpcError as e:
            call.result = error_code(e)
        except ValueError:  # the victim's channel was closed under the call
            call.result = "closed"
        call.end = time.monotonic()
        return call, change


def cas_worker(s: Stream, w: int) -> None:
    """Counter CAS plus a marker ref, atomically: a double apply shows as a second entry
    naming the marker."""
    have: ObjectId | None = None
    for i in range(CALLS_PER_WORKER):
        if time.monotonic() > s.stop_at:
            return
        marker = f"refs/marks/c{w}-{i}".encode()
        nxt = oid(1_000_000) if have is None else oid(int.from_bytes(have, "big") + 1)
        ups = (RefUpdate(COUNTER, have, nxt), RefUpdate(marker, None, oid(w * 1000 + i + 1)))
        cmd = encode_command(Commit(1, ups, None, w * 1000 + i + 1, False, True))
        call, change = s.propose(w, marker, s.target(w + i), cmd)
        if call.result == "ok":
            have = nxt
            continue
        for r in change.refs:
            if r.name == COUNTER and r.status is RefStatus.STALE:
                have = None if r.current is None else r.current.oid


def distinct_worker(s: Stream, w: int) -> None:
    """Creates one new ref per commit: a double apply shows as a second entry naming it."""
    for i in range(CALLS_PER_WORKER):
        if time.monotonic() > s.stop_at:
            return
        ref = f"refs/heads/d{w}-{i}".encode()
        cmd = encode_command(
            Commit(1, (RefUpdate(ref, None, oid(w * 1000 + i + 1)),), None, 1, False)
        )
        s.propose(w, ref, s.target(w + i), cmd)


def changes_since(p: LedgerProc, after: int, until: int) -> list[tuple[int, Change]]:
    call = p.ledger.Subscribe(
        ledger_pb2.SubscribeRequest(repo="r", incarnation=1, after_version=after), timeout=20
    )
    out: list[tuple[int, Change]] = []
    try:
        for _ in range(10 * (until - after) + 10):
            if out and out[-1][0] >= until:
                break
            msg = next(call)
            assert msg.HasField("changes"), "a snapshot instead of the changes since the base"
            out.extend((c.version, decode_change(c.effects)) for c in msg.changes.changes)
    finally:
        call.cancel()
    return out


def barrier_version(p: LedgerProc) -> int:
    def version() -> int | None:
        try:
            return int(p.ledger.Barrier(ledger_pb2.BarrierRequest(repo="r"), timeout=3).version)
        except grpc.RpcError:
            return None  # no leader yet: ask again

    return wait_for_value(version, 20, "a barrier on a survivor", poll_s=0.1)


def state_of(p: LedgerProc) -> dict[bytes, ObjectId]:
    call = p.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo="r"), timeout=10)
    try:
        st = decode_state(next(call).snapshot.data)
    finally:
        call.cancel()
    return {name: v.oid for name, v in st.refs.items()}


def test_leader_kill_during_concurrent_commits_loses_none_repeats_none_and_stalls_none(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes = start_three(tmp_path, procs)
    req = ledger_pb2.ActivateRequest(repo="r", create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN)
    assert nodes[0].ledger.Activate(req, timeout=20).created
    lead = wait_for_value(lambda: agreed_leader(nodes, "r"), 10, "one leader of r on every voter")
    victim = lead - 1
    base = barrier_version(nodes[victim])

    s = Stream(nodes)
    workers = [
        threading.Thread(target=cas_worker, args=(s, w), daemon=True) for w in range(CAS_WORKERS)
    ] + [
        threading.Thread(target=distinct_worker, args=(s, CAS_WORKERS + w), daemon=True)
        for w in range(DISTINCT_WORKERS)
    ]
    for t in workers:
        t.start()
    wait_until(
        lambda: s.acked() >= KILL_AFTER_ACKED,
        s.stop_at - time.monotonic(),
        "the stream gets going",
        poll_s=0.01,
    )
    proc = nodes[victim].proc
    assert proc is not None
    with s.lock:
        s.dead, s.killed_at = victim, time.monotonic()
        in_flight = [c for c in s.calls if not c.end]
    proc.kill()  # SIGKILL, with calls in flight on every node
    for t in workers:
        t.join(RUN_LIMIT_S)
        assert not t.is_alive(), "a worker did not finish"
    proc.wait(10)

    calls = s.calls
    assert in_flight, "no call was in flight at the kill"
    # nothing waits out its deadline: every call ends with an answer or a clean refusal
    stuck = [c for c in calls if c.result in ("timeout", "status:StatusCode.DEADLINE_EXCEEDED")]
    assert not stuck, stuck
    slow = [c for c in in_flight if c.end - c.start > IN_FLIGHT_DONE_S]
    assert not slow, slow
    survivors_in_flight = [c for c in in_flight if c.node != victim]
    clean = ("ok", "stale", "unavailable")  # an answer, or a typed refusal
    assert all(c.result in clean for c in survivors_in_flight), survivors_in_flight

    # the survivors agree, and the change log since the base names each marker once at most
    alive = [nodes[i] for i in range(3) if i != victim]
    final = barrier_version(alive[0])
    assert barrier_version(alive[1]) == final
    changes = changes_since(alive[0], base, final)
    versions = [v for v, _ in changes]
    assert versions == list(range(base + 1, final + 1)), versions
    named = Counter(r.name for _, ch in changes for r in ch.refs if r.name != COUNTER)
    twice = {name for name, n in named.items() if n > 1}
    assert not twice, f"applied twice: {sorted(twice)}"
    ok_markers = {r.name for _, ch in changes for r in ch.refs if r.status is RefStatus.OK}
    refs = state_of(alive[0])
    assert state_of(alive[1]) == refs
    for c in calls:
        if c.result == "ok":
            assert c.marker in ok_markers and c.marker in refs, c
    # the counter moved by one per applied CAS, so no CAS applied twice either
    cas_ok = sum(
        1 for _, ch in changes for r in ch.refs if r.name == COUNTER and r.status is RefStatus.OK
    )
    assert int.from_bytes(refs[COUNTER], "big") == 1_000_000 + cas_ok - 1
