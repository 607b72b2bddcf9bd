"""The gitproto ASGI application: Git smart HTTP, REST /api/v1 and status endpoints.

A plain ASGI router rather than a framework's: the Git handler must read the
request body and write the response at once (bidirectional relay), which
framework responses that watch ``receive`` for disconnects would race with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from enroute_gitproto.api import PREFIX, ApiHandler
from enroute_gitproto.auth import Authorizer, TokenFile
from enroute_gitproto.githttp import GitHandler, GitHttpLimits
from enroute_gitproto.observe import Metrics, StatusEndpoints
from enroute_gitproto.responses import Receive, Scope, Send
from enroute_gitproto.routing import ComputePool

log = logging.getLogger(__name__)


class GitprotoApp:
    def __init__(
        self,
        members: Sequence[str],
        anonymous: str = "none",
        tokens_file: str | None = None,
        node_id: str = "",
        limits: GitHttpLimits | None = None,
    ) -> None:
        self.metrics = Metrics()
        self.pool = ComputePool(members)
        self.authorizer = Authorizer(anonymous, TokenFile(tokens_file))
        self.git = GitHandler(self.pool, self.authorizer, self.metrics, limits)
        self.api = ApiHandler(self.pool, self.authorizer)
        self.status = StatusEndpoints(node_id, self.pool.members, self.metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if await self.status(scope, send):
            return
        path = scope["path"]
        kind = "api" if path == PREFIX or path.startswith(PREFIX + "/") else "git"
        started = time.monotonic()
        self.metrics.in_flight.inc()
        self.metrics.in_flight_count += 1
        status = 500
        try:
            if kind == "api":
                status = await self.api(scope, receive, send)
            else:
                status = await self.git(scope, receive, send)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.in_flight_count -= 1
            self.metrics.requests.labels(kind, str(status)).inc()
            self.metrics.duration.labels(kind).observe(time.monotonic() - started)

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
