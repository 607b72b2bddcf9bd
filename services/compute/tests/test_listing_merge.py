"""Seed 001, "Listing": the compute merges one page per ledger member.

"For each name, the most advanced answer wins: the newest incarnation, deleted over
live, then the newest version ... The merged page stops at the smallest last name
among nodes that had more, so pages never skip a name."

The first tests feed canned member pages to ListRepositories, one rule each; the last
runs three real ledger processes, one of them frozen (SIGSTOP) while the others move
on, and pages through the merge with a small limit.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, cast

import grpc

from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.ledger_port import ListPage, RepoSummary
from enroute_compute.rpc.servicer import ComputeServicer
from enroute_core.base.ids import ObjectId
from enroute_core.state import Commit, OutcomeCode, RefUpdate, decode_change, encode_command
from enroute_proto.gen.enroute.compute.v1 import compute_pb2
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
MAIN = b"refs/heads/main"


def _ledger_helpers() -> ModuleType:
    """The ledger service tests' process helpers (start, kill, configs), loaded by path."""
    path = ROOT / "services/ledger/tests/service/conftest.py"
    spec = importlib.util.spec_from_file_location("ledger_service_helpers", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ledger_service_helpers", mod)
    spec.loader.exec_module(mod)
    return mod


H = _ledger_helpers()
procs = H.procs  # the fixture: every started ledger process is killed in teardown


class PagesLedger:
    """A ledger port that answers List with fixed member pages (names after start_after)."""

    def __init__(self, members: list[list[RepoSummary]]) -> None:
        self.members = members
        self.calls: list[tuple[str, int]] = []

    async def list(self, start_after: str, limit: int) -> list[ListPage]:
        self.calls.append((start_after, limit))
        pages = []
        for repos in self.members:
            after = [r for r in repos if r.name.encode() > start_after.encode()]
            pages.append(ListPage(tuple(after[:limit]), len(after) > limit))
        return pages


def s(name: str, incarnation: int = 1, version: int = 1, deleted: bool = False) -> RepoSummary:
    return RepoSummary(name, incarnation, version, deleted, MAIN, True, None)


def list_page(ledger: Any, limit: int, token: str = "") -> compute_pb2.ListRepositoriesResponse:
    servicer = ComputeServicer(
        cast(Any, SimpleNamespace(ledger=ledger, state_listeners=[], unhost_listeners=[]))
    )
    req = compute_pb2.ListRepositoriesRequest(limit=limit, page_token=token)
    return asyncio.run(servicer.ListRepositories(req, cast(Any, None)))


def list_all(ledger: Any, limit: int) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    token = ""
    for _ in range(100):
        resp = list_page(ledger, limit, token)
        out += [(r.name, r.incarnation, r.version) for r in resp.repositories]
        assert all(not r.deleted for r in resp.repositories)
        token = resp.next_page_token
        if not token:
            return out
    raise AssertionError("the listing never ended")


def test_newest_incarnation_wins_even_over_a_deleted_older_one() -> None:
    ledger = PagesLedger([[s("a", 1, 9, deleted=True)], [s("a", 2, 10)], [s("a", 1, 5)]])
    assert list_all(ledger, 10) == [("a", 2, 10)]
    ledger = PagesLedger([[s("a", 2, 11, deleted=True)], [s("a", 1, 30)]])
    assert list_all(ledger, 10) == []


def test_deleted_wins_over_live_in_the_same_incarnation() -> None:
    # the deleted answer wins even with a lower version than the live one
    ledger = PagesLedger([[s("a", 1, 7)], [s("a", 1, 3, deleted=True)], [s("b")]])
    assert list_all(ledger, 10) == [("b", 1, 1)]


def test_newest_version_wins_among_live_answers() -> None:
    ledger = PagesLedger([[s("a", 1, 4)], [s("a", 1, 9)], [s("a", 1, 6)]])
    assert list_all(ledger, 10) == [("a", 1, 9)]


def test_merged_page_stops_at_the_smallest_last_name_among_members_with_more() -> None:
    # member 0 knows only early names; member 1 knows late ones; neither is complete
    m0 = [s("a"), s("b"), s("c"), s("d"), s("e")]
    m1 = [s("a"), s("c"), s("x"), s("y"), s("z")]
    ledger = PagesLedger([m0, m1])
    first = list_page(ledger, 2)
    # member 0 stops at b, member 1 at c: the page stops at b, and c waits for page 2
    assert [r.name for r in first.repositories] == ["a", "b"]
    assert first.next_page_token
    assert list_all(ledger, 2) == [(n, 1, 1) for n in "abcdexyz"]


def test_a_page_can_be_short_because_deleted_names_take_places() -> None:
    ledger = PagesLedger([[s("a", deleted=True), s("b", deleted=True), s("c"), s("d")]])
    first = list_page(ledger, 2)
    assert list(first.repositories) == [] and first.next_page_token
    assert list_all(ledger, 2) == [("c", 1, 1), ("d", 1, 1)]


# -- three real ledger processes, one lagging -------------------------------------------------


def _activate(p: Any, name: str) -> ledger_pb2.ActivateResponse:
    """Create ``name``; an explicit create is idempotent, so an answer of unknown outcome
    (docs/rpc.md) is retried."""
    req = ledger_pb2.ActivateRequest(repo=name, create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN)
    for attempt in range(3):
        try:
            got: ledger_pb2.ActivateResponse = p.ledger.Activate(req, timeout=20)
            return got
        except grpc.RpcError as e:
            call: Any = e  # a failed call is also a grpc.Call
            if attempt == 2 or call.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            print(f"create {name}: outcome unknown, retried; {''.join(p.stderr)[-2000:]}")
    raise AssertionError("unreachable")


def _commit(p: Any, name: str, incarnation: int, old: int | None, new: int) -> int:
    up = RefUpdate(
        MAIN,
        None if old is None else ObjectId(old.to_bytes(20, "big")),
        ObjectId(new.to_bytes(20, "big")),
    )
    cmd = encode_command(Commit(incarnation, (up,), None, new, False))
    resp = p.ledger.Propose(
        ledger_pb2.ProposeRequest(repo=name, incarnation=incarnation, command=cmd), timeout=20
    )
    assert decode_change(resp.effects).outcome.code is OutcomeCode.OK
    return int(resp.version)


def _leader_of(p: Any, repo: str) -> int | None:
    with urllib.request.urlopen(f"http://{p.http_addr}/status?repo={repo}", timeout=5) as r:
        st = json.loads(r.read())
    for g in st["raft_groups"]:
        if g["repo"] == repo and not g["deleted"]:
            return int(g["leader"]) if g["leader"] else None
    return None


class RecordingLedger:
    """Passes List through, keeping the first member's pages (the thawed one)."""

    def __init__(self, inner: GrpcLedger) -> None:
        self.inner = inner
        self.first_member: list[RepoSummary] = []

    async def list(self, start_after: str, limit: int) -> list[ListPage]:
        pages = await self.inner.list(start_after, limit)
        self.first_member += pages[0].repos
        return pages


def _behind(r: RepoSummary, expect: dict[str, tuple[int, int] | None]) -> bool:
    want = expect.get(r.name)
    if want is None:
        return not r.deleted
    return (r.incarnation, r.version) != want


def _member_list(p: Any) -> dict[str, tuple[int, bool, int]]:
    resp = p.ledger.List(ledger_pb2.ListRequest(start_after="", limit=1000), timeout=5)
    return {r.name: (r.incarnation, r.deleted, r.version) for r in resp.repositories}


def test_seed001_listing_merges_a_lagging_member_without_skipping_or_regressing(
    tmp_path: Path, procs: list[Any]
) -> None:
    """Seed 001, "Listing": with one member frozen through creates, deletes, re-creates and
    commits, the merged listing (limit 3, every page) shows every live name once, in its
    most advanced state, and no deleted name."""
    nodes = H.start_three(tmp_path, procs)
    first = [f"r{i:02d}" for i in range(12)]
    expect: dict[str, tuple[int, int] | None] = {}  # name -> (incarnation, version) or deleted
    with ThreadPoolExecutor(8) as pool:  # each create waits for its group's first election
        for name, got in zip(first, pool.map(lambda n: _activate(nodes[0], n), first), strict=True):
            expect[name] = (got.state.incarnation, got.state.version)
    wait_until(
        lambda: all(set(_member_list(n)) >= set(first) for n in nodes),
        15,
        "every member lists every created name",
    )
    # A proposal forwarded to a frozen leader is lost and the call waits out the ledger's
    # timeout (docs/rpc.md: outcome unknown), so the names changed while the member is
    # frozen are ones whose group another member leads.
    # Leader spreading must be over too: a node leading more than ceil(groups / nodes) + 1
    # (multiraft/node.py, scenario 4) hands groups to the least-loaded member, which is the
    # one frozen below, and a group it took just before the freeze stalls its writes.
    leaders: dict[str, int] = {}
    fair = -(-len(first) // len(nodes)) + 1

    def settled() -> bool:
        leaders.clear()
        for name in first:
            seen = {_leader_of(n, name) for n in nodes}
            (one,) = seen if len(seen) == 1 else (None,)
            if one is None:
                return False
            leaders[name] = one
        return max(Counter(leaders.values()).values()) <= fair

    wait_until(settled, 15, "one leader per group, spread fairly", explain=lambda: leaders)
    # freeze the member that leads the fewest groups
    lag_id = min((1, 2, 3), key=lambda i: sum(v == i for v in leaders.values()))
    lag = nodes[lag_id - 1]
    up = [n for n in nodes if n is not lag]
    movable = [n for n in first if leaders[n] != lag_id]
    assert len(movable) >= 7, leaders
    deleted, recreated, moved = movable[0:3], movable[3:5], movable[5:7]
    assert lag.proc is not None
    os.kill(lag.proc.pid, signal.SIGSTOP)
    try:
        for name in deleted:
            assert up[0].ledger.Delete(ledger_pb2.DeleteRequest(repo=name), timeout=20)
            expect[name] = None
        for name in recreated:  # deleted and created again: incarnation 2
            up[1].ledger.Delete(ledger_pb2.DeleteRequest(repo=name), timeout=20)
            st = _activate(up[0], name).state
            assert st.incarnation == 2
            expect[name] = (2, st.version)
        for name in moved:  # moved on: newer versions
            v = _commit(up[0], name, 1, None, 1)
            v = _commit(up[1], name, 1, 1, 2)
            expect[name] = (1, v)
        for name in ("q0", "r035", "s0"):  # only the members that were up host these
            st = _activate(up[1], name).state
            expect[name] = (st.incarnation, st.version)
    finally:
        os.kill(lag.proc.pid, signal.SIGCONT)

    want = sorted(((n, *v) for n, v in expect.items() if v is not None), key=lambda t: t[0])

    async def merged() -> list[tuple[str, int, int]]:
        # the thawed member first, so that it answers before it has caught up
        ledger = GrpcLedger((lag.grpc_addr, up[0].grpc_addr, up[1].grpc_addr))
        try:
            out: list[tuple[str, int, int]] = []
            token = ""
            seen = RecordingLedger(ledger)
            servicer = ComputeServicer(
                cast(Any, SimpleNamespace(ledger=seen, state_listeners=[], unhost_listeners=[]))
            )
            while True:
                req = compute_pb2.ListRepositoriesRequest(limit=3, page_token=token)
                resp = await servicer.ListRepositories(req, cast(Any, None))
                out += [(r.name, r.incarnation, r.version) for r in resp.repositories]
                token = resp.next_page_token
                if not token:
                    stale.append(sum(_behind(r, expect) for r in seen.first_member))
                    return out
        finally:
            await ledger.close()

    stale: list[int] = []

    assert asyncio.run(merged()) == want
    print(f"stale answers of the thawed member merged away: {stale[0]}")
    # and again once the lagging member has caught up: the same answer
    wait_until(
        lambda: _member_list(lag) == _member_list(up[0]), 15, "the lagging member catches up"
    )
    assert asyncio.run(merged()) == want
