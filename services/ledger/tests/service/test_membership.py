"""Raft ids from ``ledger.members``, and the warning an even number of voters earns."""

from __future__ import annotations

import logging

import pytest

from enroute_core.config import Config
from enroute_ledger.main import membership

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
