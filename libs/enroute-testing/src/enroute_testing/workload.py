"""Concurrent git clients against a cluster, every operation recorded (history.py).

Each client is a thread with its own seeded random stream, its own git home
and one bare repository per test repository. It picks operations from a mix:

* ``push``: a new commit (unique token in message and file) on top of the
  value the client last saw for a branch, pushed with the real git CLI and
  ``--force-with-lease=<ref>:<expected>`` -- a compare-and-swap, a
  fast-forward when it wins; a branch delete now and then;
* ``api_commit``: ``POST /api/v1/repos/<repo>/-/commits`` with ``expected_oid``;
* ``fetch`` (into the client's repository: git checks the pack is complete),
  ``ls_refs`` (``git ls-remote``, protocol v2) and ``clone`` (a fresh bare
  clone, then ``git fsck``): reads of every branch;
* ``create`` / ``delete`` of the repository over REST (only when enabled).

Everything is bounded: clients, operations, wall time, and each git call.
After the run, :func:`check` heals nothing by itself: the caller heals the
cluster, then :func:`check` reads the final state through a mirror clone
and verifies the invariants listed in docs/reliability.md.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import random
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enroute_testing.gitcli import git_env
from enroute_testing.history import (
    PENDING,
    Record,
    Recorder,
    RefMap,
    Report,
    acknowledged_writes,
    check_records,
)

GIT_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 30.0
BRANCHES = ("main", "b1", "b2")
PACK_ERRORS = (
    "did not send all necessary objects",
    "bad object",
    "missing blob",
    "missing tree",
    "missing commit",
    "fatal: pack",
    "index-pack failed",
    "invalid index-pack output",
    "unresolved deltas",
)
CUT_SHORT = "transfer closed with outstanding read data remaining"
"""curl's error 18: the response ended without its last chunk, which gitproto does when a
compute fails after the answer started (githttp.py, rule 4). index-pack then reports the
truncated pack ("early EOF", "invalid index-pack output"): a failed read, not a bad pack."""
MISSING_REPO = ("not found", "error: 404", "does not exist")
"""What git prints for a repository that is not there. A bare "404" matched the port of
a failed read's gRPC error ("UNAVAILABLE: ipv4:127.0.0.1:40431"), which then counted as
a read of an empty repository and made a correct history illegal."""


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    seed: int
    repos: tuple[str, ...]
    clients: int = 4
    duration_s: float = 10.0
    ops_max: int = 200
    """Operations of all clients together."""
    mix: tuple[tuple[str, int], ...] = (
        ("push", 35),
        ("api_commit", 15),
        ("fetch", 20),
        ("ls_refs", 15),
        ("clone", 10),
        ("branch_delete", 5),
    )
    repo_ops: bool = False
    """Add creates and deletes of whole repositories."""
    think_s: float = 0.0
    pace_s: float = 0.0
    """Each client starts at most one operation per this many seconds (0: back to back).
    Bounds the rate (``clients / pace_s``) independently of how fast the cluster answers,
    so that a budget of :meth:`ops_for` ``(duration_s)`` lasts the whole duration: a
    scenario whose fault ends the load needs it running until then, and an idle machine
    serves back-to-back operations fast enough to spend any fixed budget early."""
    blob_bytes: int = 0
    """Up to this many extra incompressible bytes in each pushed commit (uniformly drawn):
    bigger packs, a longer ingest, layers past ``layers.inline_max`` go to the store."""
    op_timeout_s: float = GIT_TIMEOUT_S
    """Each git call and HTTP request; one that takes longer counts as unknown."""

    def ops_for(self, duration_s: float) -> int:
        """Most operations the paced clients can start in ``duration_s``."""
        assert self.pace_s > 0, "only paced clients have a rate bound"
        return self.clients * (math.floor(duration_s / self.pace_s) + 1)


@dataclass
class _Client:
    index: int
    rng: random.Random
    home: Path
    work: Path
    known: dict[str, dict[str, str]] = field(default_factory=dict)
    made: int = 0


class Workload:
    """``w = Workload(url, work, config); w.start(); ...faults...; w.join()``."""

    def __init__(self, base_url: str, work: Path, config: WorkloadConfig) -> None:
        self.base_url = base_url.rstrip("/")
        self.work = work
        self.config = config
        self.history = Recorder()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._ops_left = config.ops_max
        self._lock = threading.Lock()
        self.tokens: dict[str, str] = {}  # commit oid -> token (commits the clients built)
        self.errors: list[str] = []

    # -- running

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        for i in range(self.config.clients):
            home = self.work / f"c{i}" / "home"
            home.mkdir(parents=True, exist_ok=True)
            rng = random.Random(self.config.seed * 1000 + i)
            client = _Client(i, rng, home, self.work / f"c{i}")
            t = threading.Thread(target=self._run_client, args=(client,), daemon=True)
            self._threads.append(t)
        self._deadline = time.monotonic() + self.config.duration_s
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    def running(self) -> bool:
        """Some client still runs operations (none has hit the time or operation bound)."""
        return any(t.is_alive() for t in self._threads)

    def join(self, timeout_s: float | None = None) -> None:
        limit = self.config.duration_s + 4 * self.config.op_timeout_s
        limit = timeout_s if timeout_s is not None else limit
        end = time.monotonic() + limit
        for t in self._threads:
            t.join(max(0.1, end - time.monotonic()))
        stuck = [t for t in self._threads if t.is_alive()]
        assert not stuck, f"{len(stuck)} clients still running after {limit} s"

    def run(self) -> None:
        self.start()
        self.join()

    def _take(self) -> bool:
        with self._lock:
            if self._ops_left <= 0:
                return False
            self._ops_left -= 1
            return True

    def _run_client(self, c: _Client) -> None:
        kinds = [k for k, _ in self.config.mix]
        weights = [w for _, w in self.config.mix]
        if self.config.repo_ops:
            kinds += ["create", "delete"]
            weights += [4, 3]
        while not self._stop.is_set() and time.monotonic() < self._deadline and self._take():
            began = time.monotonic()
            kind = c.rng.choices(kinds, weights)[0]
            repo = c.rng.choice(self.config.repos)
            try:
                getattr(self, "_op_" + kind)(c, repo)
            except Exception as e:  # a bug in the client itself, not the server
                self.errors.append(f"client {c.index} {kind} {repo}: {e!r}")
            if self.config.think_s:
                time.sleep(c.rng.random() * self.config.think_s)
            if self.config.pace_s:
                self._stop.wait(max(0.0, began + self.config.pace_s - time.monotonic()))

    # -- helpers

    def _git(self, c: _Client, args: list[str], cwd: Path,
             input: bytes = b"") -> subprocess.CompletedProcess[bytes]:  # fmt: skip
        try:
            return subprocess.run(
                ["git", *args],
                cwd=cwd,
                env=git_env(c.home),
                input=input,
                capture_output=True,
                timeout=self.config.op_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(["git", *args], -1, b"", b"(git timed out)")

    def _local(self, c: _Client, repo: str) -> Path:
        path = c.work / repo
        if not (path / "HEAD").exists():
            path.mkdir(parents=True, exist_ok=True)
            self._git(c, ["init", "--quiet", "--bare"], path)
        return path

    def url(self, repo: str) -> str:
        return f"{self.base_url}/{repo}.git"

    def _token(self, c: _Client) -> str:
        c.made += 1
        return f"t{self.config.seed}-c{c.index}-{c.made}"

    def _has(self, c: _Client, local: Path, oid: str) -> bool:
        return self._git(c, ["cat-file", "-e", oid + "^{commit}"], local).returncode == 0

    def _pack_anomaly(self, rec: Record, stderr: str) -> None:
        if CUT_SHORT not in stderr and any(p in stderr for p in PACK_ERRORS):
            self.history.anomaly(f"op #{rec.op_id} {rec.kind} {rec.repo}: {stderr[-300:]!r}")

    # -- reads

    def _read_remote_refs(self, c: _Client, local: Path) -> RefMap:
        out = self._git(c, ["for-each-ref", "--format=%(objectname) %(refname)", "refs/o/"], local)
        refs = []
        for line in out.stdout.decode().splitlines():
            oid, name = line.split(" ", 1)
            refs.append(("refs/heads/" + name.removeprefix("refs/o/"), oid))
        return tuple(sorted(refs))

    def _op_fetch(self, c: _Client, repo: str) -> None:
        local = self._local(c, repo)
        rec = self.history.invoke(c.index, "fetch", repo, ("read",))
        done = self._git(
            c,
            ["-c", "protocol.version=2", "fetch", "--quiet", "--prune", "--no-tags",
             self.url(repo), "+refs/heads/*:refs/o/*"],
            local,
        )  # fmt: skip
        self._finish_read(c, rec, done, lambda: self._read_remote_refs(c, local))

    def _op_ls_refs(self, c: _Client, repo: str) -> None:
        local = self._local(c, repo)
        rec = self.history.invoke(c.index, "ls_refs", repo, ("read",))
        done = self._git(
            c, ["-c", "protocol.version=2", "ls-remote", self.url(repo), "refs/heads/*"], local
        )

        def parse() -> RefMap:
            pairs = (line.split("\t", 1) for line in done.stdout.decode().splitlines())
            return tuple(sorted((name, oid) for oid, name in pairs))

        self._finish_read(c, rec, done, parse)

    def _op_clone(self, c: _Client, repo: str) -> None:
        target = c.work / f"clone-{c.made}-{c.rng.randrange(1 << 30)}"
        c.made += 1
        rec = self.history.invoke(c.index, "clone", repo, ("read",))
        done = self._git(c, ["clone", "--quiet", "--bare", self.url(repo), str(target)], c.work)

        def parse() -> RefMap:
            out = self._git(
                c, ["for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/"], target
            )
            pairs = (x.split(" ", 1) for x in out.stdout.decode().splitlines())
            return tuple(sorted((n, o) for o, n in pairs))

        try:
            self._finish_read(c, rec, done, parse)
            if done.returncode == 0:
                fsck = self._git(c, ["fsck", "--no-progress", "--no-dangling"], target)
                if fsck.returncode != 0:
                    self.history.anomaly(
                        f"op #{rec.op_id} clone {repo}: fsck: {fsck.stderr.decode()[-300:]!r}"
                    )
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def _finish_read(
        self,
        c: _Client,
        rec: Record,
        done: subprocess.CompletedProcess[bytes],
        parse: Callable[[], RefMap],
    ) -> None:
        stderr = done.stderr.decode("utf-8", "replace")
        if done.returncode == 0:
            refs = parse()
            self.history.complete(rec, "ok", refs)
            c.known[rec.repo] = dict(refs)
            return
        self._pack_anomaly(rec, stderr)
        if any(m in stderr for m in MISSING_REPO) and "fatal: unable to access" not in stderr:
            self.history.complete(rec, "ok", (), stderr)  # a missing repository reads empty
            c.known[rec.repo] = {}
            return
        self.history.complete(rec, "fail", None, stderr)  # a failed read had no effect

    # -- writes

    def _new_commit(self, c: _Client, local: Path, parent: str | None, token: str) -> str:
        size = c.rng.randrange(self.config.blob_bytes + 1) if self.config.blob_bytes else 0
        content = token.encode() * 3 + c.rng.randbytes(size)
        blob = self._git(c, ["hash-object", "-w", "--stdin"], local, content)
        entry = b"100644 blob " + blob.stdout.strip() + b"\tf-" + token.encode() + b"\n"
        tree = self._git(c, ["mktree"], local, entry)
        args = ["commit-tree", tree.stdout.decode().strip(), "-m", token]
        if parent is not None:
            args += ["-p", parent]
        out = self._git(c, args, local)
        if out.returncode != 0:
            raise RuntimeError(f"commit-tree: {out.stderr!r}")
        oid = out.stdout.decode().strip()
        with self._lock:
            self.tokens[oid] = token
        return oid

    def _op_push(self, c: _Client, repo: str, delete: bool = False) -> None:
        local = self._local(c, repo)
        known = c.known.get(repo)
        if known is None:
            self._op_fetch(c, repo)
            return
        ref = "refs/heads/" + c.rng.choice(BRANCHES)
        expected = known.get(ref)
        if delete and expected is None:
            return
        if expected is not None and not self._has(c, local, expected):
            self._op_fetch(c, repo)
            return
        token = self._token(c)
        new = None if delete else self._new_commit(c, local, expected, token)
        rec = self.history.invoke(c.index, "push", repo, ("cas", ref, expected, new), token)
        lease = f"--force-with-lease={ref}:{expected or ''}"
        src = "" if new is None else new
        done = self._git(
            c, ["push", "--porcelain", "--no-verify", lease, self.url(repo), f"{src}:{ref}"], local
        )
        out = done.stdout.decode("utf-8", "replace")
        err = done.stderr.decode("utf-8", "replace")
        self._pack_anomaly(rec, err)
        line = next((x for x in out.splitlines() if x.startswith(tuple(" +-*!=")) and ref in x), "")
        if line and line[0] in " +-*" and done.returncode == 0:
            self.history.complete(rec, "ok", True, line)
            if new is None:
                known.pop(ref, None)
            else:
                known[ref] = new
        elif line.startswith("!") and ("stale info" in line or "stale ref" in line):
            self.history.complete(rec, "ok", False, line)
            c.known.pop(repo, None)  # re-read before the next write
        elif line.startswith("!") and (
            "incarnation" in line or "(object store put failed)" in line
        ):
            # refused before any effect: a push's layer is put before its Commit is
            # proposed, and a refused put is reported in the push's report. Counting it
            # as failed can only make the check stricter (an effect would be illegal).
            self.history.complete(rec, "fail", None, line)
            c.known.pop(repo, None)
        else:
            self.history.complete(rec, "info", None, (line + " " + err).strip())
            c.known.pop(repo, None)

    def _op_branch_delete(self, c: _Client, repo: str) -> None:
        self._op_push(c, repo, delete=True)

    def _api(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.base_url}/api/v1{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.config.op_timeout_s) as r:
                raw = r.read()
                return int(r.status), json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return int(e.code), json.loads(raw) if raw else None
            except ValueError:
                return int(e.code), raw[:300].decode("utf-8", "replace")

    def _op_api_commit(self, c: _Client, repo: str) -> None:
        known = c.known.get(repo)
        if not known:
            self._op_ls_refs(c, repo)
            return
        ref = c.rng.choice(sorted(known))
        expected = known[ref]
        token = self._token(c)
        rec = self.history.invoke(
            c.index, "api_commit", repo, ("cas", ref, expected, PENDING), token
        )
        body = {
            "branch": ref.removeprefix("refs/heads/"),
            "message": token,
            "expected_oid": expected,
            "author": {"name": "Enroute Test", "email": "test@enroute.invalid"},
            "changes": [
                {"path": f"f-{token}", "content_base64": base64.b64encode(token.encode()).decode()}
            ],
        }
        try:
            status, answer = self._api("POST", f"/repos/{repo}/-/commits", body)
        except OSError as e:
            self.history.complete(rec, "info", None, repr(e))
            c.known.pop(repo, None)
            return
        code = answer.get("code", "") if isinstance(answer, dict) else ""
        if status == 201 and isinstance(answer, dict):
            oid = str(answer["oid"])
            rec.input = ("cas", ref, expected, oid)
            with self._lock:
                self.tokens[oid] = token
            self.history.complete(rec, "ok", True, "201")
            known[ref] = oid
        elif status in (409, 412) or code in ("stale_ref", "not_found") or status == 404:
            self.history.complete(rec, "ok", False, f"{status} {answer!r}")
            c.known.pop(repo, None)
        elif 400 <= status < 500 and code not in ("unavailable", "deadline_exceeded"):
            self.history.complete(rec, "fail", None, f"{status} {answer!r}")
            c.known.pop(repo, None)
        else:
            self.history.complete(rec, "info", None, f"{status} {answer!r}")
            c.known.pop(repo, None)

    def _op_create(self, c: _Client, repo: str) -> None:
        rec = self.history.invoke(c.index, "create", repo, ("create",))
        try:
            status, answer = self._api("POST", "/repos", {"name": repo})
        except OSError as e:
            self.history.complete(rec, "info", None, repr(e))
            return
        how = "ok" if status in (200, 201) else "info"
        self.history.complete(rec, how, None, f"{status} {answer!r}")

    def _op_delete(self, c: _Client, repo: str) -> None:
        rec = self.history.invoke(c.index, "delete", repo, ("delete",))
        try:
            status, answer = self._api("DELETE", f"/repos/{repo}")
        except OSError as e:
            self.history.complete(rec, "info", None, repr(e))
            return
        how = "ok" if status in (200, 204, 404) else "info"
        self.history.complete(rec, how, None, f"{status} {answer!r}")
        c.known.pop(repo, None)

    # -- the end

    def final_read(self, repo: str, target: Path, attempts: int = 20) -> Record:
        """A mirror clone recorded as the last read of ``repo`` (retried while it heals)."""
        c = _Client(-1, random.Random(0), self.work / "final-home", self.work)
        c.home.mkdir(parents=True, exist_ok=True)
        for _ in range(attempts):
            shutil.rmtree(target, ignore_errors=True)
            rec = self.history.invoke(-1, "final", repo, ("read",))
            argv = ["clone", "--quiet", "--mirror", self.url(repo), str(target)]
            done = self._git(c, argv, self.work)
            err = done.stderr.decode("utf-8", "replace")
            if done.returncode == 0:
                out = self._git(
                    c, ["for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/"], target
                )
                pairs = (x.split(" ", 1) for x in out.stdout.decode().splitlines())
                self.history.complete(rec, "ok", tuple(sorted((n, o) for o, n in pairs)))
                return rec
            self._pack_anomaly(rec, err)
            if any(m in err for m in MISSING_REPO) and "unable to access" not in err:
                target.mkdir(parents=True, exist_ok=True)
                self._git(c, ["init", "--quiet", "--bare"], target)
                self.history.complete(rec, "ok", (), err)
                return rec
            self.history.complete(rec, "fail", None, err)
            time.sleep(1.0)
        raise AssertionError(f"final clone of {repo} failed {attempts} times: {err[-500:]}")


def _git_plain(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(home), capture_output=True,
        timeout=GIT_TIMEOUT_S * 4, check=False,
    )  # fmt: skip


def token_commits(repos: Sequence[Path], home: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(token -> commit, commit -> token) of every commit reachable in ``repos``.

    The tokens of writes whose answer was lost are resolved here. A write of
    unknown outcome that took effect and was then overwritten or deleted is
    gone from the final mirrors and only in the client repositories that read
    it, so ``repos`` must include those too (docs/reliability.md, failure 7).
    """
    resolve: dict[str, str] = {}
    token_of: dict[str, str] = {}
    for repo in repos:
        log = _git_plain(["log", "--all", "--format=%H %s"], repo, home)
        for line in log.stdout.decode().splitlines():
            oid, _, subject = line.partition(" ")
            resolve.setdefault(subject, oid)
            token_of.setdefault(oid, subject)
    return resolve, token_of


def check(workload: Workload, final_dir: Path) -> Report:
    """Read the final state of every repository and check the recorded history.

    1. Linearizable per repository (RepoRefs model) including the final reads.
    2. Every acknowledged write is an ancestor of its branch at the end (unless a
       delete may have come after it).
    3. No pack error was seen by any fetch or clone, every clone was fsck-clean,
       and the final mirrors and every client repository are fsck-clean.
    4. No commit a client saw acknowledged before a repository delete was invoked
       is in the final mirror (no object of a deleted incarnation reappears).
    """
    problems: list[str] = []
    home = final_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    mirrors: dict[str, Path] = {}
    for repo in workload.config.repos:
        mirrors[repo] = final_dir / repo
        workload.final_read(repo, mirrors[repo])
    records = list(workload.history.records)
    clients = [
        local
        for client_dir in sorted(workload.work.glob("c*"))
        for local in sorted(client_dir.iterdir())
        if local.name != "home" and (local / "HEAD").exists()
    ]
    resolve, token_of = token_commits([*mirrors.values(), *clients], home)
    for oid, token in workload.tokens.items():
        token_of[oid] = token
    result = check_records(records, resolve)
    # acknowledged writes present
    acked = acknowledged_writes(records)
    for w in acked:
        _, ref, _, new = w.input
        mirror = mirrors[w.repo]
        final = _git_plain(["rev-parse", "--verify", "-q", ref], mirror, home)
        tip = final.stdout.decode().strip()
        if not tip:
            problems.append(f"acknowledged #{w.op_id} {w.kind} {w.repo} {ref}={new}: ref gone")
            continue
        anc = _git_plain(["merge-base", "--is-ancestor", new, tip], mirror, home)
        if anc.returncode != 0:
            problems.append(
                f"acknowledged #{w.op_id} {w.kind} {w.repo} {ref}={new} not in history of {tip}"
            )
    # pack and fsck problems
    problems += workload.history.anomalies
    problems += [f"client error: {e}" for e in workload.errors]
    for repo, mirror in mirrors.items():
        fsck = _git_plain(["fsck", "--no-progress", "--no-dangling"], mirror, home)
        if fsck.returncode != 0:
            problems.append(f"final mirror {repo}: fsck: {fsck.stderr.decode()[-300:]!r}")
    for local in clients:
        fsck = _git_plain(["fsck", "--no-progress", "--no-dangling", "--connectivity-only"],
                          local, home)  # fmt: skip
        if fsck.returncode != 0:
            problems.append(f"{local}: fsck: {fsck.stderr.decode()[-300:]!r}")
    # deleted incarnations
    by_op = {r.token: r for r in records if r.token}
    for repo, mirror in mirrors.items():
        deletes = [r for r in records if r.repo == repo and r.kind == "delete" and r.how == "ok"]
        if not deletes:
            continue
        last_delete_call = max(d.call for d in deletes)
        objects = _git_plain(
            ["cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)"],
            mirror,
            home,
        )
        for line in objects.stdout.decode().splitlines():
            oid, _, kind = line.partition(" ")
            if kind != "commit" or oid not in token_of:
                continue
            writer = by_op.get(token_of[oid])
            if writer is not None and writer.how == "ok" and writer.ret < last_delete_call:
                # written and answered before the last delete began: must be gone
                problems.append(
                    f"{repo}: commit {oid} of #{writer.op_id} (before the delete) reappeared"
                )
    return Report(result, problems, len(records), resolve, len(acked))


def dump(workload: Workload, path: Path) -> None:
    """Every record as one JSON line (for a failure's post-mortem)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in workload.history.records:
            f.write(json.dumps(dataclasses.asdict(r), default=repr) + "\n")


def summary(workload: Workload) -> dict[str, Any]:
    """Counts of operations by kind and result, and latency percentiles (seconds)."""
    recs = [r for r in workload.history.records if r.client >= 0]
    lat = sorted(r.latency_s for r in recs if r.how == "ok")

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0.0

    writes = [r for r in recs if r.how == "ok" and r.input[0] == "cas"]
    return {
        "ops": len(recs),
        "by_kind": workload.history.counts(),
        "cas_won": sum(1 for r in writes if r.output is True),
        "cas_lost": sum(1 for r in writes if r.output is False),
        "p50_s": round(pct(0.5), 3),
        "p99_s": round(pct(0.99), 3),
    }


RELIABILITY_LOG_ENV = "ENROUTE_RELIABILITY_LOG"
OUTCOMES = {"ok": "ok", "fail": "fail", "info": "unknown", "": "unknown"}


def reliability_line(
    scenario: str, seed: int, workload: Workload, report: Report, duration_s: float
) -> dict[str, Any]:
    """One checked run, counted for docs/reliability.md: operations by kind and outcome
    (ok / fail / unknown; the final reads included), acknowledged writes whose survival
    was checked, and violations (a non-linearizable repository or any other problem)."""
    ops: dict[str, dict[str, int]] = {}
    for r in workload.history.records:
        row = ops.setdefault(r.kind, {})
        how = OUTCOMES[r.how]
        row[how] = row.get(how, 0) + 1
    lost = sum(1 for p in report.problems if p.startswith("acknowledged "))
    return {
        "scenario": scenario,
        "seed": seed,
        "operations": len(workload.history.records),
        "by_kind": ops,
        "acknowledged_checked": report.acknowledged,
        "linearizable": report.linearizable.ok,
        "lost_acknowledged": lost,
        "violations": len(report.problems) + (0 if report.linearizable.ok else 1),
        "duration_s": round(duration_s, 1),
    }


def log_reliability(line: dict[str, Any], env: dict[str, str] | None = None) -> None:
    """Append ``line`` to the file named by ENROUTE_RELIABILITY_LOG (nothing when unset)."""
    path = (os.environ if env is None else env).get(RELIABILITY_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
