"""Golden vectors of the ledger membership record (docs/formats/ledger-membership.md).

``ledger/membership`` is read by every voter at start and every second, and
written by compare-and-swap from any of them and from the operator's command:
its bytes are a format. These vectors pin one record with a change open and one
without; each decodes to its values and encodes back byte for byte, and the
records the page calls corrupt are refused as ``CorruptData``.
"""

from __future__ import annotations

import pytest

from enroute_core.base.errors import CorruptData
from enroute_ledger.membership import Record, Recovery, founding_record

A, B, C, E = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.5:7000"
ADDING = (
    b'{"epoch": 3, "format": 1, "founders": 3, "next_id": 6, "retired": [4], '
    b'"target": {"1": "10.0.0.1:7000", "2": "10.0.0.2:7000", "3": "10.0.0.3:7000", '
    b'"5": "10.0.0.5:7000"}, '
    b'"voters": {"1": "10.0.0.1:7000", "2": "10.0.0.2:7000", "3": "10.0.0.3:7000"}}'
)
"""Voter 4 was removed earlier (retired); voter 5 is being added."""
FOUNDED = (
    b'{"epoch": 1, "format": 1, "founders": 3, "next_id": 4, "retired": [], '
    b'"target": null, "voters": {"1": "a:1", "2": "b:1", "3": "c:1"}}'
)
"""The record the first voter to start writes from ``ledger.members``."""
RECOVERING = (
    b'{"epoch": 2, "format": 1, "founders": 2, "next_id": 4, '
    b'"recovery": {"lost": 2, "new": 3, "survivor": 1}, "retired": [2], '
    b'"target": {"1": "10.0.0.1:7000", "3": "10.0.0.9:7000"}, '
    b'"voters": {"1": "10.0.0.1:7000", "2": "10.0.0.2:7000"}}'
)
"""A two-voter recovery open: voter 2 lost (retired at once), voter 1 alone, voter 3 added."""


def test_a_record_with_a_change_open_is_its_vector() -> None:
    rec = Record(
        epoch=3,
        voters={1: A, 2: B, 3: C},
        next_id=6,
        founders=3,
        target={1: A, 2: B, 3: C, 5: E},
        retired=(4,),
    )
    assert rec.encode() == ADDING
    assert Record.decode(ADDING) == rec
    assert rec.view == {1: A, 2: B, 3: C, 5: E}
    assert rec.change_text() == f"add 5 ({E})"


def test_the_founding_record_is_its_vector() -> None:
    rec = founding_record(["a:1", "b:1", "c:1"])
    assert rec.encode() == FOUNDED
    assert Record.decode(FOUNDED) == rec
    assert rec.view == rec.voters and rec.change_text() == ""


def test_a_record_with_a_recovery_open_is_its_vector() -> None:
    rec = Record(
        epoch=2,
        voters={1: A, 2: B},
        next_id=4,
        founders=2,
        target={1: A, 3: "10.0.0.9:7000"},
        retired=(2,),
        recovery=Recovery(survivor=1, lost=2, new=3),
    )
    assert rec.encode() == RECOVERING
    assert Record.decode(RECOVERING) == rec
    assert rec.change_text() == "recover: voter 2 lost, voter 1 alone, then add 3 (10.0.0.9:7000)"


@pytest.mark.parametrize(
    "data",
    [
        FOUNDED.replace(b'"format": 1', b'"format": 2'),  # a format this reader does not know
        FOUNDED.replace(b'"next_id": 4', b'"next_id": 3'),  # an id not below next_id
        FOUNDED.replace(b'"voters": {"1": "a:1", "2": "b:1", "3": "c:1"}', b'"voters": {}'),
        FOUNDED.replace(b'"founders": 3, ', b""),  # a key missing
        FOUNDED[:-1],  # cut short
        b"[]",
        RECOVERING.replace(b'"retired": [2]', b'"retired": []'),  # the lost id not retired
        RECOVERING.replace(b'"target": {"1"', b'"target": null, "x": {"1"'),  # no target
    ],
    ids=[
        "format",
        "next-id",
        "no-voters",
        "missing-key",
        "truncated",
        "not-an-object",
        "recovery-lost-not-retired",
        "recovery-without-target",
    ],
)
def test_a_corrupt_record_is_refused(data: bytes) -> None:
    with pytest.raises(CorruptData):
        Record.decode(data)
