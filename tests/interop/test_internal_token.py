"""Issue 23 item 5: every internal gRPC call carries the shared secret (docs/security.md,
"Internal calls"), on a real `enroute dev` (its three roles as processes).

The normal flows (push, clone, the REST API) work, so gitproto -> compute and
compute -> ledger send the token; a call made straight to a compute's or a
ledger's gRPC port without it, or with a wrong one, is refused UNAUTHENTICATED
for each kind of method (unary, server stream, client stream, bidirectional),
with a log line; the HTTP probes stay open; the per-repository ``/status`` needs
the same token as an admin bearer token.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from enroute_proto.peer_token import TOKEN_KEY
from enroute_testing.devserver import DevServer, role_log, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.ready import ready_in_log


class Dev:
    def __init__(self, server: DevServer, root: Path) -> None:
        self.server = server
        self.logs = root / "data" / "logs"
        self.token = (root / "data" / "internal-token").read_text().strip()
        self.grpc: dict[str, str] = {}
        self.http: dict[str, str] = {}
        for role in ("ledger", "compute"):
            ready = ready_in_log(role_log(root, role), role)[0]  # the first start
            self.grpc[role], self.http[role] = ready["grpc"], f"http://{ready['http']}"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    root = tmp_path_factory.mktemp("internal-token")
    with running_dev(root) as server:
        yield Dev(server, root)


def _code(call: Any) -> grpc.StatusCode:
    try:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            for _ in result:
                break
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def _calls(dev: Dev, metadata: tuple[tuple[str, str], ...]) -> dict[str, grpc.StatusCode]:
    """One call of each handler kind to the compute and the ledger, with ``metadata``."""
    md = metadata or None
    out = {}
    with grpc.insecure_channel(dev.grpc["compute"]) as channel:
        compute = compute_pb2_grpc.ComputeStub(channel)
        out["compute ListRepositories"] = _code(
            lambda: compute.ListRepositories(
                compute_pb2.ListRepositoriesRequest(), metadata=md, timeout=20
            )
        )
        out["compute InfoRefs"] = _code(
            lambda: compute.InfoRefs(iter([compute_pb2.GitRequest()]), metadata=md, timeout=20)
        )
    with grpc.insecure_channel(dev.grpc["ledger"]) as channel:
        ledger = ledger_pb2_grpc.LedgerStub(channel)
        raft = ledger_pb2_grpc.RaftTransportStub(channel)
        out["ledger List"] = _code(
            lambda: ledger.List(ledger_pb2.ListRequest(), metadata=md, timeout=20)
        )
        out["ledger Subscribe"] = _code(
            lambda: ledger.Subscribe(ledger_pb2.SubscribeRequest(), metadata=md, timeout=5)
        )
        out["ledger Send"] = _code(
            lambda: raft.Send(iter([ledger_pb2.RaftBatch()]), metadata=md, timeout=20)
        )
    return out


@pytest.mark.interop
@pytest.mark.timeout(240)
def test_internal_calls_need_the_token(dev: Dev, tmp_path: Path) -> None:
    # the normal flows: gitproto -> compute -> ledger, each call with the token
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    (src / "a.txt").write_text("internal token\n")
    run_git(["add", "."], cwd=src)
    run_git(["commit", "-q", "-m", "c"], cwd=src)
    url = f"{dev.server.url}/sec/token.git"
    run_git(["push", "-q", url, "main:refs/heads/main"], cwd=src)
    run_git(["clone", "-q", url, str(tmp_path / "clone")], cwd=tmp_path)
    assert (tmp_path / "clone" / "a.txt").read_text() == "internal token\n"

    for metadata in ((), ((TOKEN_KEY, "x" * 43),)):
        refused = _calls(dev, metadata)
        assert set(refused.values()) == {grpc.StatusCode.UNAUTHENTICATED}, refused
    admitted = _calls(dev, ((TOKEN_KEY, dev.token),))
    assert grpc.StatusCode.UNAUTHENTICATED not in admitted.values(), admitted

    compute_log = (dev.logs / "compute.log").read_text(errors="replace")
    ledger_log = (dev.logs / "ledger.log").read_text(errors="replace")
    for reason in ("missing_token", "wrong_token"):
        assert "method=/enroute.compute.v1.Compute/ListRepositories" in compute_log
        assert f"reason={reason}" in compute_log and f"reason={reason}" in ledger_log
    assert "/enroute.ledger.v1.RaftTransport/Send" in ledger_log

    # the probes stay open to the kubelet (HTTP, no token)
    for role in ("ledger", "compute"):
        for path in ("/healthz", "/readyz"):
            with urllib.request.urlopen(dev.http[role] + path, timeout=20) as r:
                assert r.status == 200, (role, path)


@pytest.mark.interop
@pytest.mark.timeout(240)
def test_repository_status_needs_the_admin_token(dev: Dev, tmp_path: Path) -> None:
    """``/status?repo=`` names a repository and its state: with the internal token as a
    bearer token only (401 otherwise); the summary ``/status`` stays open to scrapers."""
    for role in ("ledger", "compute"):
        url = f"{dev.http[role]}/status?repo=sec/token"
        for headers in ({}, {"Authorization": "Bearer " + "x" * 43}):
            try:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20)
                raise AssertionError(f"{role}: /status?repo= answered without the token")
            except urllib.error.HTTPError as error:
                assert error.code == 401, (role, error.code)
        admin = urllib.request.Request(url, headers={"Authorization": f"Bearer {dev.token}"})
        with urllib.request.urlopen(admin, timeout=20) as r:
            assert r.status == 200 and isinstance(json.loads(r.read()), dict)
        with urllib.request.urlopen(f"{dev.http[role]}/status", timeout=20) as r:
            assert r.status == 200


@pytest.mark.interop
@pytest.mark.timeout(120)
def test_ledger_leadership_transfer_needs_the_admin_token(dev: Dev) -> None:
    """POST /transfer-leadership (the chart's preStop hook) moves every group's leader:
    with the internal token only, as the hook sends it."""
    url = f"{dev.http['ledger']}/transfer-leadership?timeout=5"
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=20)
        raise AssertionError("/transfer-leadership answered without the token")
    except urllib.error.HTTPError as error:
        assert error.code == 401, error.code
    admin = urllib.request.Request(
        url, data=b"", method="POST", headers={"Authorization": f"Bearer {dev.token}"}
    )
    with urllib.request.urlopen(admin, timeout=30) as r:
        assert r.status == 200 and isinstance(json.loads(r.read()), dict)
