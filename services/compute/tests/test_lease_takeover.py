"""A maintenance lease held by a compute that dies mid-merge is taken over after it
expires (issue "Layer maintenance", acceptance: "a crashed holder's lease is taken over
after expiry"; seed 001, "Reclaiming layer files": leases by CAS with an expiry).

Two real compute processes (``python -m enroute_compute``) share one ledger process and
one file store. Pushes of large random blobs keep both busy with merges; the compute
holding the repository's lease is killed with SIGKILL while a merge file is in its
scratch directory; the other one takes the lease once it has expired, finishes the
compaction, and a clone through it is fsck-clean with every pushed blob. Every wait is
bounded in time.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from enroute_testing.gitcli import run_git
from enroute_testing.repogen import list_refs

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SEED = int(os.environ.get("ENROUTE_SEED", "23"))
READY = re.compile(r"enroute compute ready: grpc=(\S+) http=(\S+)")
LEASE_S = 3.0
PUSHES = 8
BLOB_BYTES = 3 * 1024 * 1024
DEADLINE_S = 90.0


@dataclass
class Compute:
    node: str
    process: subprocess.Popen[str]
    grpc: str
    http: str
    data: Path

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.http}/status", timeout=5) as r:
            answer: dict[str, Any] = json.loads(r.read())
        return answer

    def merging(self) -> bool:
        scratch = self.data / "layers" / "scratch"
        return scratch.exists() and any(p.name.startswith("merge") for p in scratch.iterdir())


def _start(node: str, ledger: str, store: Path, tmp_path: Path) -> Compute:
    data = tmp_path / node
    config = tmp_path / f"{node}.yaml"
    config.write_text(
        f"node:\n  id: {node}\n  data_dir: {data}\n"
        f"store:\n  url: file://{store}\n"
        f"ledger:\n  members: ['{ledger}']\n"
        "listen:\n  grpc: 127.0.0.1:0\n  http: 127.0.0.1:0\n"
        "layers:\n  inline_max: 0\n  maintenance_interval: 100ms\n"
        f"  lease_duration: {LEASE_S}s\n  lease_margin: 1s\n"
        "  sweep_interval: 1s\n  sweep_retention: 3600s\n"
    )
    log = open(tmp_path / f"{node}.log", "w")  # noqa: SIM115 - the process owns it
    process = subprocess.Popen(
        [sys.executable, "-m", "enroute_compute", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = READY.search(line)
    assert match, f"{node} not ready: {line!r} {(tmp_path / f'{node}.log').read_text()[-2000:]}"
    return Compute(node, process, match.group(1), match.group(2), data)


@pytest.fixture
def computes(ledger_process: str, tmp_path: Path) -> Iterator[tuple[Compute, Compute]]:
    store = tmp_path / "store"
    started = [_start(n, ledger_process, store, tmp_path) for n in ("compute-a", "compute-b")]
    try:
        yield started[0], started[1]
    finally:
        for c in started:
            if c.process.poll() is None:
                c.process.send_signal(signal.SIGTERM)
                try:
                    c.process.wait(15)
                except subprocess.TimeoutExpired:
                    c.process.kill()
                    c.process.wait(5)


def _until(
    what: str,
    check: Callable[[], bool],
    limit_s: float = DEADLINE_S,
    explain: Callable[[], object] = lambda: "",
) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"not within {limit_s} s: {what} {explain()}")


def test_a_lease_held_by_a_killed_compute_is_taken_over_after_expiry(
    computes: tuple[Compute, Compute],
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
) -> None:
    a, b = computes
    urls = {c.node: f"http://127.0.0.1:{git_bridge(c.grpc).server_address[1]}" for c in (a, b)}
    name = f"takeover-{uuid.uuid4().hex[:8]}"
    work = tmp_path / "work"
    run_git(["init", "-q", "-b", "main", str(work)], cwd=tmp_path)
    (work / "README").write_text("takeover\n")
    run_git(["add", "."], cwd=work)
    run_git(["commit", "-q", "-m", "initial"], cwd=work)
    run_git(["push", "-q", f"{urls[a.node]}/{name}.git", "main"], cwd=work)
    run_git(["ls-remote", f"{urls[b.node]}/{name}.git"], cwd=work)  # b hosts it too

    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    blobs: dict[str, bytes] = {}
    victim: Compute | None = None
    victim_term = 0
    by_node = {a.node: a, b.node: b}
    for i in range(PUSHES):
        blobs[f"blob{i}.bin"] = rng.randbytes(BLOB_BYTES)
        (work / f"blob{i}.bin").write_bytes(blobs[f"blob{i}.bin"])
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"blob {i}"], cwd=work)
        run_git(["push", "-q", f"{urls[a.node]}/{name}.git", "main"], cwd=work)
    head = run_git(["rev-parse", "HEAD"], cwd=work).strip()

    # Kill the holder while a merge file is in its scratch (a merge in progress).
    def holder_merging() -> bool:
        nonlocal victim, victim_term
        for c in (a, b):
            holders = c.status()["maintenance"]["lease_holders"]
            if name in holders and c.merging():
                victim = by_node[c.node]
                victim_term = int(holders[name].rsplit("@", 1)[1])
                return True
        return False

    survivor_merges = 0
    try:
        _until("the lease holder is seen merging", holder_merging, 30.0)
    except AssertionError:
        # Merges finished before one was caught: push more so that one is in flight.
        for i in range(PUSHES, 2 * PUSHES):
            blobs[f"blob{i}.bin"] = rng.randbytes(BLOB_BYTES)
            (work / f"blob{i}.bin").write_bytes(blobs[f"blob{i}.bin"])
            run_git(["add", "."], cwd=work)
            run_git(["commit", "-q", "-m", f"blob {i}"], cwd=work)
            run_git(["push", "-q", f"{urls[a.node]}/{name}.git", "main"], cwd=work)
            if holder_merging():
                break
        head = run_git(["rev-parse", "HEAD"], cwd=work).strip()
        assert victim is not None, "no merge in flight was ever seen"
    assert victim is not None
    survivor = b if victim is a else a
    survivor_merges = survivor.status()["maintenance"]["merges"]
    killed_at = time.monotonic()
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)

    if victim is a:  # the pushes went through a; b must see the last one
        run_git(["ls-remote", f"{urls[b.node]}/{name}.git"], cwd=work)
    _until(
        "the survivor holds the lease",
        lambda: name in survivor.status()["maintenance"]["lease_holders"],
        explain=lambda: survivor.status()["maintenance"],
    )
    took_s = time.monotonic() - killed_at
    print(f"victim {victim.node}; lease taken over after {took_s:.2f} s")
    # Taken over (a new term), not handed over, and only once the old lease expired.
    term = int(survivor.status()["maintenance"]["lease_holders"][name].rsplit("@", 1)[1])
    assert term > victim_term >= 1
    assert took_s <= LEASE_S + 5.0, took_s  # the expiry, plus passes on a loaded machine

    def settled() -> bool:
        m = survivor.status()["maintenance"]
        return m["merges"] > survivor_merges and m["layers"].get(name, 99) <= 3

    _until(
        "the survivor finishes the compaction",
        settled,
        2 * DEADLINE_S,
        explain=lambda: survivor.status()["maintenance"],
    )
    status = survivor.status()["maintenance"]
    print(f"survivor status: {status}")
    assert status["lease_holders"][name].startswith(survivor.node + "@")

    clone = tmp_path / "clone.git"
    url = urls[survivor.node]
    run_git(["clone", "-q", "--mirror", f"{url}/{name}.git", str(clone)], cwd=tmp_path)
    run_git(["fsck", "--strict", "--no-progress"], cwd=clone)
    assert list_refs(clone)[b"refs/heads/main"] == head
    for path, data in blobs.items():
        assert run_git(["cat-file", "blob", f"main:{path}"], cwd=clone) == data, path
