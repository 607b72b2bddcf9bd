"""receive.py refuses push commands git's receive-pack refuses (gitprotocol-pack,
"Reference Update Request and Packfile Transfer"; docs/security.md)."""

from __future__ import annotations

import pytest

from enroute_core.base.errors import EnrouteError, InvalidRefName, LimitExceeded, ProtocolError
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import FLUSH_PKT, NEED_DATA, pkt_line
from enroute_core.protocol.receive import PushRequest, ReceivePack

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
    ("ref", "error", "text"),
    [
        (b"HEAD", InvalidRefName, "one component"),
        (b"heads/main", InvalidRefName, "not under refs/"),
        (b"refs/heads/a..b", InvalidRefName, "'..'"),
        (b"refs/heads/a\x7fb", InvalidRefName, "control character"),
        (b"refs/heads/x.lock", InvalidRefName, ".lock"),
        (b"refs/heads/" + b"r" * 100, InvalidRefName, "longer than 64"),
    ],
)
def test_bad_refs_are_refused(ref: bytes, error: type[EnrouteError], text: str) -> None:
    with pytest.raises(error, match=text):
        request(ref, limits=Limits(ref_name_bytes_max=64))


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
