"""Members survive compaction (docs/raft.md, "Membership changes").

A compaction snapshot must carry the members as of its index: the conf change
entries it replaces are gone from the log, and a restarted node (or a follower
sent the snapshot) takes its members from the snapshot alone.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from memnet import WAIT_S, until

from enroute_core.base.ids import NodeId
from enroute_ledger.raft.types import ConfChange, ConfChangeType

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from test_dedup_window import create, node, run_commits  # noqa: E402


def test_a_compaction_snapshot_keeps_the_members_a_conf_change_made(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "log"
        async with node(path) as n:
            rt = n.rt
            g = await create(rt)
            # a learner: node 2 does not exist here, and a voter would stop the commits
            rt.mr.propose_conf_change(g.gid, ConfChange(ConfChangeType.ADD_LEARNER, NodeId(2)))
            rt.wake()
            await until(lambda: NodeId(2) in rt.mr.raw_node(g.gid).raft.tracker.learners)
            await run_commits(rt, g, 1, 3)
            rt.compact(g, g.state, g.applied)
            await until(lambda: rt.compactions == 1)
            snap = g.mem.snapshot().metadata
            assert snap.index == g.applied and snap.conf_state.learners == {NodeId(2)}
        async with node(path) as n:  # the conf change entry is compacted away
            g = n.rt.by_repo["r"]
            await n.rt.wait_applied(g, g.applied, WAIT_S)
            tracker = n.rt.mr.raw_node(g.gid).raft.tracker
            assert tracker.learners == {NodeId(2)} and tracker.voters == {NodeId(1)}

    asyncio.run(main())
