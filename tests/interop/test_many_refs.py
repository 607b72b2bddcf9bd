"""A repository with more refs than ``protocol_wants_max`` pushes, clones and fetches.

git's fetch-pack sends one ``want`` per ref it fetches (fetch-pack.c ``add_wants``,
``find_common``), and ``git push --mirror`` one command per ref; a repository of
300,000 refs (a long-lived monorepo's tags and review refs) is normal. The wants
bound follows the repository's ref count (``protocol.fetch.wants_max``), so a clone
of such a repository passes while a request of more distinct wants than both is still
refused. Every ref here points at its own commit, so the wants are all distinct.

``test_300k_refs`` (nightly) runs 300,000 refs against the default limits; its ref
creations go in raw receive-pack requests, since git's own send-pack is quadratic in
the refs of an HTTP push (see :func:`push_raw`). On two cores shared with other work
(load 30 to 40) it took 1,200 s: the 31 pushes 587 s, the clones 149 s (v2) and
116 s (v0), the fetches 51 s and 58 s. Each push's advertisement lists every ref
(about 60 bytes a ref, 18 MB at 300,000), which no push avoids; the rest of a push
costs the refs it names (``test_one_ref_push_peels_the_same_at_4n_refs`` here,
``tests/state/test_ref_scale.py``). ``test_refs_above_the_wants_limit``
(CI) takes the same path with the git CLI throughout, on a server whose
``protocol_wants_max`` is 500 and a repository of 1,500 refs.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_core.base.ids import ZERO_OID, oid_from_hex
from enroute_core.git.pktline import DELIM_PKT, FLUSH_PKT, pkt_text
from enroute_core.protocol.receive import PushCommand, PushRequest, encode_push_request
from enroute_core.state.refmap import LEAF_REFS
from enroute_testing.devserver import DevServer, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import list_refs

pytestmark = pytest.mark.interop

_names = itertools.count()


def many_refs(path: Path, count: int) -> None:
    """A bare repository with ``count`` commits in a line, ``refs/tags/t<i>`` at the i-th,
    and ``main`` at the last: one fast-import stream, then the tags in packed-refs."""
    path.mkdir(parents=True)
    run_git(["init", "--quiet", "--bare", "--initial-branch=main", "."], cwd=path)
    stream = bytearray()
    for i in range(count):
        message = b"c%d\n" % i
        stream += b"commit refs/heads/main\nmark :%d\n" % (i + 1)
        stream += b"committer E <e@x> %d +0000\ndata %d\n%s" % (1_700_000_000 + i, len(message),
                                                                  message)  # fmt: skip
        stream += b"M 644 inline f\ndata 2\n%d\n" % (i % 10)
    run_git(["fast-import", "--quiet", "--export-marks=marks"], cwd=path, input=bytes(stream),
            timeout_s=600)  # fmt: skip
    # The tags go straight into packed-refs (gitrepository-layout, "packed-refs"): 300,000
    # loose ref files through update-ref take minutes on a busy disk.
    lines = []
    for line in (path / "marks").read_bytes().split(b"\n"):
        if line:
            mark, oid = line.split(b" ")
            lines.append((b"refs/tags/t%s" % mark[1:], oid))
    lines.sort()
    packed = b"# pack-refs with: peeled fully-peeled sorted \n"
    packed += b"".join(b"%s %s\n" % (oid, name) for name, oid in lines)
    (path / "packed-refs").write_bytes(packed)


def push_raw(source: Path, url: str, batch: int) -> None:
    """``main`` (every commit) with ``git push``, then the tags as ref creations, ``batch``
    commands to a receive-pack request. (``protocol_push_commands_max`` is 100,000, but
    on two busy cores a push of 25,000 ref creations outlasts the compute's wait for the
    ledger, ``ng <ref> no ledger member answered in time``; 10,000 take 3-7 s.)

    git's send-pack over smart HTTP matches each pushed ref against every local and
    every remote ref through the ref DWIM rules (remote.c ``match_explicit`` calls
    ``count_refspec_match`` on both lists): quadratic on the client, whatever the
    server, about 10 minutes for 20,000 refs on a busy core. So the nightly run sends
    the ref creations as git would, but encoded here (gitprotocol-pack, "Reference
    Update Request"), with the empty pack git sends when the server has every object.
    """
    run_git(["push", "--quiet", url, "refs/heads/main:refs/heads/main"], cwd=source,
            timeout_s=900)  # fmt: skip
    push_tags(url, tags_of(source), batch)


def tags_of(source: Path) -> list[bytes]:
    """``<oid hex> <name>`` of every tag of ``source``, in name order."""
    return run_git(["for-each-ref", "--format=%(objectname) %(refname)", "refs/tags/"],
                   cwd=source).splitlines()  # fmt: skip


def push_tags(url: str, tags: list[bytes], batch: int) -> None:
    """Create the ``tags`` (lines of :func:`tags_of`) on ``url``, ``batch`` to a raw
    receive-pack request (see :func:`push_raw`)."""
    empty = b"PACK" + struct.pack(">II", 2, 0)
    empty += hashlib.sha1(empty).digest()
    for start in range(0, len(tags), batch):
        commands = tuple(
            PushCommand(ZERO_OID, oid_from_hex(oid), name)
            for oid, name in (line.split(b" ") for line in tags[start : start + batch])
        )
        # As git does: the advertisement first (read behind a barrier, so it waits for
        # the view to hold the previous push), then the request.
        with urllib.request.urlopen(f"{url}/info/refs?service=git-receive-pack", timeout=900):
            pass
        body = encode_push_request(PushRequest(commands, (b"report-status",))) + empty
        request = urllib.request.Request(
            f"{url}/git-receive-pack",
            data=body,
            headers={"Content-Type": "application/x-git-receive-pack-request"},
        )
        with urllib.request.urlopen(request, timeout=900) as reply:
            report = reply.read()
        assert b"unpack ok" in report and b"ng " not in report, report[:500]


def _round_trip(
    enroute_url: str, tmp_path: Path, count: int, batch: int | None
) -> dict[str, float]:
    source = tmp_path / "source.git"
    many_refs(source, count)
    expected = list_refs(source)
    assert len(expected) == count + 1
    url = f"{enroute_url}/many-refs{next(_names)}.git"
    took: dict[str, float] = {}
    started = time.monotonic()
    if batch is None:
        run_git(["push", "--quiet", "--mirror", url], cwd=source, timeout_s=900)
    else:
        push_raw(source, url, batch)
    took["push"] = time.monotonic() - started
    for version in ("2", "0"):
        clone = tmp_path / f"clone-v{version}.git"
        started = time.monotonic()
        run_git(["-c", f"protocol.version={version}", "clone", "--quiet", "--bare", url,
                 str(clone)], cwd=tmp_path, timeout_s=900)  # fmt: skip
        took[f"clone v{version}"] = time.monotonic() - started
        assert list_refs(clone) == expected
    # New commits on two refs, fetched into each clone over its protocol.
    work = tmp_path / "work"
    run_git(["clone", "--quiet", "--single-branch", "--no-tags", str(source), str(work)],
            cwd=tmp_path, timeout_s=900)  # fmt: skip
    run_git(["commit", "--quiet", "--allow-empty", "-m", "more"], cwd=work)
    run_git(["push", "--quiet", url, "HEAD:refs/heads/main", "HEAD:refs/heads/extra"], cwd=work)
    main = run_git(["rev-parse", "HEAD"], cwd=work).strip()
    for version in ("2", "0"):
        clone = tmp_path / f"clone-v{version}.git"
        started = time.monotonic()
        run_git(["-c", f"protocol.version={version}", "fetch", "--quiet", url,
                 "+refs/heads/*:refs/heads/*"], cwd=clone, timeout_s=900)  # fmt: skip
        took[f"fetch v{version}"] = time.monotonic() - started
        for ref in ("refs/heads/main", "refs/heads/extra"):
            assert run_git(["rev-parse", ref], cwd=clone).strip() == main
        run_git(["fsck", "--no-progress", "--connectivity-only"], cwd=clone, timeout_s=900)
    print(f"{count} refs:", ", ".join(f"{k} {v:.1f} s" for k, v in took.items()))
    return took


WANTS_MAX_SMALL = 500
"""``protocol_wants_max`` of the CI run's server: its 1,500 refs are three times over it."""


@pytest.fixture(scope="module")
def small_limit_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    config = {"limits": {"protocol_wants_max": WANTS_MAX_SMALL}}
    with running_dev(tmp_path_factory.mktemp("enroute-dev-wants"), config) as dev:
        yield dev


@pytest.fixture(scope="module")
def small_limit_url(small_limit_dev: DevServer) -> str:
    return small_limit_dev.url


@pytest.mark.slow
def test_refs_above_the_wants_limit(small_limit_url: str, tmp_path: Path) -> None:
    """CI: the same path as 300,000 refs against the default, with the git CLI throughout."""
    _round_trip(small_limit_url, tmp_path, 3 * WANTS_MAX_SMALL, None)


def test_more_distinct_wants_than_refs_and_limit_are_refused(small_limit_url: str) -> None:
    """The bound still holds: one more distinct want than the ref count and the limit."""
    url = f"{small_limit_url}/few-refs{next(_names)}.git"
    source = Path(tempfile.mkdtemp(prefix="few-refs-")) / "src.git"
    many_refs(source, 10)
    run_git(["push", "--quiet", "--mirror", url], cwd=source)
    wants = b"".join(pkt_text(b"want %040x" % i) for i in range(1, WANTS_MAX_SMALL + 2))
    body = pkt_text(b"command=fetch") + DELIM_PKT + wants + pkt_text(b"done") + FLUSH_PKT
    request = urllib.request.Request(
        f"{url}/git-upload-pack",
        data=body,
        headers={
            "Content-Type": "application/x-git-upload-pack-request",
            "Git-Protocol": "version=2",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as answer:  # a refusal git shows:
        assert answer.status == 200  # one ERR packet (docs/protocol.md, "Errors git shows")
        text = answer.read()
    assert text[4:8] == b"ERR ", text
    assert b"protocol_wants_max" in text and b"distinct wants" in text, text


SCALE_REFS = 2_000
"""N of the CI run that compares a push of one ref at N and at 4N refs."""


def _peeled_by_one_ref_push(dev: DevServer, url: str, source: Path, n: int) -> int:
    """Refs the compute peeled for a push of one new branch as git sends it (the
    receive-pack advertisement, the push) and the advertisement after it, into a
    repository of ``n`` refs. The advertisement before starts from a settled state."""
    advertisement = f"{url}/info/refs?service=git-receive-pack"
    with urllib.request.urlopen(advertisement, timeout=300) as answer:
        answer.read()
    before = dev.compute_status()["refs_peeled"]
    run_git(["push", "--quiet", url, f"refs/tags/t1:refs/heads/b{n}"], cwd=source, timeout_s=300)
    with urllib.request.urlopen(advertisement, timeout=300) as answer:
        assert f"refs/heads/b{n}".encode() in answer.read()
    peeled: int = dev.compute_status()["refs_peeled"] - before
    return peeled


@pytest.mark.slow
def test_one_ref_push_peels_the_same_at_4n_refs(small_limit_dev: DevServer, tmp_path: Path) -> None:
    """A push of one ref into a repository of N refs and of 4N makes the compute read the
    same number of refs' objects (``refs_peeled``, a count, not a time): the
    advertisements git reads before and after a push list every ref (gitprotocol-pack,
    "Reference Discovery"), but peel only the refs of the leaves the push changed. The
    ledger's and a compute's apply of such a push: ``tests/state/test_ref_scale.py``.
    When every advertisement peeled every ref (git's and the one after), this counted
    2(N + 1) and 2(4N + 1)."""
    source = tmp_path / "source.git"
    many_refs(source, 4 * SCALE_REFS)
    tags = tags_of(source)
    url = f"{small_limit_dev.url}/scale{next(_names)}.git"
    run_git(["push", "--quiet", url, "refs/heads/main:refs/heads/main"], cwd=source, timeout_s=300)
    push_tags(url, tags[:SCALE_REFS], SCALE_REFS)
    at_n = _peeled_by_one_ref_push(small_limit_dev, url, source, SCALE_REFS)
    push_tags(url, tags[SCALE_REFS:], 2 * SCALE_REFS)
    at_4n = _peeled_by_one_ref_push(small_limit_dev, url, source, 4 * SCALE_REFS)
    print(f"refs peeled for a one-ref push: {at_n} at {SCALE_REFS} refs, {at_4n} at 4x")
    assert 0 < at_n <= 2 * LEAF_REFS + 1 and 0 < at_4n <= 2 * LEAF_REFS + 1
    assert at_4n <= 1.5 * at_n + 64


@pytest.mark.nightly
@pytest.mark.timeout(3600)  # two clones of 300,000 refs and 30 pushes, on a loaded machine
def test_300k_refs(enroute_url: str, tmp_path: Path) -> None:
    """300,000 refs against the default limits: clones send 300,000 distinct wants."""
    _round_trip(enroute_url, tmp_path, 300_000, 10_000)
