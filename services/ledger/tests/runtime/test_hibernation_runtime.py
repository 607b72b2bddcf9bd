"""The runtime's side of hibernation (docs/raft.md, "Hibernation").

Three in-process runtimes that hibernate groups after a few quiet ticks. A
hibernated group answers views and listings without waking; a proposal, a
read barrier, a message or a restarted peer wakes it from the log store, with
its state rebuilt (checkpoint plus the entries after it) and its id window
intact, so nothing is applied twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from memnet import WAIT_S, MemNet, Node, genesis, start, stop, until
from test_blank_runtime import MAIN, commit, oid

from enroute_core.state import (
    Commit,
    OutcomeCode,
    RefUpdate,
    encode_command,
)
from enroute_ledger import calls
from enroute_ledger.machine import command_entry
from enroute_ledger.runtime import HIBERNATE_REPLAY_BYTES_MAX, Group, Runtime


def asleep(nodes: list[Node], repo: str) -> bool:
    return all(n.rt.by_repo[repo].hibernated for n in nodes)


def test_hibernated_groups_wake_for_proposals_reads_messages_and_restarts(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        net = MemNet()
        nodes = [
            await start(tmp_path / f"log{i}", net, i, hibernate_after_s=0.1) for i in (1, 2, 3)
        ]
        try:
            first = nodes[0].rt
            g1 = await genesis([n.rt for n in nodes])
            for k in range(1, 4):
                await commit(first, g1, k)
            version = g1.state.version
            await until(lambda: asleep(nodes, "r"))
            assert all(n.rt.mr.hibernated_count() == 1 for n in nodes)

            # views and listings answer without waking
            wakes = [n.rt.wakes for n in nodes]
            for n in nodes:
                g = n.rt.by_repo["r"]
                assert g.version == version and not g.deleted
                listed = g.listing()
                assert (listed.version, listed.head, listed.incarnation) == (version, MAIN, 1)
                n.rt.is_leader(g)
                n.rt.leader_of(g)
                n.rt.apply_lag_entries()
            assert sum(n.rt.is_leader(n.rt.by_repo["r"]) for n in nodes) == 1
            assert [n.rt.wakes for n in nodes] == wakes

            # a proposal on a follower wakes the group everywhere; the state was
            # rebuilt from the log (genesis and three commits replayed)
            follower = next(n.rt for n in nodes if not n.rt.is_leader(n.rt.by_repo["r"]))
            gf = follower.by_repo["r"]
            await commit(follower, gf, 4)
            assert gf.state.refs[MAIN].oid == oid(4) and gf.state.version == version + 1
            for n in nodes:
                await until(lambda n=n: n.rt.by_repo["r"].applied == gf.applied)
                assert n.rt.by_repo["r"].state.refs[MAIN].oid == oid(4)
            await until(lambda: asleep(nodes, "r"))

            # a read barrier on a hibernated group
            g3 = nodes[2].rt.by_repo["r"]
            await calls.barrier(nodes[2].rt, g3, WAIT_S)
            assert g3.state.version == version + 1
            await until(lambda: asleep(nodes, "r"))

            # a compaction, then hibernation: the wake reads the snapshot payload, and
            # the id window in it still makes a copy of an applied entry a no-op
            gl = next(n.rt.by_repo["r"] for n in nodes if n.rt.is_leader(n.rt.by_repo["r"]))
            rtl = next(n.rt for n in nodes if n.rt.by_repo["r"] is gl)
            cmd = encode_command(Commit(1, (RefUpdate(MAIN, oid(4), oid(5)),), None, 5, False))
            rid5 = rtl.client.request_id()
            first_apply = await calls.propose(rtl, gl, command_entry(rid5, cmd), rid5, WAIT_S)
            rtl.compact(gl, gl.state, gl.applied)
            await until(lambda: rtl.compactions == 1)
            await until(lambda: asleep(nodes, "r"))
            skipped = rtl.duplicates_skipped
            again = await calls.propose(rtl, gl, command_entry(rid5, cmd), rid5, WAIT_S)
            assert again.version == first_apply.version, "applied once"
            assert gl.state.refs[MAIN].oid == oid(5)
            assert rtl.duplicates_skipped >= skipped
            await until(lambda: asleep(nodes, "r"))

            # a restarted peer's messages wake the others; it commits with them
            await stop(nodes[1])
            nodes[1] = await start(tmp_path / "log2", net, 2, hibernate_after_s=0.1)
            g2 = nodes[1].rt.by_repo["r"]
            await commit_next(nodes[1].rt, g2, 6)
            for n in nodes:
                await until(lambda n=n: n.rt.by_repo["r"].applied == g2.applied)
                assert n.rt.by_repo["r"].state.refs[MAIN].oid == oid(6)
            await until(lambda: asleep(nodes, "r"))

            # dropping a hibernated group does not wake it
            wakes = [n.rt.wakes for n in nodes]
            nodes[0].rt.drop(nodes[0].rt.by_repo["r"])
            await until(lambda: not nodes[0].rt.mr.group_count())
            assert nodes[0].rt.wakes == wakes[0]
        finally:
            for n in nodes:
                if not n.task.done():
                    await stop(n)

    asyncio.run(main())


async def commit_next(rt: Runtime, g: Group, n: int) -> None:
    cmd = encode_command(Commit(1, (RefUpdate(MAIN, oid(n - 1), oid(n)),), None, n, False))
    rid = rt.client.request_id()
    got = await calls.propose(rt, g, command_entry(rid, cmd), rid, WAIT_S)
    assert got.outcome.code is OutcomeCode.OK, got.outcome


def test_a_group_whose_log_since_its_snapshot_is_large_stays_awake_until_compacted(
    tmp_path: Path,
) -> None:
    """A wake applies every entry after the snapshot again, on the loop: past
    ``HIBERNATE_REPLAY_BYTES_MAX`` of them (here one push of 30,000 new refs, 1.2 MB) the
    group stays awake, and sleeps once a checkpoint compacts its log (issue "Bounded
    work", refs at scale: wakes that replayed 170,000 refs outlasted a Propose)."""

    async def main() -> None:
        net = MemNet()
        nodes = [
            await start(tmp_path / f"log{i}", net, i, hibernate_after_s=0.1) for i in (1, 2, 3)
        ]
        try:
            first = nodes[0].rt
            g = await genesis([n.rt for n in nodes])
            updates = tuple(
                RefUpdate(b"refs/tags/t%06d" % k, None, oid(k + 1)) for k in range(30_000)
            )
            entry = encode_command(Commit(1, updates, None, 1, True))
            assert len(entry) > HIBERNATE_REPLAY_BYTES_MAX
            rid = first.client.request_id()
            got = await calls.propose(first, g, command_entry(rid, entry), rid, WAIT_S)
            assert got.outcome.code is OutcomeCode.OK, got.outcome
            for n in nodes:
                await until(lambda n=n: n.rt.by_repo["r"].applied == g.applied)
            await asyncio.sleep(1.0)  # ten times the hibernation delay
            assert not any(n.rt.by_repo["r"].hibernated for n in nodes)
            for n in nodes:
                gn = n.rt.by_repo["r"]
                n.rt.compact(gn, gn.state, gn.applied)
            await until(lambda: asleep(nodes, "r"))
            assert len(g.state.refs) == 30_000, "woken again from the compacted log"
        finally:
            for n in nodes:
                if not n.task.done():
                    await stop(n)

    asyncio.run(main())
