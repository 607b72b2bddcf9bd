"""Ports for processes the tests start, chosen before those processes bind them.

A port found free by binding to port 0 comes from the kernel's ephemeral
range, and stays free only until the kernel hands it out again: to any
outgoing connection's source port or any other ``bind(0)`` on the machine.
Between the choice and the bind of a starting process (seconds on a loaded
machine) another test's connection could take it, and the process failed
with "Address already in use". These ports come from below the ephemeral
range, which the kernel never hands out on its own; a port is offered only
if it binds now.

A port that binds now is still only free until whoever asked binds it. Two
choices made before either bind could name the same port: a cluster picks a
dozen ports in a row before it starts anything (about a 1% chance of a
repeat per cluster over 22,000 ports), and the suite's workers choose at the
same time. So a port is handed out once per process, and once per machine
while its process lives: each choice takes a one-byte lock at the port's
offset in a shared file. POSIX record locks belong to the process and go
when it exits, so a crashed worker leaks nothing.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

__all__ = ["free_port"]

_LOW = 10_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOCK_FILE = Path(tempfile.gettempdir()) / f"enroute-test-ports-{os.getuid()}.lock"
_TRIES = 200
_rng = random.SystemRandom()
_given: set[int] = set()
_lock_fd: int | None = None


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default range starts here


def _claim(port: int) -> bool:
    """Whether no other live process has taken ``port``; takes it for this one."""
    global _lock_fd
    if _lock_fd is None:
        _lock_fd = os.open(_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(_lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
    except OSError:
        return False
    return True


def _binds(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port below the kernel's ephemeral range that binds on ``host`` now.

    No other call, in this process or in any other live one, is given it.
    """
    high = _ephemeral_start()
    if high - _LOW >= 1_000:
        for _ in range(_TRIES):
            port = _rng.randrange(_LOW, high)
            if port in _given or not _binds(host, port) or not _claim(port):
                continue
            _given.add(port)
            return port
    with socket.socket() as s:  # no room below the range: a kernel-chosen port
        s.bind((host, 0))
        return int(s.getsockname()[1])
