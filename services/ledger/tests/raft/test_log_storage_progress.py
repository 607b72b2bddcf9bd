"""The log (stable + unstable), MemoryStorage's contract, and per-follower progress."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from raftnet import ids, storage_with

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import (
    Compacted,
    ConfState,
    EntriesUnavailable,
    Entry,
    MemoryStorage,
    Snapshot,
    SnapshotMetadata,
    SnapshotOutOfDate,
)
from enroute_ledger.raft.log import RaftLog
from enroute_ledger.raft.progress import Inflights, Progress, ProgressState, ProgressTracker


def ent(i: int, t: int, data: bytes = b"") -> Entry:
    return Entry(Term(t), LogIndex(i), data=data)


# -- MemoryStorage ---------------------------------------------------------------------------------


def test_storage_entries_terms_and_bounds() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 2)], [1])
    assert (s.first_index(), s.last_index()) == (1, 3)
    assert s.term(LogIndex(0)) == 0 and s.term(LogIndex(3)) == 2
    assert s.entries(LogIndex(1), LogIndex(4), 1 << 20) == [ent(1, 1), ent(2, 1), ent(3, 2)]
    assert s.entries(LogIndex(1), LogIndex(4), 1) == [ent(1, 1)]  # never less than one
    with pytest.raises(EntriesUnavailable):
        s.term(LogIndex(4))
    with pytest.raises(EntriesUnavailable):
        s.entries(LogIndex(2), LogIndex(5), 100)


def test_storage_compaction_and_snapshots() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 2), (4, 2)], [1, 2])
    snap = s.create_snapshot(LogIndex(2), ConfState(ids(1, 2)), b"app")
    assert (snap.index, snap.term, snap.data) == (2, 1, b"app")
    s.compact(LogIndex(2))
    assert s.first_index() == 3 and s.term(LogIndex(2)) == 1
    with pytest.raises(Compacted):
        s.term(LogIndex(1))
    with pytest.raises(Compacted):
        s.entries(LogIndex(2), LogIndex(4), 100)
    with pytest.raises(Compacted):
        s.compact(LogIndex(2))
    with pytest.raises(SnapshotOutOfDate):
        s.create_snapshot(LogIndex(2), ConfState(), b"")
    with pytest.raises(InvalidArgument):
        s.create_snapshot(LogIndex(9), ConfState(), b"")
    assert s.initial_state()[1] == ConfState(ids(1, 2))


def test_storage_apply_snapshot_replaces_everything() -> None:
    s = storage_with([(1, 1), (2, 1)], [1])
    snap = Snapshot(SnapshotMetadata(LogIndex(5), Term(3), ConfState(ids(1, 2))), b"x")
    s.apply_snapshot(snap)
    assert (s.first_index(), s.last_index()) == (6, 5)
    with pytest.raises(SnapshotOutOfDate):
        s.apply_snapshot(snap)


def test_storage_append_truncates_and_refuses_gaps() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 1)], [1])
    s.append([ent(2, 2)])
    assert [e.term for e in s.entries(LogIndex(1), LogIndex(3), 100)] == [1, 2]
    with pytest.raises(InvalidArgument):
        s.append([ent(5, 2)])


@given(
    st.lists(
        st.tuples(st.integers(1, 12), st.integers(1, 4), st.integers(1, 5)), min_size=1, max_size=30
    )
)
def test_storage_append_matches_a_list_model(writes: list[tuple[int, int, int]]) -> None:
    """Appending at index i replaces everything from i on, as the contract says."""
    s = MemoryStorage()
    model: list[Entry] = []
    for start, term, count in writes:
        if start > len(model) + 1:
            continue
        batch = [ent(start + k, term) for k in range(count)]
        s.append(batch)
        model = model[: start - 1] + batch
    assert s.last_index() == len(model)
    if model:
        assert s.entries(LogIndex(1), LogIndex(len(model) + 1), 1 << 30) == model


# -- RaftLog ---------------------------------------------------------------------------------------


def _log(stable: list[tuple[int, int]]) -> RaftLog:
    return RaftLog(storage_with(stable, [1]), 1 << 20)


def test_log_reads_across_stable_and_unstable() -> None:
    log = _log([(1, 1), (2, 1)])
    log.append([ent(3, 2, b"a"), ent(4, 2, b"b")])
    assert log.last_index() == 4 and log.term(LogIndex(3)) == 2
    assert [e.index for e in log.slice(LogIndex(2), LogIndex(5), 1 << 20)] == [2, 3, 4]
    assert [e.index for e in log.slice(LogIndex(1), LogIndex(5), 1)] == [1]
    log.stable_to(LogIndex(3), Term(2))
    assert [e.index for e in log.unstable_entries()] == [4]


def test_log_stable_to_ignores_a_replaced_entry() -> None:
    log = _log([])
    log.append([ent(1, 1)])
    log.append([ent(1, 2)])  # replaced before the first write was acknowledged
    log.stable_to(LogIndex(1), Term(1))
    assert log.unstable_entries() == (ent(1, 2),)


def test_log_maybe_append_and_conflicts() -> None:
    log = _log([(1, 1), (2, 2), (3, 2)])
    assert log.maybe_append(LogIndex(1), Term(2), LogIndex(0), ()) is None
    assert log.maybe_append(LogIndex(1), Term(1), LogIndex(2), (ent(2, 3),)) == 2
    assert [(e.index, e.term) for e in log.all_entries()] == [(1, 1), (2, 3)]
    assert log.committed == 2
    with pytest.raises(AssertionError):
        log.maybe_append(LogIndex(1), Term(1), LogIndex(2), (ent(2, 4),))  # conflicts with commit


@pytest.mark.parametrize(
    ("index", "term", "want"),
    [(6, 3, (6, 3)), (6, 2, (3, 2)), (6, 1, (1, 1)), (6, 0, (0, 0)), (2, 9, (2, 2))],
)
def test_log_find_conflict_by_term(index: int, term: int, want: tuple[int, int]) -> None:
    log = _log([(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 3)])
    assert log.find_conflict_by_term(LogIndex(index), Term(term)) == want


def test_log_committed_entries_wait_for_a_pending_snapshot() -> None:
    log = _log([(1, 1), (2, 1)])
    log.commit_to(LogIndex(2))
    assert [e.index for e in log.next_committed_entries()] == [1, 2]
    log.restore(Snapshot(SnapshotMetadata(LogIndex(7), Term(2)), b""))
    assert log.next_committed_entries() == [] and log.committed == 7
    assert log.first_index() == 8 and log.term(LogIndex(7)) == 2
    with pytest.raises(Compacted):
        log.term(LogIndex(3))


def test_log_commit_only_in_current_term_by_counting() -> None:
    log = _log([(1, 1), (2, 2)])
    assert not log.maybe_commit(LogIndex(1), Term(2))
    assert log.maybe_commit(LogIndex(2), Term(2)) and log.committed == 2


# -- Progress --------------------------------------------------------------------------------------


def _pr(next_index: int = 5, count: int = 3, size: int = 1000) -> Progress:
    return Progress(LogIndex(next_index), Inflights(count, size))


def test_inflights_count_and_bytes() -> None:
    inf = Inflights(3, 100)
    inf.add(LogIndex(1), 10)
    inf.add(LogIndex(2), 95)
    assert inf.full()  # bytes
    inf.free_le(LogIndex(1))
    assert not inf.full() and inf.bytes == 95
    inf.add(LogIndex(3), 1)
    inf.free_first_one()
    assert len(inf) == 1 and inf.bytes == 1
    with pytest.raises(AssertionError):
        inf.add(LogIndex(2), 1)  # indexes only grow


def test_progress_probe_backoff_uses_the_hint() -> None:
    pr = _pr(next_index=10)
    assert not pr.maybe_decr_to(LogIndex(5), LogIndex(2))  # stale: not our last probe
    assert pr.maybe_decr_to(LogIndex(9), LogIndex(3))
    assert pr.next == 4


def test_progress_replicate_is_optimistic_and_bounded() -> None:
    pr = _pr(next_index=5, count=2)
    pr.maybe_update(LogIndex(4))
    pr.become_replicate()
    pr.sent_entries(LogIndex(7), 3, 30)
    pr.sent_entries(LogIndex(9), 2, 20)
    assert pr.next == 10 and pr.is_paused()
    assert not pr.maybe_decr_to(LogIndex(3), LogIndex(0))  # below match: stale
    assert pr.maybe_decr_to(LogIndex(7), LogIndex(0)) and pr.next == 5


def test_progress_snapshot_then_probe_resumes_after_it() -> None:
    pr = _pr()
    pr.become_snapshot(LogIndex(20))
    assert pr.is_paused() and pr.state is ProgressState.SNAPSHOT
    pr.become_probe()
    assert pr.next == 21


def test_tracker_commit_index_is_the_quorum_match() -> None:
    tr = ProgressTracker(4, 1000)
    for n, match in ((1, 5), (2, 3), (3, 9), (4, 1), (5, 7)):
        tr.voters |= {NodeId(n)}
        tr.progress[NodeId(n)] = tr.new_progress(LogIndex(1), is_learner=False)
        tr.progress[NodeId(n)].match = LogIndex(match)
    assert tr.committed() == 5
    tr.learners |= {NodeId(6)}
    tr.progress[NodeId(6)] = tr.new_progress(LogIndex(1), is_learner=True)
    tr.progress[NodeId(6)].match = LogIndex(100)
    assert tr.committed() == 5
