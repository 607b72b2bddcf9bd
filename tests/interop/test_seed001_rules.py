"""Seed 001 (Lifecycle), one test per rule of "Creation", "Deletion", "Listing", "Last
push" and "Ref update times", each through a public API. docs/lifecycle.md maps every
rule sentence to its test.

Two setups:

* ``enroute_url``: a real ``enroute dev``; the tests speak REST /api/v1 and drive the
  real git client over smart HTTP. Where a rule is about the object store (trash
  marker, state object), the test reads the dev server's file store afterwards.
* ``cluster``: one real ledger process and two computes serving Compute gRPC on
  127.0.0.1, A on the wall clock and B one hour behind (clocks of proposers differ),
  each with its own view, for the rules about clocks, followers and versions.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.util
import itertools
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from enroute_compute.main import SystemClock
from enroute_core.base.ids import ZERO_OID, ObjectId
from enroute_core.git.pktline import pkt_text
from enroute_core.protocol.receive import PushCommand, PushRequest, encode_push_request
from enroute_core.state import decode_state
from enroute_core.state.names import state_key, trash_key
from enroute_core.storage.objectstore import open_store
from enroute_proto import find_error_detail
from enroute_proto.gen.enroute.common.v1 import common_pb2
from enroute_proto.gen.enroute.compute.v1 import compute_pb2
from enroute_testing.devserver import DevServer
from enroute_testing.gitcli import GitFailed, run_git
from enroute_testing.ledgers import LedgerProc, write_config
from enroute_testing.waiting import wait_for_value, wait_until

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]
HOUR_US = 3600 * 1_000_000
_names = itertools.count()


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


# The computes-on-one-ledger helpers of the compute service's deletion tests.
D = _load(ROOT / "services/compute/tests/test_deletion.py", "enroute_deletion_helpers")


def fresh(section: str) -> str:
    return f"seed001/{section}-{next(_names)}-{time.monotonic_ns()}"


now_us = SystemClock().now_us
"""Wall time in µs, read as a compute reads it."""


# -- REST and git against `enroute dev` -------------------------------------------------


def api(url: str, method: str, path: str, body: object = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/api/v1{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def ok(url: str, method: str, path: str, body: object = None) -> Any:
    status, answer = api(url, method, path, body)
    assert status < 300, (method, path, status, answer)
    return answer


def create(url: str, name: str, branch: str | None = None) -> Any:
    body: dict[str, Any] = {"name": name}
    if branch is not None:
        body["default_branch"] = branch
    return ok(url, "POST", "/repos", body)


def get(url: str, name: str) -> tuple[int, Any]:
    return api(url, "GET", f"/repos/{name}")


def rest_refs(url: str, name: str) -> dict[str, tuple[str, str]]:
    """ref -> (oid, updated_at)."""
    listed = ok(url, "GET", f"/repos/{name}/-/refs")["refs"]
    return {r["name"]: (r["oid"], r["updated_at"]) for r in listed}


def rfc_us(text: str) -> int:
    from datetime import UTC, datetime

    moment = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def api_commit(
    url: str, name: str, branch: str, expected: str | None, files: dict[str, bytes]
) -> Any:
    body = {
        "branch": branch, "expected_oid": expected, "message": "api",
        "author": {"name": "A", "email": "a@example.com"},
        "changes": [{"path": p, "content_base64": base64.b64encode(d).decode()}
                    for p, d in files.items()],
    }  # fmt: skip
    return api(url, "POST", f"/repos/{name}/-/commits", body)


class Work:
    """A local repository whose commits the tests push with the real git client."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir()
        self.git("init", "--quiet", "--initial-branch", "main")
        self.n = 0

    def git(self, *args: str) -> str:
        return run_git(list(args), cwd=self.path).decode().strip()

    def commit(self, branch: str = "main") -> str:
        """A new commit on ``branch`` (created from the current HEAD when new)."""
        self.n += 1
        self.git("checkout", "--quiet", "-B", branch)
        (self.path / "f").write_text(f"{self.n}\n")
        self.git("add", "f")
        self.git("commit", "--quiet", "-m", f"c{self.n}")
        return self.git("rev-parse", "HEAD")

    def push(self, url: str, *refspecs: str) -> None:
        self.git("push", "--quiet", url, *refspecs)


@pytest.fixture(scope="module")
def dev_store(enroute_dev: DevServer) -> Path:
    """The file store of the `enroute dev` of this session (``--data DIR`` -> DIR/store)."""
    store = enroute_dev.log_path.parent / "data" / "store"
    assert store.is_dir(), f"no store at {store}"
    return store


def store_get(store: Path, key: str) -> bytes | None:
    async def read() -> bytes | None:
        s = open_store(f"file://{store}")
        try:
            return await s.get(key)
        except Exception:
            return None
        finally:
            close = getattr(s, "close", None)
            if close is not None:
                await close()

    return asyncio.run(read())


# -- Compute gRPC against one ledger, two computes --------------------------------------


class SkewedClock(SystemClock):
    """The compute's own clock with its wall time moved by ``offset_us``: node b of the
    cluster runs an hour behind, and no rule may depend on the computes' clocks agreeing."""

    def __init__(self, offset_us: int) -> None:
        self.offset_us = offset_us

    def now_us(self) -> int:
        return super().now_us() + self.offset_us


@dataclass
class Cluster:
    ledger: LedgerProc
    store: Path
    a: Any  # D.Compute, wall clock
    b: Any  # D.Compute, one hour behind
    start: Callable[[str], Any]  # another compute on the wall clock


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("seed001-cluster")
    store = work / "store"
    ledger = LedgerProc(write_config(work / "ledger.yaml", node_id=1, data=work / "l", store=store))
    ledger.start()
    stops: list[Callable[[], None]] = []

    def start(label: str, offset_us: int = 0) -> Any:
        node, stop = D.start_compute(ledger.grpc_addr, store, work / label, SkewedClock(offset_us))
        stops.append(stop)
        return node

    try:
        yield Cluster(ledger, store, start("a"), start("b", -HOUR_US), start)
    finally:
        for stop in reversed(stops):
            stop()
        ledger.kill()


def g_create(c: Any, name: str, branch: bytes = b"main") -> common_pb2.RepositoryState:
    req = compute_pb2.CreateRepositoryRequest(repo=name, default_branch=branch)
    state: common_pb2.RepositoryState = c.stub.CreateRepository(req, timeout=30).repository
    return state


def g_get(c: Any, name: str) -> common_pb2.RepositoryState:
    req = compute_pb2.GetRepositoryRequest(repo=name)
    state: common_pb2.RepositoryState = c.stub.GetRepository(req, timeout=30).repository
    return state


def g_refs(c: Any, name: str) -> dict[bytes, tuple[bytes, int]]:
    chunks = c.stub.ListRefs(compute_pb2.ListRefsRequest(repo=name), timeout=30)
    return {r.name: (r.oid, r.set_time_us) for m in chunks for r in m.refs}


def g_commit(c: Any, name: str, expected: bytes | None, data: bytes) -> bytes:
    oid: bytes = D.commit(c, name, expected, {b"f": data})
    return oid


def g_code(fn: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    call: Any = info.value  # a failed call is also a grpc.Call
    detail = find_error_detail(call.trailing_metadata())
    return detail.code if detail is not None else "?"


def g_push(c: Any, name: str, commands: list[tuple[bytes, bytes, bytes]], pack: bytes) -> bytes:
    """Compute.ReceivePack with ``(old, new, ref)`` commands: the report-status."""
    request = PushRequest(
        tuple(PushCommand(ObjectId(o), ObjectId(n), r) for o, n, r in commands),
        (b"report-status",),
    )
    header = compute_pb2.GitRequestHeader(repo=name, service=compute_pb2.GIT_SERVICE_RECEIVE_PACK)
    msgs = [compute_pb2.GitRequest(header=header)]
    msgs.append(compute_pb2.GitRequest(body=encode_push_request(request) + pack))
    return b"".join(r.body for r in c.stub.ReceivePack(iter(msgs), timeout=30))


_EMPTY_PACK_HEAD = b"PACK" + (2).to_bytes(4, "big") + (0).to_bytes(4, "big")
EMPTY_PACK = _EMPTY_PACK_HEAD + hashlib.sha1(_EMPTY_PACK_HEAD).digest()
"""A pack of no objects: what a push that only sets refs to known objects sends."""


def pack_of(work: Work, *revs: str) -> bytes:
    return run_git(["pack-objects", "--stdout", "--revs", "--quiet"], cwd=work.path,
                   input="".join(r + "\n" for r in revs).encode())  # fmt: skip


def raw(hex_oid: str) -> bytes:
    return bytes.fromhex(hex_oid)


# =====================================================================================
# Creation
# =====================================================================================


def test_creation_create_repository_activates_with_the_create_option_and_a_head(
    enroute_url: str,
) -> None:
    """ "CreateRepository activates the repository with the create option and a HEAD.\""""
    name = fresh("creation")
    status, made = api(enroute_url, "POST", "/repos", {"name": name, "default_branch": "trunk"})
    assert status == 201 and made["head"] == "refs/heads/trunk" and not made["deleted"]
    assert get(enroute_url, name) == (200, made)


def test_creation_claims_the_next_incarnation_when_missing_or_deleted(enroute_url: str) -> None:
    """ "If the repository does not exist (or is deleted), the node claims the next
    incarnation, as for an implicit create.\""""
    name = fresh("creation")
    first = create(enroute_url, name)
    ok(enroute_url, "DELETE", f"/repos/{name}")
    second = create(enroute_url, name)
    assert second["incarnation"] == first["incarnation"] + 1
    ok(enroute_url, "DELETE", f"/repos/{name}")
    status, third = api(enroute_url, "POST", "/repos", {"name": name})
    assert status == 201 and third["incarnation"] == first["incarnation"] + 2


def test_creation_head_names_the_default_branch_and_is_kept(cluster: Cluster) -> None:
    """ "HEAD names the default branch, and the state marks HEAD as kept.\""""
    name = fresh("creation")
    made = g_create(cluster.a, name, b"trunk")
    assert made.head == b"refs/heads/trunk" and made.head_kept
    assert g_get(cluster.b, name).head_kept


def test_creation_kept_head_stays_on_its_unborn_branch_and_an_empty_clone_takes_it(
    enroute_url: str, tmp_path: Path
) -> None:
    """ "HEAD stays on its branch while that branch is unborn, as Git does (ls-refs
    unborn; an empty clone takes it).\""""
    name = fresh("creation")
    create(enroute_url, name, "trunk")
    url = f"{enroute_url}/{name}.git"
    empty = tmp_path / "empty"
    run_git(["clone", "--quiet", url, str(empty)], cwd=tmp_path)
    assert run_git(["symbolic-ref", "HEAD"], cwd=empty).strip() == b"refs/heads/trunk"
    work = Work(tmp_path / "work")
    work.commit("other")
    work.push(url, "other")
    assert get(enroute_url, name)[1]["head"] == "refs/heads/trunk"  # trunk is still unborn
    again = tmp_path / "again"
    run_git(["clone", "--quiet", "--no-checkout", url, str(again)], cwd=tmp_path)
    assert run_git(["symbolic-ref", "HEAD"], cwd=again).strip() == b"refs/heads/trunk"


def test_creation_kept_head_stays_on_its_branch_after_the_branch_is_deleted(
    enroute_url: str, tmp_path: Path
) -> None:
    """ "It also stays on its branch after the branch is deleted.\""""
    name = fresh("creation")
    create(enroute_url, name, "trunk")
    url = f"{enroute_url}/{name}.git"
    work = Work(tmp_path / "work")
    work.commit("trunk")
    work.commit("other")
    work.push(url, "trunk", "other")
    work.push(url, ":trunk")
    assert set(rest_refs(enroute_url, name)) == {"refs/heads/other"}
    assert get(enroute_url, name)[1]["head"] == "refs/heads/trunk"


def test_creation_push_created_head_is_repaired_main_then_master_then_the_first(
    enroute_url: str, tmp_path: Path
) -> None:
    """ "A repository that a push created is different: Enroute repairs its HEAD to an
    existing branch (main, then master, then the first) when its branch is gone.\""""
    name = fresh("creation")
    url = f"{enroute_url}/{name}.git"
    work = Work(tmp_path / "work")
    for branch in ("main", "master", "topic/b", "topic/a"):
        work.commit(branch)
    work.push(url, "main", "master", "topic/b", "topic/a")
    assert get(enroute_url, name)[1]["head"] == "refs/heads/main"
    work.push(url, ":main")
    assert get(enroute_url, name)[1]["head"] == "refs/heads/master"
    work.push(url, ":master")
    assert get(enroute_url, name)[1]["head"] == "refs/heads/topic/a"


def test_creation_creating_an_existing_repository_changes_nothing(
    enroute_url: str, tmp_path: Path
) -> None:
    """ "Creating an existing repository changes nothing and answers with what it has.\""""
    name = fresh("creation")
    made = create(enroute_url, name, "trunk")
    work = Work(tmp_path / "work")
    work.commit("trunk")
    work.push(f"{enroute_url}/{name}.git", "trunk")
    before = get(enroute_url, name)[1], rest_refs(enroute_url, name)
    status, again = api(enroute_url, "POST", "/repos", {"name": name, "default_branch": "dev"})
    assert status == 200 and again == before[0]
    assert again["incarnation"] == made["incarnation"] and again["head"] == "refs/heads/trunk"
    assert (get(enroute_url, name)[1], rest_refs(enroute_url, name)) == before


def test_creation_names_are_at_most_256_bytes(enroute_url: str) -> None:
    """ "Names are at most 256 bytes, so every Enroute key is one.\""""
    prefix = "seed001/long-"
    longest = prefix + "x" * (256 - len(prefix))
    ok(enroute_url, "DELETE", f"/repos/{longest}")
    assert api(enroute_url, "POST", "/repos", {"name": longest})[0] in (200, 201)
    status, error = api(enroute_url, "POST", "/repos", {"name": longest + "y"})
    assert status == 400 and error["error"]["code"] == "invalid_name"
    assert get(enroute_url, longest)[0] == 200 and get(enroute_url, longest + "y")[0] == 400


@dataclass
class Trio:
    """Three ledger voters; node 3 reaches its peers, and they it, only through proxies."""

    nodes: list[LedgerProc]
    links: list[Any]  # D.TcpProxy: to node 1, to node 2 (for node 3), to node 3 (for 1, 2)
    on_1: Any  # a compute whose ledger is node 1
    on_3: Any  # a compute whose ledger is node 3


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[Trio]:
    from enroute_testing.ports import free_port

    ports = [free_port() for _ in range(3)]
    real = [f"127.0.0.1:{p}" for p in ports]
    links = [D.TcpProxy(a) for a in real]
    seen_by = {1: (real[0], real[1], links[2].address), 2: (real[0], real[1], links[2].address),
               3: (links[0].address, links[1].address, real[2])}  # fmt: skip
    fast: dict[str, object] = {"tick_interval": 0.05}
    nodes = []
    for i in (1, 2, 3):
        config = write_config(
            tmp_path / f"l{i}.yaml",
            node_id=i,
            data=tmp_path / f"d{i}",
            store=tmp_path / "store",
            grpc_port=ports[i - 1],
            members=seen_by[i],
            ledger=fast,
        )
        nodes.append(LedgerProc(config))
    stops: list[Callable[[], None]] = []
    try:
        for n in nodes:
            n.spawn()
        for n in nodes:
            n.wait_ready()
        computes = []
        for i in (0, 2):
            node, stop = D.start_compute(
                real[i], tmp_path / "store", tmp_path / f"c{i}", SystemClock()
            )
            stops.append(stop)
            computes.append(node)
        yield Trio(nodes, links, computes[0], computes[1])
    finally:
        for stop in stops:
            stop()
        for n in nodes:
            n.kill()
        for link in links:
            link.close()


def _leader(node: LedgerProc, repo: str) -> int | None:
    groups = node.status(repo)["raft_groups"]
    assert isinstance(groups, list)
    for g in groups:
        if g["repo"] == repo and not g["deleted"]:
            return int(g["leader"]) if g["leader"] else None
    return None


def _hosts(node: LedgerProc, repo: str) -> bool:
    groups = node.status(repo)["raft_groups"]
    assert isinstance(groups, list)
    return any(g["repo"] == repo for g in groups)


def test_creation_explicit_create_on_a_replica_that_missed_the_deletion(trio: Trio) -> None:
    """ "An explicit create reads the state object even when the node hosts the
    repository, so a replica that missed a deletion cannot answer with the deleted
    repository.\" Node 3 is cut off from its peers, the name is deleted through node 1,
    then created through a compute on node 3, which still hosts E live: the answer is
    never E."""
    names = [fresh("creation") for _ in range(4)]
    made = {n: g_create(trio.on_1, n) for n in names}

    def settled_group() -> str | None:
        for n in names:
            leaders = {_leader(node, n) for node in trio.nodes}
            settled = len(leaders) == 1 and None not in leaders and 3 not in leaders
            if settled and all(_hosts(node, n) for node in trio.nodes):
                return n
        return None

    pick = wait_for_value(settled_group, 20, "a group settled on all three nodes", poll_s=0.05)
    incarnation = made[pick].incarnation
    for link in trio.links:
        link.cut()
    trio.on_1.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=pick), timeout=30)
    assert decode_state(
        store_get(trio.nodes[0].config.parent / "store", state_key(pick)) or b""
    ).deleted
    request = compute_pb2.CreateRepositoryRequest(repo=pick)
    try:
        answer = trio.on_3.stub.CreateRepository(request, timeout=4)
    except grpc.RpcError as exc:
        print(f"create on the cut-off replica: {exc.code()}")  # it cannot reach a quorum
    else:
        assert answer.repository.incarnation != incarnation, "answered with the deleted E"
        assert answer.created and answer.repository.incarnation == incarnation + 1
    for link in trio.links:
        link.resume()

    def created() -> compute_pb2.CreateRepositoryResponse | None:
        try:
            made: compute_pb2.CreateRepositoryResponse
            made = trio.on_3.stub.CreateRepository(request, timeout=10)
        except grpc.RpcError:
            return None  # not healed yet: ask again
        return made

    answer = wait_for_value(created, 30, "the create succeeds once healed", poll_s=0.2)
    assert answer.repository.incarnation == incarnation + 1 and not answer.repository.deleted
    assert g_get(trio.on_1, pick).incarnation == incarnation + 1


# =====================================================================================
# Deletion
# =====================================================================================


def test_deletion_drops_the_refs_and_the_manifest(enroute_url: str, tmp_path: Path) -> None:
    """ "Host the live incarnation E (from the state object) and propose a delete for E.
    The state machine drops the refs and the manifest ...\" Nothing of E comes back."""
    name = fresh("deletion")
    url = f"{enroute_url}/{name}.git"
    work = Work(tmp_path / "work")
    tip = work.commit()
    work.push(url, "main")
    ok(enroute_url, "DELETE", f"/repos/{name}")
    create(enroute_url, name)
    assert rest_refs(enroute_url, name) == {}
    empty = tmp_path / "empty"
    run_git(["init", "--quiet", "--bare", str(empty)], cwd=tmp_path)
    with pytest.raises(GitFailed):
        run_git(["fetch", "--quiet", url, tip], cwd=empty)


def test_deletion_marks_the_state_deleted(enroute_url: str, dev_store: Path) -> None:
    """ "It marks the state deleted.\" (and "When the call returns, the state object says
    deleted.\")"""
    name = fresh("deletion")
    made = create(enroute_url, name)
    assert ok(enroute_url, "DELETE", f"/repos/{name}") is None
    data = store_get(dev_store, state_key(name))
    assert data is not None
    state = decode_state(data)
    assert state.deleted and state.incarnation == made["incarnation"]
    status, error = get(enroute_url, name)
    assert status == 404 and error["error"]["code"] == "not_found"


def test_deletion_every_later_command_in_e_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """ "Every later command in E is refused as deleted, on the node before it reaches the
    log, and by the state machine for any that did.\" B's view of E is held (its
    subscription cannot tell it), so B prepares a push against E after the deletion:
    it is refused and nothing lands, not even in E + 1."""
    a, b = cluster.a, cluster.b
    name = fresh("deletion")
    g_create(a, name)
    first = g_commit(a, name, None, b"one\n")
    assert g_refs(b, name)[b"refs/heads/main"][0] == first
    b.call(b.host.ledger.hold)
    try:
        a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=30)
        g_create(a, name)  # E + 1, empty
        work = Work(tmp_path / "work")
        tip = work.commit()
        report = g_push(b, name, [(ZERO_OID, raw(tip), b"refs/heads/topic")], pack_of(work, tip))
    finally:
        b.call(b.host.ledger.release)
    assert pkt_text(b"unpack ok") in report and b"ng refs/heads/topic" in report, report
    assert g_refs(a, name) == {}


def test_deletion_of_a_missing_or_deleted_repository_succeeds(enroute_url: str) -> None:
    """ "Deleting a missing or deleted repository succeeds.\""""
    name = fresh("deletion")
    assert api(enroute_url, "DELETE", f"/repos/{name}")[0] == 204  # never existed
    create(enroute_url, name)
    assert api(enroute_url, "DELETE", f"/repos/{name}")[0] == 204
    assert api(enroute_url, "DELETE", f"/repos/{name}")[0] == 204  # already deleted


def test_deletion_writes_the_trash_marker_with_the_last_upload_generation(
    enroute_url: str, dev_store: Path
) -> None:
    """ "After the tombstone is applied there ..., write the trash marker trash/<repo>/<E>
    with the last upload generation of E.\""""
    name = fresh("deletion")
    made = create(enroute_url, name)
    ok(enroute_url, "DELETE", f"/repos/{name}")
    raw = store_get(dev_store, trash_key(name, made["incarnation"]))
    assert raw is not None, "no trash marker"
    marker = json.loads(raw)
    state = decode_state(store_get(dev_store, state_key(name)) or b"")
    assert marker["incarnation"] == made["incarnation"]
    assert marker["last_upload_gen"] == state.upload_gen


def test_deletion_swaps_the_deleted_state_into_the_state_object_at_e(cluster: Cluster) -> None:
    """ "Then swap the deleted state into the state object at E by compare-and-swap.\"
    The state object holds E, deleted, at the tombstone's version."""
    name = fresh("deletion")
    made = g_create(cluster.a, name)
    g_commit(cluster.a, name, None, b"x\n")
    live = g_get(cluster.a, name)
    cluster.a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=30)
    state = decode_state(store_get(cluster.store, state_key(name)) or b"")
    assert state.deleted and state.incarnation == made.incarnation
    assert state.version == live.version + 1 and not state.refs


def test_deletion_activation_answers_not_found_unless_it_creates(
    enroute_url: str, tmp_path: Path
) -> None:
    """ "When the call returns, the state object says deleted. Activation then answers
    not found unless it creates.\""""
    name = fresh("deletion")
    url = f"{enroute_url}/{name}.git"
    made = create(enroute_url, name)
    ok(enroute_url, "DELETE", f"/repos/{name}")
    assert get(enroute_url, name)[0] == 404
    assert rest_refs_status(enroute_url, name) == 404
    assert api_commit(enroute_url, name, "main", None, {"a": b"a"})[0] == 404
    with pytest.raises(GitFailed):
        run_git(["ls-remote", url], cwd=tmp_path)
    assert get(enroute_url, name)[0] == 404  # none of these created it
    work = Work(tmp_path / "work")
    work.commit()
    work.push(url, "main")  # a push creates (implicitly)
    assert get(enroute_url, name)[1]["incarnation"] == made["incarnation"] + 1


def rest_refs_status(url: str, name: str) -> int:
    return api(url, "GET", f"/repos/{name}/-/refs")[0]


def test_deletion_a_create_claims_e_plus_1(enroute_url: str, dev_store: Path) -> None:
    """ "A create claims E + 1 by compare-and-swap from the deleted state, through the
    same claim as incarnation 1.\""""
    name = fresh("deletion")
    made = create(enroute_url, name)
    ok(enroute_url, "DELETE", f"/repos/{name}")
    again = create(enroute_url, name, "trunk")
    assert again["incarnation"] == made["incarnation"] + 1 and again["head"] == "refs/heads/trunk"
    state = decode_state(store_get(dev_store, state_key(name)) or b"")
    assert state.incarnation == again["incarnation"] and not state.deleted


def test_deletion_the_new_incarnation_starts_empty(enroute_url: str, tmp_path: Path) -> None:
    """ "The initial state of the new incarnation is empty.\""""
    name = fresh("deletion")
    url = f"{enroute_url}/{name}.git"
    work = Work(tmp_path / "work")
    work.commit()
    work.commit("other")
    work.push(url, "main", "other")
    ok(enroute_url, "DELETE", f"/repos/{name}")
    made = create(enroute_url, name)
    assert made["last_push"] is None and rest_refs(enroute_url, name) == {}
    assert run_git(["ls-remote", url], cwd=tmp_path) == b""
    status, _ = api_commit(enroute_url, name, "main", None, {"a": b"a"})  # unborn again
    assert status == 201


def test_deletion_the_new_version_is_one_more_than_the_last_of_e(cluster: Cluster) -> None:
    """ "Its version is one more than the last version of E, so views and subscribers
    never mistake it for an older state.\""""
    name = fresh("deletion")
    g_create(cluster.a, name)
    g_commit(cluster.a, name, None, b"x\n")
    cluster.a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=30)
    last_of_e = decode_state(store_get(cluster.store, state_key(name)) or b"").version
    again = g_create(cluster.a, name)
    assert again.version == last_of_e + 1
    assert g_get(cluster.b, name).version == last_of_e + 1


def test_deletion_the_new_upload_generation_is_past_the_window_of_e(cluster: Cluster) -> None:
    """ "Its upload generation is the last one of E plus the upload window, plus 1.\""""
    name = fresh("deletion")
    made = g_create(cluster.a, name)
    cluster.a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=30)
    marker = json.loads(store_get(cluster.store, trash_key(name, made.incarnation)) or b"{}")
    g_create(cluster.a, name)
    state = decode_state(store_get(cluster.store, state_key(name)) or b"")
    assert state.incarnation == made.incarnation + 1
    assert state.upload_gen == marker["last_upload_gen"] + state.upload_window + 1


def test_deletion_a_node_hosting_e_drops_it_when_it_hosts_e_plus_1(cluster: Cluster) -> None:
    """ "A node that hosts E drops it when it hosts E + 1 (as a superseded incarnation).\""""
    name = fresh("deletion")
    made = g_create(cluster.a, name)
    cluster.a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=30)
    g_create(cluster.a, name)
    groups = cluster.ledger.status(name)["raft_groups"]
    assert isinstance(groups, list)
    mine = {(g["incarnation"], bool(g.get("deleted"))) for g in groups if g["repo"] == name}
    assert made.incarnation not in {inc for inc, _ in mine}, groups
    assert (made.incarnation + 1, False) in mine


# =====================================================================================
# Listing
# =====================================================================================


def _list_all(c: Any, limit: int) -> tuple[list[str], list[int]]:
    names: list[str] = []
    sizes: list[int] = []
    token = ""
    for _ in range(1000):
        page = c.stub.ListRepositories(
            compute_pb2.ListRepositoriesRequest(limit=limit, page_token=token), timeout=30
        )
        names += [r.name for r in page.repositories]
        sizes.append(len(page.repositories))
        token = page.next_page_token
        if not token:
            return names, sizes
    raise AssertionError("paging never ended")


def test_listing_is_in_name_order_from_the_hosted_list(enroute_url: str) -> None:
    """ "The list of hosted repositories on each node (in name order, in memory) is
    therefore the source\": names come back in byte order, each once."""
    prefix = fresh("listing")
    names = [f"{prefix}/{n}" for n in ("b", "B", "a-z", "a.z", "a/z", "a_z", "a0")]
    for name in names:
        create(enroute_url, name)
    seen: list[str] = []
    token = ""
    while True:
        page = ok(enroute_url, "GET", f"/repos?limit=500&page_token={token}")
        seen += [r["name"] for r in page["repos"]]
        token = page["next_page_token"] or ""
        if not token:
            break
    assert seen == sorted(seen, key=str.encode) and len(seen) == len(set(seen))
    assert [n for n in seen if n.startswith(prefix + "/")] == sorted(names, key=str.encode)


def test_listing_needs_no_object_store(tmp_path: Path) -> None:
    """ "... is therefore the source, with no object-store requests.\" A ledger and a
    compute of their own; while the listing runs, the store directory is a plain file,
    so any store request would fail: the listing is still whole and right."""
    store = tmp_path / "store"
    ledger = LedgerProc(write_config(tmp_path / "l.yaml", node_id=1, data=tmp_path / "l",
                                     store=store)).start()  # fmt: skip
    compute, stop = D.start_compute(ledger.grpc_addr, store, tmp_path / "c", SystemClock())
    try:
        names = [f"nostore/{c}" for c in "abcde"]
        for name in names:
            g_create(compute, name)
        compute.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=names[1]))
        compute.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=names[3]))
        again = g_create(compute, names[3])
        want = [(names[0], 1), (names[2], 1), (names[3], again.incarnation), (names[4], 1)]
        assert again.incarnation == 2
        away = tmp_path / "store.away"
        store.rename(away)
        store.write_bytes(b"not a directory")
        try:
            seen: list[tuple[str, int]] = []
            token = ""
            while True:
                page = compute.stub.ListRepositories(
                    compute_pb2.ListRepositoriesRequest(limit=2, page_token=token), timeout=10
                )
                seen += [(r.name, r.incarnation) for r in page.repositories]
                token = page.next_page_token
                if not token:
                    break
        finally:
            store.unlink()
            away.rename(store)
        assert seen == want
    finally:
        stop()
        ledger.kill()


def test_listing_after_the_call_agrees_with_it(enroute_url: str) -> None:
    """ "The node that answered a create hosts it, and the node that answered a deletion
    applied it. A listing after the call therefore agrees with it while that node is up.\""""
    name = fresh("listing")

    def listed() -> dict[str, int]:
        start = base64.urlsafe_b64encode(name[:-1].encode()).decode()
        page = ok(enroute_url, "GET", f"/repos?limit=50&page_token={start}")
        return {r["name"]: r["incarnation"] for r in page["repos"]}

    made = create(enroute_url, name)
    assert listed().get(name) == made["incarnation"]
    ok(enroute_url, "DELETE", f"/repos/{name}")
    assert name not in listed()
    again = create(enroute_url, name)
    assert listed().get(name) == again["incarnation"] == made["incarnation"] + 1


def test_listing_pages_never_skip_a_name_and_can_be_short(cluster: Cluster) -> None:
    """ "Each node returns at most one page of names, deleted ones too, and says if more
    follow. The merged page stops at the smallest last name among nodes that had more,
    so pages never skip a name. A page can be short, because deleted names take places.\""""
    prefix = fresh("listing")
    names = [f"{prefix}/{i:02}" for i in range(9)]
    for name in names:
        g_create(cluster.a, name)
    gone = {names[1], names[2], names[3], names[6]}
    for name in gone:
        cluster.a.stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name))
    want = [n for n in names if n not in gone]
    for limit in (1, 2, 3, 4, 100):
        for c in (cluster.a, cluster.b):
            seen, sizes = _list_all(c, limit)
            assert [n for n in seen if n.startswith(prefix)] == want, (limit, seen)
            assert all(size <= limit for size in sizes)
    # limit 3 from just before names[0]: "00" live, "01".."03" deleted take the places.
    start = base64.urlsafe_b64encode(prefix.encode()).decode()
    page = cluster.a.stub.ListRepositories(
        compute_pb2.ListRepositoriesRequest(limit=3, page_token=start)
    )
    assert [r.name for r in page.repositories] == [names[0]] and page.next_page_token


# =====================================================================================
# Last push
# =====================================================================================


def test_last_push_is_stamped_by_the_computes_clock_on_a_git_push(
    enroute_url: str, tmp_path: Path
) -> None:
    """ "The compute stamps the commit entry of a Git push with its clock.\" (dev runs on
    the wall clock: the stamp lies within the push.)"""
    name = fresh("lastpush")
    create(enroute_url, name)
    work = Work(tmp_path / "work")
    work.commit()
    before = now_us()
    work.push(f"{enroute_url}/{name}.git", "main")
    after = now_us()
    assert before <= rfc_us(get(enroute_url, name)[1]["last_push"]) <= after


def test_last_push_is_recorded_only_if_a_ref_moved(cluster: Cluster, tmp_path: Path) -> None:
    """ "The state machine records it as the last push time if a ref moved\": a push that
    sets a ref to the value it has moves nothing and leaves the last push time."""
    a = cluster.a
    name = fresh("lastpush")
    g_create(a, name)
    work = Work(tmp_path / "work")
    tip = work.commit()
    g_push(a, name, [(ZERO_OID, raw(tip), b"refs/heads/main")], pack_of(work, tip))
    stamped = g_get(a, name).last_push_us
    wait_until(lambda: now_us() > stamped, 5, "the clock moves past the first push")
    report = g_push(a, name, [(raw(tip), raw(tip), b"refs/heads/main")], EMPTY_PACK)
    assert b"ok refs/heads/main" in report, report
    assert g_get(a, name).last_push_us == stamped


def test_last_push_never_moves_back(cluster: Cluster, tmp_path: Path) -> None:
    """ "... and never moves it back.\" B's clock is an hour behind A's."""
    name = fresh("lastpush")
    g_create(cluster.a, name)
    work = Work(tmp_path / "work")
    one = work.commit()
    g_push(cluster.a, name, [(ZERO_OID, raw(one), b"refs/heads/main")], pack_of(work, one))
    stamped = g_get(cluster.a, name).last_push_us
    two = work.commit()
    report = g_push(cluster.b, name, [(raw(one), raw(two), b"refs/heads/main")],
                    pack_of(work, two, "^" + one))  # fmt: skip
    assert b"ok refs/heads/main" in report, report
    assert g_refs(cluster.a, name)[b"refs/heads/main"][0] == raw(two)  # the ref moved
    assert g_get(cluster.a, name).last_push_us == stamped


def test_last_push_is_left_by_a_refused_push(cluster: Cluster, tmp_path: Path) -> None:
    """ "A refused push leaves it.\""""
    a = cluster.a
    name = fresh("lastpush")
    g_create(a, name)
    work = Work(tmp_path / "work")
    one = work.commit()
    g_push(a, name, [(ZERO_OID, raw(one), b"refs/heads/main")], pack_of(work, one))
    stamped = g_get(a, name).last_push_us
    two = work.commit()
    stale = [(raw(two), raw(two), b"refs/heads/main")]  # expects a value main does not have
    report = g_push(a, name, stale, pack_of(work, two, "^" + one))
    assert b"ng refs/heads/main" in report, report
    assert g_get(a, name).last_push_us == stamped


def test_last_push_is_not_stamped_by_api_commits(enroute_url: str, tmp_path: Path) -> None:
    """ "API commits and maintenance do not stamp it.\""""
    name = fresh("lastpush")
    create(enroute_url, name)
    status, _ = api_commit(enroute_url, name, "main", None, {"a": b"a"})
    assert status == 201 and get(enroute_url, name)[1]["last_push"] is None
    run_git(["clone", "--quiet", f"{enroute_url}/{name}.git", "w"], cwd=tmp_path)
    work = tmp_path / "w"
    (work / "b").write_text("b\n")
    run_git(["add", "b"], cwd=work)
    run_git(["commit", "--quiet", "-m", "b"], cwd=work)
    run_git(["push", "--quiet", "origin", "main"], cwd=work)
    pushed = get(enroute_url, name)[1]["last_push"]
    tip = run_git(["rev-parse", "HEAD"], cwd=work).decode().strip()
    assert api_commit(enroute_url, name, "main", tip, {"c": b"c"})[0] == 201
    assert get(enroute_url, name)[1]["last_push"] == pushed


def test_last_push_is_returned_by_describe_with_head(enroute_url: str, tmp_path: Path) -> None:
    """ "A describe call returns it with HEAD.\""""
    name = fresh("lastpush")
    create(enroute_url, name, "trunk")
    work = Work(tmp_path / "work")
    work.commit("trunk")
    work.push(f"{enroute_url}/{name}.git", "trunk")
    described = get(enroute_url, name)[1]
    assert described["head"] == "refs/heads/trunk" and described["last_push"] is not None
    assert rfc_us(described["last_push"]) > 0


# =====================================================================================
# Ref update times
# =====================================================================================


def test_ref_times_when_created_moved_or_set_to_the_same_value(
    cluster: Cluster, tmp_path: Path
) -> None:
    """ "Each ref has the time it was last set (created or moved, also to the same
    value), as ListRefs of Enroute reports it.\""""
    a = cluster.a
    name = fresh("reftimes")
    g_create(a, name)
    work = Work(tmp_path / "work")
    one = work.commit()
    t0 = now_us()
    g_push(a, name, [(ZERO_OID, raw(one), b"refs/heads/main")], pack_of(work, one))
    created = g_refs(a, name)[b"refs/heads/main"][1]
    two = work.commit()
    g_push(a, name, [(raw(one), raw(two), b"refs/heads/main")], pack_of(work, two, "^" + one))
    moved = g_refs(a, name)[b"refs/heads/main"][1]
    report = g_push(a, name, [(raw(two), raw(two), b"refs/heads/main")], EMPTY_PACK)
    assert b"ok refs/heads/main" in report
    same = g_refs(a, name)[b"refs/heads/main"]
    assert t0 <= created < moved < same[1] <= now_us()
    assert same[0] == raw(two)


def test_ref_times_are_stamped_by_the_computes_clock_on_pushes_and_api_commits(
    enroute_url: str, tmp_path: Path
) -> None:
    """ "The compute stamps every commit entry that updates refs with its clock, so
    applying stays deterministic.\" Pushes and API commits alike."""
    name = fresh("reftimes")
    create(enroute_url, name)
    before = now_us()
    status, made = api_commit(enroute_url, name, "main", None, {"a": b"a"})
    after = now_us()
    assert status == 201
    oid, at = rest_refs(enroute_url, name)["refs/heads/main"]
    assert oid == made["oid"] and before <= rfc_us(at) <= after
    work = Work(tmp_path / "work")
    work.commit("side")
    before = now_us()
    work.push(f"{enroute_url}/{name}.git", "side")
    after = now_us()
    assert before <= rfc_us(rest_refs(enroute_url, name)["refs/heads/side"][1]) <= after


def test_ref_times_go_to_each_ref_the_commit_sets(enroute_url: str, tmp_path: Path) -> None:
    """ "The state machine gives that time to each ref that the commit sets\": one push
    of two refs gives both the same time; a ref it does not set keeps its own."""
    name = fresh("reftimes")
    url = f"{enroute_url}/{name}.git"
    work = Work(tmp_path / "work")
    work.commit("keep")
    work.push(url, "keep")
    kept = rest_refs(enroute_url, name)["refs/heads/keep"]
    work.commit("x")
    work.commit("y")
    work.push(url, "--atomic", "x", "y")
    refs = rest_refs(enroute_url, name)
    assert refs["refs/heads/x"][1] == refs["refs/heads/y"][1]
    assert refs["refs/heads/keep"] == kept
    assert rfc_us(refs["refs/heads/x"][1]) > rfc_us(kept[1])


def test_ref_times_are_dropped_with_the_ref(enroute_url: str, tmp_path: Path) -> None:
    """ "... and drops it with the ref.\" A deleted ref is gone from ListRefs, and set
    again it carries the new time, not the old one."""
    name = fresh("reftimes")
    url = f"{enroute_url}/{name}.git"
    work = Work(tmp_path / "work")
    tip = work.commit("gone")
    work.commit("main")
    work.push(url, "main", "gone")
    old = rest_refs(enroute_url, name)["refs/heads/gone"][1]
    work.push(url, ":gone")
    assert "refs/heads/gone" not in rest_refs(enroute_url, name)
    wait_until(lambda: now_us() > rfc_us(old), 5, "the clock moves past the first stamp")
    work.push(url, f"{tip}:refs/heads/gone")
    again = rest_refs(enroute_url, name)["refs/heads/gone"]
    assert again[0] == tip and rfc_us(again[1]) > rfc_us(old)


def test_ref_times_are_left_by_a_refused_update(enroute_url: str) -> None:
    """ "A refused update leaves it.\" A stale API commit is refused and changes nothing."""
    name = fresh("reftimes")
    create(enroute_url, name)
    first = api_commit(enroute_url, name, "main", None, {"a": b"1"})[1]
    second = api_commit(enroute_url, name, "main", first["oid"], {"a": b"2"})[1]
    before = rest_refs(enroute_url, name)
    status, error = api_commit(enroute_url, name, "main", first["oid"], {"a": b"3"})
    assert status == 409 and error["error"]["code"] == "stale_ref"
    assert rest_refs(enroute_url, name) == before
    assert before["refs/heads/main"][0] == second["oid"]


def test_ref_times_reach_followers_and_snapshots(cluster: Cluster) -> None:
    """ "The repository state keeps the time, and each ref change carries it to
    followers. ... so snapshots, checkpoints and the state object carry it\": B follows
    the change; a compute started afterwards starts from a snapshot; both report A's
    times, to the microsecond."""
    name = fresh("reftimes")
    g_create(cluster.a, name)
    assert g_refs(cluster.b, name) == {}  # B follows from the start
    g_commit(cluster.a, name, None, b"one\n")
    times = g_refs(cluster.a, name)
    wait_until(lambda: g_refs(cluster.b, name) == times, 10, "B gets the ref time")
    late = cluster.start("late")
    assert g_refs(late, name) == times


def test_ref_times_come_from_the_proposers_clock_and_can_go_back(cluster: Cluster) -> None:
    """ "Times come from the clocks of proposers, so they can go back when clocks
    differ.\" B's clock is an hour behind A's."""
    name = fresh("reftimes")
    g_create(cluster.a, name)
    first = g_commit(cluster.a, name, None, b"one\n")
    at_a = g_refs(cluster.a, name)[b"refs/heads/main"][1]
    second = g_commit(cluster.b, name, first, b"two\n")
    oid, at_b = g_refs(cluster.a, name)[b"refs/heads/main"]
    assert oid == second
    assert at_a - HOUR_US - 60_000_000 < at_b < at_a  # went back by about an hour
