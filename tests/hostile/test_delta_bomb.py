"""A delta bomb is refused before it is applied (issue 24, finding 2).

A 15 KiB pack (a 15 MiB blob of zeros and one OFS_DELTA of 64 copies of it) declares
a 1 GiB object. Applying it took the compute from 66 MiB to 1.1 GiB resident (three at
once: 3.1 GiB). The indexer now adds up the result sizes the deltas declare as it reads
them (gitformat-pack.txt, "Deltified representation": the delta header's target size)
and refuses the pack once they pass ``pack_delta_expansion_free_bytes`` plus
``pack_delta_expansion_ratio_max`` times the pack's bytes, before allocating anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostile_wire import ZERO, Client, report_lines

from enroute_testing.bigpush import delta_bomb
from enroute_testing.devserver import DevServer, running_dev
from enroute_testing.procmem import MiB, memory, role_pid

BASE_BYTES = 15 * MiB
RESULT_BYTES = 1024 * MiB
PUSHES = 3
# What refusing may hold beyond the baseline: the 15 MiB base inflated per push, and
# the pack spooled; applying the delta would hold 1 GiB per push.
PEAK_GROWTH_BYTES_MAX = 256 * MiB


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    with running_dev(tmp_path_factory.mktemp("enroute-delta-bomb")) as server:
        yield server


def test_a_delta_bomb_is_refused_before_it_is_applied(dev: DevServer) -> None:
    data = delta_bomb(BASE_BYTES, RESULT_BYTES)
    assert len(data) < 20 * 1024
    compute = role_pid(dev.pid, "compute")
    before = memory(compute)
    client = Client(dev.url)
    with ThreadPoolExecutor(PUSHES) as pool:
        replies = list(
            pool.map(
                lambda i: client.push(f"bomb{i}", [(ZERO, b"1" * 40, b"refs/heads/main")], data),
                range(PUSHES),
            )
        )
    for reply in replies:
        assert reply.status == 200, reply.text()
        lines = report_lines(reply)
        assert lines[0].startswith(b"unpack the pack's deltas declare 1073741824 result bytes")
        assert b"pack_delta_expansion_ratio_max" in lines[0]
        assert lines[1] == b"ng refs/heads/main unpacker error"
    grown = memory(compute).peak_bytes - before.peak_bytes
    print(f"compute peak {before.peak_bytes // MiB} -> {memory(compute).peak_bytes // MiB} MiB")
    assert grown < PEAK_GROWTH_BYTES_MAX, f"the compute's peak grew by {grown // MiB} MiB"
