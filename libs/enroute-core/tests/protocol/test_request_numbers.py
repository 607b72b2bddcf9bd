"""Numbers in fetch arguments are read as git's upload-pack reads them, and bounded.

gitprotocol-v2 "fetch" (deepen, deepen-since, filter) and gitprotocol-pack "Packfile
Negotiation"; the ranges are git's: ``deepen`` is an int (upload-pack.c
``process_deepen``, INFINITE_DEPTH = 2^31-1 unshallows), ``deepen-since`` a
``timestamp_t`` with -1 refused (``process_deepen_since``), ``tree:<n>`` and
``blob:limit=<n>`` an unsigned long with an optional k/m/g unit
(list-objects-filter-options.c, ``git_parse_ulong``). Every value out of range is a
ProtocolError that names the argument, never a huge number handed to the engine.
"""

from __future__ import annotations

import pytest

from enroute_core.base.errors import ProtocolError
from enroute_core.git.pktline import DELIM_PKT, FLUSH_PKT, pkt_text
from enroute_core.protocol.fetch import (
    DEEPEN_MAX,
    BlobLimit,
    FetchCommand,
    TreeDepth,
    UploadPackV2,
    parse_filter,
)

U64 = 2**64 - 1
WANT = b"want " + b"ab" * 20


def _fetch(*args: bytes) -> FetchCommand:
    body = pkt_text(b"command=fetch") + DELIM_PKT + b"".join(map(pkt_text, args)) + FLUSH_PKT
    conv = UploadPackV2()
    conv.feed(body)
    conv.feed_eof()
    event = conv.next_event()
    assert isinstance(event, FetchCommand)
    return event


@pytest.mark.parametrize(
    ("text", "depth"),
    [(b"1", 1), (b"2", 2), (b"2147483647", DEEPEN_MAX), (b"007", 7)],
)
def test_deepen_in_range(text: bytes, depth: int) -> None:
    assert _fetch(WANT, b"deepen " + text).request.deepen.depth == depth


@pytest.mark.parametrize(
    "text",
    [b"0", b"-1", b"2147483648", b"9223372036854775808", b"18446744073709551617",
     b"99999999999999999999", b"1" * 21, b"", b"x", b"1e9", b"0x10", b" 1"],
)  # fmt: skip
def test_deepen_out_of_range_is_refused(text: bytes) -> None:
    with pytest.raises(ProtocolError, match="deepen"):
        _fetch(WANT, b"deepen " + text)


@pytest.mark.parametrize(
    ("text", "since"), [(b"0", 0), (b"1", 1), (b"18446744073709551614", 2**64 - 2)]
)
def test_deepen_since_in_range(text: bytes, since: int) -> None:
    assert _fetch(WANT, b"deepen-since " + text).request.deepen.since == since


@pytest.mark.parametrize(
    "text", [b"-1", b"18446744073709551615", b"18446744073709551617", b"1" * 21, b"x", b""]
)
def test_deepen_since_out_of_range_is_refused(text: bytes) -> None:
    with pytest.raises(ProtocolError, match="deepen-since"):
        _fetch(WANT, b"deepen-since " + text)


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        (b"tree:0", TreeDepth(0)),
        (b"tree:2147483647", TreeDepth(2**31 - 1)),
        (b"tree:18446744073709551615", TreeDepth(U64)),
        (b"tree:1k", TreeDepth(1024)),
        (b"tree:2G", TreeDepth(2 << 30)),
        (b"blob:limit=0", BlobLimit(0)),
        (b"blob:limit=18446744073709551615", BlobLimit(U64)),
        (b"blob:limit=17179869183g", BlobLimit(17179869183 << 30)),
        (b"blob:limit=1K", BlobLimit(1024)),
    ],
)
def test_filter_numbers_in_range(spec: bytes, parsed: object) -> None:
    assert parse_filter(spec) == parsed
    assert _fetch(WANT, b"filter " + spec).request.filter == parsed


@pytest.mark.parametrize(
    "spec",
    [b"tree:18446744073709551616", b"tree:18446744073709551617", b"tree:-1", b"tree:",
     b"tree:16777216t", b"tree:17179869184g", b"blob:limit=18446744073709551616",
     b"blob:limit=17179869184g", b"blob:limit=-1", b"blob:limit=1kk", b"blob:limit=1" + b"0" * 20,
     b"tree:1 ", b"tree:x"],
)  # fmt: skip
def test_filter_numbers_out_of_range_are_refused(spec: bytes) -> None:
    with pytest.raises(ProtocolError, match="filter"):
        parse_filter(spec)
