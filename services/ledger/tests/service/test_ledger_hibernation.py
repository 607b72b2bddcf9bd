"""Hibernated groups in real ledger processes (docs/raft.md, "Hibernation").

Three voters host a dozen repositories, commit once to each and stay idle
past the hibernation delay (``RuntimeConfig.hibernate_after_s``, 3 s by
default): their groups give up their Raft objects and applied state. Then a
listing answers from the summaries, a read barrier and a commit wake their
groups, and after a voter is killed (SIGKILL) the other two elect in every
group it led, commit to every repository and list them all.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from enroute_core.state import OutcomeCode, decode_change
from enroute_ledger.runtime import HIBERNATE_REPLAY_MAX
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing import ledgers
from enroute_testing.waiting import wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, fast_timing, start_three  # noqa: E402
from test_ledger_idle import metrics  # noqa: E402
from test_ledger_service import MAIN, commit, create, oid  # noqa: E402

REPOS = 12
DEADLINE_S = 30.0  # beside RuntimeConfig's hibernation delay of 3 s


def name(k: int) -> str:
    return f"hib/{k:02d}"


def propose_until_ok(p: LedgerProc, repo: str, cmd: bytes, rid: bytes) -> int:
    """Propose with one request id until an answer (a retry of the same id applies once)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        req = ledger_pb2.ProposeRequest(repo=repo, incarnation=1, command=cmd, request_id=rid)
        try:
            resp = p.ledger.Propose(req, timeout=10)
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        assert decode_change(resp.effects).outcome.code is OutcomeCode.OK, repo
        return int(resp.version)


def rid(tag: str, k: int) -> bytes:
    return f"{tag}-{k:02d}".encode().ljust(16, b"-")


def listed(p: LedgerProc) -> dict[str, int]:
    resp = p.ledger.List(ledger_pb2.ListRequest(limit=1000), timeout=10)
    return {r.name: int(r.version) for r in resp.repositories}


def hibernated(nodes: list[LedgerProc]) -> bool:
    """All groups hibernated on every node (``enroute_ledger_groups_hibernated``)."""
    return all(metrics(n)["groups_hibernated"] == REPOS for n in nodes)


@pytest.mark.slow
def test_hibernated_groups_list_read_commit_and_survive_a_leader_kill(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes = start_three(tmp_path, procs)
    with ThreadPoolExecutor(6) as ex:
        incs = list(ex.map(lambda k: create(nodes[k % 3], name(k)).state.incarnation, range(REPOS)))
    assert incs == [1] * REPOS
    versions = {}
    for k in range(REPOS):
        versions[name(k)] = propose_until_ok(
            nodes[k % 3], name(k), commit(1, MAIN, None, oid(1)), rid("first", k)
        )

    wait_until(lambda: hibernated(nodes), DEADLINE_S, "every group hibernated", poll_s=0.2)

    # a listing answers from what hibernated groups keep
    for n in nodes:
        assert listed(n) == versions

    # a read barrier and a commit wake their groups
    b = nodes[2].ledger.Barrier(ledger_pb2.BarrierRequest(repo=name(0)), timeout=10)
    assert (b.incarnation, b.version, b.deleted) == (1, versions[name(0)], False)
    versions[name(1)] = propose_until_ok(
        nodes[1], name(1), commit(1, MAIN, oid(1), oid(2)), rid("second", 1)
    )
    last = {name(k): oid(1) for k in range(REPOS)}
    last[name(1)] = oid(2)

    # voter 1 dies: the groups it led wake on the others and elect; every repository
    # takes a commit through voter 2, and voter 3 lists and reads them all
    nodes[0].kill()
    for k in range(REPOS):
        repo = name(k)
        cmd = commit(1, MAIN, last[repo], oid(9))
        versions[repo] = propose_until_ok(nodes[1], repo, cmd, rid("after-kill", k))
    wait_until(
        lambda: listed(nodes[2]) == versions,
        DEADLINE_S,
        "voter 3 lists every commit",
        poll_s=0.1,
        explain=lambda: listed(nodes[2]),
    )
    for k in range(REPOS):
        b = nodes[2].ledger.Barrier(ledger_pb2.BarrierRequest(repo=name(k)), timeout=10)
        assert b.version == versions[name(k)]


def test_a_group_with_a_long_log_hibernates_on_its_followers_too(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """A group with more entries past its compaction point than a wake replays
    (``runtime.HIBERNATE_REPLAY_MAX``) waits for a checkpoint to hibernate. Only the
    leader writes the checkpoint, and a follower used to compact a live group's log
    never: the group slept on its leader and stayed awake on both followers for good
    (issue 19, a 10,000-repository fleet: 31 groups awake on each follower). A
    follower now compacts to its applied state once the object holds it."""
    nodes = commit_then_sleep(tmp_path, procs, "1s", "long", HIBERNATE_REPLAY_MAX + 6)
    # each voter compacted its own copy (the followers read the leader's checkpoint)
    assert all(metrics(n)["log_compactions_total"] >= 1 for n in nodes)


def commit_then_sleep(
    tmp_path: Path, procs: list[LedgerProc], interval: str, repo: str, commits: int
) -> list[LedgerProc]:
    """Three voters checkpointing every ``interval``: ``commits`` to one repository, then
    until its group hibernated on every voter."""
    timing = fast_timing()
    timing |= {"checkpoint_interval": interval, "hibernate_after": "0.3s"}
    nodes = ledgers.start_three(tmp_path, procs, ledger=timing)
    create(nodes[0], repo)
    last = None
    for k in range(commits):
        propose_until_ok(nodes[0], repo, commit(1, MAIN, last, oid(k + 1)), rid(repo, k))
        last = oid(k + 1)
    wait_until(
        lambda: all(metrics(n)["groups_hibernated"] == 1 for n in nodes),
        DEADLINE_S,
        f"{repo}'s group hibernated on every voter",
        poll_s=0.2,
        explain=lambda: [
            (metrics(n)["groups_hibernated"], metrics(n)["log_compactions_total"]) for n in nodes
        ],
    )
    return nodes


def test_a_quiet_group_is_settled_on_every_voter_before_it_sleeps(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    """A repository pushed once and then left alone sleeps on every voter with its
    state object holding its change and every copy of its log compacted, long before
    the interval rule (checkpoints.py, "Quiet groups"). Before, each voter woke the
    group an interval later to checkpoint or to look (issue 19: 94 groups awake per
    voter and about 10% of a core each in an idle 10,000-repository fleet)."""
    nodes = commit_then_sleep(tmp_path, procs, "300s", "quiet", 3)
    # settled: each voter compacted its copy, the leader after its checkpoint and the
    # followers once the object held it, and nothing is left for the interval rule
    assert all(metrics(n)["log_compactions_total"] >= 1 for n in nodes)
