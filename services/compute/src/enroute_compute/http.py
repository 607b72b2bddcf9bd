"""The compute's operator HTTP endpoints: /status, /metrics, /healthz, /readyz.

DESIGN "Observability". A small asyncio HTTP/1.1 responder (GET only, one
request per connection): these endpoints are read by probes and scrapers, so
they need no framework.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from enroute_compute.host import RepositoryHost
from enroute_compute.maintainer import Maintainer
from enroute_core.protocol._common import VERSION

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class OpsServer:
    """Serves the four endpoints for one compute node."""

    def __init__(
        self,
        host: RepositoryHost,
        node_id: str,
        ready: Callable[[], bool],
        *,
        maintainer: Maintainer | None = None,
    ) -> None:
        self.host = host
        self.maintainer = maintainer
        self.node_id = node_id
        self.ready = ready
        self._server: asyncio.Server | None = None

    def status(self) -> dict[str, Any]:
        layers = self.host.layers
        stats: dict[str, Any] | None = None
        if layers is not None:
            s = layers.stats()
            stats = asdict(s)
        maintenance = None if self.maintainer is None else self.maintainer.status()
        return {
            "maintenance": maintenance,
            "role": "compute",
            "node_id": self.node_id,
            "version": VERSION.decode(),
            "hosted_repositories": list(self.host.hosted),
            "layers": stats,
            "pushes": self.host.pushes,
            "fetches": self.host.fetches,
            "view_builds": self.host.view_builds,
            "view_updates": self.host.view_updates,
        }

    def metrics(self) -> str:
        lines = [
            "# TYPE enroute_compute_hosted_repositories gauge",
            f"enroute_compute_hosted_repositories {len(self.host.hosted)}",
            "# TYPE enroute_compute_pushes_total counter",
            f"enroute_compute_pushes_total {self.host.pushes}",
            "# TYPE enroute_compute_fetches_total counter",
            f"enroute_compute_fetches_total {self.host.fetches}",
            "# HELP enroute_compute_view_builds_total views built whole (snapshots)",
            "# TYPE enroute_compute_view_builds_total counter",
            f"enroute_compute_view_builds_total {self.host.view_builds}",
            "# HELP enroute_compute_view_updates_total views updated in place by a change",
            "# TYPE enroute_compute_view_updates_total counter",
            f"enroute_compute_view_updates_total {self.host.view_updates}",
        ]
        if self.maintainer is not None:
            lines += self.maintainer.metrics_lines()
        layers = self.host.layers
        if layers is not None:
            s = layers.stats()
            lines += [
                "# TYPE enroute_layer_links_total counter",
                f"enroute_layer_links_total {s.links}",
                "# TYPE enroute_layer_hydrations_total counter",
                f"enroute_layer_hydrations_total {s.hydrations}",
                "# TYPE enroute_layer_loads_in_flight gauge",
                f"enroute_layer_loads_in_flight {s.loads_in_flight}",
                "# TYPE enroute_layer_fetched_bytes_total counter",
                f"enroute_layer_fetched_bytes_total {s.bytes_fetched}",
            ]
        return "\n".join(lines) + "\n"

    def route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method != "GET":
            return 405, "text/plain", b"method not allowed\n"
        path = path.split("?", 1)[0]
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            if self.ready():
                return 200, "text/plain", b"ready\n"
            return 503, "text/plain", b"not ready\n"
        if path == "/status":
            return 200, "application/json", json.dumps(self.status(), indent=1).encode()
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.metrics().encode()
        return 404, "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            if len(parts) < 2:
                return
            status, ctype, body = self.route(parts[0], parts[1])
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, host, port)
        sock = self._server.sockets[0].getsockname()
        return str(sock[0]), int(sock[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
