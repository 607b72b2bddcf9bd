"""The node's buffer pool feeds the enroute_pool_* families of /metrics (seed 004, "Pages
and memory": one pool per node, sized by node.page_cache)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from enroute_compute.http import _pool_families
from enroute_core.base.ids import ObjectId
from enroute_core.git.pack import encode_entry_header
from enroute_core.storage.layer import Kind, LayerEntry, write_layer
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore.file import FileStore

KEY = "repos/r/layers/1"


def test_pool_families_have_samples_from_the_layer_service_pool(tmp_path: Path) -> None:
    rng = random.Random(5)
    entries = []
    for _ in range(50):
        body = rng.randbytes(2000)
        entry = encode_entry_header(3, len(body)) + body
        entries.append(LayerEntry(ObjectId(rng.randbytes(20)), Kind.BLOB, entry, 2000, None, 0))
    data, sealed = write_layer(entries)

    async def run() -> dict[str, float]:
        service = LayerService(
            FileStore(tmp_path / "store"), tmp_path / "node", page_cache_bytes=3 << 20
        )
        await service.publish("r", KEY, data)
        layer = await service.open_layer("r", KEY, sealed.file_size, sealed.meta_size)
        for i, e in enumerate(entries):
            assert layer.reader.lookup(e.oid) == i
            assert layer.entry_bytes(i) == e.entry
        samples = {m.name: m.samples[0].value for m in _pool_families(service.pool) if m.samples}
        await service.close()
        return samples

    got = asyncio.run(run())
    assert got["enroute_pool_budget_bytes"] == 3 << 20
    assert got["enroute_pool_hits"] > 0 and got["enroute_pool_misses"] > 0
    assert got["enroute_pool_used_bytes"] > 0
    assert "enroute_pool_evictions" in got
