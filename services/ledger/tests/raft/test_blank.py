"""A voter that lost its disk comes back blank (docs/raft.md, "A voter that lost its disk").

Scenario checked first: three voters, an entry committed by the leader and
voter 2 only, voter 2's disk wiped, the leader lost. Voter 3 (without the
entry) must not be elected with the blank voter's help: that would lose a
committed entry (paper §5.4, Leader Completeness). Then: a blank voter is
caught up, readmitted by a READMIT entry committed without it, and counts
again only once it applied a READMIT naming its own blank id.
"""

from __future__ import annotations

from raftnet import MT, Network, hup, ids, msg, new_raft, persist, prop, read

from enroute_core.base.ids import LogIndex, NodeId
from enroute_ledger.raft import (
    ConfChange,
    ConfState,
    EntryType,
    MemoryStorage,
    Raft,
    Role,
)
from enroute_ledger.raft.types import ConfChangeType, MessageType

BLANK = 0xB1A7


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


def _apply_all(net: Network) -> list[ConfChange]:
    out: list[ConfChange] = []
    for r in net.peers.values():
        out += _apply(r)
    return out


def _blank_raft(node: int, blank: int = BLANK, **kw: object) -> Raft:
    """A founder's storage (voters 1..3) with no memory of what it did before."""
    st = MemoryStorage(conf_state=ConfState(ids(1, 2, 3)))
    return new_raft(node, [1, 2, 3], storage=st, blank=blank, **kw)  # type: ignore[arg-type]


def _committed_by_1_and_2() -> tuple[Network, LogIndex]:
    net = Network(None, None, None)
    net.send(hup(1))
    assert net[1].role is Role.LEADER
    net.cut(1, 3)
    net.send(prop(1, b"acknowledged"))
    committed = net[1].log.committed
    assert net[2].log.last_index() == committed > net[3].log.last_index()
    return net, committed


def test_wiped_voter_does_not_elect_a_leader_without_a_committed_entry() -> None:
    net, _ = _committed_by_1_and_2()
    net.peers[NodeId(2)] = _blank_raft(2)
    net.isolate(1)  # the leader, the only other holder of the entry, is lost
    for _ in range(30):
        net.tick(3)
        net.tick(2)
    assert net[3].role is not Role.LEADER
    assert net[2].role is not Role.LEADER


def test_without_the_blank_guard_the_entry_is_lost() -> None:
    """The same schedule with a plain empty voter: the harness can fail (§5.4)."""
    net, committed = _committed_by_1_and_2()
    net.peers[NodeId(2)] = _blank_raft(2, blank=0)
    net.isolate(1)
    for _ in range(30):
        net.tick(3)
    assert net[3].role is Role.LEADER
    assert net[3].log.term_or_zero(committed) != net[1].log.term_or_zero(committed)


def test_blank_voter_refuses_votes_and_never_campaigns() -> None:
    r = _blank_raft(2)
    for t in (MT.VOTE, MT.PRE_VOTE):
        r.step(msg(t, 3, 2, term=5, index=100, log_term=4))
        (resp,) = read(r)
        assert resp.reject and resp.blank == BLANK
    for _ in range(100):
        r.tick()
    r.step(msg(MT.TIMEOUT_NOW, 1, 2, term=r.term))
    assert r.role is Role.FOLLOWER
    assert not [m for m in read(r) if m.type in (MT.VOTE, MT.PRE_VOTE)]


def test_blank_acknowledgements_do_not_commit() -> None:
    net = Network(None, None, None)
    net.send(hup(1))
    net.peers[NodeId(2)] = _blank_raft(2)
    net.isolate(3)
    net.send(prop(1, b"x"))
    for _ in range(5):
        net.tick(1)
    leader = net[1]
    assert net[2].log.last_index() == leader.log.last_index()  # replicated to it...
    assert leader.log.committed < leader.log.last_index()  # ...but not counted
    assert leader.tracker.progress[NodeId(2)].blank == BLANK


def test_blank_voter_is_caught_up_readmitted_and_then_counts() -> None:
    net = Network(None, None, None)
    net.send(hup(1))
    net.send(prop(1, b"before"))
    net.peers[NodeId(2)] = _blank_raft(2)
    net.tick(1)  # a heartbeat: 2 answers blank, 1 probes it from the top
    applied = _apply_all(net)
    readmits = [cc for cc in applied if cc.type is ConfChangeType.READMIT]
    assert readmits and all(cc.node_id == 2 for cc in readmits)
    assert net[2].blank == 0
    assert net[2].log.committed == net[1].log.committed
    net.tick(1)
    assert net[1].tracker.progress[NodeId(2)].blank == 0
    # counts again: with 3 lost, 1 and 2 commit
    net.isolate(3)
    net.send(prop(1, b"after"))
    assert net[1].log.committed == net[1].log.last_index() == net[2].log.last_index()


def test_readmit_of_another_life_readmits_nobody() -> None:
    r = _blank_raft(2)
    old = ConfChange(ConfChangeType.READMIT, NodeId(2), (BLANK + 1).to_bytes(8, "big"))
    r.apply_conf_change(old)
    assert r.blank == BLANK
    other = ConfChange(ConfChangeType.READMIT, NodeId(3), BLANK.to_bytes(8, "big"))
    r.apply_conf_change(other)
    assert r.blank == BLANK
    r.apply_conf_change(ConfChange(ConfChangeType.READMIT, NodeId(2), BLANK.to_bytes(8, "big")))
    assert r.blank == 0


def test_blank_heartbeat_commit_is_clamped_to_the_log() -> None:
    r = _blank_raft(2)
    r.step(msg(MT.HEARTBEAT, 1, 2, term=3, commit=50))
    assert r.log.committed <= r.log.last_index()
    (resp,) = read(r)
    assert resp.type is MessageType.HEARTBEAT_RESP and resp.blank == BLANK


def test_leader_does_not_readmit_while_behind_the_commit() -> None:
    r = new_raft(1, [1, 2, 3])
    r.step(hup(1))
    r.step(msg(MT.VOTE_RESP, 2, 1, term=r.term))
    r.step(prop(1, b"a"))
    r.step(msg(MT.APP_RESP, 3, 1, term=r.term, index=r.log.last_index()))
    read(r)
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=LogIndex(1), blank=BLANK))
    assert r.tracker.progress[NodeId(2)].readmit_index == 0
    assert r.log.last_index() == r.log.committed


def test_blank_voter_without_a_leader_pokes_the_voters_and_wakes_a_quiet_leader() -> None:
    net = Network(None, None, None)
    net.send(hup(1))
    net.send(prop(1, b"x"))
    _apply_all(net)
    for r in net.peers.values():
        persist(r)
    assert net[1].quiesce()
    net.send(*read(net[1]))  # the followers go quiet too
    net.peers[NodeId(2)] = _blank_raft(2)
    b = net[2]
    for _ in range(2 * b.config.election_ticks):
        b.tick()
    pokes = read(b)
    assert {int(m.to) for m in pokes} == {1, 3}
    assert all(m.type is MT.HEARTBEAT_RESP and m.term == 0 and m.blank for m in pokes)
    leader = net[1]
    assert all(leader.wakes(m) for m in pokes)  # RawNode.step unquiesces on these
    net.send(*pokes)
    assert leader.role is Role.LEADER
    assert b.log.last_index() == leader.log.last_index()
    assert net[3].term == leader.term  # nobody's term moved
