"""Fleet benchmark: what an idle repository costs each role of a real local cluster.

Issue 19, "Measured idle cost". Starts the cluster of ``enroute_testing.cluster``
(three ledger voters, two computes, one gitproto, SeaweedFS as the object store,
every role a separate process on 127.0.0.1) and:

1. creates ``N`` repositories through the API, pushes a 3-commit history to each
   with git and clones each once (``--concurrency`` at a time), then leaves the
   cluster idle for ``--idle-seconds`` (default 60);
2. reads each process's RSS (``VmRSS``), its CPU over ``--cpu-seconds`` of the idle
   time (utime + stime, as ``bench/ledger.py`` measures it), the series count of
   its /metrics and the size of its /status;
3. does the same for ``N`` more (``2N`` in all);
4. pages through every repository through the REST API
   (``GET /api/v1/repos?limit=1000&page_token=``), timing each page;
5. times what an evicted view costs the next request (docs/fleet.md): ``git
   ls-remote`` and a clone of repositories whose views were evicted (an Activate, a
   Subscribe and its snapshot first), then the same again with the views open.

The computes run with ``limits.view_idle_ms_max`` set to ``--view-idle-seconds``
(default 30, under the idle time), so views of idle repositories are evicted, with
their subscriptions, before each measurement.

It reports, per process, the RSS at ``N`` and ``2N`` and the slope between them
per repository (target: at most 2 KiB on each ledger and each compute), idle CPU
(target: growth within 2% of a core), and the listing's pages, then writes the
section "fleet" of docs/benchmarks.md. Usage:
``python -m bench.fleet [--repos N]`` from the checkout root (default 2,000; the
issue's figure is 10,000, about an hour here).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.report import CLK_TCK, cpu_ticks, write_section
from enroute_testing.cluster import COMPUTES, GITPROTO, LEDGERS, Cluster, running_cluster
from enroute_testing.gitcli import run_git
from enroute_testing.procmem import Memory, memory
from enroute_testing.scrape import series_count

ROLES = (*LEDGERS, *COMPUTES, GITPROTO)
PAGE = 1000
RSS_TARGET_KIB = 2.0
CPU_TARGET = 0.02


def name(k: int) -> str:
    return f"fleet/r{k:06d}"


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        body: bytes = r.read()
    return body


def create(cluster: Cluster, repo: str) -> None:
    req = urllib.request.Request(
        f"{cluster.url}/api/v1/repos",
        data=json.dumps({"name": repo}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


def source(work: Path) -> Path:
    src = work / "src"
    run_git(["init", "-q", "-b", "main", str(src)], cwd=work)
    for i in range(3):
        (src / f"f{i}.txt").write_text(f"fleet {i}\n" * 40)
        run_git(["add", "."], cwd=src)
        run_git(["commit", "-q", "-m", f"c{i}"], cwd=src)
    return src


def populate(cluster: Cluster, src: Path, work: Path, span: range, jobs: int) -> float:
    """Create, push and clone the repositories numbered in ``span``; the seconds it took."""
    clones = work / "clones"
    clones.mkdir(exist_ok=True)

    def one(k: int) -> None:
        repo = name(k)
        create(cluster, repo)
        run_git(["push", "-q", cluster.git_url(repo), "main"], cwd=src)
        dest = clones / str(k)
        run_git(["clone", "-q", "--bare", cluster.git_url(repo), str(dest)], cwd=work)
        shutil.rmtree(dest, ignore_errors=True)

    t = time.perf_counter()
    with ThreadPoolExecutor(jobs) as ex:
        for i, _ in enumerate(ex.map(one, span), span.start + 1):
            if i % 500 == 0:
                print(f"  {i:,} repositories", flush=True)
    return time.perf_counter() - t


def http_of(cluster: Cluster, role: str) -> str:
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


def observe(cluster: Cluster, idle_s: float, cpu_s: float) -> dict[str, Sample]:
    """After ``idle_s`` of idleness: RSS, CPU over ``cpu_s``, series, /status size."""
    for role in ROLES:  # the first scrape of a role makes its own ops series
        get(f"{http_of(cluster, role)}/metrics")
    time.sleep(max(idle_s - cpu_s, 0.0))
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
    return out


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


def report(  # noqa: PLR0917 - one call site, every figure of the run
    n: int,
    at_n: dict[str, Sample],
    at_2n: dict[str, Sample],
    took: Sequence[float],
    pages: tuple[int, list[float]],
    asleep: Sequence[int],
    idle_s: float,
    reopen: dict[str, list[float]],
    view_idle_s: float,
) -> list[str]:
    lines = [
        f"{n:,} then {2 * n:,} repositories on 3 ledger voters, 2 computes and gitproto "
        f"(`enroute_testing.cluster`, SeaweedFS store): each created through the API, "
        f"pushed (3 commits) and cloned once with git ({took[0]:.0f} s and {took[1]:.0f} s), "
        f"then idle {idle_s:.0f} s before each measurement (computes evict views idle "
        f"{view_idle_s:.0f} s: `limits.view_idle_ms_max`). Hibernated groups per voter at "
        f"{2 * n:,}: {' / '.join(f'{x:,}' for x in asleep)}.",
        "",
        f"| process | RSS at {n:,} (MiB) | RSS at {2 * n:,} (MiB) | KiB per repository "
        f"| idle CPU at {n:,} / {2 * n:,} (% of a core) | series | /status bytes "
        "| views / streams open |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst: dict[str, float] = {}
    for role in ROLES:
        a, b = at_n[role], at_2n[role]
        slope = (b.rss_kib - a.rss_kib) / n
        worst[role] = slope
        lines.append(
            f"| {role} | {a.rss_kib / 1024:.0f} | {b.rss_kib / 1024:.0f} | {slope:.2f} "
            f"| {a.cpu * 100:.2f} / {b.cpu * 100:.2f} | {a.series} / {b.series} "
            f"| {a.status_bytes:,} / {b.status_bytes:,} "
            f"| {'' if role == GITPROTO else f'{a.followed:,} / {b.followed:,}'} |"
        )
    count, times = pages
    rss_roles = [r for r in ROLES if r != GITPROTO]
    rss_ok = all(worst[r] <= RSS_TARGET_KIB for r in rss_roles)
    cpu_growth = max(at_2n[r].cpu - at_n[r].cpu for r in ROLES)
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
        f"Listing: {count:,} repositories in {len(times)} pages of {PAGE:,} through "
        f"`GET /api/v1/repos`, {sum(times):.2f} s in all; first page {times[0] * 1e3:.0f} ms, "
        f"median {statistics.median(times) * 1e3:.0f} ms, last {times[-1] * 1e3:.0f} ms "
        f"(at this rate 100,000 take {sum(times) / max(count, 1) * 100_000:.1f} s).",
        "",
        f"What an evicted view costs the next request ({sum(map(len, reopen.values())) // 2} "
        "repositories, half ls-remote'd and half cloned, median seconds; evicted: the "
        "compute activates the name, subscribes and builds the view from the snapshot "
        "first): " + "; ".join(f"{k} {statistics.median(v):.3f}" for k, v in reopen.items()) + ".",
        "",
        f"Load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} "
        "(every process on the host counts).",
        "",
    ]
    return lines


def started(work: Path, view_idle_s: float) -> contextlib.AbstractContextManager[Cluster]:
    limits = {"view_idle_ms_max": int(view_idle_s * 1000)}
    extra = {"compute": {"limits": limits}}
    return running_cluster(work / "cluster", faults=False, extra_config=extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repos", type=int, default=2000, help="N: measured at N and 2N")
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--cpu-seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--view-idle-seconds", type=float, default=30.0)
    ap.add_argument("--reopen-repos", type=int, default=20)
    ap.add_argument("--no-write", action="store_true", help="print, leave docs alone")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    n = args.repos
    try:
        with started(work, args.view_idle_seconds) as cluster:
            src = source(work)
            took = [populate(cluster, src, work, range(n), args.concurrency)]
            print(f"{n:,} repositories in {took[0]:.0f} s; idle {args.idle_seconds:.0f} s")
            at_n = observe(cluster, args.idle_seconds, args.cpu_seconds)
            for role, a in at_n.items():  # kept in the log should the run not finish
                print(
                    f"  {role}: RSS {a.rss_kib / 1024:.1f} MiB, followed {a.followed}", flush=True
                )
            took.append(populate(cluster, src, work, range(n, 2 * n), args.concurrency))
            print(f"{2 * n:,} repositories in {took[1]:.0f} s; idle {args.idle_seconds:.0f} s")
            at_2n = observe(cluster, args.idle_seconds, args.cpu_seconds)
            asleep = hibernated(cluster)
            pages = listing(cluster)
            step = max(2 * n // max(args.reopen_repos, 1), 1)
            reopen = reopen_cost(cluster, work, range(0, 2 * n, step)[: args.reopen_repos])
            lines = report(
                n,
                at_n,
                at_2n,
                took,
                pages,
                asleep,
                args.idle_seconds,
                reopen,
                args.view_idle_seconds,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    if not args.no_write:
        write_section("fleet", lines)


if __name__ == "__main__":
    main()
