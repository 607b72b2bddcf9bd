"""What the store keeps in memory per group (issue 19: an idle repository costs a voter
almost nothing; docs/ledger-storage.md, the shapes that answer without a query).

The hard state is kept as its three fields, not as an object per group.

A log whose entries all carry one term (one leader since the last checkpoint: most
idle repositories) keeps that term as one int, not an array of terms, through appends,
truncations, compactions and a reopen; a second term makes it an array, a compaction
past the change one int again. Every read answers as the reference model does.
"""

from __future__ import annotations

from array import array

from conftest import Opener
from storemodel import entry

from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft.types import ConfState, HardState, SnapshotMetadata
from enroute_ledger.storage import SqliteStore
from enroute_ledger.storage.api import GroupId, WriteBatch

G = GroupId(b"team/app", 1)


def terms_of(s: SqliteStore) -> tuple[object, list[int]]:
    """The shape's terms as held, and every term the store answers for the log."""
    held = s._shapes[G].terms
    first, last = s.first_index(G), s.last_index(G)
    return held, [s.term(G, LogIndex(i)) for i in range(first, last + 1)]


def test_a_log_of_one_term_keeps_one_int(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    b.append(G, [entry(i, 2) for i in range(1, 6)])
    s.commit(b)
    assert terms_of(s) == (2, [2] * 5)
    b = WriteBatch()
    b.append(G, [entry(i, 2) for i in range(6, 8)])
    s.commit(b)
    assert terms_of(s) == (2, [2] * 7)
    # a new leader's term: an array, of both terms
    b = WriteBatch()
    b.append(G, [entry(i, 3) for i in range(5, 9)])  # replaces 5..7
    s.commit(b)
    held, terms = terms_of(s)
    assert isinstance(held, array) and terms == [2] * 4 + [3] * 4
    # a truncation back to the first term's entries: one int again
    b = WriteBatch()
    b.truncate_suffix(G, LogIndex(4))
    s.commit(b)
    assert terms_of(s) == (2, [2] * 3)
    b = WriteBatch()
    b.append(G, [entry(i, 4) for i in range(4, 7)])
    s.commit(b)
    assert isinstance(terms_of(s)[0], array)
    # a checkpoint's compaction past the change: one int, and so after a reopen
    b = WriteBatch()
    b.set_snapshot(G, SnapshotMetadata(LogIndex(4), Term(4), ConfState()))
    b.compact(G, LogIndex(4), keep=[])
    s.commit(b)
    assert terms_of(s) == (4, [4, 4])
    assert s.term(G, LogIndex(4)) == 4
    s.close()
    s = opener()
    assert terms_of(s) == (4, [4, 4])
    # the whole log compacted: nothing past the base
    b = WriteBatch()
    b.set_snapshot(G, SnapshotMetadata(LogIndex(6), Term(4), ConfState()))
    b.compact(G, LogIndex(6), keep=[])
    s.commit(b)
    assert terms_of(s) == (0, [])
    assert s.last_index(G) == 6 and s.term(G, LogIndex(6)) == 4
    s.close()
    s = opener()
    assert terms_of(s) == (0, [])
    assert s.last_index(G) == 6 and s.term(G, LogIndex(6)) == 4


def test_mixed_terms_read_back_after_a_reopen(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    b.append(G, [entry(1, 1), entry(2, 1), entry(3, 2), entry(4, 5)])
    s.commit(b)
    s.close()
    s = opener()
    held, terms = terms_of(s)
    assert isinstance(held, array) and terms == [1, 1, 2, 5]


def test_the_hard_state_is_kept_as_fields(opener: Opener) -> None:
    s = opener()
    assert s.hard_state(G) == HardState()
    for hs in (HardState(Term(3), NodeId(2), LogIndex(0)), HardState(Term(4), None, LogIndex(1))):
        b = WriteBatch()
        b.append(G, [entry(1, 3)])
        b.set_hard_state(G, hs)
        s.commit(b)
        assert s.hard_state(G) == hs
        shape = s._shapes[G]
        assert not [a for a in shape.__slots__ if isinstance(getattr(shape, a), HardState)]
        s.close()
        s = opener()
        assert s.hard_state(G) == hs
