"""Ports for processes the tests start, chosen before those processes bind them.

A port found free by binding to port 0 comes from the kernel's ephemeral
range, and stays free only until the kernel hands it out again: to any
outgoing connection's source port or any other ``bind(0)`` on the machine.
Between the choice and the bind of a starting process (seconds on a loaded
machine) another test's connection could take it, and the process failed
with "Address already in use". These ports come from below the ephemeral
range, which the kernel never hands out on its own; a port is offered only
if it binds now.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_LOW = 10_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 200
_rng = random.SystemRandom()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default range starts here


def free_port(host: str = "127.0.0.1") -> int:
    """A port that binds on ``host`` now and lies below the kernel's ephemeral range."""
    high = _ephemeral_start()
    if high - _LOW >= 1_000:
        for _ in range(_TRIES):
            port = _rng.randrange(_LOW, high)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the range: a kernel-chosen port
        s.bind((host, 0))
        return int(s.getsockname()[1])
