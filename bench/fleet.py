"""Fleet benchmark: what an idle repository costs each role of a real local cluster.

Issue 19, "Measured idle cost". Starts the cluster of ``enroute_testing.cluster``
(three ledger voters, two computes, one gitproto, SeaweedFS as the object store,
every role a separate process on 127.0.0.1) and:

1. creates repositories through the API, pushes a 3-commit history to each and clones
   each once (``--concurrency`` at a time; ``enroute_testing.fleet``: git makes the
   pack once, and each push and clone is the smart-HTTP request git sends, so two
   cores go to the servers and not to 20 client processes per repository), in
   ``--points`` equal steps up to ``--repos``; after each step the cluster is left
   idle for ``--idle-seconds`` (default 60);
2. at each step reads each process's RSS (``VmRSS``), its CPU over ``--cpu-seconds``
   of the idle time (utime + stime, as ``bench/ledger.py`` measures it), the series
   count of its /metrics and the size of its /status;
3. pages through every repository through the REST API
   (``GET /api/v1/repos?limit=1000&page_token=``), timing each page;
4. times what an evicted view costs the next request (docs/fleet.md): ``git
   ls-remote`` and a clone of repositories whose views were evicted (an Activate, a
   Subscribe and its snapshot first), then the same again with the views open.

The computes run with ``limits.view_idle_ms_max`` set to ``--view-idle-seconds``
(default 30, under the idle time), so views of idle repositories are evicted, with
their subscriptions, before each measurement.

It reports, per process, the RSS at each step and its slope per repository (a
least-squares line through the steps; target: at most 2 KiB on each ledger and each
compute), idle CPU at the first and the last step (target: growth within 2% of a
core), and the listing's pages, then writes the section "fleet" of
docs/benchmarks.md. Usage: ``python -m bench.fleet [--repos N]`` from the checkout
root (default 2,000; the issue's figure is 10,000).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import CLK_TCK, ROOT, cpu_ticks, write_section
from enroute_testing.cluster import COMPUTES, GITPROTO, LEDGERS, Cluster, running_cluster
from enroute_testing.fleet import Populated, Seed, make_seed, populate
from enroute_testing.gitcli import GitFailed, run_git
from enroute_testing.ports import free_port
from enroute_testing.procmem import Memory, memory
from enroute_testing.scrape import series_count

ROLES = (*LEDGERS, *COMPUTES, GITPROTO)
PAGE = 1000
PROGRESS_EVERY = 500
ATTEMPTS = 5
SETTLE_POLL_S = 5.0
RSS_TARGET_KIB = 2.0
CPU_TARGET = 0.02


def name(k: int) -> str:
    return f"fleet/r{k:06d}"


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        body: bytes = r.read()
    return body


def grow(cluster: Cluster, seed: Seed, span: range, jobs: int) -> tuple[float, Populated]:
    """Create, push and clone the repositories numbered in ``span``: (the seconds it
    took, what was retried and given up on)."""

    def progress(done: int) -> None:
        if done % PROGRESS_EVERY == 0:
            print(f"  {span.start + done:,} repositories", flush=True)

    t = time.perf_counter()
    address = cluster.members[GITPROTO].http
    made = populate(
        address,
        [name(k) for k in span],
        seed,
        jobs,
        progress=progress,
        attempts=ATTEMPTS,
        keep_going=True,
    )
    for line in made.retries:
        print(f"  retried {line}", flush=True)
    for line in made.failed:
        print(f"  FAILED {line}", flush=True)
    return time.perf_counter() - t, made


def http_of(cluster: Cluster, role: str) -> str:
    """Where ``role`` answers /metrics and /status: gitproto's operator port (``started``)."""
    if role == GITPROTO:
        return f"http://{cluster.extra_config[GITPROTO]['listen']['ops']}"
    return f"http://{cluster.members[role].http}"


class Sample:
    """One role's figures at one repository count."""

    def __init__(self, memory: Memory, cpu: float, series: int, status: bytes) -> None:
        self.rss_kib = memory.rss_bytes / 1024
        self.cpu = cpu
        self.series = series
        self.status_bytes = len(status)
        st = json.loads(status)
        # a compute's open views, a ledger's open Subscribe streams (docs/fleet.md)
        self.followed = int(st.get("views", {}).get("open", st.get("subscriptions_open", 0)))
        # a compute's flushes: repositories whose pushed layer maintenance stored before
        # their view went (a view evicted first is not visited: docs/fleet.md)
        self.flushes = int(st.get("maintenance", {}).get("flushes", 0))


def following(cluster: Cluster) -> int:
    """Views open on the computes plus Subscribe streams open on the voters."""
    total = 0
    for role in (*LEDGERS, *COMPUTES):
        st = json.loads(get(f"{http_of(cluster, role)}/status"))
        total += int(st.get("views", {}).get("open", st.get("subscriptions_open", 0)))
    return total


def observe(
    cluster: Cluster, idle_s: float, cpu_s: float, settle_s: float
) -> tuple[float, dict[str, Sample]]:
    """After ``idle_s`` of idleness, and then until no view or stream is open (at most
    ``settle_s`` more: on a loaded machine eviction lags): RSS, CPU over ``cpu_s``,
    series, /status size; and the seconds waited in all."""
    t0 = time.perf_counter()
    for role in ROLES:  # the first scrape of a role makes its own ops series
        get(f"{http_of(cluster, role)}/metrics")
    time.sleep(max(idle_s - cpu_s, 0.0))
    deadline = time.perf_counter() + settle_s
    while following(cluster) and time.perf_counter() < deadline:
        time.sleep(SETTLE_POLL_S)
    pids = [cluster.members[r].pid for r in ROLES]
    before = [cpu_ticks(p) for p in pids]
    t = time.perf_counter()
    time.sleep(cpu_s)
    wall = time.perf_counter() - t
    cpu = [(cpu_ticks(p) - b) / CLK_TCK / wall for p, b in zip(pids, before, strict=True)]
    out = {}
    for role, pid, share in zip(ROLES, pids, cpu, strict=True):
        text = get(f"{http_of(cluster, role)}/metrics").decode()
        status = get(f"{http_of(cluster, role)}/status")
        out[role] = Sample(memory(pid), share, series_count(text), status)
    return time.perf_counter() - t0, out


def listing(cluster: Cluster) -> tuple[int, list[float]]:
    """Every repository through the REST API: (count, seconds of each page)."""
    token, count, times = "", 0, []
    while True:
        query = f"limit={PAGE}" + (f"&page_token={token}" if token else "")
        t = time.perf_counter()
        page = json.loads(get(f"{cluster.url}/api/v1/repos?{query}"))
        times.append(time.perf_counter() - t)
        count += len(page["repos"])
        token = page.get("next_page_token") or ""
        if not token:
            return count, times


def git_seconds(args: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    run_git(args, cwd=cwd)
    return time.perf_counter() - t


def reopen_cost(cluster: Cluster, work: Path, ks: Sequence[int]) -> dict[str, list[float]]:
    """Seconds of ``git ls-remote`` (every other one of ``ks``) or of a clone (the rest):
    first with its view evicted (the request re-opens it), then with the view open."""
    out: dict[str, list[float]] = {"ls-remote evicted": [], "ls-remote open": []}
    out.update({"clone evicted": [], "clone open": []})
    for i, k in enumerate(ks):
        url = cluster.git_url(name(k))
        for state in ("evicted", "open"):
            if i % 2 == 0:
                out[f"ls-remote {state}"].append(git_seconds(["ls-remote", url], work))
                continue
            dest = work / "reopen" / f"{k}-{state}"
            clone = ["clone", "-q", "--bare", url, str(dest)]
            out[f"clone {state}"].append(git_seconds(clone, work))
            shutil.rmtree(dest, ignore_errors=True)
    return out


def hibernated(cluster: Cluster) -> list[int]:
    out = []
    for role in LEDGERS:
        st = json.loads(get(f"{http_of(cluster, role)}/status"))
        out.append(int(st["groups_hibernated"]))
    return out


def revision() -> str:
    """The commit the servers run, and whether their sources differ from it."""
    try:
        head = run_git(["rev-parse", "--short", "HEAD"], cwd=ROOT).decode().strip()
        dirty = run_git(["status", "--porcelain", "--", "libs", "services"], cwd=ROOT)
    except GitFailed:  # an exported tree has no .git
        return "unknown (pass --revision)"
    return head + (" with uncommitted changes under libs/ or services/" if dirty.strip() else "")


class Step:
    """The figures of every role once ``repos`` repositories are idle."""

    def __init__(
        self, repos: int, grown: tuple[float, Populated], idle: tuple[float, dict[str, Sample]]
    ) -> None:
        self.repos = repos
        self.took_s, made = grown
        self.retries, self.failed = made.retries, made.failed
        self.idle_s, self.samples = idle
        self.load = os.getloadavg()[0]


def slope_kib(steps: Sequence[Step], role: str) -> float:
    """KiB of RSS per repository: the least-squares line through the steps."""
    xs = [float(s.repos) for s in steps]
    ys = [s.samples[role].rss_kib for s in steps]
    return statistics.linear_regression(xs, ys).slope


class After:
    """What is measured once every step is: None while the run goes on."""

    def __init__(
        self,
        asleep: Sequence[int],
        pages: tuple[int, list[float]],
        reopen: dict[str, list[float]],
    ) -> None:
        self.asleep = asleep
        self.pages = pages
        self.reopen = reopen


def report(  # noqa: PLR0917 - one call site, every figure of the run
    steps: Sequence[Step],
    after: After | None,
    target: int,
    idle_s: float,
    view_idle_s: float,
    rev: str,
    jobs: int,
    settle_s: float,
) -> list[str]:
    first, last = steps[0], steps[-1]
    counts = " / ".join(f"{s.repos:,}" for s in steps)
    made = sum(s.took_s for s in steps)
    errors = [r for s in steps for r in s.retries]
    retried = f"{len(errors)}" + (f", the first {errors[0]!r}" if errors else "")
    lost = [r for s in steps for r in s.failed]
    retried += f"; repositories given up on after {ATTEMPTS} tries: {len(lost)}" + (
        f", the first {lost[0]!r}" if lost else ""
    )
    lines = [
        f"{last.repos:,} repositories on 3 ledger voters, 2 computes and gitproto "
        f"(`enroute_testing.cluster`, SeaweedFS store), measured at {counts}: each created "
        f"through the API, pushed (3 commits) and cloned once, {jobs} at a time "
        f"(`enroute_testing.fleet`: the pack git makes, sent as git sends it; "
        f"{made:.0f} s in all, {last.repos / made:.1f} repositories a second), then idle "
        f"at least {idle_s:.0f} s before each measurement, and until the computes had "
        f"evicted every view or {settle_s:.0f} s more had passed (computes evict views idle "
        f"{view_idle_s:.0f} s: `limits.view_idle_ms_max`; idle "
        f"{' / '.join(f'{s.idle_s:.0f}' for s in steps)} s). Steps retried (a request "
        f"failed, tried up to {ATTEMPTS} times in all): {retried}. Servers at commit {rev}. "
        "Layers flushed by the computes' maintenance by each step: "
        f"{' / '.join(f'{sum(s.samples[c].flushes for c in COMPUTES):,}' for s in steps)}. "
        + (
            f"Hibernated groups per voter at {last.repos:,}: "
            f"{' / '.join(f'{x:,}' for x in after.asleep)}."
            if after
            else f"**Partial: the run had measured {last.repos:,} of {target:,} "
            "repositories when this was written.**"
        ),
        "",
        "| process | "
        + " | ".join(f"RSS at {s.repos:,} (MiB)" for s in steps)
        + f" | KiB per repository | idle CPU at {first.repos:,} / {last.repos:,} "
        "(% of a core) | series | /status bytes | views / streams open |",
        "|---|" + "---|" * (len(steps) + 5),
    ]
    worst: dict[str, float] = {}
    for role in ROLES:
        a, b = first.samples[role], last.samples[role]
        worst[role] = slope_kib(steps, role)
        rss = " | ".join(f"{s.samples[role].rss_kib / 1024:.0f}" for s in steps)
        lines.append(
            f"| {role} | {rss} | {worst[role]:.2f} "
            f"| {a.cpu * 100:.2f} / {b.cpu * 100:.2f} | {a.series} / {b.series} "
            f"| {a.status_bytes:,} / {b.status_bytes:,} "
            f"| {'' if role == GITPROTO else f'{a.followed:,} / {b.followed:,}'} |"
        )
    rss_roles = [r for r in ROLES if r != GITPROTO]
    rss_ok = all(worst[r] <= RSS_TARGET_KIB for r in rss_roles)
    cpu_growth = max(last.samples[r].cpu - first.samples[r].cpu for r in ROLES)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    lines += [
        "",
        f"Targets: at most {RSS_TARGET_KIB:.0f} KiB of RSS per idle repository on each ledger "
        f"and each compute ({'met' if rss_ok else 'NOT met'}: worst "
        f"{max(worst[r] for r in rss_roles):.2f} KiB); idle CPU growth within "
        f"{CPU_TARGET:.0%} of a core ({'met' if cpu_growth <= CPU_TARGET else 'NOT met'}: "
        f"{cpu_growth * 100:+.2f} points). Series counts do not depend on the number of "
        "repositories, and /status stays under a fixed size: its lists name at most 16 "
        "repositories, and a compute's fill as maintenance visits them "
        "(docs/observability.md).",
        "",
        *(tail(after) if after else []),
        f"The machine ({os.cpu_count()} cores) was shared with other work while this ran "
        f"(1-minute load average at the measurements: "
        f"{' / '.join(f'{s.load:.1f}' for s in steps)}; at the end "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} over 1 / 5 / 15 min), and the "
        f"benchmark and the cluster ran at nice {nice}: load slows population and listing, "
        "and does not change resident memory.",
        "",
    ]
    return lines


def tail(after: After) -> list[str]:
    count, times = after.pages
    reopen = after.reopen
    return [
        f"Listing: {count:,} repositories in {len(times)} pages of {PAGE:,} through "
        f"`GET /api/v1/repos`, {sum(times):.2f} s in all; first page {times[0] * 1e3:.0f} ms, "
        f"median {statistics.median(times) * 1e3:.0f} ms, last {times[-1] * 1e3:.0f} ms "
        f"(at this rate 100,000 take {sum(times) / max(count, 1) * 100_000:.1f} s).",
        "",
        f"What an evicted view costs the next request ({sum(map(len, reopen.values())) // 2} "
        "repositories, half ls-remote'd and half cloned with git, median seconds; evicted: "
        "the compute activates the name, subscribes and builds the view from the snapshot "
        "first): " + "; ".join(f"{k} {statistics.median(v):.3f}" for k, v in reopen.items()) + ".",
        "",
    ]


def started(
    work: Path, view_idle_s: float, election_ticks: int
) -> contextlib.AbstractContextManager[Cluster]:
    limits = {"view_idle_ms_max": int(view_idle_s * 1000)}
    ops = {"ops": f"127.0.0.1:{free_port()}"}  # the default, :9090, may be taken
    extra: dict[str, dict[str, Any]] = {"compute": {"limits": limits}, GITPROTO: {"listen": ops}}
    if election_ticks:
        extra["ledger"] = {"ledger": {"election_ticks": election_ticks}}
    return running_cluster(work / "cluster", faults=False, extra_config=extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repos", type=int, default=2000, help="repositories at the last step")
    ap.add_argument("--points", type=int, default=4, help="measured after each of this many steps")
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--cpu-seconds", type=float, default=10.0)
    ap.add_argument(
        "--settle-max-seconds",
        type=float,
        default=600.0,
        help="after the idle time, wait up to this long more for every view to be evicted",
    )
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--view-idle-seconds", type=float, default=30.0)
    ap.add_argument("--reopen-repos", type=int, default=20)
    ap.add_argument(
        "--election-ticks",
        type=int,
        default=0,
        help="ledger.election_ticks of the voters (default: the config's); on a machine "
        "loaded well past its cores, heartbeats late by more than the default second "
        "start elections on every awake group",
    )
    ap.add_argument("--revision", default="", help="the servers' commit (default: git's HEAD)")
    ap.add_argument("--no-write", action="store_true", help="print, leave docs alone")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    n, points = args.repos, max(args.points, 2)
    rev = args.revision or revision()
    if args.election_ticks:
        rev += (
            f", voters at `ledger.election_ticks` {args.election_ticks} (default 10; the "
            "machine was loaded past its cores)"
        )
    print(f"servers at {rev}", flush=True)
    try:
        with started(work, args.view_idle_seconds, args.election_ticks) as cluster:
            seed = make_seed(work)
            steps: list[Step] = []
            how = (
                args.idle_seconds,
                args.view_idle_seconds,
                rev,
                args.concurrency,
                args.settle_max_seconds,
            )
            for i in range(1, points + 1):
                span = range(n * (i - 1) // points, n * i // points)
                grown = grow(cluster, seed, span, args.concurrency)
                print(f"{span.stop:,} repositories ({grown[0]:.0f} s); idle", flush=True)
                idle = observe(
                    cluster, args.idle_seconds, args.cpu_seconds, args.settle_max_seconds
                )
                steps.append(Step(span.stop, grown, idle))
                print(f"  measured after {idle[0]:.0f} s idle", flush=True)
                for role, a in steps[-1].samples.items():  # kept in the log should it stop
                    print(
                        f"  {role}: RSS {a.rss_kib / 1024:.1f} MiB, CPU {a.cpu * 100:.2f}%, "
                        f"series {a.series}, /status {a.status_bytes}, followed {a.followed}",
                        flush=True,
                    )
                if len(steps) >= 2 and not args.no_write and len(steps) < points:
                    write_section("fleet", report(steps, None, n, *how))  # should it stop
            step = max(n // max(args.reopen_repos, 1), 1)
            after = After(
                hibernated(cluster),
                listing(cluster),
                reopen_cost(cluster, work, range(0, n, step)[: args.reopen_repos]),
            )
            lines = report(steps, after, n, *how)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    if not args.no_write:
        write_section("fleet", lines)


if __name__ == "__main__":
    main()
