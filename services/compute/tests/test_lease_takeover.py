"""A maintenance lease held by a compute that dies mid-merge is taken over after it
expires (issue "Layer maintenance", acceptance: "a crashed holder's lease is taken over
after expiry"; seed 001, "Reclaiming layer files": leases by CAS with an expiry).

Two real compute processes (``python -m enroute_compute``) share one ledger process and
one file store. Pushes of large random blobs keep the planner merging; meanwhile the
lease holder is stopped (SIGSTOP) and its scratch directory looked at, and it is killed
(SIGKILL) only when a merge file is there, so the kill lands mid-merge by construction
rather than by timing. The other compute takes the lease once it has expired, finishes
the compaction, and a clone through it is fsck-clean with every acknowledged blob.
Every wait is bounded in time.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from enroute_testing.env import service_env
from enroute_testing.gitcli import run_git
from enroute_testing.ready import START_TIMEOUT_S, read_ready
from enroute_testing.repogen import list_refs
from enroute_testing.waiting import wait_until

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SEED = int(os.environ.get("ENROUTE_SEED", "23"))
LEASE_S = 3.0
MAX_PUSHES = 24
CATCH_S = 60.0
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

    term = 0  # of the lease when this compute was caught holding it

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
        env=service_env(),
    )
    assert process.stdout is not None
    ready = read_ready(
        process.stdout, "compute", START_TIMEOUT_S, (tmp_path / f"{node}.log").read_text
    )
    return Compute(node, process, ready["grpc"], ready["http"], data)


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


def _catch_holder_merging(
    name: str, computes: tuple[Compute, Compute], pushes_failed: Callable[[], bool]
) -> Compute:
    """Stop (SIGSTOP) the lease holder and look in its scratch directory; resume it
    unless a merge file is there. A stopped process cannot finish its merge between
    the look and the kill, so the kill lands mid-merge by construction, and sampling
    while pushes keep the planner busy bounds how long catching one takes.
    """
    deadline = time.monotonic() + CATCH_S
    looks = 0
    while time.monotonic() < deadline:
        for c in computes:
            holders = c.status()["maintenance"]["lease_holders"]
            if name not in holders:
                continue
            c.process.send_signal(signal.SIGSTOP)
            looks += 1
            if c.merging():
                c.term = int(holders[name].rsplit("@", 1)[1])
                return c
            c.process.send_signal(signal.SIGCONT)
        if pushes_failed():
            break
        time.sleep(0.002)
    raise AssertionError(
        f"no merge in flight in {looks} looks at the lease holder; "
        f"{[c.status()['maintenance'] for c in computes]}"
    )


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
    initial = run_git(["rev-parse", "HEAD"], cwd=work).strip()

    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    # Commit i adds blob0..blob{i}; made up front so the pusher only pushes.
    commits: list[bytes] = []
    blobs: dict[str, bytes] = {}
    for i in range(MAX_PUSHES):
        blobs[f"blob{i}.bin"] = rng.randbytes(BLOB_BYTES)
        (work / f"blob{i}.bin").write_bytes(blobs[f"blob{i}.bin"])
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"blob {i}"], cwd=work)
        commits.append(run_git(["rev-parse", "HEAD"], cwd=work).strip())

    # Push one commit at a time through a while merges run, until a holder is caught.
    caught = threading.Event()
    acked: list[int] = []
    in_flight: list[int] = []
    failures: list[BaseException] = []

    def pusher() -> None:
        for i, oid in enumerate(commits):
            if caught.is_set():
                return
            in_flight[:] = [i]
            try:
                run_git(
                    ["push", "-q", f"{urls[a.node]}/{name}.git", f"{oid.decode()}:refs/heads/main"],
                    cwd=work,
                )
            except Exception as e:
                if not caught.is_set():  # else a was killed under it: outcome unknown
                    failures.append(e)
                return
            acked.append(i)
            in_flight.clear()

    thread = threading.Thread(target=pusher, daemon=True)
    thread.start()
    try:
        victim = _catch_holder_merging(name, (a, b), lambda: bool(failures))
    except AssertionError as e:
        raise AssertionError(f"{e}; pushes acknowledged {acked}, failed {failures}") from None
    caught.set()
    # The victim is stopped (SIGSTOP) with a merge file in its scratch: kill it there.
    survivor = b if victim is a else a
    survivor_merges = survivor.status()["maintenance"]["merges"]
    killed_at = time.monotonic()
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)
    thread.join(60)
    assert not thread.is_alive()
    assert not failures, failures
    # The final value is the last acknowledged push, or the one in flight at the kill.
    possible = {commits[acked[-1]] if acked else initial: acked[-1] if acked else -1}
    if in_flight:
        possible[commits[in_flight[0]]] = in_flight[0]

    if victim is a:  # the pushes went through a; b must see the last one
        run_git(["ls-remote", f"{urls[b.node]}/{name}.git"], cwd=work)
    wait_until(
        lambda: name in survivor.status()["maintenance"]["lease_holders"],
        DEADLINE_S,
        "the survivor holds the lease",
        poll_s=0.01,
        explain=lambda: survivor.status()["maintenance"],
    )
    took_s = time.monotonic() - killed_at
    print(f"victim {victim.node}; lease taken over after {took_s:.2f} s")
    # Taken over (a new term), not handed over, and only once the old lease expired.
    term = int(survivor.status()["maintenance"]["lease_holders"][name].rsplit("@", 1)[1])
    assert term > victim.term >= 1
    assert took_s <= LEASE_S + 5.0, took_s  # the expiry, plus passes on a loaded machine

    def settled() -> bool:
        m = survivor.status()["maintenance"]
        return bool(m["merges"] > survivor_merges and m["layers"].get(name, 99) <= 3)

    wait_until(
        settled,
        2 * DEADLINE_S,
        "the survivor finishes the compaction",
        poll_s=0.01,
        explain=lambda: survivor.status()["maintenance"],
    )
    status = survivor.status()["maintenance"]
    print(f"survivor status: {status}")
    assert status["lease_holders"][name].startswith(survivor.node + "@")

    clone = tmp_path / "clone.git"
    url = urls[survivor.node]
    run_git(["clone", "-q", "--mirror", f"{url}/{name}.git", str(clone)], cwd=tmp_path)
    run_git(["fsck", "--strict", "--no-progress"], cwd=clone)
    final = list_refs(clone)[b"refs/heads/main"]
    assert final in possible, (final, possible)
    for i in range(possible[final] + 1):
        path = f"blob{i}.bin"
        assert run_git(["cat-file", "blob", f"main:{path}"], cwd=clone) == blobs[path], path
