"""The gitproto ASGI application: Git smart HTTP, REST /api/v1 and status endpoints.

A plain ASGI router rather than a framework's: the Git handler must read the
request body and write the response at once (bidirectional relay), which
framework responses that watch ``receive`` for disconnects would race with.

Transport bounds (docs/access-control.md, "Hostile transport input") are
applied here to Git and API requests alike, before a handler runs or while
it runs: requests in flight per node and per repository (503 with
Retry-After), the whole request's time, the wait for the next body bytes,
and the API body size. Status endpoints are exempt, so probes keep working
under load.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from enroute_core.base.errors import (
    EnrouteError,
    InvalidArgument,
    LimitExceeded,
    Timeout,
    Unavailable,
)
from enroute_core.base.limits import DEFAULT_LIMITS, KiB, MiB
from enroute_gitproto.api import PREFIX, ApiHandler
from enroute_gitproto.auth import REMOTE, Authorizer, TokenFile
from enroute_gitproto.connections import Connections
from enroute_gitproto.githttp import (
    ConversationBroken,
    GitHandler,
    GitHttpLimits,
    parse_git_request,
)
from enroute_gitproto.observe import Metrics, StatusEndpoints
from enroute_gitproto.responses import (
    Message,
    Receive,
    Scope,
    Send,
    header,
    send_json_error,
    send_text_error,
)
from enroute_gitproto.routing import FAILOVER_WAIT_S, ComputePool
from enroute_proto.logs import note

log = logging.getLogger(__name__)

REPO_KEY_CHARS_MAX = 512


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """Bounds of every Git and API request on one node (config section ``transport``)."""

    requests_max: int = 256
    repo_requests_max: int = 32
    retry_after_s: float = 5.0
    request_timeout_s: float = 3600.0
    body_idle_timeout_s: float = 60.0
    api_body_bytes_max: int = 64 * MiB
    connections_max: int = 1024
    rpc_message_bytes_max: int = DEFAULT_LIMITS.rpc_message_bytes_max
    """One gRPC message to or from a compute (the ``rpc_message_bytes_max`` limit)."""
    client_connections_max: int = 256
    """Open connections from one client address; 0: no bound (connections.py)."""
    client_requests_max: int = 128
    """Requests in flight from one client address; 0: no bound."""
    header_timeout_s: float = 20.0
    """From a connection's start, or the end of its last request, to a whole request head."""
    header_bytes_max: int = 16 * KiB
    """Request line and header fields of one request."""


class Admission:
    """Requests in flight on this node, per repository and per client address; one event
    loop, so no lock."""

    def __init__(self, limits: TransportLimits) -> None:
        self.limits = limits
        self.total = 0
        self.by_repo: dict[str, int] = {}  # at most requests_max keys: zero counts go
        self.by_client: dict[str, int] = {}  # likewise

    def enter(self, repo: str | None, client: str = "-") -> None:
        """Take a slot, or Unavailable (503, Retry-After) naming the bound that is full."""
        limits = self.limits
        if self.total >= limits.requests_max:
            raise Unavailable(
                f"this node is serving its limit of {limits.requests_max} requests "
                "(transport.requests_max); retry later",
                retry_after_s=limits.retry_after_s,
            )
        cap = limits.client_requests_max
        if cap and self.by_client.get(client, 0) >= cap:
            raise Unavailable(
                f"client {client} has its limit of {cap} requests in flight "
                "(transport.client_requests_max); retry later",
                retry_after_s=limits.retry_after_s,
            )
        if repo is not None and self.by_repo.get(repo, 0) >= limits.repo_requests_max:
            raise Unavailable(
                f"repository {repo!r} is being served its limit of {limits.repo_requests_max} "
                "requests (transport.repo_requests_max); retry later",
                retry_after_s=limits.retry_after_s,
            )
        self.total += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        if repo is not None:
            self.by_repo[repo] = self.by_repo.get(repo, 0) + 1

    def leave(self, repo: str | None, client: str = "-") -> None:
        assert self.total > 0
        self.total -= 1
        left_client = self.by_client[client] - 1
        if left_client:
            self.by_client[client] = left_client
        else:
            del self.by_client[client]
        if repo is not None:
            left = self.by_repo[repo] - 1
            if left:
                self.by_repo[repo] = left
            else:
                del self.by_repo[repo]


def api_repo(path: str) -> str | None:
    """The repository an API path names (the admission key), None for listings."""
    rest = path[len(PREFIX) :]
    if not rest.startswith("/repos/"):
        return None
    target = rest[len("/repos/") :]
    name, sep, _ = target.partition("/-/")
    if not sep and target.endswith("/-"):
        name = target[:-2]
    return name[:REPO_KEY_CHARS_MAX] or None


def git_repo(scope: Scope) -> str | None:
    """The repository of a Git path; None when it names none (the handler says why)."""
    try:
        call = parse_git_request(
            scope["method"], scope["path"], scope.get("query_string", b"").decode("latin-1")
        )
    except EnrouteError:
        return None
    return call.repo if call is not None else None


class _Guard:
    """The receive and send of one request, with its bounds applied.

    ``receive`` waits at most ``body_idle_timeout_s`` for the next message
    (a slow-loris body ends in Timeout) and counts an API body against its
    bound; ``send`` notes whether the response has started.
    """

    def __init__(self, receive: Receive, send: Send, limits: TransportLimits, api: bool) -> None:
        self._receive = receive
        self._send = send
        self._limits = limits
        self._api = api
        self.body_bytes = 0
        self.started = False

    async def receive(self) -> Message:
        idle_s = self._limits.body_idle_timeout_s
        try:
            async with asyncio.timeout(idle_s):  # no task per chunk, unlike wait_for
                message = await self._receive()
        except TimeoutError:
            raise Timeout(
                f"the request body sent nothing for {idle_s:g} s (transport.body_idle_timeout)",
                timeout_s=idle_s,
            ) from None
        if self._api and message["type"] == "http.request":
            self.body_bytes += len(message.get("body", b""))
            maximum = self._limits.api_body_bytes_max
            if self.body_bytes > maximum:
                raise LimitExceeded(
                    "api_body_bytes_max",
                    self.body_bytes,
                    maximum,
                    f"the request body is over {maximum} bytes (transport.api_body_max)",
                )
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class GitprotoApp:
    def __init__(
        self,
        members: Sequence[str],
        *,
        anonymous: str = "none",
        tokens_file: str | None = None,
        node_id: str = "",
        limits: GitHttpLimits | None = None,
        transport: TransportLimits | None = None,
        failover_wait_s: float = FAILOVER_WAIT_S,
    ) -> None:
        self.metrics = Metrics()
        self.transport = transport or TransportLimits()
        self.pool = ComputePool(
            members,
            ready_wait_s=failover_wait_s,
            message_bytes_max=self.transport.rpc_message_bytes_max,
        )
        self.admission = Admission(self.transport)
        self.authorizer = Authorizer(
            anonymous,
            TokenFile(tokens_file),
            lambda reason: self.metrics.auth_failures.labels(reason).inc(),
        )
        self.git = GitHandler(self.pool, self.authorizer, self.metrics, limits)
        self.api = ApiHandler(self.pool, self.authorizer)
        self.status = StatusEndpoints(node_id, self.pool.members, self.metrics)
        self.status.sections["auth"] = self.authorizer.status
        t = self.transport
        self.connections = Connections(
            connections_max=t.connections_max,
            client_connections_max=t.client_connections_max,
            header_timeout_s=t.header_timeout_s,
            header_bytes_max=t.header_bytes_max,
            retry_after_s=t.retry_after_s,
            on_close=lambda reason: self.metrics.connections_closed.labels(reason).inc(),
        )
        self.metrics.connections_open.set_function(lambda: self.connections.open)
        self.status.sections["connections"] = self.connections.status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if await self.status(scope, send):
            return
        client = scope.get("client")
        REMOTE.set(f"{client[0]}:{client[1]}" if client else "-")
        path = scope["path"]
        kind = "api" if path == PREFIX or path.startswith(PREFIX + "/") else "git"
        self.metrics.in_flight.inc()
        self.metrics.in_flight_count += 1
        try:
            await self._admit(scope, receive, send, kind)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.in_flight_count -= 1

    async def _admit(self, scope: Scope, receive: Receive, send: Send, kind: str) -> int:
        api = kind == "api"
        guard = _Guard(receive, send, self.transport, api)
        repo = api_repo(scope["path"]) if api else git_repo(scope)
        note(repo=repo or "")  # every line of this request names it (docs/logging.md)
        client = scope["client"][0] if scope.get("client") else "-"
        try:
            if api:
                self._check_api_length(scope)
                if scope["method"] == "POST":
                    # every API POST needs write: refuse before its body is read
                    self.authorizer.authorize(header(scope, b"authorization"), "write", repo)
            self.admission.enter(repo, client)
        except EnrouteError as error:
            return await self._refuse(guard, error, api)
        timer = asyncio.timeout(self.transport.request_timeout_s)
        try:
            async with timer:
                if api:
                    return await self.api(scope, guard.receive, guard.send)
                return await self.git(scope, guard.receive, guard.send)
        except TimeoutError:
            if not timer.expired():
                raise
            timeout_s = self.transport.request_timeout_s
            late = Timeout(
                f"the request took longer than {timeout_s:g} s (transport.request_timeout)",
                timeout_s=timeout_s,
            )
            log.warning("request cut: remote=%s path=%s: %s", REMOTE.get(),
                        scope["path"][:200], late.message)  # fmt: skip
            if guard.started:
                raise ConversationBroken(late.message) from None
            return await self._refuse(guard, late, api)
        except asyncio.CancelledError:
            # Only shutdown cancels a request (uvicorn, past its grace; the timer's own
            # cancellation is a TimeoutError here): one line, not uvicorn's traceback.
            # The compute's call is cancelled with it, and its work stops.
            log.info("request cut by shutdown: remote=%s path=%s", REMOTE.get(),
                     scope["path"][:200])  # fmt: skip
            if guard.started:
                return 200  # the client sees the answer cut short, as git detects
            stopping = Unavailable("the server is shutting down; retry", retry_after_s=1)
            return await self._refuse(guard, stopping, api)
        finally:
            self.admission.leave(repo, client)

    def _check_api_length(self, scope: Scope) -> None:
        length = (header(scope, b"content-length") or "").strip()
        maximum = self.transport.api_body_bytes_max
        if length and not length.isdigit():
            raise InvalidArgument("the Content-Length header is not a number")
        if length and int(length) > maximum:
            raise LimitExceeded(
                "api_body_bytes_max",
                int(length),
                maximum,
                f"the request body of {int(length)} bytes is over {maximum} bytes "
                "(transport.api_body_max)",
            )

    async def _refuse(self, guard: _Guard, error: EnrouteError, api: bool) -> int:
        if api:
            await send_json_error(guard.send, error)
        else:
            await send_text_error(guard.send, error)
        return error.mapping.http_status

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.status.ready = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.status.ready = False
                await self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
