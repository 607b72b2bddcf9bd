"""``python -m enroute_compute --config FILE``: wire the compute together and serve.

The only module of the service that reads the environment, the clock and the
file system configuration (services.md). Prints ``enroute compute ready:
grpc=HOST:PORT http=HOST:PORT`` once both listeners are bound; SIGTERM or
SIGINT stops it cleanly with exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time

import grpc

from enroute_compute.host import RepositoryHost
from enroute_compute.http import OpsServer
from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.maintainer import Maintainer, MaintainerConfig
from enroute_compute.rpc.servicer import ComputeServicer
from enroute_core.config import Config, load_config
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore import open_store
from enroute_proto.gen.enroute.compute.v1 import compute_pb2_grpc

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


async def serve(config: Config) -> None:
    store = open_store(config.store.url, config.store.store_options(), env=os.environ)
    data_dir = os.path.join(config.node.data_dir, "layers")
    layers = LayerService(store, data_dir, disk_budget_bytes=config.node.disk_cache)
    ledger = GrpcLedger(tuple(config.ledger.members))
    host = RepositoryHost(ledger, layers, SystemClock(), inline_max_bytes=config.layers.inline_max)
    server = grpc.aio.server()
    compute_pb2_grpc.add_ComputeServicer_to_server(ComputeServicer(host), server)
    grpc_host, grpc_port = split_address(config.listen.grpc, DEFAULT_GRPC)
    bound = server.add_insecure_port(f"{grpc_host}:{grpc_port}")
    await server.start()
    ready = True
    holder = config.node.id or f"compute@{grpc_host}:{bound}"
    maintainer = Maintainer(
        host, store, holder, SystemClock(), MaintainerConfig.from_layers(config.layers)
    )
    ops = OpsServer(host, config.node.id or "compute", lambda: ready, maintainer=maintainer)
    http_host, http_port = await ops.start(*split_address(config.listen.http, DEFAULT_HTTP))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(
        f"enroute compute ready: grpc={grpc_host}:{bound} http={http_host}:{http_port}\n"
    )
    sys.stdout.flush()
    maintainer.start()
    await stop.wait()
    ready = False
    await maintainer.stop()
    await server.stop(2)
    await ops.stop()
    await host.close()
    await ledger.close()
    await layers.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enroute_compute")
    parser.add_argument("--config", help="YAML configuration file")
    args = parser.parse_args(argv)
    text = None
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            text = f.read()
    config = load_config(text, os.environ)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(serve(config))
    return 0
