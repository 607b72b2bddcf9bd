"""Two callers host the same group at once (a Propose and a peer's message, say).

Hosting writes the group's boot rows (snapshot metadata, hard state) before the
group exists in memory; a second caller that arrives meanwhile must share that
write and its group, not write the boot snapshot again: the store refuses a
snapshot no newer than the one it holds, and the loser's request failed with
``snapshot is older than the one held`` (seen in
``test_ledger_wiped_voter.py`` under load).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from memnet import MemNet, start, stop


def test_concurrent_hosts_of_one_group_share_one_write_and_one_group(tmp_path: Path) -> None:
    async def main() -> None:
        net = MemNet()
        node = await start(tmp_path / "log1", net, 1)
        try:
            for repo in ("a", "b", "c"):
                groups = await asyncio.gather(*(node.rt.founder.host(repo, 1) for _ in range(4)))
                assert all(g is groups[0] for g in groups)
                assert node.rt.by_repo[repo] is groups[0]
        finally:
            await stop(node)

    asyncio.run(main())


def test_a_host_whose_caller_gives_up_still_founds_the_group_for_the_next(
    tmp_path: Path,
) -> None:
    """The first caller is cancelled while its boot rows are being written (a request
    deadline, say); the write goes on, and the next caller takes that group instead of
    writing the boot snapshot again."""

    async def main() -> None:
        net = MemNet()
        node = await start(tmp_path / "log1", net, 1)
        try:
            first = asyncio.ensure_future(node.rt.founder.host("a", 1))
            await asyncio.sleep(0)  # the write has been submitted
            first.cancel()
            g = await node.rt.founder.host("a", 1)
            assert node.rt.by_repo["a"] is g
        finally:
            await stop(node)

    asyncio.run(main())
