"""receive.py refuses push commands git's receive-pack refuses (gitprotocol-pack,
"Reference Update Request and Packfile Transfer"; docs/security.md)."""

from __future__ import annotations

import pytest

from enroute_core.base.errors import LimitExceeded, ProtocolError
from enroute_core.base.ids import ZERO_OID, ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import FLUSH_PKT, NEED_DATA, pkt_line
from enroute_core.protocol.receive import (
    FUNNY_REFNAME,
    PushRequest,
    ReceivePack,
    ref_is_pushable,
)

OLD = b"0" * 40
NEW = b"1" * 40


def request(*refs: bytes, limits: Limits | None = None) -> PushRequest:
    lines = [
        pkt_line(OLD + b" " + NEW + b" " + r + (b"\0report-status" if i == 0 else b"") + b"\n")
        for i, r in enumerate(refs)
    ]
    conv = ReceivePack(limits=limits or Limits())
    conv.feed(b"".join(lines) + FLUSH_PKT + b"PACK")
    while True:
        event = conv.next_event()
        assert event is not NEED_DATA
        if isinstance(event, PushRequest):
            return event


def test_good_refs_pass() -> None:
    assert [c.ref for c in request(b"refs/heads/main", b"refs/tags/v1").commands] == [
        b"refs/heads/main",
        b"refs/tags/v1",
    ]


@pytest.mark.parametrize(
    "ref",
    [
        b"HEAD",
        b"heads/main",
        b"HEAD/x",
        b"refs/foo",  # one level under refs/: git takes it for a delete only
        b"refs/heads/a..b",
        b"refs/heads/a\x7fb",
        b"refs/heads/a\x01b",
        b"refs/heads/a b",
        b"refs/heads/x.lock",
        b"refs/heads/" + b"r" * 100,
    ],
)
def test_bad_refs_are_refused_one_by_one(ref: bytes) -> None:
    """receive-pack.c ``update``: ``ng <ref> funny refname`` for that command alone."""
    commands = request(b"refs/heads/ok", ref, b"refs/tags/v1", limits=Limits(ref_name_bytes_max=64))
    assert [c.ref for c in commands.commands] == [b"refs/heads/ok", ref, b"refs/tags/v1"]
    assert [c.refusal for c in commands.commands] == [None, FUNNY_REFNAME, None]
    assert not ref_is_pushable(
        ref, ObjectId(bytes.fromhex(NEW.decode())), Limits(ref_name_bytes_max=64)
    )


def test_one_level_ref_may_be_deleted() -> None:
    assert ref_is_pushable(b"refs/foo", ZERO_OID)
    assert not ref_is_pushable(b"refs/foo", ObjectId(b"\x01" * 20))
    assert not ref_is_pushable(b"refs/a..b", ZERO_OID)
    assert ref_is_pushable(
        b"refs/heads/" + b"r" * 53, ObjectId(b"\x01" * 20), Limits(ref_name_bytes_max=64)
    )
    assert not ref_is_pushable(
        b"refs/heads/" + b"r" * 54, ObjectId(b"\x01" * 20), Limits(ref_name_bytes_max=64)
    )


def test_command_count_is_bounded() -> None:
    with pytest.raises(LimitExceeded):
        request(
            *(b"refs/heads/b%d" % i for i in range(4)), limits=Limits(protocol_push_commands_max=3)
        )


def test_bad_oids_are_refused() -> None:
    conv = ReceivePack()
    conv.feed(pkt_line(b"z" * 40 + b" " + NEW + b" refs/heads/main\n") + FLUSH_PKT)
    with pytest.raises(ProtocolError, match="old-oid"):
        conv.next_event()
