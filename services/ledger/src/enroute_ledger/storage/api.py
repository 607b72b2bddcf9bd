"""The ledger node's durable store: every group's Raft log, hard state and state rows.

One store per ledger node holds the log of every repository incarnation it
hosts (DESIGN, "Processes": multi-Raft, one group per incarnation). The runtime
collects the writes of many groups' Readies into one :class:`WriteBatch` and
commits it: the batch is durable (fsynced) before ``commit`` returns or the
future of ``submit`` resolves, and it is atomic: after a crash either all of
it or none of it is visible. Batches queued while a write is in flight are
coalesced into the next fsync (group commit). Nothing written becomes readable
before it is durable, so a reader never sees what a crash could take back.

Reads are answered from memory (indexes, terms, hard states) or from disk
(entry bytes, state values); every byte read from disk is checked against its
crc32 (STYLE rule 6).

Choice of implementation and figures: ``docs/ledger-storage.md``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from enroute_core.base.errors import InvalidArgument, LimitExceeded
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_core.base.limits import DEFAULT_LIMITS, Limits

from ..raft.types import Entry, HardState, SnapshotMetadata

INCARNATION_MAX = 2**63 - 1
INDEX_MAX = 2**63 - 1
"""Indexes, terms and node ids are stored as u64; keep them in signed range for SQLite too."""


class GroupId(tuple[bytes, int]):
    """One Raft group: a repository incarnation (DESIGN, "Repository state").

    A checked ``(repo name bytes, incarnation)`` tuple: hashing and comparing it
    stay in C, which matters when one round touches a thousand groups.
    """

    __slots__ = ()

    def __new__(cls, repo: bytes, incarnation: int) -> GroupId:
        if not isinstance(repo, bytes) or not repo:
            raise InvalidArgument("group repo must be non-empty bytes", repo=repr(repo)[:80])
        if len(repo) > DEFAULT_LIMITS.repo_name_bytes_max:
            raise LimitExceeded(
                "repo_name_bytes_max", len(repo), DEFAULT_LIMITS.repo_name_bytes_max
            )
        if not isinstance(incarnation, int) or not 1 <= incarnation <= INCARNATION_MAX:
            raise InvalidArgument("incarnation out of range", incarnation=incarnation)
        return tuple.__new__(cls, (repo, incarnation))

    @property
    def repo(self) -> bytes:
        return self[0]

    @property
    def incarnation(self) -> int:
        return self[1]

    def __repr__(self) -> str:
        return f"GroupId({self[0]!r}, {self[1]})"

    def __getnewargs__(self) -> tuple[bytes, int]:
        return (self[0], self[1])


# -- the operations of a batch ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Append:
    """Write ``entries``; any stored entry at ``entries[0].index`` or later is discarded first.

    Entries below the group's first index are skipped (already covered by a snapshot).
    """

    group: GroupId
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class TruncateSuffix:
    """Discard the entries at ``from_index`` and after (conflicting entries, Raft §5.3)."""

    group: GroupId
    from_index: LogIndex


@dataclass(frozen=True, slots=True)
class SetHardState:
    group: GroupId
    hard_state: HardState


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """Replace the whole log by a snapshot at ``meta.index`` (a follower catching up, §7).

    The state rows are left alone: the caller clears and rewrites them in the same batch.
    Entries kept by pins are dropped too: the snapshot supersedes them.
    """

    group: GroupId
    meta: SnapshotMetadata


@dataclass(frozen=True, slots=True)
class SetSnapshot:
    """Record a checkpoint at an applied index; ``meta.term`` must be that entry's term."""

    group: GroupId
    meta: SnapshotMetadata


@dataclass(frozen=True, slots=True)
class Compact:
    """Drop entries up to ``upto_index`` (at most the recorded snapshot's index).

    Entries whose index is in ``keep`` survive below the first index, readable by
    :meth:`LogStore.entry`: the inline layers of the manifest pin them (DESIGN,
    "Freezing the ledger"). ``keep`` replaces the previous set: an entry kept
    before and not named again is dropped.
    """

    group: GroupId
    upto_index: LogIndex
    keep: frozenset[LogIndex] = frozenset()


@dataclass(frozen=True, slots=True)
class PutState:
    group: GroupId
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class DeleteState:
    group: GroupId
    key: bytes


@dataclass(frozen=True, slots=True)
class ClearState:
    group: GroupId


@dataclass(frozen=True, slots=True)
class DropGroup:
    """Forget the group entirely: log, hard state, snapshot record, pins and state rows."""

    group: GroupId


@dataclass(frozen=True, slots=True)
class SetNodeIdentity:
    node: NodeId


Op = (
    Append
    | TruncateSuffix
    | SetHardState
    | InstallSnapshot
    | SetSnapshot
    | Compact
    | PutState
    | DeleteState
    | ClearState
    | DropGroup
    | SetNodeIdentity
)


@dataclass(slots=True)
class WriteBatch:
    """Writes of any number of groups, made durable together by one ``commit``.

    Checks that need no stored state happen here, when a write is added; the
    rest (gaps in the log, compaction past the snapshot) when the batch is
    committed, and then the whole batch is refused with ``InvalidArgument``
    and nothing of it is written.
    """

    limits: Limits = DEFAULT_LIMITS
    ops: list[Op] = field(default_factory=list)
    size_bytes: int = 0
    submitted: bool = False

    def _add(self, op: Op, size: int) -> None:
        assert not self.submitted, "a batch is committed once"
        total = self.size_bytes + size
        if total > self.limits.ledger_commit_bytes_max:
            raise LimitExceeded(
                "ledger_commit_bytes_max", total, self.limits.ledger_commit_bytes_max
            )
        self.ops.append(op)
        self.size_bytes = total

    def append(self, group: GroupId, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        size = 0
        value_max = self.limits.ledger_record_bytes_max - 1024
        for i, e in enumerate(entries):
            n = len(e.data)
            if e.index != first + i or not (
                1 <= e.index <= INDEX_MAX and 1 <= e.term <= INDEX_MAX and n <= value_max
            ):
                _check_index("entry index", e.index, 1)
                _check_index("entry term", e.term, 1)
                _check_value(self.limits, n)
                raise InvalidArgument("entries are not contiguous", at=i, index=e.index)
            size += n + 32
        self._add(Append(group, tuple(entries)), size)

    def truncate_suffix(self, group: GroupId, from_index: LogIndex) -> None:
        _check_index("truncate index", from_index, 1)
        self._add(TruncateSuffix(group, from_index), 16)

    def set_hard_state(self, group: GroupId, hs: HardState) -> None:
        if not (
            0 <= hs.term <= INDEX_MAX
            and 0 <= hs.commit <= INDEX_MAX
            and (hs.vote is None or 1 <= hs.vote <= INDEX_MAX)
        ):
            raise InvalidArgument("hard state out of range", hard_state=repr(hs))
        self._add(SetHardState(group, hs), 32)

    def install_snapshot(self, group: GroupId, meta: SnapshotMetadata) -> None:
        _check_meta(meta)
        self._add(InstallSnapshot(group, meta), 64)

    def set_snapshot(self, group: GroupId, meta: SnapshotMetadata) -> None:
        _check_meta(meta)
        self._add(SetSnapshot(group, meta), 64)

    def compact(
        self, group: GroupId, upto_index: LogIndex, keep: Collection[LogIndex] = ()
    ) -> None:
        _check_index("compact index", upto_index, 1)
        for k in keep:
            _check_index("kept index", k, 1)
        self._add(Compact(group, upto_index, frozenset(keep)), 32 + 8 * len(keep))

    def put_state(self, group: GroupId, key: bytes, value: bytes) -> None:
        _check_key(self.limits, key)
        _check_value(self.limits, len(key) + len(value))
        self._add(PutState(group, bytes(key), bytes(value)), len(key) + len(value) + 32)

    def delete_state(self, group: GroupId, key: bytes) -> None:
        _check_key(self.limits, key)
        self._add(DeleteState(group, bytes(key)), len(key) + 32)

    def clear_state(self, group: GroupId) -> None:
        self._add(ClearState(group), 16)

    def drop_group(self, group: GroupId) -> None:
        self._add(DropGroup(group), 16)

    def set_node_identity(self, node: NodeId) -> None:
        _check_index("node id", node, 1)
        self._add(SetNodeIdentity(node), 16)


def _check_index(what: str, value: int, low: int) -> None:
    if not low <= value <= INDEX_MAX:
        raise InvalidArgument(f"{what} out of range", value=value)


def _check_key(limits: Limits, key: bytes) -> None:
    if not isinstance(key, bytes | bytearray) or not key:
        raise InvalidArgument("state keys are non-empty bytes")
    if len(key) > limits.ledger_state_key_bytes_max:
        raise LimitExceeded(
            "ledger_state_key_bytes_max", len(key), limits.ledger_state_key_bytes_max
        )


def _check_value(limits: Limits, size: int) -> None:
    if size > limits.ledger_record_bytes_max - 1024:
        raise LimitExceeded("ledger_record_bytes_max", size, limits.ledger_record_bytes_max - 1024)


def _check_meta(meta: SnapshotMetadata) -> None:
    _check_index("snapshot index", meta.index, 1)
    _check_index("snapshot term", meta.term, 1)
    for node in meta.conf_state.voters | meta.conf_state.learners:
        _check_index("member id", node, 1)


# -- the store --------------------------------------------------------------------


class LogStore(Protocol):
    """What the ledger runtime needs of durable storage.

    Reads of a group the store does not host answer as for an empty group
    (first index 1, last index 0, empty hard state, no rows); ``groups()``
    names the hosted ones. A group comes to exist when a committed batch
    writes anything for it, and ends with ``drop_group``.
    """

    def commit(self, batch: WriteBatch) -> None:
        """Make ``batch`` durable; block until it is. Raises what ``submit``'s future does."""
        ...

    def submit(self, batch: WriteBatch) -> Future[None]:
        """Queue ``batch``; the future resolves once it is durable and readable.

        The future fails with ``InvalidArgument`` when the batch contradicts the
        stored log (nothing of it written), and with ``Unavailable`` once a disk
        write or fsync failed: the store then refuses every later write until
        it is reopened (a failed fsync leaves the page cache untrustworthy).
        """
        ...

    def groups(self) -> list[GroupId]: ...

    def has_group(self, group: GroupId) -> bool: ...

    def hard_state(self, group: GroupId) -> HardState: ...

    def snapshot_meta(self, group: GroupId) -> SnapshotMetadata:
        """The last recorded snapshot (checkpoint or installed); index 0 if none."""
        ...

    def first_index(self, group: GroupId) -> LogIndex: ...

    def last_index(self, group: GroupId) -> LogIndex: ...

    def term(self, group: GroupId, index: LogIndex) -> Term:
        """Raises ``Compacted`` below ``first_index - 1``, ``EntriesUnavailable`` past the end."""
        ...

    def entries(self, group: GroupId, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        """Entries in ``[lo, hi)``: at most ``max_bytes`` (``Entry.size_bytes``), at least one."""
        ...

    def entry(self, group: GroupId, index: LogIndex) -> Entry:
        """One entry of the log, or one kept below the first index by a pin."""
        ...

    def kept_indexes(self, group: GroupId) -> frozenset[LogIndex]: ...

    def state_rows(self, group: GroupId) -> list[tuple[bytes, bytes]]:
        """Every state row of the group in byte order of keys."""
        ...

    def state_get(self, group: GroupId, key: bytes) -> bytes | None: ...

    def node_identity(self) -> NodeId | None:
        """The node id this directory belongs to; ``None`` for a blank directory.

        A node that finds ``None`` after it once had an id lost its disk: it must
        rejoin under a new id (DESIGN, "Freezing the ledger").
        """
        ...

    def set_node_identity(self, node: NodeId) -> None:
        """Durably record the id; the same id again is a no-op, another is refused."""
        ...

    def close(self) -> None: ...
