"""Which life a data directory is (docs/raft.md, "A voter that lost its disk")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_core.base.ids import NodeId
from enroute_core.state.names import layers_prefix, state_key
from enroute_core.storage.objectstore import ObjectStore, open_store
from enroute_ledger.identity import (
    BLANK_FILE,
    NodeLife,
    establish,
    list_repositories,
    node_key,
    read_blank_file,
)
from enroute_ledger.logstore import open_log_store

REPOS = ("a", "a/b", "a0", "b", "team/app", "z.x")


async def _seed(store: ObjectStore, layers: int) -> None:
    """``layers`` keys under the first repository: past one list page, the listing jumps."""
    for name in REPOS:
        await store.put(state_key(name), b"state")
    for i in range(layers):
        await store.put(f"{layers_prefix(REPOS[0])}{i:04d}", b"layer")


def test_listing_finds_every_repository_and_skips_their_layers(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store(f"file://{tmp_path / 'store'}")
        await _seed(store, layers=1001)
        assert await list_repositories(store) == frozenset(REPOS)
        await store.close()

    asyncio.run(main())


def test_first_life_then_a_wiped_life_then_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store(f"file://{tmp_path / 'store'}")
        await _seed(store, layers=2)
        node = NodeId(2)

        async def life(data: Path, new_id: int, voters: int = 3) -> NodeLife:
            data.mkdir(parents=True, exist_ok=True)
            log = open_log_store(data / "log")
            try:
                return await establish(data, log, store, node, voters=voters, new_id=new_id)
            finally:
                log.close()

        first = await life(tmp_path / "d1", 7)
        assert first == NodeLife(0, frozenset())
        assert await store.get(node_key(node))
        assert not (tmp_path / "d1" / BLANK_FILE).exists()
        assert await life(tmp_path / "d1", 8) == first  # a plain restart

        wiped = await life(tmp_path / "d2", 9)  # same id, fresh directory
        assert wiped == NodeLife(9, frozenset(REPOS))
        assert read_blank_file(tmp_path / "d2" / BLANK_FILE) == wiped
        assert await life(tmp_path / "d2", 10) == wiped  # restarts stay blank

        single = await life(tmp_path / "d3", 11, voters=1)
        assert single == NodeLife(0, frozenset())

        log = open_log_store(tmp_path / "d4" / "log")
        log.set_node_identity(NodeId(3))
        with pytest.raises(InvalidArgument):
            await establish(tmp_path / "d4", log, store, node, voters=3, new_id=1)
        log.close()
        await store.close()

    asyncio.run(main())


def test_a_damaged_blank_file_is_corrupt_data(tmp_path: Path) -> None:
    for body in (b"", b"{}", b'{"format": 1, "blank_id": "0", "repos": []}', b"\xff"):
        (tmp_path / BLANK_FILE).write_bytes(body)
        with pytest.raises(CorruptData):
            read_blank_file(tmp_path / BLANK_FILE)
