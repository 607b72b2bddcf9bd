"""The compute's operator HTTP endpoints: /status, /metrics, /healthz, /readyz.

DESIGN "Observability". A small asyncio HTTP/1.1 responder (GET only, one
request per connection): these endpoints are read by probes and scrapers, so
they need no framework. Metrics come from a prometheus-client registry of this
node alone: live instruments of the Git calls (:class:`ComputeMetrics`, fed by
the gRPC interceptor in ``main.py``) and a collector that reads the host,
layer service, disk budget and maintainer counters at scrape time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict
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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from enroute_compute.host import RepositoryHost
from enroute_compute.maintainer import Maintainer
from enroute_core.protocol._common import VERSION
from enroute_proto.peer_token import admin_authorized

_REASONS = {
    200: "OK",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
ADMIN_REFUSED = b"/status?repo= needs the internal token as a bearer token (docs/security.md)\n"
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ComputeMetrics:
    """The registry of one compute; the Git-call instruments are updated as calls run."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_*: CPU, memory, open files, start time
        Info("enroute_build", "version of this process", registry=r).info(
            {"version": VERSION.decode(), "role": "compute"}
        )
        self.in_flight_count = 0
        self.git_calls = Counter(
            "enroute_compute_git_calls_total", "gRPC calls by method and status code",
            ["method", "code"], registry=r,
        )  # fmt: skip
        self.git_in_flight = Gauge(
            "enroute_compute_git_calls_in_flight", "gRPC calls being served", registry=r
        )
        self.refused = Counter(
            "enroute_compute_calls_refused_total",
            "calls answered UNAVAILABLE because the node is draining", registry=r,
        )  # fmt: skip
        self.pack_bytes = Counter(
            "enroute_engine_pack_bytes_total",
            "Git request bytes received by ReceivePack and response bytes sent by UploadPack",
            ["direction"], registry=r,
        )  # fmt: skip
        self.objects = Counter(
            "enroute_engine_objects_total",
            "objects in the packs received (pack header count) and sent",
            ["direction"], registry=r,
        )  # fmt: skip
        self.ingest_seconds = Histogram(
            "enroute_engine_ingest_seconds", "ReceivePack calls: receive, ingest, commit, report",
            buckets=SECONDS_BUCKETS, registry=r,
        )  # fmt: skip
        self.serve_seconds = Histogram(
            "enroute_engine_serve_seconds", "UploadPack calls: negotiate, plan, write the pack",
            buckets=SECONDS_BUCKETS, registry=r,
        )  # fmt: skip
        for direction in ("received", "sent"):
            self.pack_bytes.labels(direction)
            self.objects.labels(direction)


class _NodeCollector:
    """Host, layer, disk-budget and maintainer numbers, read at each scrape."""

    def __init__(self, ops: OpsServer) -> None:
        self.ops = ops

    def collect(self) -> Iterator[Metric]:
        host = self.ops.host
        g = GaugeMetricFamily(
            "enroute_compute_hosted_repositories",
            "repositories this compute follows: its open views (docs/fleet.md)",
        )
        g.add_metric([], len(host.hosted))
        yield g
        yield _gauge("enroute_compute_view_bytes",
                     "bytes of the open views as charged against limits.views_bytes_max",
                     host.view_bytes)  # fmt: skip
        for name, value, doc in (
            ("enroute_compute_pushes", host.pushes, "pushes served"),
            ("enroute_compute_fetches", host.fetches, "fetches served"),
            ("enroute_compute_view_builds", host.view_builds, "views built whole (snapshots)"),
            ("enroute_compute_view_updates", host.view_updates,
             "views updated in place by a change"),
            ("enroute_compute_refs_peeled", host.refs_peeled,
             "refs whose object a ref snapshot read to peel it"),
            ("enroute_compute_view_evictions", host.evictions,
             "views evicted (idle, or over views_open_max or views_bytes_max) with their "
             "subscriptions"),
            ("enroute_compute_view_reopens", host.reopens,
             "views opened again after an eviction (a subscribe and a state fetch each)"),
            ("enroute_engine_reference_indexes", host.reference_indexes,
             "pushes whose pack the Python indexer read: the compiled pass gave up"),
        ):  # fmt: skip
            yield _counter(name, doc, value)
        warned = CounterMetricFamily(
            "enroute_engine_fsck_warnings",
            "objects pushes brought with a harmless fsck problem, let in with a warning "
            "(docs/security.md), by git message id",
            labels=["msg_id"],
        )
        for msg_id, count in sorted(host.fsck_warnings.items()):
            warned.add_metric([msg_id], count)
        yield warned
        if self.ops.maintainer is not None:
            text = "\n".join(self.ops.maintainer.metrics_lines()) + "\n"
            yield from text_string_to_metric_families(text)
        yield from self._layers()
        if self.ops.discovery_stats is not None:
            yield from discovery_families(self.ops.discovery_stats, "ledger")

    def _layers(self) -> Iterator[Metric]:
        layers = self.ops.host.layers
        s = None if layers is None else layers.stats()
        yield _counter("enroute_layer_links", "layer copies linked from a push's spool",
                       0 if s is None else s.links)  # fmt: skip
        yield _counter("enroute_layer_hydrations", "local copies completed in the background",
                       0 if s is None else s.hydrations)  # fmt: skip
        yield _gauge("enroute_layer_hydrations_active", "hydrations running",
                     0 if s is None else s.hydrations_active)  # fmt: skip
        yield _gauge("enroute_layer_loads_in_flight", "store loads running",
                     0 if s is None else s.loads_in_flight)  # fmt: skip
        yield _gauge("enroute_layer_open", "stored layers open (metadata in memory): the "
                     "layers of open views and of reads in flight (docs/fleet.md)",
                     0 if s is None else s.layers_open)  # fmt: skip
        yield _counter("enroute_layer_closes", "stored layers closed because their views "
                       "were evicted", 0 if s is None else s.layers_closed)  # fmt: skip
        yield _counter("enroute_layer_loads", "ranged GETs issued to the object store",
                       0 if s is None else s.gets)  # fmt: skip
        yield _counter("enroute_layer_fetched_bytes", "bytes loaded from the object store",
                       0 if s is None else s.bytes_fetched)  # fmt: skip
        yield _counter("enroute_layer_chunks_fetched", "chunks loaded from the object store",
                       0 if s is None else s.chunks_fetched)  # fmt: skip
        yield _counter("enroute_layer_hash_retries", "chunks loaded again after a bad hash",
                       0 if s is None else s.hash_retries)  # fmt: skip
        d = None if s is None else s.disk_budget
        budget = GaugeMetricFamily(
            "enroute_disk_budget_bytes", "node.disk_cache; +Inf when unbounded"
        )
        budget.add_metric([], float("inf") if d is None or d.budget_bytes is None
                          else d.budget_bytes)  # fmt: skip
        yield budget
        for name, field, doc in (
            ("enroute_disk_present_bytes", "present_bytes", "bytes of local copies on disk"),
            ("enroute_disk_pinned_bytes", "pinned_bytes", "bytes pinned by loads and readers"),
            ("enroute_disk_linked_bytes", "linked_bytes", "bytes of copies linked from spools"),
            ("enroute_disk_over_budget_bytes", "over_budget_bytes", "present bytes past budget"),
            ("enroute_disk_files", "files", "local copies tracked by the budget"),
        ):
            yield _gauge(name, doc, 0 if d is None else getattr(d, field))
        yield _counter("enroute_disk_evictions", "chunks evicted from local copies",
                       0 if d is None else d.evictions)  # fmt: skip
        yield _counter("enroute_disk_punched_bytes", "bytes released by punching holes",
                       0 if d is None else d.punched_bytes)  # fmt: skip
        yield from _read_families(self.ops.host, s)
        yield from _pool_families(getattr(layers, "pool", None))


def _read_families(host: Any, s: Any) -> Iterator[Metric]:
    """Seed 004, "Machines" and "Disk budget": what reads loaded, by request kind, the
    tickets they parked, evictions by intent and the time to the first pack byte."""
    chunks = CounterMetricFamily(
        "enroute_read_loaded_chunks", "chunks reads loaded, by request kind", labels=["kind"]
    )
    size = CounterMetricFamily(
        "enroute_read_loaded_bytes", "bytes reads loaded, by request kind", labels=["kind"]
    )
    for kind, n in sorted(((s and s.loaded_chunks) or {}).items()):
        chunks.add_metric([kind], n)
    for kind, n in sorted(((s and s.loaded_bytes) or {}).items()):
        size.add_metric([kind], n)
    tickets = CounterMetricFamily(
        "enroute_read_tickets_parked", "reads parked until their loads were done",
        labels=["kind"],
    )  # fmt: skip
    for kind, n in sorted(host.load_rounds.items()):
        tickets.add_metric([kind], n)
    evictions = CounterMetricFamily(
        "enroute_disk_evictions_by_intent", "chunks evicted, by the intent that read them",
        labels=["intent"],
    )  # fmt: skip
    d = None if s is None else s.disk_budget
    evictions.add_metric(["point"], 0 if d is None else d.evictions_point)
    evictions.add_metric(["scan"], 0 if d is None else d.evictions_scan)
    yield from (chunks, size, tickets, evictions)
    reads = host.read_stats()["first_pack_byte_s"]
    yield _gauge("enroute_first_pack_byte_seconds_p50",
                 "median time to the first pack byte, latest fetches",
                 reads["p50"] or 0)  # fmt: skip


def discovery_families(stats: Any, target: str) -> Iterator[Metric]:
    """Counters of an EndpointSliceSource (lists, watches, events, 410s, errors, updates)."""
    for name in type(stats).__dataclass_fields__:
        c = CounterMetricFamily(
            f"enroute_discovery_{name}", f"member discovery: {name}", labels=["target"]
        )
        c.add_metric([target], getattr(stats, name))
        yield c


def _pool_families(pool: Any) -> Iterator[Metric]:
    """The buffer pool of seed 004 "Pages and memory", when this node has one wired in."""
    st = None if pool is None else pool.stats()
    hits = CounterMetricFamily("enroute_pool_hits", "page reads answered from memory")
    misses = CounterMetricFamily("enroute_pool_misses", "page reads that loaded the page")
    evictions = CounterMetricFamily("enroute_pool_evictions", "pages evicted by CLOCK")
    used = GaugeMetricFamily("enroute_pool_used_bytes", "bytes charged to the page budget")
    budget = GaugeMetricFamily("enroute_pool_budget_bytes", "node.page_cache + node.cache")
    if st is not None:
        hits.add_metric([], st.hits)
        misses.add_metric([], st.misses)
        evictions.add_metric([], st.evictions)
        used.add_metric([], st.used_bytes)
        budget.add_metric([], st.budget_bytes)
    yield from (hits, misses, evictions, used, budget)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc)
    c.add_metric([], value)
    return c


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


class OpsServer:
    """Serves the four endpoints for one compute node."""

    def __init__(
        self,
        host: RepositoryHost,
        node_id: str,
        ready: Callable[[], bool],
        *,
        maintainer: Maintainer | None = None,
        metrics: ComputeMetrics | None = None,
        extra_status: Callable[[], dict[str, Any]] | None = None,
        discovery_stats: Any = None,
    ) -> None:
        self.host = host
        self.maintainer = maintainer
        self.node_id = node_id
        self.ready = ready
        self.extra_status = extra_status
        self.discovery_stats = discovery_stats
        self.metrics = metrics if metrics is not None else ComputeMetrics()
        self.metrics.registry.register(_NodeCollector(self))
        self._server: asyncio.Server | None = None

    def status(self) -> dict[str, Any]:
        layers = self.host.layers
        stats: dict[str, Any] | None = None
        if layers is not None:
            s = layers.stats()
            stats = asdict(s)
        maintenance = None if self.maintainer is None else self.maintainer.status()
        pool = getattr(layers, "pool", None)
        out = {
            "maintenance": maintenance,
            "role": "compute",
            "node_id": self.node_id,
            "version": VERSION.decode(),
            "ready": self.ready(),
            "hosted_repositories": len(self.host.hosted),
            "layers": stats,
            "pool": None if pool is None else pool.stats().as_dict(),
            "pushes": self.host.pushes,
            "fetches": self.host.fetches,
            "view_builds": self.host.view_builds,
            "view_updates": self.host.view_updates,
            "refs_peeled": self.host.refs_peeled,
            "views": {
                "open": len(self.host.hosted),
                "bytes": self.host.view_bytes,
                "evictions": self.host.evictions,
                "reopens": self.host.reopens,
                "memory_released_bytes": self.host.memory_released_bytes,
            },
            "git_calls_in_flight": self.metrics.in_flight_count,
            "reads": self.host.read_stats(),
        }
        if self.extra_status is not None:
            out.update(self.extra_status())
        return out

    def repo_status(self, name: str) -> dict[str, Any]:
        """``/status?repo=<name>``: one repository as this compute sees it (issue 19: no
        metric carries a repository name, and /status lists none)."""
        snap = self.host.peek(name)
        out: dict[str, Any] = {"role": "compute", "node_id": self.node_id, "repo": name}
        out["hosted"] = snap is not None
        if snap is not None:
            st = snap.state
            out.update(incarnation=st.incarnation, version=st.version, layers=len(st.manifest))
        if self.maintainer is not None:
            out["lease_holder"] = self.maintainer.lease_holders().get(name)
        return out

    def metrics_text(self) -> bytes:
        return generate_latest(self.metrics.registry)

    def route(
        self, method: str, path: str, authorization: str | None = None
    ) -> tuple[int, str, bytes]:
        if method != "GET":
            return 405, "text/plain", b"method not allowed\n"
        path, _, query = path.partition("?")
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            if self.ready():
                return 200, "text/plain", b"ready\n"
            return 503, "text/plain", b"not ready\n"
        if path == "/status":
            repo = parse_qs(query).get("repo")
            if repo and not admin_authorized(authorization):  # docs/security.md
                return 401, "text/plain", ADMIN_REFUSED
            body = self.status() if not repo else self.repo_status(repo[0])
            return 200, "application/json", json.dumps(body, indent=1).encode()
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics_text()
        return 404, "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            authorization = None
            while (header := await asyncio.wait_for(reader.readline(), 10)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "authorization":
                    authorization = value.strip()
            parts = line.decode("latin-1").split()
            if len(parts) < 2:
                return
            status, ctype, body = self.route(parts[0], parts[1], authorization)
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
