"""Git smart-HTTP benchmarks: Enroute against C git's ``git http-backend``, section "git".

Both servers run side by side in the same run and serve the same generated
repositories to the same git client (scrubbed environment); every measurement
alternates between them. Reported: wall time min / median / max over runs, and
the ratio enroute/git of paired runs. Targets: clones at most 1.0x, initial
push at most 1.5x, ls-remote at most 1.0x.

Usage: ``python -m bench.git [--quick] [--runs N] [--only NAME,...]`` from the checkout root;
``--only`` runs a subset of the measurements (names: ``SECTIONS``).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.report import CLK_TCK, ROOT, Series, cpu_ticks, fmt3, write_section
from enroute_testing.gitcli import git_env
from enroute_testing.repogen import RepoSpec, generate_repo

READY_TIMEOUT_S = 120.0
NEW_COMMITS = 20
LS_REMOTES = 100
CONCURRENT_CLONES = 8
SHORT_RUNS_FACTOR = 3
"""The depth-1 clone (about 0.1 s) runs this many times as often as the rest."""
SECTIONS = ("push", "clone-v2", "clone-v0", "blobless", "depth1", "incremental", "ls-remote",
            "concurrent")  # fmt: skip


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[str]


def _start(name: str, argv: list[str], marker: str, log: Path | None = None) -> Server:
    """Start a server and wait for its ready line; its stderr goes to ``log`` (shown when
    it exits early) or nowhere."""
    # ENROUTE_* variables are configuration to the roles; the report path is not theirs.
    env = {k: v for k, v in os.environ.items() if k != "ENROUTE_BENCH_REPORT"}
    with open(log or os.devnull, "wb") as err:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True
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


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


REAP_WAIT_S = 5.0


def _server_cpu_s(s: Server) -> float:
    """CPU of a server so far: enroute's dev process and its roles, or the bridge with
    the CGI processes it has waited for."""
    pid = s.proc.pid
    if s.name == "git":
        # A CGI process ends after its response: wait until the bridge has reaped it.
        deadline = time.monotonic() + REAP_WAIT_S
        while _children(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return cpu_ticks(pid, reaped=True) / CLK_TCK
    return sum(cpu_ticks(p) for p in [pid, *_children(pid)]) / CLK_TCK


def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class Bench:
    def __init__(self, work: Path, runs: int) -> None:
        self.work = work
        self.runs = runs
        home = work / "home"
        home.mkdir()
        self.env = git_env(home)
        self.counter = 0

    def git(self, *args: str, cwd: Path | None = None) -> float:
        start = time.perf_counter()
        subprocess.run(
            ["git", *args],
            cwd=cwd or self.work,
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - start

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


def run(
    work: Path, spec: RepoSpec, runs: int, only: frozenset[str] = frozenset(SECTIONS)
) -> list[str]:
    bench = Bench(work, runs)
    t0 = time.perf_counter()
    source = generate_repo(work / "source.git", spec).path
    gen_s = time.perf_counter() - t0
    objects = subprocess.run(
        ["git", "count-objects", "-v"],
        check=True,
        cwd=source,
        env=bench.env,
        capture_output=True,
        text=True,
    ).stdout
    size = dict(line.split(": ") for line in objects.splitlines())
    python = sys.executable
    enroute = str(Path(python).parent / "enroute")
    servers = [
        _start(
            "enroute",
            [enroute, "dev", "--listen", "127.0.0.1:0", "--data", str(work / "enroute-data")],
            "enroute ready: ",
            work / "enroute.stderr",
        ),
        _start(
            "git",
            [python, "-m", "bench.http_backend", "--root", str(work / "git-root")],
            "reference ready: ",
            work / "git.stderr",
        ),
    ]
    rows: list[str] = []
    notes: list[str] = []
    try:
        push_refs = ["refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"]

        cpu: dict[tuple[str, str], list[tuple[float, float]]] = {}

        def with_cpu(section: str, s: Server, work: Callable[[], float]) -> float:
            """``work``'s result; the server's and the clients' CPU kept under ``section``."""
            server0 = _server_cpu_s(s)
            kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            took = work()
            kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            clients = kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime
            cpu.setdefault((section, s.name), []).append((_server_cpu_s(s) - server0, clients))
            return took

        def cpu_note(section: str, what: str) -> str:
            def med(name: str, i: int) -> float:
                return statistics.median(x[i] for x in cpu[section, name])

            return (
                f"CPU per {what}, median: the server {med('enroute', 0):.2f} s for enroute "
                f"(its three roles) and {med('git', 0):.2f} s for `git http-backend` (the "
                f"bridge and its CGI processes); the git clients {med('enroute', 1):.2f} s "
                f"and {med('git', 1):.2f} s."
            )

        def initial_push(s: Server) -> float:
            bench.counter += 1
            url = f"{s.url}/push-{bench.counter}.git"
            return with_cpu("push", s, lambda: bench.git("push", "-q", url, *push_refs, cwd=source))

        if "push" in only:
            rows.append(_row("initial push", bench.paired(servers, initial_push)))
            notes.append(cpu_note("push", "initial push"))
        for s in servers:
            bench.git("push", "-q", f"{s.url}/main.git", *push_refs, cwd=source)
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
                s: Server, git_flags: list[str] = git_flags, cf: list[str] = clone_flags
            ) -> float:
                dest = bench.scratch()
                pre = ["-c", git_flags[0]] if git_flags else []
                took = bench.git(*pre, "clone", "-q", "--bare", *cf, f"{s.url}/main.git", str(dest))
                shutil.rmtree(dest)
                return took

            # a depth-1 clone takes about 0.1 s, near the noise of one run: more runs
            more = runs * SHORT_RUNS_FACTOR if section == "depth1" else None
            rows.append(_row(label, bench.paired(servers, clone, more)))

        if "incremental" in only:
            # Incremental push and fetch: one local repository gains 20 commits per run;
            # each server has a fetching clone made before the first run.
            local = work / "local.git"
            bench.git("clone", "-q", "--bare", str(source), str(local))
            fetchers = {}
            for s in servers:
                fetchers[s.name] = work / f"fetch-{s.name}.git"
                bench.git("clone", "-q", "--bare", f"{s.url}/main.git", str(fetchers[s.name]))
            pushes: dict[str, list[float]] = {s.name: [] for s in servers}
            fetches: dict[str, list[float]] = {s.name: [] for s in servers}
            for i in range(runs):
                bench.fast_import_commits(local, NEW_COMMITS)
                order = servers if i % 2 == 0 else servers[::-1]
                for s in order:
                    url = f"{s.url}/main.git"
                    pushes[s.name].append(bench.git("push", "-q", url, "main", cwd=local))
                for s in order:
                    fetches[s.name].append(
                        bench.git(
                            "fetch",
                            "-q",
                            "origin",
                            "+refs/heads/*:refs/heads/*",
                            cwd=fetchers[s.name],
                        )
                    )
            rows.append(
                _row(
                    f"incremental push ({NEW_COMMITS} commits)",
                    {k: Series(tuple(v)) for k, v in pushes.items()},
                )
            )
            rows.append(
                _row(
                    f"incremental fetch ({NEW_COMMITS} commits)",
                    {k: Series(tuple(v)) for k, v in fetches.items()},
                )
            )

        def ls_remotes(s: Server) -> float:
            start = time.perf_counter()
            for _ in range(LS_REMOTES):
                bench.git("ls-remote", f"{s.url}/main.git")
            return time.perf_counter() - start

        if "ls-remote" in only:
            rows.append(
                _row(f"{LS_REMOTES} sequential `git ls-remote`", bench.paired(servers, ls_remotes))
            )

        def concurrent(s: Server) -> float:
            def round_of_clones() -> float:
                start = time.perf_counter()
                with ThreadPoolExecutor(CONCURRENT_CLONES) as pool:
                    list(pool.map(lambda _: bench.clone(s, "main"), range(CONCURRENT_CLONES)))
                return time.perf_counter() - start

            return with_cpu("concurrent", s, round_of_clones)

        if "concurrent" in only:
            rows.append(
                _row(
                    f"{CONCURRENT_CLONES} concurrent full clones (wall)",
                    bench.paired(servers, concurrent),
                )
            )
            notes.append(
                cpu_note("concurrent", f"round of {CONCURRENT_CLONES} concurrent clones")
                + f" On {os.cpu_count()} cores the clients' own work is most of the wall time."
            )
        pids = [servers[0].proc.pid, *_children(servers[0].proc.pid)]
        enroute_kib = sum(_hwm_kib(p) for p in pids)
        bridge_kib = _hwm_kib(servers[1].proc.pid)
    finally:
        for s in servers:
            s.proc.terminate()
        outs = {s.name: s.proc.communicate(timeout=30)[0] for s in servers}
    cgi_kib = 0
    for line in outs["git"].splitlines():
        if line.startswith("cgi peak rss kib: "):
            cgi_kib = int(line.split(": ")[1])
    return [
        f"Repository: `RepoSpec(commits={spec.commits}, files={spec.files})`, generated in "
        f"{gen_s:.1f} s: {int(size['in-pack']) + int(size['count'])} objects, "
        f"{(int(size['size-pack']) + int(size['size'])) / 1024:.1f} MiB packed. "
        "Enroute: `enroute dev` (ledger, compute, "
        "gitproto on loopback, file:// store). Reference: `git http-backend` behind the "
        "threaded CGI bridge `bench/http_backend.py` (one CGI process per request). "
        f"{runs} runs each ({runs * SHORT_RUNS_FACTOR} of the depth-1 clone, which takes "
        "about 0.1 s), alternating servers; wall seconds of the git client.",
        "",
        "| measurement | enroute s min / median / max | git http-backend s min / median / max"
        " | ratio of medians | paired ratio min / median / max |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Peak RSS: enroute {enroute_kib / 1024:.0f} MiB (VmHWM of the dev process and its "
        f"{len(pids) - 1} children, summed); git http-backend bridge {bridge_kib / 1024:.0f} MiB "
        f"plus at most {cgi_kib / 1024:.0f} MiB per CGI request (largest VmHWM summed "
        "over one `git http-backend` process tree with its upload-pack / receive-pack and "
        "pack-objects, sampled every 20 ms).",
        "",
        *(line for note in notes for line in (note, "")),
        "Targets (ratio enroute/git): clones at most 1.0x, initial push at most 1.5x, "
        "ls-remote at most 1.0x.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small inputs, for a smoke run")
    parser.add_argument("--runs", type=int, default=None, help="runs per measurement")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )
    args = parser.parse_args()
    only = frozenset(n.strip() for n in args.only.split(",") if n.strip())
    if unknown := only - set(SECTIONS):
        parser.error(f"unknown --only names {sorted(unknown)}; choose from {SECTIONS}")
    runs = args.runs or (3 if args.quick else 5)
    spec = RepoSpec(commits=100, files=50) if args.quick else RepoSpec(commits=2000, files=500)
    with tempfile.TemporaryDirectory(prefix="enroute-bench-git-") as tmp:
        lines = run(Path(tmp), spec, runs, only)
    write_section("git", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
