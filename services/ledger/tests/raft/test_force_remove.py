"""Two-voter recovery: the survivor leads alone (docs/raft.md, "Recovering a two-voter ledger").

Scenario checked: voters 1 and 2, entries committed by both (with two voters a
commit needs both, paper §5.3), voter 1 lost. ``Raft.force_remove`` on voter 2
makes it the leader of ``{2}`` in a new term and appends REMOVE(1): every entry
committed before is kept at its index and term (§5.4, Leader Completeness), the
REMOVE commits on voter 2 alone, and voter 1, should it come back with its log
(or with entries nobody acknowledged), never wins voter 2's vote again (§5.4.1:
voter 2's last term is above any term voter 1 holds).
"""

from __future__ import annotations

from raftnet import MT, Network, hup, ids, msg, new_raft, persist, prop, read

from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import (
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Raft,
    Role,
)
from enroute_ledger.raft.types import ConfChangeType


def _apply(r: Raft) -> list[ConfChange]:
    """Apply committed entries as a driver does (conf changes through the core)."""
    out: list[ConfChange] = []
    ents = r.log.next_committed_entries()
    for e in ents:
        if e.type is EntryType.CONF_CHANGE:
            cc = ConfChange.decode(e.data)
            r.apply_conf_change(cc)
            out.append(cc)
    if ents:
        r.log.applied_to(ents[-1].index)
    return out


def _two_voters_with_commits() -> tuple[Network, list[tuple[int, int]]]:
    """Voter 1 leads, three entries committed by both; returns (index, term) of each."""
    net = Network(None, None)
    net.send(hup(1))
    assert net[1].role is Role.LEADER
    net.send(prop(1, b"a", b"b"), prop(1, b"c"))
    for r in net.peers.values():
        persist(r)
        _apply(r)
    last = net[1].log.last_index()
    assert net[1].log.committed == net[2].log.committed == last
    return net, [(i, net[2].log.term_or_zero(LogIndex(i))) for i in range(1, last + 1)]


def test_survivor_keeps_every_committed_entry_and_leads_alone() -> None:
    net, committed = _two_voters_with_commits()
    net.isolate(1)  # voter 1 is lost
    survivor = net[2]
    before = survivor.term
    assert survivor.force_remove(NodeId(1))
    assert survivor.role is Role.LEADER and survivor.term == before + 1
    tail = survivor.log.slice(
        LogIndex(len(committed) + 1), LogIndex(survivor.log.last_index() + 1), 1 << 20
    )
    assert [e.type for e in tail] == [EntryType.NORMAL, EntryType.CONF_CHANGE]  # empty, REMOVE
    assert ConfChange.decode(tail[1].data) == ConfChange(ConfChangeType.REMOVE_NODE, NodeId(1))
    persist(survivor)
    assert survivor.log.committed == survivor.log.last_index()  # its own vote is the quorum
    assert _apply(survivor) == [ConfChange(ConfChangeType.REMOVE_NODE, NodeId(1))]
    assert survivor.tracker.voters == ids(2)
    for i, t in committed:
        assert survivor.log.term_or_zero(LogIndex(i)) == t
    net.send(prop(2, b"after"))
    persist(survivor)
    assert survivor.log.committed == survivor.log.last_index()


def test_the_lost_voter_never_wins_again_nor_commits_what_it_held() -> None:
    """Voter 1 was not lost after all: it led, holds an entry voter 2 never took, and
    comes back. It cannot be elected (voter 2's log is more up to date) and its entry
    never commits; voter 2 goes on alone."""
    net, _ = _two_voters_with_commits()
    net.cut(1, 2)
    net.send(prop(1, b"never acknowledged"), prop(1, b"nor this"), prop(1, b"nor that"))
    persist(net[1])
    unacked = LogIndex(net[1].log.last_index() - 2)
    assert net[1].log.committed < unacked
    assert net[2].force_remove(NodeId(1))
    persist(net[2])
    _apply(net[2])
    net.recover()
    old = net[1]
    for _ in range(60):
        net.tick(1)
        net.tick(2)
        for r in net.peers.values():
            persist(r)
            _apply(r)
        assert old.log.committed < unacked
        assert b"never acknowledged" not in [e.data for e in net[2].log.all_entries()]
    assert net[2].tracker.voters == ids(2)
    # even asked directly, with a higher term, voter 2 refuses its vote
    net[2].step(msg(MT.VOTE, 1, 2, term=net[2].term + 5, index=old.log.last_index(),
                    log_term=old.log.last_term()))  # fmt: skip
    (resp,) = [m for m in read(net[2]) if m.type is MT.VOTE_RESP]
    assert resp.reject


def test_a_restart_before_the_remove_applies_forces_again() -> None:
    """The force lives in memory until the REMOVE applies: a restart brings back ``{1, 2}``
    from the log, the caller forces again, and the second REMOVE applies as a no-op."""
    net, _ = _two_voters_with_commits()
    net.isolate(1)
    survivor = net[2]
    assert survivor.force_remove(NodeId(1))
    persist(survivor)  # the entries are durable, the commit index is not
    st = survivor.log.storage
    assert isinstance(st, MemoryStorage)
    st.set_hard_state(HardState(survivor.term, survivor.vote, LogIndex(st.hard_state.commit)))
    again = new_raft(2, [1, 2], storage=st)
    again.log.applied_to(again.log.committed)
    assert again.tracker.voters == ids(1, 2)
    assert again.role is Role.FOLLOWER
    assert again.force_remove(NodeId(1))
    persist(again)
    removes = _apply(again)
    assert [cc.node_id for cc in removes] == [NodeId(1), NodeId(1)]
    assert again.tracker.voters == ids(2)
    assert not again.force_remove(NodeId(1))  # done: another configuration now


def test_refused_where_it_cannot_be_made_safe() -> None:
    three = new_raft(1, [1, 2, 3])
    assert not three.force_remove(NodeId(2))  # a majority of the others readmits instead
    pair = new_raft(1, [1, 2])
    assert not pair.force_remove(NodeId(1))  # itself
    assert not pair.force_remove(NodeId(3))  # not a voter
    st = MemoryStorage(conf_state=ConfState(ids(1, 2)))
    blank = new_raft(1, [1, 2], storage=st, blank=0xB1A7)  # lost entries itself
    assert not blank.force_remove(NodeId(2))
    learner = new_raft(1, [1, 2], learners=[3])
    assert not learner.force_remove(NodeId(2))
    for r in (three, pair, blank, learner):
        assert r.role is Role.FOLLOWER and r.term == Term(0) and not r.msgs


def test_refused_while_a_committed_conf_change_is_unapplied() -> None:
    net, _ = _two_voters_with_commits()
    add3 = ConfChange(ConfChangeType.ADD_NODE, NodeId(3)).encode()
    net.send(
        msg(MT.PROP, 1, 1, entries=(Entry(Term(0), LogIndex(0), EntryType.CONF_CHANGE, add3),))
    )
    persist(net[2])
    assert net[2].log.committed == net[2].log.last_index()
    net.isolate(1)
    assert not net[2].force_remove(NodeId(1))  # its configuration may be stale
    _apply(net[2])
    assert net[2].tracker.voters == ids(1, 2, 3)
    assert not net[2].force_remove(NodeId(1))  # three voters now
