"""A node asked to join an ended incarnation reads the state object once (seed 001).

Seed 001, "Why a lagging voter can never write again": a node never joins an ended
incarnation, it checks the state object first. A voter whose join lost the race to
the delete's swap is never a member the leader hears from, so the leader's group
of the deleted repository never quiesces and keeps probing it, a message a tick;
each used to start a join that read the state object again (an object-store GET a
tick for as long as the name stays deleted). The answer is remembered: an ended
incarnation never comes back.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from enroute_core.base.ids import Incarnation, NodeId
from enroute_core.state import MISSING, Activate, Delete, apply, encode_state
from enroute_core.state.names import state_key
from enroute_core.storage.objectstore.file import FileStore
from enroute_ledger.lifecycle import Lifecycle
from enroute_ledger.logstore import open_log_store
from enroute_ledger.multiraft import GroupId
from enroute_ledger.runtime import Runtime, RuntimeConfig


class CountingStore(FileStore):
    """The real file store, counting the state-object reads a join makes."""

    reads = 0

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        self.reads += 1
        return await super().get_with_etag(key)


def test_a_deleted_incarnation_is_refused_once_then_without_a_read(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        objects = CountingStore(tmp_path / "objects")
        live = apply(MISSING, Activate(create=True, head=b"refs/heads/main", upload_window=64),
                     log_index=1).state  # fmt: skip
        deleted = apply(live, Delete(1), log_index=2).state
        assert deleted.deleted
        await objects.put(state_key("gone"), encode_state(deleted))
        store = open_log_store(tmp_path / "log")
        cfg = RuntimeConfig(node_id=NodeId(2), peers=(NodeId(1), NodeId(3)))
        rt = Runtime(cfg, store, clock=loop.time, nonce=os.urandom(8), seed=2)
        lc = Lifecycle(rt, objects, upload_window=64, wall_clock_us=lambda: 0)
        gid = GroupId(b"gone", Incarnation(1))
        try:
            for _ in range(5):  # the leader's probes, one after the other
                lc._on_unknown_group(gid)
                for _ in range(100):
                    await asyncio.sleep(0)
                    if gid not in lc._joining:
                        break
                await asyncio.sleep(0.01)
            assert gid not in rt.groups  # never joined
            assert objects.reads == 1
        finally:
            store.close()

    asyncio.run(main())
