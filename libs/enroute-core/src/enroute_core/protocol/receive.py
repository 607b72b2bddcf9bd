"""The receive-pack conversation (v0/v1): push commands in, opaque pack bytes, a report out.

Request (Git ``Documentation/gitprotocol-pack.txt``, "Reference Update Request
and Packfile Transfer"; ``gitprotocol-capabilities.txt``, "push-options"):

    *PKT-LINE("shallow" SP oid LF)
    PKT-LINE(old-oid SP new-oid SP refname NUL capability-list LF)
    *PKT-LINE(old-oid SP new-oid SP refname LF)
    flush-pkt
    [*PKT-LINE(push-option LF) flush-pkt]     when push-options was negotiated
    [packfile]                                 raw bytes to the end; none for deletes only

Report (``gitprotocol-pack.txt``, "Report Status"; report-status-v2):

    PKT-LINE("unpack" SP ("ok" | reason) LF)
    *(PKT-LINE("ok" SP refname LF) *option-line | PKT-LINE("ng" SP refname SP reason LF))
    flush-pkt
    option-line = PKT-LINE("option" SP ("refname" SP ref | "old-oid" SP oid
                           | "new-oid" SP oid | "forced-update") LF)

With side-band-64k the whole report, its flush-pkt included, travels in
band-1 packets and a last flush-pkt ends the response; progress goes on band 2
and a fatal error on band 3. Before the report, while the push works, empty
band-1 packets (``0005\x01``, :data:`~enroute_core.git.sideband.RECEIVE_KEEPALIVE`)
keep the connection alive, as receive-pack's ``copy_to_sideband`` sends them.
Warnings about objects the push let in (fsck's harmless classes) go on band 2
before the report, as receive-pack's ``rp_warning`` lines do; git shows them as
``remote: warning: ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from enroute_core.base.errors import EnrouteError, ProtocolError
from enroute_core.base.ids import OID_HEX_CHARS, ZERO_OID, ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.pktline import (
    FLUSH_PKT,
    NEED_DATA,
    EndOfStream,
    Flush,
    NeedData,
    pkt_line,
    pkt_text,
)
from enroute_core.git.refname import ref_name_problem
from enroute_core.git.sideband import (
    BAND_PACK,
    BAND_PROGRESS,
    SIDEBAND_64K_DATA_BYTES_MAX,
    sideband_mux,
    sideband_pkt,
)
from enroute_core.protocol._common import (
    Conversation,
    bounded_append,
    hex_oid,
    parse_capabilities,
    parse_oid,
    text_line,
)
from enroute_core.protocol.errors import ref_reason

__all__ = [
    "FUNNY_REFNAME",
    "PackChunk",
    "PushCommand",
    "PushEnd",
    "PushReport",
    "PushRequest",
    "ReceivePack",
    "RefOption",
    "RefStatus",
    "encode_push_request",
    "encode_report",
    "ref_is_pushable",
    "refused",
]


FUNNY_REFNAME = b"funny refname"
"""git's receive-pack reason for a ref name it will not touch (``update`` in receive-pack.c)."""


@dataclass(frozen=True, slots=True)
class PushCommand:
    old: ObjectId
    new: ObjectId
    ref: bytes
    refusal: bytes | None = None
    """Set when the command is refused before anything else (``funny refname``): the push
    reports ``ng <ref> <refusal>`` for it, and its other commands go on unless atomic."""

    @property
    def is_delete(self) -> bool:
        return self.new == ZERO_OID

    @property
    def is_create(self) -> bool:
        return self.old == ZERO_OID


@dataclass(frozen=True, slots=True)
class PushRequest:
    commands: tuple[PushCommand, ...]
    capabilities: tuple[bytes, ...] = ()
    shallows: tuple[ObjectId, ...] = ()
    push_options: tuple[bytes, ...] = ()

    def has(self, capability: bytes) -> bool:
        return capability in self.capabilities

    @property
    def expects_pack(self) -> bool:
        """A pack follows unless every command deletes (gitprotocol-pack)."""
        return any(not c.is_delete for c in self.commands)


@dataclass(frozen=True, slots=True)
class PackChunk:
    """Raw pack bytes, in order, for the indexer; never looked into here."""

    data: bytes


@dataclass(frozen=True, slots=True)
class PushEnd:
    """The request body ended; ``pack_bytes`` counts the pack bytes handed over."""

    pack_bytes: int


PushEvent = PushRequest | PackChunk | PushEnd


class ReceivePack(Conversation[PushEvent]):
    """Server side of a v0/v1 receive-pack request body.

    States: SHALLOW/COMMANDS -(flush)-> OPTIONS (if push-options) -(flush)-> PACK
    -(eof)-> END. Events: one :class:`PushRequest`, then :class:`PackChunk` for
    every piece of pack fed, then :class:`PushEnd`. Pack bytes are not buffered:
    each ``feed`` in the PACK state gives one chunk. A request whose commands
    need a pack but that brings none fails at the end of input. A malformed
    command line fails the request (receive-pack dies on it); a ref name
    receive-pack would not touch only marks its command (``refusal``).
    """

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(limits=limits)
        self._state = "COMMANDS"
        self._commands: list[PushCommand] = []
        self._caps: tuple[bytes, ...] = ()
        self._shallows: list[ObjectId] = []
        self._options: list[bytes] = []
        self._request: PushRequest | None = None
        self._chunk = b""
        self._pack_bytes = 0
        self._eof = False

    def _feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._state == "PACK":
            assert not self._chunk, "feed() before next_event() returned NEED_DATA"
            self._chunk = bytes(data)
        else:
            self._reader.feed(data)

    def _feed_eof(self) -> None:
        self._eof = True
        if self._state != "PACK":
            self._reader.feed_eof()

    def _step(self) -> PushEvent | Literal[NeedData.NEED_DATA]:
        while True:
            if self._state == "PACK":
                return self._pack_step()
            if self._state == "END":
                return PushEnd(self._pack_bytes)
            event = self._packet()
            if event is NEED_DATA:
                return NEED_DATA
            if isinstance(event, EndOfStream):
                if self._commands or self._shallows or self._state == "OPTIONS":
                    raise ProtocolError("push request ends before its flush-pkt")
                self._state = "END"  # an empty body: nothing to do
                continue
            if isinstance(event, Flush):
                if self._state == "COMMANDS" and self._has(b"push-options") and self._commands:
                    self._state = "OPTIONS"
                    continue
                return self._begin_pack()
            line = text_line(event, "push request")
            if self._state == "OPTIONS":
                bounded_append(
                    self._options,
                    line,
                    "protocol_push_options_max",
                    self._limits.protocol_push_options_max,
                )
            else:
                self._command_line(line)

    def _has(self, capability: bytes) -> bool:
        return capability in self._caps

    def _command_line(self, line: bytes) -> None:
        if line.startswith(b"shallow "):
            if self._commands:
                raise ProtocolError("shallow line after a push command")
            bounded_append(
                self._shallows,
                parse_oid(line[8:], "shallow"),
                "protocol_shallows_max",
                self._limits.protocol_shallows_max,
            )
            return
        if line.startswith(b"push-cert"):
            raise ProtocolError("signed pushes (push-cert) are not supported")
        first = not self._commands
        if first and b"\x00" in line:
            line, caps = line.split(b"\x00", 1)
            self._caps = parse_capabilities(caps, self._limits)
        old = parse_oid(line[:OID_HEX_CHARS], "old-oid")
        new = parse_oid(line[OID_HEX_CHARS + 1 : 2 * OID_HEX_CHARS + 1], "new-oid")
        if (
            line[OID_HEX_CHARS : OID_HEX_CHARS + 1] != b" "
            or line[2 * OID_HEX_CHARS + 1 : 2 * OID_HEX_CHARS + 2] != b" "
        ):
            raise ProtocolError(f"malformed push command {line[:120]!r}")
        ref = line[2 * OID_HEX_CHARS + 2 :]
        bounded_append(
            self._commands,
            PushCommand(
                old, new, ref, None if ref_is_pushable(ref, new, self._limits) else FUNNY_REFNAME
            ),
            "protocol_push_commands_max",
            self._limits.protocol_push_commands_max,
        )

    def _begin_pack(self) -> PushRequest:
        request = PushRequest(
            tuple(self._commands), self._caps, tuple(self._shallows), tuple(self._options)
        )
        self._request = request
        self._state = "PACK"
        self._chunk = self._reader.take_trailing_data()
        return request

    def _pack_step(self) -> PushEvent | Literal[NeedData.NEED_DATA]:
        if self._chunk:
            chunk, self._chunk = self._chunk, b""
            if self._request is not None and not self._request.commands:
                raise ProtocolError("data after an empty push request")
            self._pack_bytes += len(chunk)
            return PackChunk(chunk)
        if not self._eof:
            return NEED_DATA
        assert self._request is not None
        if self._request.expects_pack and self._pack_bytes == 0:
            raise ProtocolError("push request has commands that need a pack, and no pack")
        self._state = "END"
        return PushEnd(self._pack_bytes)


def ref_is_pushable(ref: bytes, new: ObjectId, limits: Limits = DEFAULT_LIMITS) -> bool:
    """Whether receive-pack would touch ``ref`` (receive-pack.c ``update``).

    Git takes only names under ``refs/`` whose rest passes ``check_refname_format``,
    one level (``refs/foo``) allowed for deletes only; any other name is refused as
    ``funny refname`` for that command alone. A name over ``ref_name_bytes_max`` is
    refused the same way (git has no such bound; a name that long fails as one ref).
    """
    if len(ref) > limits.ref_name_bytes_max or not ref.startswith(b"refs/"):
        return False
    problem = ref_name_problem(ref[5:], allow_onelevel=new == ZERO_OID, limits=limits)
    return problem is None


def encode_push_request(request: PushRequest) -> bytes:
    """A client's request without its pack: shallows, commands, options.

    Lines go without LF, as git's send-pack writes them (receivers take both).
    """
    out = [pkt_line(b"shallow " + hex_oid(s)) for s in request.shallows]
    for index, c in enumerate(request.commands):
        line = hex_oid(c.old) + b" " + hex_oid(c.new) + b" " + c.ref
        if index == 0:
            line += b"\x00 " + b" ".join(request.capabilities)
        out.append(pkt_line(line))
    out.append(FLUSH_PKT)
    if request.commands and request.has(b"push-options"):
        out.extend(pkt_line(o) for o in request.push_options)
        out.append(FLUSH_PKT)
    return b"".join(out)


# -- report ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefOption:
    """A report-status-v2 option line: ``refname``, ``old-oid``, ``new-oid`` or
    ``forced-update`` (``value`` None)."""

    key: bytes
    value: bytes | None = None


@dataclass(frozen=True, slots=True)
class RefStatus:
    ref: bytes
    reason: bytes | None = None  # None: ok
    options: tuple[RefOption, ...] = ()


def refused(ref: bytes, exc: EnrouteError) -> RefStatus:
    """``ng <ref> <reason>`` for a REF-form error, through the error table."""
    return RefStatus(ref, ref_reason(exc))


@dataclass(frozen=True, slots=True)
class PushReport:
    unpack_error: bytes | None  # None: "unpack ok"
    refs: tuple[RefStatus, ...]
    warnings: tuple[bytes, ...] = ()
    """Lines the client shows as ``remote: <line>`` before the report (side-band channel 2,
    as receive-pack's ``rp_warning``); dropped when the client asked for no side-band."""


def encode_report(report: PushReport, request: PushRequest) -> bytes:
    """The report the client asked for (v2 when it said report-status-v2), framed
    in band 1 with side-band-64k, its warnings first in band 2. Nothing when it
    asked for no report."""
    v2 = request.has(b"report-status-v2")
    if not v2 and not request.has(b"report-status"):
        return b""
    shown = b""
    if report.warnings and request.has(b"side-band-64k"):
        shown = b"".join(
            sideband_pkt(BAND_PROGRESS, line[: SIDEBAND_64K_DATA_BYTES_MAX - 1] + b"\n")
            for line in report.warnings
        )
    lines = [b"unpack " + (report.unpack_error or b"ok")]
    for status in report.refs:
        if status.reason is not None:
            lines.append(b"ng " + status.ref + b" " + status.reason)
            continue
        lines.append(b"ok " + status.ref)
        if v2:
            for option in status.options:
                text = b"option " + option.key
                lines.append(text if option.value is None else text + b" " + option.value)
    body = b"".join(pkt_text(line) for line in lines) + FLUSH_PKT
    if not request.has(b"side-band-64k"):
        return body
    framed = sideband_mux(BAND_PACK, body, max_payload=SIDEBAND_64K_DATA_BYTES_MAX)
    return shown + b"".join(framed) + FLUSH_PKT
