"""REST ``/api/v1`` (DESIGN.md, "External interfaces").

A repository name may hold ``/`` and appears in the path as it is (``%2F``
works too, since the path is matched decoded); sub-resources follow a ``/-/``
segment, which no name can contain. Every error body is
``{"error": {"code", "message", "details"}}`` with the status of ERROR_TABLE.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import grpc

from enroute_core.base.errors import EnrouteError, InvalidArgument, NotFound
from enroute_core.state.names import check_repo_name
from enroute_gitproto.auth import Authorizer, Principal
from enroute_gitproto.openapi import OPENAPI
from enroute_gitproto.responses import Receive, Scope, Send, header, send_json, send_json_error
from enroute_gitproto.routing import LIST_KEY, ComputePool
from enroute_gitproto.rpc import convert
from enroute_gitproto.rpc.errors import from_rpc_error
from enroute_proto.gen.enroute.compute.v1 import compute_pb2
from enroute_proto.logs import call_metadata

if TYPE_CHECKING:
    from enroute_proto.gen.enroute.compute.v1.compute_pb2_grpc import ComputeAsyncStub

PREFIX = "/api/v1"
UNARY_TIMEOUT_S = 60.0
LIST_LIMIT_MAX = 1000


class MethodNotAllowed(Exception):
    pass


async def read_json(receive: Receive) -> Any:
    """The JSON body; its size is bounded by the transport (``transport.api_body_max``)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidArgument("the client went away before the request body ended")
        chunk = message.get("body", b"")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    try:
        value = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("the request body is not JSON") from None
    except RecursionError:
        raise InvalidArgument("the request body is nested too deeply") from None
    try:
        # A lone surrogate escape (``"\ud800"``) decodes to a str no UTF-8 encoder takes.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("the request body holds a lone surrogate escape") from None
    except RecursionError:
        raise InvalidArgument("the request body is nested too deeply") from None
    return value


class ApiHandler:
    def __init__(
        self,
        pool: ComputePool,
        authorizer: Authorizer,
        clock_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self.pool = pool
        self.authorizer = authorizer
        self.clock_us = clock_us  # API commit times: fixed here, the same on every replay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> int:
        try:
            return await self._route(scope, receive, send)
        except grpc.aio.AioRpcError as rpc_error:
            error: EnrouteError = from_rpc_error(rpc_error)
        except EnrouteError as enroute_error:
            error = enroute_error
        except MethodNotAllowed:
            await send_json(
                send, 405,
                {"error": {"code": "method_not_allowed", "message": f"{scope['method']} is "
                           "not allowed here", "details": {}}},
            )  # fmt: skip
            return 405
        await send_json_error(send, error)
        return error.mapping.http_status

    def _auth(self, scope: Scope, need: str, repo: str | None) -> Principal:
        return self.authorizer.authorize(header(scope, b"authorization"), need, repo)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> int:
        method = scope["method"]
        rest = scope["path"][len(PREFIX) :]
        if rest == "/openapi.json":
            await send_json(send, 200, OPENAPI)
            return 200
        if rest in ("/repos", "/repos/"):
            if method == "GET":
                return await self._list(scope, send)
            if method == "POST":
                return await self._create(scope, receive, send)
            raise MethodNotAllowed
        if not rest.startswith("/repos/"):
            raise NotFound(f"no such API path: {scope['path'][:200]}")
        target = rest[len("/repos/") :]
        name, sep, sub = target.partition("/-/")
        if not sep and target.endswith("/-"):
            name, sub = target[:-2], ""
        repo = check_repo_name(name)
        if not sep:
            if method == "GET":
                return await self._get(scope, send, repo)
            if method == "DELETE":
                return await self._delete(scope, send, repo)
            raise MethodNotAllowed
        if sub == "refs":
            if method != "GET":
                raise MethodNotAllowed
            return await self._refs(scope, send, repo)
        if sub == "commits":
            if method != "POST":
                raise MethodNotAllowed
            return await self._commit(scope, receive, send, repo)
        raise NotFound(f"no such sub-resource: {sub[:100]!r}")

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> int:
        body = await read_json(receive)
        if not isinstance(body, dict):
            raise InvalidArgument("the request body must be a JSON object")
        name = body.get("name")
        if not isinstance(name, str):
            raise InvalidArgument("'name' is required and must be a string", field="name")
        branch = body.get("default_branch")
        if branch is not None and not isinstance(branch, str):
            raise InvalidArgument("'default_branch' must be a string", field="default_branch")
        repo = check_repo_name(name)
        self._auth(scope, "write", repo)
        request = convert.create_repository_request(repo, branch or "")

        async def attempt(stub: ComputeAsyncStub) -> compute_pb2.CreateRepositoryResponse:
            return await stub.CreateRepository(
                request, timeout=UNARY_TIMEOUT_S, metadata=call_metadata()
            )

        response = await self.pool.call(repo, attempt)
        status = 201 if response.created else 200
        await send_json(send, status, convert.repository_json(response.repository))
        return status

    async def _get(self, scope: Scope, send: Send, repo: str) -> int:
        self._auth(scope, "read", repo)
        request = convert.get_repository_request(repo)

        async def attempt(stub: ComputeAsyncStub) -> compute_pb2.GetRepositoryResponse:
            return await stub.GetRepository(request, timeout=UNARY_TIMEOUT_S)

        response = await self.pool.call(repo, attempt)
        await send_json(send, 200, convert.repository_json(response.repository))
        return 200

    async def _delete(self, scope: Scope, send: Send, repo: str) -> int:
        self._auth(scope, "admin", repo)
        request = convert.delete_repository_request(repo)

        async def attempt(stub: ComputeAsyncStub) -> compute_pb2.DeleteRepositoryResponse:
            return await stub.DeleteRepository(
                request, timeout=UNARY_TIMEOUT_S, metadata=call_metadata()
            )

        await self.pool.call(repo, attempt)
        await send_json(send, 204, None)
        return 204

    async def _list(self, scope: Scope, send: Send) -> int:
        principal = self._auth(scope, "read", None)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        limit_text = (query.get("limit") or ["0"])[0]
        # str.isdigit() also takes digits int() refuses ("²"); only ASCII digits count.
        if not (limit_text.isascii() and limit_text.isdigit()):
            raise InvalidArgument("'limit' must be a non-negative integer", field="limit")
        # Any number over the maximum means the maximum (and int() refuses 4300+ digits).
        limit = LIST_LIMIT_MAX if len(limit_text) > 9 else min(int(limit_text), LIST_LIMIT_MAX)
        request = convert.list_repositories_request(limit, (query.get("page_token") or [""])[0])

        async def attempt(stub: ComputeAsyncStub) -> compute_pb2.ListRepositoriesResponse:
            return await stub.ListRepositories(request, timeout=UNARY_TIMEOUT_S)

        response = await self.pool.call(LIST_KEY, attempt)
        page = convert.list_repositories_json(response)
        page["repos"] = [r for r in page["repos"] if principal.sees(r["name"])]
        await send_json(send, 200, page)
        return 200

    async def _refs(self, scope: Scope, send: Send, repo: str) -> int:
        self._auth(scope, "read", repo)
        request = convert.list_refs_request(repo)

        async def attempt(stub: ComputeAsyncStub) -> list[compute_pb2.ListRefsResponse]:
            return [chunk async for chunk in stub.ListRefs(request, timeout=UNARY_TIMEOUT_S)]

        chunks = await self.pool.call(repo, attempt)
        await send_json(send, 200, convert.refs_json(chunks))
        return 200

    async def _commit(self, scope: Scope, receive: Receive, send: Send, repo: str) -> int:
        self._auth(scope, "write", repo)
        request = convert.create_commit_request(repo, await read_json(receive))
        # one id and one commit time for this commit on every compute tried, so a replay
        # builds the same commit and the ledger applies it once (docs/rpc.md, "Request ids")
        named = call_metadata()
        now_us = self.clock_us()
        if not request.author.HasField("time_us"):
            request.author.time_us = now_us
        if request.HasField("committer") and not request.committer.HasField("time_us"):
            request.committer.time_us = now_us

        async def attempt(stub: ComputeAsyncStub) -> compute_pb2.CreateCommitResponse:
            return await stub.CreateCommit(request, timeout=UNARY_TIMEOUT_S, metadata=named)

        response = await self.pool.call(repo, attempt)
        await send_json(send, 201, convert.create_commit_json(response))
        return 201
