"""RawNode and the Ready contract of docs/raft.md (persist, then send, then apply, then advance)."""

from __future__ import annotations

import pytest
from raftnet import MT, ids, msg

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    RaftConfig,
    RawNode,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMetadata,
    SoftState,
)


def _node(
    node: int = 1, peers: tuple[int, ...] = (1,), *, pre_vote: bool = False, **kw: int
) -> tuple[RawNode, MemoryStorage]:
    st = MemoryStorage(conf_state=ConfState(ids(*peers)))
    cfg = RaftConfig(NodeId(node), pre_vote=pre_vote, **kw)  # type: ignore[arg-type]
    return RawNode(cfg, st), st


def _handle(rn: RawNode, st: MemoryStorage) -> Ready:
    """One turn of a well-behaved driver."""
    rd = rn.ready()
    if rd.snapshot is not None:
        st.apply_snapshot(rd.snapshot)
    st.append(rd.entries)
    if rd.hard_state is not None:
        st.set_hard_state(rd.hard_state)
    for e in rd.committed_entries:
        if e.type is EntryType.CONF_CHANGE:
            rn.apply_conf_change(ConfChange.decode(e.data))
    rn.advance(rd)
    return rd


def test_single_node_campaign_ready() -> None:
    rn, _ = _node()
    assert not rn.has_ready()
    rn.campaign()
    assert rn.has_ready()
    rd = rn.ready()
    assert rd.soft_state == SoftState(NodeId(1), Role.LEADER)
    assert rd.hard_state == HardState(Term(1), NodeId(1), LogIndex(1))
    assert rd.entries == (Entry(Term(1), LogIndex(1)),)
    # Committed in the same Ready that carries it unpersisted: apply only after persisting.
    assert rd.committed_entries == (Entry(Term(1), LogIndex(1)),)
    assert rd.must_sync and rd.messages == ()


def test_no_second_ready_until_advance() -> None:
    rn, st = _node()
    rn.campaign()
    rd = rn.ready()
    rn.propose(b"more")
    assert not rn.has_ready()
    with pytest.raises(AssertionError):
        rn.ready()
    st.append(rd.entries)
    rn.advance(rd)
    assert rn.has_ready()


def test_advance_moves_entries_to_storage_and_applied() -> None:
    rn, st = _node()
    rn.campaign()
    _handle(rn, st)
    rn.propose(b"a")
    rd = _handle(rn, st)
    assert [e.data for e in rd.entries] == [b"a"]
    assert rn.raft.log.unstable_entries() == ()
    assert rn.raft.log.applied == 2
    assert st.last_index() == 2
    assert not rn.has_ready()


def test_hard_state_only_when_changed_and_commit_only_needs_no_sync() -> None:
    rn, st = _node(1, (1, 2))
    rn.campaign()
    rd = _handle(rn, st)
    assert rd.hard_state is not None and rd.must_sync
    rn.step(msg(MT.VOTE_RESP, 2, 1, term=Term(1)))
    rd = _handle(rn, st)  # leader: appends its empty entry, probes node 2
    assert rd.hard_state is None and rd.entries and rd.messages
    rn.step(msg(MT.APP_RESP, 2, 1, term=Term(1), index=LogIndex(1)))
    rd = _handle(rn, st)
    assert rd.hard_state == HardState(Term(1), NodeId(1), LogIndex(1))
    assert not rd.must_sync and not rd.entries


def test_messages_leave_through_ready() -> None:
    rn, _ = _node(1, (1, 2, 3))
    rn.campaign()
    rd = rn.ready()
    assert {(m.type, m.to) for m in rd.messages} == {(MT.VOTE, 2), (MT.VOTE, 3)}
    assert rd.hard_state is not None and rd.hard_state.vote == 1  # persisted before sending


def test_restart_applies_only_past_applied() -> None:
    st = MemoryStorage(conf_state=ConfState(ids(1)))
    st.append([Entry(Term(1), LogIndex(i), data=bytes([i])) for i in (1, 2, 3)])
    st.set_hard_state(HardState(Term(1), NodeId(1), LogIndex(3)))
    rn = RawNode(RaftConfig(NodeId(1), applied=LogIndex(1)), st)
    rd = rn.ready()
    assert [e.index for e in rd.committed_entries] == [2, 3]
    assert rd.hard_state is None  # nothing changed since it was loaded
    rn.advance(rd)
    assert not rn.has_ready()


def test_restart_with_applied_past_commit_is_refused() -> None:
    st = MemoryStorage(conf_state=ConfState(ids(1)))
    st.append([Entry(Term(1), LogIndex(1))])
    st.set_hard_state(HardState(Term(1), NodeId(1), LogIndex(1)))
    with pytest.raises(InvalidArgument):
        RawNode(RaftConfig(NodeId(1), applied=LogIndex(2)), st)


def test_read_index_comes_back_as_read_state() -> None:
    rn, st = _node()
    rn.campaign()
    _handle(rn, st)
    rn.read_index(b"ctx")
    rd = _handle(rn, st)
    assert rd.read_states == (ReadState(LogIndex(1), b"ctx"),)
    with pytest.raises(InvalidArgument):
        rn.read_index(b"")


def test_step_refuses_local_types_and_misaddressed_messages() -> None:
    rn, _ = _node(1, (1, 2))
    with pytest.raises(InvalidArgument):
        rn.step(Message(MT.HUP, NodeId(1), NodeId(2)))
    with pytest.raises(InvalidArgument):
        rn.step(Message(MT.APP, NodeId(3), NodeId(2)))


def test_step_ignores_answers_from_strangers_and_dropped_forwards() -> None:
    rn, _ = _node(1, (1, 2))
    rn.step(msg(MT.APP_RESP, 9, 1, term=Term(1)))
    assert not rn.has_ready()
    rn.step(Message(MT.PROP, NodeId(1), NodeId(2), entries=(Entry(Term(0), LogIndex(0)),)))
    assert not rn.has_ready()  # no leader: a forwarded proposal is dropped quietly


def test_conf_change_through_the_log() -> None:
    rn, st = _node()
    rn.campaign()
    _handle(rn, st)
    rn.propose_conf_change(ConfChange(ConfChangeType.ADD_NODE, NodeId(2)))
    rd = _handle(rn, st)
    assert [e.type for e in rd.committed_entries] == [EntryType.CONF_CHANGE]
    assert rn.raft.tracker.voters == {1, 2}
    rn.propose(b"needs two now")
    rd = _handle(rn, st)
    assert rd.committed_entries == ()
    assert {m.to for m in rd.messages} == {2}


def test_snapshot_in_ready_sets_applied() -> None:
    rn, st = _node(2, (1, 2))
    cs = ConfState(ids(1, 2))
    snap = Snapshot(SnapshotMetadata(LogIndex(10), Term(3), cs), b"app state")
    rn.step(msg(MT.SNAP, 1, 2, term=Term(3), snapshot=snap))
    rd = _handle(rn, st)
    assert rd.snapshot == snap and rd.committed_entries == ()
    assert rn.raft.log.applied == 10 and st.first_index() == 11
    assert [(m.type, m.index) for m in rd.messages] == [(MT.APP_RESP, 10)]


def test_status_reports_progress_on_the_leader() -> None:
    rn, st = _node(1, (1, 2))
    assert rn.status().progress == {}
    rn.campaign()
    _handle(rn, st)
    rn.step(msg(MT.VOTE_RESP, 2, 1, term=Term(1)))
    s = rn.status()
    assert s.soft_state.role is Role.LEADER and set(s.progress) == {1, 2}


def test_quiesced_node_ignores_ticks() -> None:
    rn, st = _node(2, (1, 2), election_ticks=5)
    rn.step(msg(MT.HEARTBEAT, 1, 2, term=Term(1), quiesce=True))
    _handle(rn, st)
    assert rn.quiesced
    for _ in range(100):
        rn.tick()
    assert rn.raft.role is Role.FOLLOWER and rn.raft.term == 1
    rn.unquiesce()
    for _ in range(10):
        rn.tick()
    assert rn.raft.role is Role.CANDIDATE


def test_propose_batch_needs_entries() -> None:
    rn, _ = _node()
    with pytest.raises(InvalidArgument):
        rn.propose_batch([])


def test_snapshot_ready_must_sync() -> None:
    rn, _ = _node(2, (1, 2))
    snap = Snapshot(SnapshotMetadata(LogIndex(4), Term(2), ConfState(ids(1, 2))), b"s")
    rn.step(msg(MT.SNAP, 1, 2, term=Term(2), snapshot=snap))
    assert rn.ready().must_sync


def test_restart_with_commit_behind_the_snapshot() -> None:
    """A commit-only hard state is not synced, so it may lag the snapshot after a crash."""
    st = MemoryStorage()
    st.apply_snapshot(Snapshot(SnapshotMetadata(LogIndex(5), Term(2), ConfState(ids(1))), b""))
    st.set_hard_state(HardState(Term(2), None, LogIndex(3)))
    rn = RawNode(RaftConfig(NodeId(1), applied=LogIndex(5)), st)
    assert rn.raft.log.committed == 5
