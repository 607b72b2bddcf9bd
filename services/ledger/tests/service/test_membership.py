"""Raft ids from ``ledger.members``, and the warning an even number of voters earns."""

from __future__ import annotations

import logging

import pytest

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import NodeId
from enroute_core.config import Config
from enroute_ledger.main import membership
from enroute_ledger.membership import Record, begin_add, begin_remove, finish, founding_record

MEMBERS = ("10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000")


def _config(members: tuple[str, ...]) -> Config:
    return Config.model_validate({"ledger": {"members": list(members)}})


def test_ids_follow_the_member_list() -> None:
    me, peers = membership(_config(MEMBERS), MEMBERS[1])
    assert me == 2 and peers == {1: MEMBERS[0], 3: MEMBERS[2]}
    assert membership(_config(()), "127.0.0.1:7000") == (1, {})


def test_an_even_number_of_voters_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="enroute.ledger"):
        membership(_config(MEMBERS), MEMBERS[0])
        assert not caplog.records
        membership(_config(MEMBERS[:2]), MEMBERS[0])
    assert any("2 voters" in r.getMessage() for r in caplog.records)


# -- the membership record (docs/raft.md, "Membership changes") -------------------------------


def test_ids_are_never_given_twice_and_steps_are_idempotent() -> None:
    rec = founding_record(list(MEMBERS))
    assert (sorted(rec.voters), rec.next_id, rec.founders) == ([1, 2, 3], 4, 3)
    adding = begin_add(rec, "10.0.0.4:7000")
    assert adding.target is not None and sorted(adding.target) == [1, 2, 3, 4]
    assert begin_add(adding, "10.0.0.4:7000") == adding  # the same command again
    with pytest.raises(InvalidArgument, match="a membership change is open"):
        begin_remove(adding, 1)  # another change waits for this one
    grown = finish(adding)
    assert grown.target is None and sorted(grown.voters) == [1, 2, 3, 4]
    assert finish(grown) == grown
    removing = begin_remove(grown, 1)
    assert begin_remove(removing, 1) == removing
    shrunk = finish(removing)
    assert sorted(shrunk.voters) == [2, 3, 4] and shrunk.retired == (1,)
    assert begin_remove(shrunk, 1) == shrunk  # done already
    # the same address again is a new machine: it gets a new id, never 1 or 4
    again = begin_add(shrunk, MEMBERS[0])
    assert again.target is not None and set(again.target) - set(shrunk.voters) == {5}
    assert Record.decode(again.encode()) == again
    assert [r.epoch for r in (rec, adding, grown, removing, shrunk, again)] == [1, 2, 3, 4, 5, 6]


def test_a_member_list_the_record_denies_is_refused_naming_the_command() -> None:
    rec = founding_record(list(MEMBERS))
    five = [*MEMBERS, "10.0.0.4:7000", "10.0.0.5:7000"]
    six = (*five, "10.0.0.6:7000")
    with pytest.raises(InvalidArgument, match="enroute ledger add ADDRESS") as err:
        membership(_config(six), six[0], rec)
    assert "lists 6 voters" in err.value.message and "has 3" in err.value.message
    with pytest.raises(InvalidArgument, match="enroute ledger remove ID"):
        membership(_config(MEMBERS[:2]), MEMBERS[0], rec)
    # the two a chart adds to stay odd may be listed before they are added; each of
    # them is refused until `enroute ledger add` gives it its id
    assert membership(_config(tuple(five)), five[0], rec)[0] == 1
    with pytest.raises(InvalidArgument, match="is not a voter"):
        membership(_config(tuple(five)), five[3], rec)
    adding = begin_add(rec, five[3])
    # during the change both sizes start: the voters of before and the new one
    assert membership(_config(MEMBERS), MEMBERS[0], adding)[0] == 1
    me, peers = membership(_config(tuple(five[:4])), five[3], adding)
    assert me == 4 and peers == {1: MEMBERS[0], 2: MEMBERS[1], 3: MEMBERS[2]}
    shrunk = finish(begin_remove(finish(adding), 1))
    with pytest.raises(InvalidArgument, match="never used again"):
        membership(_config(MEMBERS), MEMBERS[0], shrunk, stored=NodeId(1))


def test_a_blank_voter_takes_the_id_the_record_gives_its_address() -> None:
    """A chart after 3 -> 5 -> 3: pods keep their ordinal node.id, ids 4 and 5 retire,
    and growing again gives pod 3's address a new id (docs/raft.md, "Starting a voter")."""
    five = (*MEMBERS, "10.0.0.4:7000", "10.0.0.5:7000")
    rec = finish(begin_add(finish(begin_add(founding_record(list(MEMBERS)), five[3])), five[4]))
    assert membership(_config(five), five[3], rec)[0] == 4  # blank: by address, not node.id
    shrunk = finish(begin_remove(finish(begin_remove(rec, 5)), 4))
    with pytest.raises(InvalidArgument, match="no open change adds it") as err:
        membership(_config(five), five[3], shrunk)  # no node.id, as in a bare config
    assert f"run `enroute ledger add {five[3]}`" in err.value.message
    pod3 = Config.model_validate(
        {"node": {"id": "4"}, "ledger": {"members": list(five), "advertise": five[3]}}
    )
    with pytest.raises(InvalidArgument, match=r"node\.id 4 was removed"):
        membership(pod3, "0.0.0.0:7000", shrunk)  # listens everywhere, advertises five[3]
    again = begin_add(shrunk, five[3])
    assert membership(pod3, "0.0.0.0:7000", again)[0] == 6  # never 4 again
    grown = finish(again)
    assert membership(pod3, "0.0.0.0:7000", grown)[0] == 6  # its disk lost: same voter, blank
    assert membership(pod3, "0.0.0.0:7000", grown, stored=NodeId(6))[0] == 6
    with pytest.raises(InvalidArgument, match="never used again"):
        membership(pod3, "0.0.0.0:7000", grown, stored=NodeId(4))  # its old volume kept
    # a founder's id is its node.id (the ordinal), whatever its address
    founder = Config.model_validate({"node": {"id": "2"}, "ledger": {"members": list(five)}})
    assert membership(founder, "0.0.0.0:7000", grown)[0] == 2
