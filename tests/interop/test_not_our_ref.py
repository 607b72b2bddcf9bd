"""A want the repository lacks is refused with ``ERR upload-pack: not our ref <oid>``
before any ACK, NAK, shallow line or pack byte, on protocol v0 and v2, against a real
``enroute dev`` (gitprotocol-pack "Packfile Negotiation", gitprotocol-v2 "fetch").

The raw requests speak smart HTTP as git does; the git test reads the message git
itself prints.
"""

from __future__ import annotations

import itertools
import urllib.request
from pathlib import Path

import pytest

from enroute_core.git.pktline import FLUSH_PKT, pkt_text
from enroute_testing.gitcli import GitFailed, run_git

pytestmark = pytest.mark.interop

UNKNOWN = "d" * 40
_names = itertools.count()


def _post(url: str, body: bytes, protocol: str | None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/x-git-upload-pack-request"}
    if protocol is not None:
        headers["Git-Protocol"] = protocol
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read()


@pytest.fixture(scope="module")
def pushed(enroute_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    """A repository with one commit: (its URL, the commit, the local clone)."""
    work = tmp_path_factory.mktemp("notours") / "w"
    work.mkdir()
    run_git(["init", "--quiet", "--initial-branch", "main"], cwd=work)
    (work / "f").write_text("one\n")
    run_git(["add", "f"], cwd=work)
    run_git(["commit", "--quiet", "-m", "one"], cwd=work)
    tip = run_git(["rev-parse", "HEAD"], cwd=work).decode().strip()
    url = f"{enroute_url}/notours{next(_names)}.git"
    run_git(["push", "--quiet", url, "main"], cwd=work)
    run_git(["remote", "add", "origin", url], cwd=work)
    return url, tip, work


def _v0_body(wants: list[str], haves: list[str], *, done: bool, deepen: int = 0) -> bytes:
    caps = b" multi_ack_detailed no-done side-band-64k thin-pack ofs-delta"
    out = [pkt_text(b"want " + wants[0].encode() + caps)]
    out += [pkt_text(b"want " + w.encode()) for w in wants[1:]]
    if deepen:
        out.append(pkt_text(b"deepen %d" % deepen))
    out.append(FLUSH_PKT)
    out += [pkt_text(b"have " + h.encode()) for h in haves]
    out.append(pkt_text(b"done") if done else FLUSH_PKT)
    return b"".join(out)


def _expected(oid: str) -> bytes:
    return pkt_text(b"ERR upload-pack: not our ref " + oid.encode())[:-1]


@pytest.mark.parametrize("done", [True, False])
@pytest.mark.parametrize("deepen", [0, 1])
def test_v0_unknown_want_is_one_err_packet_before_any_ack(
    pushed: tuple[str, str, Path], done: bool, deepen: int
) -> None:
    url, tip, _ = pushed
    body = _v0_body([tip, UNKNOWN], [tip], done=done, deepen=deepen)
    status, data = _post(f"{url}/git-upload-pack", body, None)
    assert status == 200
    # The whole answer is the ERR packet: no shallow line, ACK, NAK or pack before it.
    assert data.startswith(_expected(UNKNOWN)), data[:200]
    assert b"ACK" not in data and b"NAK" not in data and b"PACK" not in data


def test_v0_known_wants_still_get_a_pack(pushed: tuple[str, str, Path]) -> None:
    url, tip, _ = pushed
    status, data = _post(f"{url}/git-upload-pack", _v0_body([tip], [], done=True), None)
    assert status == 200 and data.startswith(b"0008NAK\n") and b"PACK" in data


def _v2_fetch(lines: list[bytes]) -> bytes:
    head = [pkt_text(b"command=fetch"), pkt_text(b"object-format=sha1"), b"0001"]
    return b"".join(head + [pkt_text(x) for x in lines] + [FLUSH_PKT])


def test_v2_unknown_want_is_one_err_packet(pushed: tuple[str, str, Path]) -> None:
    url, tip, _ = pushed
    body = _v2_fetch([b"want " + tip.encode(), b"want " + UNKNOWN.encode(), b"done"])
    status, data = _post(f"{url}/git-upload-pack", body, "version=2")
    assert status == 200
    assert data.startswith(_expected(UNKNOWN)), data[:200]
    assert b"acknowledgments" not in data and b"packfile" not in data


def test_v2_unknown_want_ref_is_one_err_packet(pushed: tuple[str, str, Path]) -> None:
    url, _, _ = pushed
    body = _v2_fetch([b"want-ref refs/heads/nope", b"done"])
    status, data = _post(f"{url}/git-upload-pack", body, "version=2")
    assert status == 200
    assert data.startswith(pkt_text(b"ERR upload-pack: unknown ref refs/heads/nope")[:-1])


@pytest.mark.parametrize("version", ["0", "2"])
def test_git_fetch_of_an_unknown_oid_shows_the_servers_message(
    pushed: tuple[str, str, Path], version: str
) -> None:
    _, _, work = pushed
    with pytest.raises(GitFailed) as failed:
        run_git(["-c", f"protocol.version={version}", "fetch", "origin", UNKNOWN], cwd=work)
    text = str(failed.value)
    assert f"upload-pack: not our ref {UNKNOWN}" in text, text
    # The transfer was refused, not cut: git names the remote's error, not a broken stream.
    assert "remote error" in text or "ERR" in text, text


def test_v0_wants_must_be_reachable_from_the_advertised_refs_and_v2_wants_need_not(
    enroute_url: str, tmp_path: Path
) -> None:
    """git's stateless v0 rule (upload-pack ``check_non_tip``): a want that is no tip
    must be reachable from one. A commit force-pushed away is still stored (until the
    layers are compacted it is in the view) but no longer reachable: v0 refuses it,
    v2 sends it (gitprotocol-v2: wants "are not limited to advertised objects")."""
    work = tmp_path / "w"
    work.mkdir()
    run_git(["init", "--quiet", "--initial-branch", "main"], cwd=work)
    tips = []
    for i in range(3):
        (work / "f").write_text(f"{i}\n")
        run_git(["add", "f"], cwd=work)
        run_git(["commit", "--quiet", "-m", f"c{i}"], cwd=work)
        tips.append(run_git(["rev-parse", "HEAD"], cwd=work).decode().strip())
    url = f"{enroute_url}/notours{next(_names)}.git"
    run_git(["push", "--quiet", url, "main"], cwd=work)
    run_git(["push", "--quiet", "--force", url, f"{tips[1]}:refs/heads/main"], cwd=work)
    first, _, gone = tips

    status, data = _post(f"{url}/git-upload-pack", _v0_body([first], [], done=True), None)
    assert status == 200 and data.startswith(b"0008NAK\n") and b"PACK" in data  # reachable
    status, data = _post(f"{url}/git-upload-pack", _v0_body([gone], [], done=True), None)
    assert status == 200 and data.startswith(_expected(gone)), data[:200]
    body = _v2_fetch([b"want " + gone.encode(), b"done"])
    status, data = _post(f"{url}/git-upload-pack", body, "version=2")
    assert status == 200 and b"packfile\n" in data
    assert b"ERR" not in data[:64]
