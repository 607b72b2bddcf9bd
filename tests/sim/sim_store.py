"""A simulated ledger log store: the ``LogStore`` interface over dicts, with explicit sync.

``submit`` queues a batch; ``sync`` makes every queued batch durable, in submission
order, and resolves their futures (the real store's group commit). A crash either
loses the queued batches (power loss: the page cache is gone) or keeps them (the
process died, the kernel wrote them). Reads see durable writes only, as the SQLite
store's readers see only committed rounds.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import EMPTY_HARD_STATE, Entry, HardState, SnapshotMetadata
from enroute_ledger.raft.errors import Compacted, EntriesUnavailable
from enroute_ledger.storage import GroupId, WriteBatch
from enroute_ledger.storage.api import (
    Append,
    ClearState,
    Compact,
    DeleteState,
    DropGroup,
    InstallSnapshot,
    Op,
    PutState,
    SetHardState,
    SetNodeIdentity,
    SetSnapshot,
    TruncateSuffix,
)

EMPTY_META = SnapshotMetadata()


@dataclass(slots=True)
class _Group:
    hs: HardState = EMPTY_HARD_STATE
    snap: SnapshotMetadata = EMPTY_META
    base: int = 0  # index of the entry just below entries[0]
    base_term: int = 0
    entries: list[Entry] = field(default_factory=list)
    kept: dict[int, Entry] = field(default_factory=dict)
    rows: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def last(self) -> int:
        return self.base + len(self.entries)

    def at(self, index: int) -> Entry | None:
        if self.base < index <= self.last:
            return self.entries[index - self.base - 1]
        return self.kept.get(index)


class SimStore:
    def __init__(self) -> None:
        self._groups: dict[GroupId, _Group] = {}
        self._node: NodeId | None = None
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
            for op in batch.ops:
                self._apply(op)
            fut.set_result(None)

    def crash(self, *, lose_unsynced: bool) -> None:
        if lose_unsynced:
            self.queue.clear()
        else:
            self.sync()

    def _apply(self, op: Op) -> None:
        if isinstance(op, SetNodeIdentity):
            self._node = op.node
            return
        g = self._groups.setdefault(op.group, _Group())
        if isinstance(op, Append):
            ents = [e for e in op.entries if e.index > g.base]
            if ents:
                at = ents[0].index - g.base - 1
                assert at <= len(g.entries), f"gap in the log of {op.group}"
                del g.entries[at:]
                g.entries.extend(ents)
        elif isinstance(op, TruncateSuffix):
            del g.entries[max(0, op.from_index - g.base - 1) :]
        elif isinstance(op, SetHardState):
            g.hs = op.hard_state
        elif isinstance(op, InstallSnapshot):
            g.snap, g.base, g.base_term = op.meta, op.meta.index, op.meta.term
            g.entries, g.kept = [], {}
        elif isinstance(op, SetSnapshot):
            g.snap = op.meta
        elif isinstance(op, Compact):
            kept = {i: e for i in op.keep if (e := g.at(i)) is not None}
            cut = op.upto_index - g.base
            if cut > 0:
                g.base_term = g.entries[cut - 1].term
                g.base = op.upto_index
                del g.entries[:cut]
            g.kept = kept
        elif isinstance(op, PutState):
            g.rows[op.key] = op.value
        elif isinstance(op, DeleteState):
            g.rows.pop(op.key, None)
        elif isinstance(op, ClearState):
            g.rows.clear()
        elif isinstance(op, DropGroup):
            del self._groups[op.group]
        else:
            raise AssertionError(op)

    # -- reads -----------------------------------------------------------------------------

    def _g(self, group: GroupId) -> _Group:
        return self._groups.get(group) or _Group()

    def groups(self) -> list[GroupId]:
        return sorted(self._groups)

    def has_group(self, group: GroupId) -> bool:
        return group in self._groups

    def hard_state(self, group: GroupId) -> HardState:
        return self._g(group).hs

    def snapshot_meta(self, group: GroupId) -> SnapshotMetadata:
        return self._g(group).snap

    def first_index(self, group: GroupId) -> LogIndex:
        return LogIndex(self._g(group).base + 1)

    def last_index(self, group: GroupId) -> LogIndex:
        return LogIndex(self._g(group).last)

    def term(self, group: GroupId, index: LogIndex) -> Term:
        g = self._g(group)
        if index < g.base:
            raise Compacted(index)
        if index == g.base:
            return Term(g.base_term)
        e = g.at(index)
        if e is None:
            raise EntriesUnavailable(index)
        return e.term

    def entries(self, group: GroupId, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        g = self._g(group)
        if lo <= g.base:
            raise Compacted(lo)
        if hi > g.last + 1:
            raise EntriesUnavailable(hi)
        out: list[Entry] = []
        size = 0
        for e in g.entries[lo - g.base - 1 : hi - g.base - 1]:
            size += e.size_bytes
            if out and size > max_bytes:
                break
            out.append(e)
        return out

    def entry(self, group: GroupId, index: LogIndex) -> Entry:
        e = self._g(group).at(index)
        if e is None:
            raise Compacted(index)
        return e

    def kept_indexes(self, group: GroupId) -> frozenset[LogIndex]:
        return frozenset(LogIndex(i) for i in self._g(group).kept)

    def state_rows(self, group: GroupId) -> list[tuple[bytes, bytes]]:
        return sorted(self._g(group).rows.items())

    def state_get(self, group: GroupId, key: bytes) -> bytes | None:
        return self._g(group).rows.get(key)

    def node_identity(self) -> NodeId | None:
        return self._node

    def set_node_identity(self, node: NodeId) -> None:
        self._node = node

    def close(self) -> None:
        pass
