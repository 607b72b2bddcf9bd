"""The runtime's side of a wiped voter (docs/raft.md, "A voter that lost its disk").

Three in-process runtimes. Voter 2 loses its log directory and comes back with a
blank id and the repositories that existed: it joins their groups blank, keeps
the blank mark across restarts and snapshot installs, is readmitted by the
others, and then drops the mark; a group of a repository it created itself is
never blank.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from memnet import MAIN, WAIT_S, MemNet, genesis, start, stop, until

from enroute_core.base.ids import ObjectId
from enroute_core.state import Commit, RefUpdate, encode_command
from enroute_ledger import calls
from enroute_ledger.machine import command_entry
from enroute_ledger.runtime import Group, Runtime
from enroute_ledger.runtime import store_gid as sgid

BLANK = 0x5EED


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


async def commit(rt: Runtime, g: Group, n: int) -> None:
    have = None if n == 1 else oid(n - 1)
    cmd = encode_command(Commit(1, (RefUpdate(MAIN, have, oid(n)),), None, n, False))
    rid = rt.client.request_id()
    await calls.propose(rt, g, command_entry(rid, cmd), rid, WAIT_S)


def test_a_wiped_voter_joins_blank_stays_blank_until_readmitted_then_counts(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        net = MemNet()
        nodes = [await start(tmp_path / f"log{i}", net, i) for i in (1, 2, 3)]
        try:
            first = nodes[0].rt
            g1 = await genesis([n.rt for n in nodes])
            for n in range(1, 6):
                await commit(first, g1, n)

            # voter 2 loses its disk; while it is cut off it joins blank and stays blank
            await stop(nodes[1])
            shutil.rmtree(tmp_path / "log2")
            net.cut.add(2)
            nodes[1] = await start(tmp_path / "log2", net, 2, blank_id=BLANK, blank_repos=["r"])
            rt2 = nodes[1].rt
            g2 = await rt2.founder.host("r", 1)
            assert rt2.blank_of(g2) == BLANK and rt2.blank_groups == 1
            assert nodes[1].store.state_get(sgid(g2.gid), b"blank") == BLANK.to_bytes(8, "big")
            await stop(nodes[1])  # the mark is on disk: a restart is blank again
            nodes[1] = await start(tmp_path / "log2", net, 2, blank_id=BLANK, blank_repos=["r"])
            rt2 = nodes[1].rt
            g2 = rt2.by_repo["r"]
            assert rt2.blank_of(g2) == BLANK

            # back on the network: caught up and readmitted by voters 1 and 3
            net.cut.clear()
            await until(lambda: rt2.blank_readmitted == 1)
            assert rt2.blank_of(g2) == 0 and rt2.blank_groups == 0
            await until(lambda: nodes[1].store.state_get(sgid(g2.gid), b"blank") is None)
            assert g2.state.refs[MAIN].oid == oid(5)

            # it counts again: with voter 3 cut off, voters 1 and 2 commit
            net.cut.add(3)
            await commit(first, g1, 6)
            await until(lambda: g2.state.refs[MAIN].oid == oid(6))

            # a repository it creates itself after the wipe is never blank
            g_new = await rt2.founder.host("fresh", 1, campaign=True)
            assert rt2.blank_of(g_new) == 0
        finally:
            for n in nodes:
                if not n.task.done():
                    await stop(n)

    asyncio.run(main())
