"""``RaftConfig.quiet_commit`` (docs/raft.md, "Quiet commits"): the core's half.

etcd's leader broadcasts an append with no entries each time its commit index moves,
and beats every follower on each heartbeat tick. With ``quiet_commit`` (the multi-Raft
layer, which quiesces an idle leader at once and so tells the index in the quiesce
heartbeat) neither happens when it tells a follower nothing new; what a follower must
still hear (the index while the group cannot quiesce, a read's heartbeat round, a lost
append found again) it hears one beat later at most.
"""

from __future__ import annotations

from raftnet import Network, new_raft, prop, read

from enroute_core.base.ids import NodeId
from enroute_ledger.raft import Message, MessageType, Raft, Role

MT = MessageType


def _cluster(*, quiet: bool) -> Network:
    return Network(*(new_raft(i, (1, 2, 3), quiet_commit=quiet) for i in (1, 2, 3)))


def _lead(net: Network) -> Raft:
    net.send(Message(MT.HUP, NodeId(1), NodeId(1)))
    lead = net[1]
    assert lead.role is Role.LEADER
    return lead


def _empty_appends(msgs: list[Message]) -> list[Message]:
    return [m for m in msgs if m.type is MT.APP and not m.entries]


def test_a_commit_that_moves_only_the_index_sends_no_empty_appends() -> None:
    for quiet in (False, True):
        net = _cluster(quiet=quiet)
        lead = _lead(net)
        net.delivered.clear()
        net.send(prop(1, b"x"))
        assert lead.log.committed == lead.log.last_index()
        empty = _empty_appends(net.delivered)
        # etcd's bcastAppend after the commit (one per follower); none when quiet
        assert len(empty) == (0 if quiet else 2), quiet


def test_a_beat_skips_a_follower_sent_an_append_since_the_previous_beat() -> None:
    net = _cluster(quiet=True)
    lead = _lead(net)
    net.send(prop(1, b"x"))  # appends to 2 and 3 since the election's beat
    lead.tick()  # heartbeat_ticks=1: a beat is due
    assert [m for m in read(lead) if m.type is MT.HEARTBEAT] == []
    lead.tick()  # nothing sent since: every follower is beaten, with the commit
    beats = [m for m in read(lead) if m.type is MT.HEARTBEAT]
    assert sorted(m.to for m in beats) == [2, 3]
    assert all(m.commit == lead.log.committed for m in beats)


def test_the_index_reaches_a_follower_within_two_beats_while_another_is_down() -> None:
    """The group cannot quiesce (3 never answers): 2 learns the commit from a beat."""
    net = _cluster(quiet=True)
    lead = _lead(net)
    net.isolate(3)
    net.send(prop(1, b"x"))
    assert lead.log.committed == lead.log.last_index() > net[2].log.committed
    net.tick(1, 2)
    assert net[2].log.committed == lead.log.committed


def test_a_read_beats_every_follower_even_right_after_an_append() -> None:
    """ReadIndex (thesis §6.4) needs a heartbeat round of a quorum: never skipped."""
    net = _cluster(quiet=True)
    lead = _lead(net)
    net.send(prop(1, b"x"))
    net.send(Message(MT.READ_INDEX, NodeId(1), NodeId(1), context=b"r1"))
    assert [rs.context for rs in lead.read_states] == [b"r1"]
    # a beat while the read is pending carries its context to every follower too
    lead.read_states.clear()
    net.isolate(2)
    net.isolate(3)
    net.send(Message(MT.READ_INDEX, NodeId(1), NodeId(1), context=b"r2"))
    net.send(prop(1, b"y"))
    lead.tick()
    beats = [m for m in read(lead) if m.type is MT.HEARTBEAT]
    assert sorted(m.to for m in beats) == [2, 3]
    assert all(m.context == b"r2" for m in beats)
