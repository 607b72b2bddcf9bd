"""/status, /metrics, /healthz and /readyz (DESIGN.md, "External interfaces", Observability).

Metrics live in a registry of their own (not the process-global one), so two
apps in one process never share counters; names carry the ``enroute_`` prefix,
counters end in ``_total``, durations are ``_seconds`` histograms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from enroute_gitproto.responses import Scope, Send, send_bytes, send_json

VERSION = "0.1.0"


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    in_flight_count: int = 0

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "enroute_http_requests_total", "HTTP requests by route kind and status",
            ["kind", "status"], registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "enroute_http_request_duration_seconds", "HTTP request time until the response ended",
            ["kind"], registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            "enroute_http_requests_in_flight", "HTTP requests being served", registry=r
        )
        self.git_request_bytes = Counter(
            "enroute_git_request_bytes_total", "Git request body bytes sent to computes",
            ["service"], registry=r,
        )  # fmt: skip
        self.git_response_bytes = Counter(
            "enroute_git_response_bytes_total", "Git response body bytes sent to clients",
            ["service"], registry=r,
        )  # fmt: skip
        self.failovers = Counter(
            "enroute_compute_failovers_total", "Calls moved to the next compute after UNAVAILABLE",
            registry=r,
        )  # fmt: skip


class StatusEndpoints:
    def __init__(self, node_id: str, members: Sequence[str], metrics: Metrics) -> None:
        self.node_id = node_id
        self.members = tuple(members)
        self.metrics = metrics
        self.ready = False

    async def __call__(self, scope: Scope, send: Send) -> bool:
        """Answer ``scope`` when it is a status path; False when it is not one."""
        path = scope["path"]
        if path == "/healthz":
            await send_bytes(send, 200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/readyz":
            status, body = (200, b"ready\n") if self.ready else (503, b"starting\n")
            await send_bytes(send, status, body, "text/plain; charset=utf-8")
        elif path == "/metrics":
            text = generate_latest(self.metrics.registry)
            await send_bytes(send, 200, text, "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/status":
            await send_json(send, 200, self.status())
        else:
            return False
        return True

    def status(self) -> dict[str, object]:
        return {
            "role": "gitproto",
            "node_id": self.node_id,
            "version": VERSION,
            "ready": self.ready,
            "compute_members": list(self.members),
            "requests_in_flight": self.metrics.in_flight_count,
        }
