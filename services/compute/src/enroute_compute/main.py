"""``python -m enroute_compute --config FILE``: wire the compute together and serve.

The only module of the service that reads the environment, the clock and the
file system configuration (services.md). Prints ``enroute compute ready:
grpc=HOST:PORT http=HOST:PORT`` once both listeners are bound; SIGTERM or
SIGINT stops it cleanly with exit status 0.

Rolling upgrades (docs/observability.md): on SIGTERM the node first drains.
/readyz turns 503, every new call is answered UNAVAILABLE (gitproto moves it
to the next compute), and the calls in flight, pushes above all, run to their
end for at most ``compute.drain_grace``; then the listeners close.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc

from enroute_compute.host import RepositoryHost
from enroute_compute.http import ComputeMetrics, OpsServer
from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.maintainer import Maintainer, MaintainerConfig
from enroute_compute.rpc.servicer import ComputeServicer
from enroute_compute.work import PeerGoneFilter
from enroute_core.base.errors import EnrouteError
from enroute_core.base.limits import Limits
from enroute_core.config import Config, load_config
from enroute_core.discovery import MemberSource, first_members, follow, member_source
from enroute_core.drain import Drain
from enroute_core.storage.heap import tune_heap
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import ObjectStore, open_store
from enroute_core.storage.pool import BufferPool, EntrySpill, NodeCaches
from enroute_proto.channels import server_options
from enroute_proto.gen.enroute.compute.v1 import compute_pb2_grpc
from enroute_proto.logs import bind_metadata, configure_logging
from enroute_proto.peer_token import server_interceptors, use_token

DEFAULT_GRPC = "127.0.0.1:7100"
DEFAULT_HTTP = "127.0.0.1:9101"


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


def split_address(text: str, default: str) -> tuple[str, int]:
    host, _, port = (text or default).rpartition(":")
    return host or "0.0.0.0", int(port)


PACK_SCAN_BYTES_MAX = 64 * 1024
"""How far into a Git body the pack header is looked for (commands or negotiation first)."""


def pack_object_count(head: bytes) -> int | None:
    """Object count of the first pack header (gitformat-pack, "pack-*.pack files") in ``head``."""
    for version in (b"\x00\x00\x00\x02", b"\x00\x00\x00\x03"):
        at = head.find(b"PACK" + version)
        if at >= 0 and len(head) >= at + 12:
            return int.from_bytes(head[at + 8 : at + 12], "big")
    return None


class _PackTap:
    """Counts the body bytes of one direction and finds the pack header among them."""

    def __init__(self, metrics: ComputeMetrics, direction: str, scan: bool) -> None:
        self.metrics = metrics
        self.direction = direction
        self.head = b"" if scan else None
        self.bytes = 0

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.bytes += len(data)
        self.metrics.pack_bytes.labels(self.direction).inc(len(data))
        if self.head is not None:
            self.head += data[: PACK_SCAN_BYTES_MAX - len(self.head)]
            count = pack_object_count(self.head)
            if count is not None:
                self.metrics.objects.labels(self.direction).inc(count)
                self.head = None
            elif len(self.head) >= PACK_SCAN_BYTES_MAX:
                self.head = None


_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

REFUSAL_READ_BYTES_MAX = 8 * 1024 * 1024
"""How far a draining compute reads a Git stream before refusing it: a stream refused
while its caller still sends ends, about one time in three, as INTERNAL ("Internal error
from Core") instead of UNAVAILABLE, and gitproto fails over on UNAVAILABLE only. Read to
its end, it is refused as UNAVAILABLE every time. 8 MiB is what gitproto can replay to
the next compute (githttp ``replay_bytes_max``); a longer body cannot fail over anyway."""


class CallGate(grpc.aio.ServerInterceptor):
    """Every call passes here: metrics of the Git calls, the drain on SIGTERM, and the
    caller's request id and user bound to the call's log lines (enroute_proto.logs)."""

    def __init__(self, metrics: ComputeMetrics) -> None:
        self.metrics = metrics
        self.drain = Drain("compute")

    @property
    def draining(self) -> bool:
        return self.drain.draining

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = str(details.method).rsplit("/", 1)[-1]
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(method, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _enter(self) -> None:
        self.drain.enter()
        self.metrics.in_flight_count += 1
        self.metrics.git_in_flight.inc()

    def _leave(self, method: str, context: Any, started: float, failed: bool) -> None:
        self.drain.leave()
        self.metrics.in_flight_count -= 1
        self.metrics.git_in_flight.dec()
        code = context.code() if hasattr(context, "code") else None
        if code is None:
            name = "UNKNOWN" if failed else "OK"
        else:
            name = getattr(code, "name", str(code))
        self.metrics.git_calls.labels(method, name).inc()
        elapsed = time.monotonic() - started
        if method == "ReceivePack":
            self.metrics.ingest_seconds.observe(elapsed)
        elif method == "UploadPack":
            self.metrics.serve_seconds.observe(elapsed)

    async def _refuse(self, context: Any) -> None:
        self.metrics.refused.inc()
        await context.abort(grpc.StatusCode.UNAVAILABLE, self.drain.refusal().message)

    async def _refuse_stream(self, requests: AsyncIterator[Any], context: Any) -> None:
        """:meth:`_refuse` once the caller has sent its stream (see REFUSAL_READ_BYTES_MAX)."""
        read = 0
        async for msg in requests:
            read += msg.ByteSize()
            if read > REFUSAL_READ_BYTES_MAX:
                break
        await self._refuse(context)

    def _streaming(self, method: str, behavior: Any) -> Any:
        async def run(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            bind_metadata(context.invocation_metadata())  # request id and user in log lines
            if self.draining:
                await self._refuse_stream(requests, context)
            inbound = _PackTap(self.metrics, "received", scan=method == "ReceivePack")
            outbound = _PackTap(self.metrics, "sent", scan=method == "UploadPack")

            async def tapped() -> AsyncIterator[Any]:
                async for msg in requests:
                    if method == "ReceivePack" and msg.WhichOneof("part") == "body":
                        inbound.feed(msg.body)
                    yield msg

            self._enter()
            started = time.monotonic()
            failed = True
            try:
                async for msg in behavior(tapped(), context):
                    if method == "UploadPack" and msg.WhichOneof("part") == "body":
                        outbound.feed(msg.body)
                    yield msg
                failed = False
            finally:
                self._leave(method, context, started, failed)

        return run

    def _unary(self, method: str, behavior: Any) -> Any:
        async def run(request: Any, context: Any) -> Any:
            bind_metadata(context.invocation_metadata())
            if self.draining:
                await self._refuse(context)
            self._enter()
            started = time.monotonic()
            failed = True
            try:
                answer = await behavior(request, context)
                failed = False
                return answer
            finally:
                self._leave(method, context, started, failed)

        return run


async def serve(config: Config) -> None:
    store = open_store(config.store.url, config.store.store_options(), env=os.environ)
    limits = config.resource_limits()  # the `limits:` section reaches every parser and cache
    layers, caches = _node_storage(config, store)
    source = member_source(tuple(config.ledger.members), config.ledger.discovery)
    ledger, discovery = await _connect_ledger(config, source, limits)
    host = RepositoryHost(
        ledger,
        layers,
        SystemClock(),
        fsck=config.receive.fsck_policy(),
        inline_max_bytes=config.layers.inline_max,
        limits=limits,
        caches=caches,
    )
    metrics = ComputeMetrics()
    gate = CallGate(metrics)
    server = grpc.aio.server(
        interceptors=[*server_interceptors(), gate],  # the token first (peer_token.py)
        options=server_options(limits.rpc_message_bytes_max),
    )
    servicer = ComputeServicer(host, pack_writers=config.compute.pack_writers)
    compute_pb2_grpc.add_ComputeServicer_to_server(servicer, server)
    grpc_host, grpc_port = split_address(config.listen.grpc, DEFAULT_GRPC)
    bound = server.add_insecure_port(f"{grpc_host}:{grpc_port}")
    await server.start()
    ready = True
    maintainer = Maintainer(
        host,
        store,
        config.node.id or f"compute@{grpc_host}:{bound}",  # the maintenance lease's holder
        SystemClock(),
        MaintainerConfig.from_layers(config.layers),
        limits=limits,
    )
    ops = OpsServer(
        host,
        config.node.id or "compute",
        lambda: ready,
        maintainer=maintainer,
        metrics=metrics,
        extra_status=lambda: {
            "draining": gate.draining,
            "ledger_members": list(ledger.members),
            "caches": caches.stats(),
        },
        discovery_stats=getattr(source, "stats", None),
    )
    http_host, http_port = await ops.start(*split_address(config.listen.http, DEFAULT_HTTP))
    stop = _stop_on_signals()  # before the ready line: a signal after it stops cleanly
    sys.stdout.write(
        f"enroute compute ready: grpc={grpc_host}:{bound} http={http_host}:{http_port}\n"
    )
    sys.stdout.flush()
    maintainer.start()
    await stop.wait()
    ready = False
    await _drain(gate, config.compute.drain_grace)
    if discovery is not None:
        discovery.cancel()
    await maintainer.stop()
    await server.stop(2)
    servicer.fetcher.close()
    await ops.stop()
    await host.close()
    await ledger.close()
    await layers.close()
    await store.close()  # its HTTP sessions: an exit without it logs "Unclosed client session"


SPILL_SHARE_OF_DISK_BUDGET = 4
"""Under ``node.disk_cache``, the rewritten-entry spill takes at most this fraction of it."""


def _node_storage(config: Config, store: ObjectStore) -> tuple[LayerService, NodeCaches]:
    """The layers on this node's disk, and its one buffer pool: pages, and the object
    and entry caches charged to it."""
    pool = BufferPool(config.node.pool_bytes)
    spill_bytes = config.resource_limits().serve_entry_spill_bytes_max
    if config.node.disk_cache is not None:
        # A node under a disk budget keeps its rewrites within a share of it: the budget
        # is what an operator sized the disk by (docs/serving.md, "Rewritten deltas").
        spill_bytes = min(spill_bytes, config.node.disk_cache // SPILL_SHARE_OF_DISK_BUDGET)
    spill = EntrySpill(os.path.join(config.node.data_dir, "rewrites"), spill_bytes)
    caches = NodeCaches(pool, config.node.cache, spill if spill_bytes else None)
    data_dir = os.path.join(config.node.data_dir, "layers")
    layers = LayerService(store, data_dir, disk_budget_bytes=config.node.disk_cache, pool=pool)
    return layers, caches


async def _connect_ledger(
    config: Config, source: MemberSource, limits: Limits
) -> tuple[GrpcLedger, asyncio.Task[None] | None]:
    """The ledger client, at the configured members or, with ``ledger.discovery``, at
    the first list, then kept current by one watch for the life of the process (the
    task returned)."""

    def connect(members: tuple[str, ...]) -> GrpcLedger:
        return GrpcLedger(
            members,
            timeout_s=config.ledger.call_timeout,
            attempt_timeout_s=config.ledger.attempt_timeout,
            message_bytes_max=limits.rpc_message_bytes_max,
        )

    if config.ledger.discovery is None:
        return connect(tuple(config.ledger.members)), None
    updates = source.updates()
    ledger = connect(await first_members(updates))
    discovery = asyncio.get_running_loop().create_task(follow(updates, ledger.set_members))
    return ledger, discovery


def _stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _drain(gate: CallGate, grace_s: float) -> None:
    """Refuse new calls and let those in flight end, for at most ``grace_s``."""
    log = logging.getLogger("enroute.compute")
    log.info("stopping: new calls refused; %d in flight may finish within %.0f s "
             "(compute.drain_grace)", gate.drain.in_flight, grace_s)  # fmt: skip
    if await gate.drain.drained(grace_s):
        log.info("drained: every call in flight ended")
    else:
        log.warning("%d calls still running after compute.drain_grace; stopping anyway",
                    gate.drain.in_flight)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enroute_compute")
    parser.add_argument("--config", help="YAML configuration file")
    args = parser.parse_args(argv)
    text = None
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            text = f.read()
    config = load_config(text, os.environ)
    configure_logging(config.log.format, config.log.level, role="compute", node=config.node.id)
    tune_heap(config.resource_limits())  # pack pieces without page faults each
    try:
        use_token(config.auth.internal_token(), "compute")
    except EnrouteError as error:
        print(f"enroute compute: {error}", file=sys.stderr)
        return 2
    logging.getLogger("grpc._cython.cygrpc").addFilter(PeerGoneFilter())
    asyncio.run(serve(config))
    return 0
