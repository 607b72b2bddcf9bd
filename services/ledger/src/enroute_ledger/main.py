"""Process entry of a ledger node: config, wiring, ready line, clean stop on SIGTERM/SIGINT.

The only module that reads the environment, the clock and randomness
(services.md); everything below gets them passed in.

SIGTERM drains the voter (docs/reliability.md, "Graceful drain"): /readyz turns
503, new proposals and reads of computes are refused with UNAVAILABLE (their
client asks the next member under the same request id), the groups it leads
are handed to other voters, and the proposals it took run to their end, all
within ``ledger.drain_grace``; Raft traffic flows until the listener closes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import uvicorn

from enroute_core.asgi_server import QuietServer
from enroute_core.base.errors import EnrouteError, InvalidArgument
from enroute_core.base.ids import NodeId
from enroute_core.config import Config, load_config
from enroute_core.drain import Drain
from enroute_core.storage.heap import malloc_trim
from enroute_core.storage.objectstore import ObjectStore, open_store
from enroute_proto.channels import server_options
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2_grpc
from enroute_proto.logs import ContextInterceptor, configure_logging
from enroute_proto.peer_token import server_interceptors, use_token

from .checkpoints import Checkpointer
from .heaptrim import HeapTrimmer
from .http import TRANSFER_TIMEOUT_S, StatusApp, transfer_leadership
from .identity import establish
from .lifecycle import Lifecycle
from .logstore import open_log_store
from .membership import MembershipDriver, Record, founding_record, load_or_found, resolve
from .rpc.servicer import LedgerServicer, RaftTransportServicer
from .runtime import Runtime, RuntimeConfig
from .storage import LogStore
from .transport import GrpcTransport

log = logging.getLogger("enroute.ledger")


def split_hostport(value: str, default: str) -> tuple[str, int]:
    value = value or default
    host, _, port = value.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise InvalidArgument(f"not HOST:PORT: {value!r}", value=value) from None


def membership(
    config: Config,
    grpc_addr: str,
    record: Record | None = None,
    stored: NodeId | None = None,
) -> tuple[NodeId, dict[NodeId, str]]:
    """This node's Raft id and its peers' addresses (docs/raft.md, "Membership changes").

    ``grpc_addr``: ``listen.grpc``; the other voters reach this one at
    ``ledger.advertise``, else there. ``record``: the ledger's membership record (None:
    the one ``ledger.members`` founds, member i is id i + 1); ``stored``: the id the data
    directory holds (a blank one takes the id the record gives its address:
    ``membership.resolve``). Refuses a member list the record denies. Empty members (or
    only this node) make a single voter, id 1.
    """
    members = list(config.ledger.members)
    rec = record if record is not None else founding_record(members)
    address = config.ledger.advertise or grpc_addr
    me, peers = resolve(rec, members, config.node.id, address, stored)
    if len(rec.view) % 2 == 0:
        log.warning(
            "the ledger has %d voters: a majority of an even count tolerates no more "
            "failures than one voter fewer, and with 2 a voter that loses its disk cannot be "
            "readmitted (docs/raft.md, 'A voter that lost its disk'); use 3 or 5",
            len(rec.view),
        )
    return me, peers


@dataclass
class _Node:
    """What ``serve`` wires together and stops in order."""

    rt: Runtime
    transport: GrpcTransport
    members: MembershipDriver
    lc: Lifecycle
    tasks: list[asyncio.Task[object]] = field(default_factory=list)


async def _open_node(config: Config, logstore: LogStore, objstore: ObjectStore) -> _Node:
    """The runtime over this node's log store, its transport, membership and lifecycle."""
    data = Path(config.node.data_dir)
    limits = config.resource_limits()
    record = await load_or_found(objstore, list(config.ledger.members))
    node_id, peers = membership(config, config.listen.grpc, record, logstore.node_identity())
    life = await establish(
        data,
        logstore,
        objstore,
        node_id,
        voters=len(peers) + 1,
        new_id=int.from_bytes(os.urandom(8), "big") or 1,
    )
    rt = Runtime(
        RuntimeConfig(
            node_id=node_id,
            peers=tuple(sorted(peers)),
            tick_interval_s=config.ledger.tick_interval,
            election_ticks=config.ledger.election_ticks,
            heartbeat_ticks=config.ledger.heartbeat_ticks,
            hibernate_after_s=config.ledger.hibernate_after,
            dedup_window_entries=limits.ledger_dedup_window_entries,
        ),
        logstore,
        clock=time.monotonic,
        nonce=os.urandom(8),
        seed=int.from_bytes(os.urandom(8), "big"),
        blank_id=life.blank_id,
        blank_repos=life.blank_repos,
    )
    transport = GrpcTransport(
        rt.mr, peers, wake=rt.wake, message_bytes_max=limits.rpc_message_bytes_max
    )
    rt.transport = transport
    members = MembershipDriver(
        rt,
        objstore,
        record,
        set_peers=transport.set_peers,
        addresses=peers,
        clock=time.monotonic,
        wall_clock_us=lambda: time.time_ns() // 1000,
    )
    lc = Lifecycle(
        rt,
        objstore,
        upload_window=config.layers.upload_window,
        wall_clock_us=lambda: time.time_ns() // 1000,
    )
    return _Node(rt, transport, members, lc)


async def _recover(node: _Node) -> None:
    """Rebuild every stored group, start the loop, and replay each to its commit index."""
    rt = node.rt
    groups = rt.recover()
    node.tasks.append(asyncio.get_running_loop().create_task(rt.run()))
    if not rt.config.peers:
        rt.campaign_all(groups)
    for g in groups:
        commit = int(g.mem.hard_state.commit)
        try:
            await rt.wait_applied(g, commit, 30.0)
        except EnrouteError as e:
            log.warning("group %s/%s not replayed: %s", g.repo, g.incarnation, e)


async def _start_grpc(config: Config, node: _Node, gate: Drain) -> tuple[grpc.aio.Server, int]:
    limits = config.resource_limits()
    ghost, gport = split_hostport(config.listen.grpc, "127.0.0.1:7000")
    server = grpc.aio.server(
        interceptors=[*server_interceptors(), ContextInterceptor()],  # token first: peer_token.py
        options=server_options(limits.rpc_message_bytes_max),
    )
    ledger_pb2_grpc.add_LedgerServicer_to_server(
        LedgerServicer(
            node.lc, stream_proposals_max=limits.ledger_stream_proposals_max, drain=gate
        ),
        server,
    )
    ledger_pb2_grpc.add_RaftTransportServicer_to_server(RaftTransportServicer(node.rt), server)
    bound = server.add_insecure_port(f"{ghost}:{gport}")
    if bound == 0:
        raise InvalidArgument("cannot bind listen.grpc", value=f"{ghost}:{gport}")
    await server.start()
    return server, bound


async def _start_http(
    config: Config, app: StatusApp
) -> tuple[QuietServer, asyncio.Task[None], int] | None:
    """The status server on listen.http; None when it stopped before it started."""
    hhost, hport = split_hostport(config.listen.http, "127.0.0.1:9100")
    sock = socket.socket(socket.AF_INET6 if ":" in hhost else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((hhost, hport))
    hport = sock.getsockname()[1]
    http = QuietServer(
        uvicorn.Config(app, log_level="warning", log_config=None, lifespan="off", access_log=False)
    )
    http_task = asyncio.get_running_loop().create_task(http.serve(sockets=[sock]))
    while not http.started:
        if http_task.done():
            await http_task
            return None
        await asyncio.sleep(0.01)
    return http, http_task, hport


async def serve(config: Config) -> int:
    data = Path(config.node.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    limits = config.resource_limits()  # the `limits:` section of the configuration
    logstore = open_log_store(data / "log", clock=time.monotonic, limits=limits)
    objstore = open_store(config.store.url, config.store.store_options(), env=os.environ)
    node = await _open_node(config, logstore, objstore)
    rt, loop = node.rt, asyncio.get_running_loop()
    await _recover(node)
    gate = Drain("ledger")
    server, bound = await _start_grpc(config, node, gate)
    node.transport.start()
    node.tasks.append(loop.create_task(node.members.run()))
    await node.lc.startup()
    cp = Checkpointer(
        node.lc,
        every_entries=config.ledger.checkpoint_entries,
        interval_s=config.ledger.checkpoint_interval,
        clock=time.monotonic,
    )
    node.tasks.append(loop.create_task(cp.run()))
    trimmer = HeapTrimmer(rt.mr, after_groups=config.ledger.trim_heap_after, trim=malloc_trim())
    node.tasks.append(loop.create_task(trimmer.run()))
    app = StatusApp(rt, node.members)
    started = await _start_http(config, app)
    if started is None:
        return 1
    http, http_task, hport = started
    node.tasks.append(http_task)
    app.ready = True
    ghost = split_hostport(config.listen.grpc, "127.0.0.1:7000")[0]
    hhost = split_hostport(config.listen.http, "127.0.0.1:9100")[0]
    print(f"enroute ledger ready: grpc={ghost}:{bound} http={hhost}:{hport}", flush=True)

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    app.ready = False
    await drain(rt, gate, config.ledger.drain_grace)
    await server.stop(grace=1.0)
    http.should_exit = True
    await node.transport.close()
    cp.stop()
    trimmer.stop()
    node.members.stop()
    rt.stop()
    await asyncio.wait(node.tasks, timeout=5.0)
    logstore.close()
    await objstore.close()
    return 0


async def drain(rt: Runtime, gate: Drain, grace_s: float) -> None:
    """Stop taking proposals, lead nothing, let the taken ones end; at most ``grace_s``.

    The hand-over repeats the preStop hook's (a no-op when that ran): a process
    stopped without the hook (``enroute cluster``, a plain SIGTERM) still spares
    its groups an election timeout. A proposal taken before it is forwarded to
    the new leader and answered here.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    gate.start()
    log.info("stopping: new proposals refused; %d in flight; handing over leadership "
             "(ledger.drain_grace %.0f s)", gate.in_flight, grace_s)  # fmt: skip
    moved = await transfer_leadership(rt, min(TRANSFER_TIMEOUT_S, grace_s))
    if await gate.drained(deadline - loop.time()):
        log.info("drained: %s", " ".join(f"{k}={v}" for k, v in moved.items()))
    else:
        log.warning("%d proposals still open after ledger.drain_grace; stopping anyway "
                    "(their callers retry elsewhere)", gate.in_flight)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enroute_ledger")
    parser.add_argument("--config", help="YAML configuration file")
    args = parser.parse_args(argv)
    try:
        text = Path(args.config).read_text() if args.config else None
        config = load_config(text, os.environ)
        configure_logging(config.log.format, config.log.level, role="ledger", node=config.node.id)
        use_token(config.auth.internal_token(), "ledger")
        return asyncio.run(serve(config))
    except EnrouteError as e:
        print(f"enroute ledger: {e.code}: {e.message} {e.details or ''}", file=sys.stderr)
        return 2
