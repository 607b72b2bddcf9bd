"""/status, /metrics, /healthz and /readyz (DESIGN.md, "External interfaces", Observability).

Metrics live in a registry of their own (not the process-global one), so two
apps in one process never share counters; names carry the ``enroute_`` prefix,
counters end in ``_total``, durations are ``_seconds`` histograms.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from enroute_gitproto.responses import (
    Message,
    Receive,
    Scope,
    Send,
    header,
    send_bytes,
    send_json,
)
from enroute_proto.logs import ACCESS_LOGGER, log_context
from enroute_proto.request_id import new_request_id

VERSION = "0.1.0"
ACCESS_PATH_CHARS_MAX = 300
ACCESS_AGENT_CHARS_MAX = 200

access_log = logging.getLogger(ACCESS_LOGGER)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    in_flight_count: int = 0

    def __post_init__(self) -> None:
        r = self.registry
        # requests are counted once, by service (RequestMetrics): enroute_gitproto_requests_total
        ProcessCollector(registry=r)  # process_*: CPU, memory, open files, start time
        Info("enroute_build", "version of this process", registry=r).info(
            {"version": VERSION, "role": "gitproto"}
        )
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
        self.gitproto_requests = Counter(
            "enroute_gitproto_requests_total", "HTTP requests by Git service (api, ops) and status",
            ["service", "status"], registry=r,
        )  # fmt: skip
        self.gitproto_seconds = Histogram(
            "enroute_gitproto_request_seconds", "HTTP request time by Git service (or api, ops)",
            ["service"], registry=r,
        )  # fmt: skip
        self.auth_failures = Counter(
            "enroute_gitproto_auth_failures_total",
            "Requests refused by authentication or authorization, by reason",
            ["reason"], registry=r,
        )  # fmt: skip
        self.connections_open = Gauge(
            "enroute_gitproto_connections_open", "HTTP connections open on this node", registry=r
        )
        self.connections_closed = Counter(
            "enroute_gitproto_connections_closed_total",
            "HTTP connections refused or closed by a connection bound, by reason",
            ["reason"], registry=r,
        )  # fmt: skip
        self.compute_members = Gauge(
            "enroute_gitproto_compute_members", "Compute members requests are routed over",
            registry=r,
        )  # fmt: skip


class DiscoveryCollector:
    """Counters of the EndpointSliceSource that finds computes (enroute_core.discovery)."""

    def __init__(self, stats: Any, target: str) -> None:
        self.stats = stats
        self.target = target

    def collect(self) -> Iterator[Metric]:
        for name in type(self.stats).__dataclass_fields__:
            c = CounterMetricFamily(
                f"enroute_discovery_{name}", f"member discovery: {name}", labels=["target"]
            )
            c.add_metric([self.target], getattr(self.stats, name))
            yield c


OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/status"})
OPS_ONLY_PATHS = frozenset({"/metrics", "/status"})
"""Served on the operator port only (``listen.ops``), never on the Git port."""


def service_of(scope: Scope) -> str:
    """The ``service`` label of a request: the Git service, ``api``, ``ops`` or ``other``."""
    path: str = scope.get("path", "")
    if path in OPS_PATHS:
        return "ops"
    if path == "/api/v1" or path.startswith("/api/v1/"):
        return "api"
    if path.endswith("/git-upload-pack"):
        return "git-upload-pack"
    if path.endswith("/git-receive-pack"):
        return "git-receive-pack"
    if path.endswith("/info/refs"):
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
        service = (query.get("service") or [""])[0]
        if service in ("git-upload-pack", "git-receive-pack"):
            return service
        return "git-upload-pack"  # dumb-protocol probes: answered as a fetch would be
    return "other"


class RequestMetrics:
    """ASGI wrapper: counts every HTTP request by service and the status it was answered,
    and writes its access line (docs/logging.md, "Access lines").

    Each request gets a fresh request id here: every line logged while it is served
    carries it, it goes to the compute in the call's metadata (enroute_proto.logs),
    and the client gets it as ``X-Request-Id`` to quote in a report. An id a client
    sends is not taken: it is the ledger's deduplication key of the write.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Any], metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        service = service_of(scope)
        request_id = new_request_id().hex()
        log_context(request_id=request_id)
        status = [0]
        sizes = [0, 0]  # body bytes received, sent
        started = time.monotonic()

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                headers = [*message.get("headers", ()), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                sizes[1] += len(message.get("body", b""))
            await send(message)

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                sizes[0] += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, receiving, counting)
        finally:
            elapsed = time.monotonic() - started
            code = str(status[0]) if status[0] else "aborted"
            self.metrics.gitproto_requests.labels(service, code).inc()
            self.metrics.gitproto_seconds.labels(service).observe(elapsed)
            access_line(scope, service, status[0], sizes, elapsed)


def access_line(
    scope: Scope, service: str, status: int, sizes: Sequence[int], elapsed_s: float
) -> None:
    """The one access line of a request; the credential never appears (it is a header).

    ``status`` 0: the response never started (the client or the server went away).
    Probes (``ops``) are DEBUG, so a scrape every few seconds does not bury the rest;
    a 5xx is WARNING.
    """
    method = str(scope.get("method", ""))
    path = str(scope.get("path", ""))[:ACCESS_PATH_CHARS_MAX]
    query = bytes(scope.get("query_string", b"")).decode("latin-1")[:ACCESS_PATH_CHARS_MAX]
    client = scope.get("client")
    agent = header(scope, b"user-agent") or ""
    upstream = header(scope, b"x-request-id") or ""  # a proxy's id: logged, never used
    level = logging.INFO
    if service == "ops":
        level = logging.DEBUG
    elif status >= 500 or status == 0:
        level = logging.WARNING
    access_log.log(
        level,
        "%s %s %s %d B in, %d B out, %.3f s", method, path + ("?" + query if query else ""),
        status or "aborted", sizes[0], sizes[1], elapsed_s,
        extra={
            "method": method,
            "path": path,
            "query": query,
            "service": service,
            "status": status,
            "bytes_in": sizes[0],
            "bytes_out": sizes[1],
            "duration_s": round(elapsed_s, 6),
            "client": f"{client[0]}:{client[1]}" if client else "-",
            "user_agent": agent[:ACCESS_AGENT_CHARS_MAX],
            **({"upstream_request_id": upstream[:ACCESS_AGENT_CHARS_MAX]} if upstream else {}),
        },
    )  # fmt: skip


class StatusEndpoints:
    def __init__(self, node_id: str, members: Sequence[str], metrics: Metrics) -> None:
        self.node_id = node_id
        self.metrics = metrics
        self.set_members(members)
        self.ready = False
        self.sections: dict[str, Callable[[], object]] = {}
        """More ``/status`` sections by name (``auth``, ``connections``), each read per call."""

    async def __call__(self, scope: Scope, send: Send, *, ops: bool = False) -> bool:
        """Answer ``scope`` when it is a status path; False when it is not one.

        ``ops``: the request came to the operator port (``listen.ops``). The Git port
        answers only the probes: an Ingress routes all of it, and ``/metrics`` and
        ``/status`` name members, token counts and load an outsider has no use for
        (docs/security.md, "Operator endpoints"); there they fall through to a 404.
        """
        path = scope["path"]
        if not ops and path in OPS_ONLY_PATHS:
            return False
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

    def set_members(self, members: Sequence[str]) -> None:
        self.members = tuple(members)
        self.metrics.compute_members.set(len(self.members))

    def status(self) -> dict[str, object]:
        return {
            "role": "gitproto",
            "node_id": self.node_id,
            "version": VERSION,
            "ready": self.ready,
            "compute_members": list(self.members),
            "auth_failures": int(
                sum(
                    s.value
                    for m in self.metrics.auth_failures.collect()
                    for s in m.samples
                    if s.name.endswith("_total")
                )
            ),
            "requests_in_flight": self.metrics.in_flight_count,
            **{name: section() for name, section in self.sections.items()},
        }


class OpsApp:
    """The operator port (``listen.ops``): ``/metrics``, ``/status`` and the probes; 404
    for anything else, so no Git or API request is ever served here."""

    def __init__(self, status: StatusEndpoints) -> None:
        self.status = status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if not await self.status(scope, send, ops=True):
            await send_bytes(send, 404, b"not found\n", "text/plain; charset=utf-8")
