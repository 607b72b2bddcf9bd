"""Peak memory of a compute under concurrent clones and pushes, beside C git's on the same
work, written to docs/benchmarks.md (section "Compute memory"; issue 18, item 4).

One `enroute dev` (ledger, compute, gitproto on loopback, a file:// store) with
``node.page_cache`` and ``node.cache`` set (64 MiB each by default), and C git's
``git http-backend`` behind ``bench/http_backend.py``. Each gets the generated
repository pushed once. Then, per server, one measurement: ``CLONES`` full clones
of it and ``PUSHES`` pushes of it into new repositories, all at once.

Read: the compute's own peak resident set (VmHWM, reset at the start by
``bench.git.Meter``, which also gives the peak of the whole process tree of each
server) and its resident set when idle after the setup push, which is the fixed
overhead of the formula docs/buffer-pool.md states:

    peak <= node.page_cache + node.cache + pushes * ingest allowance + overhead

Usage: ``python -m bench.compute_memory [--note TEXT]`` from the checkout root.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import yaml

from bench.git import CACHE, Bench, Meter, Server, _start
from bench.report import write_section
from enroute_core.base.limits import DEFAULT_LIMITS, MiB
from enroute_core.config import load_config
from enroute_testing.procmem import memory, role_pid
from enroute_testing.repogen import GeneratedRepo, RepoSpec, cached_repo, profile

CLONES = 8
PUSHES = 4
NODE = {"page_cache": "64MiB", "cache": "64MiB"}
SPEC: RepoSpec = replace(
    profile("large"), commits=40_000, big_blob_bytes=(40 * MiB, 56 * MiB, 40 * MiB)
)
"""The ``large`` profile at about half its history and big blobs: a pack near 150 MiB."""
PUSH_REFS = ["refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"]
PER_OBJECT_BYTES = 1024  # docs/ingest.md, "Memory": what a push holds per pack object


def _pack_mib(repo: GeneratedRepo) -> float:
    packs = (repo.path / "objects" / "pack").glob("*.pack")
    return sum(p.stat().st_size for p in packs) / MiB


def ingest_allowance(repo: GeneratedRepo) -> int:
    """One push of ``repo``'s objects, docs/ingest.md "Memory": the 128 MiB cache,
    about 1 KiB per object and twice the largest object."""
    sizes = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch-check=%(objectsize)"],
        cwd=repo.path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return (
        DEFAULT_LIMITS.ingest_body_cache_bytes_max
        + PER_OBJECT_BYTES * len(sizes)
        + 2 * max(map(int, sizes))
    )


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def _together(bench: Bench, server: Server, source: Path) -> tuple[float, list[str]]:
    """``CLONES`` full clones and ``PUSHES`` pushes at once: wall seconds and failures."""

    def clone(_: int) -> str:
        bench.clone(server, "main")
        return ""

    def push(i: int) -> str:
        url = f"{server.url}/load-{i}.git"
        bench.git("push", "-q", url, *PUSH_REFS, cwd=source)
        return ""

    started = time.monotonic()
    failures: list[str] = []
    with ThreadPoolExecutor(CLONES + PUSHES) as pool:
        jobs = [pool.submit(clone, i) for i in range(CLONES)]
        jobs += [pool.submit(push, i) for i in range(PUSHES)]
        for job in jobs:
            try:
                job.result()
            except subprocess.CalledProcessError as exc:
                failures.append(str(exc))
    return time.monotonic() - started, failures


def run(work: Path, note: str) -> list[str]:
    repo, gen_s = cached_repo(SPEC, CACHE, "compute-memory")
    bench = Bench(work, 1)
    config_path = work / "enroute.yaml"
    config_path.write_text(yaml.safe_dump({"node": NODE}))
    node = load_config(config_path.read_text(), {}).node
    enroute = str(Path(sys.executable).parent / "enroute")
    servers = [
        _start(
            "enroute",
            [
                enroute,
                "dev",
                "--listen",
                "127.0.0.1:0",
                "--data",
                str(work / "enroute-data"),
                "--config",
                str(config_path),
            ],
            "enroute ready: ",
            work / "enroute.stderr",
        ),
        _start(
            "git",
            [sys.executable, "-m", "bench.http_backend", "--root", str(work / "git-root")],
            "reference ready: ",
            work / "git.stderr",
        ),
    ]
    rows: list[str] = []
    try:
        load_before = _load()
        compute = role_pid(servers[0].proc.pid, "compute")
        started = memory(compute).rss_bytes
        for s in servers:
            bench.git("push", "-q", f"{s.url}/main.git", *PUSH_REFS, cwd=repo.path)
        idle = memory(compute).rss_bytes
        for s in servers:
            with Meter(s) as meter:
                took, failures = _together(bench, s, repo.path)
            peak = memory(compute).peak_bytes if s.name == "enroute" else 0
            compute_peak = f"{peak / MiB:.0f}" if peak else "-"
            failed = "; ".join(failures)[:200] or "none"
            rows.append(
                f"| {s.name} | {took:.1f} | {meter.cpu_s:.1f} | {meter.rss_kib / 1024:.0f} "
                f"| {compute_peak} | {failed} |"
            )
            if s.name == "enroute":
                enroute_peak = peak
    finally:
        for s in servers:
            s.proc.terminate()
            s.proc.wait(timeout=60)
    allowance = ingest_allowance(repo)
    formula = node.page_cache + node.cache + PUSHES * allowance + idle
    verdict = "within" if enroute_peak <= formula else "OVER"
    return [
        f"Issue 18, item 4: {CLONES} full clones and {PUSHES} pushes (into new "
        f"repositories) of one repository, all at once, against each server. "
        f"Repository: `bench.compute_memory.SPEC` (the `large` profile with "
        f"{SPEC.commits:,} commits and big blobs of "
        f"{', '.join(str(b // MiB) for b in SPEC.big_blob_bytes)} MiB), "
        f"{_pack_mib(repo):.0f} MiB packed, generated in {gen_s:.0f} s. Enroute: `enroute dev` "
        f"(file:// store) with `node.page_cache: {NODE['page_cache']}`, "
        f"`node.cache: {NODE['cache']}`. Reference: `git http-backend` behind "
        f"`bench/http_backend.py`. Load average before / after: {load_before} and "
        f"{_load()} (1 / 5 / 15 min; 2 cores, other work shared them).",
        "",
        *([note, ""] if note else []),
        "| server | wall s | server CPU s | peak RSS of the server's processes, MiB "
        "(`bench.git.Meter`) | compute's own peak RSS, MiB | failures |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f'The formula (docs/buffer-pool.md, "What a compute\'s memory is"): '
        f"`node.page_cache + node.cache + pushes x ingest allowance + overhead`, the "
        f"allowance of one push of this repository being 128 MiB + 1 KiB x objects + "
        f"2 x its largest object = {allowance / MiB:.0f} MiB: "
        f"{node.page_cache // MiB} + {node.cache // MiB} + {PUSHES} x {allowance / MiB:.0f} "
        f"+ {idle / MiB:.0f} (the compute's resident set when idle after the setup push; "
        f"{started / MiB:.0f} MiB when it had just started) "
        f"= {formula / MiB:.0f} MiB. The compute's peak, {enroute_peak / MiB:.0f} MiB, is "
        f"{verdict} it.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--note", default="", help="a sentence written above the table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-compute-memory-") as tmp:
        lines = run(Path(tmp), args.note)
    write_section("Compute memory", lines)


if __name__ == "__main__":
    main()
