"""A simulated ledger log store: the ``LogStore`` interface over dicts, with explicit sync.

``submit`` queues a batch; ``sync`` makes every queued batch durable, in submission
order, and resolves their futures (the real store's group commit). A crash either
loses the queued batches (power loss: the page cache is gone) or keeps them (the
process died, the kernel wrote them). Reads see durable writes only, as the SQLite
store's readers see only committed rounds.
"""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType
from typing import Any

from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import Entry, HardState, SnapshotMetadata
from enroute_ledger.raft.errors import Compacted, EntriesUnavailable
from enroute_ledger.storage import GroupId, WriteBatch


def _storemodel() -> ModuleType:
    """The storage tests' model, loaded from its file under a name of its own (that
    folder is not put on sys.path: its conftest would shadow other test folders')."""
    name = "ledger_storemodel"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "services/ledger/tests/storage/storemodel.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_model = _storemodel()
MGroup, Model, Refused = _model.MGroup, _model.Model, _model.Refused


class SimStore:
    """``LogStore`` over the storage tests' reference model of the store contract.

    The model's rules are the ones the SQLite store is checked against
    (services/ledger/tests/storage/storemodel.py); a batch the real store would
    refuse (a gap in the log, a snapshot older than the one held, a compaction past
    it) stops the schedule here, as a driver bug.
    """

    def __init__(self) -> None:
        self.model = Model()
        self.queue: list[tuple[WriteBatch, Future[None]]] = []
        self.syncs = 0

    # -- writes ----------------------------------------------------------------------------

    def submit(self, batch: WriteBatch) -> Future[None]:
        batch.submitted = True
        fut: Future[None] = Future()
        self.queue.append((batch, fut))
        return fut

    def commit(self, batch: WriteBatch) -> None:
        self.submit(batch)
        self.sync()

    def sync(self) -> None:
        queue, self.queue = self.queue, []
        if queue:
            self.syncs += 1
        for batch, fut in queue:
            try:
                for op in batch.ops:
                    self.model._op(op)
            except Refused:
                raise AssertionError(f"the store refuses a batch of the driver: {op}") from None
            fut.set_result(None)

    def crash(self, *, lose_unsynced: bool) -> None:
        if lose_unsynced:
            self.queue.clear()
        else:
            self.sync()

    # -- reads -----------------------------------------------------------------------------

    def _g(self, group: GroupId) -> Any:
        return self.model.groups.get(group) or MGroup()

    def groups(self) -> list[GroupId]:
        return sorted(self.model.groups)

    def has_group(self, group: GroupId) -> bool:
        return group in self.model.groups

    def hard_state(self, group: GroupId) -> HardState:
        return self._g(group).hs

    def snapshot_meta(self, group: GroupId) -> SnapshotMetadata:
        return self._g(group).snapshot

    def first_index(self, group: GroupId) -> LogIndex:
        return LogIndex(self._g(group).base + 1)

    def last_index(self, group: GroupId) -> LogIndex:
        return LogIndex(self._g(group).last)

    def term(self, group: GroupId, index: LogIndex) -> Term:
        g = self._g(group)
        if index < g.base:
            raise Compacted(index)
        if index > g.last:
            raise EntriesUnavailable(index)
        return Term(g.term(index))

    def entries(self, group: GroupId, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        g = self._g(group)
        if lo <= g.base:
            raise Compacted(lo)
        if hi > g.last + 1:
            raise EntriesUnavailable(hi)
        out: list[Entry] = []
        size = 0
        for i in range(lo, hi):
            e = g.entries[i]
            size += e.size_bytes
            if out and size > max_bytes:
                break
            out.append(e)
        return out

    def entry(self, group: GroupId, index: LogIndex) -> Entry:
        g = self._g(group)
        e = g.entries.get(index) or g.kept.get(index)
        if e is None:
            raise Compacted(index)
        return e

    def kept_indexes(self, group: GroupId) -> frozenset[LogIndex]:
        return frozenset(LogIndex(i) for i in self._g(group).kept)

    def state_rows(self, group: GroupId) -> list[tuple[bytes, bytes]]:
        return sorted(self._g(group).state.items())

    def state_get(self, group: GroupId, key: bytes) -> bytes | None:
        return self._g(group).state.get(key)

    def node_identity(self) -> NodeId | None:
        return self.model.node

    def set_node_identity(self, node: NodeId) -> None:
        self.model.node = node

    def close(self) -> None:
        pass
