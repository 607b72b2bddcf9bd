"""One request id per logical write, kept across retries and replays (docs/rpc.md, "Request ids").

gitproto replays a push to another compute when the first died before answering;
the compute's ledger client resends a Propose to the next member when one did not
answer. Each copy carries the same id, so the ledger's answer is the first
apply's, and git hears ``ok`` for a push that was applied, not ``stale ref``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_compute.commits import BuiltCommit, CommitRequest, FileChange, Signature
from enroute_compute.host import RepositoryHost
from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.ledger_port import CreateMode, Proposed
from enroute_compute.main import SystemClock
from enroute_compute.push import Pusher
from enroute_core.base.errors import StaleRef, Unavailable
from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_core.state import Change, Commit, Outcome, OutcomeCode, RefUpdate, encode_change
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import open_store
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_proto.request_id import (
    derive_request_id,
    find_request_id,
    new_request_id,
    request_id_metadata,
)
from enroute_testing.local_ledger import LocalLedger
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects
from enroute_testing.waiting import until

# -- the metadata form ------------------------------------------------------------------


def test_request_id_metadata_round_trip_and_malformed_values_are_ignored() -> None:
    rid = new_request_id()
    assert len(rid) == 16 and rid != new_request_id()
    assert find_request_id(request_id_metadata(rid)) == rid
    assert find_request_id([("other", "x"), *request_id_metadata(rid)]) == rid
    assert find_request_id(None) is None
    for bad in ("", "zz" * 16, "ab" * 15, "ab" * 17):
        assert find_request_id([("enroute-request-id", bad)]) is None
    assert find_request_id([("enroute-request-id", b"\x00" * 32)]) is None
    with pytest.raises(ValueError):
        request_id_metadata(b"short")
    assert derive_request_id(rid, b"push") == derive_request_id(rid, b"push")
    assert derive_request_id(rid, b"push") != derive_request_id(rid, b"commit")
    assert len(derive_request_id(rid, b"push")) == 16


# -- the ledger client keeps the id across members --------------------------------------


class _Failing(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")


class _Stub:
    """A member's unary Propose (the stream's attempts: test_ledger_propose_stream.py)."""

    def __init__(self, fail: grpc.StatusCode | None, seen: list[tuple[bytes, float]]) -> None:
        self.fail = fail
        self.seen = seen

    async def Propose(  # noqa: N802
        self, req: ledger_pb2.ProposeRequest, timeout: float, metadata: Any = ()
    ) -> Any:
        self.seen.append((req.request_id, timeout))
        if self.fail is not None:
            raise _Failing(self.fail)
        ok = encode_change(Change(Outcome(OutcomeCode.OK)))
        return ledger_pb2.ProposeResponse(version=7, effects=ok)


@pytest.mark.parametrize(
    "fail", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED], ids=str
)
def test_propose_goes_to_the_next_member_under_the_same_id(fail: grpc.StatusCode) -> None:
    async def run() -> tuple[Proposed, list[tuple[bytes, float]]]:
        ledger = GrpcLedger(
            ("127.0.0.1:1", "127.0.0.1:2"), attempt_timeout_s=0.5, stream_proposals=False
        )
        seen: list[tuple[bytes, float]] = []
        ledger._stubs = [_Stub(fail, seen), _Stub(None, seen)]  # type: ignore[list-item]
        try:
            cmd = Commit(1, (RefUpdate(b"refs/heads/main", None, None),), None, 1, True)
            return await ledger.propose("r", 1, cmd), seen
        finally:
            await ledger.close()

    got, seen = asyncio.run(run())
    assert got.version == 7
    assert len(seen) == 2 and seen[0][0] == seen[1][0] and len(seen[0][0]) == 16


class _Hung(_Stub):
    async def Propose(  # noqa: N802
        self, req: ledger_pb2.ProposeRequest, timeout: float, metadata: Any = ()
    ) -> Any:
        self.seen.append((req.request_id, timeout))
        await asyncio.sleep(self.delay_s)
        ok = encode_change(Change(Outcome(OutcomeCode.OK)))
        return ledger_pb2.ProposeResponse(version=9, effects=ok)

    delay_s = 3600.0


@pytest.mark.parametrize("delay_s", [3600.0, 0.3], ids=["hung", "slow"])
def test_a_member_that_does_not_answer_gets_a_copy_sent_to_the_next(delay_s: float) -> None:
    """A hung member (SIGSTOP) costs one attempt deadline; a slow one may still win."""

    async def run() -> tuple[Proposed, list[tuple[bytes, float]], float]:
        ledger = GrpcLedger(
            ("a:1", "b:1"), timeout_s=5.0, attempt_timeout_s=0.2, stream_proposals=False
        )
        seen: list[tuple[bytes, float]] = []
        first = _Hung(None, seen)
        first.delay_s = delay_s
        second = _Hung(None, seen) if delay_s < 1 else _Stub(None, seen)
        ledger._stubs = [first, second]  # type: ignore[list-item]
        began = time.monotonic()
        try:
            got = await ledger.propose("r", 1, Commit(1, (), None, 1, True))
            return got, seen, time.monotonic() - began
        finally:
            await ledger.close()

    got, seen, took_s = asyncio.run(run())
    assert len(seen) == 2 and seen[0][0] == seen[1][0]
    assert seen[0][1] > 1.0  # the first copy keeps the call's deadline, not the attempt's
    if delay_s > 1:
        assert got.version == 7 and 0.2 <= took_s < 1.0
    else:
        assert got.version == 9 and took_s < 0.45  # the first copy answered first


def test_propose_gives_up_when_every_member_fails_and_other_errors_are_answers() -> None:
    async def run(fail: grpc.StatusCode) -> list[tuple[bytes, float]]:
        ledger = GrpcLedger(
            ("a:1", "b:1"), timeout_s=5.0, attempt_timeout_s=0.5, stream_proposals=False
        )
        seen: list[tuple[bytes, float]] = []
        ledger._stubs = [_Stub(fail, seen), _Stub(fail, seen)]  # type: ignore[list-item]
        rid = secrets.token_bytes(16)
        try:
            cmd = Commit(1, (), None, 1, True)
            await ledger.propose("r", 1, cmd, rid)
        except Exception as exc:
            seen.append((type(exc).__name__.encode(), 0.0))
        finally:
            await ledger.close()
        assert all(r == rid for r, _ in seen[:-1])
        return seen

    down = asyncio.run(run(grpc.StatusCode.UNAVAILABLE))
    assert len(down) == 2 * 3 + 1 and down[-1][0] == Unavailable.__name__.encode()
    refused = asyncio.run(run(grpc.StatusCode.INVALID_ARGUMENT))
    assert len(refused) == 2  # not retried


# -- a push replayed on another compute ---------------------------------------------------


def _request(refs: dict[bytes, bytes], pack: bytes) -> bytes:
    lines = []
    for i, (ref, oid) in enumerate(sorted(refs.items())):
        line = b"0" * 40 + b" " + oid + b" " + ref
        if i == 0:
            line += b"\x00report-status ofs-delta"
        lines.append(pkt_line(line + b"\n"))
    return b"".join(lines) + FLUSH_PKT + pack


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[bytes, bytes], bytes]:
    spec = RepoSpec(seed=3, commits=6, files=5, annotated_tags=0, lightweight_tags=0)
    made = generate_repo(tmp_path_factory.mktemp("src") / "r.git", spec)
    refs = {r: o for r, o in made.refs.items() if r.startswith(b"refs/heads/")}
    return refs, pack_objects(made.path)


def _replay(
    tmp: Path,
    body: bytes,
    first_id: bytes,
    replay_id: bytes,
    forget_details: bool = False,
) -> tuple[bytes, bytes]:
    """Push ``body`` through one compute, then again through a second one (its own
    layer directory, the same store and ledger) as gitproto's failover does."""

    async def run() -> tuple[bytes, bytes]:
        ledger = LocalLedger()
        store = f"file://{tmp / 'store'}"
        out: list[bytes] = []
        for n, rid in enumerate((first_id, replay_id)):
            if n and forget_details:  # as the ledger after a restart: the outcome only
                for key, got in ledger.done.items():
                    ledger.done[key] = Proposed(got.version, Change(got.change.outcome))
            layers = LayerService(open_store(store), tmp / f"compute{n}")
            host = RepositoryHost(ledger, layers, SystemClock(), inline_max_bytes=1)
            try:
                parts = Pusher(host).receive_pack("r", _chunks(body), rid)
                out.append(b"".join([p async for p in parts]))
            finally:
                await host.close()
                await layers.close()
        return out[0], out[1]

    return asyncio.run(run())


@pytest.mark.interop
@pytest.mark.parametrize("forget_details", [False, True], ids=["logged", "outcome-only"])
def test_a_replayed_push_under_its_id_is_reported_ok(
    tmp_path: Path, pushed: tuple[dict[bytes, bytes], bytes], forget_details: bool
) -> None:
    refs, pack = pushed
    rid = new_request_id()
    first, replay = _replay(tmp_path, _request(refs, pack), rid, rid, forget_details)
    assert first.count(b"ok refs/heads/") == len(refs) and b"ng " not in first
    # the stored layer was published again under its content-addressed key: accepted
    assert replay == first


@pytest.mark.interop
def test_the_same_push_under_another_id_is_a_new_write(
    tmp_path: Path, pushed: tuple[dict[bytes, bytes], bytes]
) -> None:
    refs, pack = pushed
    first, replay = _replay(tmp_path, _request(refs, pack), new_request_id(), b"")
    assert b"ng " not in first
    assert replay.count(b"stale ref") == len(refs)  # what git was told before ids


# -- an API commit replayed on another compute --------------------------------------------


def _api_replay(tmp: Path, second: CommitRequest, first_id: bytes, replay_id: bytes) -> Any:
    """Commit ``FIRST`` through one compute, then ``second`` through another (the same
    ledger and store): the answer of the second, or the error it raised."""

    async def run() -> Any:
        ledger = LocalLedger()
        await ledger.activate("r", CreateMode.EXPLICIT, b"refs/heads/main")
        store = f"file://{tmp / 'store'}"
        got: list[Any] = []
        for n, (req, rid) in enumerate(((FIRST, first_id), (second, replay_id))):
            layers = LayerService(open_store(store), tmp / f"compute{n}")
            host = RepositoryHost(ledger, layers, SystemClock(), inline_max_bytes=1)
            try:
                got.append(await Pusher(host).create_commit(req, rid))
            except StaleRef as exc:
                got.append(exc)
            finally:
                await host.close()
                await layers.close()
        assert isinstance(got[0], BuiltCommit)
        return got[0], got[1]

    return asyncio.run(run())


_WHEN_US = 1_700_000_000_000_000
_WHO = Signature(b"A U Thor", b"author@example.com", time_us=_WHEN_US)
FIRST = CommitRequest("r", b"main", None, b"api\n", _WHO, None, (FileChange(b"a.txt", b"hello\n"),))


def test_a_replayed_api_commit_answers_the_commit_the_first_applied(tmp_path: Path) -> None:
    rid = new_request_id()
    first, replay = _api_replay(tmp_path / "same", FIRST, rid, rid)
    assert isinstance(replay, BuiltCommit) and replay.oid == first.oid
    # another request (another time) under the same id is no replay: stale, as before
    other = replace(FIRST, author=replace(_WHO, time_us=_WHEN_US + 10**6))
    _, refused = _api_replay(tmp_path / "other", other, rid, rid)
    assert isinstance(refused, StaleRef)
    # the same request without an id: stale, as before
    _, bare = _api_replay(tmp_path / "bare", FIRST, rid, b"")
    assert isinstance(bare, StaleRef)


# -- a silent member's subscriptions are ended ------------------------------------------


class _SilentCall:
    """A Subscribe call on a paused member: nothing comes; cancel() ends it as gRPC does."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        await self.ended.wait()
        raise asyncio.CancelledError  # grpc.aio: a locally cancelled call
        yield  # an async generator

    def cancel(self) -> None:
        self.ended.set()


class _SilentFollow(_SilentCall):
    """A Follow call on a paused member: it takes every Follow and sends nothing."""

    async def write(self, req: Any) -> None:
        pass

    async def done_writing(self) -> None:
        pass


class _Member:
    def __init__(self, silent: bool) -> None:
        self.silent = silent
        self.calls: list[_SilentCall] = []

    def Subscribe(self, req: Any) -> _SilentCall:  # noqa: N802
        self.calls.append(_SilentCall())
        return self.calls[-1]

    def Follow(self) -> _SilentCall:  # noqa: N802
        self.calls.append(_SilentFollow())
        return self.calls[-1]

    async def Barrier(self, req: Any, timeout: float) -> Any:  # noqa: N802
        if self.silent:
            await asyncio.sleep(3600)
        return ledger_pb2.BarrierResponse(incarnation=1, version=3)


@pytest.mark.parametrize("follow_streams", [True, False], ids=["Follow", "Subscribe"])
def test_subscriptions_on_a_member_that_went_silent_end_unavailable(
    follow_streams: bool,
) -> None:
    async def run() -> tuple[BaseException | None, int]:
        ledger = GrpcLedger(
            ("a:1", "b:1"), timeout_s=5.0, attempt_timeout_s=0.1, follow_streams=follow_streams
        )
        paused, alive = _Member(silent=True), _Member(silent=False)
        ledger._stubs = [paused, alive]  # type: ignore[list-item]

        async def follow() -> None:
            async for _ in ledger.subscribe("r", 1, 0):
                pass

        follower = asyncio.ensure_future(follow())
        await until(lambda: paused.calls, 5.0, "the follower asks the paused member")
        assert len(paused.calls) == 1 and not follower.done()
        point = await ledger.barrier("r")  # the paused member does not answer: b does
        await asyncio.wait([follower], timeout=2.0)
        try:
            return follower.exception() if follower.done() else None, point.version
        finally:
            follower.cancel()
            await ledger.close()

    ended, version = asyncio.run(run())
    assert version == 3
    assert isinstance(ended, Unavailable)  # the follower subscribes again, elsewhere
