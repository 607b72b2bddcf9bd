"""The record's steps of a two-voter recovery and the survivor's consent.

docs/raft.md, "Recovering a two-voter ledger": the lost id retires the moment the
recovery opens, the steps are idempotent, and every case that cannot be made safe
is refused with a message that says why and what to run instead.
"""

from __future__ import annotations

import pytest

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_ledger.membership import (
    HEALTHY_S,
    NOT_THE_SURVIVOR,
    Record,
    Recovery,
    begin_add,
    begin_recover,
    begin_remove,
    finish,
    founding_record,
    recovery_refusal,
    resolve,
)

A, B, C, NEW = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.9:7000"
NOW_US = 1_000_000_000_000


def _two() -> Record:
    return founding_record([A, B])


def test_recovery_retires_the_lost_id_at_once_and_closes_like_a_change() -> None:
    rec = _two()
    opened = begin_recover(rec, 2, NEW, 1)
    assert opened.recovery == Recovery(survivor=1, lost=2, new=3)
    assert opened.target == {1: A, 3: NEW} and opened.voters == rec.voters
    assert opened.retired == (2,) and opened.next_id == 4 and opened.epoch == rec.epoch + 1
    assert opened.change_text() == f"recover: voter 2 lost, voter 1 alone, then add 3 ({NEW})"
    assert Record.decode(opened.encode()) == opened
    assert begin_recover(opened, 2, NEW, 1) == opened  # the same command again
    with pytest.raises(InvalidArgument, match="a membership change is open"):
        begin_add(opened, C)
    with pytest.raises(InvalidArgument, match="a membership change is open"):
        begin_recover(opened, 2, C, 1)  # another address: another recovery
    done = finish(opened)
    assert done.voters == {1: A, 3: NEW} and done.target is None and done.recovery is None
    assert done.retired == (2,)
    assert b"recovery" not in done.encode()  # the key is there only while one is open
    assert begin_recover(done, 2, NEW, 1) == done  # done already
    assert begin_remove(done, 2) == done


def test_the_lost_voter_is_refused_at_start_once_the_recovery_opened() -> None:
    opened = begin_recover(_two(), 2, NEW, 1)
    with pytest.raises(InvalidArgument, match="its id is never used again"):
        resolve(opened, [A, B], "2", B, None)
    me, peers = resolve(opened, [A, B], "3", NEW, None)
    assert me == 3 and peers == {1: A}
    me, peers = resolve(opened, [A, B], "1", A, None)
    assert me == 1 and peers == {3: NEW}


@pytest.mark.parametrize(
    ("rec", "lost", "address", "survivor", "message"),
    [
        (founding_record([A, B, C]), 2, NEW, 1, "for two voters only"),
        (founding_record([A]), 1, NEW, 1, "for two voters only"),
        (begin_add(founding_record([A, B]), C), 2, NEW, 1, "a membership change is open"),
        (founding_record([A, B]), 1, NEW, 1, "two different voters"),
        (founding_record([A, B]), 2, NEW, 3, "two different voters"),
        (founding_record([A, B]), 3, NEW, 1, "two different voters"),
        (founding_record([A, B]), 2, A, 1, "needs its own"),
        (founding_record([A, B]), 2, "nohost", 1, "not HOST:PORT"),
    ],
    ids=[
        "three-voters",
        "one-voter",
        "change-open",
        "self",
        "survivor-unknown",
        "lost-unknown",
        "address-taken",
        "bad-address",
    ],
)
def test_what_is_never_safe_is_refused(
    rec: Record, lost: int, address: str, survivor: int, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        begin_recover(rec, lost, address, survivor)


def _report(age_s: float, blank: int) -> dict[str, object]:
    return {"id": 2, "epoch": 1, "blank": blank, "at_us": NOW_US - int(age_s * 1e6)}


@pytest.mark.parametrize(
    ("me", "blank_here", "report", "refused"),
    [
        (1, 0, None, ""),  # the lost voter never reported: gone
        (1, 0, _report(HEALTHY_S + 1, 0), ""),  # silent for longer than a report's life
        (1, 0, _report(1, 12), ""),  # it answers blank: its disk was wiped
        (1, 0, _report(1, 0), "it is not lost"),  # it answers with its data
        (1, 3, None, "lost its own disk too"),  # the survivor lacks committed entries
        (2, 0, None, NOT_THE_SURVIVOR),  # asked of the other voter
    ],
    ids=["never-reported", "silent", "blank", "holds-data", "survivor-blank", "not-survivor"],
)
def test_the_survivor_consents_only_when_it_can(
    me: int, blank_here: int, report: dict[str, object] | None, refused: str
) -> None:
    opened = begin_recover(_two(), 2, NEW, 1)
    got = recovery_refusal(opened, me, blank_here, report, NOW_US)
    assert (refused in got) if refused else got == ""


@pytest.mark.parametrize(
    "recovery",
    [
        b'{"lost": 1, "new": 3, "survivor": 2}',  # the lost id is not retired
        b'{"lost": 2, "new": 4, "survivor": 1}',  # the new id is not the target's
        b'{"lost": 2, "new": 3}',  # a key missing
    ],
)
def test_an_inconsistent_recovery_is_corrupt(recovery: bytes) -> None:
    good = begin_recover(_two(), 2, NEW, 1).encode()
    start = good.index(b'"recovery": ') + len(b'"recovery": ')
    end = good.index(b"}", start) + 1
    with pytest.raises(CorruptData):
        Record.decode(good[:start] + recovery + good[end:])
