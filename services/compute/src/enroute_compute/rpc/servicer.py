"""The Compute servicer (docs/rpc.md, "Compute"): Git byte streams and the repository API.

Git streams: the first request message is the header, the rest are body
chunks; the answer is a header, then body chunks. An error before the first
answer is a gRPC status with the error detail (gitproto renders it); once the
body has started, errors are written in Git's form by the host, and anything
else breaks the call.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc

from enroute_compute.fetch import Fetcher
from enroute_compute.host import REQUEST_ID, RepositoryHost
from enroute_compute.ledger_port import CreateMode, RepoSummary
from enroute_compute.push import Pusher
from enroute_compute.rpc.convert import commit_request_from_pb, ref_to_pb, summary_to_pb
from enroute_compute.rpc.errors import abort_args
from enroute_core.base.errors import (
    EnrouteError,
    Internal,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    ProtocolError,
)
from enroute_core.base.limits import MiB
from enroute_core.protocol.advertise import Service
from enroute_core.state.head import branch_ref
from enroute_core.state.model import advancement
from enroute_core.state.names import check_repo_name
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_proto.request_id import find_request_id

REQUEST_BODY_BYTES_MAX = 64 * MiB
"""Largest upload-pack request body (wants and haves), after decompression."""
REFS_PER_MESSAGE = 1000
BODY_BYTES_PER_MESSAGE = 1 * MiB
"""Largest body of one GitResponse: an advertisement is built whole (one chunk), and one
of a repository with many refs goes out in pieces, far below the message bound. A piece
of a pack (256 to 512 KiB with its side-band frames, ``serve._FLUSH_BYTES``) is one
message, not cut."""
log = logging.getLogger(__name__)

LIST_LIMIT_DEFAULT = 100
LIST_LIMIT_MAX = 1000

_SERVICES: dict[int, Service] = {
    compute_pb2.GIT_SERVICE_UPLOAD_PACK: "git-upload-pack",
    compute_pb2.GIT_SERVICE_RECEIVE_PACK: "git-receive-pack",
}
_CONTENT_TYPES = {
    ("advertisement", "git-upload-pack"): "application/x-git-upload-pack-advertisement",
    ("advertisement", "git-receive-pack"): "application/x-git-receive-pack-advertisement",
    ("result", "git-upload-pack"): "application/x-git-upload-pack-result",
    ("result", "git-receive-pack"): "application/x-git-receive-pack-result",
}


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any],
    exc: EnrouteError,
    cause: BaseException | None = None,
) -> NoReturn:
    """End the call with the error table's status for ``exc`` (docs/rpc.md, "Errors").

    A failure of this server (the table maps it to HTTP 5xx: internal, unavailable,
    corrupt data, ...) is logged here, once, with the request id, so that no 500 a
    client sees goes without a log line; a client's own error (4xx) is its answer.
    """
    if exc.mapping.http_status >= 500:
        request_id = find_request_id(context.invocation_metadata()) or b""
        log.error(
            "request %s failed: %s: %s",
            request_id.hex(),
            exc.code,
            exc.message,
            exc_info=cause,
        )
    status, message, metadata = abort_args(exc)
    context.set_trailing_metadata(metadata)
    await context.abort(status, message)
    raise AssertionError("abort returned")


async def _header(
    requests: AsyncIterator[compute_pb2.GitRequest],
) -> compute_pb2.GitRequestHeader:
    async for msg in requests:
        if msg.HasField("header"):
            return msg.header
        break
    raise ProtocolError("a Git stream starts with its header")


async def _body(
    requests: AsyncIterator[compute_pb2.GitRequest], content_encoding: str
) -> AsyncIterator[bytes]:
    """The request body, decompressed as ``Content-Encoding`` says (git gzips large requests)."""
    encoding = content_encoding.strip().lower()
    inflater: Any = None
    if encoding in ("gzip", "x-gzip"):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    elif encoding not in ("", "identity"):
        raise ProtocolError(f"unsupported Content-Encoding {content_encoding!r}")
    async for msg in requests:
        if msg.HasField("header"):
            raise ProtocolError("a second header in a Git stream")
        data = msg.body
        if inflater is not None:
            try:
                data = inflater.decompress(data)
            except zlib.error as e:
                raise ProtocolError(f"request body does not inflate: {e}") from None
        if data:
            yield data
    if inflater is not None:
        tail = inflater.flush()
        if tail:
            yield tail


async def _collect(chunks: AsyncIterator[bytes]) -> bytes:
    out = bytearray()
    async for chunk in chunks:
        out.extend(chunk)
        if len(out) > REQUEST_BODY_BYTES_MAX:
            raise LimitExceeded("request_body_bytes_max", len(out), REQUEST_BODY_BYTES_MAX)
    return bytes(out)


async def _git_header(
    requests: AsyncIterator[compute_pb2.GitRequest],
    context: grpc.aio.ServicerContext[Any, Any],
    implied: Service | None,
) -> tuple[compute_pb2.GitRequestHeader, Service]:
    """The header of a Git stream and its service, the repository name checked; a bad
    one ends the call with its status."""
    try:
        header = await _header(requests)
        service = _service_of(header, implied)
        check_repo_name(header.repo)
    except EnrouteError as exc:
        await _abort(context, exc)
    return header, service


def _service_of(header: compute_pb2.GitRequestHeader, implied: Service | None) -> Service:
    service = _SERVICES.get(header.service)
    if implied is None:
        if service is None:
            raise InvalidArgument("InfoRefs needs a service")
        return service
    if service is not None and service != implied:
        raise InvalidArgument(f"service {service} on the {implied} call")
    return implied


def _page_token(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def _token_name(token: str) -> str:
    if not token:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token is not one this service gave") from None


class ComputeServicer(compute_pb2_grpc.ComputeServicer):
    def __init__(self, host: RepositoryHost, *, pack_writers: int = 64) -> None:
        self.host = host
        self.fetcher = Fetcher(host, pack_writers=pack_writers)
        self.pusher = Pusher(host)

    async def _git(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        content_type: str,
        chunks: AsyncIterator[bytes],
        what: str,
    ) -> AsyncIterator[compute_pb2.GitResponse]:
        """``what`` names the call in the log line of a request that went before its end."""
        started = False
        began = time.monotonic()
        REQUEST_ID.set(find_request_id(context.invocation_metadata()) or b"")
        try:
            async for chunk in chunks:
                if not started:
                    started = True
                    yield compute_pb2.GitResponse(
                        header=compute_pb2.GitResponseHeader(content_type=content_type)
                    )
                for start in range(0, len(chunk), BODY_BYTES_PER_MESSAGE):
                    piece = chunk[start : start + BODY_BYTES_PER_MESSAGE]
                    yield compute_pb2.GitResponse(body=piece)
        except EnrouteError as exc:
            await _abort(context, exc)
        except asyncio.CancelledError:
            # The client went, gitproto cancelled the call, its deadline passed or the
            # compute is stopping: the work has stopped (work.py); one line, no traceback.
            log.info(
                "%s ended with its request after %.1f s (call cancelled: client gone, "
                "body refused, deadline or shutdown); its work stopped",
                what,
                time.monotonic() - began,
            )
            raise
        except Exception as exc:  # a bug: answered as internal, logged with its traceback
            await _abort(context, Internal(f"{what} failed: {type(exc).__name__}"), exc)
        if not started:
            yield compute_pb2.GitResponse(
                header=compute_pb2.GitResponseHeader(content_type=content_type)
            )

    async def InfoRefs(
        self,
        request_iterator: AsyncIterator[compute_pb2.GitRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[compute_pb2.GitResponse]:
        header, service = await _git_header(request_iterator, context, None)

        async def chunks() -> AsyncIterator[bytes]:
            yield await self.fetcher.info_refs(header.repo, service, header.git_protocol)

        ctype = _CONTENT_TYPES[("advertisement", service)]
        async for msg in self._git(context, ctype, chunks(), f"info/refs of {header.repo}"):
            yield msg

    async def UploadPack(
        self,
        request_iterator: AsyncIterator[compute_pb2.GitRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[compute_pb2.GitResponse]:
        header, _ = await _git_header(request_iterator, context, "git-upload-pack")
        try:
            body = await _collect(_body(request_iterator, header.content_encoding))
        except EnrouteError as exc:
            await _abort(context, exc)
        chunks = self.fetcher.upload_pack(header.repo, header.git_protocol, body)
        ctype = _CONTENT_TYPES[("result", "git-upload-pack")]
        async for msg in self._git(context, ctype, chunks, f"upload-pack of {header.repo}"):
            yield msg

    async def ReceivePack(
        self,
        request_iterator: AsyncIterator[compute_pb2.GitRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[compute_pb2.GitResponse]:
        header, _ = await _git_header(request_iterator, context, "git-receive-pack")
        chunks = self.pusher.receive_pack(
            header.repo,
            _body(request_iterator, header.content_encoding),
            find_request_id(context.invocation_metadata()) or b"",
        )
        ctype = _CONTENT_TYPES[("result", "git-receive-pack")]
        async for msg in self._git(context, ctype, chunks, f"receive-pack to {header.repo}"):
            yield msg

    # -- repository API -------------------------------------------------------------------

    async def CreateRepository(
        self,
        request: compute_pb2.CreateRepositoryRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> compute_pb2.CreateRepositoryResponse:
        try:
            check_repo_name(request.repo)
            head = branch_ref(request.default_branch or b"main")
            activated = await self.host.ledger.activate(request.repo, CreateMode.EXPLICIT, head)
        except EnrouteError as exc:
            await _abort(context, exc)
        return compute_pb2.CreateRepositoryResponse(
            repository=summary_to_pb(activated.state), created=activated.created
        )

    async def GetRepository(
        self,
        request: compute_pb2.GetRepositoryRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> compute_pb2.GetRepositoryResponse:
        try:
            check_repo_name(request.repo)
            summary = await self.host.ledger.describe(request.repo)
            if summary.deleted:
                self.host.drop(request.repo)
                raise NotFound(f"repository {request.repo} not found", name=request.repo)
        except EnrouteError as exc:
            await _abort(context, exc)
        return compute_pb2.GetRepositoryResponse(repository=summary_to_pb(summary))

    async def ListRepositories(
        self,
        request: compute_pb2.ListRepositoriesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> compute_pb2.ListRepositoriesResponse:
        try:
            start = _token_name(request.page_token)
            limit = min(request.limit or LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX)
            pages = await self.host.ledger.list(start, limit)
        except EnrouteError as exc:
            await _abort(context, exc)
        best: dict[str, RepoSummary] = {}
        for page in pages:
            for s in page.repos:
                old = best.get(s.name)
                if old is None or _summary_advancement(s) > _summary_advancement(old):
                    best[s.name] = s
        cuts = [p.repos[-1].name.encode() for p in pages if p.more and p.repos]
        cut = min(cuts) if cuts else None
        names = sorted(best, key=str.encode)
        if cut is not None:
            names = [n for n in names if n.encode() <= cut]
        live = [summary_to_pb(best[n]) for n in names if not best[n].deleted]
        token = _page_token(cut.decode()) if cut is not None else ""
        return compute_pb2.ListRepositoriesResponse(repositories=live, next_page_token=token)

    async def DeleteRepository(
        self,
        request: compute_pb2.DeleteRepositoryRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> compute_pb2.DeleteRepositoryResponse:
        try:
            check_repo_name(request.repo)
            await self.host.ledger.delete(request.repo)
        except EnrouteError as exc:
            await _abort(context, exc)
        self.host.drop(request.repo)
        return compute_pb2.DeleteRepositoryResponse()

    async def ListRefs(
        self,
        request: compute_pb2.ListRefsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[compute_pb2.ListRefsResponse]:
        try:
            repo = await self.host.read(request.repo)  # behind a barrier: DESIGN "Read path"
        except EnrouteError as exc:
            await _abort(context, exc)
        refs = [
            ref_to_pb(name, value)
            for name, value in sorted(repo.state.refs.items())
            if name.startswith(request.prefix)
        ]
        for i in range(0, len(refs), REFS_PER_MESSAGE):
            yield compute_pb2.ListRefsResponse(refs=refs[i : i + REFS_PER_MESSAGE])

    async def CreateCommit(
        self,
        request: compute_pb2.CreateCommitRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> compute_pb2.CreateCommitResponse:
        try:
            built = await self.pusher.create_commit(
                commit_request_from_pb(request),
                find_request_id(context.invocation_metadata()) or b"",
            )
        except EnrouteError as exc:
            await _abort(context, exc)
        warnings = [
            compute_pb2.FsckWarning(msg_id=w.msg_id, count=w.count, example=w.example)
            for w in built.warnings
        ]
        return compute_pb2.CreateCommitResponse(oid=built.oid, tree=built.tree, warnings=warnings)


def _summary_advancement(s: RepoSummary) -> tuple[int, bool, int]:
    return advancement(s.incarnation, s.deleted, s.version)
