"""ProposeStream on three real voters (docs/rpc.md, ProposeStream; issue 21, item 4).

Many repositories' proposals share one bidirectional call per member. Each must be
handled as the unary Propose handles it: applied once (request id window, docs/raft.md
"Applying each id once"), answered with the same version and effects or the same typed
error, forwarded by a member that does not lead the group. A stream broken under its
proposals leaves each one applied and answered, or failed UNAVAILABLE (outcome
unknown) so that the caller's retry under the same id gets the first apply's answer,
as a unary call cut by a dead connection does.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

from enroute_compute.ledger_client import GrpcLedger, ProposalStream
from enroute_compute.ledger_port import Proposed
from enroute_compute.rpc.errors import error_from_rpc
from enroute_core.base.errors import IncarnationEnded, NotFound, Timeout, Unavailable
from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Commit,
    OutcomeCode,
    RefUpdate,
    decode_change,
    decode_state,
    encode_command,
)
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from enroute_testing.ledgers import start_three
from enroute_testing.waiting import until, wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, error_code  # noqa: E402
from test_ledger_cluster import leader_of  # noqa: E402
from test_ledger_service import create  # noqa: E402

FAST = {"tick_interval": "20ms", "election_ticks": 10}
REPOS = 30
COMMITS_PER_REPO = 4
T = 20.0


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def new_ref(repo: int, i: int) -> tuple[bytes, Commit]:
    """A Commit creating one ref of its own: applied twice, the second would be a
    refused compare-and-swap and an extra version."""
    ref = b"refs/heads/s%03d-%03d" % (repo, i)
    return ref, Commit(1, (RefUpdate(ref, None, oid(repo * 1000 + i + 1)),), None, 1, False)


def unary(repo: str, incarnation: int) -> ledger_pb2.ProposeRequest:
    cmd = encode_command(Commit(incarnation, (), None, 1, True))
    return ledger_pb2.ProposeRequest(repo=repo, incarnation=incarnation, command=cmd)


def refs_and_version(p: LedgerProc, repo: str) -> tuple[set[bytes], int]:
    """The state after a barrier on ``p``: its ref names and version."""
    p.ledger.Barrier(ledger_pb2.BarrierRequest(repo=repo), timeout=T)
    call = p.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo=repo), timeout=T)
    data = b""
    try:
        for ev in call:
            if ev.HasField("snapshot"):
                data += ev.snapshot.data
                if ev.snapshot.last:
                    break
    finally:
        call.cancel()
    st = decode_state(data)
    return set(st.refs) - {b"refs/heads/main"}, st.version


def metric(p: LedgerProc, name: str) -> float:
    with urllib.request.urlopen(f"http://{p.http_addr}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def three(tmp_path: Path, procs: list[LedgerProc]) -> tuple[list[LedgerProc], list[str]]:
    nodes = start_three(tmp_path, procs, ledger=FAST)
    repos = [f"s/{i:03d}" for i in range(REPOS)]
    for r in repos:
        assert create(nodes[0], r).state.incarnation == 1
    wait_until(lambda: all(leader_of(nodes[0], r) for r in repos), 30, "a leader of every group")
    return nodes, repos


def test_streamed_proposals_for_many_groups_apply_once_and_answer_as_unary(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes, repos = three(tmp_path, procs)
    # the client's first member answers: it leads only some groups and forwards the rest
    led_elsewhere = [r for r in repos if leader_of(nodes[0], r) != 1]
    assert led_elsewhere, "member 1 leads every group: nothing is forwarded"
    m0 = metric(nodes[0], "enroute_ledger_streamed_outcomes_total")

    async def run() -> tuple[list[Proposed | BaseException], object, object, Proposed]:
        ledger = GrpcLedger(tuple(n.grpc_addr for n in nodes), timeout_s=T)
        try:
            work = [
                ledger.propose(r, 1, new_ref(k, i)[1])
                for i in range(COMMITS_PER_REPO)
                for k, r in enumerate(repos)
            ]
            answers = await asyncio.gather(*work, return_exceptions=True)
            # errors come back typed, as the unary call's: a missing repository, a
            # later incarnation than the live one
            missing = await asyncio.gather(
                ledger.propose("s/none", 1, Commit(1, (), None, 1, True)), return_exceptions=True
            )
            wrong = await asyncio.gather(
                ledger.propose(repos[0], 2, Commit(2, (), None, 1, True)), return_exceptions=True
            )
            # a CAS on a moved ref is an answer with a refusal, not an error
            stale = await ledger.propose(
                repos[0], 1, Commit(1, (RefUpdate(new_ref(0, 0)[0], None, oid(9)),), None, 1, True)
            )
            return answers, missing[0], wrong[0], stale
        finally:
            await ledger.close()

    answers, missing, wrong, stale = asyncio.run(run())
    failed = [a for a in answers if isinstance(a, BaseException)]
    assert not failed, failed[:3]
    assert all(isinstance(a, Proposed) and a.change.outcome.code is OutcomeCode.OK for a in answers)
    assert isinstance(missing, NotFound), missing
    assert isinstance(wrong, IncarnationEnded), wrong
    assert stale.change.outcome.code is not OutcomeCode.OK
    # the unary call refuses the same requests with the same codes
    for req, code in ((unary("s/none", 1), missing.code), (unary(repos[0], 2), wrong.code)):
        with pytest.raises(grpc.RpcError) as ei:
            nodes[0].ledger.Propose(req, timeout=T)
        assert error_code(ei.value) == code
    # each proposal applied once: one version and one ref per commit, on every voter
    for k, r in enumerate(repos):
        want = {new_ref(k, i)[0] for i in range(COMMITS_PER_REPO)}
        extra = 1 if k == 0 else 0  # the refused CAS is an entry too
        for n in nodes:
            refs, version = refs_and_version(n, r)
            assert refs == want, (r, n.grpc_addr)
            assert version == 1 + COMMITS_PER_REPO + extra, (r, version)
    # they went on the stream, many outcomes per message
    outcomes = metric(nodes[0], "enroute_ledger_streamed_outcomes_total") - m0
    assert outcomes >= REPOS * COMMITS_PER_REPO
    messages = metric(nodes[0], "enroute_ledger_streamed_outcome_messages_total")
    assert messages < outcomes, (messages, outcomes)


def test_a_stream_broken_under_its_proposals_leaves_each_applied_or_unknown(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes, repos = three(tmp_path, procs)
    victim = nodes[2]
    rids = {
        (k, i): secrets.token_bytes(16) for k in range(REPOS) for i in range(COMMITS_PER_REPO * 5)
    }

    def req(k: int, i: int) -> ledger_pb2.ProposeRequest:
        return ledger_pb2.ProposeRequest(
            repo=repos[k],
            incarnation=1,
            command=encode_command(new_ref(k, i)[1]),
            request_id=rids[k, i],
        )

    async def run() -> dict[tuple[int, int], object]:
        channel = grpc.aio.insecure_channel(victim.grpc_addr)
        stream = ProposalStream(ledger_pb2_grpc.LedgerStub(channel), victim.grpc_addr)
        got: dict[tuple[int, int], object] = {}

        async def one(k: int, i: int) -> None:
            try:
                got[k, i] = await stream.propose(req(k, i), T)
            except grpc.RpcError as exc:
                got[k, i] = error_from_rpc(exc)

        tasks = [asyncio.ensure_future(one(k, i)) for k, i in rids]
        # some answered, most still open on the stream
        await until(lambda: len(got) >= 20, T, "20 streamed proposals answered", poll_s=0.005)
        victim.kill()  # SIGKILL: the stream breaks with proposals at every stage
        await asyncio.wait_for(asyncio.gather(*tasks), T)
        await channel.close()
        return got

    got = asyncio.run(run())
    applied = {key for key, a in got.items() if isinstance(a, ledger_pb2.ProposeResponse)}
    unknown = {key for key, a in got.items() if isinstance(a, Unavailable | Timeout)}
    assert applied and unknown, (len(applied), len(unknown))
    assert applied | unknown == set(rids), {k: got[k] for k in set(rids) - applied - unknown}
    for key in applied:
        assert decode_change(got[key].effects).outcome.code is OutcomeCode.OK  # type: ignore[attr-defined]
    # the caller's retry under the same id, on a survivor, answers each unknown one: the
    # first apply's answer when a copy was applied, else this apply's; never a refusal
    survivor = nodes[0]
    for key in sorted(unknown):
        resp = survivor.ledger.Propose(req(*key), timeout=T)
        assert decode_change(resp.effects).outcome.code is OutcomeCode.OK, key
    # and nothing applied twice: one version and one ref per proposal
    per_repo = COMMITS_PER_REPO * 5
    for k, r in enumerate(repos):
        refs, version = refs_and_version(survivor, r)
        assert refs == {new_ref(k, i)[0] for i in range(per_repo)}, r
        assert version == 1 + per_repo, (r, version)
