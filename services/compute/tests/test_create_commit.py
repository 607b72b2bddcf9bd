"""CreateCommit through the Compute gRPC service, read back with the real git CLI.

DESIGN "API commits (borrowed from Graft)": the branch moves by
compare-and-swap, a stale call reports the current value and changes
nothing, the repository is never created; seed 001 "Last push": API commits
do not stamp it. The smart-HTTP bridge of ``conftest.py`` serves git.
"""

from __future__ import annotations

from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_proto import find_error_detail
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import RepoSpec, generate_repo

pytestmark = pytest.mark.interop

AUTHOR = compute_pb2.Signature(name=b"A U Thor", email=b"author@example.com")


@pytest.fixture
def url(compute: Any, git_bridge: Callable[[str], ThreadingHTTPServer]) -> str:
    server = git_bridge(compute.address)
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def stub(compute: Any) -> compute_pb2_grpc.ComputeStub:
    return compute_pb2_grpc.ComputeStub(grpc.insecure_channel(compute.address))


def _commit(
    stub: compute_pb2_grpc.ComputeStub,
    repo: str,
    expected: bytes | None,
    changes: dict[bytes, bytes | None],
    branch: bytes = b"main",
) -> compute_pb2.CreateCommitResponse:
    request = compute_pb2.CreateCommitRequest(
        repo=repo,
        branch=branch,
        message=b"API commit",
        author=AUTHOR,
        changes=[
            compute_pb2.FileChange(path=p)
            if c is None
            else compute_pb2.FileChange(path=p, content=c)
            for p, c in changes.items()
        ],
    )
    if expected is not None:
        request.expected_oid = expected
    response: compute_pb2.CreateCommitResponse = stub.CreateCommit(request)
    return response


def _error(call: Any) -> tuple[grpc.StatusCode, str, dict[str, Any]]:
    import json

    with pytest.raises(grpc.RpcError) as info:
        call()
    detail = find_error_detail(info.value.trailing_metadata())  # type: ignore[attr-defined]
    assert detail is not None
    return info.value.code(), detail.code, json.loads(detail.details_json or "{}")  # type: ignore[attr-defined]


def _refs(url: str, repo: str, cwd: Path) -> bytes:
    return run_git(["ls-remote", f"{url}/{repo}.git"], cwd=cwd)


def test_commits_are_visible_to_a_clone(
    url: str, stub: compute_pb2_grpc.ComputeStub, compute: Any, tmp_path: Path
) -> None:
    stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo="cc/visible"))
    first = _commit(stub, "cc/visible", None, {b"a.txt": b"a\n", b"dir/b.txt": b"b\n"})
    second = _commit(stub, "cc/visible", first.oid, {b"a.txt": None, b"dir/c.txt": b"c\n"})
    clone = tmp_path / "clone"
    run_git(["clone", "--quiet", f"{url}/cc/visible.git", str(clone)], cwd=tmp_path)
    run_git(["fsck", "--strict", "--no-progress"], cwd=clone)
    assert run_git(["rev-parse", "HEAD", "HEAD^", "HEAD^{tree}"], cwd=clone).split() == [
        second.oid.hex().encode(),
        first.oid.hex().encode(),
        second.tree.hex().encode(),
    ]
    assert run_git(["ls-files"], cwd=clone).split() == [b"dir/b.txt", b"dir/c.txt"]
    summary = stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="cc/visible")).repository
    assert not summary.HasField("last_push_us"), "an API commit stamped the last push"


def test_commit_on_pushed_history_keeps_last_push(
    url: str, stub: compute_pb2_grpc.ComputeStub, tmp_path: Path
) -> None:
    source = generate_repo(tmp_path / "source.git", RepoSpec(seed=11, commits=5, files=6))
    run_git(["push", "--mirror", f"{url}/cc/pushed.git"], cwd=source.path)
    before = stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="cc/pushed")).repository
    tip = bytes.fromhex(source.refs[b"refs/heads/main"].decode())
    made = _commit(stub, "cc/pushed", tip, {b"added.txt": b"added\n"})
    after = stub.GetRepository(compute_pb2.GetRepositoryRequest(repo="cc/pushed")).repository
    assert after.last_push_us == before.last_push_us
    assert made.oid.hex().encode() in _refs(url, "cc/pushed", tmp_path)
    work = tmp_path / "work"
    run_git(["clone", "--quiet", f"{url}/cc/pushed.git", str(work)], cwd=tmp_path)
    diff = run_git(["diff", "--name-status", tip.hex(), "HEAD"], cwd=work)
    assert diff.split() == [b"A", b"added.txt"]


@pytest.mark.parametrize("case", ["moved", "born-unexpected", "unborn-expected"])
def test_stale_expected_oid_changes_nothing(
    url: str, stub: compute_pb2_grpc.ComputeStub, tmp_path: Path, case: str
) -> None:
    repo = f"cc/stale-{case}"  # the gRPC ledger lives for the session: one name per case
    stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo=repo))
    first = _commit(stub, repo, None, {b"a": b"a"})
    second = _commit(stub, repo, first.oid, {b"b": b"b"})
    before = _refs(url, repo, tmp_path)
    branch, expected, current = {
        "moved": (b"main", first.oid, second.oid.hex()),
        "born-unexpected": (b"main", None, second.oid.hex()),
        "unborn-expected": (b"other", second.oid, None),
    }[case]
    status, code, details = _error(lambda: _commit(stub, repo, expected, {b"c": b"c"}, branch))
    assert (status, code) == (grpc.StatusCode.FAILED_PRECONDITION, "stale_ref")
    assert details["current_oid"] == current
    assert _refs(url, repo, tmp_path) == before


def test_invalid_path_and_missing_repository(
    url: str, stub: compute_pb2_grpc.ComputeStub, tmp_path: Path
) -> None:
    status, code, details = _error(lambda: _commit(stub, "cc/nope", None, {b"a": b"a"}))
    assert (status, code) == (grpc.StatusCode.NOT_FOUND, "not_found")
    stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo="cc/paths"))
    status, code, details = _error(lambda: _commit(stub, "cc/paths", None, {b"x/.git/y": b"y"}))
    assert (status, code, details["path"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid_path",
        "x/.git/y",
    )
    assert _refs(url, "cc/paths", tmp_path) == b""
    listed = stub.ListRepositories(compute_pb2.ListRepositoriesRequest())
    assert "cc/nope" not in [r.name for r in listed.repositories], "a commit created a repository"


def test_large_commit_goes_to_a_stored_layer(
    url: str, stub: compute_pb2_grpc.ComputeStub, compute: Any, tmp_path: Path
) -> None:
    import random

    data = random.Random(5).randbytes(64 * 1024)  # over the fixture's 16 KiB inline bound
    stub.CreateRepository(compute_pb2.CreateRepositoryRequest(repo="cc/big"))
    made = _commit(stub, "cc/big", None, {b"blob.bin": data})
    state = compute.host._repos["cc/big"].state
    assert any(e.key is not None for e in state.manifest), "the layer was not stored"
    clone = tmp_path / "cc/big"
    run_git(["clone", "--quiet", f"{url}/cc/big.git", str(clone)], cwd=tmp_path)
    assert (clone / "blob.bin").read_bytes() == data
    assert run_git(["rev-parse", "HEAD"], cwd=clone).strip() == made.oid.hex().encode()
