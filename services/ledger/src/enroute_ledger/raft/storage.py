"""The Storage seam: the caller's durable log as the core reads it.

The core never writes to a Storage. The caller writes what a Ready hands out
(entries, hard state, snapshot) and then the core reads it back through this
protocol (etcd's ``Storage`` interface). :class:`MemoryStorage` is the one
implementation here: tests use it as it is, and a disk-backed runtime keeps one
as its in-memory view, rebuilt from disk at restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, Term

from .errors import Compacted, EntriesUnavailable, SnapshotOutOfDate
from .types import (
    EMPTY_HARD_STATE,
    EMPTY_SNAPSHOT,
    ConfState,
    Entry,
    HardState,
    Snapshot,
    SnapshotMetadata,
)


class Storage(Protocol):
    """What the core reads back of what the caller persisted.

    Indexes below ``first_index()`` are compacted: ``entries`` and ``term``
    raise :class:`Compacted` for them, except that ``term(first_index() - 1)``
    answers with the term of the last snapshot. Indexes past ``last_index()``
    raise :class:`EntriesUnavailable`.
    """

    def initial_state(self) -> tuple[HardState, ConfState]: ...

    def entries(self, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        """Entries in ``[lo, hi)``, at most ``max_bytes`` of them but at least one."""
        ...

    def term(self, index: LogIndex) -> Term: ...

    def first_index(self) -> LogIndex: ...

    def last_index(self) -> LogIndex: ...

    def snapshot(self) -> Snapshot:
        """The latest snapshot; may raise ``SnapshotTemporarilyUnavailable``."""
        ...


def limit_size(entries: Sequence[Entry], max_bytes: int) -> list[Entry]:
    """The longest prefix within ``max_bytes``, but never less than one entry."""
    if not entries:
        return []
    total = entries[0].size_bytes
    n = 1
    while n < len(entries):
        total += entries[n].size_bytes
        if total > max_bytes:
            break
        n += 1
    return list(entries[:n])


class MemoryStorage:
    """A Storage held in memory; ``_ents[0]`` is a dummy carrying the snapshot's index and term."""

    __slots__ = ("_ents", "_hard_state", "_snapshot")

    def __init__(self, *, conf_state: ConfState | None = None) -> None:
        """``conf_state`` seeds members into an empty log: for tests of a fixed cluster.

        A real cluster bootstraps from a snapshot at index 1 instead (docs/raft.md,
        "Bootstrapping"): a node added later must learn the founders from it.
        """
        self._hard_state = EMPTY_HARD_STATE
        self._snapshot = EMPTY_SNAPSHOT
        if conf_state is not None:
            self._snapshot = Snapshot(SnapshotMetadata(conf_state=conf_state))
        self._ents: list[Entry] = [Entry(Term(0), LogIndex(0))]

    # -- Storage --------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._hard_state, self._snapshot.metadata.conf_state

    def entries(self, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise Compacted(lo)
        if hi > self.last_index() + 1:
            raise EntriesUnavailable(hi)
        return limit_size(self._ents[lo - offset : hi - offset], max_bytes)

    def term(self, index: LogIndex) -> Term:
        offset = self._ents[0].index
        if index < offset:
            raise Compacted(index)
        if index - offset >= len(self._ents):
            raise EntriesUnavailable(index)
        return self._ents[index - offset].term

    def first_index(self) -> LogIndex:
        return LogIndex(self._ents[0].index + 1)

    def last_index(self) -> LogIndex:
        return LogIndex(self._ents[0].index + len(self._ents) - 1)

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- the caller's writes ----------------------------------------------------

    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hs: HardState) -> None:
        self._hard_state = hs

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace everything with ``snap`` (a follower installing the leader's state)."""
        if snap.index <= self._snapshot.index:
            raise SnapshotOutOfDate(snap.index)
        self._snapshot = snap
        self._ents = [Entry(snap.term, snap.index)]

    def create_snapshot(self, index: LogIndex, conf_state: ConfState, data: bytes) -> Snapshot:
        """Record the application's state at ``index`` (at most the applied index)."""
        if index <= self._snapshot.index:
            raise SnapshotOutOfDate(index)
        if index > self.last_index():
            raise InvalidArgument("snapshot past the last entry", index=index)
        meta = SnapshotMetadata(index, self.term(index), conf_state)
        self._snapshot = Snapshot(meta, data)
        return self._snapshot

    def compact(self, index: LogIndex) -> None:
        """Drop entries up to ``index``; the caller must not compact past what it applied."""
        offset = self._ents[0].index
        if index <= offset:
            raise Compacted(index)
        if index > self.last_index():
            raise InvalidArgument("compact past the last entry", index=index)
        i = index - offset
        self._ents = [Entry(self._ents[i].term, self._ents[i].index), *self._ents[i + 1 :]]

    def append(self, entries: Sequence[Entry]) -> None:
        """Write entries; any held entry at or after ``entries[0].index`` is replaced."""
        if not entries:
            return
        first = self.first_index()
        if entries[-1].index < first:
            return
        if entries[0].index < first:
            entries = entries[first - entries[0].index :]
        at = entries[0].index - self._ents[0].index
        if at > len(self._ents):
            raise InvalidArgument("gap before appended entries", index=entries[0].index)
        del self._ents[at:]
        self._ents.extend(entries)
