"""Each group's log shape in memory, and the checks every batch must pass.

The store keeps, per group, what answers ``first_index``, ``last_index`` and
``term`` without a query: the base (index and term just below the first
entry), the last recorded snapshot, the hard state, the term of every entry
and the terms of entries kept below the base by pins. A write round stages its
batches on :class:`Stage` overlays (cheap: only what the round adds), checking
each operation against the log as the earlier batches of the round leave it;
after the commit, :func:`fold` publishes the stages. Readers see only
published shapes, so nothing uncommitted is ever visible.

Pure: no I/O, so the rules can be tested on their own.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import TypeAlias

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId, Term

from ..raft.errors import Compacted, EntriesUnavailable
from ..raft.types import EMPTY_HARD_STATE, Entry, HardState, SnapshotMetadata

EMPTY_META = SnapshotMetadata()

Terms: TypeAlias = "array[int] | int"
"""A shape's terms: see ``GroupShape.terms``."""


NO_KEPT: dict[int, int] = {}
"""The ``kept`` of every group with no pinned entry below its base: one shared dict.

Never changed in place (every change assigns a new dict, see ``Stage``); an empty
dict per group was 64 bytes of every idle repository's cost on a voter (issue 19)."""


class GroupShape:
    """The published shape of one group; changed only by :func:`fold`, under the store's lock."""

    __slots__ = (
        "base_index",
        "base_term",
        "hs_commit",
        "hs_term",
        "hs_vote",
        "kept",
        "last",
        "rowid",
        "snapshot",
        "terms",
    )

    def __init__(self) -> None:
        self.rowid = 0
        """The group's key in the store's tables (0: none yet); kept here rather than in
        a map of its own, one entry less per hosted group (issue 19)."""
        self.base_index = 0
        self.base_term = 0
        self.snapshot = EMPTY_META
        # the hard state's fields, not the object: 40 bytes less per group (issue 19)
        self.hs_term = 0
        self.hs_vote: int | None = None
        self.hs_commit = 0
        self.last = 0
        self.terms: Terms = 0
        """Terms of the entries ``base_index + 1 .. last``: one int when they all have
        the same (a log with one leader since its last checkpoint, most of them), else
        an array; an array object was 112 bytes of every idle repository (issue 19)."""
        self.kept: dict[int, int] = NO_KEPT
        """Index -> term of the entries kept below the base by pins."""

    @property
    def first_index(self) -> int:
        return self.base_index + 1

    @property
    def last_index(self) -> int:
        return self.last

    @property
    def hard_state(self) -> HardState:
        vote = self.hs_vote
        return HardState(
            Term(self.hs_term), None if vote is None else NodeId(vote), LogIndex(self.hs_commit)
        )

    @hard_state.setter
    def hard_state(self, hs: HardState) -> None:
        self.hs_term, self.hs_vote, self.hs_commit = hs.term, hs.vote, hs.commit

    def term(self, index: int) -> int:
        """Raft's ``term(i)``: ``Compacted`` below the base, ``EntriesUnavailable`` past the end."""
        if index < self.base_index:
            raise Compacted(index)
        if index == self.base_index:
            return self.base_term
        if index > self.last:
            raise EntriesUnavailable(index)
        terms = self.terms
        return terms if isinstance(terms, int) else terms[index - self.base_index - 1]


class Stage:
    """One group's changes within a write round, checked as they are staged.

    ``tail`` holds the terms the round wrote for indexes ``tail_from ..
    last_index``; below ``tail_from`` the published shape answers, unless the
    round replaced the whole log (``log_reset``) or dropped the group.
    """

    __slots__ = (
        "base_index",
        "base_term",
        "exists",
        "hard_state",
        "hs_dirty",
        "kept",
        "last_index",
        "log_reset",
        "meta_dirty",
        "pub",
        "pub_dropped",
        "rowid",
        "snapshot",
        "tail",
        "tail_from",
    )

    def __init__(self, pub: GroupShape | None) -> None:
        self.pub = pub
        self.exists = pub is not None
        self.log_reset = False
        self.pub_dropped = False
        self.meta_dirty = False
        self.hs_dirty = False
        self.tail: list[int] = []
        self.rowid = 0 if pub is None else pub.rowid  # kept through a drop: the same row
        if pub is None:
            self._reset()
        else:
            self.base_index = pub.base_index
            self.base_term = pub.base_term
            self.snapshot = pub.snapshot
            self.hard_state = pub.hard_state
            self.kept = pub.kept  # shared: every change below assigns a new dict
            self.last_index = pub.last_index
            self.tail_from = self.last_index + 1

    def _reset(self) -> None:
        self.base_index = 0
        self.base_term = 0
        self.snapshot = EMPTY_META
        self.hard_state = EMPTY_HARD_STATE
        self.kept = NO_KEPT
        self.last_index = 0
        self.tail_from = 1
        self.tail = []

    def term(self, index: int) -> int:
        """The term of an index the stage holds (``base_index <= index <= last_index``)."""
        assert self.base_index <= index <= self.last_index, (index, self.base_index)
        if index == self.base_index:
            return self.base_term
        if index >= self.tail_from:
            return self.tail[index - self.tail_from]
        assert not self.log_reset and self.pub is not None
        return self.pub.term(index)

    # -- changes: each checks first, then mutates -------------------------------

    @property
    def created(self) -> bool:
        """The group is new in this round (or was dropped and created again)."""
        return self.exists and (self.pub is None or self.pub_dropped)

    def ensure(self) -> None:
        if not self.exists:
            self.exists = True
            self.meta_dirty = True

    def append(self, entries: Sequence[Entry]) -> tuple[Sequence[Entry], int | None]:
        """The entries to write, and the index from which stored entries are discarded."""
        self.ensure()
        first = self.base_index + 1
        if entries[-1].index < first:
            return (), None
        if entries[0].index < first:
            entries = entries[first - entries[0].index :]
        e0 = entries[0].index
        if e0 > self.last_index + 1:
            raise InvalidArgument("append leaves a gap", index=e0, last_index=self.last_index)
        discard = e0 if e0 <= self.last_index else None
        if e0 >= self.tail_from:
            del self.tail[e0 - self.tail_from :]
        else:
            self.tail_from = e0
            self.tail = []
        self.tail.extend(e.term for e in entries)
        self.last_index = entries[-1].index
        return entries, discard

    def truncate_suffix(self, from_index: int) -> bool:
        self.ensure()
        if from_index <= self.base_index:
            raise InvalidArgument(
                "truncation below the first index", index=from_index, first=self.base_index + 1
            )
        if from_index > self.last_index:
            return False
        if from_index >= self.tail_from:
            del self.tail[from_index - self.tail_from :]
        else:
            self.tail_from = from_index
            self.tail = []
        self.last_index = from_index - 1
        return True

    def set_hard_state(self, hs: HardState) -> None:
        self.ensure()
        self.hard_state = hs
        self.hs_dirty = True

    def install_snapshot(self, meta: SnapshotMetadata) -> None:
        self.ensure()
        if meta.index <= self.snapshot.index:
            raise InvalidArgument(
                "snapshot is older than the one held", index=meta.index, held=self.snapshot.index
            )
        self.base_index = meta.index
        self.base_term = meta.term
        self.snapshot = meta
        self.kept = NO_KEPT
        self.last_index = meta.index
        self.tail_from = meta.index + 1
        self.tail = []
        self.log_reset = True
        self.meta_dirty = True

    def set_snapshot(self, meta: SnapshotMetadata) -> None:
        self.ensure()
        if meta.index < self.snapshot.index:
            raise InvalidArgument("snapshot goes back", index=meta.index, held=self.snapshot.index)
        if not self.base_index <= meta.index <= self.last_index:
            raise InvalidArgument(
                "snapshot index outside the log",
                index=meta.index,
                first=self.base_index + 1,
                last=self.last_index,
            )
        if self.term(meta.index) != meta.term:
            raise InvalidArgument(
                "snapshot term differs from the log's", index=meta.index, term=meta.term
            )
        self.snapshot = meta
        self.meta_dirty = True

    def compact(self, upto: int, keep: Iterable[int]) -> None:
        self.ensure()
        if upto > self.snapshot.index:
            raise InvalidArgument(
                "compaction past the snapshot", index=upto, snapshot=self.snapshot.index
            )
        upto = max(upto, self.base_index)
        kept: dict[int, int] = {}
        for k in keep:
            if k > upto:
                continue
            if k > self.base_index:
                kept[k] = self.term(k)
            elif k in self.kept:
                kept[k] = self.kept[k]
            else:
                raise InvalidArgument("kept entry is gone", index=k)
        if upto > self.base_index:
            self.base_term = self.term(upto)
            self.base_index = upto
        self.kept = kept or NO_KEPT
        self.meta_dirty = True

    def drop(self) -> bool:
        if not self.exists:
            return False
        self.exists = False
        self.log_reset = True
        self.pub_dropped = self.pub is not None
        self.meta_dirty = False
        self.hs_dirty = False
        self._reset()
        return True


def pack_terms(terms: array[int]) -> Terms:
    """One int for terms that are all the same (an empty log's: 0), else the array."""
    if not terms:
        return 0
    first = terms[0]
    # a log's terms never go down, so unequal ends settle it without the count
    if first == terms[-1] and terms.count(first) == len(terms):
        return first
    return terms


def _splice(terms: Terms, held: int, keep: int, tail: list[int]) -> Terms:
    """The ``held`` terms cut to their first ``keep``, then ``tail``; an array is changed
    in place (it is the published shape's, under the store's lock)."""
    if isinstance(terms, int):
        if keep == 0:
            return pack_terms(array("q", tail))
        if all(t == terms for t in tail):
            return terms
        out = array("q", [terms]) * held
    else:
        out = terms
    del out[keep:]
    out.extend(tail)
    return out


def fold(stage: Stage) -> GroupShape | None:
    """Publish a stage: the group's new shape, or ``None`` when the group is gone."""
    if not stage.exists:
        return None
    shape = stage.pub
    terms: Terms
    if shape is None or stage.pub_dropped or stage.log_reset:
        shape = shape if shape is not None and not stage.pub_dropped else GroupShape()
        terms = array("q", stage.tail)
        start = stage.tail_from - 1
    else:
        start = shape.base_index
        terms = _splice(shape.terms, shape.last - start, stage.tail_from - start - 1, stage.tail)
    if not isinstance(terms, int):
        del terms[: stage.base_index - start]
        terms = pack_terms(terms)
    elif stage.last_index == stage.base_index:
        terms = 0
    shape.terms = terms
    shape.last = stage.last_index
    shape.base_index = stage.base_index
    shape.base_term = stage.base_term
    shape.snapshot = stage.snapshot
    shape.hard_state = stage.hard_state
    shape.kept = stage.kept
    shape.rowid = stage.rowid
    return shape
