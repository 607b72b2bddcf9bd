"""pkt-line framing: encode packets, and a push parser that decodes them.

Format (Git ``Documentation/gitprotocol-common.txt``, "pkt-line Format";
``gitprotocol-v2.txt``, "Packet-Line Framing"):

    pkt-line  = pkt-len pkt-payload        pkt-len counts itself: 4 + len(payload)
    pkt-len   = 4 hex digits               written lowercase; read in either case
    "0000"    flush-pkt                    end of a message
    "0001"    delim-pkt                    separates sections (v2)
    "0002"    response-end-pkt             end of a response, stateless (v2)
    "0003"    invalid
    "0004"    data-pkt with an empty payload (senders SHOULD NOT send it)
    "0005".."fff0"                         data-pkt; at most 65520 bytes in all,
                                           so at most 65516 bytes of payload

Decoding is sans-IO in the manner of h11: the caller feeds bytes with
:meth:`PktLineReader.feed`, then calls :meth:`PktLineReader.next_event` until it
returns :data:`NEED_DATA`. Malformed input raises a typed error and the reader
stays failed: every later call raises the same error again.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

from enroute_core.base.errors import InvalidPktLine, LimitExceeded
from enroute_core.base.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "DELIM_PKT",
    "FLUSH_PKT",
    "NEED_DATA",
    "PKT_LEN_BYTES",
    "PKT_LINE_BYTES_MAX",
    "PKT_PAYLOAD_BYTES_MAX",
    "RESPONSE_END_PKT",
    "Data",
    "Delim",
    "EndOfStream",
    "Flush",
    "NeedData",
    "PktEvent",
    "PktLineReader",
    "PktPacket",
    "ResponseEnd",
    "encode_event",
    "err_message",
    "err_pkt",
    "iter_pkt_lines",
    "pkt_line",
    "pkt_text",
    "strip_lf",
]

PKT_LEN_BYTES: Final = 4
PKT_LINE_BYTES_MAX: Final = 65520
PKT_PAYLOAD_BYTES_MAX: Final = PKT_LINE_BYTES_MAX - PKT_LEN_BYTES  # 65516
# The largest value four hex digits can hold; a Limits value above it is meaningless.
_PKT_LEN_VALUE_MAX: Final = 0xFFFF

FLUSH_PKT: Final = b"0000"
DELIM_PKT: Final = b"0001"
RESPONSE_END_PKT: Final = b"0002"


# -- events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Data:
    """A data-pkt; ``payload`` excludes the 4 length bytes and may be empty ("0004")."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Flush:
    """flush-pkt "0000": the end of a message (gitprotocol-common)."""


@dataclass(frozen=True, slots=True)
class Delim:
    """delim-pkt "0001": a section boundary (gitprotocol-v2, "Packet-Line Framing")."""


@dataclass(frozen=True, slots=True)
class ResponseEnd:
    """response-end-pkt "0002": a stateless response is over (gitprotocol-v2)."""


@dataclass(frozen=True, slots=True)
class EndOfStream:
    """The input ended cleanly on a packet boundary after :meth:`PktLineReader.feed_eof`."""


class NeedData(enum.Enum):
    """The type of :data:`NEED_DATA`; an enum so that ``is`` narrows it for the type checker."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA
"""Returned by ``next_event`` when no whole packet is buffered: feed more bytes."""

PktPacket = Data | Flush | Delim | ResponseEnd
PktEvent = Data | Flush | Delim | ResponseEnd | EndOfStream

_FLUSH: Final = Flush()
_DELIM: Final = Delim()
_RESPONSE_END: Final = ResponseEnd()
_END: Final = EndOfStream()


# -- encoding -----------------------------------------------------------------


def pkt_line(data: bytes | bytearray | memoryview) -> bytes:
    """Frame ``data`` as one data-pkt; over 65516 bytes of payload is refused.

    gitprotocol-common: "Implementations MUST NOT send pkt-line whose length
    exceeds 65520". An empty payload gives "0004", which the spec lets
    receivers accept but asks senders to avoid.
    """
    size = len(data)
    if size > PKT_PAYLOAD_BYTES_MAX:
        raise LimitExceeded("pkt_line_payload_bytes", size, PKT_PAYLOAD_BYTES_MAX)
    return b"%04x" % (size + PKT_LEN_BYTES) + data


def pkt_text(line: bytes) -> bytes:
    """Frame a text line with its LF, as git writes them.

    gitprotocol-common: "A non-binary line SHOULD BE terminated by an LF".
    """
    return pkt_line(line + b"\n")


def err_pkt(message: bytes) -> bytes:
    """Frame an ``ERR`` packet, which a git client shows as "remote error: <message>".

    gitprotocol-pack, "Pack Protocol": ``error-line = PKT-LINE("ERR" SP explanation-text)``.
    """
    return pkt_text(b"ERR " + message)


def encode_event(event: PktPacket) -> bytes:
    """The wire bytes of one packet event; ``decode(encode_event(e)) == e``."""
    if isinstance(event, Data):
        return pkt_line(event.payload)
    if isinstance(event, Flush):
        return FLUSH_PKT
    if isinstance(event, Delim):
        return DELIM_PKT
    return RESPONSE_END_PKT


def strip_lf(payload: bytes) -> bytes:
    """Drop one trailing LF from a text payload.

    gitprotocol-common: receivers "MUST treat pkt-lines with non-binary data
    the same whether or not they contain the trailing LF".
    """
    return payload[:-1] if payload.endswith(b"\n") else payload


def err_message(payload: bytes) -> bytes | None:
    """The explanation of an ``ERR`` packet payload, or None when it is not one."""
    if payload.startswith(b"ERR "):
        return strip_lf(payload[4:])
    return None


# -- decoding -----------------------------------------------------------------

_HEX_DIGITS: Final = b"0123456789abcdefABCDEF"
# Git's own reader accepts both cases, though the ABNF in gitprotocol-common
# names only lowercase; being as liberal as git keeps every git client working.
_HEX_VALUE: Final[tuple[int, ...]] = tuple(
    int(chr(b), 16) if b in _HEX_DIGITS else -1 for b in range(256)
)


def _decode_len(buf: bytearray, pos: int) -> int:
    """The pkt-len at ``pos``, or -1 when any of the four bytes is not a hex digit.

    ``int(x, 16)`` is not used: it accepts signs, spaces and underscores.
    """
    hv = _HEX_VALUE
    a, b, c, d = hv[buf[pos]], hv[buf[pos + 1]], hv[buf[pos + 2]], hv[buf[pos + 3]]
    if a < 0 or b < 0 or c < 0 or d < 0:
        return -1
    return (a << 12) | (b << 8) | (c << 4) | d


class PktLineReader:
    """A push parser: bytes in through :meth:`feed`, packet events out of :meth:`next_event`.

    Caller's contract:

    1. ``feed(chunk)``, then call ``next_event()`` until it returns
       :data:`NEED_DATA`; only then feed again.
    2. At the end of input call ``feed_eof()`` and drain: the last event is
       :class:`EndOfStream`, or :class:`InvalidPktLine` if the input stopped
       inside a packet.
    3. To hand the rest of the stream to another parser (a raw pack after the
       flush-pkt of a v0 push), stop calling ``next_event`` and take
       :meth:`take_trailing_data`.

    Bound: when the caller keeps rule 1, the unconsumed bytes never exceed
    ``limits.pkt_line_bytes_max - 1`` plus the chunk just fed (a packet longer
    than the limit fails on its 4-byte header, before its payload is
    buffered). Consumed bytes are dropped lazily, once they are at least as
    many as the unconsumed ones, so the buffer holds under twice that bound
    and each byte is moved O(1) times however the stream is chunked.

    Errors: a bad pkt-len raises :class:`InvalidPktLine` (:class:`LimitExceeded`
    for one over ``limits.pkt_line_bytes_max``); from then on every method
    raises that error again.
    """

    __slots__ = ("_buf", "_eof", "_error", "_max", "_pos", "_start_offset")

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS) -> None:
        maximum = limits.pkt_line_bytes_max
        assert PKT_LEN_BYTES <= maximum <= _PKT_LEN_VALUE_MAX, maximum
        self._max = maximum
        self._buf = bytearray()
        self._pos = 0  # next unconsumed byte in _buf
        self._start_offset = 0  # stream offset of _buf[0], for error details
        self._eof = False
        self._error: InvalidPktLine | LimitExceeded | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet returned as events."""
        return len(self._buf) - self._pos

    @property
    def failed(self) -> bool:
        return self._error is not None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._raise_if_failed()
        assert not self._eof, "feed() after feed_eof()"
        if not data:
            return
        pending = len(self._buf) - self._pos
        assert pending < self._max, "feed() before next_event() returned NEED_DATA"
        if pending == 0:
            self._start_offset += len(self._buf)
            self._buf = bytearray(data)
            self._pos = 0
            return
        if self._pos >= pending:
            self._start_offset += self._pos
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def feed_eof(self) -> None:
        """No more bytes will come; a packet cut short now fails instead of waiting."""
        self._raise_if_failed()
        self._eof = True

    def next_event(self) -> PktEvent | Literal[NeedData.NEED_DATA]:
        self._raise_if_failed()
        try:
            return self._next()
        except (InvalidPktLine, LimitExceeded) as exc:
            self._error = exc
            raise

    def take_trailing_data(self) -> bytes:
        """Remove and return the unconsumed bytes, for a parser of what follows."""
        self._raise_if_failed()
        rest = bytes(self._buf[self._pos :])
        self._start_offset += len(self._buf)
        self._buf = bytearray()
        self._pos = 0
        return rest

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error.with_traceback(None)

    def _next(self) -> PktEvent | Literal[NeedData.NEED_DATA]:
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail >= PKT_LEN_BYTES:
            size = _decode_len(buf, pos)
            if size >= PKT_LEN_BYTES:
                if size > self._max:
                    raise self._too_long(size)
                if avail < size:
                    return self._need_data(avail, size)
                self._pos = pos + size
                return Data(bytes(buf[pos + PKT_LEN_BYTES : pos + size]))
            if size == 0:
                self._pos = pos + PKT_LEN_BYTES
                return _FLUSH
            if size == 1:
                self._pos = pos + PKT_LEN_BYTES
                return _DELIM
            if size == 2:
                self._pos = pos + PKT_LEN_BYTES
                return _RESPONSE_END
            header = bytes(buf[pos : pos + PKT_LEN_BYTES])
            raise InvalidPktLine(
                f"bad pkt-line length {header!r} at offset {self._offset()}",
                offset=self._offset(),
                header=header.hex(),
            )
        if avail == 0 and self._eof:
            return _END
        return self._need_data(avail, PKT_LEN_BYTES)

    def _too_long(self, size: int) -> LimitExceeded:
        offset = self._offset()
        exc = LimitExceeded(
            "pkt_line_bytes_max",
            size,
            self._max,
            f"pkt-line of {size} bytes at offset {offset} is over the limit of {self._max}",
        )
        exc.details["offset"] = offset
        return exc

    def _need_data(self, avail: int, wanted: int) -> Literal[NeedData.NEED_DATA]:
        if self._eof:
            raise InvalidPktLine(
                f"input ends inside a pkt-line at offset {self._offset()}: "
                f"{avail} of {wanted} bytes",
                offset=self._offset(),
                have=avail,
                want=wanted,
            )
        return NEED_DATA

    def _offset(self) -> int:
        return self._start_offset + self._pos


def iter_pkt_lines(
    data: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS
) -> Iterator[PktPacket]:
    """Decode a whole buffer; fails (lazily, where the bad packet is) like the reader does."""
    reader = PktLineReader(limits=limits)
    reader.feed(data)
    reader.feed_eof()
    while True:
        event = reader.next_event()
        if isinstance(event, EndOfStream):
            return
        assert event is not NEED_DATA  # the reader saw EOF: it never waits
        yield event
