"""Restart drill (issue 23, item 3): each role stopped with SIGTERM under a large clone and push.

Through the local cluster (three voters, two computes, gitproto, S3; the
internal token on), for gitproto, the compute serving the repository, and the
voter leading it: a clone and a push of a 12 MB incompressible blob each are
read and sent through a throttling proxy, so both are in flight on that
process when it gets SIGTERM (docs/reliability.md, "Graceful drain"). Then:

* the process drains and exits 0 by itself: the in-flight count its
  ``stopping:`` line gives includes our transfers (gitproto, compute), and it
  was not killed at the end of the test's grace;
* the clone completes (``git fsck --full`` of it is clean);
* the push is reported ok or failed, never half-applied: ok means the
  branch is at the pushed commit; failed means it is still at the old one;
  either way a fresh clone holds every object its refs reach;
* while the compute or the voter drains, a small push to another repository
  goes to the surviving compute or voter and succeeds;
* the process restarts and the cluster answers again.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from enroute_testing.cluster import COMPUTES, GITPROTO, Cluster, get_json, running_cluster
from enroute_testing.faultproxy import LinkMode, TcpProxy
from enroute_testing.gitcli import default_home, git_env, run_git

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BLOB_BYTES = 12 * 1024 * 1024
THROTTLE_CHUNK_BYTES = 32 * 1024
THROTTLE_DELAY_S = 0.02
"""At most 32 KiB per 20 ms each way (about 1.6 MB/s): a 12 MB transfer takes 7 s or more,
longer than the 2 s a stopping gRPC server grants its calls anyway (``server.stop(2)``),
so only the drain can let it finish."""
TERM_GRACE_S = 60.0
"""How long the test waits for a drained exit before it kills (then the drill fails)."""
IN_FLIGHT_WAIT_S = 30.0
GIT_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("drill")
    with running_cluster(root, faults=False) as started:
        yield started


@pytest.fixture(scope="module")
def throttled(cluster: Cluster) -> Iterator[str]:
    """The cluster's Git URL through a throttling proxy (the same port after a restart)."""
    host, port = cluster.members[GITPROTO].http.split(":")
    proxy = TcpProxy(host, int(port), chunk_bytes=THROTTLE_CHUNK_BYTES)
    proxy.start()
    proxy.set(LinkMode.DELAY, THROTTLE_DELAY_S)
    try:
        yield f"http://{proxy.address}"
    finally:
        proxy.stop()


def commit_blob(work: Path, name: str, seed: int) -> str:
    (work / name).write_bytes(random.Random(seed).randbytes(BLOB_BYTES))
    run_git(["add", name], cwd=work)
    run_git(["commit", "-q", "-m", name], cwd=work)
    return run_git(["rev-parse", "HEAD"], cwd=work).decode().strip()


def remote_ref(url: str, ref: str, cwd: Path) -> str | None:
    out = run_git(["ls-remote", url, ref], cwd=cwd, timeout_s=60).decode().split()
    return out[0] if out else None


def start_git(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["git", *args],
        cwd=cwd,
        env=git_env(default_home()),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def finish(proc: subprocess.Popen[bytes]) -> Finished:
    try:
        out, err = proc.communicate(timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return Finished(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def calls_in_flight(cluster: Cluster) -> dict[str, int]:
    out = {}
    for name in COMPUTES:
        try:
            status = get_json(f"http://{cluster.members[name].http}/status", timeout_s=5)
            out[name] = int(status["git_calls_in_flight"])
        except OSError:
            out[name] = 0
    return out


def wait_in_flight(
    cluster: Cluster, gits: list[subprocess.Popen[bytes]], wait_s: float = IN_FLIGHT_WAIT_S
) -> str | None:
    """The compute with a call of each of ``gits`` in flight (one repository: one compute);
    None when that was not seen within ``wait_s`` and every one of ``gits`` still runs."""
    deadline = time.monotonic() + wait_s
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        seen = calls_in_flight(cluster)
        for name, count in seen.items():
            if count >= len(gits):
                return name
        for git in gits:
            if git.poll() is not None:
                done = finish(git)
                raise AssertionError(f"{git.args!r} ended before the drill: {done}")
        time.sleep(0.1)
    if wait_s < IN_FLIGHT_WAIT_S:
        return None
    raise AssertionError(f"the transfers never were in flight together: {seen}")


def wait_receiving(clone_dir: Path, clone: subprocess.Popen[bytes]) -> None:
    """Wait until the clone reads its pack: index-pack has made its ``tmp_pack_*``.

    A call of the clone in flight on the compute may still be its ``ls-refs``: stopped
    then, gitproto has closed its port before the clone asks for the pack, which is
    refused (one gitproto here; an ingress would send it to another).
    """
    deadline = time.monotonic() + IN_FLIGHT_WAIT_S
    while time.monotonic() < deadline:
        if any(clone_dir.glob(".git/objects/pack/tmp_pack_*")):
            return
        if clone.poll() is not None:
            raise AssertionError(f"the clone ended before the drill: {finish(clone)}")
        time.sleep(0.05)
    raise AssertionError(f"the clone read no pack within {IN_FLIGHT_WAIT_S} s")


def stopping_line(cluster: Cluster, name: str) -> dict[str, object]:
    """The JSON log line in which ``name`` said it stops taking work (this start's)."""
    member = cluster.members[name]
    text = member.log_path.read_text(errors="replace")
    text = text[text.rfind(f"--- start {member.starts} at") :]
    for line in text.splitlines():
        if line.startswith("{") and '"stopping: ' in line:
            record: dict[str, object] = json.loads(line)
            return record
    raise AssertionError(f"{name} logged no stopping line:\n{text[-3000:]}")


DRAINED = {
    "gitproto": ("", "request cut by shutdown"),
    "compute": ("drained: every call in flight ended", "still running after"),
    "ledger": ("drained: ", "still open after"),
}
"""Per role: the line a drain that let its work end writes, and the one a cut drain writes."""


def drained_in_log(cluster: Cluster, name: str, role: str) -> None:
    member = cluster.members[name]
    text = member.log_path.read_text(errors="replace")
    text = text[text.rfind(f"--- start {member.starts} at") :]
    done, cut = DRAINED[role]
    assert done in text and cut not in text, f"{name} did not drain:\n{text[-3000:]}"


def in_flight_of(record: dict[str, object]) -> int:
    words = str(record["msg"]).replace(";", " ").split()
    return int(words[words.index("in") - 1])


def drill(cluster: Cluster, throttled: str, tmp_path: Path, role: str, seed: int) -> None:
    repo = f"drill/{role}"
    direct = cluster.git_url(repo)
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    base = commit_blob(src, "base.bin", seed)
    run_git(["push", "-q", direct, "main"], cwd=src, timeout_s=GIT_TIMEOUT_S)
    pushed = commit_blob(src, "more.bin", seed + 1)

    url = f"{throttled}/{repo}.git"
    push = start_git(["push", "--porcelain", url, "main"], src)
    serving = wait_in_flight(cluster, [push])  # its body arrives at the pace of the proxy
    clone = start_git(["clone", "-q", url, str(tmp_path / "clone")], tmp_path)
    wait_receiving(tmp_path / "clone", clone)
    # the clone's pack may pass whole into the buffers between the compute and the
    # proxy: then it is in flight on gitproto alone (as it is on the client)
    both = wait_in_flight(cluster, [push, clone], wait_s=1.0)
    assert push.poll() is None and clone.poll() is None, "a transfer ended before SIGTERM"
    victim = {"gitproto": GITPROTO, "compute": serving}.get(role) or cluster.leader_of(repo)
    assert victim is not None, f"no leader of {repo}"
    started = time.monotonic()
    cluster.begin_stop(victim)
    try:
        if role != "gitproto":  # new work goes to the surviving compute or voter meanwhile
            probe(cluster, role, tmp_path)
    finally:  # the next drill finds the cluster whole even when this one fails
        # killed after it (None); ensure_running of the next drill restarts it
        status = cluster.wait_exit(victim, TERM_GRACE_S)
        drained_s = time.monotonic() - started
    assert status == 0, f"{victim} did not exit 0 by itself within {TERM_GRACE_S} s: {status}"
    line = stopping_line(cluster, victim)
    drained_in_log(cluster, victim, role)
    if role != "ledger":  # the voter holds no Git call; its proposals are short
        assert in_flight_of(line) >= 1, line
    cluster.restart(victim)
    cluster.wait_readyz(victim)

    cloned = finish(clone)
    pushed_result = finish(push)
    print(f"{role}: {victim} drained in {drained_s:.1f} s (clone on the compute too: "
          f"{both is not None}); clone rc={cloned.returncode}; "
          f"push rc={pushed_result.returncode}")  # fmt: skip
    assert cloned.returncode == 0, cloned.stderr
    run_git(["fsck", "--full", "--strict"], cwd=tmp_path / "clone", timeout_s=GIT_TIMEOUT_S)
    head = run_git(["rev-parse", "HEAD"], cwd=tmp_path / "clone").decode().strip()
    assert head in (base, pushed)

    now = remote_ref(direct, "refs/heads/main", tmp_path)
    if pushed_result.returncode == 0:  # git push --porcelain: " \t<src>:<dst>\t<old>..<new>"
        assert f" \trefs/heads/main:refs/heads/main\t{base[:7]}" in pushed_result.stdout, (
            pushed_result.stdout
        )
        assert now == pushed, f"push reported ok, branch at {now}"
    else:
        assert now == base, f"push reported failed, branch at {now}: {pushed_result.stderr}"
    after = tmp_path / "after"
    run_git(["clone", "-q", direct, str(after)], cwd=tmp_path, timeout_s=GIT_TIMEOUT_S)
    run_git(["fsck", "--full", "--strict"], cwd=after, timeout_s=GIT_TIMEOUT_S)
    assert run_git(["rev-parse", "HEAD"], cwd=after).decode().strip() == now


def probe(cluster: Cluster, role: str, tmp_path: Path) -> None:
    """A small push to a repository of its own: it must succeed while a member drains."""
    work = tmp_path / "probe"
    run_git(["init", "-q", "-b", "side", str(work)], cwd=tmp_path)
    (work / "f").write_text(role)
    run_git(["add", "f"], cwd=work)
    run_git(["commit", "-q", "-m", "probe"], cwd=work)
    # traced: an answer other than ok shows its HTTP exchange, body included
    env = {**git_env(default_home()), "GIT_TRACE_CURL": "1"}
    done = subprocess.run(["git", "push", "-q", cluster.git_url(f"drill/{role}-probe"), "side"],
                          cwd=work, env=env, capture_output=True, timeout=GIT_TIMEOUT_S,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-6000:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("role", ["gitproto", "compute", "ledger"])
def test_restart_under_clone_and_push(
    cluster: Cluster, throttled: str, tmp_path: Path, role: str
) -> None:
    cluster.ensure_running()
    seed = int(os.environ.get("ENROUTE_SEED", "23"))  # the blobs' bytes
    print(f"ENROUTE_SEED={seed}")
    drill(cluster, throttled, tmp_path, role, seed=seed + len(role))
