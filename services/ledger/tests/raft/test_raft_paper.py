"""The rules of the Raft paper ("In Search of an Understandable Consensus Algorithm",
extended version), each test naming the section it checks.

Modelled on etcd's raft_paper_test.go; written for this core.
"""

from __future__ import annotations

import pytest
from raftnet import MT, Network, hup, msg, new_raft, prop, read, storage_with

from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import Entry, Raft, Role


def _leader_of_three() -> Raft:
    r = new_raft(1, [1, 2, 3])
    r.become_candidate()
    r.become_leader()
    read(r)
    return r


def _commit_noop(r: Raft) -> None:
    """Let followers 2 and 3 acknowledge the leader's empty entry."""
    for f in (2, 3):
        r.step(msg(MT.APP_RESP, f, 1, term=r.term, index=r.log.last_index()))
    read(r)


# -- §5.1 basics ------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["follower", "candidate", "pre_candidate", "leader"])
def test_5_1_update_term_from_message(role: str) -> None:
    """§5.1: "If one server's current term is smaller than the other's, then it updates its
    current term to the larger value. If a candidate or leader discovers that its term is
    out of date, it immediately reverts to follower state." """
    r = new_raft(1, [1, 2, 3])
    if role == "candidate":
        r.become_candidate()
    elif role == "pre_candidate":
        r.become_pre_candidate()
    elif role == "leader":
        r.become_candidate()
        r.become_leader()
    r.step(msg(MT.APP, 2, 1, term=Term(5)))
    assert r.term == 5
    assert r.role is Role.FOLLOWER
    assert r.lead == 2


def test_5_1_reject_stale_term_message() -> None:
    """§5.1: "If a server receives a request with a stale term number, it rejects the request." """
    r = new_raft(1, [1, 2, 3])
    r.become_follower(Term(2), None)
    r.step(msg(MT.APP, 2, 1, term=Term(1), entries=(Entry(Term(1), LogIndex(1)),)))
    assert r.log.last_index() == 0
    assert r.term == 2


def test_5_2_start_as_follower() -> None:
    """§5.2: "When servers start up, they begin as followers." """
    r = new_raft(1, [1, 2, 3])
    assert r.role is Role.FOLLOWER


# -- §5.2 leader election ---------------------------------------------------------------------


def test_5_2_leader_broadcasts_heartbeats() -> None:
    """§5.2: leaders send periodic heartbeats to all followers to maintain their authority."""
    r = new_raft(1, [1, 2, 3], heartbeat=1)
    r.become_candidate()
    r.become_leader()
    read(r)
    r.tick()
    beats = sorted((m.to, m.type, m.term) for m in read(r))
    assert beats == [(2, MT.HEARTBEAT, 1), (3, MT.HEARTBEAT, 1)]


@pytest.mark.parametrize("role", ["follower", "candidate"])
def test_5_2_election_starts_after_timeout(role: str) -> None:
    """§5.2: a follower (or a candidate whose election timed out) increments its term, votes
    for itself and asks every other server for its vote."""
    r = new_raft(1, [1, 2, 3], election=10)
    if role == "candidate":
        r.become_candidate()
    term = r.term
    for _ in range(2 * 10):
        r.tick()
    assert r.role is Role.CANDIDATE
    assert r.term == term + 1
    assert r.vote == 1
    reqs = sorted((m.to, m.type, m.term, m.index) for m in read(r))
    assert reqs == [(2, MT.VOTE, term + 1, 0), (3, MT.VOTE, term + 1, 0)]


@pytest.mark.parametrize(
    ("size", "votes", "role"),
    [
        (1, {}, Role.LEADER),
        (3, {2: True, 3: True}, Role.LEADER),
        (3, {2: True}, Role.LEADER),
        (5, {2: True, 3: True, 4: True, 5: True}, Role.LEADER),
        (5, {2: True, 3: True}, Role.LEADER),
        (3, {2: False, 3: False}, Role.FOLLOWER),
        (5, {2: False, 3: False, 4: False}, Role.FOLLOWER),
        (3, {}, Role.CANDIDATE),
        (5, {2: True}, Role.CANDIDATE),
        (5, {2: False, 3: False}, Role.CANDIDATE),
    ],
)
def test_5_2_election_in_one_round(size: int, votes: dict[int, bool], role: Role) -> None:
    """§5.2: a candidate wins with votes from a majority, loses when a majority refuses,
    and otherwise waits."""
    r = new_raft(1, range(1, size + 1))
    r.step(hup(1))
    for node, granted in votes.items():
        r.step(msg(MT.VOTE_RESP, node, 1, term=r.term, reject=not granted))
    assert r.role is role
    assert r.term == 1


@pytest.mark.parametrize(
    ("vote", "candidate", "reject"),
    [(None, 2, False), (None, 3, False), (2, 2, False), (3, 3, False), (2, 3, True), (3, 2, True)],
)
def test_5_2_one_vote_per_term(vote: int | None, candidate: int, reject: bool) -> None:
    """§5.2: "each server will vote for at most one candidate in a given term, on a
    first-come-first-served basis." """
    r = new_raft(1, [1, 2, 3])
    r.term = Term(1)
    r.vote = NodeId(vote) if vote is not None else None
    r.step(msg(MT.VOTE, candidate, 1, term=Term(1)))
    [resp] = read(r)
    assert (resp.type, resp.to, resp.reject) == (MT.VOTE_RESP, candidate, reject)


def test_5_2_candidate_falls_back_on_current_leader() -> None:
    """§5.2: a candidate that hears from a leader of at least its term becomes a follower."""
    for term in (1, 2):
        r = new_raft(1, [1, 2, 3])
        r.step(hup(1))
        assert r.role is Role.CANDIDATE
        r.step(msg(MT.APP, 2, 1, term=Term(term)))
        assert (r.role, r.term, r.lead) == (Role.FOLLOWER, term, 2)


@pytest.mark.parametrize("role", ["follower", "candidate"])
def test_5_2_election_timeout_is_randomized(role: str) -> None:
    """§5.2: "election timeouts are chosen randomly from a fixed interval" ([et, 2et) here)."""
    et = 10
    seen = set()
    r = new_raft(1, [1, 2, 3], election=et)
    for round_ in range(200):
        r.become_follower(Term(r.term + 1), None)
        if role == "candidate":
            r.become_candidate()
        ticks = 0
        start_term = r.term
        while r.term == start_term:
            r.tick()
            ticks += 1
            assert ticks < 2 * et, round_
        read(r)
        seen.add(ticks)
    assert seen == set(range(et, 2 * et))


def test_5_2_election_timeouts_rarely_collide() -> None:
    """§5.2: randomized timeouts spread out servers so that usually one times out alone."""
    et, size, rounds = 10, 5, 1000
    rafts = [new_raft(i, range(1, size + 1), election=et, seed=7) for i in range(1, size + 1)]
    collisions = 0
    for _ in range(rounds):
        for r in rafts:
            r.become_follower(Term(r.term + 1), None)
        fired = 0
        while fired == 0:
            fired = 0
            for r in rafts:
                before = r.term
                r.tick()
                fired += r.term != before
                read(r)
        collisions += fired > 1
    assert collisions / rounds < 0.3


# -- §5.3 log replication ---------------------------------------------------------------------


def test_5_3_leader_starts_replication() -> None:
    """§5.3: the leader appends the command to its log and issues AppendEntries in parallel."""
    r = _leader_of_three()
    _commit_noop(r)
    li = r.log.last_index()
    r.step(prop(1, b"some data"))
    assert r.log.last_index() == li + 1
    assert r.log.committed == li
    out = sorted((m.to, m.type, m.index, m.log_term, m.commit) for m in read(r))
    assert out == [(2, MT.APP, li, 1, li), (3, MT.APP, li, 1, li)]
    ents = r.log.unstable_entries()
    assert ents[-1] == Entry(Term(1), LogIndex(li + 1), data=b"some data")


def test_5_3_leader_commits_on_majority_and_tells_followers() -> None:
    """§5.3: an entry is committed once the leader replicated it on a majority; the leader
    then includes the new commit index in later AppendEntries."""
    r = _leader_of_three()
    _commit_noop(r)
    li = r.log.last_index()
    r.step(prop(1, b"x"))
    read(r)
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=LogIndex(li + 1)))
    assert r.log.committed == li + 1
    out = sorted((m.to, m.type, m.commit) for m in read(r))
    assert out == [(2, MT.APP, li + 1), (3, MT.APP, li + 1)]


@pytest.mark.parametrize(
    ("size", "acks", "committed"),
    [
        (1, set(), True),
        (3, set(), False),
        (3, {2}, True),
        (3, {2, 3}, True),
        (5, set(), False),
        (5, {2}, False),
        (5, {2, 3}, True),
        (5, {2, 3, 4, 5}, True),
    ],
)
def test_5_3_leader_acknowledges_commit(size: int, acks: set[int], committed: bool) -> None:
    """§5.3: committed once the leader that created the entry replicated it on a majority."""
    r = new_raft(1, range(1, size + 1))
    r.step(hup(1))
    for n in range(2, size + 1):
        r.step(msg(MT.VOTE_RESP, n, 1, term=r.term))
    assert r.role is Role.LEADER
    for n in range(2, size + 1):
        r.step(msg(MT.APP_RESP, n, 1, term=r.term, index=r.log.last_index()))
    read(r)
    li = r.log.last_index()
    r.step(prop(1, b"x"))
    read(r)
    for n in acks:
        r.step(msg(MT.APP_RESP, n, 1, term=r.term, index=LogIndex(li + 1)))
    assert (r.log.committed == li + 1) is committed


def test_5_3_leader_commits_preceding_entries() -> None:
    """§5.3: committing an entry commits all preceding entries, those of earlier leaders too."""
    st = storage_with([(1, 2), (2, 2)], [1, 2, 3])
    r = new_raft(1, [1, 2, 3], storage=st)
    r.term = Term(2)
    r.become_candidate()
    r.become_leader()
    r.step(prop(1, b"x"))
    read(r)
    for n in (2, 3):
        r.step(msg(MT.APP_RESP, n, 1, term=r.term, index=r.log.last_index()))
    assert r.log.committed == 4
    assert [e.index for e in r.log.next_committed_entries()] == [1, 2, 3, 4]


def test_5_3_follower_commits_what_the_leader_committed() -> None:
    """§5.3: "Once a follower learns that a log entry is committed, it applies the entry." """
    r = new_raft(1, [1, 2, 3])
    r.become_follower(Term(1), NodeId(2))
    ents = tuple(Entry(Term(1), LogIndex(i), data=b"d") for i in (1, 2))
    r.step(msg(MT.APP, 2, 1, term=Term(1), entries=ents, commit=LogIndex(1)))
    assert r.log.committed == 1
    assert [e.index for e in r.log.next_committed_entries()] == [1]


@pytest.mark.parametrize(
    ("index", "log_term", "reject", "resp_index", "hint"),
    [
        (0, 0, False, 0, 0),  # match with the dummy entry
        (1, 1, False, 1, 0),
        (2, 2, False, 2, 0),
        (1, 2, True, 1, 1),  # mismatched term at an existing index
        (3, 3, True, 3, 2),  # past our last index: hint at our end
    ],
)
def test_5_3_follower_consistency_check(
    index: int, log_term: int, reject: bool, resp_index: int, hint: int
) -> None:
    """§5.3: "If the follower does not find an entry in its log with the same index and term,
    then it refuses the new entries." """
    st = storage_with([(1, 1), (2, 2)], [1, 2, 3])
    r = new_raft(1, [1, 2, 3], storage=st)
    r.become_follower(Term(2), NodeId(2))
    r.step(msg(MT.APP, 2, 1, term=Term(2), index=LogIndex(index), log_term=Term(log_term)))
    [resp] = read(r)
    assert (resp.type, resp.index, resp.reject, resp.reject_hint) == (
        MT.APP_RESP,
        resp_index,
        reject,
        hint,
    )


@pytest.mark.parametrize(
    ("index", "log_term", "ents", "want"),
    [
        (2, 2, [(3, 3)], [(1, 1), (2, 2), (3, 3)]),
        (1, 1, [(2, 3), (3, 4)], [(1, 1), (2, 3), (3, 4)]),
        (0, 0, [(1, 1)], [(1, 1), (2, 2)]),
        (0, 0, [(1, 3)], [(1, 3)]),
    ],
)
def test_5_3_follower_appends_and_truncates_conflicts(
    index: int, log_term: int, ents: list[tuple[int, int]], want: list[tuple[int, int]]
) -> None:
    """§5.3: "If an existing entry conflicts with a new one (same index but different terms),
    delete the existing entry and all that follow it; append any new entries." """
    st = storage_with([(1, 1), (2, 2)], [1, 2, 3])
    r = new_raft(1, [1, 2, 3], storage=st)
    r.become_follower(Term(2), NodeId(2))
    entries = tuple(Entry(Term(t), LogIndex(i)) for i, t in ents)
    r.step(
        msg(
            MT.APP,
            2,
            1,
            term=Term(2),
            index=LogIndex(index),
            log_term=Term(log_term),
            entries=entries,
        )
    )
    assert [(e.index, e.term) for e in r.log.all_entries()] == want


FIGURE_7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIGURE_7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("case", sorted(FIGURE_7_FOLLOWERS))
def test_5_3_figure_7_leader_brings_every_follower_in_line(case: str) -> None:
    """§5.3, Figure 7: whatever the follower's log (missing entries, extra entries, both),
    the leader's AppendEntries make it identical to the leader's."""
    lead_st = storage_with(enumerate(FIGURE_7_LEADER, start=1), [1, 2, 3])
    foll_terms = FIGURE_7_FOLLOWERS[case]
    foll_st = storage_with(enumerate(foll_terms, start=1), [1, 2, 3])
    lead = new_raft(1, [1, 2, 3], storage=lead_st)
    lead.term = Term(8)
    foll = new_raft(2, [1, 2, 3], storage=foll_st)
    foll.term = Term(max(foll_terms))
    net = Network(lead, foll, None)
    net.send(hup(1))
    # The third node votes; the follower may or may not (its log may be newer).
    assert lead.role is Role.LEADER
    net.send(prop(1, b"fill"))
    want = [(e.index, e.term) for e in lead.log.all_entries()]
    assert [(e.index, e.term) for e in foll.log.all_entries()] == want


# -- §5.4 safety ------------------------------------------------------------------------------


def test_5_4_1_vote_request_carries_last_log_position() -> None:
    """§5.4.1: "The RequestVote RPC includes information about the candidate's log"."""
    st = storage_with([(1, 1), (2, 2)], [1, 2, 3])
    r = new_raft(1, [1, 2, 3], storage=st)
    r.term = Term(3)
    r.step(hup(1))
    reqs = read(r)
    assert {(m.type, m.index, m.log_term, m.term) for m in reqs} == {(MT.VOTE, 2, 2, 4)}


@pytest.mark.parametrize(
    ("log", "index", "log_term", "grant"),
    [
        ([(1, 1)], 1, 1, True),  # same
        ([(1, 1)], 2, 1, True),  # longer
        ([(1, 1), (2, 1)], 1, 1, False),  # shorter
        ([(1, 2)], 1, 1, False),  # older last term
        ([(1, 2)], 1, 3, True),  # newer last term
        ([(1, 2), (2, 2)], 1, 3, True),  # newer term beats length
    ],
)
def test_5_4_1_election_restriction(
    log: list[tuple[int, int]], index: int, log_term: int, grant: bool
) -> None:
    """§5.4.1: "the voter denies its vote if its own log is more up-to-date than that of
    the candidate" (last term first, then length)."""
    r = new_raft(1, [1, 2, 3], storage=storage_with(log, [1, 2, 3]))
    r.step(msg(MT.VOTE, 2, 1, term=Term(5), index=LogIndex(index), log_term=Term(log_term)))
    [resp] = read(r)
    assert resp.reject is not grant


def test_5_4_2_leader_commits_only_by_counting_current_term() -> None:
    """§5.4.2: "Raft never commits log entries from previous terms by counting replicas";
    they commit with the first entry of the current term (Figure 8)."""
    st = storage_with([(1, 1), (2, 2)], [1, 2, 3])
    r = new_raft(1, [1, 2, 3], storage=st)
    r.term = Term(2)
    r.become_candidate()  # term 3
    r.become_leader()  # appends an empty entry at 3
    read(r)
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=LogIndex(2)))
    assert r.log.committed == 0, "an entry of term 2 replicated on a majority is not committed"
    r.step(msg(MT.APP_RESP, 2, 1, term=r.term, index=LogIndex(3)))
    assert r.log.committed == 3


def test_5_3_fast_backtracking_skips_a_term_per_round_trip() -> None:
    """§5.3 (the optimisation at its end): with the conflicting term in the rejection the
    leader skips all entries of that term at once instead of one index per round trip."""
    lead_st = storage_with([(i, 1) for i in range(1, 4)] + [(i, 5) for i in range(4, 40)], [1, 2])
    foll_st = storage_with([(i, 1) for i in range(1, 4)] + [(i, 3) for i in range(4, 60)], [1, 2])
    lead = new_raft(1, [1, 2], storage=lead_st)
    lead.term = Term(5)
    foll = new_raft(2, [1, 2], storage=foll_st)
    foll.term = Term(5)
    net = Network(lead, foll)
    net.send(hup(1))
    assert lead.role is Role.LEADER
    rejections = [m for m in net.delivered if m.type is MT.APP_RESP and m.reject]
    assert len(rejections) <= 2
    assert [(e.index, e.term) for e in foll.log.all_entries()] == [
        (e.index, e.term) for e in lead.log.all_entries()
    ]


def test_5_2_only_a_granted_vote_restarts_the_election_timer() -> None:
    """Figure 2 (Followers): convert to candidate if the election timeout elapses "without
    receiving AppendEntries RPC from current leader or granting vote to candidate". A
    candidate whose log is behind must not hold an up-to-date follower back forever."""
    r = new_raft(1, [1, 2], storage=storage_with([(1, 1), (2, 1)], [1, 2]))
    for _ in range(5):
        r.tick()
    r.step(msg(MT.VOTE, 2, 1, term=Term(2), index=LogIndex(1), log_term=Term(1)))
    [resp] = read(r)
    assert resp.reject and r.term == 2
    assert r.election_elapsed == 5
    r.step(msg(MT.VOTE, 2, 1, term=Term(3), index=LogIndex(2), log_term=Term(1)))
    [resp] = read(r)
    assert not resp.reject and r.election_elapsed == 0
