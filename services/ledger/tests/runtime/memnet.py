"""In-process runtimes wired together: a batch goes straight to its receiver's ``step``.

Tests cut nodes off (``cut``), filter or lose batches (``drop`` returns the batch, a
filtered copy, or None to lose it) and look at everything sent (``seen``, kept only
when asked for: memory tests must not measure it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from enroute_core.base.ids import NodeId
from enroute_core.state import MISSING, Activate
from enroute_ledger import calls
from enroute_ledger.logstore import open_log_store
from enroute_ledger.machine import genesis_entry
from enroute_ledger.multiraft import Batch
from enroute_ledger.runtime import Group, Runtime, RuntimeConfig
from enroute_ledger.storage import LogStore
from enroute_testing import waiting

WAIT_S = 10.0
MAIN = b"refs/heads/main"


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
    """``enroute_testing.waiting.until`` with these tests' bound and a quick poll."""
    await waiting.until(cond, wait_s, "the condition of the test", poll_s=0.01)


@dataclasses.dataclass
class Node:
    rt: Runtime
    store: LogStore
    task: asyncio.Task[None]


async def start(
    path: Path,
    net: MemNet,
    i: int,
    *,
    tick_interval_s: float = 0.01,
    election_ticks: int = 10,
    hibernate_after_s: float = 3.0,
    blank_id: int = 0,
    blank_repos: Iterable[str] = (),
) -> Node:
    """Voter ``i`` of three (ids 1-3) on the log directory ``path``, running, in ``net``.

    A fresh nonce per start: request ids of an earlier life must not repeat.
    """
    store = open_log_store(path)
    cfg = RuntimeConfig(
        node_id=NodeId(i),
        peers=tuple(NodeId(p) for p in (1, 2, 3) if p != i),
        tick_interval_s=tick_interval_s,
        election_ticks=election_ticks,
        hibernate_after_s=hibernate_after_s,
    )
    loop = asyncio.get_running_loop()
    rt = Runtime(
        cfg,
        store,
        clock=loop.time,
        nonce=os.urandom(8),
        seed=i,
        blank_id=blank_id,
        blank_repos=blank_repos,
    )
    rt.transport = net.link()
    net.nodes[i] = rt
    rt.recover()
    return Node(rt, store, loop.create_task(rt.run()))


async def stop(n: Node, wait_s: float = WAIT_S) -> None:
    n.rt.stop()
    await asyncio.wait_for(n.task, wait_s)
    n.store.close()


async def genesis(runtimes: Sequence[Runtime], repo: str = "r") -> Group:
    """Host ``repo`` on every runtime, elect the first, apply the genesis; the first's group."""
    first = runtimes[0]
    for rt in runtimes[1:]:
        await rt.founder.host(repo, 1)
    g = await first.founder.host(repo, 1, campaign=True)
    rid = first.client.request_id()
    act = Activate(create=True, head=MAIN, upload_window=64)
    await calls.propose(first, g, genesis_entry(rid, MISSING, act), rid, WAIT_S)
    return g
