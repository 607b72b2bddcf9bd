"""Git smart-HTTP benchmarks: Enroute against C git's ``git http-backend``, section "git".

Both servers run side by side in the same run and serve the same generated
repositories to the same git client (scrubbed environment); every measurement
alternates between them. Reported per measurement: the client's wall time min /
median / max over runs and the ratio enroute/git of paired runs; the server's CPU
and peak RSS over the same runs (``Meter`` says exactly what is read). Targets:
clones at most 1.0x, initial push at most 1.5x, ls-remote at most 1.0x.

Profiles: ``default`` (section "git"), ``quick`` (a smoke run, same section) and the
large-project shapes of ``enroute_testing.repogen.PROFILES`` (``large``,
``large-ci``; section "git-<profile>"), which run the initial push, the full,
blobless and depth-1 clones, the incremental push and fetch and the concurrent
clones. Generated repositories are kept under ``--cache`` (``.bench-cache/``), so
a profile is generated once. The large profiles carry the legacy quirks
(``RepoSpec.quirks``) only if Enroute accepts a push of them; otherwise they run
without, and the section says so.

With ``--s3`` a third server runs beside them: ``enroute dev`` on SeaweedFS
(``weed mini``) with ``node.disk_cache`` a quarter of the source's packs (issue 18:
serving from the object store under a disk budget); its rows are written beside the
``file://`` ones of the same run, as ratios to both, in a section of its own
(``git-s3``, ``git-<profile>-s3``).

With ``--split-cores`` the servers run on the last CPU and the git client on the others,
a diagnostic: it tells what a server costs the client on a shared core (the setting
of the targets, where the servers' threads and the client share the cores as they
come) from what the server itself costs.

Usage: ``python -m bench.git [--profile NAME] [--quick] [--runs N] [--only NAME,...] [--s3]
[--split-cores] [--section NAME] [--note TEXT]`` from the checkout root; ``--only`` runs a
subset of the measurements (names: ``SECTIONS``), ``--section`` writes it under a name of
its own so the full run's section stays.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from bench.report import (
    CLK_TCK,
    ROOT,
    Series,
    children_of,
    cpu_ticks,
    fmt3,
    hwm_kib,
    write_section,
)
from enroute_testing.gitcli import git_env
from enroute_testing.repogen import (
    PROFILES,
    QUIRK_IDS,
    GeneratedRepo,
    RepoSpec,
    cached_repo,
    generate_repo,
    profile,
)
from enroute_testing.s3budget import BUCKET, dev_config
from enroute_testing.s3servers import S3Endpoint, seaweedfs_server

READY_TIMEOUT_S = 120.0
NEW_COMMITS = 20
LS_REMOTES = 100
CONCURRENT_CLONES = 8
SHORT_RUNS_FACTOR = 3
"""The depth-1 clone of a small profile (about 0.1 s) runs this many times as often as
the rest; a large profile's takes seconds and runs as often as the rest."""
SECTIONS = ("push", "clone-v2", "clone-v0", "blobless", "depth1", "incremental", "ls-remote",
            "concurrent")  # fmt: skip
LARGE_SECTIONS = ("push", "clone-v2", "blobless", "depth1", "incremental", "concurrent")
SMALL_PROFILES = {
    "default": RepoSpec(commits=2000, files=500),
    "quick": RepoSpec(commits=100, files=50),
}
CACHE = ROOT / ".bench-cache"
SAMPLE_S = 0.02
S3_SERVER = "enroute-s3"
S3_BUDGET_SHARE = 4
"""``--s3``: the disk budget is the source's pack bytes divided by this."""


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[str]


def _on_cpus(cpus: frozenset[int] | None) -> list[str]:
    """The argv prefix that keeps a child and what it starts on ``cpus`` (``--split-cores``):
    util-linux's ``taskset``, as a ``preexec_fn`` is unsafe beside the bench's threads."""
    return [] if cpus is None else ["taskset", "-c", ",".join(str(c) for c in sorted(cpus))]


def _start(
    name: str,
    argv: list[str],
    marker: str,
    log: Path | None = None,
    cpus: frozenset[int] | None = None,
) -> Server:
    """Start a server and wait for its ready line; its stderr goes to ``log`` (shown when
    it exits early) or nowhere; ``cpus``: where it and its processes run."""
    # ENROUTE_* variables are configuration to the roles; the report path is not theirs.
    env = {k: v for k, v in os.environ.items() if k != "ENROUTE_BENCH_REPORT"}
    with open(log or os.devnull, "wb") as err:
        proc = subprocess.Popen(
            [*_on_cpus(cpus), *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            tail = log.read_text(errors="replace")[-2000:] if log else "(not kept)"
            raise RuntimeError(f"{name} exited before it was ready; its stderr ends:\n{tail}")
        if line.startswith(marker):
            return Server(name, line[len(marker) :].strip(), proc)
    raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S} s")


REAP_WAIT_S = 5.0


def _server_cpu_s(s: Server) -> float:
    """CPU of a server so far: enroute's dev process and its roles, or the bridge with
    the CGI processes it has waited for."""
    pid = s.proc.pid
    if s.name == "git":
        # A CGI process ends after its response: wait until the bridge has reaped it.
        deadline = time.monotonic() + REAP_WAIT_S
        while children_of(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return cpu_ticks(pid, reaped=True) / CLK_TCK
    return sum(cpu_ticks(p) for p in [pid, *children_of(pid)]) / CLK_TCK


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants alive now."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        with contextlib.suppress(OSError, ValueError):  # a process that ended meanwhile
            todo += children_of(found[-1])
    return found


def _status_kib(pid: int) -> dict[str, int]:
    """The kB fields of /proc/PID/status (VmHWM, VmRSS, RssAnon, RssFile, ...)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.endswith(" kB"):
            out[key] = int(value.split()[0])
    return out


ROLES = ("dev", "ledger", "compute", "gitproto")
"""The processes of ``enroute dev``: the dev process and its three roles."""


def _roles(s: Server) -> dict[str, int]:
    """The pid of each role of an ``enroute dev`` server (none for the reference)."""
    if not s.name.startswith("enroute"):
        return {}
    found = {"dev": s.proc.pid}
    for pid in children_of(s.proc.pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        for role in ROLES[1:]:
            if f"enroute_{role}".encode() in argv:
                found[role] = pid
    return found


def _baseline(s: Server) -> str:
    """Each role's resident set now (before any work): VmRSS, and of it RssFile (mapped
    files, mostly shared libraries, which the roles share) in MiB."""
    parts = []
    for role, pid in _roles(s).items():
        st = _status_kib(pid)
        parts.append(f"{role} {st['VmRSS'] / 1024:.0f} ({st['RssFile'] / 1024:.0f} file)")
    return ", ".join(parts)


@dataclass(frozen=True)
class Sample:
    """One run of one measurement against one server."""

    wall_s: float  # the git client's wall time: the request from start to end
    server_cpu_s: float
    client_cpu_s: float  # the git clients this process ran (RUSAGE_CHILDREN)
    server_rss_kib: int
    roles: tuple[tuple[str, float, int], ...] = ()  # enroute: (role, CPU s, peak RSS KiB)


class Meter:
    """The server's CPU and peak RSS while ``with Meter(server):`` runs.

    Peak RSS is read from every process of the server's tree: the server process
    and all its descendants (enroute's dev process and its roles; the bridge and,
    per request, ``git http-backend`` with its upload-pack / receive-pack and their
    pack-objects / index-pack). Each reports its own peak resident set, VmHWM in
    /proc/PID/status. At the start, the processes alive (the long-lived ones) have
    that peak reset to their current RSS (``5`` written to /proc/PID/clear_refs), so
    it is their peak during the measurement. A thread reads the tree every 20 ms
    and adds up the VmHWM of the processes alive; the result is the largest such
    sum. So a process that lives less than 20 ms can be missed, and processes alive
    together that peaked at different times are added as if they peaked together
    (an upper bound of the resident set at any one time).

    CPU is ``_server_cpu_s`` before and after: user + system time of the server
    process and its children (for git, the CGI processes the bridge has reaped).

    For enroute, each role's CPU and peak RSS (its VmHWM at the end) are kept too
    (``roles``): issue 25 asks for each role separately.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rss_kib = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample_loop, daemon=True)
        self.cpu_s = 0.0
        self.role_pids = _roles(server)
        self.role_cpu: dict[str, int] = {}
        self.roles: tuple[tuple[str, float, int], ...] = ()

    def _sample(self) -> None:
        total = 0
        for pid in _tree(self.server.proc.pid):
            with contextlib.suppress(OSError, ValueError):  # ended since it was listed
                total += hwm_kib(pid)
        self.rss_kib = max(self.rss_kib, total)

    def _role_ticks(self) -> dict[str, int]:
        return {role: cpu_ticks(pid) for role, pid in self.role_pids.items()}

    def _sample_loop(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self._sample()

    def __enter__(self) -> Meter:
        for pid in _tree(self.server.proc.pid):
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        self._sample()
        self.role_cpu = self._role_ticks()
        self.cpu_s = -_server_cpu_s(self.server)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._sample()
        self.cpu_s += _server_cpu_s(self.server)
        ticks = self._role_ticks()
        self.roles = tuple(
            (role, (ticks[role] - self.role_cpu[role]) / CLK_TCK, hwm_kib(pid))
            for role, pid in self.role_pids.items()
        )


def _show_server_logs(work: Path) -> None:
    """A failed run's working directory is removed on the way out: what the servers logged
    is printed first, so the failure can be told apart from the client's side."""
    for log in [*sorted(work.glob("*.stderr")), *sorted(work.glob("*/logs/*.log"))]:
        tail = log.read_text(errors="replace")[-6000:]
        print(f"--- {log.relative_to(work)} (its end) ---\n{tail}", file=sys.stderr)


def _split_cores() -> tuple[frozenset[int], frozenset[int]]:
    """``--split-cores``: the servers on the last of this process's CPUs, the client on the
    rest, to tell a server's cost to the client on a shared core from its own cost."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        raise SystemExit("--split-cores needs at least two CPUs and util-linux's taskset")
    return frozenset(cpus[-1:]), frozenset(cpus[:-1])


def _cpu_list(cpus: frozenset[int]) -> str:
    return ", ".join(str(c) for c in sorted(cpus))


class Bench:
    def __init__(self, work: Path, runs: int, cpus: frozenset[int] | None = None) -> None:
        self.work = work
        self.runs = runs
        self.cpus = cpus  # where the git client runs (--split-cores)
        home = work / "home"
        home.mkdir()
        self.env = git_env(home)
        self.counter = 0

    def git(self, *args: str, cwd: Path | None = None) -> float:
        start = time.perf_counter()
        done = subprocess.run(
            [*_on_cpus(self.cpus), "git", *args],
            check=False,
            cwd=cwd or self.work,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        took = time.perf_counter() - start
        if done.returncode:
            # What the client printed is the only account of a failed run the report can give.
            print(done.stderr.decode(errors="replace"), file=sys.stderr)
            done.check_returncode()
        return took

    def scratch(self) -> Path:
        self.counter += 1
        return self.work / f"scratch-{self.counter}"

    def paired(
        self, servers: list[Server], fn: Callable[[Server], float], runs: int | None = None
    ) -> dict[str, Series]:
        samples: dict[str, list[float]] = {s.name: [] for s in servers}
        for i in range(runs or self.runs):
            for server in servers if i % 2 == 0 else servers[::-1]:
                samples[server.name].append(fn(server))
        return {name: Series(tuple(v)) for name, v in samples.items()}

    def clone(self, server: Server, repo: str, *flags: str) -> float:
        dest = self.scratch()
        took = self.git("clone", "-q", "--bare", *flags, f"{server.url}/{repo}.git", str(dest))
        shutil.rmtree(dest)
        return took

    def fast_import_commits(self, local: Path, count: int) -> None:
        """Append ``count`` commits to main of ``local``, each editing one new file."""
        tip = subprocess.run(
            ["git", "rev-parse", "refs/heads/main"],
            cwd=local,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        stream = []
        for i in range(count):
            self.counter += 1
            body = f"change {self.counter}\n".encode() * 50
            msg = f"bench commit {self.counter}\n".encode()
            stream += [
                b"commit refs/heads/main\n",
                b"committer Bench <b@e.invalid> 1700000000 +0000\n",
                b"data %d\n%s" % (len(msg), msg),
            ]
            if i == 0:
                stream.append(b"from %s\n" % tip.encode())
            stream += [
                b"M 100644 inline bench/f%d.txt\n" % self.counter,
                b"data %d\n%s\n" % (len(body), body),
            ]
        subprocess.run(
            ["git", "fast-import", "--quiet"],
            cwd=local,
            env=self.env,
            input=b"".join(stream),
            check=True,
        )


def _row(label: str, series: dict[str, Series], scale: float = 1.0) -> str:
    ours, ref = series["enroute"], series["git"]
    ratios = Series(tuple(sorted(o / g for o, g in zip(ours.samples, ref.samples, strict=True))))
    return (
        f"| {label} | {fmt3(ours, scale)} | {fmt3(ref, scale)} | "
        f"{ours.median / ref.median:.2f} | {fmt3(ratios, digits=2)} |"
    )


def _server_row(label: str, samples: dict[str, list[Sample]]) -> str:
    def cols(name: str) -> list[str]:
        runs = samples[name]
        cpu = Series(tuple(x.server_cpu_s for x in runs))
        rss = Series(tuple(x.server_rss_kib / 1024 for x in runs))
        client = statistics.median(x.client_cpu_s for x in runs)
        return [fmt3(cpu, digits=2), fmt3(rss, digits=0), f"{client:.2f}"]

    ours, ref = cols("enroute"), cols("git")
    return (
        "| " + " | ".join([label, ours[0], ref[0], ours[1], ref[1], f"{ours[2]} / {ref[2]}"]) + " |"
    )


def _role_row(label: str, runs: list[Sample]) -> str:
    cols = []
    for role in ROLES:
        got = [(cpu, kib) for x in runs for (r, cpu, kib) in x.roles if r == role]
        if not got:
            cols.append("-")
            continue
        cpu = statistics.median(c for c, _ in got)
        mib = statistics.median(k for _, k in got) / 1024
        cols.append(f"{cpu:.2f} / {mib:.0f}")
    return "| " + " | ".join([label, *cols]) + " |"


def _s3_server(
    work: Path,
    s3: S3Endpoint,
    source: Path,
    servers: list[Server],
    cpus: frozenset[int] | None = None,
) -> int:
    """Start ``enroute dev`` on ``s3`` under a disk budget of a quarter of ``source``'s
    packs and add it to ``servers``; answers the budget in bytes."""
    packs = sum(p.stat().st_size for p in source.rglob("objects/pack/*.pack"))
    budget = max(packs // S3_BUDGET_SHARE, 1024 * 1024)
    config = work / "enroute-s3.yaml"
    config.write_text(json.dumps(dev_config(s3, "bench", budget)))  # YAML reads JSON
    enroute = str(Path(sys.executable).parent / "enroute")
    data = str(work / "enroute-s3-data")
    argv = [enroute, "dev", "--listen", "127.0.0.1:0", "--data", data, "--config", str(config)]
    servers.append(_start(S3_SERVER, argv, "enroute ready: ", work / "enroute-s3.stderr", cpus))
    return budget


def _s3_row(label: str, walls: dict[str, Series], samples: list[Sample]) -> str:
    ours = walls[S3_SERVER]
    rss = Series(tuple(x.server_rss_kib / 1024 for x in samples))
    return (
        f"| {label} | {fmt3(ours)} | {ours.median / walls['enroute'].median:.2f} | "
        f"{ours.median / walls['git'].median:.2f} | {fmt3(rss, digits=0)} |"
    )


def _s3_table(rows: list[str]) -> list[str]:
    if not rows:
        return []
    return [
        f"`{S3_SERVER}` (S3 store, disk budget a quarter of the data), the same runs: wall "
        "seconds of the git client, the ratios of medians to `enroute` on `file://` and to "
        "`git http-backend`, and its peak RSS in MiB:",
        "",
        "| measurement | enroute-s3 s min / median / max | ratio to enroute file:// "
        "| ratio to git | enroute-s3 peak RSS MiB |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def _describe(source: GeneratedRepo, env: dict[str, str]) -> tuple[str, Counter[str]]:
    """The shape of the generated repository as git sees it, for the report."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=source.path, env=env, check=True, capture_output=True, text=True
        )
        return done.stdout

    kinds: Counter[str] = Counter()
    base: dict[str, str] = {}
    biggest = 0
    check = "--batch-check=%(objectname) %(objecttype) %(objectsize) %(deltabase)"
    for line in git("cat-file", "--batch-all-objects", check).splitlines():
        oid, kind, size, delta_base = line.split()
        kinds[kind] += 1
        if kind == "blob":
            biggest = max(biggest, int(size))
        if delta_base != "0" * len(delta_base):
            base[oid] = delta_base
    depth: dict[str, int] = {}
    for start in base:
        chain, at = [], start
        while at in base and at not in depth:
            chain.append(at)
            at = base[at]
        d = depth.get(at, 0)
        for o in reversed(chain):
            d += 1
            depth[o] = d
    deepest = max(depth.values(), default=0)
    counts = dict(line.split(": ") for line in git("count-objects", "-v").splitlines())
    tags = len(git("for-each-ref", "refs/tags").splitlines())
    merges = Counter(
        len(ln.split()) - 1 for ln in git("rev-list", "--parents", "--merges", "--all").splitlines()
    )
    by_kind = ", ".join(f"{n:,} {k}s" for k, n in sorted(kinds.items()))
    packed_mib = (int(counts["size-pack"]) + int(counts["size"])) / 1024
    text = (
        f"{sum(kinds.values()):,} objects ({by_kind}), "
        f"{packed_mib:.0f} MiB packed, {tags:,} tag refs, "
        f"{sum(merges.values()):,} merges (the widest with {max(merges, default=0)} parents), "
        f"delta chains up to depth {deepest} ({sum(1 for d in depth.values() if d == deepest):,} "
        f"objects at it), the biggest blob {biggest / 2**20:.0f} MiB"
    )
    return text, kinds


def _quirks_refused(bench: Bench, server: Server) -> str | None:
    """None if ``server`` takes a push of the legacy quirks, else git's message."""
    probe = generate_repo(
        bench.work / "quirks-probe.git", RepoSpec(commits=2, files=2, quirks=True)
    )
    done = subprocess.run(
        ["git", "push", f"{server.url}/quirks-probe.git", "refs/heads/*:refs/heads/*"],
        cwd=probe.path,
        env=bench.env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode == 0:
        return None
    return " ".join(
        ln.strip() for ln in done.stderr.splitlines() if "rejected" in ln or "error" in ln
    )


def run(
    work: Path,
    name: str,
    runs: int,
    only: frozenset[str] = frozenset(SECTIONS),
    *,
    cache: Path = CACHE,
    seed: int = 0,
    s3: S3Endpoint | None = None,
    split_cores: bool = False,
) -> list[str]:
    server_cpus, client_cpus = _split_cores() if split_cores else (None, None)
    bench = Bench(work, runs, client_cpus)
    depth1_runs = runs * SHORT_RUNS_FACTOR if name in SMALL_PROFILES else runs
    python = sys.executable
    enroute = str(Path(python).parent / "enroute")
    servers = [
        _start(
            "enroute",
            [enroute, "dev", "--listen", "127.0.0.1:0", "--data", str(work / "enroute-data")],
            "enroute ready: ",
            work / "enroute.stderr",
            server_cpus,
        ),
        _start(
            "git",
            [python, "-m", "bench.http_backend", "--root", str(work / "git-root")],
            "reference ready: ",
            work / "git.stderr",
            server_cpus,
        ),
    ]
    rows: list[str] = []
    server_rows: list[str] = []
    role_rows: list[str] = []
    s3_rows: list[str] = []
    notes: list[str] = []  # before the tables
    if server_cpus is not None and client_cpus is not None:
        notes.append(
            f"`--split-cores`: the servers ran on CPU {_cpu_list(server_cpus)} and the git "
            f"client on CPU {_cpu_list(client_cpus)} (`taskset`), so neither "
            "server's threads share the client's cores; a diagnostic, not the acceptance "
            "setting, in which they share the machine's cores as they come."
        )
    after: list[str] = []
    try:
        baseline = _baseline(servers[0])
        spec = (
            replace(SMALL_PROFILES[name], seed=seed)
            if name in SMALL_PROFILES
            else profile(name, seed=seed)
        )
        if spec.quirks and (refused := _quirks_refused(bench, servers[0])):
            spec = replace(spec, quirks=False)
            notes.append(
                "Run without the legacy quirks (`quirks=False`): Enroute refused a push of "
                f"them with default configuration ({refused})."
            )
        elif spec.quirks:
            notes.append(
                "The history starts with the legacy quirks (" + ", ".join(sorted(QUIRK_IDS)) + "); "
                "both servers accepted them with default configuration."
            )
        repo, gen_s = cached_repo(spec, cache, name)
        source = repo.path
        if s3 is not None:
            budget = _s3_server(work, s3, source, servers, server_cpus)
            notes.append(
                f"`{S3_SERVER}`: `enroute dev` on SeaweedFS (`weed mini`, loopback) with "
                f"`node.disk_cache: {budget // 1024}KiB`, a quarter of the source's packs; "
                "its rows follow the tables below."
            )
        shape, _ = _describe(repo, bench.env)
        push_refs = ["refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"]
        stats: dict[tuple[str, str], list[Sample]] = {}

        def measured(section: str, s: Server, work: Callable[[], float]) -> float:
            """``work``'s wall time; the server's CPU and peak RSS and the clients' CPU
            are kept under ``section``."""
            # The disk's pending writes go first, outside the measurement: a run must not
            # pay for what the run before it wrote (a clone's 267 MiB pack, git's repack,
            # the scratch copy removed), which fell on whichever server came next
            os.sync()
            kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            with Meter(s) as meter:
                took = work()
            kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            clients = kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime
            stats.setdefault((section, s.name), []).append(
                Sample(took, meter.cpu_s, clients, meter.rss_kib, meter.roles)
            )
            return took

        def report(section: str, label: str) -> None:
            by_server = {s.name: stats[section, s.name] for s in servers}
            walls = {k: Series(tuple(x.wall_s for x in v)) for k, v in by_server.items()}
            rows.append(_row(label, walls))
            server_rows.append(_server_row(label, by_server))
            role_rows.append(_role_row(label, by_server["enroute"]))
            if S3_SERVER in walls:
                s3_rows.append(_s3_row(label, walls, by_server[S3_SERVER]))

        served: dict[str, str] = {}

        def initial_push(s: Server) -> float:
            bench.counter += 1
            repo_name = f"push-{bench.counter}"
            served.setdefault(s.name, repo_name)
            url = f"{s.url}/{repo_name}.git"
            return measured("push", s, lambda: bench.git("push", "-q", url, *push_refs, cwd=source))

        if "push" in only:
            bench.paired(servers, initial_push)
            report("push", "initial push")
        for s in servers:
            if s.name not in served:  # the repository the clones read: the first push's
                bench.git("push", "-q", f"{s.url}/main.git", *push_refs, cwd=source)
                served[s.name] = "main"
        if only - {"push"}:
            took = bench.git(
                "repack", "-q", "-a", "-d", "-b", cwd=work / "git-root" / f"{served['git']}.git"
            )
            notes.append(
                "Before the reads, git's served repository was repacked with a reachability "
                f"bitmap (`git repack -a -d -b`, {took:.1f} s, not measured), as a Git "
                "server's maintenance does (`git gc` on a bare repository writes one): "
                "receive-pack keeps the pushed pack as it came, without a bitmap, and "
                "`pack-objects` without one finds a clone's objects by walking the whole "
                "history, which is not what C git costs a maintained server."
            )
        for section, label, flags in (
            ("clone-v2", "full clone, protocol v2", ["-c", "protocol.version=2"]),
            ("clone-v0", "full clone, protocol v0", ["-c", "protocol.version=0"]),
            ("blobless", "blobless clone (v2, `--filter=blob:none`)", ["--filter=blob:none"]),
            ("depth1", "depth-1 clone (v2, `--depth 1`)", ["--depth", "1"]),
        ):
            if section not in only:
                continue
            git_flags = [f for f in flags if f.startswith("protocol")]
            clone_flags = [f for f in flags if f not in git_flags and f != "-c"]

            def clone(
                s: Server,
                section: str = section,
                git_flags: list[str] = git_flags,
                cf: list[str] = clone_flags,
            ) -> float:
                dest = bench.scratch()
                pre = ["-c", git_flags[0]] if git_flags else []
                url = f"{s.url}/{served[s.name]}.git"
                took = measured(
                    section,
                    s,
                    lambda: bench.git(*pre, "clone", "-q", "--bare", *cf, url, str(dest)),
                )
                shutil.rmtree(dest)
                return took

            more = depth1_runs if section == "depth1" else None
            bench.paired(servers, clone, more)
            report(section, label)

        if "incremental" in only:
            # Incremental push and fetch: one local repository gains 20 commits per run;
            # each server has a fetching repository, a local clone of the source (the
            # objects and refs the server holds) whose origin is the server.
            local = work / "local.git"
            bench.git("clone", "-q", "--bare", str(source), str(local))
            fetchers = {}
            for s in servers:
                fetchers[s.name] = work / f"fetch-{s.name}.git"
                bench.git("clone", "-q", "--bare", str(source), str(fetchers[s.name]))
                url = f"{s.url}/{served[s.name]}.git"
                bench.git("remote", "set-url", "origin", url, cwd=fetchers[s.name])

            def push(s: Server) -> float:
                return bench.git("push", "-q", f"{s.url}/{served[s.name]}.git", "main", cwd=local)

            def fetch(s: Server) -> float:
                refspec = "+refs/heads/*:refs/heads/*"
                return bench.git("fetch", "-q", "origin", refspec, cwd=fetchers[s.name])

            for i in range(runs):
                bench.fast_import_commits(local, NEW_COMMITS)
                order = servers if i % 2 == 0 else servers[::-1]
                for s in order:
                    measured("incremental-push", s, partial(push, s))
                for s in order:
                    measured("incremental-fetch", s, partial(fetch, s))
            report("incremental-push", f"incremental push ({NEW_COMMITS} commits)")
            report("incremental-fetch", f"incremental fetch ({NEW_COMMITS} commits)")

        def ls_remotes(s: Server) -> float:
            def all_of_them() -> float:
                start = time.perf_counter()
                for _ in range(LS_REMOTES):
                    bench.git("ls-remote", f"{s.url}/{served[s.name]}.git")
                return time.perf_counter() - start

            return measured("ls-remote", s, all_of_them)

        if "ls-remote" in only:
            bench.paired(servers, ls_remotes)
            report("ls-remote", f"{LS_REMOTES} sequential `git ls-remote`")

        def concurrent(s: Server) -> float:
            def round_of_clones() -> float:
                start = time.perf_counter()
                with ThreadPoolExecutor(CONCURRENT_CLONES) as pool:
                    list(
                        pool.map(lambda _: bench.clone(s, served[s.name]), range(CONCURRENT_CLONES))
                    )
                return time.perf_counter() - start

            return measured("concurrent", s, round_of_clones)

        if "concurrent" in only:
            bench.paired(servers, concurrent)
            report("concurrent", f"{CONCURRENT_CLONES} concurrent full clones (wall)")
            after.append(
                f"On {os.cpu_count()} cores the {CONCURRENT_CLONES} concurrent clones' own "
                "work (the clients' CPU above) is most of their wall time."
            )
    finally:
        for s in servers:
            s.proc.terminate()
        for s in servers:
            s.proc.communicate(timeout=60)
    load = os.getloadavg()
    if name in SMALL_PROFILES:
        what = f"`RepoSpec(commits={spec.commits}, files={spec.files})`"
    else:
        what = f"profile `{name}` (`enroute_testing.repogen.PROFILES[{name!r}]`, seed {spec.seed})"
    return [
        f"Repository: {what}, generated in {gen_s:.1f} s (cached under `.bench-cache/`): "
        f"{shape}. Enroute: `enroute dev` (ledger, compute, gitproto on loopback, file:// "
        "store). Reference: `git http-backend` behind the threaded CGI bridge "
        "`bench/http_backend.py` (one CGI process per request). "
        f"{runs} runs each ({depth1_runs} of the depth-1 clone), alternating "
        "servers, each run after `sync`. Load average at the end: "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min; other work shared "
        "the machine).",
        "",
        *(line for note in notes for line in (note, "")),
        "Wall seconds of the git client, from its start to its exit:",
        "",
        "| measurement | enroute s min / median / max | git http-backend s min / median / max"
        " | ratio of medians | paired ratio min / median / max |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "The server's CPU seconds (enroute: the dev process and its roles; git: the bridge "
        "and the CGI processes it has reaped) and its peak RSS in MiB (`bench.git.Meter`: "
        "every 20 ms, the VmHWM of the server's processes alive then, added up; the long-lived "
        "ones' reset at the start; the largest sum), min / median / max over the runs; the "
        "git clients' CPU seconds, median:",
        "",
        "| measurement | enroute CPU s | git http-backend CPU s | enroute peak RSS MiB"
        " | git http-backend peak RSS MiB | clients' CPU s enroute / git |",
        "|---|---|---|---|---|---|",
        *server_rows,
        "",
        "Enroute per role (`bench.git.Meter`): CPU seconds and peak RSS in MiB (the "
        "role's VmHWM, reset at the start), medians over the runs. Before any work "
        f"(VmRSS MiB, of it mapped files): {baseline}.",
        "",
        "| measurement | " + " | ".join(f"{r} CPU s / MiB" for r in ROLES) + " |",
        "|---|" + "---|" * len(ROLES),
        *role_rows,
        "",
        *_s3_table(s3_rows),
        *(line for note in after for line in (note, "")),
        "Targets (ratio enroute/git): clones at most 1.0x, initial push at most 1.5x, "
        "ls-remote at most 1.0x.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    choices = [*SMALL_PROFILES, *PROFILES]
    parser.add_argument("--profile", choices=choices, default="default", help="what to generate")
    parser.add_argument("--quick", action="store_true", help="same as --profile quick")
    parser.add_argument("--runs", type=int, default=None, help="runs per measurement")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed")
    parser.add_argument("--cache", type=Path, default=CACHE, help="generated repositories")
    parser.add_argument("--note", default="", help="a sentence for the report (why fewer runs)")
    parser.add_argument(
        "--section", default="", help="write this section instead (a subset run beside a full one)"
    )
    parser.add_argument(
        "--s3", action="store_true", help="also enroute dev on SeaweedFS under a 1/4 disk budget"
    )
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help="servers on the last CPU, the git client on the others (a diagnostic)",
    )
    args = parser.parse_args()
    name = "quick" if args.quick else args.profile
    large = name not in SMALL_PROFILES
    only = frozenset(
        n.strip() for n in (args.only or ",".join(LARGE_SECTIONS if large else SECTIONS)).split(",")
    ) - {""}
    if unknown := only - set(SECTIONS):
        parser.error(f"unknown --only names {sorted(unknown)}; choose from {SECTIONS}")
    runs = args.runs or (3 if name in ("quick", "large") else 5)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="enroute-bench-git-"))
        s3 = stack.enter_context(seaweedfs_server(buckets=(BUCKET,))) if args.s3 else None
        try:
            lines = run(
                Path(tmp),
                name,
                runs,
                only,
                cache=args.cache,
                seed=args.seed,
                s3=s3,
                split_cores=args.split_cores,
            )
        except subprocess.CalledProcessError:
            _show_server_logs(Path(tmp))
            raise
    if args.note:
        lines[1:1] = ["", args.note]
    # --s3: a section of its own, so a file:// run's section stays as it was measured
    section = ("git" if not large else f"git-{name}") + ("-s3" if args.s3 else "")
    write_section(args.section or section, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
