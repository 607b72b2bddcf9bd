"""Real ledger processes on 127.0.0.1 for service tests; always killed in teardown."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_proto import find_error_detail
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2_grpc

READY_PREFIX = "enroute ledger ready: "
START_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LedgerProc:
    config: Path
    proc: subprocess.Popen[str] | None = None
    grpc_addr: str = ""
    http_addr: str = ""
    channel: grpc.Channel | None = None
    stderr: list[str] = field(default_factory=list)

    def spawn(self) -> LedgerProc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENROUTE_")}
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
        line: list[str] = []
        out = self.proc.stdout
        t = threading.Thread(target=lambda: line.append(out.readline()), daemon=True)
        t.start()
        t.join(START_TIMEOUT_S)
        if not line or not line[0].startswith(READY_PREFIX):
            self.kill()
            raise AssertionError(f"ledger did not start: {line} {''.join(self.stderr)[-3000:]}")
        parts = dict(p.split("=", 1) for p in line[0][len(READY_PREFIX) :].split())
        self.grpc_addr, self.http_addr = parts["grpc"], parts["http"]
        self.channel = grpc.insecure_channel(self.grpc_addr)
        return self

    def start(self) -> LedgerProc:
        return self.spawn().wait_ready()

    @property
    def ledger(self) -> ledger_pb2_grpc.LedgerStub:
        assert self.channel is not None
        return ledger_pb2_grpc.LedgerStub(self.channel)

    def stop(self) -> int:
        """SIGTERM; the process must exit cleanly."""
        assert self.proc is not None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.proc.terminate()
        try:
            return self.proc.wait(10)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


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
    checkpoint_entries: int = 10_000,
) -> Path:
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
        "  tick_interval: 20ms",
        "  election_ticks: 10",
        f"  checkpoint_entries: {checkpoint_entries}",
    ]
    if members:
        lines.append("  members: [" + ", ".join(f'"{m}"' for m in members) + "]")
    path.write_text("\n".join(lines) + "\n")
    return path


def start_all(nodes: list[LedgerProc], started: list[LedgerProc]) -> None:
    """Start processes side by side (each waits for its peers' ports only through Raft)."""
    for n in nodes:
        started.append(n.spawn())
    for n in nodes:
        n.wait_ready()


@pytest.fixture
def procs() -> Iterator[list[LedgerProc]]:
    started: list[LedgerProc] = []
    yield started
    for p in started:
        p.kill()


def wait_for(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")
