"""Real ledger processes on 127.0.0.1 for tests and benchmarks; the caller always kills them.

Ports are picked before the processes start so that every config can name all
members (``ledger.members``); voters start side by side and find each other
through Raft.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_proto import find_error_detail
from enroute_proto.channels import channel_options
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2_grpc
from enroute_testing.env import service_env
from enroute_testing.ports import free_port
from enroute_testing.ready import START_TIMEOUT_S, read_ready


@dataclass
class LedgerProc:
    config: Path
    proc: subprocess.Popen[str] | None = None
    grpc_addr: str = ""
    http_addr: str = ""
    channel: grpc.Channel | None = None
    stderr: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> LedgerProc:
        env = service_env()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "enroute_ledger", "--config", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stderr is not None
        err = self.proc.stderr
        threading.Thread(target=lambda: self.stderr.extend(err), daemon=True).start()
        return self

    def wait_ready(self) -> LedgerProc:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            fields = read_ready(
                self.proc.stdout, "ledger", START_TIMEOUT_S, lambda: "".join(self.stderr)[-3000:]
            )
        except AssertionError:
            self.kill()
            raise
        self.grpc_addr, self.http_addr = fields["grpc"], fields["http"]
        # the message bound a compute's channel has (a subscribed change can be large)
        bound = DEFAULT_LIMITS.rpc_message_bytes_max
        self.channel = grpc.insecure_channel(self.grpc_addr, options=channel_options(bound))
        # connected before the first call: the channel options bound each connection attempt
        # (min_reconnect_backoff_ms is gRPC's minimum connect timeout too) to 0.1-1 s, which a
        # process just started on a loaded machine can miss ("timed out before receiving
        # SETTINGS frame"), and a call on a channel between attempts fails UNAVAILABLE at once
        try:
            grpc.channel_ready_future(self.channel).result(timeout=START_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            self.kill()
            tail = "".join(self.stderr)[-3000:]
            raise AssertionError(f"ledger gRPC not connectable: {tail}") from None
        return self

    def start(self) -> LedgerProc:
        return self.spawn().wait_ready()

    @property
    def ledger(self) -> ledger_pb2_grpc.LedgerStub:
        assert self.channel is not None
        return ledger_pb2_grpc.LedgerStub(self.channel)

    def status(self, repo: str | None = None) -> dict[str, object]:
        """/status; with ``repo``, every group of that repository (the plain answer lists
        only the most active groups)."""
        query = "" if repo is None else "?" + urllib.parse.urlencode({"repo": repo})
        with urllib.request.urlopen(f"http://{self.http_addr}/status{query}", timeout=30) as r:
            st: dict[str, object] = json.loads(r.read())
        return st

    def stop(self) -> int:
        """SIGTERM; the process must exit cleanly."""
        assert self.proc is not None
        self._close_channel()
        self.proc.terminate()
        try:
            return self.proc.wait(10)
        finally:
            self.kill()

    def kill(self) -> None:
        self._close_channel()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def error_code(e: grpc.RpcError) -> str:
    call: Any = e  # a failed call is also a grpc.Call
    detail = find_error_detail(call.trailing_metadata())
    return detail.code if detail is not None else f"status:{call.code()}"


def write_config(
    path: Path,
    *,
    node_id: int,
    data: Path,
    store: Path,
    grpc_port: int = 0,
    members: tuple[str, ...] = (),
    ledger: dict[str, object] | None = None,
) -> Path:
    """A ledger config; ``ledger`` adds keys of the ledger section (timing, checkpoints)."""
    lines = [
        "node:",
        f'  id: "{node_id}"',
        f"  data_dir: {data}",
        "store:",
        f"  url: file://{store}",
        "listen:",
        f'  grpc: "127.0.0.1:{grpc_port}"',
        '  http: "127.0.0.1:0"',
        "ledger:",
        *(f"  {k}: {v}" for k, v in (ledger or {}).items()),
    ]
    if members:
        lines.append("  members: [" + ", ".join(f'"{m}"' for m in members) + "]")
    if lines[-1] == "ledger:":
        lines.pop()
    path.write_text("\n".join(lines) + "\n")
    return path


def start_all(nodes: list[LedgerProc], started: list[LedgerProc]) -> None:
    """Start processes side by side (each waits for its peers' ports only through Raft)."""
    for n in nodes:
        started.append(n.spawn())
    for n in nodes:
        n.wait_ready()


def start_three(
    work: Path, started: list[LedgerProc], *, ledger: dict[str, object] | None = None
) -> list[LedgerProc]:
    """Three voters under ``work``; every started process is appended to ``started``."""
    store = work / "store"
    ports = [free_port() for _ in range(3)]
    members = tuple(f"127.0.0.1:{port}" for port in ports)
    nodes = [
        LedgerProc(
            write_config(
                work / f"l{i + 1}.yaml",
                node_id=i + 1,
                data=work / f"d{i + 1}",
                store=store,
                grpc_port=ports[i],
                members=members,
                ledger=ledger,
            )
        )
        for i in range(3)
    ]
    start_all(nodes, started)
    return nodes
