"""A push right after an acknowledged push, without a new advertisement, sees it.

git's receive-pack writes the refs before it reports (receive-pack.c
``execute_commands``, then ``report``), so a client may push again at once
from the refs it just pushed, with a thin pack against them (pack-objects
``--thin``: bases the server is known to have are left out). git's own push
asks for the advertisement first, which Enroute reads behind a barrier (DESIGN
"Read path"); a client that keeps what it pushed does not. Enroute reports once
the commit is durable, before the compute's view applies it, so the second push
must wait for the view to reach the first one's version (read-your-writes,
``Pusher._snapshot_after_own_pushes``). Without that wait the second push is
ingested against a view without the first and refused: ``ng refs/heads/main
delta base <oid> is neither in the pack nor in the repository``.

Each round pushes a few thousand commits with ``git push`` (a stored layer whose
commit graph the view builds when it applies it: the widest window), then at once
one more commit as a receive-pack request whose pack is ``git pack-objects
--thin`` against the first push's tip, as a client that keeps its refs sends it
(gitprotocol-pack, "Reference Update Request"). Before the fix this test failed
(a trial of 5 rounds of 5,000 commits had 3 refused). At the end a clone must
pass ``git fsck`` and hold the last tip.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from enroute_core.base.ids import oid_from_hex
from enroute_core.protocol.receive import PushCommand, PushRequest, encode_push_request
from enroute_testing.gitcli import run_git

pytestmark = pytest.mark.interop

ROUNDS = 5
COMMITS_PER_ROUND = 4000
FILES = 50


def _grow(work: Path, round_: int, commits: int) -> None:
    """``commits`` more commits on main (one ``git fast-import`` stream)."""
    stream = bytearray()
    tip = b""
    if round_:
        tip = run_git(["rev-parse", "HEAD"], cwd=work).strip()
    for k in range(commits):
        message = b"round %d commit %d\n" % (round_, k)
        stream += b"commit refs/heads/main\ncommitter E <e@x> %d +0000\n" % (
            1_700_000_000 + round_ * (commits + 10) + k
        )
        stream += b"data %d\n%s" % (len(message), message)
        if k == 0 and tip:
            stream += b"from %s\n" % tip
        stream += b"M 644 inline f%d\ndata %d\n%s" % (k % FILES, len(message), message)
    run_git(["fast-import", "--quiet"], cwd=work, input=bytes(stream), timeout_s=300)
    run_git(["reset", "-q", "--hard"], cwd=work)


def _push_without_advertisement(work: Path, url: str, old: bytes, new: bytes) -> bytes:
    """``old..new`` to main as one receive-pack request, thin against ``old``; the report."""
    pack = run_git(
        ["pack-objects", "--stdout", "--thin", "--revs", "-q"],
        cwd=work,
        input=new + b"\n^" + old + b"\n",
    )
    command = PushCommand(oid_from_hex(old), oid_from_hex(new), b"refs/heads/main")
    body = encode_push_request(PushRequest((command,), (b"report-status",))) + pack
    request = urllib.request.Request(
        f"{url}/git-receive-pack",
        data=body,
        headers={"Content-Type": "application/x-git-receive-pack-request"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        report: bytes = reply.read()
    return report


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_push_sees_the_push_acknowledged_before_it(enroute_url: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    run_git(["init", "-q", "-b", "main", str(work)], cwd=tmp_path)
    url = f"{enroute_url}/push-after-push.git"
    refused: list[tuple[int, bytes]] = []
    for r in range(ROUNDS):
        _grow(work, r, COMMITS_PER_ROUND)
        run_git(["push", "-q", url, "main"], cwd=work, timeout_s=300)
        old = run_git(["rev-parse", "HEAD"], cwd=work).strip()
        (work / "after").write_text(f"after round {r}\n")
        run_git(["add", "after"], cwd=work)
        run_git(["commit", "-q", "-m", f"after round {r}"], cwd=work)
        new = run_git(["rev-parse", "HEAD"], cwd=work).strip()
        report = _push_without_advertisement(work, url, old, new)
        if b"unpack ok" not in report or b"ok refs/heads/main" not in report:
            refused.append((r, report))
            # as the refused client would: push again with git (advertisement first)
            run_git(["push", "-q", url, "main"], cwd=work, timeout_s=300)
    assert not refused, f"{len(refused)} of {ROUNDS} pushes right after a push refused: {refused}"
    clone = tmp_path / "clone"
    run_git(["clone", "-q", "--bare", url, str(clone)], cwd=tmp_path, timeout_s=300)
    run_git(["fsck", "--no-progress"], cwd=clone, timeout_s=300)
    tip = run_git(["rev-parse", "main"], cwd=clone).strip()
    assert tip == run_git(["rev-parse", "HEAD"], cwd=work).strip()
