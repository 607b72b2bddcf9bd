"""Side-band multiplexing of pack data, progress and errors over pkt-lines.

Format (Git ``Documentation/gitprotocol-capabilities.txt``, "side-band,
side-band-64k"; ``gitprotocol-v2.txt``, "fetch", ``sideband-all``):

    sideband-pkt = pkt-len band data       one data-pkt whose first payload byte is the band
    band 1       primary data: the pack (or, with sideband-all, every response line)
    band 2       progress text for the user's terminal ("0005\\x02" is a keepalive)
    band 3       a fatal error message, sent just before the stream aborts

Keepalives (git ``builtin/upload-pack.c``, ``uploadpack.keepAlive``;
``builtin/receive-pack.c``, ``copy_to_sideband``): an empty data packet on a
band the reader skips. upload-pack sends ``0005\\x02`` (empty progress);
receive-pack sends ``0005\\x01`` (empty primary data, which the client's report
reader takes as no bytes), and only once the client's pack is all in.

Progress text is what git's ``progress.c`` ``display`` writes: ``<title>:
<pct>% (<done>/<total>)`` with the percentage right-aligned in 3 columns, or
``<title>: <done>`` without a total; ``\\r`` between updates of a line and
``, done.\\n`` after its last. The client shows each line after ``remote: ``.

A side-band packet is at most 1000 bytes ("side-band") or 65520 bytes
("side-band-64k"), the 4 length bytes and the band byte included, so it
carries at most 995 or 65515 bytes of data. (The capabilities page speaks of
999 and 65519 bytes of payload, leaving out the length bytes; git's
``send_sideband`` writes ``packet_max - 5`` bytes of data, and so do we.)

flush-, delim- and response-end-pkts carry no band byte and pass through the
demultiplexer unchanged; an empty data-pkt has no band and is an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

from enroute_core.base.errors import InvalidPktLine, LimitExceeded
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.pktline import (
    NEED_DATA,
    PKT_LEN_BYTES,
    PKT_LINE_BYTES_MAX,
    Data,
    Delim,
    EndOfStream,
    Flush,
    NeedData,
    PktLineReader,
    ResponseEnd,
)

__all__ = [
    "BAND_ERROR",
    "BAND_PACK",
    "BAND_PROGRESS",
    "RECEIVE_KEEPALIVE",
    "SIDEBAND_64K_DATA_BYTES_MAX",
    "SIDEBAND_64K_PACKET_BYTES_MAX",
    "SIDEBAND_DATA_BYTES_MAX",
    "SIDEBAND_PACKET_BYTES_MAX",
    "DemuxEvent",
    "PackData",
    "Progress",
    "RemoteError",
    "SidebandDemux",
    "SidebandEvent",
    "demux_payload",
    "progress_text",
    "sideband_mux",
    "sideband_parts",
    "sideband_pkt",
]

BAND_PACK: Final = 1
BAND_PROGRESS: Final = 2
BAND_ERROR: Final = 3

_BAND_BYTES: Final = 1
RECEIVE_KEEPALIVE: Final = b"0005\x01"
"""receive-pack's keepalive: an empty band-1 packet (receive-pack.c ``copy_to_sideband``)."""
SIDEBAND_PACKET_BYTES_MAX: Final = 1000
SIDEBAND_64K_PACKET_BYTES_MAX: Final = PKT_LINE_BYTES_MAX
SIDEBAND_DATA_BYTES_MAX: Final = SIDEBAND_PACKET_BYTES_MAX - PKT_LEN_BYTES - _BAND_BYTES  # 995
SIDEBAND_64K_DATA_BYTES_MAX: Final = (
    SIDEBAND_64K_PACKET_BYTES_MAX - PKT_LEN_BYTES - _BAND_BYTES
)  # 65515


@dataclass(frozen=True, slots=True)
class PackData:
    """Band 1: a slice of the pack (or one response line under sideband-all)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Progress:
    """Band 2: progress text, shown to the user as is (may hold CR, LF or nothing)."""

    message: bytes


@dataclass(frozen=True, slots=True)
class RemoteError:
    """Band 3: the sender's fatal error; the stream aborts after it."""

    message: bytes


SidebandEvent = PackData | Progress | RemoteError
DemuxEvent = PackData | Progress | RemoteError | Data | Flush | Delim | ResponseEnd | EndOfStream


# -- encoding -----------------------------------------------------------------


def sideband_pkt(band: int, data: bytes | bytearray | memoryview) -> bytes:
    """One side-band packet; ``sideband_pkt(2, b"")`` is the sideband-all keepalive."""
    assert BAND_PACK <= band <= BAND_ERROR, band
    size = len(data)
    if size > SIDEBAND_64K_DATA_BYTES_MAX:
        raise LimitExceeded("sideband_data_bytes", size, SIDEBAND_64K_DATA_BYTES_MAX)
    return _band_header(band, size) + data


def _band_header(band: int, size: int) -> bytes:
    return b"%04x%c" % (size + PKT_LEN_BYTES + _BAND_BYTES, band)


def sideband_parts(
    band: int, data: bytes | bytearray | memoryview, *, max_payload: int
) -> list[bytes | memoryview]:
    """The packets of :func:`sideband_mux` as header and payload, the payload a view of
    ``data``: ``b"".join`` of them frames a pack piece in one copy (the packets copy
    each payload once, their join a second time)."""
    assert BAND_PACK <= band <= BAND_ERROR, band
    assert 1 <= max_payload <= SIDEBAND_64K_DATA_BYTES_MAX, max_payload
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    for start in range(0, len(view), max_payload):
        payload = view[start : start + max_payload]
        parts += (_band_header(band, len(payload)), payload)
    return parts


def sideband_mux(
    band: int, data: bytes | bytearray | memoryview, *, max_payload: int
) -> Iterator[bytes]:
    """Split ``data`` into side-band packets of at most ``max_payload`` data bytes each.

    ``max_payload`` is :data:`SIDEBAND_DATA_BYTES_MAX` for "side-band" and
    :data:`SIDEBAND_64K_DATA_BYTES_MAX` for "side-band-64k". Empty data gives no
    packet, as in git's ``send_sideband``. Lazy, so a large pack is framed
    without a second copy of it.
    """
    assert BAND_PACK <= band <= BAND_ERROR, band
    assert 1 <= max_payload <= SIDEBAND_64K_DATA_BYTES_MAX, max_payload
    view = memoryview(data)
    for start in range(0, len(view), max_payload):
        yield sideband_pkt(band, view[start : start + max_payload])


def progress_text(title: str, done: int, total: int | None = None, *, final: bool = False) -> bytes:
    """One progress update as git's ``progress.c`` shows it (``Resolving deltas:  45%
    (450/1000)\\r``; ``, done.\\n`` when ``final``). ``total`` None: a bare count."""
    if total:
        percent = min(done, total) * 100 // total
        counters = f"{percent:3d}% ({done}/{total})"
    else:
        counters = f"{done}"
    return f"{title}: {counters}{', done.' + chr(10) if final else chr(13)}".encode()


# -- decoding -----------------------------------------------------------------


def demux_payload(payload: bytes) -> SidebandEvent:
    """Split the band byte off one data-pkt payload.

    Git's ``demultiplex_sideband`` calls an empty payload "missing sideband
    designator" and any band but 1, 2 or 3 "bad band"; both are fatal.
    """
    if not payload:
        raise InvalidPktLine("side-band packet has no band byte")
    band = payload[0]
    if band == BAND_PACK:
        return PackData(payload[1:])
    if band == BAND_PROGRESS:
        return Progress(payload[1:])
    if band == BAND_ERROR:
        return RemoteError(payload[1:])
    raise InvalidPktLine(f"bad side-band band {band}", band=band)


class SidebandDemux:
    """A push parser over pkt-line bytes that splits data-pkts by band.

    Same contract, bound and error state as :class:`PktLineReader`, which it
    wraps. Two modes:

    - ``sideband_all=True``: every data-pkt carries a band byte from the
      first one on (v2 ``sideband-all``).
    - ``sideband_all=False``: data-pkts pass through as :class:`Data` until
      :meth:`begin_sideband` (v0 after the final NAK/ACK line; v2 after the
      "packfile" section header).

    flush-, delim- and response-end-pkts always pass through; the caller
    decides what they end.
    """

    __slots__ = ("_error", "_reader", "_sideband")

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS, sideband_all: bool = False) -> None:
        self._reader = PktLineReader(limits=limits)
        self._sideband = sideband_all
        self._error: InvalidPktLine | None = None

    @property
    def sideband(self) -> bool:
        """Whether data-pkts are being split by band."""
        return self._sideband

    @property
    def buffered_bytes(self) -> int:
        return self._reader.buffered_bytes

    def begin_sideband(self) -> None:
        """From the next data-pkt on, read a band byte first."""
        self._raise_if_failed()
        self._sideband = True

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._raise_if_failed()
        self._reader.feed(data)

    def feed_eof(self) -> None:
        self._raise_if_failed()
        self._reader.feed_eof()

    def take_trailing_data(self) -> bytes:
        self._raise_if_failed()
        return self._reader.take_trailing_data()

    def next_event(self) -> DemuxEvent | Literal[NeedData.NEED_DATA]:
        self._raise_if_failed()
        event = self._reader.next_event()
        if event is NEED_DATA or not self._sideband or not isinstance(event, Data):
            return event
        try:
            return demux_payload(event.payload)
        except InvalidPktLine as exc:
            self._error = exc
            raise

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error.with_traceback(None)
