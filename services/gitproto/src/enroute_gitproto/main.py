"""Process entry: ``python -m enroute_gitproto --config FILE`` (the only reader of os.environ).

Prints ``enroute gitproto ready: http=HOST:PORT ops=HOST:PORT`` with the bound
ports once it serves (Git and the probes on ``http``; ``/metrics`` and ``/status`` on
``ops``, docs/security.md, "Operator endpoints"); SIGTERM or SIGINT stops it cleanly
with exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Callable

import uvicorn

from enroute_core.asgi_server import QuietServer
from enroute_core.base.errors import EnrouteError, InvalidArgument
from enroute_core.config import Config, load_config
from enroute_core.discovery import MemberSource, follow, member_source
from enroute_core.storage.heap import tune_heap
from enroute_gitproto.app import GitprotoApp, TransportLimits
from enroute_gitproto.connections import guarded_protocol
from enroute_gitproto.githttp import GitHttpLimits
from enroute_gitproto.observe import DiscoveryCollector, OpsApp, RequestMetrics
from enroute_proto.logs import configure_logging
from enroute_proto.peer_token import use_token

DEFAULT_HTTP = ":8080"
DEFAULT_OPS = ":9090"

log = logging.getLogger(__name__)


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(f"listen address {value!r} is not HOST:PORT", key="listen")
    return host.strip("[]") or "0.0.0.0", int(port)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(
        family, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )  # asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(
    app: GitprotoApp,
    sock: socket.socket,
    on_ready: Callable[[str], None],
    stop: asyncio.Event | None = None,
    *,
    members: MemberSource | None = None,
    shutdown_grace_s: float = 25.0,
    ops_sock: socket.socket | None = None,
) -> None:
    """Serve ``app`` on ``sock`` until SIGTERM/SIGINT (or ``stop`` when given).

    ``ops_sock``, when given, serves the operator endpoints (:class:`OpsApp`) until
    the Git port has stopped, so a scrape still sees the drain.
    ``members``, when given, keeps the compute set of ``app`` current (discovery).
    The drain (docs/observability.md, "Rolling upgrades"): on the signal ``/readyz`` turns 503 and
    the listening socket closes, so no new request starts here; requests in flight
    run on for up to ``shutdown_grace_s`` (``transport.shutdown_grace``), each on a
    connection that closes after its response; then the rest are cut.
    """
    discovery = None
    if members is not None:
        stats = getattr(members, "stats", None)
        if stats is not None:
            app.metrics.registry.register(DiscoveryCollector(stats, "compute"))
        discovery = asyncio.create_task(follow(members.updates(), lambda m: use_members(app, m)))
    config = uvicorn.Config(
        RequestMetrics(app, app.metrics),
        lifespan="on",
        log_level="warning",
        log_config=None,  # uvicorn's lines go through ours (configure_logging), as JSON
        access_log=False,  # RequestMetrics writes the access lines
        timeout_graceful_shutdown=math.ceil(shutdown_grace_s),  # whole seconds in uvicorn
        http=guarded_protocol(app.connections),  # connection bounds: connections.py
        ws="none",  # no WebSocket upgrade: it would hand the socket to a protocol not counted
    )
    server = QuietServer(config)
    ops = None
    if ops_sock is not None:
        ops_config = uvicorn.Config(
            RequestMetrics(OpsApp(app.status), app.metrics),
            lifespan="off",
            log_level="warning",
            log_config=None,
            access_log=False,
            ws="none",
        )
        ops = QuietServer(ops_config)
        ops_task = asyncio.create_task(ops.serve(sockets=[ops_sock]))
    loop = asyncio.get_running_loop()

    def drain() -> None:
        log.info("stopping: no new requests; %d in flight may finish within %g s "
                 "(transport.shutdown_grace)", app.metrics.in_flight_count,
                 shutdown_grace_s)  # fmt: skip
        app.status.ready = False
        server.should_exit = True

    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, drain)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    while ops is not None and not ops.started and not ops_task.done():
        await asyncio.sleep(0.01)
    if server.started:
        on_ready(address(sock) + ("" if ops_sock is None else f" ops={address(ops_sock)}"))
    if stop is not None:
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        waiter.cancel()
    await task
    if ops is not None:
        ops.should_exit = True
        await ops_task
    if discovery is not None:
        discovery.cancel()


def use_members(app: GitprotoApp, members: tuple[str, ...]) -> None:
    """Route over a new compute set; rendezvous hashing moves only the names that must move."""
    app.pool.set_members(members)
    app.status.set_members(app.pool.members)


def transport_limits(config: Config) -> tuple[GitHttpLimits, TransportLimits]:
    """The ``transport`` section as the bounds of the Git relay and of every request."""
    t = config.transport
    git = GitHttpLimits(
        body_bytes_max=t.git_body_max,
        gzip_ratio_max=t.gzip_ratio_max,
        gzip_slack_bytes=t.gzip_slack,
        negotiation_pkt_lines_max=t.negotiation_pkt_lines_max,
    )
    every = TransportLimits(
        requests_max=t.requests_max,
        repo_requests_max=t.repo_requests_max,
        retry_after_s=t.retry_after,
        request_timeout_s=t.request_timeout,
        body_idle_timeout_s=t.body_idle_timeout,
        api_body_bytes_max=t.api_body_max,
        connections_max=t.connections_max,
        rpc_message_bytes_max=config.resource_limits().rpc_message_bytes_max,
        client_connections_max=t.client_connections_max,
        client_requests_max=t.client_requests_max,
        header_timeout_s=t.header_timeout,
        header_bytes_max=t.header_max,
    )
    return git, every


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enroute_gitproto")
    parser.add_argument("--config", help="YAML configuration file")
    args = parser.parse_args(argv)
    try:
        text = None
        if args.config:
            with open(args.config, encoding="utf-8") as f:
                text = f.read()
        config = load_config(text, os.environ)
        configure_logging(config.log.format, config.log.level, role="gitproto",
                          node=config.node.id)  # fmt: skip
        tune_heap(config.resource_limits())  # pack pieces without page faults each
        use_token(config.auth.internal_token(), "gitproto")  # on every call to a compute
        host, port = parse_listen(config.listen.http or DEFAULT_HTTP)
        git_limits, transport = transport_limits(config)
        app = GitprotoApp(
            config.compute.members,
            anonymous=config.auth.anonymous,
            tokens_file=config.auth.tokens_file,
            node_id=config.node.id,
            limits=git_limits,
            transport=transport,
            failover_wait_s=config.compute.failover_wait,
        )
        sock = bind(host, port)
        ops_sock = bind(*parse_listen(config.listen.ops or DEFAULT_OPS))
    except (EnrouteError, OSError) as error:
        print(f"enroute gitproto: {error}", file=sys.stderr)
        return 2

    def ready(where: str) -> None:
        print(f"enroute gitproto ready: http={where}", flush=True)

    source = None
    if config.compute.discovery is not None:
        source = member_source((), config.compute.discovery)
    grace_s = config.transport.shutdown_grace
    asyncio.run(
        serve(app, sock, ready, members=source, shutdown_grace_s=grace_s, ops_sock=ops_sock)
    )
    return 0
