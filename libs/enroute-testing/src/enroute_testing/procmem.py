"""The memory of a role of a running `enroute dev`, as Linux reports it (proc(5), status).

``VmHWM`` is the process's peak resident set since it started: a test that reads it
before and after a request sees the most the request ever held, not a sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MiB = 1024 * 1024
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Memory:
    rss_bytes: int
    """Resident now (``VmRSS``)."""
    peak_bytes: int
    """Peak resident since the process started (``VmHWM``)."""
    anon_bytes: int
    """Resident anonymous memory now (``RssAnon``): the process's own, without the
    pages of the interpreter's and libraries' files, which are shared with other
    processes and come and go with the page cache."""


def role_pid(dev_pid: int, role: str) -> int:
    """The process id of ``role`` (``compute``, ``gitproto``, ``ledger``), a child of the
    `enroute dev` process ``dev_pid``, started as ``python -m enroute_<role>``."""
    module = f"enroute_{role}".encode()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == dev_pid and module in argv:
            return int(entry.name)
    raise LookupError(f"no {role} process under {dev_pid}")


def memory(pid: int) -> Memory:
    status = (_PROC / str(pid) / "status").read_text()

    def kib(key: str) -> int:
        found = re.search(rf"^{key}:\s+(\d+) kB$", status, re.MULTILINE)
        assert found is not None, f"{key} not in /proc/{pid}/status"
        return int(found.group(1)) * 1024

    return Memory(kib("VmRSS"), kib("VmHWM"), kib("RssAnon"))
