"""The extensions beyond the paper's core, each test naming the section of the paper or
of Ongaro's thesis ("Consensus: Bridging Theory and Practice") it checks."""

from __future__ import annotations

import pytest
from raftnet import MT, Network, hup, msg, new_raft, persist, prop, read, storage_with

from enroute_core.base.errors import InvalidArgument, ProposalDropped
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import (
    TRANSFER_CONTEXT,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    ProgressState,
    Raft,
    RaftConfig,
    ReadState,
    Role,
    SplitMix64,
)


def _elect(net: Network, node: int = 1) -> Raft:
    net.send(hup(node))
    r = net[node]
    assert r.role is Role.LEADER
    return r


def _read(node: int, ctx: bytes) -> Message:
    return Message(MT.READ_INDEX, NodeId(node), NodeId(node), context=ctx)


def _conf(node: int, cc: ConfChange) -> Message:
    ent = Entry(Term(0), LogIndex(0), EntryType.CONF_CHANGE, cc.encode())
    return Message(MT.PROP, NodeId(node), NodeId(node), entries=(ent,))


def _transfer(leader: int, to: int) -> Message:
    return Message(MT.TRANSFER_LEADER, NodeId(leader), NodeId(to))


def _commit_all(r: Raft) -> None:
    """Pretend the caller applied everything committed."""
    r.log.applied_to(r.log.committed)


# -- §9.6 PreVote ---------------------------------------------------------------------------------


def test_9_6_prevote_does_not_raise_terms_when_it_cannot_win() -> None:
    """Thesis §9.6: a server that rejoins after a partition asks first whether it could win;
    it cannot (the others' logs are ahead), so nobody's term moves."""
    net = Network(None, None, None, pre_vote=True)
    _elect(net)
    net.send(prop(1, b"x"))
    net.isolate(3)
    net.send(prop(1, b"y"))
    for _ in range(50):
        net.tick(3)
    assert net[3].term == 1 and net[3].role is Role.PRE_CANDIDATE
    net.recover()
    net.tick(3, 30)
    assert net[1].role is Role.LEADER and net[1].term == 1
    assert net[3].term == 1


def test_9_6_prevote_without_it_the_rejoining_node_disrupts() -> None:
    """Thesis §9.6, the problem PreVote solves: without it the isolated node's term runs
    ahead and its return deposes the leader."""
    net = Network(None, None, None)
    _elect(net)
    net.isolate(3)
    for _ in range(50):
        net.tick(3)
    assert net[3].term > 1
    net.recover()
    net.tick(3, 20)  # its next campaign reaches the leader
    assert (net[1].term > 1 and net[1].role is not Role.LEADER) or net[1].term > 2


def test_9_6_prevote_is_granted_without_changing_vote_or_term() -> None:
    """Thesis §9.6: a pre-vote is answered in the pre-candidate's next term, and the voter
    keeps its term and its vote."""
    r = new_raft(1, [1, 2, 3], pre_vote=True)
    r.become_follower(Term(2), None)
    r.vote = NodeId(3)
    r.step(msg(MT.PRE_VOTE, 2, 1, term=Term(3), index=LogIndex(0), log_term=Term(0)))
    [resp] = read(r)
    assert (resp.type, resp.reject, resp.term) == (MT.PRE_VOTE_RESP, False, 3)
    assert (r.term, r.vote) == (2, 3)


def test_9_6_precandidate_becomes_candidate_after_quorum() -> None:
    r = new_raft(1, [1, 2, 3], pre_vote=True)
    r.step(hup(1))
    assert r.role is Role.PRE_CANDIDATE and r.term == 0
    assert {m.type for m in read(r)} == {MT.PRE_VOTE}
    r.step(msg(MT.PRE_VOTE_RESP, 2, 1, term=Term(1)))
    assert r.role is Role.CANDIDATE and r.term == 1
    assert {m.type for m in read(r)} == {MT.VOTE}


# -- CheckQuorum and the leader lease (thesis §6.2, §4.2.3) ----------------------------------------


def test_6_2_leader_steps_down_without_quorum_contact() -> None:
    """Thesis §6.2: a leader steps down if an election timeout passes without a successful
    round of heartbeats to a majority."""
    net = Network(None, None, None, check_quorum=True)
    lead = _elect(net)
    net.isolate(1)
    for _ in range(2 * 10 + 1):
        net.tick(1)
    assert lead.role is Role.FOLLOWER


def test_6_2_leader_with_quorum_contact_stays() -> None:
    net = Network(None, None, None, check_quorum=True)
    lead = _elect(net)
    net.isolate(3)
    for _ in range(5 * 10):
        net.tick(1)
    assert lead.role is Role.LEADER


def test_4_2_3_follower_with_live_leader_ignores_votes() -> None:
    """Thesis §4.2.3: within the minimum election timeout of hearing from a leader a server
    neither updates its term nor grants its vote."""
    net = Network(None, None, None, check_quorum=True)
    _elect(net)
    f = net[2]
    f.step(msg(MT.VOTE, 3, 2, term=Term(5), index=LogIndex(5), log_term=Term(5)))
    assert read(f) == []
    assert f.term == 1 and f.vote == 1


def test_4_2_3_lease_expires_after_election_timeout() -> None:
    net = Network(None, None, None, check_quorum=True)
    _elect(net)
    f = net[2]
    for _ in range(10):
        f.tick()
    read(f)
    f.step(msg(MT.VOTE, 3, 2, term=Term(5), index=LogIndex(5), log_term=Term(5)))
    [resp] = read(f)
    assert not resp.reject and f.term == 5


def test_3_10_transfer_vote_passes_the_lease() -> None:
    """Thesis §3.10: a vote request caused by a leadership transfer is not held off by leases."""
    net = Network(None, None, None, check_quorum=True)
    _elect(net)
    f = net[2]
    f.step(
        msg(
            MT.VOTE,
            3,
            2,
            term=Term(2),
            index=LogIndex(5),
            log_term=Term(5),
            context=TRANSFER_CONTEXT,
        )
    )
    [resp] = read(f)
    assert not resp.reject and f.vote == 3


def test_stale_leader_learns_the_new_term_from_its_followers() -> None:
    """With leases a deposed leader's heartbeats are answered with the new term."""
    net = Network(None, None, None, check_quorum=True, pre_vote=True)
    _elect(net)
    net.isolate(1)
    for _ in range(40):
        net.tick(2)
        net.tick(3)
    assert any(net[n].role is Role.LEADER for n in (2, 3))
    net.recover()
    net.tick(1)  # heartbeat at the old term
    assert net[1].role is Role.FOLLOWER and net[1].term > 1


# -- ReadIndex (thesis §6.4) ----------------------------------------------------------------------


def test_6_4_read_index_on_leader_waits_for_heartbeat_quorum() -> None:
    """Thesis §6.4: record the commit index, confirm leadership with a heartbeat round,
    then the read may proceed at the recorded index."""
    net = Network(None, None, None)
    lead = _elect(net)
    net.send(prop(1, b"x"))
    net.ignore(MT.HEARTBEAT_RESP)
    net.send(_read(1, b"r1"))
    assert lead.read_states == []
    net.recover()
    net.send(_read(1, b"r2"))
    assert lead.read_states == [
        ReadState(lead.log.committed, b"r1"),
        ReadState(lead.log.committed, b"r2"),
    ]


def test_6_4_read_index_from_follower_is_forwarded() -> None:
    net = Network(None, None, None)
    lead = _elect(net)
    net.send(prop(1, b"x"))
    net.send(_read(2, b"from-follower"))
    assert net[2].read_states == [ReadState(lead.log.committed, b"from-follower")]
    assert lead.read_states == []


def test_6_4_new_leader_defers_reads_until_it_commits_in_its_term() -> None:
    """Thesis §6.4 step 1: a new leader's commit index may be stale until it commits the
    entry of its own term."""
    net = Network(None, None, None)
    net.ignore(MT.APP)
    lead = _elect(net)
    net.send(_read(1, b"early"))
    assert lead.read_states == [] and len(lead.pending_read_msgs) == 1
    net.recover()
    net.tick(1)  # a heartbeat round lets the stalled probes through; the entry commits
    assert [rs.context for rs in lead.read_states] == [b"early"]
    assert lead.read_states[0].index >= 1


def test_6_4_single_node_reads_at_once() -> None:
    r = new_raft(1, [1])
    r.step(hup(1))
    r.step(_read(1, b"solo"))
    assert r.read_states == [ReadState(r.log.committed, b"solo")]


def test_6_4_read_without_leader_is_dropped() -> None:
    r = new_raft(1, [1, 2, 3])
    with pytest.raises(ProposalDropped):
        r.step(_read(1, b"nobody"))


def test_6_4_pending_reads_are_bounded() -> None:
    net = Network(None, None, None)
    net.peers[NodeId(1)] = new_raft(1, [1, 2, 3], pending_reads_max=2)
    lead = _elect(net)
    net.send(prop(1, b"x"))
    net.ignore(MT.HEARTBEAT_RESP)
    net.send(_read(1, b"a"), _read(1, b"b"))
    with pytest.raises(ProposalDropped):
        lead.step(_read(1, b"c"))


# -- leadership transfer (thesis §3.10) ------------------------------------------------------------


def test_3_10_transfer_to_up_to_date_follower() -> None:
    net = Network(None, None, None)
    _elect(net)
    net.send(_transfer(1, 2))
    assert net[2].role is Role.LEADER and net[1].role is Role.FOLLOWER
    assert net[1].lead == 2


def test_3_10_transfer_to_lagging_follower_catches_it_up_first() -> None:
    net = Network(None, None, None)
    _elect(net)
    net.isolate(3)
    net.send(prop(1, b"a"), prop(1, b"b"))
    net.recover()
    net.ignore(MT.APP)
    net.send(_transfer(1, 3))
    assert net[1].lead_transferee == 3 and net[1].role is Role.LEADER
    net.recover()
    net.send(msg(MT.HEARTBEAT_RESP, 3, 1, term=net[1].term))
    assert net[3].role is Role.LEADER


def test_3_10_proposals_are_dropped_during_transfer() -> None:
    net = Network(None, None, None)
    lead = _elect(net)
    net.ignore(MT.TIMEOUT_NOW)
    net.send(_transfer(1, 2))
    assert lead.lead_transferee == 2
    with pytest.raises(ProposalDropped) as err:
        lead.step(prop(1, b"x"))
    assert err.value.details["reason"] == "leader_transfer_in_progress"


def test_3_10_transfer_aborts_after_an_election_timeout() -> None:
    net = Network(None, None, None)
    lead = _elect(net)
    net.ignore(MT.TIMEOUT_NOW)
    net.send(_transfer(1, 2))
    for _ in range(10):
        lead.tick()
        read(lead)
    assert lead.lead_transferee is None and lead.role is Role.LEADER
    lead.step(prop(1, b"accepted again"))


def test_3_10_transfer_to_self_or_learner_is_ignored() -> None:
    r = new_raft(1, [1, 2], learners=[3])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.step(_transfer(1, 1))
    r.step(_transfer(1, 3))
    assert r.lead_transferee is None


def test_3_10_follower_forwards_transfer_to_leader() -> None:
    net = Network(None, None, None)
    _elect(net)
    net.send(_transfer(2, 3))
    assert net[3].role is Role.LEADER


# -- membership changes (paper §6, thesis §4.1) ----------------------------------------------------


def test_6_added_node_counts_in_the_quorum_once_applied() -> None:
    r = new_raft(1, [1, 2])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.apply_conf_change(ConfChange(ConfChangeType.ADD_NODE, NodeId(3)))
    assert r.tracker.voters == {1, 2, 3}
    assert r.tracker.progress[NodeId(3)].match == 0
    read(r)
    r.step(prop(1, b"x"))
    li = r.log.last_index()
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=li))
    assert r.log.committed == li  # 2 of 3


def test_6_removed_node_shrinks_the_quorum() -> None:
    r = new_raft(1, [1, 2, 3])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.step(prop(1, b"x"))
    committed = r.log.committed
    r.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, NodeId(2)))
    r.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, NodeId(3)))
    assert r.log.committed > committed  # a single voter commits alone


def test_4_1_one_conf_change_at_a_time() -> None:
    """Thesis §4.1: a new change may be proposed only once the previous one applied."""
    r = new_raft(1, [1, 2, 3])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=r.log.last_index()))  # its empty entry
    _commit_all(r)
    r.step(_conf(1, ConfChange(ConfChangeType.ADD_NODE, NodeId(4))))
    with pytest.raises(ProposalDropped) as err:
        r.step(_conf(1, ConfChange(ConfChangeType.ADD_NODE, NodeId(5))))
    assert err.value.details["reason"] == "conf_change_pending"
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=r.log.last_index()))
    _commit_all(r)
    r.step(_conf(1, ConfChange(ConfChangeType.ADD_NODE, NodeId(5))))


def test_4_1_a_leader_commits_an_entry_of_its_term_before_a_change() -> None:
    """Ongaro's correction to single-server changes (raft-dev, "bug in single-server
    membership changes", 2015; docs/raft.md, "Membership changes"): until an entry of
    its own term commits, a new leader may lack a change an earlier leader appended,
    and a second change beside it could let two disjoint majorities decide."""
    r = new_raft(1, [1, 2, 3])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    _commit_all(r)
    assert r.log.term_or_zero(r.log.committed) != r.term  # its empty entry is not committed
    with pytest.raises(ProposalDropped) as err:
        r.step(_conf(1, ConfChange(ConfChangeType.ADD_NODE, NodeId(4))))
    assert err.value.details["reason"] == "conf_change_pending"
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=r.log.last_index()))
    _commit_all(r)
    r.step(_conf(1, ConfChange(ConfChangeType.ADD_NODE, NodeId(4))))
    assert r.pending_conf_index == r.log.last_index()


def test_4_1_new_leader_waits_for_unapplied_conf_changes() -> None:
    """etcd's rule: a new leader treats its whole log as possibly holding a change."""
    st = MemoryStorage(conf_state=ConfState(frozenset({NodeId(1), NodeId(2), NodeId(3)})))
    cc = ConfChange(ConfChangeType.ADD_NODE, NodeId(4)).encode()
    st.append([Entry(Term(1), LogIndex(1), EntryType.CONF_CHANGE, cc)])
    r = new_raft(1, [1, 2, 3], storage=st)
    r.term = Term(1)
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    assert r.role is Role.LEADER and r.pending_conf_index == 1
    with pytest.raises(ProposalDropped):
        r.step(_conf(1, ConfChange(ConfChangeType.ADD_NODE, NodeId(5))))


def test_4_1_no_campaign_with_committed_unapplied_conf_change() -> None:
    st = MemoryStorage(conf_state=ConfState(frozenset({NodeId(1), NodeId(2), NodeId(3)})))
    cc = ConfChange(ConfChangeType.REMOVE_NODE, NodeId(1)).encode()
    st.append([Entry(Term(1), LogIndex(1), EntryType.CONF_CHANGE, cc)])
    r = new_raft(1, [1, 2, 3], storage=st)
    r.log.commit_to(LogIndex(1))
    r.step(hup(1))
    assert r.role is Role.FOLLOWER and read(r) == []
    r.log.applied_to(LogIndex(1))
    r.step(hup(1))
    assert r.role is Role.CANDIDATE


def test_6_removed_leader_steps_down() -> None:
    r = new_raft(1, [1, 2, 3])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, NodeId(1)))
    assert r.role is Role.FOLLOWER and not r.promotable()


def test_4_1_conf_change_that_leaves_no_voter_is_refused() -> None:
    r = new_raft(1, [1])
    r.step(hup(1))
    _commit_all(r)
    with pytest.raises(ProposalDropped) as err:
        r.step(_conf(1, ConfChange(ConfChangeType.REMOVE_NODE, NodeId(1))))
    assert err.value.details["reason"] == "invalid_conf_change"


def test_4_2_1_learners_replicate_but_neither_vote_nor_count() -> None:
    """Thesis §4.2.1: a new server joins without voting rights until it caught up."""
    net = Network(new_raft(1, [1, 2], learners=[3]), new_raft(2, [1, 2], learners=[3]), None)
    net.peers[NodeId(3)] = new_raft(3, [1, 2], learners=[3])
    lead = _elect(net)
    net.isolate(2)
    li = lead.log.last_index()
    net.send(prop(1, b"x"))
    assert net[3].log.last_index() == li + 1
    assert lead.log.committed == li  # the learner's copy does not count
    for _ in range(40):
        net.tick(3)
    assert net[3].role is Role.FOLLOWER  # learners never campaign
    lead.apply_conf_change(ConfChange(ConfChangeType.ADD_NODE, NodeId(3)))
    assert lead.log.committed == li + 1  # promoted: now 2 of 3


def test_conf_change_corruption_only_raises_invalid_argument() -> None:
    """Every prefix cut and every flipped byte either decodes or raises the typed error."""
    good = ConfChange(ConfChangeType.REMOVE_NODE, NodeId(0x0102030405), b"why").encode()
    variants = [good[:n] for n in range(len(good))]
    for i in range(len(good)):
        for bit in (0x01, 0x80):
            variants.append(good[:i] + bytes([good[i] ^ bit]) + good[i + 1 :])
    for bad in variants:
        try:
            cc = ConfChange.decode(bad)
        except InvalidArgument:
            continue
        assert ConfChange.decode(cc.encode()) == cc


def test_conf_change_encoding_round_trips_and_rejects_garbage() -> None:
    cc = ConfChange(ConfChangeType.ADD_LEARNER, NodeId(7), b"ctx")
    assert ConfChange.decode(cc.encode()) == cc
    for bad in (b"", b"CC1", b"XX1" + cc.encode()[3:], cc.encode()[:3] + b"\x09" + cc.encode()[4:]):
        with pytest.raises(InvalidArgument):
            ConfChange.decode(bad)


# -- snapshots (paper §7) --------------------------------------------------------------------------


def _compacted_leader() -> tuple[Network, Raft]:
    net = Network(None, None, None)
    lead = _elect(net)
    net.isolate(3)
    for d in (b"a", b"b", b"c"):
        net.send(prop(1, d))
    persist(lead)
    st = lead.log.storage
    assert isinstance(st, MemoryStorage)
    st.create_snapshot(lead.log.committed, lead.conf_state(), b"state")
    st.compact(lead.log.committed)
    net.recover()
    return net, lead


def test_7_leader_sends_snapshot_when_entries_are_compacted() -> None:
    """§7: "the leader must occasionally send snapshots to followers that lag behind"."""
    net, lead = _compacted_leader()
    net.ignore(MT.SNAP)
    net.send(msg(MT.HEARTBEAT_RESP, 3, 1, term=lead.term))
    assert lead.tracker.progress[NodeId(3)].state is ProgressState.SNAPSHOT
    net.recover()
    lead.step(Message(MT.SNAP_STATUS, NodeId(1), NodeId(3), reject=True))
    net.send(msg(MT.HEARTBEAT_RESP, 3, 1, term=lead.term))
    snaps = [m.snapshot for m in net.delivered if m.type is MT.SNAP]
    assert len(snaps) == 1 and snaps[0] is not None and snaps[0].data == b"state"
    f = net[3]
    assert f.log.committed == snaps[0].index
    assert f.log.unstable.snapshot == snaps[0]
    assert f.log.first_index() == snaps[0].index + 1


def test_7_snapshot_progress_resumes_replication_after_ack() -> None:
    net, lead = _compacted_leader()
    net.send(msg(MT.HEARTBEAT_RESP, 3, 1, term=lead.term))
    pr = lead.tracker.progress[NodeId(3)]
    assert pr.state is ProgressState.REPLICATE
    assert pr.match == lead.log.last_index()


def test_7_failed_snapshot_falls_back_to_probe() -> None:
    net, lead = _compacted_leader()
    net.ignore(MT.SNAP)
    net.send(msg(MT.HEARTBEAT_RESP, 3, 1, term=lead.term))
    pr = lead.tracker.progress[NodeId(3)]
    assert pr.state is ProgressState.SNAPSHOT
    lead.step(Message(MT.SNAP_STATUS, NodeId(1), NodeId(3), reject=True))
    assert pr.state is ProgressState.PROBE and pr.is_paused() and pr.pending_snapshot == 0


def test_7_snapshot_of_a_prefix_keeps_the_following_entries() -> None:
    """§7: a snapshot that describes a prefix of the follower's log only moves commit."""
    st = storage_with([(1, 1), (2, 1), (3, 1)], [1, 2])
    r = new_raft(2, [1, 2], storage=st)
    r.become_follower(Term(1), NodeId(1))
    snap = _snapshot(2, 1, [1, 2])
    r.step(msg(MT.SNAP, 1, 2, term=Term(1), snapshot=snap))
    assert r.log.committed == 2 and r.log.last_index() == 3
    assert not r.log.has_pending_snapshot()


def test_7_old_snapshot_is_ignored() -> None:
    st = storage_with([(1, 1), (2, 1), (3, 1)], [1, 2])
    r = new_raft(2, [1, 2], storage=st)
    r.become_follower(Term(1), NodeId(1))
    r.log.commit_to(LogIndex(3))
    r.step(msg(MT.SNAP, 1, 2, term=Term(1), snapshot=_snapshot(2, 1, [1, 2])))
    [resp] = read(r)
    assert resp.index == 3 and not r.log.has_pending_snapshot()


def _snapshot(index: int, term: int, voters: list[int]) -> object:
    from enroute_ledger.raft import Snapshot, SnapshotMetadata

    cs = ConfState(frozenset(NodeId(v) for v in voters))
    return Snapshot(SnapshotMetadata(LogIndex(index), Term(term), cs), b"s")


# -- flow control: pipelining, windows, batching ---------------------------------------------------


def _replicating_leader(**kw: int) -> Raft:
    r = new_raft(1, [1, 2], **kw)
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=r.log.last_index()))
    read(r)
    assert r.tracker.progress[NodeId(2)].state is ProgressState.REPLICATE
    return r


def test_pipelining_is_bounded_by_the_inflight_count() -> None:
    r = _replicating_leader(inflight_msgs_max=3)
    for i in range(10):
        r.step(prop(1, bytes([i])))
    apps = [m for m in read(r) if m.type is MT.APP]
    assert len(apps) == 3  # the rest waits for acknowledgements
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=apps[0].entries[-1].index))
    more = [m for m in read(r) if m.type is MT.APP and m.entries]
    # One slot freed: the waiting proposals go out batched in one message.
    assert len(more) == 1 and len(more[0].entries) == 7


def test_pipelining_is_bounded_by_inflight_bytes() -> None:
    r = _replicating_leader(inflight_bytes_max=300, msg_bytes_max=100)
    for i in range(10):
        r.step(prop(1, bytes(50) + bytes([i])))
    apps = [m for m in read(r) if m.type is MT.APP]
    sent = sum(len(e.data) + 24 for m in apps for e in m.entries)
    assert sent < 300 + 100 and len(apps) < 10


def test_batching_respects_the_message_size() -> None:
    r = new_raft(1, [1, 2], msg_bytes_max=200)
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    read(r)
    r.step(prop(1, *[bytes(60)] * 6))
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=LogIndex(0), reject=True))
    apps = [m for m in read(r) if m.type is MT.APP]
    assert apps and all(sum(len(e.data) + 24 for e in m.entries) <= 200 for m in apps)


def test_heartbeat_response_unblocks_a_full_window() -> None:
    """A lost append must not stall replication forever: a heartbeat reply frees a slot."""
    r = _replicating_leader(inflight_msgs_max=1)
    r.step(prop(1, b"a"))
    r.step(prop(1, b"b"))
    read(r)
    pr = r.tracker.progress[NodeId(2)]
    assert pr.is_paused()
    r.step(msg(MT.HEARTBEAT_RESP, 2, 1, term=r.term))
    assert any(m.type is MT.APP for m in read(r))


def test_probe_sends_one_append_until_answered() -> None:
    r = new_raft(1, [1, 2])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    read(r)
    r.step(prop(1, b"a"))
    r.step(prop(1, b"b"))
    assert [m for m in read(r) if m.type is MT.APP] == []  # the probe from election is out


def test_uncommitted_bytes_bound_drops_proposals() -> None:
    r = new_raft(1, [1, 2], uncommitted_bytes_max=100)
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.step(prop(1, bytes(80)))
    with pytest.raises(ProposalDropped) as err:
        r.step(prop(1, bytes(80)))
    assert err.value.details["reason"] == "uncommitted_bytes_max"


@pytest.mark.parametrize("role", ["follower", "candidate", "pre_candidate"])
def test_proposal_without_leader_is_dropped(role: str) -> None:
    r = new_raft(1, [1, 2, 3])
    if role == "candidate":
        r.become_candidate()
    elif role == "pre_candidate":
        r.become_pre_candidate()
    with pytest.raises(ProposalDropped) as err:
        r.step(prop(1, b"x"))
    assert err.value.details["reason"] == "no_leader"
    assert err.value.mapping.retryable


def test_follower_forwards_proposals_to_the_leader() -> None:
    net = Network(None, None, None)
    lead = _elect(net)
    net.send(prop(2, b"via follower"))
    assert lead.log.all_entries()[-1].data == b"via follower"


# -- quiescence ------------------------------------------------------------------------------------


def _quiet_cluster() -> Network:
    net = Network(None, None, None, check_quorum=True, pre_vote=True)
    lead = _elect(net)
    net.send(prop(1, b"x"))
    net.tick(1)
    for n in (1, 2, 3):
        persist(net[n])
    _commit_all(lead)
    assert lead.is_idle()
    assert lead.quiesce()
    net.send(*read(lead))
    return net


def test_idle_group_goes_quiet_and_nobody_campaigns() -> None:
    net = _quiet_cluster()
    assert all(net[n].quiesced for n in (1, 2, 3))
    for _ in range(100):
        for n in (1, 2, 3):
            net.tick(n)
    assert net[1].role is Role.LEADER and net[1].term == 1
    assert all(net[n].term == 1 for n in (2, 3))


def test_quiet_leader_wakes_on_work() -> None:
    net = _quiet_cluster()
    net[1].unquiesce()
    net.send(prop(1, b"y"))
    assert net[2].log.all_entries()[-1].data == b"y"


def test_busy_leader_is_not_idle() -> None:
    net = Network(None, None, None)
    lead = _elect(net)
    net.isolate(3)
    net.send(prop(1, b"x"))
    assert not lead.is_idle() and not lead.quiesce()
    assert not net[2].is_idle()


def test_stale_heartbeat_does_not_wake_a_quiet_follower() -> None:
    net = _quiet_cluster()
    f = net[2]
    stale = msg(MT.HEARTBEAT, 1, 2, term=Term(1), commit=f.log.committed)
    assert not f.wakes(stale)
    assert f.wakes(msg(MT.VOTE, 3, 2, term=Term(2)))
    assert f.wakes(msg(MT.APP, 1, 2, term=Term(1), commit=LogIndex(f.log.committed + 1)))


# -- configuration and randomness ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"election_ticks": 1, "heartbeat_ticks": 1},
        {"heartbeat_ticks": 0},
        {"inflight_msgs_max": 0},
        {"msg_bytes_max": 0},
    ],
)
def test_config_is_validated(kw: dict[str, int]) -> None:
    with pytest.raises(InvalidArgument):
        RaftConfig(NodeId(1), **kw)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        RaftConfig(NodeId(0))


def test_splitmix_is_deterministic_and_in_range() -> None:
    a, b = SplitMix64(42), SplitMix64(42)
    xs = [a.randrange(10) for _ in range(1000)]
    assert xs == [b.randrange(10) for _ in range(1000)]
    assert set(xs) == set(range(10))
    assert [SplitMix64(1).next_u64() for _ in range(2)] != [
        SplitMix64(2).next_u64() for _ in range(2)
    ]


def test_restart_keeps_term_vote_and_commit() -> None:
    st = storage_with([(1, 1), (2, 2)], [1, 2, 3])
    from enroute_ledger.raft import HardState

    st.set_hard_state(HardState(Term(2), NodeId(3), LogIndex(2)))
    r = new_raft(1, [1, 2, 3], storage=st)
    assert (r.term, r.vote, r.log.committed) == (2, 3, 2)
    r.step(msg(MT.VOTE, 2, 1, term=Term(2), index=LogIndex(9), log_term=Term(9)))
    [resp] = read(r)
    assert resp.reject  # already voted for 3 in term 2


def test_corrupt_hard_state_is_refused() -> None:
    from enroute_core.base.errors import CorruptData
    from enroute_ledger.raft import HardState

    st = storage_with([(1, 1)], [1, 2, 3])
    st.set_hard_state(HardState(Term(1), None, LogIndex(5)))
    with pytest.raises(CorruptData):
        Raft(RaftConfig(NodeId(1)), st, SplitMix64(1))
