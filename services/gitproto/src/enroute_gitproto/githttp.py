"""Git smart HTTP, relayed to a compute as opaque byte streams.

DESIGN.md, "Processes" and "Git protocol"; docs/rpc.md, "Git streams";
gitprotocol-http ("Smart Clients", "Smart Service git-upload-pack"). URLs:
``/<name>.git/info/refs?service=...``, ``/<name>.git/git-upload-pack``,
``/<name>.git/git-receive-pack``, and the same without ``.git``.

1. The header message goes first (repository, service, ``Git-Protocol``,
   principal), then the request body in chunks as it arrives. A gzip body
   (``Content-Encoding: gzip``) is inflated here, so the header says no
   encoding and the compute always sees the plain protocol bytes.
2. Nothing is sent to the client until the compute's first body bytes (or
   the end of its answer): an error before then is a gRPC status, mapped
   through ERROR_TABLE to an HTTP status with a plain-text reason on a GET
   (``info/refs``: git shows ``repository ... not found`` for 404 and asks for
   credentials on 401). On a POST git shows no HTTP body, only ``RPC failed;
   HTTP <status>``, so a refusal there is a 200 answer holding one ``ERR``
   packet, which git shows as ``fatal: remote error: <reason>`` (fetch-pack and
   send-pack read with ``PACKET_READ_DIE_ON_ERR_PACKET``). A 401 stays a 401,
   which git answers with credentials, and a failure of ours (5xx: no compute
   reachable, a timeout) stays an HTTP status that proxies and access logs
   count (:func:`send_git_refusal`).
3. Until then an UNAVAILABLE compute is replaced by the next one in
   rendezvous order, and the body read so far is replayed to it, as long as
   it fits ``replay_bytes_max``.
4. An error after the response started means the conversation broke: the
   HTTP response is cut short (no final chunk), which Git clients detect.
5. Hostile bodies are refused before a compute spends on them
   (docs/access-control.md, "Hostile transport input"): a Content-Length over
   ``body_bytes_max`` before any byte is read; while streaming, the inflated
   size, the gzip inflation ratio and the pkt-line count of the negotiation.
   A body that fails any bound cancels the compute's call at once, so the
   compute never sees a truncated body as a complete one.
6. A client that goes away, while its body comes or after, cancels the
   compute's call too: the compute stops the request's work (an ingest, a
   pack being written) and frees what it held. One log line, no traceback.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import grpc

from enroute_core.base.errors import (
    EnrouteError,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    Timeout,
    Unauthenticated,
)
from enroute_core.base.limits import GiB, MiB
from enroute_core.git.pktline import FLUSH_PKT, err_pkt
from enroute_core.git.sideband import BAND_ERROR, sideband_pkt
from enroute_core.protocol.errors import git_message
from enroute_core.state.names import repo_name_from_url
from enroute_gitproto.auth import Authorizer
from enroute_gitproto.observe import Metrics
from enroute_gitproto.responses import (
    NO_CACHE,
    Receive,
    Scope,
    Send,
    header,
    send_text_error,
)
from enroute_gitproto.routing import ComputePool
from enroute_gitproto.rpc.convert import (
    SERVICE_RECEIVE_PACK,
    SERVICE_UPLOAD_PACK,
    GitHeader,
    GitResponsePart,
    git_body_request,
    git_header_request,
    git_response_part,
)
from enroute_gitproto.rpc.errors import from_rpc_error
from enroute_proto.gen.enroute.compute.v1.compute_pb2 import GitRequest, GitResponse
from enroute_proto.logs import call_metadata

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from enroute_proto.gen.enroute.compute.v1.compute_pb2_grpc import ComputeAsyncStub

INFO_REFS = "info/refs"
_ENDPOINTS = (INFO_REFS, SERVICE_UPLOAD_PACK, SERVICE_RECEIVE_PACK)
_SCOPE_OF = {SERVICE_UPLOAD_PACK: "read", SERVICE_RECEIVE_PACK: "write"}


@dataclass(frozen=True, slots=True)
class GitHttpLimits:
    """Bounds of one relayed conversation (STYLE rule 5)."""

    # a request body after gzip inflation (pushes of packs)
    body_bytes_max: int = 16 * GiB
    # body bytes kept to replay to the next compute on failover
    replay_bytes_max: int = 8 * MiB
    # body bytes read ahead of what the compute has taken
    window_bytes_max: int = 4 * MiB
    # inflated bytes produced per step of the gzip decoder
    inflate_step_bytes: int = 1 * MiB
    # deflate bombs: inflated <= gzip_ratio_max * deflated + gzip_slack_bytes
    gzip_ratio_max: int = 100
    gzip_slack_bytes: int = 1 * MiB
    # pkt-lines of an upload-pack body, or of a receive-pack body up to its first flush
    negotiation_pkt_lines_max: int = 400_000


class PktLineCounter:
    """Counts the pkt-lines of a request body as it streams (gitprotocol-common, "pkt-line
    Format"), so that a negotiation of millions of lines is refused at the transport.

    Framing only: a length that is not four hex digits, or ``0003``, ends the
    count; the protocol layer refuses such a body with its own typed error.
    With ``stop_at_flush`` the count ends at the first flush-pkt (the pack of
    a push follows its command list and is no pkt-line data).
    """

    def __init__(self, lines_max: int, stop_at_flush: bool) -> None:
        self.lines_max = lines_max
        self.stop_at_flush = stop_at_flush
        self.lines = 0
        self.active = True
        self._skip = 0  # payload bytes of the current pkt-line still to pass
        self._head = b""  # a length header split across chunks

    def feed(self, data: bytes) -> None:
        at, end = 0, len(data)
        while self.active and at < end:
            if self._skip:
                step = min(self._skip, end - at)
                self._skip -= step
                at += step
                continue
            take = min(4 - len(self._head), end - at)
            self._head += data[at : at + take]
            at += take
            if len(self._head) < 4:
                return
            head, self._head = self._head, b""
            if any(c not in b"0123456789abcdefABCDEF" for c in head):
                self.active = False
                return
            length = int(head, 16)
            self.lines += 1
            if self.lines > self.lines_max:
                raise LimitExceeded(
                    "negotiation_pkt_lines_max",
                    self.lines,
                    self.lines_max,
                    f"the request has more than {self.lines_max} pkt-lines "
                    "(transport.negotiation_pkt_lines_max)",
                )
            if (length == 0 and self.stop_at_flush) or length == 3:
                self.active = False
            elif length >= 4:
                self._skip = length - 4


_HEAD_BYTES = 65520
"""Body bytes kept to read a push's capabilities from: its first pkt-line at most."""


def push_uses_sideband(head: bytes) -> bool:
    """Whether the push whose body starts with ``head`` asked for side-band-64k (its
    first command's capabilities, after the NUL: gitprotocol-pack, "Reference Update
    Request"). Once it has, send-pack reads the response through the side-band
    demultiplexer, which takes an ``ERR`` packet for band 69 ("bad band #69")."""
    if len(head) < 4 or any(c not in b"0123456789abcdef" for c in head[:4]):
        return False
    line = head[4 : int(head[:4], 16)]
    _, nul, caps = line.partition(b"\0")
    return bool(nul) and b"side-band-64k" in caps.split()


async def send_git_refusal(
    send: Send, call: GitCall, error: EnrouteError, body: BodyBuffer | None = None
) -> int:
    """``error`` as the client can show it (item 2 above); answers the HTTP status sent.
    A push that asked for side-band gets it on band 3 and a flush-pkt, which send-pack
    shows as ``remote: <reason>`` and fails with (sideband.c, band 3)."""
    status = error.mapping.http_status
    if call.endpoint == INFO_REFS or isinstance(error, Unauthenticated) or status >= 500:
        await send_text_error(send, error)
        return status
    log.info("%s of %r refused: %s: %s (answered with ERR)", call.service, call.repo,
             error.code, error.message)  # fmt: skip
    message = git_message(error)
    sideband = (
        call.service == SERVICE_RECEIVE_PACK and body is not None and push_uses_sideband(body.head)
    )
    answer = sideband_pkt(BAND_ERROR, message) + FLUSH_PKT if sideband else err_pkt(message)
    headers = [(b"content-type", f"application/x-{call.service}-result".encode()), *NO_CACHE]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer, "more_body": False})
    return 200


class ConversationBroken(Exception):
    """The compute failed after the response started; the HTTP response is cut short."""


@dataclass(frozen=True, slots=True)
class GitCall:
    repo: str
    service: str
    endpoint: str


def parse_git_request(method: str, path: str, query: str) -> GitCall | None:
    """The Git call of a request, None when the path is no Git endpoint.

    InvalidName for a bad repository name (``//``, empty, ``.`` or ``..``
    segments among them); InvalidArgument for a bad service or method.
    """
    for endpoint in _ENDPOINTS:
        suffix = "/" + endpoint
        if path.endswith(suffix):
            name_part = path[: -len(suffix)]
            break
    else:
        return None
    repo = repo_name_from_url(name_part[1:] if name_part.startswith("/") else name_part)
    if endpoint == INFO_REFS:
        if method != "GET":
            raise InvalidArgument(f"{method} is not allowed on info/refs; use GET")
        services = parse_qs(query).get("service", [])
        if len(services) != 1 or services[0] not in _SCOPE_OF:
            raise InvalidArgument(
                "info/refs needs ?service=git-upload-pack or ?service=git-receive-pack "
                "(the dumb HTTP protocol is not served)"
            )
        return GitCall(repo, services[0], endpoint)
    if method != "POST":
        raise InvalidArgument(f"{method} is not allowed on {endpoint}; use POST")
    return GitCall(repo, endpoint, endpoint)


class BodyBuffer:
    """The request body between the HTTP receiver and the compute's request stream.

    One pump reads (and inflates) the body; each attempt reads it from the
    start while it is replayable, so a failover resends what the failed
    compute already got. Read-ahead is bounded by ``window_bytes_max``.
    """

    def __init__(
        self, receive: Receive, gzip: bool, limits: GitHttpLimits, push: bool = False
    ) -> None:
        self._receive = receive
        self._limits = limits
        self._inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS) if gzip else None
        self._pkt_lines = PktLineCounter(limits.negotiation_pkt_lines_max, stop_at_flush=push)
        self._call: grpc.aio.StreamStreamCall[GitRequest, GitResponse] | None = None
        self.deflated_bytes = 0
        self._chunks: list[bytes] = []
        self._base = 0  # absolute index of _chunks[0]
        self._next = 0  # absolute index of the chunk the current attempt takes next
        self._attempt = 0
        self._changed = asyncio.Condition()
        self.total_bytes = 0
        self.head = b""
        """The body's first bytes (:data:`_HEAD_BYTES`), for :func:`push_uses_sideband`."""
        self.replayable = True
        self.done = False
        self.error: EnrouteError | None = None
        self.gone = False
        """The client disconnected before the answer ended (item 6 above)."""

    def _pending_bytes(self) -> int:
        return sum(len(c) for c in self._chunks[self._next - self._base :])

    def _drop_taken(self) -> None:
        taken = self._next - self._base
        if taken > 0:
            del self._chunks[:taken]
            self._base = self._next

    async def _append(self, data: bytes) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._pending_bytes() < self._limits.window_bytes_max
            )
            if len(self.head) < _HEAD_BYTES:
                self.head += data[: _HEAD_BYTES - len(self.head)]
            self.total_bytes += len(data)
            if self.total_bytes > self._limits.body_bytes_max:
                raise LimitExceeded("body_bytes_max", self.total_bytes, self._limits.body_bytes_max)
            self._chunks.append(data)
            if self.replayable and self.total_bytes > self._limits.replay_bytes_max:
                self.replayable = False
                self._drop_taken()
            self._changed.notify_all()

    def attach(self, call: grpc.aio.StreamStreamCall[GitRequest, GitResponse]) -> None:
        """The compute call of the current attempt: a failing body cancels it at once."""
        self._call = call

    def _inflate(self, data: bytes) -> list[bytes]:
        """Inflate one received chunk step by step, refusing a deflate bomb after one step."""
        assert self._inflater is not None
        limits = self._limits
        pieces: list[bytes] = []
        inflated = self.total_bytes
        try:
            while data and not self._inflater.eof:
                piece = self._inflater.decompress(data, limits.inflate_step_bytes)
                self.deflated_bytes += len(data) - len(self._inflater.unconsumed_tail)
                inflated += len(piece)
                allowed = limits.gzip_ratio_max * self.deflated_bytes + limits.gzip_slack_bytes
                if inflated > allowed:
                    raise LimitExceeded(
                        "gzip_ratio_max",
                        inflated // max(self.deflated_bytes, 1),
                        limits.gzip_ratio_max,
                        f"the gzip request body inflates more than {limits.gzip_ratio_max} "
                        "times its size (transport.gzip_ratio_max)",
                    )
                if piece:
                    pieces.append(piece)
                data = self._inflater.unconsumed_tail
        except zlib.error as error:
            raise InvalidArgument(f"the gzip request body does not inflate: {error}") from None
        return pieces

    async def _end(self, error: EnrouteError | None) -> None:
        async with self._changed:
            self.error = error
            self.done = True
            if error is not None and self._call is not None:
                self._call.cancel()  # the compute stops reading and releases what it holds
            self._changed.notify_all()

    async def pump(self) -> None:
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    raise InvalidArgument("the client went away before the request body ended")
                data = message.get("body", b"")
                pieces = self._inflate(data) if self._inflater is not None else [data]
                for piece in pieces:
                    if piece:
                        self._pkt_lines.feed(piece)
                        await self._append(piece)
                if not message.get("more_body", False):
                    if self._inflater is not None and not self._inflater.eof:
                        raise InvalidArgument("the gzip request body is truncated")
                    await self._end(None)
                    break
            await self._until_disconnect()
            self.gone = True
            if self._call is not None:
                self._call.cancel()  # the compute stops the work of an answer nobody reads
        except EnrouteError as error:
            await self._end(error)

    async def _until_disconnect(self) -> None:
        """The body is in: the next message is the disconnect, once the answer is complete
        or when the client goes before it is (the pump ends with the request). The
        receiver's idle bound (``Timeout``) is for bodies: an answer may take longer."""
        while True:
            try:
                message = await self._receive()
            except Timeout:
                continue
            if message["type"] == "http.disconnect":
                return

    def rewind(self) -> None:
        """Start a new attempt from the first byte of the body."""
        assert self.replayable and self._base == 0
        self._attempt += 1
        self._next = 0

    async def commit(self) -> None:
        """The response started: no more failover, so taken chunks can go."""
        async with self._changed:
            self.replayable = False
            self._drop_taken()
            self._changed.notify_all()

    async def requests(self, first: GitRequest) -> AsyncIterator[GitRequest]:
        attempt = self._attempt
        yield first
        while True:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: (
                        self._next < self._base + len(self._chunks)
                        or self.done
                        or attempt != self._attempt
                    )
                )
                if attempt != self._attempt:
                    return
                if self._next >= self._base + len(self._chunks):
                    if self.error is not None:
                        # never half-close after a failed body: a compute must not take a
                        # truncated body for a whole one (gRPC cancels the call instead)
                        raise self.error
                    return
                chunk = self._chunks[self._next - self._base]
                self._next += 1
                if not self.replayable:
                    self._drop_taken()
                self._changed.notify_all()
            yield git_body_request(chunk)


def _body_failure(body: BodyBuffer | None) -> EnrouteError | None:
    """The body's error when it, not this task, cancelled the compute call.

    gRPC raises CancelledError from a locally cancelled call; a pending
    cancellation of the task itself (a request timeout) must stay one.
    """
    task = asyncio.current_task()
    if body is None or body.error is None or (task is not None and task.cancelling()):
        return None
    return body.error


def _client_gone(body: BodyBuffer | None) -> bool:
    """Whether the client's disconnect, not this task's cancellation, cancelled the call."""
    task = asyncio.current_task()
    return body is not None and body.gone and not (task is not None and task.cancelling())


async def _only(first: GitRequest) -> AsyncIterator[GitRequest]:
    yield first


@dataclass
class _Opened:
    call: grpc.aio.StreamStreamCall[GitRequest, GitResponse]
    parts: list[GitResponsePart]
    ended: bool


class GitHandler:
    def __init__(
        self,
        pool: ComputePool,
        authorizer: Authorizer,
        metrics: Metrics,
        limits: GitHttpLimits | None = None,
    ) -> None:
        self.pool = pool
        self.authorizer = authorizer
        self.metrics = metrics
        self.limits = limits or GitHttpLimits()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> int:
        """Serve one Git request; answers the HTTP status it started with."""
        try:
            call = parse_git_request(
                scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1")
            )
            if call is None:
                raise NotFound(f"no such path: {scope['path'][:200]}")
            principal = self.authorizer.authorize(
                header(scope, b"authorization"), _SCOPE_OF[call.service], call.repo
            )
        except EnrouteError as error:
            await send_text_error(send, error)
            return error.mapping.http_status
        return await self._converse(scope, receive, send, call, principal.name)

    def _header(self, scope: Scope, call: GitCall, principal: str) -> GitHeader:
        encoding = (header(scope, b"content-encoding") or "").strip().lower()
        length = header(scope, b"content-length")
        inflated = encoding in ("gzip", "x-gzip")
        return GitHeader(
            repo=call.repo,
            service=call.service,
            git_protocol=header(scope, b"git-protocol") or "",
            content_encoding="" if inflated else encoding,
            principal=principal,
            user_agent=header(scope, b"user-agent") or "",
            content_length_bytes=(
                int(length) if length and length.isdigit() and not inflated else None
            ),
        )

    async def _converse(
        self, scope: Scope, receive: Receive, send: Send, call: GitCall, principal: str
    ) -> int:
        git_header = self._header(scope, call, principal)
        first = git_header_request(git_header)
        body: BodyBuffer | None = None
        pump: asyncio.Task[None] | None = None
        if call.endpoint != INFO_REFS:
            length = header(scope, b"content-length")
            if length and length.strip().isdigit() and int(length) > self.limits.body_bytes_max:
                error = LimitExceeded(
                    "body_bytes_max",
                    int(length),
                    self.limits.body_bytes_max,
                    f"the request body of {int(length)} bytes is over the limit of "
                    f"{self.limits.body_bytes_max} (transport.git_body_max)",
                )
                # refused before a byte of the body is read: 413 lets the client stop
                # sending (git gives a Content-Length only to bodies under http.postBuffer)
                await send_text_error(send, error)
                return error.mapping.http_status
            encoding = (header(scope, b"content-encoding") or "").strip().lower()
            push = call.service == SERVICE_RECEIVE_PACK
            body = BodyBuffer(receive, encoding in ("gzip", "x-gzip"), self.limits, push)
            pump = asyncio.create_task(body.pump())
        try:
            try:
                opened = await self._open(call, first, body)
            except grpc.aio.AioRpcError as rpc_error:
                failure: EnrouteError = from_rpc_error(rpc_error)
                if body is not None and body.error is not None:
                    failure = body.error
                return await send_git_refusal(send, call, failure, body)
            except EnrouteError as enroute_error:
                return await send_git_refusal(send, call, enroute_error, body)
            if body is not None and body.error is not None:
                opened.call.cancel()
                return await send_git_refusal(send, call, body.error, body)
            return await self._relay(send, call, opened, body)
        finally:
            if pump is not None:
                pump.cancel()
            if body is not None:
                self.metrics.git_request_bytes.labels(call.service).inc(body.total_bytes)

    async def _open(self, call: GitCall, first: GitRequest, body: BodyBuffer | None) -> _Opened:
        """Start the conversation on the repository's compute; fail over while nothing is sent."""
        attempts = 0
        last_error: grpc.aio.AioRpcError | None = None
        # one id for this push on every compute tried, so the ledger applies it once
        # (docs/rpc.md, "Request ids")
        named = call_metadata()  # and the request's user, for log lines (docs/logging.md)

        async def attempt(stub: ComputeAsyncStub) -> _Opened:
            nonlocal attempts, last_error
            attempts += 1
            if attempts > 1:
                self.metrics.failovers.inc()
            if body is not None and attempts > 1:
                if not body.replayable and last_error is not None:
                    raise from_rpc_error(last_error)
                body.rewind()
            requests = body.requests(first) if body is not None else _only(first)
            method = {
                INFO_REFS: stub.InfoRefs,
                SERVICE_UPLOAD_PACK: stub.UploadPack,
                SERVICE_RECEIVE_PACK: stub.ReceivePack,
            }[call.endpoint]
            rpc = method(requests, metadata=named)
            if body is not None:
                body.attach(rpc)
            parts: list[GitResponsePart] = []
            try:
                while True:
                    message = await rpc.read()
                    if message is grpc.aio.EOF or not isinstance(message, GitResponse):
                        return _Opened(rpc, parts, True)
                    part = git_response_part(message)
                    parts.append(part)
                    if part.body:
                        return _Opened(rpc, parts, False)
            except grpc.aio.AioRpcError as error:
                last_error = error
                rpc.cancel()
                raise
            except asyncio.CancelledError:
                rpc.cancel()
                failed = _body_failure(body)
                if failed is None and _client_gone(body):
                    log.info("%s of %r: the client went away before the answer began; "
                             "its compute call is cancelled", call.service, call.repo)  # fmt: skip
                    failed = InvalidArgument("the client went away before the answer began")
                if failed is None:
                    raise
                raise failed from None

        opened = await self.pool.call(call.repo, attempt)
        if body is not None:
            await body.commit()
        return opened

    async def _relay(
        self, send: Send, call: GitCall, opened: _Opened, body: BodyBuffer | None
    ) -> int:
        status = 200
        kind = "result" if call.endpoint != INFO_REFS else "advertisement"
        content_type = f"application/x-{call.service}-{kind}"
        for part in opened.parts:
            status = part.http_status or status
            content_type = part.content_type or content_type
        headers = [(b"content-type", content_type.encode()), *NO_CACHE]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        sent = self.metrics.git_response_bytes.labels(call.service)
        for part in opened.parts:
            if part.body:
                await send({"type": "http.response.body", "body": part.body, "more_body": True})
                sent.inc(len(part.body))
        if not opened.ended:
            try:
                while True:
                    message = await opened.call.read()
                    if message is grpc.aio.EOF or not isinstance(message, GitResponse):
                        break
                    part = git_response_part(message)
                    if part.body:
                        await send(
                            {"type": "http.response.body", "body": part.body, "more_body": True}
                        )
                        sent.inc(len(part.body))
            except grpc.aio.AioRpcError as error:
                raise ConversationBroken(f"{call.service} of {call.repo!r}: {error}") from None
            except asyncio.CancelledError:
                if _client_gone(body):
                    log.info("%s of %r: the client went away before the answer ended; "
                             "its compute call is cancelled", call.service, call.repo)  # fmt: skip
                    return status
                failed = _body_failure(body)
                if failed is None:
                    raise
                raise ConversationBroken(f"{call.service} of {call.repo!r}: {failed}") from None
            finally:
                opened.call.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return status
