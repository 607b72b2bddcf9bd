"""Three real ledger voters on 127.0.0.1 for the ledger benchmark; always killed at the end.

Ports are picked before the processes start so that every config can name all
members (``ledger.members``); the processes start side by side and find each
other through Raft.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

READY_PREFIX = "enroute ledger ready: "
START_TIMEOUT_S = 30.0


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
    stderr: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

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
            raise RuntimeError(f"ledger did not start: {line} {''.join(self.stderr)[-3000:]}")
        parts = dict(p.split("=", 1) for p in line[0][len(READY_PREFIX) :].split())
        self.grpc_addr, self.http_addr = parts["grpc"], parts["http"]
        return self

    def status(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://{self.http_addr}/status", timeout=30) as r:
            st: dict[str, object] = json.loads(r.read())
        return st

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def write_config(
    path: Path, *, node_id: int, data: Path, store: Path, grpc_port: int, members: tuple[str, ...]
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
        "  members: [" + ", ".join(f'"{m}"' for m in members) + "]",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_three(work: Path, started: list[LedgerProc]) -> list[LedgerProc]:
    """Start three voters under ``work``; every started process is appended to ``started``."""
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
            )
        )
        for i in range(3)
    ]
    for n in nodes:
        started.append(n.spawn())
    for n in nodes:
        n.wait_ready()
    return nodes
