"""A real single-voter ledger process, end to end over gRPC (seed 001, docs/rpc.md)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import grpc
import pytest

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Commit,
    OutcomeCode,
    RefStatus,
    RefUpdate,
    decode_change,
    decode_state,
    encode_command,
)
from enroute_core.state.names import state_key, trash_key
from enroute_core.storage.objectstore import open_store
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, error_code, write_config  # noqa: E402

MAIN = b"refs/heads/main"
EXPLICIT = ledger_pb2.CREATE_MODE_EXPLICIT
T = 10.0


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def commit(inc: int, name: bytes, old: ObjectId | None, new: ObjectId | None) -> bytes:
    return encode_command(Commit(inc, (RefUpdate(name, old, new),), None, 1_000_000, False))


def propose(p: LedgerProc, repo: str, inc: int, cmd: bytes) -> ledger_pb2.ProposeResponse:
    req = ledger_pb2.ProposeRequest(repo=repo, incarnation=inc, command=cmd)
    resp: ledger_pb2.ProposeResponse = p.ledger.Propose(req, timeout=T)
    return resp


def create(p: LedgerProc, repo: str) -> ledger_pb2.ActivateResponse:
    req = ledger_pb2.ActivateRequest(repo=repo, create=EXPLICIT, head=MAIN)
    resp: ledger_pb2.ActivateResponse = p.ledger.Activate(req, timeout=T)
    return resp


def read_object(store_dir: Path, key: str) -> bytes:
    async def go() -> bytes:
        st = open_store(f"file://{store_dir}")
        try:
            return await st.get(key)
        finally:
            await st.close()

    return asyncio.run(go())


def expect_error(code: str, fn: object, *args: object) -> None:
    with pytest.raises(grpc.RpcError) as ei:
        fn(*args, timeout=T)  # type: ignore[operator]
    assert error_code(ei.value) == code


def test_single_voter_lifecycle_end_to_end_and_restart(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    store = tmp_path / "store"
    cfg = write_config(tmp_path / "l.yaml", node_id=1, data=tmp_path / "data", store=store)
    p = LedgerProc(cfg).start()
    procs.append(p)

    # seed 001, Creation: the create claims incarnation 1; creating again changes nothing
    got = create(p, "team/app")
    assert got.created and got.state.incarnation == 1 and got.state.version == 1
    assert got.state.head == MAIN and got.state.head_kept and not got.state.deleted
    again = create(p, "team/app")
    assert not again.created and again.state.incarnation == 1
    assert decode_state(read_object(store, state_key("team/app"))).incarnation == 1
    d = p.ledger.Describe(ledger_pb2.DescribeRequest(repo="team/app"), timeout=T)
    assert d.state.incarnation == 1 and d.state.name == "team/app"
    expect_error("not_found", p.ledger.Describe, ledger_pb2.DescribeRequest(repo="nope"))
    expect_error("invalid_name", p.ledger.Describe, ledger_pb2.DescribeRequest(repo="../x"))
    expect_error("not_found", p.ledger.Activate, ledger_pb2.ActivateRequest(repo="nope"))

    # refs.cas through the log: a stale expectation is a result, not an error
    r1 = propose(p, "team/app", 1, commit(1, MAIN, None, oid(1)))
    ch = decode_change(r1.effects)
    assert ch.outcome.code is OutcomeCode.OK and r1.version == 2
    stale = decode_change(propose(p, "team/app", 1, commit(1, MAIN, None, oid(2))).effects)
    assert stale.outcome.code is OutcomeCode.STALE_REF
    assert stale.refs[0].status is RefStatus.STALE and stale.refs[0].current is not None
    assert stale.refs[0].current.oid == oid(1)
    r3 = propose(p, "team/app", 1, commit(1, MAIN, oid(1), oid(3)))
    assert decode_change(r3.effects).outcome.code is OutcomeCode.OK

    # Subscribe: snapshot first, then every change in version order
    call = p.ledger.Subscribe(
        ledger_pb2.SubscribeRequest(repo="team/app", after_version=0), timeout=T
    )
    first = next(call)
    assert first.WhichOneof("event") == "snapshot" and first.snapshot.last
    snap = decode_state(first.snapshot.data)
    assert snap.refs[MAIN].oid == oid(3) and snap.version == r3.version
    r4 = propose(p, "team/app", 1, commit(1, b"refs/heads/dev", None, oid(4)))
    nxt = next(call)
    assert nxt.WhichOneof("event") == "changes"
    assert [c.version for c in nxt.changes.changes] == [r4.version]
    assert decode_change(nxt.changes.changes[0].effects).outcome.code is OutcomeCode.OK
    call.cancel()

    b = p.ledger.Barrier(ledger_pb2.BarrierRequest(repo="team/app"), timeout=T)
    assert (b.incarnation, b.version, b.deleted) == (1, r4.version, False)

    # List: name order, pages with a `more` flag
    for name in ("b", "a/x", "c"):
        create(p, name)
    page1 = p.ledger.List(ledger_pb2.ListRequest(limit=2), timeout=T)
    assert [r.name for r in page1.repositories] == ["a/x", "b"] and page1.more
    page2 = p.ledger.List(ledger_pb2.ListRequest(start_after="b", limit=2), timeout=T)
    assert [r.name for r in page2.repositories] == ["c", "team/app"] and not page2.more

    # seed 001, Deletion: tombstone, trash marker, state object says deleted on return
    last_v = r4.version
    dr = p.ledger.Delete(ledger_pb2.DeleteRequest(repo="team/app"), timeout=T)
    assert dr.state.deleted and dr.state.incarnation == 1 and dr.state.version == last_v + 1
    obj = decode_state(read_object(store, state_key("team/app")))
    assert obj.deleted and obj.incarnation == 1
    marker = json.loads(read_object(store, trash_key("team/app", 1)))
    assert marker["last_upload_gen"] == obj.upload_gen
    assert p.ledger.Delete(ledger_pb2.DeleteRequest(repo="team/app"), timeout=T).state.deleted
    assert not p.ledger.Delete(ledger_pb2.DeleteRequest(repo="never"), timeout=T).HasField("state")
    expect_error("not_found", p.ledger.Activate, ledger_pb2.ActivateRequest(repo="team/app"))
    dd = p.ledger.Describe(ledger_pb2.DescribeRequest(repo="team/app"), timeout=T)
    assert dd.state.deleted
    # "Every later command in E is refused as deleted, on the node before it reaches the log"
    stale_e1 = ledger_pb2.ProposeRequest(
        repo="team/app", incarnation=1, command=commit(1, MAIN, oid(3), oid(5))
    )
    expect_error("incarnation_ended", p.ledger.Propose, stale_e1)
    listed = p.ledger.List(ledger_pb2.ListRequest(), timeout=T)
    assert [(r.name, r.deleted) for r in listed.repositories][-1] == ("team/app", True)

    # seed 001: a create claims E + 1 from the deleted state, version = last + 1
    re = create(p, "team/app")
    assert re.created and re.state.incarnation == 2 and re.state.version == last_v + 2
    # seed 001, "Commands prepared against a deleted incarnation": refused in E + 1
    expect_error("incarnation_ended", p.ledger.Propose, stale_e1)
    r5 = propose(p, "team/app", 2, commit(2, MAIN, None, oid(6)))
    assert decode_change(r5.effects).outcome.code is OutcomeCode.OK

    # restart: everything acknowledged is still there
    assert p.stop() == 0
    p2 = LedgerProc(cfg).start()
    procs.append(p2)
    d2 = p2.ledger.Describe(ledger_pb2.DescribeRequest(repo="team/app"), timeout=T)
    assert (d2.state.incarnation, d2.state.version) == (2, r5.version)
    call = p2.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo="team/app"), timeout=T)
    s2 = decode_state(next(call).snapshot.data)
    call.cancel()
    assert dict((k, v.oid) for k, v in s2.refs.items()) == {MAIN: oid(6)}
    names = [r.name for r in p2.ledger.List(ledger_pb2.ListRequest(), timeout=T).repositories]
    assert names == ["a/x", "b", "c", "team/app"]
    r6 = propose(p2, "team/app", 2, commit(2, MAIN, oid(6), oid(7)))
    assert r6.version == r5.version + 1
    assert p2.stop() == 0


def test_http_status_and_metrics(tmp_path: Path, procs: list[LedgerProc]) -> None:
    import urllib.request

    cfg = write_config(
        tmp_path / "l.yaml", node_id=1, data=tmp_path / "data", store=tmp_path / "store"
    )
    p = LedgerProc(cfg).start()
    procs.append(p)
    create(p, "x")
    base = f"http://{p.http_addr}"
    with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(base + "/status", timeout=5) as r:
        st = json.loads(r.read())
    assert st["role"] == "ledger" and st["hosted_repositories"] == 1
    assert st["raft_groups"][0]["leader"] == st["node_id"]
    # one repository's groups, and pages in name order (issue 19: /status is bounded)
    create(p, "y")
    with urllib.request.urlopen(base + "/status?repo=y", timeout=5) as r:
        assert [g["repo"] for g in json.loads(r.read())["raft_groups"]] == ["y"]
    with urllib.request.urlopen(base + "/status?after=", timeout=5) as r:
        page = json.loads(r.read())
    assert [g["repo"] for g in page["raft_groups"]] == ["x", "y"] and page["raft_groups_next"] == ""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "enroute_ledger_groups 2.0" in text
    t0 = time.monotonic()
    assert p.stop() == 0
    assert time.monotonic() - t0 < 5


def write_object(store_dir: Path, key: str, data: bytes) -> None:
    async def go() -> None:
        st = open_store(f"file://{store_dir}")
        try:
            await st.put(key, data)
        finally:
            await st.close()

    asyncio.run(go())


def test_seed001_crash_between_tombstone_and_state_object_is_finished_by_activation(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """Seed 001, Deletion step 2: "A crash between the two steps is finished by the next
    checkpoint, or by the next activation of a node that applied the tombstone"."""
    store = tmp_path / "store"
    cfg = write_config(tmp_path / "l.yaml", node_id=1, data=tmp_path / "data", store=store)
    p = LedgerProc(cfg).start()
    procs.append(p)
    create(p, "r")
    live = read_object(store, state_key("r"))
    assert p.ledger.Delete(ledger_pb2.DeleteRequest(repo="r"), timeout=T).state.deleted
    # as if the node crashed after the tombstone applied, before the swap
    write_object(store, state_key("r"), live)
    assert p.stop() == 0
    p2 = LedgerProc(cfg).start()
    procs.append(p2)
    # startup (or the activation below) finishes the deletion
    expect_error("not_found", p2.ledger.Activate, ledger_pb2.ActivateRequest(repo="r"))
    obj = decode_state(read_object(store, state_key("r")))
    assert obj.deleted and obj.incarnation == 1
    # and subscribing with incarnation 0 and a version answers the deletion snapshot
    call = p2.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo="r"), timeout=T)
    assert decode_state(next(call).snapshot.data).deleted
    assert list(call) == []  # the deleted state is the last event: the call ends OK
