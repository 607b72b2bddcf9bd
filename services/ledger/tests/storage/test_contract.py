"""The LogStore contract, checked on the SQLite store.

Raft's duties on storage: docs/raft.md, "The caller's contract" 5.1 and 6
(persist entries, hard state and snapshot; entries at ``i`` discard those at
``i`` and after; Compacted below the snapshot, EntriesUnavailable past the end).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import Opener
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storemodel import Model, check_equal, entry, open_store, refused

from enroute_core.base.errors import InvalidArgument, LimitExceeded
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft.errors import Compacted, EntriesUnavailable
from enroute_ledger.raft.types import ConfState, HardState, SnapshotMetadata
from enroute_ledger.storage.api import GroupId, WriteBatch

G1 = GroupId(b"team/app", 1)
G2 = GroupId(b"team/app", 2)
G3 = GroupId(b"other", 7)


def meta(index: int, term: int, voters: tuple[int, ...] = (1, 2, 3)) -> SnapshotMetadata:
    return SnapshotMetadata(
        LogIndex(index), Term(term), ConfState(frozenset(NodeId(v) for v in voters))
    )


def test_empty_store_answers_as_empty(opener: Opener) -> None:
    s = opener()
    assert s.groups() == []
    assert not s.has_group(G1)
    assert s.first_index(G1) == 1
    assert s.last_index(G1) == 0
    assert s.term(G1, LogIndex(0)) == 0
    assert s.hard_state(G1) == HardState()
    assert s.state_rows(G1) == []
    assert s.node_identity() is None
    with pytest.raises(EntriesUnavailable):
        s.term(G1, LogIndex(1))


def test_append_read_back_and_reopen(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(1, 1, b"a"), entry(2, 1, b"bb"), entry(3, 2, b"ccc", conf=True)])
    b.set_hard_state(G1, HardState(Term(2), NodeId(3), LogIndex(2)))
    b.put_state(G1, b"refs/heads/main", b"\x01" * 28)
    s.commit(b)
    want = [entry(1, 1, b"a"), entry(2, 1, b"bb"), entry(3, 2, b"ccc", conf=True)]
    for again in (False, True):
        s = _reopen(s, opener) if again else s
        store = s
        assert store.groups() == [G1]
        assert store.entries(G1, LogIndex(1), LogIndex(4), 1 << 20) == want
        assert store.entries(G1, LogIndex(2), LogIndex(3), 1 << 20) == want[1:2]
        assert store.entries(G1, LogIndex(2), LogIndex(2), 1 << 20) == []
        assert store.term(G1, LogIndex(3)) == 2
        assert store.hard_state(G1) == HardState(Term(2), NodeId(3), LogIndex(2))
        assert store.state_get(G1, b"refs/heads/main") == b"\x01" * 28
        with pytest.raises(EntriesUnavailable):
            store.entries(G1, LogIndex(1), LogIndex(5), 1 << 20)
        with pytest.raises(Compacted):
            store.entries(G1, LogIndex(0), LogIndex(2), 1 << 20)


def _reopen(s: Any, opener: Opener) -> Any:
    s.close()
    return opener()


def test_max_bytes_gives_at_least_one_entry(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(i, 1, bytes(100)) for i in range(1, 6)])
    s.commit(b)
    size = entry(1, 1, bytes(100)).size_bytes
    assert len(s.entries(G1, LogIndex(1), LogIndex(6), 0)) == 1
    assert len(s.entries(G1, LogIndex(1), LogIndex(6), size)) == 1
    assert len(s.entries(G1, LogIndex(1), LogIndex(6), 3 * size)) == 3
    assert len(s.entries(G1, LogIndex(1), LogIndex(6), 3 * size - 1)) == 2


def test_conflicting_append_discards_the_suffix(opener: Opener) -> None:
    """Raft §5.3: a conflicting entry and all that follow it are deleted."""
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(i, 1, b"old%d" % i) for i in range(1, 6)])
    s.commit(b)
    b = WriteBatch()
    b.append(G1, [entry(3, 2, b"new3")])
    s.commit(b)
    assert s.last_index(G1) == 3
    assert [e.data for e in s.entries(G1, LogIndex(1), LogIndex(4), 1 << 20)] == [
        b"old1",
        b"old2",
        b"new3",
    ]
    b = WriteBatch()
    b.truncate_suffix(G1, LogIndex(2))
    s.commit(b)
    s = _reopen(s, opener)
    assert s.last_index(G1) == 1
    assert s.term(G1, LogIndex(1)) == 1


def test_hard_state_moves_on_alone(opener: Opener) -> None:
    """Raft §5.1 Figure 2: currentTerm and votedFor are persisted before answering."""
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(1, 1)])
    s.commit(b)
    for hs in (HardState(Term(2), NodeId(1), LogIndex(1)), HardState(Term(3), None, LogIndex(1))):
        b = WriteBatch()
        b.set_hard_state(G1, hs)
        s.commit(b)
        assert s.hard_state(G1) == hs
    s = _reopen(s, opener)
    assert s.hard_state(G1) == HardState(Term(3), None, LogIndex(1))


def test_refused_batch_leaves_no_trace(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(1, 1)])
    s.commit(b)
    bad = WriteBatch()
    bad.append(G2, [entry(1, 1, b"x")])
    bad.put_state(G2, b"k", b"v")
    bad.append(G1, [entry(3, 1)])  # gap: last index is 1
    assert refused(s, bad)
    assert s.groups() == [G1]
    assert s.last_index(G1) == 1
    s = _reopen(s, opener)
    assert s.groups() == [G1]


def test_coalesced_round_refuses_only_the_bad_batch(opener: Opener) -> None:
    s = opener()
    good1, bad, good2 = WriteBatch(), WriteBatch(), WriteBatch()
    good1.append(G1, [entry(1, 1, b"a")])
    bad.append(G1, [entry(2, 1, b"b")])
    bad.truncate_suffix(G1, LogIndex(1))
    bad.compact(G1, LogIndex(1))  # past the snapshot (none): refused
    good2.append(G1, [entry(2, 1, b"c")])
    results = s._run_round([good1, bad, good2])  # one round, as the committer would run it
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], InvalidArgument)
    assert [e.data for e in s.entries(G1, LogIndex(1), LogIndex(3), 1 << 20)] == [b"a", b"c"]
    s = _reopen(s, opener)
    assert [e.data for e in s.entries(G1, LogIndex(1), LogIndex(3), 1 << 20)] == [b"a", b"c"]


def test_install_snapshot_replaces_the_log(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(i, 1) for i in range(1, 4)])
    s.commit(b)
    b = WriteBatch()
    b.install_snapshot(G1, meta(10, 3, voters=(1, 5)))
    b.append(G1, [entry(11, 3, b"after")])
    s.commit(b)
    for again in (False, True):
        s = _reopen(s, opener) if again else s
        store = s
        assert store.first_index(G1) == 11
        assert store.last_index(G1) == 11
        assert store.term(G1, LogIndex(10)) == 3
        assert store.snapshot_meta(G1) == meta(10, 3, voters=(1, 5))
        with pytest.raises(Compacted):
            store.term(G1, LogIndex(9))
    b = WriteBatch()
    b.install_snapshot(G1, meta(10, 3))
    assert refused(s, b)  # not newer than the one held


def test_compaction_keeps_pinned_entries(opener: Opener) -> None:
    """DESIGN, "Freezing the ledger": truncate up to the checkpoint except pinned entries."""
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(i, 1 + i // 4, b"e%d" % i) for i in range(1, 11)])
    s.commit(b)
    b = WriteBatch()
    b.compact(G1, LogIndex(5))
    assert refused(s, b)  # no snapshot recorded yet
    b = WriteBatch()
    b.set_snapshot(G1, meta(6, 2))
    b.compact(G1, LogIndex(6), keep=[LogIndex(2), LogIndex(5), LogIndex(9)])
    s.commit(b)
    for again in (False, True):
        s = _reopen(s, opener) if again else s
        store = s
        assert store.first_index(G1) == 7
        assert store.term(G1, LogIndex(6)) == 2
        assert store.kept_indexes(G1) == {2, 5}
        assert store.entry(G1, LogIndex(5)) == entry(5, 2, b"e5")
        assert store.entry(G1, LogIndex(8)) == entry(8, 3, b"e8")
        with pytest.raises(Compacted):
            store.entry(G1, LogIndex(3))
    b = WriteBatch()
    b.compact(G1, LogIndex(6), keep=[LogIndex(5)])  # releases the pin on 2
    s.commit(b)
    assert s.kept_indexes(G1) == {5}
    b = WriteBatch()
    b.compact(G1, LogIndex(6), keep=[LogIndex(3)])  # 3 is gone already
    assert refused(s, b)
    b = WriteBatch()
    b.set_snapshot(G1, meta(8, 2))  # wrong term: entry 8 has term 3
    assert refused(s, b)


def test_state_rows(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    for k in (b"b", b"a", b"c"):
        b.put_state(G1, k, k * 3)
    b.put_state(G2, b"a", b"other group")
    s.commit(b)
    b = WriteBatch()
    b.delete_state(G1, b"b")
    b.put_state(G1, b"a", b"new")
    s.commit(b)
    for again in (False, True):
        s = _reopen(s, opener) if again else s
        store = s
        assert store.state_rows(G1) == [(b"a", b"new"), (b"c", b"ccc")]
        assert store.state_get(G1, b"b") is None
        assert store.state_rows(G2) == [(b"a", b"other group")]
    b = WriteBatch()
    b.clear_state(G1)
    b.put_state(G1, b"z", b"")
    s.commit(b)
    assert s.state_rows(G1) == [(b"z", b"")]


def test_drop_group_and_recreate(opener: Opener) -> None:
    s = opener()
    b = WriteBatch()
    b.append(G1, [entry(1, 1)])
    b.put_state(G1, b"k", b"v")
    b.set_hard_state(G1, HardState(Term(1), None, LogIndex(1)))
    b.append(G3, [entry(1, 1)])
    s.commit(b)
    b = WriteBatch()
    b.drop_group(G1)
    b.drop_group(G2)  # not hosted: nothing to do
    s.commit(b)
    assert s.groups() == [G3]
    b = WriteBatch()
    b.drop_group(G3)
    b.append(G3, [entry(1, 4, b"again")])
    s.commit(b)
    for again in (False, True):
        s = _reopen(s, opener) if again else s
        store = s
        assert store.groups() == [G3]
        assert store.state_rows(G1) == []
        assert store.hard_state(G1) == HardState()
        assert store.entries(G3, LogIndex(1), LogIndex(2), 100) == [entry(1, 4, b"again")]


def test_node_identity(opener: Opener) -> None:
    """DESIGN, "Freezing the ledger": a blank directory must be detectable."""
    s = opener()
    assert s.node_identity() is None
    s.set_node_identity(NodeId(42))
    s.set_node_identity(NodeId(42))
    with pytest.raises(InvalidArgument):
        s.set_node_identity(NodeId(43))
    s = _reopen(s, opener)
    assert s.node_identity() == 42


def test_batch_checks_before_commit() -> None:
    b = WriteBatch()
    with pytest.raises(InvalidArgument):
        b.append(G1, [entry(1, 1), entry(3, 1)])
    with pytest.raises(InvalidArgument):
        b.append(G1, [entry(1, 0)])
    with pytest.raises(InvalidArgument):
        b.put_state(G1, b"", b"v")
    with pytest.raises(LimitExceeded):
        b.put_state(G1, b"k" * 70_000, b"")
    with pytest.raises(InvalidArgument):
        GroupId(b"", 1)
    with pytest.raises(InvalidArgument):
        GroupId(b"x", 0)
    assert b.ops == []


def test_second_open_of_a_directory_is_refused(opener: Opener) -> None:
    opener()
    with pytest.raises(InvalidArgument):
        opener()


# -- the model ---------------------------------------------------------------------------

GROUPS = (G1, G2, G3)


def _draw_op(data: st.DataObject, model: Model, b: WriteBatch) -> None:
    g = data.draw(st.sampled_from(GROUPS))
    mg = model.groups.get(g)
    base = mg.base if mg else 0
    last = mg.last if mg else 0
    snap = mg.snapshot.index if mg else 0
    kind = data.draw(st.integers(0, 11))
    if kind <= 3:
        start = data.draw(st.integers(max(1, base - 1), last + 2))
        n = data.draw(st.integers(1, 3))
        term = data.draw(st.integers(1, 4))
        b.append(
            g, [entry(i, term, data.draw(st.binary(max_size=40))) for i in range(start, start + n)]
        )
    elif kind == 4:
        b.truncate_suffix(g, LogIndex(data.draw(st.integers(max(1, base), last + 1))))
    elif kind == 5:
        b.set_hard_state(g, HardState(Term(data.draw(st.integers(0, 5))), None, LogIndex(last)))
    elif kind == 6:
        idx = data.draw(st.integers(max(0, base - 1), last + 1))
        real = mg is not None and base <= idx <= last
        term = mg.term(idx) if real and mg and data.draw(st.booleans()) else 1
        b.set_snapshot(g, meta(max(1, idx), max(1, term)))
    elif kind == 7:
        upto = data.draw(st.integers(max(1, base - 1), snap + 1))
        keep = data.draw(st.sets(st.integers(max(1, base - 2), upto + 1), max_size=3))
        b.compact(g, LogIndex(upto), [LogIndex(k) for k in keep])
    elif kind == 8:
        b.install_snapshot(g, meta(data.draw(st.integers(max(1, snap), last + 3)), 5))
    elif kind == 9:
        key = data.draw(st.sampled_from([b"a", b"b", b"refs/heads/main"]))
        if data.draw(st.booleans()):
            b.put_state(g, key, data.draw(st.binary(max_size=30)))
        else:
            b.delete_state(g, key)
    elif kind == 10:
        if data.draw(st.booleans()):
            b.clear_state(g)
        else:
            b.drop_group(g)
    else:
        b.set_node_identity(NodeId(data.draw(st.integers(1, 2))))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_store_matches_the_model(tmp_path: Path, data: st.DataObject) -> None:
    """Random batches against the reference model, with reopens: every read agrees."""
    path = Path(tempfile.mkdtemp(dir=tmp_path))
    model = Model()
    s = open_store(path)
    try:
        for _step in range(data.draw(st.integers(1, 14), label="batches")):
            b = WriteBatch()
            for _ in range(data.draw(st.integers(1, 4))):
                _draw_op(data, model, b)
            ok = model.commit(b)
            assert refused(s, b) != ok
            check_equal(s, model)
            if data.draw(st.integers(0, 4)) == 0:
                s.close()
                s = open_store(path)
                check_equal(s, model)
        s.close()
        s = open_store(path)
        check_equal(s, model)
    finally:
        s.close()
