"""Pieces every conversation shares: ref snapshots, oid and capability parsing, the
h11-style driver, and the v2 request frame.

The v2 request frame (Git ``Documentation/gitprotocol-v2.txt``, "Command Request"):

    request = command-line *capability-line [delim-pkt *command-args] flush-pkt
    command-line = PKT-LINE("command=" key LF)
    capability-line = PKT-LINE(key ["=" value] LF)

A flush-pkt where a command line is expected ends the session.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from enroute_core.base.errors import EnrouteError, LimitExceeded, ProtocolError
from enroute_core.base.ids import OID_HEX_CHARS, ObjectId, oid_from_hex, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.git.pktline import (
    NEED_DATA,
    Data,
    Delim,
    EndOfStream,
    Flush,
    NeedData,
    PktEvent,
    PktLineReader,
    ResponseEnd,
    strip_lf,
)

__all__ = [
    "AGENT",
    "NEED_DATA",
    "OBJECT_FORMAT",
    "VERSION",
    "Conversation",
    "NeedData",
    "Ref",
    "RefSnapshot",
    "V2Frame",
    "V2FrameEvent",
    "capability_value",
    "parse_capabilities",
    "parse_oid",
]

VERSION: Final = b"0.1.0"
AGENT: Final = b"enroute/" + VERSION
OBJECT_FORMAT: Final = b"sha1"


@dataclass(frozen=True, slots=True)
class Ref:
    """One ref as the engine's view sees it; ``peeled`` is set for an annotated tag."""

    name: bytes
    oid: ObjectId
    peeled: ObjectId | None = None


@dataclass(frozen=True, slots=True)
class RefSnapshot:
    """The refs a conversation advertises: ``refs`` in byte order of name, HEAD apart.

    ``head`` is HEAD's symbolic target (``refs/heads/main``) or None when the
    repository has no HEAD. HEAD resolves when its target is among ``refs``;
    otherwise it is unborn (an empty repository, or a deleted branch that a
    kept HEAD still names).
    """

    refs: tuple[Ref, ...]
    head: bytes | None = None

    def __post_init__(self) -> None:
        names = [r.name for r in self.refs]
        assert names == sorted(names), "refs must be in byte order of name"

    @property
    def head_ref(self) -> Ref | None:
        """HEAD as a ref (named ``HEAD``), or None when it does not resolve."""
        if self.head is None:
            return None
        for ref in self.refs:
            if ref.name == self.head:
                return Ref(b"HEAD", ref.oid, ref.peeled)
        return None


def parse_oid(text: bytes, what: str) -> ObjectId:
    """40 lowercase hex digits, or a ProtocolError naming the field."""
    try:
        return oid_from_hex(text)
    except ValueError:
        raise ProtocolError(f"{what}: not an object id: {text[:80]!r}", field=what) from None


def split_oid(rest: bytes, what: str) -> tuple[ObjectId, bytes]:
    """An oid, then a space and the rest of the line (possibly empty)."""
    oid = parse_oid(rest[:OID_HEX_CHARS], what)
    tail = rest[OID_HEX_CHARS:]
    if tail and not tail.startswith(b" "):
        raise ProtocolError(f"{what}: expected a space after the object id", field=what)
    return oid, tail[1:]


def hex_oid(oid: ObjectId) -> bytes:
    return oid_to_hex(oid).encode("ascii")


def parse_capabilities(text: bytes, limits: Limits) -> tuple[bytes, ...]:
    """A space-separated capability list (gitprotocol-capabilities), bounded."""
    caps = tuple(c for c in text.split(b" ") if c)
    check_limit("protocol_capabilities_max", len(caps), limits.protocol_capabilities_max)
    return caps


def capability_value(caps: Iterable[bytes], name: bytes) -> bytes | None:
    """The value of ``name=value`` among ``caps``, or None when absent."""
    prefix = name + b"="
    for cap in caps:
        if cap.startswith(prefix):
            return cap[len(prefix) :]
    return None


UINT64_MAX: Final = 2**64 - 1
"""The largest number a request argument may carry: git parses them into 64-bit
integers (``strtoumax``, ``git_parse_ulong``) and refuses what overflows."""


def parse_uint(text: bytes, what: str, *, maximum: int = UINT64_MAX) -> int:
    """A decimal number of at most ``maximum`` (20 digits are read at most, so the
    conversion costs nothing whatever the client sends); else a ProtocolError that
    names the field and the range."""
    if not text or not text.isdigit() or len(text) > 20:
        raise ProtocolError(f"{what}: not a number: {text[:40]!r}", field=what)
    value = int(text)
    if value > maximum:
        raise ProtocolError(f"{what}: {value} is out of range (0 to {maximum})", field=what)
    return value


E = TypeVar("E")


class Conversation(Generic[E]):
    """The h11-style driver: ``feed``/``feed_eof``, then ``next_event`` until NEED_DATA.

    Subclasses implement :meth:`_step`, which reads pkt events from
    ``self._reader`` and returns one event of theirs or NEED_DATA. Any
    EnrouteError puts the conversation in a failed state that stays: every
    later call raises the same error again.
    """

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._reader = PktLineReader(limits=limits)
        self._error: EnrouteError | None = None

    @property
    def failed(self) -> bool:
        return self._error is not None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._guard(lambda: self._feed(data))

    def feed_eof(self) -> None:
        self._guard(self._feed_eof)

    def next_event(self) -> E | Literal[NeedData.NEED_DATA]:
        if self._error is not None:
            raise self._error.with_traceback(None)
        try:
            return self._step()
        except EnrouteError as exc:
            self._error = exc
            raise

    def _guard(self, action: object) -> None:
        if self._error is not None:
            raise self._error.with_traceback(None)
        assert callable(action)
        try:
            action()
        except EnrouteError as exc:
            self._error = exc
            raise

    def _feed(self, data: bytes | bytearray | memoryview) -> None:
        self._reader.feed(data)

    def _feed_eof(self) -> None:
        self._reader.feed_eof()

    def _step(self) -> E | Literal[NeedData.NEED_DATA]:
        raise NotImplementedError

    def _packet(self) -> PktEvent | Literal[NeedData.NEED_DATA]:
        event = self._reader.next_event()
        if isinstance(event, ResponseEnd):
            raise ProtocolError("unexpected response-end packet in a request")
        return event


def text_line(event: PktEvent, where: str) -> bytes:
    """The payload of a data-pkt without its LF, or a ProtocolError naming ``where``."""
    if not isinstance(event, Data):
        raise ProtocolError(f"{where}: expected a line, got {type(event).__name__}")
    return strip_lf(event.payload)


# -- v2 request frame ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class V2Command:
    """``command=<name>`` and the capability lines after it."""

    name: bytes
    capabilities: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class V2Argument:
    line: bytes


@dataclass(frozen=True, slots=True)
class V2RequestEnd:
    """The flush-pkt that ends one command request."""


@dataclass(frozen=True, slots=True)
class V2SessionEnd:
    """A flush-pkt, or the end of input, where a command was expected."""


V2FrameEvent = V2Command | V2Argument | V2RequestEnd | V2SessionEnd

_KNOWN_V2_CAPABILITIES: Final = (b"agent", b"object-format", b"server-option", b"session-id")


class V2Frame:
    """Splits pkt events into v2 command requests; knows nothing of any one command.

    States: COMMAND -> CAPS -> (delim) ARGS -> (flush) COMMAND. Arguments are
    passed on one at a time so that the command parser bounds them as they come.
    """

    __slots__ = ("_caps", "_command", "_limits", "_state")

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._state = "COMMAND"
        self._command = b""
        self._caps: list[bytes] = []

    def step(self, event: PktEvent) -> V2FrameEvent | None:
        """Advance on one pkt event; returns a frame event or None when it only buffered."""
        if self._state == "COMMAND":
            if isinstance(event, (Flush, EndOfStream)):
                return V2SessionEnd()
            line = text_line(event, "command")
            if not line.startswith(b"command="):
                raise ProtocolError(f"expected command=<name>, got {line[:80]!r}")
            self._command = line[len(b"command=") :]
            self._caps = []
            self._state = "CAPS"
            return None
        if isinstance(event, EndOfStream):
            raise ProtocolError("request ends before its flush-pkt")
        if self._state == "CAPS":
            if isinstance(event, (Delim, Flush)):
                self._state = "ARGS" if isinstance(event, Delim) else "COMMAND"
                return V2Command(self._command, tuple(self._caps))
            line = text_line(event, "capability")
            key = line.split(b"=", 1)[0]
            if key not in _KNOWN_V2_CAPABILITIES:
                raise ProtocolError(f"unknown capability {line[:80]!r}")
            if key == b"object-format" and line != b"object-format=" + OBJECT_FORMAT:
                raise ProtocolError(f"unsupported {line[:80]!r}: only sha1 is served")
            self._caps.append(line)
            check_limit(
                "protocol_capabilities_max",
                len(self._caps),
                self._limits.protocol_capabilities_max + self._limits.protocol_server_options_max,
            )
            return None
        if isinstance(event, Flush):
            self._state = "COMMAND"
            return V2RequestEnd()
        return V2Argument(text_line(event, "argument"))

    @property
    def in_args(self) -> bool:
        """True after a delim-pkt, until the flush-pkt that ends the request."""
        return self._state == "ARGS"


def server_options(caps: Sequence[bytes], limits: Limits) -> tuple[bytes, ...]:
    found = tuple(c[len(b"server-option=") :] for c in caps if c.startswith(b"server-option="))
    check_limit("protocol_server_options_max", len(found), limits.protocol_server_options_max)
    return found


def agent_of(caps: Sequence[bytes]) -> bytes | None:
    return capability_value(caps, b"agent")


def bounded_append(items: list[E], item: E, limit: str, maximum: int) -> None:
    """Append, refusing the item that would take the list over ``maximum``."""
    if len(items) >= maximum:
        raise LimitExceeded(limit, len(items) + 1, maximum)
    items.append(item)
