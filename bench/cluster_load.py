"""Cluster load: concurrent clones and pushes across many repositories, section "cluster_load".

Enroute runs as the multi-process cluster of ``enroute cluster up`` (SeaweedFS
S3, three ledger voters, two computes, one gitproto; enroute_testing.cluster);
the reference is C git's ``git http-backend`` (bench/http_backend.py). Both
get the same repositories (``--repos``, each a small history made with
``git fast-import``) and then the same load for ``--duration`` seconds:
``--clients`` threads, each repeatedly picking a random repository and either
cloning it (bare, protocol v2) or pushing one new commit to a branch of its
own (a fast-forward). Reported: operations per second, p50/p99 latency per
kind, failures, and the resident memory (VmRSS, VmHWM) of every process.

The run fails (exit status 1, after the report) when any Enroute operation
fails other than by an expected compare-and-swap conflict, when a process of
the cluster exited or was restarted during the run, or when the peak resident
memory (VmHWM) of a process exceeds its budget: the buffer pool the config
gives it (``node.page_cache`` plus ``node.cache``, set explicitly here; the object
and entry caches are charged to it) plus ``RUNTIME_MIB`` for the interpreter, gRPC and the
working memory of requests in flight, which no config key bounds.

Usage: ``python -m bench.cluster_load [--repos 100 --duration 30 --clients 8]``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.git import _start
from bench.report import ROOT, write_section
from enroute_core.config import load_config
from enroute_testing.cluster import Cluster
from enroute_testing.gitcli import git_env

COMMITS_PER_REPO = 20
GIT_TIMEOUT_S = 120.0
MiB = 1024 * 1024
BUDGETS = {"compute": {"node": {"page_cache": "64MiB", "cache": "32MiB"}}}
"""Explicit memory budgets of the cluster's configs (the defaults are 256 MiB each)."""
RUNTIME_MIB = 192
"""Per process, beyond its configured budgets: interpreter, libraries, gRPC, requests in
flight (measured: 60-110 MiB after this load)."""
CAS_CONFLICT = ("stale ref", "stale info", "fetch first", "non-fast-forward", "cannot lock ref")
"""What git prints when a compare-and-swap on a ref lost: expected under concurrent pushes."""


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    """Failures other than CAS conflicts (git's message), each one a failed run."""

    def add(self, kind: str, seconds: float, ok: bool, stderr: str = "") -> None:
        with self.lock:
            if ok:
                self.latencies.setdefault(kind, []).append(seconds)
                return
            self.failures[kind] = self.failures.get(kind, 0) + 1
            if kind == "push" and any(c in stderr for c in CAS_CONFLICT):
                self.conflicts += 1
            else:
                self.errors.append(f"{kind}: {stderr.strip()[-300:]}")


def _run_git(env: dict[str, str], cwd: Path, *args: str, input: bytes = b"") -> tuple[bool, str]:
    """Success and git's stderr (a timeout is a failure)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, env=env, input=input, capture_output=True,
            timeout=GIT_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"git {args[0]} timed out after {GIT_TIMEOUT_S:g} s"
    return done.returncode == 0, done.stderr.decode("utf-8", "replace")


def _git(env: dict[str, str], cwd: Path, *args: str, input: bytes = b"") -> bool:
    return _run_git(env, cwd, *args, input=input)[0]


def _history(count: int, seed: int) -> bytes:
    """A fast-import stream: ``count`` commits on main, each adding a ~2 KiB file."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        msg = f"commit {i}\n".encode()
        body = rng.randbytes(1024).hex().encode()
        out += [
            b"commit refs/heads/main\n",
            b"committer Bench <b@e.invalid> %d +0000\n" % (1700000000 + i),
            b"data %d\n%s" % (len(msg), msg),
            b"M 100644 inline f%d.txt\n" % i,
            b"data %d\n%s\n" % (len(body), body),
        ]
    return b"".join(out)


def seed_repos(url: str, work: Path, env: dict[str, str], repos: int) -> None:
    source = work / "source.git"
    if not source.exists():
        _git(env, work, "init", "-q", "--bare", str(source))
        _git(env, source, "fast-import", "--quiet", input=_history(COMMITS_PER_REPO, 0))
    for i in range(repos):
        ok, err = _run_git(env, source, "push", "-q", f"{url}/load-{i}.git", "main")
        if not ok:
            raise RuntimeError(f"seeding load-{i} at {url} failed: {err.strip()[-300:]}")


def run_load(url: str, work: Path, env: dict[str, str], *, repos: int, clients: int,
             duration_s: float, seed: int) -> tuple[Tally, float]:  # fmt: skip
    tally = Tally()
    deadline = time.monotonic() + duration_s

    def client(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        local = work / f"client-{index}.git"
        _git(env, work, "init", "-q", "--bare", str(local))
        tips: dict[int, str] = {}
        n = 0
        while time.monotonic() < deadline:
            repo = rng.randrange(repos)
            n += 1
            if rng.random() < 0.7:
                dest = work / f"clone-{index}-{n}"
                t = time.perf_counter()
                ok, err = _run_git(env, work, "-c", "protocol.version=2", "clone", "-q", "--bare",
                                   f"{url}/load-{repo}.git", str(dest))  # fmt: skip
                tally.add("clone", time.perf_counter() - t, ok, err)
                shutil.rmtree(dest, ignore_errors=True)
            else:
                parent = ["-p", tips[repo]] if repo in tips else []
                tree = subprocess.run(
                    ["git", "mktree"], cwd=local, env=env, input=b"", capture_output=True,
                    check=True,
                ).stdout.decode().strip()  # fmt: skip
                commit = subprocess.run(
                    ["git", "commit-tree", tree, "-m", f"load {index} {n}", *parent],
                    cwd=local, env=env, capture_output=True, check=True,
                ).stdout.decode().strip()  # fmt: skip
                t = time.perf_counter()
                ok, err = _run_git(env, local, "push", "-q", "--force", f"{url}/load-{repo}.git",
                                   f"{commit}:refs/heads/c{index}")  # fmt: skip
                tally.add("push", time.perf_counter() - t, ok, err)
                if ok:
                    tips[repo] = commit

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally, time.monotonic() - started


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def _mem_kib(pid: int) -> tuple[int, int]:
    rss = hwm = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def budget_mib(role: str, config: dict[str, Any]) -> float:
    """A process's memory budget: its buffer pool (``node.page_cache + node.cache``, the
    object and entry caches charged to it; only computes have one) plus ``RUNTIME_MIB``."""
    pool = load_config(json.dumps(config), {}).node.pool_bytes if role == "compute" else 0
    return RUNTIME_MIB + pool / MiB


def _rows(name: str, tally: Tally, took_s: float) -> list[str]:
    total = sum(len(v) for v in tally.latencies.values())
    rows = []
    for kind in ("clone", "push"):
        lat = tally.latencies.get(kind, [])
        rows.append(
            f"| {name} | {kind} | {len(lat)} | {tally.failures.get(kind, 0)} | "
            f"{len(lat) / took_s:.2f} | {_pct(lat, 0.5) * 1000:.0f} | "
            f"{_pct(lat, 0.99) * 1000:.0f} |"
        )
    rows.append(f"| {name} | all | {total} | {sum(tally.failures.values())} | "
                f"{total / took_s:.2f} | - | - |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repos", type=int, default=100)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print, do not edit the docs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="enroute-cluster-load-"))
    home = work / "home"
    home.mkdir()
    env = git_env(home)
    cluster = Cluster.create(work / "cluster", extra_config=BUDGETS)
    reference: Callable[[], None] | None = None
    table: list[str] = []
    memory: list[str] = []
    failed: list[str] = []
    outcomes: list[str] = []
    try:
        cluster.start()
        ref = _start(
            "git",
            [sys.executable, "-m", "bench.http_backend", "--root", str(work / "git-root")],
            "reference ready: ",
        )
        reference = ref.proc.terminate
        for name, url in (("enroute cluster", cluster.url), ("git http-backend", ref.url)):
            side = work / name.split()[0]
            side.mkdir()
            t = time.monotonic()
            seed_repos(url, side, env, args.repos)
            seeded_s = time.monotonic() - t
            tally, took = run_load(url, side, env, repos=args.repos, clients=args.clients,
                                   duration_s=args.duration, seed=args.seed)  # fmt: skip
            table += _rows(name, tally, took)
            counts = f"{tally.conflicts} CAS conflicts, {len(tally.errors)} other errors"
            print(f"{name}: seeded {args.repos} repos in {seeded_s:.1f} s; {counts}", flush=True)
            outcomes.append(f"{name}: {counts}")
            if name == "enroute cluster":
                failed += [f"error: {e}" for e in tally.errors]
        for member in cluster.members.values():
            rss, hwm = _mem_kib(member.pid)
            budget = budget_mib(member.role, cluster.config_of(member.name))
            within = member.alive() and member.starts == 1 and 0 < hwm / 1024 <= budget
            memory.append(f"| {member.name} | {rss / 1024:.0f} | {hwm / 1024:.0f} | "
                          f"{budget:.0f} | {'yes' if within else 'NO'} |")  # fmt: skip
            if not member.alive() or member.starts != 1:
                failed.append(f"{member.name} exited or was restarted during the run")
            elif not 0 < hwm / 1024 <= budget:
                failed.append(f"{member.name}: VmHWM {hwm / 1024:.0f} MiB > budget {budget:.0f}")
        rss, hwm = _mem_kib(ref.proc.pid)
        memory.append(f"| http-backend bridge (CGI children not included) | {rss / 1024:.0f} | "
                      f"{hwm / 1024:.0f} | - | - |")  # fmt: skip
    finally:
        if reference is not None:
            reference()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        f"{args.repos} repositories of {COMMITS_PER_REPO} commits (~2 KiB file each), "
        f"{args.clients} client threads for {args.duration:g} s per server, 70% bare clones "
        "(protocol v2) and 30% one-commit pushes to a branch per client; the servers run one "
        "after the other on the same machine. Enroute: 3 ledger voters, 2 computes, 1 gitproto, "
        "SeaweedFS S3, each its own process.",
        "",
        "| server | operation | done | failed | per s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
        *table,
        "",
        "Failed operations: " + "; ".join(outcomes) + ".",
        "",
        f"Memory after the load (MiB). Budget: the buffer pool, `node.page_cache + node.cache` "
        f"(computes: {BUDGETS['compute']['node']['page_cache']} + "
        f"{BUDGETS['compute']['node']['cache']}, the object and entry caches charged to it) "
        f"plus {RUNTIME_MIB} MiB per process for the runtime; VmHWM is the peak of the run.",
        "",
        "| process | VmRSS | VmHWM | budget | within |",
        "|---|---|---|---|---|",
        *memory,
        "",
        f"Problems (Enroute errors other than CAS conflicts, budgets exceeded, processes "
        f"restarted): {len(failed)}" + "".join(f"\n- {f}" for f in failed[:20]),
        "",
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("cluster_load", lines)
    if failed:
        print(f"cluster load FAILED: {len(failed)} problems", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
