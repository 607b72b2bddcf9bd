"""The log as the core sees it: the caller's stable Storage plus an unstable tail.

Entries the core appended (or a snapshot it received) wait in ``Unstable``
until a Ready hands them out and ``advance`` says they were persisted; from
then on they are read back from Storage. ``committed`` and ``applied`` follow
Figure 2 of the Raft paper: ``applied <= committed <= last_index``.
"""

from __future__ import annotations

from enroute_core.base.ids import LogIndex, Term

from .errors import Compacted, EntriesUnavailable, StorageSignal
from .storage import Storage, limit_size
from .types import Entry, Snapshot


class Unstable:
    """Entries and a snapshot not yet persisted; ``entries[i]`` has index ``offset + i``."""

    __slots__ = ("entries", "offset", "snapshot")

    def __init__(self, offset: LogIndex) -> None:
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self.offset = offset

    def first_index(self) -> LogIndex | None:
        return LogIndex(self.snapshot.index + 1) if self.snapshot is not None else None

    def last_index(self) -> LogIndex | None:
        if self.entries:
            return LogIndex(self.offset + len(self.entries) - 1)
        if self.snapshot is not None:
            return self.snapshot.index
        return None

    def term(self, index: LogIndex) -> Term | None:
        if index < self.offset:
            if self.snapshot is not None and self.snapshot.index == index:
                return self.snapshot.term
            return None
        i = index - self.offset
        if i >= len(self.entries):
            return None
        return self.entries[i].term

    def stable_to(self, index: LogIndex, term: Term) -> None:
        # Only if the entry is still the one persisted: a later append may have replaced it.
        if index < self.offset or self.term(index) != term:
            return
        del self.entries[: index + 1 - self.offset]
        self.offset = LogIndex(index + 1)

    def stable_snap_to(self, index: LogIndex) -> None:
        if self.snapshot is not None and self.snapshot.index == index:
            self.snapshot = None

    def restore(self, snap: Snapshot) -> None:
        self.offset = LogIndex(snap.index + 1)
        self.entries = []
        self.snapshot = snap

    def truncate_and_append(self, ents: list[Entry] | tuple[Entry, ...]) -> None:
        after = ents[0].index
        if after == self.offset + len(self.entries):
            self.entries.extend(ents)
        elif after <= self.offset:
            # Replaces everything unstable and some of what the storage holds.
            self.offset = after
            self.entries = list(ents)
        else:
            del self.entries[after - self.offset :]
            self.entries.extend(ents)

    def slice(self, lo: LogIndex, hi: LogIndex) -> list[Entry]:
        assert self.offset <= lo <= hi <= self.offset + len(self.entries), (lo, hi, self.offset)
        return self.entries[lo - self.offset : hi - self.offset]


class RaftLog:
    __slots__ = ("applied", "applying_bytes_max", "committed", "storage", "unstable")

    def __init__(self, storage: Storage, applying_bytes_max: int) -> None:
        self.storage = storage
        self.unstable = Unstable(LogIndex(storage.last_index() + 1))
        first = storage.first_index()
        self.committed = LogIndex(first - 1)
        self.applied = LogIndex(first - 1)
        self.applying_bytes_max = applying_bytes_max

    # -- reading --------------------------------------------------------------

    def first_index(self) -> LogIndex:
        i = self.unstable.first_index()
        return i if i is not None else self.storage.first_index()

    def last_index(self) -> LogIndex:
        i = self.unstable.last_index()
        return i if i is not None else self.storage.last_index()

    def term(self, index: LogIndex) -> Term:
        """The term at ``index``; Compacted below the snapshot, EntriesUnavailable past the end."""
        t = self.unstable.term(index)
        if t is not None:
            return t
        if index < self.first_index() - 1:
            raise Compacted(index)
        if index > self.last_index():
            raise EntriesUnavailable(index)
        return self.storage.term(index)

    def term_or_zero(self, index: LogIndex) -> Term:
        try:
            return self.term(index)
        except StorageSignal:
            return Term(0)

    def last_term(self) -> Term:
        return self.term(self.last_index())

    def match_term(self, index: LogIndex, term: Term) -> bool:
        try:
            return self.term(index) == term
        except StorageSignal:
            return False

    def is_up_to_date(self, last_index: LogIndex, term: Term) -> bool:
        """§5.4.1: the candidate's log is at least as up-to-date as ours."""
        last_term = self.last_term()
        return term > last_term or (term == last_term and last_index >= self.last_index())

    def slice(self, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        """Entries in ``[lo, hi)``, size-limited; raises Compacted when ``lo`` is compacted."""
        if lo < self.first_index():
            raise Compacted(lo)
        assert hi <= self.last_index() + 1, (hi, self.last_index())
        if lo >= hi:
            return []
        off = self.unstable.offset
        ents: list[Entry] = []
        if lo < off:
            ents = self.storage.entries(lo, LogIndex(min(hi, off)), max_bytes)
            if len(ents) < min(hi, off) - lo:
                return ents  # the size limit cut the stored part
        if hi > off:
            tail = self.unstable.slice(LogIndex(max(lo, off)), hi)
            ents = limit_size(ents + tail, max_bytes) if ents else limit_size(tail, max_bytes)
        return ents

    def entries_from(self, lo: LogIndex, max_bytes: int) -> list[Entry]:
        if lo > self.last_index():
            return []
        return self.slice(lo, LogIndex(self.last_index() + 1), max_bytes)

    def all_entries(self) -> list[Entry]:
        """Every entry still held; for tests and debugging."""
        return self.entries_from(self.first_index(), 1 << 62)

    def find_conflict(self, ents: tuple[Entry, ...]) -> LogIndex:
        """The first index whose term differs from ours (or past our end); 0 when none."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return LogIndex(0)

    def find_conflict_by_term(self, index: LogIndex, term: Term) -> tuple[LogIndex, Term]:
        """The last index at or below ``index`` whose term is at most ``term``.

        The fast-backtracking hint of §5.3 ("the follower can include the term of
        the conflicting entry"): every entry after it in our log is of a later
        term and so cannot match the other log. An unknown (compacted) term is
        returned as 0, a possible match.
        """
        while index > 0:
            try:
                ours = self.term(index)
            except StorageSignal:
                return index, Term(0)
            if ours <= term:
                return index, ours
            index = LogIndex(index - 1)
        return LogIndex(0), Term(0)

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()

    def has_pending_snapshot(self) -> bool:
        return self.unstable.snapshot is not None

    def unstable_entries(self) -> tuple[Entry, ...]:
        return tuple(self.unstable.entries)

    def has_next_committed_entries(self) -> bool:
        if self.unstable.snapshot is not None:
            return False  # the snapshot applies first
        return self.committed > max(self.applied, self.first_index() - 1)

    def next_committed_entries(self) -> list[Entry]:
        if not self.has_next_committed_entries():
            return []
        lo = LogIndex(max(self.applied + 1, self.first_index()))
        return self.slice(lo, LogIndex(self.committed + 1), self.applying_bytes_max)

    # -- changing -------------------------------------------------------------

    def append(self, ents: list[Entry] | tuple[Entry, ...]) -> LogIndex:
        if not ents:
            return self.last_index()
        assert ents[0].index > self.committed, ("overwriting committed", ents[0].index)
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    def maybe_append(
        self, index: LogIndex, log_term: Term, committed: LogIndex, ents: tuple[Entry, ...]
    ) -> LogIndex | None:
        """§5.3 AppendEntries receiver rules 2-5; None when ``(index, log_term)`` does not match."""
        if not self.match_term(index, log_term):
            return None
        last_new = LogIndex(index + len(ents))
        conflict = self.find_conflict(ents)
        if conflict:
            # Log Matching makes a conflict at or below commit impossible (§5.3).
            assert conflict > self.committed, ("conflict with committed entry", conflict)
            self.append(ents[conflict - index - 1 :])
        self.commit_to(LogIndex(min(committed, last_new)))
        return last_new

    def commit_to(self, index: LogIndex) -> None:
        if index > self.committed:
            assert index <= self.last_index(), ("commit past the log", index, self.last_index())
            self.committed = index

    def maybe_commit(self, index: LogIndex, term: Term) -> bool:
        """§5.4.2: only an entry of the current term is committed by counting replicas."""
        if index > self.committed and self.term_or_zero(index) == term:
            self.commit_to(index)
            return True
        return False

    def applied_to(self, index: LogIndex) -> None:
        if index == 0 or index <= self.applied:
            return
        assert index <= self.committed, ("applied past commit", index, self.committed)
        self.applied = index

    def stable_to(self, index: LogIndex, term: Term) -> None:
        self.unstable.stable_to(index, term)

    def stable_snap_to(self, index: LogIndex) -> None:
        self.unstable.stable_snap_to(index)

    def restore(self, snap: Snapshot) -> None:
        self.committed = snap.index
        self.unstable.restore(snap)
