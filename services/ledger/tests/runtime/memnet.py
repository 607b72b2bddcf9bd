"""In-process runtimes wired together: a batch goes straight to its receiver's ``step``.

Tests cut nodes off (``cut``), filter or lose batches (``drop`` returns the batch, a
filtered copy, or None to lose it) and look at everything sent (``seen``, kept only
when asked for: memory tests must not measure it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from enroute_ledger.multiraft import Batch
from enroute_ledger.runtime import Runtime

WAIT_S = 10.0


class MemNet:
    def __init__(self, *, record: bool = False) -> None:
        self.record = record
        self.nodes: dict[int, Runtime] = {}
        self.cut: set[int] = set()
        self.seen: list[Batch] = []
        self.drop: Callable[[Batch], Batch | None] = lambda b: b
        self.dropped = 0

    def link(self) -> MemLink:
        return MemLink(self)

    def deliver(self, batch: Batch) -> None:
        if self.record:
            self.seen.append(batch)
        if int(batch.to_node) in self.cut or int(batch.from_node) in self.cut:
            return
        got = self.drop(batch)
        if got is None:
            self.dropped += 1
            return
        rt = self.nodes.get(int(got.to_node))
        if rt is not None:
            asyncio.get_running_loop().call_soon(rt.step, got)


class MemLink:
    """The runtime's transport: sends into the net."""

    def __init__(self, net: MemNet) -> None:
        self.net = net

    def send(self, batch: Batch) -> None:
        self.net.deliver(batch)


async def until(cond: Callable[[], bool], wait_s: float = WAIT_S) -> None:
    for _ in range(int(wait_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")
