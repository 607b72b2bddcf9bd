"""The ready line of an Enroute role, read and parsed in one place.

DESIGN.md "Processes": each role prints one line on stdout once it serves,
``enroute <role> ready: key=value ...`` (ledger and compute: ``grpc= http=``;
gitproto: ``http= ops=``), and ``enroute dev`` copies its roles' lines into their logs
(``data/logs/<role>.log``), one per start. ``enroute dev``'s own ``enroute ready: URL``
is read by ``enroute_testing.devserver``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import IO

ROLE_READY = re.compile(r"^enroute (\w+) ready: (.*)$", re.MULTILINE)
START_TIMEOUT_S = 120.0
"""How long a role may take to print its ready line: generous, a loaded CI machine starts
Python slowly."""


def parse_ready(line: str, role: str) -> dict[str, str]:
    """The ``key=value`` fields of ``role``'s ready line; an AssertionError quoting the line
    when it is not one."""
    match = ROLE_READY.match(line.strip())
    assert match and match.group(1) == role, f"not a ready line of {role}: {line!r}"
    return dict(part.split("=", 1) for part in match.group(2).split())


def read_ready(
    stdout: IO[str], role: str, timeout_s: float, log: Callable[[], str] = lambda: ""
) -> dict[str, str]:
    """Read the first line of a just started ``role`` process and parse it; a process that
    prints nothing within ``timeout_s`` fails with ``log()`` (its stderr tail, say), as does
    one that exits or prints something else first."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not line or not ROLE_READY.match(line[0]):
        got = repr(line[0]) if line else f"nothing within {timeout_s} s"
        raise AssertionError(f"{role} did not start: {got}\n{log()}")
    return parse_ready(line[0], role)


def ready_in_log(text: str, role: str) -> list[dict[str, str]]:
    """The fields of every ready line of ``role`` in a log, one per start, oldest first."""
    return [parse_ready(m.group(0), role) for m in ROLE_READY.finditer(text) if m.group(1) == role]


def latest_ready(text: str, role: str) -> dict[str, str]:
    """The fields of the latest ready line of ``role`` in a log; asserts there is one."""
    found = ready_in_log(text, role)
    assert found, f"no ready line of {role} in its log: {text[-2000:]}"
    return found[-1]
