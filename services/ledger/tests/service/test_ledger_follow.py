"""Ledger.Follow on real ledger processes (docs/rpc.md, Follow; issue 19).

A compute follows every repository it has a view of on one Follow call per
member, through ``GrpcLedger.subscribe`` as the host's followers do. Checked
here: many repositories on one call each see every change once and in order; a
follow the compute leaves (a view evicted) gets nothing more and leaves no
cursor on the member; a followed idle group still hibernates; a member killed
under its follows fails every one of them over at once, and each resumes on
another member from its own version with nothing missed or repeated.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.ledger_port import ChangeEvent, SnapshotEvent
from enroute_core.base.errors import Timeout, Unavailable
from enroute_core.storage.heap import trim_free_heap
from enroute_ledger.follow import Cursor
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from enroute_testing import ledgers
from enroute_testing.ledgers import start_three
from enroute_testing.procmem import memory
from enroute_testing.waiting import wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc  # noqa: E402
from test_ledger_cluster import leader_of  # noqa: E402
from test_ledger_idle import metrics  # noqa: E402
from test_ledger_service import commit, create, oid  # noqa: E402

T = 20.0
FAST = {"tick_interval": "20ms", "election_ticks": 10, "hibernate_after": "0.3s"}


def start_one(tmp_path: Path, procs: list[LedgerProc]) -> LedgerProc:
    cfg = ledgers.write_config(
        tmp_path / "l.yaml",
        node_id=1,
        data=tmp_path / "data",
        store=tmp_path / "store",
        ledger=FAST,
    )
    p = LedgerProc(cfg).start()
    procs.append(p)
    return p


def push(nodes: list[LedgerProc], repo: str, n: int) -> int:
    """Commit a new ref ``n`` to ``repo`` through whichever member answers; its version."""
    req = ledger_pb2.ProposeRequest(
        repo=repo,
        incarnation=1,
        command=commit(1, b"refs/heads/r%05d" % n, None, oid(n + 1)),
        request_id=n.to_bytes(8, "big") + repo.encode()[-8:].rjust(8, b"-"),
    )
    last: Exception | None = None
    for _ in range(60):
        for p in nodes:
            try:
                resp: ledger_pb2.ProposeResponse = p.ledger.Propose(req, timeout=5)
                return resp.version
            except grpc.RpcError as e:
                last = e
    raise AssertionError(f"no member took the proposal: {last}")


class Follower:
    """What the host's follower does with ``subscribe``: apply each event, follow again
    from the last version after a stream ends or fails (enroute_compute.host)."""

    def __init__(self, ledger: GrpcLedger, repo: str) -> None:
        self.ledger = ledger
        self.repo = repo
        self.version = 0
        self.snapshots: list[int] = []
        self.changes: list[int] = []
        self.resumed = 0
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        while True:
            try:
                async for ev in self.ledger.subscribe(self.repo, 1, self.version):
                    if isinstance(ev, SnapshotEvent):
                        self.snapshots.append(ev.state.version)
                        self.version = ev.state.version
                    else:
                        assert isinstance(ev, ChangeEvent)
                        self.changes.append(ev.version)
                        # every change once, in order: the next version, none skipped
                        assert ev.version == self.version + 1, (self.repo, ev.version)
                        self.version = ev.version
            except (Unavailable, Timeout):
                pass
            self.resumed += 1
            await asyncio.sleep(0.05)


async def until(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not cond():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


async def pushed(nodes: list[LedgerProc], repo: str, n: int) -> int:
    return await asyncio.to_thread(push, nodes, repo, n)


def open_follows(p: LedgerProc) -> float:
    m = metrics(p)
    return float(m["subscriptions_total"] - m["subscriptions_ended_total"])


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())  # type: ignore[arg-type]


def test_many_repositories_on_one_stream_see_every_change_in_order_and_unfollow_stops(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    p = start_one(tmp_path, procs)
    repos = [f"f/{i:02d}" for i in range(12)]
    for r in repos:
        assert create(p, r).state.version == 1

    async def main() -> None:
        ledger = GrpcLedger((p.grpc_addr,), timeout_s=T)
        try:
            fs = {r: Follower(ledger, r) for r in repos}
            await until(lambda: all(f.version == 1 for f in fs.values()), T, "snapshots")
            m = metrics(p)
            # one call carries every follow, each counted as a subscription
            assert m["follow_streams_total"] - m.get("follow_streams_ended_total", 0) == 1
            assert m["subscriptions_total"] - m["subscriptions_ended_total"] == len(repos)
            # every group hibernates while followed
            await until(lambda: metrics(p)["groups_hibernated"] == len(repos), T, "hibernated")
            # and stay parked while followed and idle: nothing wakes them
            woken = metrics(p)["group_wakes_total"]
            await asyncio.sleep(1.0)
            assert metrics(p)["group_wakes_total"] == woken
            assert metrics(p)["groups_hibernated"] == len(repos)

            # interleaved commits to every repository
            n = 0
            for _ in range(5):
                for r in repos:
                    n += 1
                    await pushed([p], r, n)
            await until(lambda: all(f.version == 6 for f in fs.values()), T, "every change")
            for f in fs.values():
                assert f.snapshots == [1] and f.changes == [2, 3, 4, 5, 6] and not f.resumed

            # a view evicted: its follower task cancelled; the compute sends Unfollow
            gone = fs.pop(repos[0])
            gone.task.cancel()
            await asyncio.gather(gone.task, return_exceptions=True)
            await until(lambda: open_follows(p) == len(repos) - 1, T, "the member forgot it")
            for _ in range(3):
                n += 1
                await pushed([p], repos[0], n)
                n += 1
                await pushed([p], repos[1], n)
            await until(lambda: fs[repos[1]].version == 9, T, "the other follow goes on")
            await asyncio.sleep(0.3)
            assert gone.version == 6 and gone.changes == [2, 3, 4, 5, 6]
            # still one call: no call opened or cancelled per view
            m = metrics(p)
            assert m["follow_streams_total"] == 1 and m.get("follow_streams_ended_total", 0) == 0
            for f in fs.values():
                f.task.cancel()
        finally:
            await ledger.close()

    run(main)


def test_a_killed_member_fails_every_follow_over_to_another_from_its_own_version(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes = start_three(tmp_path, procs, ledger=FAST)
    repos = [f"k/{i:02d}" for i in range(10)]
    for r in repos:
        assert create(nodes[0], r).state.incarnation == 1
    wait_until(lambda: all(leader_of(nodes[0], r) for r in repos), 30, "a leader of every group")

    async def main() -> None:
        ledger = GrpcLedger(tuple(n.grpc_addr for n in nodes), timeout_s=T)
        try:
            fs = {r: Follower(ledger, r) for r in repos}
            await until(lambda: all(f.version == 1 for f in fs.values()), T, "snapshots")
            # the repositories stand at different versions when the member goes
            n = 0
            for k, r in enumerate(repos):
                for _ in range(k % 4):
                    n += 1
                    await pushed(nodes, r, n)
            want = {r: 1 + k % 4 for k, r in enumerate(repos)}
            await until(lambda: all(fs[r].version == want[r] for r in repos), T, "caught up")
            assert metrics(nodes[0])["subscriptions_total"] == len(repos)

            nodes[0].kill()
            rest = nodes[1:]
            for r in repos:
                for _ in range(2):
                    n += 1
                    await pushed(rest, r, n)
                    want[r] += 1
            await until(lambda: all(fs[r].version == want[r] for r in repos), 60, "resumed")
            for r in repos:
                f = fs[r]
                # resumed once, from its own version: changes only, nothing missed or twice
                assert f.snapshots == [1], (r, f.snapshots)
                assert f.changes == list(range(2, want[r] + 1)), (r, f.changes)
                assert f.resumed >= 1
            # all of them on one call on one surviving member
            opened = [metrics(q)["follow_streams_total"] for q in rest]
            assert sorted(opened) == [0, 1], opened
            for f in fs.values():
                f.task.cancel()
        finally:
            await ledger.close()

    run(main)


class PreviousRelease(ledger_pb2_grpc.LedgerServicer):
    """A member of the release before Follow (a rolling upgrade): the real ledger's
    Subscribe through a forwarder whose servicer has no Follow, which the generated
    base answers UNIMPLEMENTED as an older ledger does."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub: Any = ledger_pb2_grpc.LedgerStub(self.channel)

    async def Subscribe(self, request: Any, context: Any) -> Any:  # noqa: N802
        async for msg in self.stub.Subscribe(request):
            yield msg


def test_a_member_without_follow_gets_subscribe_calls(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    p = start_one(tmp_path, procs)
    assert create(p, "old").state.version == 1

    async def main() -> None:
        older = PreviousRelease(p.grpc_addr)
        server = grpc.aio.server()
        ledger_pb2_grpc.add_LedgerServicer_to_server(older, server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        ledger = GrpcLedger((address,), timeout_s=T)
        try:
            first = Follower(ledger, "old")
            await until(lambda: first.version == 1, T, "the snapshot through Subscribe")
            v = await pushed([p], "old", 1)
            await until(lambda: first.version == v, T, "the change through Subscribe")
            assert first.snapshots == [1] and first.changes == [v] and not first.resumed
            assert ledger._muxes[address].unimplemented  # asked once, then Subscribe
            first.task.cancel()
            await asyncio.gather(first.task, return_exceptions=True)
            again = Follower(ledger, "old")
            await until(lambda: again.version == v, T, "a later follow through Subscribe")
            again.task.cancel()
            await asyncio.gather(again.task, return_exceptions=True)
            m = metrics(p)
            assert m["follow_streams_total"] == 0 and m["subscriptions_total"] == 2
        finally:
            await ledger.close()
            await server.stop(None)
            await older.channel.close()

    run(main)


def test_a_cursor_is_small_and_holds_no_task() -> None:
    """What a parked follow costs the member: the cursor's slots, no task, no event."""
    assert set(Cursor.__slots__) == {
        "closed",
        "group",
        "id",
        "incarnation",
        "job",
        "pending",
        "repo",
        "sent",
        "stream",
    }
    assert sys.getsizeof(object.__new__(Cursor)) <= 120


CHURN_CYCLES = 2_000
CHURN_STEPS = 5
CHURN_SLOPE_BYTES_MAX = 40
"""Bound on the resident anonymous memory a follow and unfollow cycle may leave in the
compute (least squares over the steps). A Subscribe call cancelled by the compute left
143 to 200 bytes of C heap each in grpc.aio (grpc/grpc#43360; docs/fleet.md)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [  # glibc's struct mallinfo2, mallinfo(3)
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def c_heap_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (``uordblks`` + ``hblkhd``):
    what a leak of small C allocations moves, while the resident set hides it in pages
    that were resident already."""
    fn = ctypes.CDLL(None).mallinfo2
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


async def churn(ledger: GrpcLedger, repo: str, cycles: int) -> list[tuple[int, int, int]]:
    """Open a view's subscription, take its snapshot, evict it (cancel the follower task,
    as ``RepositoryHost._evict`` does) ``cycles`` times; the compute's (this process's)
    C heap in use and ``RssAnon`` after a full collection and a heap trim at each step."""
    points: list[tuple[int, int, int]] = []
    step = cycles // CHURN_STEPS

    async def view(got: asyncio.Event) -> None:
        async for _ in ledger.subscribe(repo, 1, 0):
            got.set()

    for i in range(1, cycles + step // 4 + 1):
        got = asyncio.Event()
        task = asyncio.get_running_loop().create_task(view(got))
        await got.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        done = i - step // 4  # the first quarter step warms the caches and the call up
        if done > 0 and done % step == 0:
            await asyncio.sleep(0.05)  # the Unfollow and the cancellations are sent
            gc.collect()
            trim_free_heap()
            points.append((done, c_heap_in_use(), memory(os.getpid()).anon_bytes))
    return points


def slope(points: list[tuple[int, int, int]], column: int) -> float:
    xs = [p[0] for p in points]
    ys = [p[column] for p in points]
    return float(statistics.linear_regression(xs, ys).slope)


@pytest.mark.slow
def test_follow_and_unfollow_churn_leaves_no_memory_in_the_compute_or_the_member(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """2,000 views opened and evicted on Follow: the compute's C heap in use and
    resident anonymous memory stay flat, and so does the member's. The same churn on
    Subscribe calls (the path before, kept for one release) is measured too and
    printed, not asserted: it is gRPC's leak, and an upstream fix would make it flat."""
    p = start_one(tmp_path, procs)
    assert create(p, "churn").state.version == 1

    async def main(follow_streams: bool) -> tuple[list[tuple[int, int, int]], int]:
        ledger = GrpcLedger((p.grpc_addr,), timeout_s=T, follow_streams=follow_streams)
        try:
            member_before = memory(p.pid).anon_bytes
            points = await churn(ledger, "churn", CHURN_CYCLES)
            await until(lambda: open_follows(p) == 0, T, "every follow ended on the member")
            return points, memory(p.pid).anon_bytes - member_before
        finally:
            await ledger.close()

    new, member_new = asyncio.run(main(True))
    old, member_old = asyncio.run(main(False))
    print(
        f"compute per cycle (C heap in use, RssAnon): Follow {slope(new, 1):.1f} B, "
        f"{slope(new, 2):.1f} B; Subscribe {slope(old, 1):.1f} B, {slope(old, 2):.1f} B; "
        f"member RssAnon over {CHURN_CYCLES:,} cycles: Follow {member_new // 1024} KiB, "
        f"Subscribe {member_old // 1024} KiB; steps {new} / {old}"
    )
    m = metrics(p)
    assert m["follow_streams_total"] == 1  # one call carried all 2,000 follows
    assert slope(new, 1) <= CHURN_SLOPE_BYTES_MAX, new
    assert slope(new, 2) <= CHURN_SLOPE_BYTES_MAX * 4, new  # pages: coarser
