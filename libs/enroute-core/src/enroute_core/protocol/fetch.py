"""Fetch conversations: v2 ``fetch`` (with ``ls-refs`` dispatch) and v0/v1 upload-pack.

v2 request arguments (Git ``Documentation/gitprotocol-v2.txt``, "fetch"):

    want <oid> | want-ref <ref> | have <oid> | done | thin-pack | no-progress
    include-tag | ofs-delta | shallow <oid> | deepen <n> | deepen-relative
    deepen-since <ts> | deepen-not <ref> | filter <spec> | sideband-all | wait-for-done

v2 response sections, each a header line, joined by delim-pkts, ended by a flush-pkt:

    acknowledgments   NAK | ACK <oid>... [ready]      (left out after "done")
    shallow-info      shallow <oid> | unshallow <oid> (when deepening)
    wanted-refs       <oid> SP <ref>                  (for want-ref)
    packfile          side-band packets: 1 pack, 2 progress, 3 fatal error

Without ``ready`` the response ends after acknowledgments. Under
``sideband-all`` every line is a band-1 packet as well.

v0/v1 request (``gitprotocol-pack.txt``, "Packfile Negotiation"), stateless over HTTP:

    PKT-LINE("want" SP oid SP capability-list LF) *PKT-LINE("want" SP oid LF)
    *(shallow | deepen | deepen-since | deepen-not | filter lines) flush-pkt
    *PKT-LINE("have" SP oid LF) (flush-pkt | PKT-LINE("done" LF))

and its answer: shallow-update lines and a flush-pkt when deepening, then the
ACK/NAK lines of multi_ack_detailed (:func:`encode_v0_acks`), then the pack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from enroute_core.base.errors import LimitExceeded, ProtocolError
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.pktline import (
    DELIM_PKT,
    FLUSH_PKT,
    NEED_DATA,
    EndOfStream,
    Flush,
    NeedData,
    PktEvent,
    pkt_line,
    pkt_text,
)
from enroute_core.git.refname import check_ref_format
from enroute_core.git.sideband import (
    BAND_PACK,
    BAND_PROGRESS,
    SIDEBAND_64K_DATA_BYTES_MAX,
    SIDEBAND_DATA_BYTES_MAX,
    sideband_mux,
)
from enroute_core.protocol._common import (
    AGENT,
    OBJECT_FORMAT,
    Conversation,
    V2Argument,
    V2Command,
    V2Frame,
    V2RequestEnd,
    V2SessionEnd,
    agent_of,
    bounded_append,
    hex_oid,
    parse_capabilities,
    parse_oid,
    parse_uint,
    server_options,
    split_oid,
    text_line,
)
from enroute_core.protocol.lsrefs import LsRefsBuilder, LsRefsRequest

__all__ = [
    "BlobLimit",
    "BlobNone",
    "Deepen",
    "FetchCommand",
    "FetchReply",
    "FetchRequest",
    "Filter",
    "HaveBatch",
    "LsRefsCommand",
    "RequestEnd",
    "SessionEnd",
    "TreeDepth",
    "UploadPackV0",
    "UploadPackV2",
    "UploadRequestV0",
    "V0Acks",
    "WantList",
    "encode_fetch_head",
    "encode_fetch_request",
    "encode_filter",
    "encode_pack_data",
    "encode_progress",
    "encode_shallow_update",
    "encode_upload_request_v0",
    "encode_v0_acks",
    "parse_filter",
    "sends_pack",
    "wants_max",
]

# -- filters (gitprotocol-v2 "fetch", filter; git rev-list --filter) -----------


@dataclass(frozen=True, slots=True)
class BlobNone:
    """``blob:none``: no blobs at all."""


@dataclass(frozen=True, slots=True)
class BlobLimit:
    """``blob:limit=<n>``: blobs of fewer than ``bytes_max`` bytes (git omits size >= n)."""

    bytes_max: int


@dataclass(frozen=True, slots=True)
class TreeDepth:
    """``tree:<depth>``: trees and blobs at most ``depth`` levels below a root tree."""

    depth: int


Filter = BlobNone | BlobLimit | TreeDepth

_SUFFIX: Final = {b"": 1, b"k": 1 << 10, b"m": 1 << 20, b"g": 1 << 30}


def parse_filter(spec: bytes) -> Filter:
    """One of the supported filter specs; any other is refused with its name.

    Both numbers are read as git's ``git_parse_ulong`` reads them
    (list-objects-filter-options.c): decimal, an optional ``k``/``m``/``g`` unit in
    either case, and nothing over 2^64-1 after the unit (git refuses what overflows).
    A depth up to that is served: the tree walk ends when the trees do.
    """
    if spec == b"blob:none":
        return BlobNone()
    if spec.startswith(b"blob:limit="):
        return BlobLimit(_parse_ulong(spec[len(b"blob:limit=") :], "filter blob:limit"))
    if spec.startswith(b"tree:"):
        return TreeDepth(_parse_ulong(spec[len(b"tree:") :], "filter tree"))
    shown = spec[:80].decode("utf-8", "replace")
    raise ProtocolError(f"filter {shown!r} is not supported", filter=shown)


def _parse_ulong(text: bytes, what: str) -> int:
    value = text.lower()
    unit = value[-1:] if value[-1:] in (b"k", b"m", b"g") else b""
    number = parse_uint(value[: len(value) - len(unit)], what)
    return parse_uint(b"%d" % (number * _SUFFIX[unit]), what)


def encode_filter(spec: Filter) -> bytes:
    if isinstance(spec, BlobNone):
        return b"blob:none"
    if isinstance(spec, BlobLimit):
        return b"blob:limit=%d" % spec.bytes_max
    return b"tree:%d" % spec.depth


# -- shallow and deepen lines, shared by v0 and v2 ------------------------------


DEEPEN_MAX: Final = 0x7FFFFFFF
"""The largest ``deepen <n>``: git's upload-pack reads it into an int
(upload-pack.c ``process_deepen``), and this value, git's INFINITE_DEPTH, is what
``git fetch --unshallow`` sends. Larger values are refused as git refuses them."""
DEEPEN_SINCE_MAX: Final = 2**64 - 2
"""``deepen-since`` is git's ``timestamp_t``; 2^64-1 (``-1``) is refused by git
(``process_deepen_since``: "revisions.c's max_age -1 is special")."""


@dataclass(frozen=True, slots=True)
class Deepen:
    """The shallow side of a request: the client's shallow commits and how to deepen."""

    shallows: tuple[ObjectId, ...] = ()
    depth: int | None = None
    since: int | None = None
    not_refs: tuple[bytes, ...] = ()
    relative: bool = False

    @property
    def deepening(self) -> bool:
        return self.depth is not None or self.since is not None or bool(self.not_refs)


@dataclass(slots=True)
class _DeepenBuilder:
    limits: Limits
    shallows: list[ObjectId] = field(default_factory=list)
    depth: int | None = None
    since: int | None = None
    not_refs: list[bytes] = field(default_factory=list)
    relative: bool = False
    filter: Filter | None = None

    def add(self, line: bytes) -> bool:
        """Take a shallow/deepen/filter line; False when the line is something else."""
        if line.startswith(b"shallow "):
            bounded_append(
                self.shallows,
                parse_oid(line[8:], "shallow"),
                "protocol_shallows_max",
                self.limits.protocol_shallows_max,
            )
        elif line.startswith(b"deepen "):
            depth = parse_uint(line[7:], "deepen", maximum=DEEPEN_MAX)
            if depth < 1:
                raise ProtocolError("deepen: the depth must be positive")
            self.depth = depth
        elif line.startswith(b"deepen-since "):
            self.since = parse_uint(line[13:], "deepen-since", maximum=DEEPEN_SINCE_MAX)
        elif line.startswith(b"deepen-not "):
            name = line[11:]
            check_ref_format(name, allow_onelevel=True, limits=self.limits)
            bounded_append(
                self.not_refs,
                name,
                "protocol_deepen_nots_max",
                self.limits.protocol_deepen_nots_max,
            )
        elif line == b"deepen-relative":
            self.relative = True
        elif line.startswith(b"filter "):
            self.filter = parse_filter(line[7:])
        else:
            return False
        return True

    def finish(self) -> Deepen:
        if self.depth is not None and (self.since is not None or self.not_refs):
            raise ProtocolError("deepen cannot be used with deepen-since or deepen-not")
        return Deepen(
            tuple(self.shallows), self.depth, self.since, tuple(self.not_refs), self.relative
        )


def _deepen_lines(deepen: Deepen, spec: Filter | None, *, v2: bool) -> list[bytes]:
    lines = [b"shallow " + hex_oid(s) for s in deepen.shallows]
    if deepen.depth is not None:
        lines.append(b"deepen %d" % deepen.depth)
    if deepen.since is not None:
        lines.append(b"deepen-since %d" % deepen.since)
    lines.extend(b"deepen-not " + n for n in deepen.not_refs)
    if v2 and deepen.relative:
        lines.append(b"deepen-relative")
    if spec is not None:
        lines.append(b"filter " + encode_filter(spec))
    return lines


# -- v2 fetch request ------------------------------------------------------------

_V2_FLAGS: Final = (
    b"thin-pack",
    b"no-progress",
    b"include-tag",
    b"ofs-delta",
    b"sideband-all",
    b"wait-for-done",
)


@dataclass(frozen=True, slots=True)
class FetchRequest:
    wants: tuple[ObjectId, ...] = ()
    want_refs: tuple[bytes, ...] = ()
    haves: tuple[ObjectId, ...] = ()
    done: bool = False
    thin_pack: bool = False
    no_progress: bool = False
    include_tag: bool = False
    ofs_delta: bool = False
    sideband_all: bool = False
    wait_for_done: bool = False
    deepen: Deepen = Deepen()
    filter: Filter | None = None
    agent: bytes | None = None
    server_options: tuple[bytes, ...] = ()


def wants_max(limits: Limits, ref_count: int) -> int:
    """How many distinct wants (and ``want-ref`` names) one request may carry.

    git's fetch-pack sends one ``want`` per ref it fetches (fetch-pack.c ``add_wants``,
    ``find_common``), so a clone of a repository with more refs than
    ``protocol_wants_max`` must still pass: the bound is the larger of the two.
    Repeated wants are counted once (the conversations drop them as they come).
    """
    return max(limits.protocol_wants_max, ref_count)


class _Wants:
    """Wants in request order, each once, bounded by :func:`wants_max` as they come."""

    __slots__ = ("_maximum", "items")

    def __init__(self, maximum: int) -> None:
        self._maximum = maximum
        self.items: dict[ObjectId, None] = {}

    def add(self, oid: ObjectId) -> None:
        if oid in self.items:
            return
        if len(self.items) >= self._maximum:
            raise _too_many_wants(len(self.items) + 1, self._maximum)
        self.items[oid] = None


def _too_many_wants(count: int, maximum: int) -> LimitExceeded:
    return LimitExceeded(
        "protocol_wants_max",
        count,
        maximum,
        f"upload-pack: more than {maximum} distinct wants in one request (the limit is "
        "protocol_wants_max, or the repository's ref count when that is larger)",
    )


class FetchBuilder:
    """Collects ``fetch`` arguments one line at a time, each list bounded as it grows."""

    __slots__ = (
        "_caps", "_deepen", "_done", "_flags", "_haves", "_limits", "_want_refs",
        "_wants", "_wants_max",
    )  # fmt: skip

    def __init__(
        self, capabilities: tuple[bytes, ...], limits: Limits, *, wants_max: int | None = None
    ) -> None:
        self._caps = capabilities
        self._limits = limits
        self._wants_max = limits.protocol_wants_max if wants_max is None else wants_max
        self._wants = _Wants(self._wants_max)
        self._want_refs: list[bytes] = []
        self._haves: list[ObjectId] = []
        self._flags: set[bytes] = set()
        self._done = False
        self._deepen = _DeepenBuilder(limits)

    def add(self, line: bytes) -> None:
        limits = self._limits
        if line.startswith(b"want "):
            self._wants.add(parse_oid(line[5:], "want"))
        elif line.startswith(b"have "):
            oid = parse_oid(line[5:], "have")
            bounded_append(self._haves, oid, "protocol_haves_max", limits.protocol_haves_max)
        elif line.startswith(b"want-ref "):
            name = line[9:]
            check_ref_format(name, limits=limits)
            if len(self._want_refs) >= self._wants_max:
                raise _too_many_wants(len(self._want_refs) + 1, self._wants_max)
            self._want_refs.append(name)
        elif line == b"done":
            self._done = True
        elif line in _V2_FLAGS:
            self._flags.add(line)
        elif line.startswith(b"packfile-uris"):
            raise ProtocolError("fetch: packfile-uris is not supported")
        elif not self._deepen.add(line):
            raise ProtocolError(f"fetch: unexpected argument {line[:80]!r}")

    def finish(self) -> FetchRequest:
        flags = self._flags
        return FetchRequest(
            wants=tuple(self._wants.items),
            want_refs=tuple(self._want_refs),
            haves=tuple(self._haves),
            done=self._done,
            thin_pack=b"thin-pack" in flags,
            no_progress=b"no-progress" in flags,
            include_tag=b"include-tag" in flags,
            ofs_delta=b"ofs-delta" in flags,
            sideband_all=b"sideband-all" in flags,
            wait_for_done=b"wait-for-done" in flags,
            deepen=self._deepen.finish(),
            filter=self._deepen.filter,
            agent=agent_of(self._caps),
            server_options=server_options(self._caps, self._limits),
        )


def encode_fetch_request(request: FetchRequest, *, agent: bytes = AGENT) -> bytes:
    """A client's v2 ``fetch`` request, in the order git's fetch-pack writes it."""
    caps = [b"command=fetch", b"agent=" + (request.agent or agent)]
    caps.extend(b"server-option=" + o for o in request.server_options)
    caps.append(b"object-format=" + OBJECT_FORMAT)
    flags = (
        request.thin_pack,
        request.no_progress,
        request.include_tag,
        request.ofs_delta,
        request.sideband_all,
        request.wait_for_done,
    )
    args = [name for name, on in zip(_V2_FLAGS, flags, strict=True) if on]
    args.extend(_deepen_lines(request.deepen, request.filter, v2=True))
    args.extend(b"want " + hex_oid(w) for w in request.wants)
    args.extend(b"want-ref " + r for r in request.want_refs)
    args.extend(b"have " + hex_oid(h) for h in request.haves)
    if request.done:
        args.append(b"done")
    body = b"".join(pkt_text(c) for c in caps) + DELIM_PKT
    return body + b"".join(pkt_text(a) for a in args) + FLUSH_PKT


# -- v2 conversation ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LsRefsCommand:
    request: LsRefsRequest


@dataclass(frozen=True, slots=True)
class FetchCommand:
    request: FetchRequest


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """No more commands: a flush-pkt or the end of input where a command could start."""


V2Event = LsRefsCommand | FetchCommand | SessionEnd


class UploadPackV2(Conversation[V2Event]):
    """Server side of a v2 upload-pack request body: one event per command.

    Caller's contract: feed bytes, call ``next_event`` until NEED_DATA, answer
    each command with :func:`encode_ls_refs_response` or :func:`encode_fetch_head`
    and the pack; at the end of the body call ``feed_eof``. After
    :class:`SessionEnd` every call returns it again and later bytes are ignored.
    """

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS, wants_max: int | None = None) -> None:
        """``wants_max``: :func:`wants_max` for the repository (``protocol_wants_max``
        when None)."""
        super().__init__(limits=limits)
        self._frame = V2Frame(limits)
        self._builder: LsRefsBuilder | FetchBuilder | None = None
        self._closed = False
        self._wants_max = wants_max

    def _feed(self, data: bytes | bytearray | memoryview) -> None:
        # After SessionEnd nothing reads the pkt-line reader again: bytes kept there
        # would grow without bound and trip its buffer assertion, so they are dropped.
        if not self._closed:
            self._reader.feed(data)

    def _step(self) -> V2Event | Literal[NeedData.NEED_DATA]:
        while not self._closed:
            event = self._packet()
            if event is NEED_DATA:
                return NEED_DATA
            frame = self._frame.step(event)
            if isinstance(frame, V2Command):
                self._builder = self._start(frame)
                if not self._frame.in_args:
                    return self._finish()
            elif isinstance(frame, V2Argument):
                assert self._builder is not None
                self._builder.add(frame.line)
            elif isinstance(frame, V2RequestEnd):
                return self._finish()
            elif isinstance(frame, V2SessionEnd):
                self._closed = True
        return SessionEnd()

    def _start(self, command: V2Command) -> LsRefsBuilder | FetchBuilder:
        if command.name == b"ls-refs":
            return LsRefsBuilder(command.capabilities, self._limits)
        if command.name == b"fetch":
            return FetchBuilder(command.capabilities, self._limits, wants_max=self._wants_max)
        raise ProtocolError(f"unknown command {command.name[:80]!r}")

    def _finish(self) -> V2Event:
        builder, self._builder = self._builder, None
        assert builder is not None
        if isinstance(builder, LsRefsBuilder):
            return LsRefsCommand(builder.finish())
        return FetchCommand(builder.finish())


# -- v2 fetch response ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchReply:
    """What the engine decided for one fetch request.

    ``common``: the client's haves the server has, in request order.
    ``ready``: the server can make a pack from what it knows now.
    ``shallow``/``unshallow``: the client's new shallow boundary.
    ``wanted_refs``: the oid each ``want-ref`` resolved to.
    """

    common: tuple[ObjectId, ...] = ()
    ready: bool = False
    shallow: tuple[ObjectId, ...] = ()
    unshallow: tuple[ObjectId, ...] = ()
    wanted_refs: tuple[tuple[ObjectId, bytes], ...] = ()


def sends_pack(request: FetchRequest, reply: FetchReply) -> bool:
    """Whether this response carries a packfile section (else it ends after the acks)."""
    return request.done or (reply.ready and not request.wait_for_done)


def encode_fetch_head(request: FetchRequest, reply: FetchReply) -> bytes:
    """The response up to and including the ``packfile`` header, or the whole of it
    (ended by a flush-pkt) when no pack follows; see :func:`sends_pack`."""
    band = request.sideband_all

    def line(text: bytes, lf: bytes = b"\n") -> bytes:
        return pkt_line((b"\x01" if band else b"") + text + lf)

    out: list[bytes] = []
    pack = sends_pack(request, reply)
    if not request.done:
        out.append(line(b"acknowledgments"))
        out.extend(line(b"ACK " + hex_oid(c)) for c in reply.common)
        if not reply.common:
            out.append(line(b"NAK"))
        if pack:
            out.append(line(b"ready"))
        if not pack:
            out.append(FLUSH_PKT)
            return b"".join(out)
        out.append(DELIM_PKT)
    if request.deepen.deepening or request.deepen.shallows or reply.shallow or reply.unshallow:
        out.append(line(b"shallow-info"))
        # No LF on these two, as git's upload-pack writes them.
        out.extend(line(b"shallow " + hex_oid(s), b"") for s in reply.shallow)
        out.extend(line(b"unshallow " + hex_oid(s), b"") for s in reply.unshallow)
        out.append(DELIM_PKT)
    if reply.wanted_refs:
        out.append(line(b"wanted-refs"))
        out.extend(line(hex_oid(oid) + b" " + name) for oid, name in reply.wanted_refs)
        out.append(DELIM_PKT)
    out.append(line(b"packfile"))
    return b"".join(out)


def encode_pack_data(data: bytes, *, sideband_max: int = SIDEBAND_64K_DATA_BYTES_MAX) -> bytes:
    """Pack bytes on band 1; ``sideband_max`` is 995 for v0 plain ``side-band``."""
    return b"".join(sideband_mux(BAND_PACK, data, max_payload=sideband_max))


def encode_progress(message: bytes) -> bytes:
    """Progress text on band 2 (left out by the caller under no-progress/quiet)."""
    return b"".join(sideband_mux(BAND_PROGRESS, message, max_payload=SIDEBAND_64K_DATA_BYTES_MAX))


# -- v0/v1 upload-pack ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UploadRequestV0:
    wants: tuple[ObjectId, ...] = ()
    capabilities: tuple[bytes, ...] = ()
    deepen: Deepen = Deepen()
    filter: Filter | None = None

    def has(self, capability: bytes) -> bool:
        return capability in self.capabilities

    @property
    def sideband_max(self) -> int | None:
        """Data bytes per side-band packet, or None for a raw pack."""
        if self.has(b"side-band-64k"):
            return SIDEBAND_64K_DATA_BYTES_MAX
        if self.has(b"side-band"):
            return SIDEBAND_DATA_BYTES_MAX
        return None


@dataclass(frozen=True, slots=True)
class WantList:
    """The first part of a v0 request: wants, capabilities, shallow and deepen lines."""

    request: UploadRequestV0


@dataclass(frozen=True, slots=True)
class HaveBatch:
    """Haves up to a flush-pkt (``done`` False) or up to ``done`` (True)."""

    haves: tuple[ObjectId, ...]
    done: bool


@dataclass(frozen=True, slots=True)
class RequestEnd:
    """The request body ended where it may end."""


V0Event = WantList | HaveBatch | RequestEnd


class UploadPackV0(Conversation[V0Event]):
    """Server side of a v0/v1 upload-pack request body (stateless HTTP or a stream).

    States: WANTS -(flush)-> HAVES -(flush)-> HAVES ... -(done)-> DONE -(eof)-> END.
    Haves are bounded over the whole request by ``protocol_haves_max``.
    """

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS, wants_max: int | None = None) -> None:
        """``wants_max``: :func:`wants_max` for the repository (``protocol_wants_max``
        when None)."""
        super().__init__(limits=limits)
        self._state = "WANTS"
        self._wants = _Wants(limits.protocol_wants_max if wants_max is None else wants_max)
        self._caps: tuple[bytes, ...] = ()
        self._deepen = _DeepenBuilder(limits)
        self._haves: list[ObjectId] = []
        self._have_count = 0
        self._seen_line = False

    def _step(self) -> V0Event | Literal[NeedData.NEED_DATA]:
        while True:
            if self._state == "END":
                return RequestEnd()
            event = self._packet()
            if event is NEED_DATA:
                return NEED_DATA
            if isinstance(event, EndOfStream):
                if self._state == "WANTS" and self._seen_line:
                    raise ProtocolError("upload-pack request ends inside its want list")
                if self._state == "HAVES" and self._haves:
                    raise ProtocolError("upload-pack request ends inside a have list")
                self._state = "END"
                return RequestEnd()
            if self._state == "DONE":
                raise ProtocolError("upload-pack request goes on after done")
            if self._state == "WANTS":
                if isinstance(event, Flush):
                    self._state = "HAVES"
                    return WantList(
                        UploadRequestV0(
                            tuple(self._wants.items),
                            self._caps,
                            self._deepen.finish(),
                            self._deepen.filter,
                        )
                    )
                self._want_line(text_line(event, "want list"))
                continue
            result = self._have_event(event)
            if result is not None:
                return result

    def _want_line(self, line: bytes) -> None:
        first = not self._seen_line
        self._seen_line = True
        if line.startswith(b"want "):
            oid, rest = split_oid(line[5:], "want")
            if rest and not (first or not self._wants.items):
                raise ProtocolError("capabilities after the first want line")
            if rest:
                self._caps = parse_capabilities(rest, self._limits)
            self._wants.add(oid)
        elif not self._deepen.add(line):
            raise ProtocolError(f"upload-pack: unexpected line {line[:80]!r}")

    def _have_event(self, event: PktEvent) -> HaveBatch | None:
        if isinstance(event, Flush):
            batch, self._haves = tuple(self._haves), []
            return HaveBatch(batch, done=False)
        line = text_line(event, "have list")
        if line == b"done":
            batch, self._haves = tuple(self._haves), []
            self._state = "DONE"
            return HaveBatch(batch, done=True)
        if not line.startswith(b"have "):
            raise ProtocolError(f"upload-pack: expected have or done, got {line[:80]!r}")
        self._have_count += 1
        if self._have_count > self._limits.protocol_haves_max:
            raise LimitExceeded(
                "protocol_haves_max", self._have_count, self._limits.protocol_haves_max
            )
        self._haves.append(parse_oid(line[5:], "have"))
        return None


def encode_upload_request_v0(
    request: UploadRequestV0, haves: Sequence[ObjectId] = (), *, done: bool = True
) -> bytes:
    """A client's stateless v0 request: wants, flush, haves, then ``done`` or a flush."""
    out: list[bytes] = []
    for index, want in enumerate(request.wants):
        line = b"want " + hex_oid(want)
        if index == 0 and request.capabilities:
            line += b" " + b" ".join(request.capabilities)
        out.append(pkt_text(line))
    out.extend(pkt_text(x) for x in _deepen_lines(request.deepen, request.filter, v2=False))
    out.append(FLUSH_PKT)
    out.extend(pkt_text(b"have " + hex_oid(h)) for h in haves)
    out.append(pkt_text(b"done") if done else FLUSH_PKT)
    return b"".join(out)


def encode_shallow_update(shallow: Sequence[ObjectId], unshallow: Sequence[ObjectId]) -> bytes:
    """v0 shallow-update: sent before the acks when the request deepens (no LF, as git)."""
    lines = [b"shallow " + hex_oid(s) for s in shallow]
    lines.extend(b"unshallow " + hex_oid(s) for s in unshallow)
    return b"".join(pkt_line(line) for line in lines) + FLUSH_PKT


@dataclass(frozen=True, slots=True)
class V0Acks:
    """The ACK/NAK lines for one have batch, and whether the pack follows them."""

    data: bytes
    send_pack: bool


def encode_v0_acks(
    request: UploadRequestV0,
    batch: HaveBatch,
    common: frozenset[ObjectId],
    *,
    ready: bool,
) -> V0Acks:
    """Answer one have batch as git's upload-pack does (gitprotocol-pack,
    "Packfile Negotiation"; gitprotocol-capabilities, "multi_ack_detailed", "no-done").

    ``common`` holds the haves the server has; ``ready`` says the server has
    found enough common commits to cut a pack (git's ``ok_to_give_up``).
    """
    detailed = request.has(b"multi_ack_detailed")
    multi = detailed or request.has(b"multi_ack")
    out: list[bytes] = []
    last: ObjectId | None = None
    got_common = got_other = sent_ready = False
    common_count = 0
    for have in batch.haves:
        if have in common:
            got_common = True
            common_count += 1
            last = have
            if detailed:
                out.append(b"ACK " + hex_oid(have) + b" common")
            elif multi:
                out.append(b"ACK " + hex_oid(have) + b" continue")
            elif common_count == 1:
                out.append(b"ACK " + hex_oid(have))
        else:
            got_other = True
            if multi and ready:
                suffix = b" ready" if detailed else b" continue"
                sent_ready = sent_ready or detailed
                out.append(b"ACK " + hex_oid(have) + suffix)
    if batch.done:
        if last is not None:
            if multi:
                out.append(b"ACK " + hex_oid(last))
        else:
            out.append(b"NAK")
        return V0Acks(b"".join(pkt_text(x) for x in out), send_pack=True)
    if detailed and got_common and not got_other and ready and last is not None:
        sent_ready = True
        out.append(b"ACK " + hex_oid(last) + b" ready")
    if common_count == 0 or multi:
        out.append(b"NAK")
    send = request.has(b"no-done") and sent_ready and last is not None
    if send and last is not None:
        out.append(b"ACK " + hex_oid(last))
    return V0Acks(b"".join(pkt_text(x) for x in out), send_pack=send)
