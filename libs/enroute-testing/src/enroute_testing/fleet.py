"""Many repositories, fast: the population of bench/fleet.py and the fleet CI test.

Issue 19 measures what an idle repository costs, which needs thousands of them, each
created, pushed and cloned once. A `git push` and a `git clone` per repository are
some 10 processes each (git, remote-https, pack-objects, index-pack, ...), which on
two loaded cores made 2 repositories a second. Here the client work is done once:
git makes the pack of a small history (`git pack-objects`, what `git push` sends to
an empty repository), and every repository gets the same smart-HTTP requests over
plain HTTP (gitprotocol-http, "Smart Service git-receive-pack" and "Smart Service
git-upload-pack"; gitprotocol-pack, "Pushing Data To a Server" and "Packfile
Negotiation"):

- create: ``POST /api/v1/repos``;
- push: ``POST /<repo>.git/git-receive-pack`` with one create command for
  ``refs/heads/main`` and the pack; the answer's report-status must say
  ``unpack ok`` and ``ok refs/heads/main``;
- clone: ``POST /<repo>.git/git-upload-pack`` (protocol v0, the request `git clone`
  makes after the ref advertisement: one ``want`` of the pushed head and ``done``);
  the answer's pack, taken from side-band 1, must hold every object of the history and
  end with its SHA-1 trailer.

The server does what it does for git: a push and a full clone of each repository.
``workers`` requests run at once.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import struct
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_testing.bigpush import push_file
from enroute_testing.gitcli import run_git

TIMEOUT_S = 300.0
_PACK_HEADER = struct.Struct(">4sII")
_SIDEBAND_DATA = 1
_SIDEBAND_ERROR = 3


@dataclass(frozen=True, slots=True)
class Seed:
    """The history every repository gets: a small repository made by git, and its pack."""

    work: Path
    """The git repository it was made in (``main`` checked out)."""
    head: bytes
    """The hex id of ``main``."""
    pack: Path
    """Every object of ``main``, as `git pack-objects` writes them."""
    objects: int


def make_seed(root: Path, commits: int = 3, lines: int = 40) -> Seed:
    """A ``commits``-commit history of one small file each, made by git under ``root``."""
    work = root / "seed"
    run_git(["init", "-q", "-b", "main", str(work)], cwd=root)
    for i in range(commits):
        (work / f"f{i}.txt").write_text(f"fleet {i}\n" * lines)
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"c{i}"], cwd=work)
    head = run_git(["rev-parse", "HEAD"], cwd=work).strip()
    listed = run_git(["rev-list", "--objects", "main"], cwd=work)
    objects = len(listed.splitlines())
    pack = root / "seed.pack"
    pack.write_bytes(run_git(["pack-objects", "--stdout", "-q"], cwd=work, input=listed))
    return Seed(work, head, pack, objects)


def _request(
    address: str, method: str, target: str, body: bytes, content_type: str
) -> tuple[int, bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request(method, target, body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def create(address: str, repo: str, *, again: bool = False) -> None:
    """Create ``repo`` through the REST API of gitproto at ``address`` (HOST:PORT);
    ``again``: a retry, which may find it made by the attempt that failed (the API
    answers 200 and the repository then)."""
    body = json.dumps({"name": repo}).encode()
    status, answer = _request(address, "POST", "/api/v1/repos", body, "application/json")
    assert status == 201 or (again and status in {200, 409}), (
        f"create {repo}: HTTP {status} {answer[:300]!r}"
    )


def push(address: str, repo: str, seed: Seed, *, again: bool = False) -> None:
    """Push the seed's pack to the empty ``repo`` as ``refs/heads/main``; ``again``: a
    retry, which may find ``main`` already there (the failed attempt's answer was lost
    after the ledger took it), and then is done."""
    status, answer = push_file(address, repo, seed.head, seed.pack)
    assert status == 200, f"push {repo}: HTTP {status} {answer[:300]!r}"
    if again and b"ng refs/heads/main" in answer:
        refs = _request(address, "GET", f"/{repo}.git/info/refs?service=git-upload-pack", b"", "")
        if seed.head + b" refs/heads/main" in refs[1]:
            return
    assert b"unpack ok" in answer and b"ok refs/heads/main" in answer, (
        f"push {repo}: {answer[:300]!r}"
    )


def _packets(data: bytes) -> Iterable[bytes]:
    """The payloads of the pkt-lines in ``data``; a flush ends nothing here (v0 answers
    a NAK, then side-band packets, then a flush)."""
    at = 0
    while at < len(data):
        size = int(data[at : at + 4], 16)
        if size == 0:
            at += 4
            continue
        yield data[at + 4 : at + size]
        at += size


def fetch(address: str, repo: str, seed: Seed) -> None:
    """Fetch all of ``repo``'s ``main`` as `git clone` does, and check the pack: the
    seed's object count and a matching SHA-1 trailer."""
    want = pkt_line(b"want " + seed.head + b" multi_ack_detailed side-band-64k ofs-delta\n")
    body = want + FLUSH_PKT + pkt_line(b"done\n")
    status, answer = _request(
        address,
        "POST",
        f"/{repo}.git/git-upload-pack",
        body,
        "application/x-git-upload-pack-request",
    )
    assert status == 200, f"clone {repo}: HTTP {status} {answer[:300]!r}"
    pack = bytearray()
    for payload in _packets(answer):
        if payload[:1] == bytes([_SIDEBAND_DATA]):
            pack += payload[1:]
        elif payload[:1] == bytes([_SIDEBAND_ERROR]):
            raise AssertionError(f"clone {repo}: {payload[1:]!r}")
    magic, _version, count = _PACK_HEADER.unpack_from(pack)
    assert magic == b"PACK" and count == seed.objects, f"clone {repo}: {bytes(pack[:12])!r}"
    assert hashlib.sha1(pack[:-20]).digest() == pack[-20:], f"clone {repo}: bad trailer"


class Populated:
    """What :func:`populate` did: repositories made, the steps it had to retry, and
    (``keep_going``) the repositories it gave up on."""

    def __init__(self) -> None:
        self.done = 0
        self.retries: list[str] = []
        """One line per retried step: the repository and the first line of its error."""
        self.failed: list[str] = []
        """One line per repository given up on, the same way."""


def populate(
    address: str,
    repos: Iterable[str],
    seed: Seed,
    workers: int,
    *,
    progress: Callable[[int], None] | None = None,
    attempts: int = 1,
    keep_going: bool = False,
) -> Populated:
    """Create, push and clone each of ``repos``, ``workers`` at a time.

    Each step is tried up to ``attempts`` times, waiting 1, 2, 4 ... s between (a
    benchmark on a loaded machine sees pushes refused with ``ng ... no ledger member
    answered in time``); ``keep_going``: a repository whose step failed every time is
    recorded and left, and the others go on. A test keeps the defaults and fails on the
    first error."""
    out = Populated()

    def step(repo: str, fn: Callable[[bool], None]) -> None:
        for attempt in range(attempts):
            try:
                fn(attempt > 0)
                return
            except (AssertionError, OSError) as e:
                if attempt + 1 == attempts:
                    raise
                out.retries.append(f"{repo}: {str(e).splitlines()[0][:200]}")
                time.sleep(2.0**attempt)

    def one(repo: str) -> None:
        try:
            step(repo, lambda again: create(address, repo, again=again))
            step(repo, lambda again: push(address, repo, seed, again=again))
            step(repo, lambda _again: fetch(address, repo, seed))
        except (AssertionError, OSError) as e:
            if not keep_going:
                raise
            out.failed.append(f"{repo}: {str(e).splitlines()[0][:200]}")

    with ThreadPoolExecutor(workers) as ex:
        for _ in ex.map(one, repos):
            out.done += 1
            if progress is not None:
                progress(out.done)
    return out


def clone_contents(clone: Path) -> bytes:
    """What a clone holds: its refs and every object reachable from them."""
    refs = run_git(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=clone)
    objects = run_git(["rev-list", "--objects", "--all"], cwd=clone)
    return refs + b"\n" + b"\n".join(sorted(objects.splitlines()))
