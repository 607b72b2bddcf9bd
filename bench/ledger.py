"""Ledger service benchmark: three real voters on 127.0.0.1, fsync on (``synchronous=FULL``).

Starts three ``python -m enroute_ledger`` processes (a fresh data directory each
and a shared ``file://`` store under the system temp dir) and talks to them
through the generated gRPC stubs with commands of ``enroute_core.state``'s codec,
as compute does:

1. one group: sequential Commit proposals with compare-and-swap on one ref,
   then 16 concurrent proposers on the same repository with distinct refs;
2. many groups (1,000; ``--quick`` 100): concurrent proposers spread over the
   repositories, each repository proposed to by one proposer at a time, with
   batching off (one unary ``Propose`` per commit) and on (the compute's
   ``ProposalStream``: one ``ProposeStream`` per member, many proposals per
   message) (target: at least 2,000 commits/s in aggregate);
3. idle cost: activate 10,000 repositories (``--quick`` 1,000), let them go
   quiet, then each process's CPU over 10 s (utime + stime of /proc/<pid>/stat;
   target at most 2% of a core) and its RSS growth per repository (VmRSS
   before and after; target at most 2 KiB each).

Proposals go to the member that leads the repository's group (read from
/status), as a client that follows leaders would. Each member's /metrics show
where a throughput run spent its time (Ready rounds, fsync waits) and what
idle groups still do (awake groups, group ticks, messages); the machine's load
average is recorded, since other processes on the host share its cores. Writes its section to
docs/benchmarks.md (section "ledger"). Usage: ``python -m bench.ledger [--quick]``
from the checkout root; about 6 minutes (``--quick``: about 1).

``--py-spy PATH`` (py-spy, not a dependency of the project: ``pip install py-spy``)
also samples each process while it holds the interpreter lock during one more
batching-on case (:data:`PROFILE_PROPOSERS` proposers) and splits each process's
CPU per commit by phase (:data:`PHASES`): the event-loop timers above count wall
time, which a loaded host inflates, while these samples count only the process's
own work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.report import CLK_TCK, cpu_ticks, write_section
from enroute_compute.ledger_client import ProposalStream
from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Commit,
    OutcomeCode,
    RefStatus,
    RefUpdate,
    decode_change,
    encode_command,
)
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from enroute_testing.ledgers import LedgerProc, start_three
from enroute_testing.ports import free_port

MAIN = b"refs/heads/main"
CALL_TIMEOUT_S = 30.0
ACTIVATE_CONCURRENCY = 32
FLOOR_PROPOSERS = 64
ACTIVATE_TIMEOUT_S = 10.0
GROUPS_BUDGET_S = 120.0
IDLE_CPU_WINDOW_S = 10.0
QUIET_S = 5.0
PROFILE_PROPOSERS = 64
PROFILE_RATE_HZ = 100

PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (phase, frames that put a sample in it): the first phase with a frame in the
    # sample's stack takes it, so the order puts the narrower phases first
    ("store thread: SQLite write and fsync", ("ledger-store-writer",)),
    ("apply: state machine, change encoding", ("Runtime._apply_durable", "Runtime._apply_ready")),
    ("Raft receive: batch decode", ("batch_from_proto",)),
    ("Raft receive: step", ("Runtime.step",)),
    ("Raft receive: gRPC read", ("RaftTransportServicer.Send",)),
    ("Raft send: batch encode", ("batch_to_proto",)),
    ("Raft send: gRPC write", ("GrpcTransport._run",)),
    ("proposals: log line", ("Logger.info",)),
    ("proposals: into Raft", ("Lifecycle.propose",)),
    ("proposals: stream read and answer", ("LedgerServicer.ProposeStream",)),
    ("Ready round: take, write batch, send, advance", ("Runtime.run",)),
    ("ticks", ("Runtime.tick",)),
    ("client: proposals written", ("ProposalStream._write", "ProposalStream.propose")),
    ("client: answers read", ("ProposalStream._read",)),
    ("client: commands built, changes decoded", ("bench/ledger.py",)),
)
OTHER_PHASE = "other: event loop, gRPC callbacks and pollers"


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


@dataclass(frozen=True)
class Result:
    commits: int
    seconds: float
    latencies_s: tuple[float, ...]
    refused: int

    @property
    def per_s(self) -> float:
        return self.commits / self.seconds


def pct(samples: Sequence[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


class Client:
    """One aio channel per member; a repository's calls go to its leader when known."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.channels = [grpc.aio.insecure_channel(a) for a in addresses]
        # aio stubs: the generated annotations describe the blocking ones
        self.stubs: list[Any] = [ledger_pb2_grpc.LedgerStub(c) for c in self.channels]
        # batching on: the compute's ProposeStream per member (off: one Propose per commit)
        self.streams = [ProposalStream(s, a) for s, a in zip(self.stubs, addresses, strict=True)]
        self.batching = False
        self.leader: dict[str, int] = {}
        self.incarnation: dict[str, int] = {}
        self.have: dict[tuple[str, bytes], ObjectId | None] = {}
        self.serial = 0
        self.failed = 0

    def stub_for(self, repo: str) -> Any:
        return self.stubs[self.leader.get(repo, 0)]

    async def activate(self, repo: str) -> bool:
        """Host ``repo`` (creating it); False when the call failed (counted in ``failed``)."""
        req = ledger_pb2.ActivateRequest(
            repo=repo, create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN
        )
        try:
            resp = await self.stubs[hash(repo) % len(self.stubs)].Activate(
                req, timeout=ACTIVATE_TIMEOUT_S
            )
        except grpc.RpcError:
            self.failed += 1
            return False
        self.incarnation[repo] = resp.state.incarnation
        return True

    async def activate_many(self, repos: Sequence[str], concurrency: int) -> float:
        it = iter(repos)

        async def worker() -> None:
            for repo in it:
                if not await self.activate(repo):
                    # an outcome-unknown create: a second call answers the repository
                    await self.activate(repo)

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t

    def learn_leaders(self, node: LedgerProc) -> None:
        """Map repositories to the member index of their group leader (Raft id - 1), as
        ``node``'s /status tells."""
        after = ""
        while True:  # /status lists a bounded page of groups per call (issue 19)
            query = urllib.parse.urlencode({"after": after})
            with urllib.request.urlopen(f"http://{node.http_addr}/status?{query}", timeout=30) as r:
                page = json.loads(r.read())
            for g in page["raft_groups"]:
                if not g["deleted"] and g["leader"]:
                    self.leader[g["repo"]] = int(g["leader"]) - 1
            after = page["raft_groups_next"]
            if not after:
                return

    async def commit(self, repo: str, ref: bytes) -> bool:
        """Move ``ref`` of ``repo`` to a fresh id by compare-and-swap on its last value."""
        self.serial += 1
        new = oid(self.serial)
        inc = self.incarnation[repo]
        old = self.have.get((repo, ref))
        cmd = encode_command(Commit(inc, (RefUpdate(ref, old, new),), None, self.serial, True))
        req = ledger_pb2.ProposeRequest(repo=repo, incarnation=inc, command=cmd)
        try:
            if self.batching:
                resp = await self.streams[self.leader.get(repo, 0)].propose(req, CALL_TIMEOUT_S)
            else:
                resp = await self.stub_for(repo).Propose(req, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError:
            self.failed += 1
            return False
        change = decode_change(resp.effects)
        ok = change.outcome.code is OutcomeCode.OK
        if ok:
            self.have[(repo, ref)] = new
        for r in change.refs:  # refused: a proposal that timed out applied after all
            if not ok and r.name == ref and r.status is RefStatus.STALE:
                self.have[(repo, ref)] = None if r.current is None else r.current.oid
        return ok

    async def close(self) -> None:
        for stream in self.streams:
            stream.close()
        for c in self.channels:
            await c.close()


Lane = Callable[[int], Awaitable[bool]]


async def drive(lanes: Sequence[Lane], seconds: float) -> Result:
    """Run every lane's commits back to back for ``seconds``; each lane is one proposer."""
    lat: list[float] = []
    refused = 0
    stop = time.perf_counter() + seconds

    async def run(lane: Lane) -> None:
        nonlocal refused
        n = 0
        while time.perf_counter() < stop:
            n += 1
            t = time.perf_counter()
            ok = await lane(n)
            lat.append(time.perf_counter() - t)
            refused += not ok

    start = time.perf_counter()
    await asyncio.gather(*(run(lane) for lane in lanes))
    elapsed = time.perf_counter() - start
    return Result(len(lat) - refused, elapsed, tuple(lat), refused)


def ref_lane(c: Client, repo: str, ref: bytes) -> Lane:
    """Commits that move ``ref`` forward by compare-and-swap, one at a time."""

    async def lane(n: int) -> bool:
        return await c.commit(repo, ref)

    return lane


def repos_lane(c: Client, repos: Sequence[str]) -> Lane:
    """One proposer over several repositories in turn, CAS on each one's main."""

    async def lane(n: int) -> bool:
        return await c.commit(repos[n % len(repos)], MAIN)

    return lane


def row(title: str, r: Result, lanes: int) -> str:
    return (
        f"| {title} | {lanes} | {r.commits:,} | {r.per_s:,.0f} | "
        f"{pct(r.latencies_s, 0.5) * 1e3:.1f} | {pct(r.latencies_s, 0.99) * 1e3:.1f} | "
        f"{r.refused} |"
    )


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def node_metrics(node: LedgerProc) -> dict[str, float]:
    """The counters of ``/metrics`` (``enroute_ledger_`` prefix removed)."""
    with urllib.request.urlopen(f"http://{node.http_addr}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            out[name.removeprefix("enroute_ledger_")] = float(value)
    return out


def where_time_went(
    m0: list[dict[str, float]],
    m1: list[dict[str, float]],
    t0: list[int],
    t1: list[int],
    *,
    result: Result,
    title: str,
) -> list[str]:
    """Per member, from /metrics and /proc: where a throughput run spent its time.

    The phases are the runtime's (docs/raft.md, "Commit latency and throughput"): on the
    proposer (the leader here) per answered proposal, on a follower per append.
    """
    seconds = result.seconds
    commits = max(result.commits, 1)
    lines = [
        f"Where the time went: {title} ({result.commits:,} commits; columns: see above).",
        "",
        "| member | rounds/s | groups per round | queue | own fsync | replicate | apply "
        "| answer | follower queue | follower fsync | store COMMIT per round | CPU "
        "| CPU ms per commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ms(x: float) -> str:
        return f"{x * 1e3:.1f}"

    for i, (a, b) in enumerate(zip(m0, m1, strict=True)):

        def d(key: str, a: dict[str, float] = a, b: dict[str, float] = b) -> float:
            return b.get(key, 0.0) - a.get(key, 0.0)

        rounds = max(d("persist_rounds_total"), 1.0)
        n = d("commits_traced_total")
        f = d("follower_appends_total")
        cpu = (t1[i] - t0[i]) / CLK_TCK

        def per(key: str, count: float) -> str:
            return ms(d(key) / count) if count else "-"

        lines.append(
            f"| {i + 1} | {d('persist_rounds_total') / seconds:,.0f} "
            f"| {d('ready_groups_total') / rounds:,.1f} "
            f"| {per('phase_queue_seconds_total', n)} | {per('phase_persist_seconds_total', n)} "
            f"| {per('phase_replicate_seconds_total', n)} | {per('phase_apply_seconds_total', n)} "
            f"| {per('phase_answer_seconds_total', n)} "
            f"| {per('follower_queue_seconds_total', f)} "
            f"| {per('follower_persist_seconds_total', f)} "
            f"| {ms(d('store_commit_seconds_total') / rounds)} "
            f"| {cpu / seconds:.0%} | {cpu / commits * 1e3:.2f} |"
        )
    cpu = (t1[-1] - t0[-1]) / CLK_TCK
    lines.append(
        f"| client | | | | | | | | | | | {cpu / seconds:.0%} | {cpu / commits * 1e3:.2f} |",
    )
    lines += [
        "",
        f"CPU by phase: {title}, ms per commit, from each member's event-loop timers "
        "(wall time of the loop's one thread: on a loaded host a share lost to other "
        "processes counts too, so they are upper bounds) and its CPU (utime + stime); "
        "'rest' is the process CPU the loop timers do not cover: gRPC and the servicers, "
        "request checks, protobuf, logging, the transport's writers, the store thread's "
        "SQLite.",
        "",
        "| member | Ready taken | step peers' batches | persist and send (handle, no wait) "
        "| apply and answer | ticks | rest | CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (a, b) in enumerate(zip(m0, m1, strict=True)):

        def dm(key: str, a: dict[str, float] = a, b: dict[str, float] = b) -> float:
            return (b.get(key, 0.0) - a.get(key, 0.0)) / commits * 1e3

        cpu_ms = (t1[i] - t0[i]) / CLK_TCK / commits * 1e3
        apply = dm("apply_seconds_total")
        handle = dm("ready_seconds_total") - dm("persist_wait_seconds_total") - apply
        parts = [
            dm("ready_take_seconds_total"),
            dm("step_seconds_total"),
            handle,
            apply,
            dm("tick_seconds_total"),
        ]
        cells = " | ".join(f"{x:.3f}" for x in parts)
        lines.append(f"| {i + 1} | {cells} | {cpu_ms - sum(parts):.3f} | {cpu_ms:.3f} |")
    return lines


@dataclass(frozen=True)
class Measured:
    result: Result
    where: list[str]
    cpu_ms: tuple[float, ...]
    """CPU per commit of each member, then of the client."""


async def measured(
    nodes: list[LedgerProc], lanes: Sequence[Lane], seconds: float, title: str
) -> Measured:
    """``drive`` with each member's counters and every process's CPU around it."""
    pids = [*(n.pid for n in nodes), os.getpid()]
    m0 = [node_metrics(n) for n in nodes]
    t0 = [cpu_ticks(p) for p in pids]
    r = await drive(lanes, seconds)
    t1 = [cpu_ticks(p) for p in pids]
    m1 = [node_metrics(n) for n in nodes]
    cpu_ms = tuple((b - a) / CLK_TCK / max(r.commits, 1) * 1e3 for a, b in zip(t0, t1, strict=True))
    return Measured(r, where_time_went(m0, m1, t0, t1, result=r, title=title), cpu_ms)


def phase_of(stack: Sequence[str]) -> str:
    for phase, frames in PHASES:
        if any(f in frame for frame in stack for f in frames):
            return phase
    return OTHER_PHASE


def phase_shares(raw: Path) -> dict[str, float]:
    """Share of a process's samples in each phase, from py-spy's raw output (one
    ``frame;frame;... count`` line per distinct stack, the thread first)."""
    counts: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            phase = phase_of(stack.split(";"))
            counts[phase] = counts.get(phase, 0) + int(n)
    total = sum(counts.values()) or 1
    return {k: v / total for k, v in counts.items()}


async def profiled(
    nodes: list[LedgerProc], lanes: Sequence[Lane], seconds: float, py_spy: str, work: Path
) -> tuple[Measured, list[dict[str, float]]]:
    """``measured`` with py-spy sampling every process (``--gil``: only while it holds
    the interpreter lock, so the samples split the process's own CPU)."""
    pids = [*(n.pid for n in nodes), os.getpid()]
    args = ["record", "--gil", "--threads", "--format", "raw", "--rate", str(PROFILE_RATE_HZ)]
    args += ["--duration", str(round(seconds))]
    spies = [
        subprocess.Popen(
            [py_spy, *args, "--pid", str(pid), "--output", str(work / f"spy-{i}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, pid in enumerate(pids)
    ]
    try:
        m = await measured(nodes, lanes, seconds, "profiled")
    finally:
        for p in spies:
            await asyncio.to_thread(p.wait)
    return m, [phase_shares(work / f"spy-{i}.txt") for i in range(len(pids))]


def phase_lines(m: Measured, shares: list[dict[str, float]]) -> list[str]:
    """Each process's CPU per commit split by its samples' phases, in ms."""
    names = [*(str(i + 1) for i in range(len(shares) - 1)), "client"]
    order = [p for p, _ in PHASES] + [OTHER_PHASE]
    used = [p for p in order if any(s.get(p, 0.0) >= 0.005 for s in shares)]
    lines = [
        f"| phase | {' | '.join(names)} | all |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for p in used:
        cells = [s.get(p, 0.0) * cpu for s, cpu in zip(shares, m.cpu_ms, strict=True)]
        lines.append(f"| {p} | " + " | ".join(f"{x:.3f}" for x in cells) + f" | {sum(cells):.3f} |")
    lines.append(
        "| CPU per commit | "
        + " | ".join(f"{x:.3f}" for x in m.cpu_ms)
        + f" | {sum(m.cpu_ms):.3f} |"
    )
    return lines


def budget_lines(m: Measured, how: str) -> list[str]:
    """What the CPU per commit of the best case means for 2,000 commits/s."""
    voters, total = m.cpu_ms[:-1], sum(m.cpu_ms)
    per_voter = max(voters)
    return [
        f"CPU budget ({how}, best case): the three voters and the client used "
        f"{total:.2f} ms of CPU per commit in all ("
        + " + ".join(f"{x:.2f}" for x in m.cpu_ms)
        + f"), so this machine's {os.cpu_count()} cores carry at most "
        f"{(os.cpu_count() or 1) * 1e3 / total:,.0f} commits/s with all of them on it, "
        f"however many calls are batched; 2,000 commits/s needs at most "
        f"{(os.cpu_count() or 1) * 1e3 / 2000:.2f} ms in all. One voter used at most "
        f"{per_voter:.2f} ms per commit: a voter with a core of its own (one per machine, "
        f"as deployed) carries {1e3 / per_voter:,.0f} commits/s.",
    ]


@dataclass(frozen=True)
class Floor:
    result: Result
    server_ms: float
    client_ms: float


async def floor(seconds: float) -> Floor:
    """The same client and proposers against ``bench.ledger_floor``, whose ``Propose``
    answers at once: the rate and CPU of the calls alone, on this machine."""
    addr = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "bench.ledger_floor", "--listen", addr]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        if not (await asyncio.to_thread(proc.stdout.readline)).startswith("floor ready"):
            raise RuntimeError("bench.ledger_floor exited before it served")
        c = Client([addr])
        repos = [f"f/{i:05d}" for i in range(FLOOR_PROPOSERS)]
        c.incarnation.update(dict.fromkeys(repos, 1))
        try:
            await c.commit(repos[0], MAIN)  # connected before the clock starts
            lanes = [repos_lane(c, repos[k::FLOOR_PROPOSERS]) for k in range(FLOOR_PROPOSERS)]
            pids = [proc.pid, os.getpid()]
            t0 = [cpu_ticks(p) for p in pids]
            r = await drive(lanes, seconds)
            t1 = [cpu_ticks(p) for p in pids]
        finally:
            await c.close()
    finally:
        proc.kill()
        proc.wait()
    server_ms, client_ms = (
        (b - a) / CLK_TCK / max(r.commits, 1) * 1e3 for a, b in zip(t0, t1, strict=True)
    )
    return Floor(r, server_ms, client_ms)


def floor_lines(f: Floor, best: float) -> list[str]:
    cores = (f.server_ms + f.client_ms) * 2000 / 1e3
    return [
        f"Floor: the same client with {FLOOR_PROPOSERS} proposers against "
        "`bench.ledger_floor`, one process whose `Propose` answers at once (no Raft, no "
        f"store, no peers): {f.result.per_s:,.0f} calls/s, p50 "
        f"{pct(f.result.latencies_s, 0.5) * 1e3:.1f} ms; CPU per call {f.server_ms:.2f} ms "
        f"in the server and {f.client_ms:.2f} ms in the client. At 2,000 commits/s the "
        f"calls alone would take {cores:.2f} of this machine's {os.cpu_count()} cores, "
        "before the three voters' Raft, replication, fsync and apply; the best aggregate "
        f"above is {best / f.result.per_s:.0%} of the floor's rate.",
    ]


def loadavg() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_share(pids: Sequence[int], seconds: float) -> list[float]:
    """Fraction of one core each process used over ``seconds`` of wall time."""
    before = [cpu_ticks(p) for p in pids]
    t = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - t
    return [(cpu_ticks(p) - b) / CLK_TCK / wall for p, b in zip(pids, before, strict=True)]


async def bench(
    nodes: list[LedgerProc],
    groups: int,
    idle: int,
    seconds: float,
    *,
    py_spy: str | None = None,
    work: Path | None = None,
) -> list[str]:
    c = Client([n.grpc_addr for n in nodes])
    pids = [n.pid for n in nodes]
    load_start = loadavg()
    empty_cpu = cpu_share(pids, IDLE_CPU_WINDOW_S / 2)  # no group yet: the process's own
    base = await floor(seconds)
    print(f"floor {base.result.per_s:,.0f} calls/s", flush=True)
    out = [
        "Three ledger voters (`python -m enroute_ledger`, default `ledger.*` timing) on "
        "127.0.0.1, each with its own data directory on the local disk (SQLite WAL, "
        "`synchronous=FULL`: fsync on every write round) and a shared `file://` store; "
        "one client process with one `grpc.aio` channel per member. A commit is one "
        "proposal of an atomic `Commit` with one compare-and-swap ref update, answered "
        "once the proposer has applied it: batching off, one unary `Propose` call; "
        "batching on, one proposal on the member's `ProposeStream` (the compute's "
        "`ProposalStream`: the proposals made while a message is written leave together "
        "in the next). Proposals go to the repository's group leader "
        "(from /status). Latency: wall time of one proposal seen by the client; "
        f"each case runs {seconds:g} s.",
        "",
        "| case | proposers | commits | commits/s | p50 ms | p99 ms | refused or failed |",
        "|---|---|---|---|---|---|---|",
    ]
    try:
        await c.activate("one")
        c.learn_leaders(nodes[0])
        wheres: list[str] = [
            "Where the time went, per case and member: Ready rounds written per second and "
            "groups per round; the proposer's phases in ms per commit (queue: proposed until "
            "the Ready that appends it was taken; own fsync: that Ready until durable here; "
            "replicate: durable here until the Ready that brings it committed; apply; answer: "
            "applied until the call returned); a follower's per append (queue: received until "
            "its Ready; fsync: until durable, after which it acknowledges); the store's COMMIT "
            "(WAL write and fsync) per round; CPU of each process as a share of one core and "
            "in ms per commit (what decides the rate a given number of cores can carry).",
            "",
        ]
        title = "1 group, sequential, CAS on one ref"
        m = await measured(nodes, [ref_lane(c, "one", MAIN)], seconds, title)
        r, where = m.result, m.where
        out.append(row(title, r, 1))
        wheres += [*where, ""]
        print(out[-1], flush=True)
        lanes = [ref_lane(c, "one", b"refs/heads/w%02d" % k) for k in range(16)]
        title = "1 group, concurrent, distinct refs"
        m = await measured(nodes, lanes, seconds, title)
        r, where = m.result, m.where
        out.append(row(title, r, 16))
        wheres += [*where, ""]
        print(out[-1], flush=True)

        wanted = [f"g/{i:05d}" for i in range(groups)]
        t = time.perf_counter()
        for i in range(0, groups, 100):
            await c.activate_many(wanted[i : i + 100], ACTIVATE_CONCURRENCY)
            if time.perf_counter() - t > GROUPS_BUDGET_S:
                break
        took = time.perf_counter() - t
        many = [r for r in wanted if r in c.incarnation]
        cut = "" if len(many) == groups else f" (stopped at {len(many):,}: time budget)"
        groups = len(many)
        print(f"activated {groups} groups in {took:.1f} s", flush=True)
        c.learn_leaders(nodes[0])
        spread = [0, 0, 0]
        for repo in many:
            spread[c.leader.get(repo, 0)] += 1
        results: dict[bool, list[Measured]] = {False: [], True: []}
        counts = sorted({min(groups, 64), min(groups, 256), groups})
        # off and on side by side at each count (the host's load drifts); the largest
        # count last, since its calls that time out leave refs the next case must relearn
        cases = [(batching, p) for p in counts for batching in (False, True)]
        for batching, proposers in cases:
            c.batching = batching
            c.learn_leaders(nodes[0])  # leaders move (spreading, elections under load)
            how = "ProposeStream" if batching else "unary Propose"
            lanes = [repos_lane(c, many[k::proposers]) for k in range(proposers)]
            title = f"{groups:,} groups, {proposers} proposers, {how}"
            m = await measured(nodes, lanes, seconds, title)
            r, where = m.result, m.where
            results[batching].append(m)
            out.append(row(f"{groups:,} groups, concurrent, {how}", r, proposers))
            wheres += [*where, ""]
            print(out[-1], flush=True)
        profile: list[str] = []
        if py_spy is not None and work is not None:
            c.batching = True
            c.learn_leaders(nodes[0])
            proposers = min(groups, PROFILE_PROPOSERS)
            lanes = [repos_lane(c, many[k::proposers]) for k in range(proposers)]
            m, shares = await profiled(nodes, lanes, seconds, py_spy, work)
            print(f"profiled {m.result.per_s:,.0f} commits/s", flush=True)
            profile = [
                f"CPU per commit by phase (ms), batching on, {proposers} proposers, one more "
                f"run of {seconds:g} s ({m.result.commits:,} commits, "
                f"{m.result.per_s:,.0f}/s) with py-spy sampling each process at "
                f"{PROFILE_RATE_HZ} Hz while it holds the interpreter lock: a phase's share "
                "of a process's samples times the process's CPU per commit (utime + "
                "stime). Phases by the frames on the sample's stack (`bench.ledger.PHASES`); "
                "members 1 to 3 each lead a third of the groups and follow the rest.",
                "",
                *phase_lines(m, shares),
                "",
            ]
        c.batching = False
        best_off = max(results[False], key=lambda x: x.result.per_s)
        best_on = max(results[True], key=lambda x: x.result.per_s)
        unary, best = best_off.result.per_s, best_on.result.per_s
        out += [
            "",
            f"{groups:,} groups{cut}: activated in {took:.1f} s "
            f"({ACTIVATE_CONCURRENCY} at a time); "
            f"leaders per member {spread[0]} / {spread[1]} / {spread[2]}. "
            f"Best aggregate {best:,.0f} commits/s with batching on (one `ProposeStream` "
            f"per member, many proposals per message), {unary:,.0f} with batching off (one "
            f"unary `Propose` per commit); target at least 2,000 "
            f"({'met' if best >= 2000 else 'NOT met'}).",
            "",
            *floor_lines(base, best),
            "",
            *budget_lines(best_on, "batching on"),
            "",
            *budget_lines(best_off, "batching off"),
            "",
            *profile,
            *wheres,
        ]

        # idle cost
        await asyncio.sleep(QUIET_S)
        base_cpu = cpu_share(pids, IDLE_CPU_WINDOW_S / 2)
        print(f"cpu before idle activations {base_cpu}", flush=True)
        rss0 = [rss_kib(p) for p in pids]
        idle_repos = [f"i/{i:05d}" for i in range(idle)]
        budget_s = 90.0 if idle >= 10_000 else 40.0
        done: list[str] = []
        t = time.perf_counter()
        step = 100
        for i in range(0, idle, step):
            chunk = idle_repos[i : i + step]
            await c.activate_many(chunk, ACTIVATE_CONCURRENCY)
            done += chunk
            if time.perf_counter() - t > budget_s:
                break
        took = time.perf_counter() - t
        hosted = sum(r in c.incarnation for r in done)
        print(f"activated {hosted} idle repositories in {took:.1f} s", flush=True)
        await asyncio.sleep(QUIET_S)
        m0 = [node_metrics(n) for n in nodes]
        cpu = cpu_share(pids, IDLE_CPU_WINDOW_S)
        m1 = [node_metrics(n) for n in nodes]
        rss1 = [rss_kib(p) for p in pids]
        per_repo = [(b - a) / hosted for a, b in zip(rss0, rss1, strict=True)]
        total_groups = hosted + groups + 1
        print(f"idle cpu {cpu} rss/repo KiB {per_repo}", flush=True)
        cut = (
            ""
            if hosted == idle
            else f" (stopped at {hosted:,} of {idle:,}: a {budget_s:.0f} s time budget)"
        )
        out += [
            "### Idle cost",
            "",
            f"Activated {hosted:,} more repositories{cut} in {took:.0f} s "
            f"({hosted / took:,.0f}/s, {ACTIVATE_CONCURRENCY} at a time), so each member "
            f"hosts {total_groups:,} groups; waited {QUIET_S:g} s, then measured each "
            f"process over {IDLE_CPU_WINDOW_S:g} s (utime + stime from /proc/PID/stat). "
            "RSS growth: VmRSS after minus before the activations, divided by "
            f"{hosted:,}. Before the activations ({groups + 1:,} groups) the CPU was "
            + " / ".join(f"{x * 100:.1f}%" for x in base_cpu)
            + ".",
            f"Calls that failed (deadline) over the whole run: {c.failed}.",
            "",
            "Raft work in the window, from each member's /metrics: awake groups at its "
            "end, group ticks, per-group messages and coalesced heartbeats sent, and "
            "batches sent (empty liveness beats included).",
            "",
            "| member | CPU (% of a core) | VmRSS before MiB | after MiB | KiB per repository "
            "| awake groups | group ticks | messages | heartbeats | batches |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for i in range(3):

            def delta(key: str, i: int = i) -> int:
                return int(m1[i][key] - m0[i][key])

            out.append(
                f"| {i + 1} | {cpu[i] * 100:.2f} | {rss0[i] / 1024:.0f} | {rss1[i] / 1024:.0f} "
                f"| {per_repo[i]:.2f} | {int(m1[i]['groups_active'])} "
                f"| {delta('raft_group_ticks_total')} | {delta('raft_messages_out_total')} "
                f"| {delta('raft_heartbeats_out_total')} | {delta('raft_batches_out_total')} |"
            )
        added = [after - before for before, after in zip(base_cpu, cpu, strict=True)]
        cpu_ok = max(added) <= 0.02
        rss_ok = max(per_repo) <= 2.0
        out += [
            "",
            "Targets, for what the idle repositories cost (both as growth over the same "
            "ledgers before the activations): CPU at most 2% of a core "
            f"({'met' if cpu_ok else 'NOT met'}: worst {max(added) * 100:+.2f}%, the process "
            f"in all {max(cpu) * 100:.2f}%; with no group at all it used "
            + " / ".join(f"{x * 100:.1f}%" for x in empty_cpu)
            + ": gRPC pollers, HTTP server, the 0.1 s tick, liveness beats); RSS at "
            f"most 2 KiB per repository ({'met' if rss_ok else 'NOT met'}: worst "
            f"{max(per_repo):.2f} KiB).",
            "",
            f"Load average of the machine (1 / 5 / 15 min) at the start: {load_start}; "
            f"at the end: {loadavg()} (every process on the host counts, not only these). "
            f"The benchmark ran at nice {os.nice(0)}, and the voters it starts inherit it: "
            "on a host shared with other work, they get the CPU that work leaves.",
            "",
        ]
    finally:
        await c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="100 groups, 1,000 idle repositories")
    ap.add_argument("--seconds", type=float, default=None, help="per throughput case")
    ap.add_argument("--py-spy", default=None, help="py-spy executable: CPU per commit by phase")
    args = ap.parse_args()
    groups, idle = (100, 1000) if args.quick else (1000, 10_000)
    seconds = args.seconds if args.seconds is not None else (3.0 if args.quick else 8.0)
    # SIGTERM (e.g. from `timeout`) unwinds through the finally below too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    started: list[LedgerProc] = []
    try:
        nodes = start_three(work, started)
        lines = asyncio.run(bench(nodes, groups, idle, seconds, py_spy=args.py_spy, work=work))
    finally:
        for p in started:
            p.kill()
        shutil.rmtree(work, ignore_errors=True)
    write_section("ledger", lines)


if __name__ == "__main__":
    main()
