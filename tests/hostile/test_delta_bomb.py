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
from hostile_wire import ZERO, Client, full_entry, ofs_delta_entry, pack, report_lines, varint

from enroute_testing.devserver import DevServer, running_dev
from enroute_testing.procmem import MiB, memory, role_pid

BASE_BYTES = 15 * MiB
RESULT_BYTES = 1024 * MiB
PUSHES = 3
# What refusing may hold beyond the baseline: the 15 MiB base inflated per push, and
# the pack spooled; applying the delta would hold 1 GiB per push.
PEAK_GROWTH_BYTES_MAX = 256 * MiB


def _copy(offset: int, size: int) -> bytes:
    """A copy instruction with a 3-byte length (gitformat-pack.txt: up to 0xFFFFFF bytes)."""
    cmd, args = 0x80, bytearray()
    for i in range(4):
        byte = (offset >> (8 * i)) & 0xFF
        if byte:
            cmd |= 1 << i
            args.append(byte)
    for i in range(3):
        byte = (size >> (8 * i)) & 0xFF
        if byte:
            cmd |= 1 << (4 + i)
            args.append(byte)
    return bytes([cmd]) + bytes(args)


def _bomb() -> bytes:
    base = full_entry(3, bytes(BASE_BYTES))
    copies = bytearray()
    left = RESULT_BYTES
    while left:
        copies += _copy(0, min(left, BASE_BYTES))
        left -= min(left, BASE_BYTES)
    delta = varint(BASE_BYTES) + varint(RESULT_BYTES) + bytes(copies)
    return pack([base, ofs_delta_entry(len(base), delta)])


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    with running_dev(tmp_path_factory.mktemp("enroute-delta-bomb")) as server:
        yield server


def test_a_delta_bomb_is_refused_before_it_is_applied(dev: DevServer) -> None:
    data = _bomb()
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
