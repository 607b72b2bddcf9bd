"""Hibernation in the core (docs/raft.md, "Hibernation"): ``RawNode.hibernation`` and
``RawNode.wake_from``.

Three RawNodes driven by a well-behaved loop (persist, send, apply, advance). A
quiet group's nodes are freed and rebuilt from their storage and records; they
come back in their roles and terms without a Ready, answer messages, commit
and serve reads; a node whose disk says more (a later term, a vote) takes the
disk's word and keeps time instead.
"""

from __future__ import annotations

import contextlib
import dataclasses

from raftnet import ids

from enroute_core.base.errors import ProposalDropped
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import (
    ConfState,
    HardState,
    MemoryStorage,
    Message,
    RaftConfig,
    RawNode,
    Role,
)

PEERS = (1, 2, 3)


class Trio:
    """Three RawNodes on MemoryStorage; deliver() runs the Ready loop until nothing moves."""

    def __init__(self) -> None:
        self.st = {n: MemoryStorage(conf_state=ConfState(ids(*PEERS))) for n in PEERS}
        self.raw = {n: self._build(n) for n in PEERS}
        self.applied: dict[int, list[bytes]] = {n: [] for n in PEERS}
        self.reads: dict[int, list[bytes]] = {n: [] for n in PEERS}

    def _build(self, n: int) -> RawNode:
        return RawNode(RaftConfig(NodeId(n), election_ticks=5), self.st[n])

    def deliver(self, rounds: int = 50) -> int:
        """Ready rounds until quiet; returns the messages sent."""
        sent = 0
        for _ in range(rounds):
            out: list[Message] = []
            for n, rn in self.raw.items():
                if not rn.has_ready():
                    continue
                rd = rn.ready()
                st = self.st[n]
                st.append(rd.entries)
                if rd.hard_state is not None:
                    st.set_hard_state(rd.hard_state)
                out += rd.messages
                self.applied[n] += [e.data for e in rd.committed_entries if e.data]
                self.reads[n] += [rs.context for rs in rd.read_states]
                rn.advance(rd)
            if not out:
                return sent
            sent += len(out)
            for m in out:
                self.raw[int(m.to)].step(m)
        raise AssertionError("no quiet after many rounds")

    def leader(self) -> int:
        (lead,) = [n for n, rn in self.raw.items() if rn.raft.role is Role.LEADER]
        return lead

    def elect_commit_quiesce(self) -> int:
        self.raw[1].campaign()
        self.deliver()
        lead = self.leader()
        self.raw[lead].propose(b"one")
        self.deliver()
        assert self.raw[lead].quiesce()
        self.deliver()
        assert all(rn.quiesced for rn in self.raw.values())
        return lead

    def hibernate_and_wake(self, n: int) -> bool:
        h = self.raw[n].hibernation()
        assert h is not None
        self.raw[n] = self._build(n)  # the old objects are gone; storage is the disk
        return self.raw[n].wake_from(h)


def test_a_quiet_group_hibernates_and_wakes_in_its_roles() -> None:
    t = Trio()
    lead = t.elect_commit_quiesce()
    term = t.raw[lead].raft.term
    for n in PEERS:
        assert t.hibernate_and_wake(n)
    for n, rn in t.raw.items():
        r = rn.raft
        assert rn.quiesced and r.term == term and r.lead == lead
        assert r.role is (Role.LEADER if n == lead else Role.FOLLOWER)
        assert r.log.applied == r.log.committed == r.log.last_index()
        assert not rn.has_ready(), "a woken node reports no change"
    # nobody keeps time while quiet
    for _ in range(50):
        for rn in t.raw.values():
            rn.tick()
    assert t.deliver() == 0
    # a proposal at a woken follower is forwarded and committed everywhere
    follower = next(n for n in PEERS if n != lead)
    t.raw[follower].propose(b"two")
    t.deliver()
    assert all(t.applied[n][-1] == b"two" for n in PEERS)
    # a read at the woken leader needs a heartbeat round, which it gets
    t.raw[lead].read_index(b"ctx")
    t.deliver()
    assert t.reads[lead] == [b"ctx"]


def test_a_woken_leader_steps_down_for_a_later_term() -> None:
    t = Trio()
    lead = t.elect_commit_quiesce()
    assert t.hibernate_and_wake(lead)
    others = [n for n in PEERS if n != lead]
    t.raw[others[0]].unquiesce()
    t.raw[others[1]].unquiesce()
    for _ in range(12):  # the followers elect without the (silent) woken leader
        for n in others:
            t.raw[n].tick()
        with contextlib.suppress(ProposalDropped):
            t.deliver()
    new = [n for n in others if t.raw[n].raft.role is Role.LEADER]
    assert new, "the other two elected"
    t.raw[new[0]].propose(b"later")
    t.deliver()
    old = t.raw[lead].raft
    assert old.role is Role.FOLLOWER and old.lead == new[0]
    assert t.applied[lead][-1] == b"later"


def test_the_durable_hard_state_wins_over_the_record() -> None:
    t = Trio()
    lead = t.elect_commit_quiesce()
    follower = next(n for n in PEERS if n != lead)
    h = t.raw[follower].hibernation()
    assert h is not None
    # meanwhile the disk moved on: a later term with a vote (written before a message left)
    st = t.st[follower]
    st.set_hard_state(HardState(Term(h.term + 1), NodeId(lead), st.hard_state.commit))
    t.raw[follower] = t._build(follower)
    assert not t.raw[follower].wake_from(h)
    r = t.raw[follower].raft
    assert r.term == h.term + 1 and r.vote == lead, "never less than the durable hard state"
    assert not r.quiesced and r.lead is None and r.role is Role.FOLLOWER
    assert t.raw[follower].has_ready(), "the change of leader is reported"


def test_a_commit_index_not_yet_on_disk_is_taken_from_the_record() -> None:
    t = Trio()
    lead = t.elect_commit_quiesce()
    follower = next(n for n in PEERS if n != lead)
    h = t.raw[follower].hibernation()
    assert h is not None
    st = t.st[follower]
    st.set_hard_state(dataclasses.replace(st.hard_state, commit=LogIndex(1)))
    t.raw[follower] = t._build(follower)
    assert t.raw[follower].wake_from(h)
    log = t.raw[follower].raft.log
    assert log.committed == log.applied == h.commit


def test_what_refuses_hibernation() -> None:
    t = Trio()
    assert all(rn.hibernation() is None for rn in t.raw.values()), "not quiet"
    lead = t.elect_commit_quiesce()
    rn = t.raw[lead]
    rn.propose(b"x")  # wakes it, with an unstable entry
    assert rn.hibernation() is None
    rd = rn.ready()
    assert rn.hibernation() is None, "a Ready outstanding"
    t.st[lead].append(rd.entries)
    rn.advance(rd)
    for m in rd.messages:
        t.raw[int(m.to)].step(m)
    t.deliver()
    assert not rn.quiesced and rn.hibernation() is None
    assert rn.quiesce()
    t.deliver()
    assert rn.hibernation() is not None
    rn.read_index(b"r")
    assert rn.hibernation() is None, "a read in flight"
    t.deliver()
    assert rn.quiesce()
    t.deliver()
    follower = t.raw[next(n for n in PEERS if n != lead)]
    follower.raft.blank = 7
    assert follower.hibernation() is None, "a blank node keeps its objects"
