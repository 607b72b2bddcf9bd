"""Push and clone with the real git CLI through the Compute gRPC service.

A test-only smart-HTTP bridge (below) turns git's HTTP requests into the
Compute streams; the real ingress is gitproto's.
"""

from __future__ import annotations

from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from enroute_compute.rpc.servicer import BODY_BYTES_PER_MESSAGE
from enroute_core.base.ids import ZERO_OID, oid_from_hex
from enroute_core.git.pktline import FLUSH_PKT
from enroute_core.protocol.receive import PushCommand, PushRequest, encode_push_request
from enroute_core.state import Commit, OutcomeCode, RefUpdate
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import RepoSpec, generate_repo, list_refs

pytestmark = pytest.mark.interop


@pytest.fixture
def url(compute: object, git_bridge: Callable[[str], ThreadingHTTPServer]) -> str:
    server = git_bridge(compute.address)  # type: ignore[attr-defined]
    return f"http://127.0.0.1:{server.server_address[1]}"


def _fsck(path: Path) -> None:
    run_git(["fsck", "--strict", "--no-progress"], cwd=path)


def test_push_to_missing_repo_then_clone_v2_and_v0(
    url: str, compute: object, tmp_path: Path
) -> None:
    spec = RepoSpec(seed=7, commits=40, branches=2, files=30, annotated_tags=2)
    source = generate_repo(tmp_path / "source.git", spec)
    run_git(["push", "--mirror", f"{url}/team/app.git"], cwd=source.path)
    for version in ("2", "0"):
        dest = tmp_path / f"clone-v{version}.git"
        run_git(
            [
                "-c",
                f"protocol.version={version}",
                "clone",
                "--mirror",
                f"{url}/team/app.git",
                str(dest),
            ],
            cwd=tmp_path,
        )
        assert list_refs(dest) == source.refs
        _fsck(dest)
        head = run_git(["symbolic-ref", "HEAD"], cwd=dest).strip()
        assert head == b"refs/heads/main"
    host = compute.host  # type: ignore[attr-defined]
    state = host._repos["team/app"].state
    assert state.incarnation == 1 and not state.head_kept
    assert any(e.key is not None for e in state.manifest), "the first push is a stored layer"


def test_incremental_push_then_fetch(url: str, tmp_path: Path) -> None:
    spec = RepoSpec(seed=3, commits=12, branches=1, files=10, annotated_tags=1)
    source = generate_repo(tmp_path / "source.git", spec)
    run_git(["push", "--mirror", f"{url}/inc.git"], cwd=source.path)
    work = tmp_path / "work"
    run_git(["-c", "protocol.version=2", "clone", f"{url}/inc.git", str(work)], cwd=tmp_path)
    other = tmp_path / "other"
    run_git(["-c", "protocol.version=0", "clone", f"{url}/inc.git", str(other)], cwd=tmp_path)
    (work / "new.txt").write_text("hello\n")
    run_git(["add", "new.txt"], cwd=work)
    run_git(["commit", "-q", "-m", "more"], cwd=work)
    run_git(["tag", "-a", "v9", "-m", "v9"], cwd=work)
    run_git(["push", "origin", "main", "refs/tags/v9", "HEAD:refs/heads/topic"], cwd=work)
    run_git(["push", "origin", ":refs/heads/topic"], cwd=work)
    for version in ("2", "0"):
        run_git(["-c", f"protocol.version={version}", "fetch", "--tags", "origin"], cwd=other)
        tip = run_git(["rev-parse", "origin/main"], cwd=other)
        assert tip == run_git(["rev-parse", "HEAD"], cwd=work)
        _fsck(other)
    remote = run_git(["ls-remote", f"{url}/inc.git"], cwd=work)
    assert b"refs/heads/topic" not in remote and b"refs/tags/v9^{}" in remote


def test_clone_of_empty_repository(url: str, compute: object, tmp_path: Path) -> None:
    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(compute.address))  # type: ignore[attr-defined]
    made = stub.CreateRepository(
        compute_pb2.CreateRepositoryRequest(repo="empty", default_branch=b"trunk")
    )
    assert made.created and made.repository.head == b"refs/heads/trunk"
    for version in ("2", "0"):
        dest = tmp_path / f"e{version}"
        run_git(
            ["-c", f"protocol.version={version}", "clone", f"{url}/empty.git", str(dest)],
            cwd=tmp_path,
        )
        assert run_git(["rev-parse", "--git-dir"], cwd=dest).strip() == b".git"


def test_missing_repository_fetch_is_not_found(url: str, tmp_path: Path) -> None:
    from enroute_testing.gitcli import GitFailed

    with pytest.raises(GitFailed) as info:
        run_git(["clone", f"{url}/nothing.git", str(tmp_path / "x")], cwd=tmp_path)
    assert b"not found" in info.value.stderr.lower() or b"404" in info.value.stderr


def _receive(stub: compute_pb2_grpc.ComputeStub, repo: str, body: bytes) -> bytes:
    header = compute_pb2.GitRequestHeader(repo=repo, service=compute_pb2.GIT_SERVICE_RECEIVE_PACK)
    msgs = [compute_pb2.GitRequest(header=header), compute_pb2.GitRequest(body=body)]
    return b"".join(r.body for r in stub.ReceivePack(iter(msgs)))


def test_stale_push_is_refused_with_ng(url: str, compute: object, tmp_path: Path) -> None:
    spec = RepoSpec(seed=5, commits=6, branches=1, files=5, annotated_tags=0)
    source = generate_repo(tmp_path / "source.git", spec)
    run_git(["push", "--mirror", f"{url}/stale.git"], cwd=source.path)
    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(compute.address))  # type: ignore[attr-defined]
    branch = next(
        n for n in source.refs if n != b"refs/heads/main" and n.startswith(b"refs/heads/")
    )
    wrong = oid_from_hex(source.refs[b"refs/heads/main"].decode())
    if wrong == oid_from_hex(source.refs[branch].decode()):
        wrong = bytes(19) + b"\x01"  # type: ignore[assignment]
    request = PushRequest((PushCommand(wrong, ZERO_OID, branch),), (b"report-status",))
    report = _receive(stub, "stale", encode_push_request(request))
    assert b"ng " + branch + b" stale" in report
    assert report.endswith(FLUSH_PKT)
    assert list_refs(source.path)[branch] == source.refs[branch]
    remote = run_git(["ls-remote", f"{url}/stale.git"], cwd=tmp_path)
    assert branch in remote


def test_a_large_advertisement_goes_out_in_bounded_messages(
    url: str, compute: object, tmp_path: Path
) -> None:
    """12,000 tags with long names make a v0 advertisement of about 2 MB: it reaches
    gitproto in messages of at most BODY_BYTES_PER_MESSAGE, and the git client lists
    every ref. (Whole, one of about 40,000 refs was over gRPC's default 4 MiB.)"""
    source = generate_repo(tmp_path / "source.git", RepoSpec(seed=5, commits=3, files=3))
    run_git(["push", "--mirror", f"{url}/many.git"], cwd=source.path)
    host = compute.host  # type: ignore[attr-defined]
    incarnation = host._repos["many"].state.incarnation
    tip = oid_from_hex(source.refs[b"refs/heads/main"])
    names = [b"refs/tags/" + b"t" * 100 + b"-%05d" % i for i in range(12_000)]
    command = Commit(incarnation, tuple(RefUpdate(n, None, tip) for n in names), None, 1, False)
    proposed = compute.call(host.ledger.propose("many", incarnation, command))  # type: ignore[attr-defined]
    assert proposed.change.outcome.code is OutcomeCode.OK
    header = compute_pb2.GitRequestHeader(repo="many", service=compute_pb2.GIT_SERVICE_UPLOAD_PACK)
    with grpc.insecure_channel(compute.address) as channel:  # type: ignore[attr-defined]
        stub = compute_pb2_grpc.ComputeStub(channel)
        bodies = [m.body for m in stub.InfoRefs(iter([compute_pb2.GitRequest(header=header)]))]
    assert sum(map(len, bodies)) > BODY_BYTES_PER_MESSAGE
    assert max(map(len, bodies)) <= BODY_BYTES_PER_MESSAGE
    for version in ("0", "2"):
        argv = ["-c", f"protocol.version={version}", "ls-remote", f"{url}/many.git"]
        listed = run_git(argv, cwd=tmp_path)
        refs = {line.split(b"\t")[1] for line in listed.splitlines()}
        assert {r for r in refs if not r.endswith(b"^{}")} == {b"HEAD", *source.refs, *names}
