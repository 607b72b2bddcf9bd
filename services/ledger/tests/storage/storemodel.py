"""A reference model of the store contract, and helpers shared by the storage tests.

The model is written independently of ``enroute_ledger.storage.shape``: plain
dicts, one rule per operation, as docs/ledger-storage.md states them.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft.errors import Compacted, EntriesUnavailable
from enroute_ledger.raft.types import EMPTY_HARD_STATE, Entry, HardState, SnapshotMetadata
from enroute_ledger.storage import SqliteStore
from enroute_ledger.storage.api import (
    Append,
    ClearState,
    Compact,
    DeleteState,
    DropGroup,
    GroupId,
    InstallSnapshot,
    Op,
    PutState,
    SetHardState,
    SetNodeIdentity,
    SetSnapshot,
    TruncateSuffix,
    WriteBatch,
)


def open_store(path: Path) -> SqliteStore:
    return SqliteStore.open(path)


def seed_from_env(default: int) -> int:
    seed = int(os.environ.get("ENROUTE_SEED", default))
    print(f"ENROUTE_SEED={seed}")
    return seed


class Refused(Exception):
    pass


@dataclass
class MGroup:
    base: int = 0
    base_term: int = 0
    snapshot: SnapshotMetadata = field(default_factory=SnapshotMetadata)
    entries: dict[int, Entry] = field(default_factory=dict)
    kept: dict[int, Entry] = field(default_factory=dict)
    hs: HardState = EMPTY_HARD_STATE
    state: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def last(self) -> int:
        return self.base + len(self.entries)

    def term(self, i: int) -> int:
        return self.base_term if i == self.base else self.entries[i].term


@dataclass
class Model:
    groups: dict[GroupId, MGroup] = field(default_factory=dict)
    node: NodeId | None = None

    def commit(self, batch: WriteBatch) -> bool:
        """Apply ``batch`` all or nothing; False if the store must refuse it."""
        trial = copy.deepcopy(self)
        try:
            for op in batch.ops:
                trial._op(op)
        except Refused:
            return False
        self.groups, self.node = trial.groups, trial.node
        return True

    def _op(self, op: Op) -> None:
        if isinstance(op, SetNodeIdentity):
            if self.node is not None and self.node != op.node:
                raise Refused
            self.node = op.node
            return
        if isinstance(op, DropGroup):
            self.groups.pop(op.group, None)
            return
        g = self.groups.setdefault(op.group, MGroup())
        if isinstance(op, Append):
            ents = [e for e in op.entries if e.index > g.base]
            if not ents:
                return
            if ents[0].index > g.last + 1:
                raise Refused
            for i in range(ents[0].index, g.last + 1):
                del g.entries[i]
            g.entries.update((e.index, e) for e in ents)
        elif isinstance(op, TruncateSuffix):
            if op.from_index <= g.base:
                raise Refused
            for i in range(op.from_index, g.last + 1):
                del g.entries[i]
        elif isinstance(op, SetHardState):
            g.hs = op.hard_state
        elif isinstance(op, InstallSnapshot):
            if op.meta.index <= g.snapshot.index:
                raise Refused
            g.base, g.base_term, g.snapshot = op.meta.index, op.meta.term, op.meta
            g.entries, g.kept = {}, {}
        elif isinstance(op, SetSnapshot):
            m = op.meta
            if m.index < g.snapshot.index or not g.base <= m.index <= g.last:
                raise Refused
            if g.term(m.index) != m.term:
                raise Refused
            g.snapshot = m
        elif isinstance(op, Compact):
            self._compact(g, op)
        elif isinstance(op, PutState):
            g.state[op.key] = op.value
        elif isinstance(op, DeleteState):
            g.state.pop(op.key, None)
        elif isinstance(op, ClearState):
            g.state = {}
        else:
            raise AssertionError(op)

    @staticmethod
    def _compact(g: MGroup, op: Compact) -> None:
        if op.upto_index > g.snapshot.index:
            raise Refused
        upto = max(op.upto_index, g.base)
        kept: dict[int, Entry] = {}
        for k in op.keep:
            if k > upto:
                continue
            if k > g.base:
                kept[k] = g.entries[k]
            elif k in g.kept:
                kept[k] = g.kept[k]
            else:
                raise Refused
        if upto > g.base:
            g.base_term = g.term(upto)
            for i in range(g.base + 1, upto + 1):
                del g.entries[i]
            g.base = upto
        g.kept = kept


def check_equal(store: SqliteStore, model: Model) -> None:
    """Every read of the contract answers as the model says."""
    assert store.groups() == sorted(model.groups)
    assert store.node_identity() == model.node
    for gid, g in model.groups.items():
        assert store.has_group(gid)
        assert store.first_index(gid) == g.base + 1
        assert store.last_index(gid) == g.last
        assert store.hard_state(gid) == g.hs
        assert store.snapshot_meta(gid) == g.snapshot
        assert store.term(gid, LogIndex(g.base)) == g.base_term
        if g.base > 0:
            try:
                store.term(gid, LogIndex(g.base - 1))
                raise AssertionError("term below the base answered")
            except Compacted:
                pass
        try:
            store.term(gid, LogIndex(g.last + 1))
            raise AssertionError("term past the end answered")
        except EntriesUnavailable:
            pass
        want = [g.entries[i] for i in range(g.base + 1, g.last + 1)]
        for e in want:
            assert store.term(gid, e.index) == e.term
        if want:
            got = store.entries(gid, LogIndex(g.base + 1), LogIndex(g.last + 1), 1 << 40)
            assert got == want
            one = store.entries(gid, LogIndex(g.base + 1), LogIndex(g.last + 1), 0)
            assert one == want[:1]
            budget = sum(e.size_bytes for e in want[:2])
            two = store.entries(gid, LogIndex(g.base + 1), LogIndex(g.last + 1), budget)
            assert two == want[:2]
        assert store.kept_indexes(gid) == frozenset(g.kept)
        for i, e in g.kept.items():
            assert store.entry(gid, LogIndex(i)) == e
        assert store.state_rows(gid) == sorted(g.state.items())
        for k, v in g.state.items():
            assert store.state_get(gid, k) == v
        assert store.state_get(gid, b"\xffabsent") == g.state.get(b"\xffabsent")


def entry(index: int, term: int, data: bytes = b"", conf: bool = False) -> Entry:
    from enroute_ledger.raft.types import EntryType

    etype = EntryType.CONF_CHANGE if conf else EntryType.NORMAL
    return Entry(Term(term), LogIndex(index), etype, data)


def refused(store: SqliteStore, batch: WriteBatch) -> bool:
    try:
        store.commit(batch)
    except InvalidArgument:
        return True
    return False
