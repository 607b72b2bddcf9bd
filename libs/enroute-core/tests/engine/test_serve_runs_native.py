"""The compiled run writer (``enroute_native.pack_run``, docs/native.md) against its
reference, ``serve._write_run_reference``, on drawn runs (seed 004, "Layers": entries
are stored as pack entries, so serving copies them; gitformat-pack "Deltified
representation" and "offset encoding").

Each round draws a layer's data region of full entries and REF_DELTAs (type-and-size
headers of one to ten bytes, sizes at the 7-bit boundaries of the varint), a run of it
with bases in the run, earlier in the layer (every id below the run planned, so the
compiled code reads their offsets by rank, or not) and in earlier layers (in the
pack, held by a thin client, a duplicate's, unknown), a byte bound that cuts it, and
written offsets whose distances sit at the boundaries of the offset encoding; and now
and then a corrupt entry (a delta record on a full entry, a header of eleven bytes, no
room for the base oid). Both writers must give the same bytes, pack offsets, counts,
lookups and reads, or the same ``CorruptData``. ``test_serve_runs.py`` compares whole
packs of real layers, runs against entry by entry.

The seed is printed; ``ENROUTE_SEED=N`` replays a run.
"""

from __future__ import annotations

import os
import random
from array import array
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from pyroaring import BitMap

from enroute_core.base.errors import CorruptData
from enroute_core.engine import serve
from enroute_core.engine.serve import PackPlan, _PackOut, _RunCounts, _write_run_reference
from enroute_core.engine.view import View
from enroute_core.git.pack import encode_ofs_distance
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.layer.format import RECORD, REF_EXTERNAL, REF_NONE
from enroute_core.storage.layer.reader import EntryRows

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
ROUNDS = 400

# gitformat-pack "offset encoding": each byte past the first adds 2**(7k) to the range.
_DISTANCE_EDGES = [1, 0x7F, 0x80, 0x81, 0x407F, 0x4080, 0x4081, 0x20407F, 0x204080,
                   0x1020407F, 0x10204080, (1 << 35) + 0x10204080, (1 << 56) - 1]  # fmt: skip
# The size varint: 4 bits in the first byte, 7 in each further one.
_SIZE_EDGES = [0, 15, 16, 2047, 2048, (1 << 18) - 1, 1 << 18, (1 << 25) - 1, 1 << 25,
               (1 << 60) - 1, 1 << 60, (1 << 64) - 1]  # fmt: skip


@dataclass
class _Reader:
    """The data region of one layer in memory: what ``_write_run`` asks of a
    :class:`LayerReader` (its reads are recorded, to compare the two writers' reads)."""

    region: bytes
    local_end: int
    external_oids: list[bytes]
    reads: list[tuple[int, int]] = field(default_factory=list)

    @property
    def data_end(self) -> int:
        return len(self.region)

    def local_bytes(self, offset: int, length: int) -> int:
        return max(0, min(length, self.local_end - offset))

    def data_bytes(self, offset: int, length: int, intent: Any = None) -> bytes:
        self.reads.append((offset, length))
        return self.region[offset : offset + length]

    def external_oid(self, index: int) -> bytes:
        return self.external_oids[index]


@dataclass
class _View:
    """``id_of_oid`` of the earlier layers (the lookups are recorded)."""

    ids: dict[bytes, int]
    asked: list[bytes] = field(default_factory=list)

    def id_of_oid(self, oid: bytes) -> int | None:
        self.asked.append(oid)
        return self.ids.get(oid)


def _rows(rows: list[tuple[int, int, int]]) -> EntryRows:
    """The rows as the object table's records (the oid, size, context and depth are
    not read: filled with bytes the writers must not look at)."""
    return EntryRows(
        b"".join(RECORD.pack(b"\xee" * 20, o, n, 1 << 40, b, 7, 9) for o, n, b in rows)
    )


def _header(type_num: int, size: int) -> bytes:
    """A type-and-size header (gitformat-pack, "Pack file entry"), minimal."""
    out = bytearray()
    byte = type_num << 4 | size & 0x0F
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def _entry(rnd: random.Random, delta: bool, corrupt: bool) -> bytes:
    size = rnd.choice(_SIZE_EDGES) if rnd.random() < 0.5 else rnd.randrange(1 << 20)
    body = rnd.randbytes(rnd.choice([1, 5, rnd.randrange(1, 200), rnd.randrange(100, 2000)]))
    type_num = 7 if delta else rnd.randrange(1, 5)
    if not corrupt:
        return _header(type_num, size) + (rnd.randbytes(20) if delta else b"") + body
    how = rnd.randrange(3)
    if how == 0:  # a delta record on a full entry
        return _header(rnd.randrange(1, 5), size) + body
    if how == 1:  # a header of eleven bytes
        return b"\xf0" + b"\x80" * 9 + b"\x01" + rnd.randbytes(20) + body
    return _header(7, size) + rnd.randbytes(rnd.randrange(20))  # no room for the oid


def _lengths_at_edges(rnd: random.Random) -> int:
    """A full entry's length that puts the next delta on it at an encoding edge."""
    return rnd.choice([d for d in _DISTANCE_EDGES if d < 0x30000] + [rnd.randrange(1, 300)])


def _draw(rnd: random.Random) -> dict[str, Any]:
    """One layer, one plan and one run of it."""
    first = rnd.randrange(0, 50)  # ids of the earlier layers: [0, first)
    n = rnd.randrange(2, 60)
    start = rnd.randrange(0, n - 1)  # the run's first local
    row0 = rnd.randrange(0, start + 1)
    stop = rnd.randrange(start + 1, n + 1)
    corrupt_at = rnd.randrange(start, n) if rnd.random() < 0.25 else -1
    externals = [bytes([k]) * 20 for k in range(8)]
    view_ids: dict[bytes, int] = {}
    for k, oid in enumerate(externals):
        if k % 4 != 3:  # some earlier objects are unknown to the view
            view_ids[oid] = rnd.randrange(first + n + 5) if k == 2 else rnd.randrange(first or 1)
    region = bytearray(rnd.randbytes(rnd.randrange(0, 40)))  # the data region's start
    rows: list[tuple[int, int, int]] = []
    for local in range(n):
        delta = local > 0 and rnd.random() < 0.6
        if local in (start, start + 1) and rnd.random() < 0.4:
            delta = local > 0 or bool(first)
        if local == start + 1 and not delta and rnd.random() < 0.5:
            entry = _header(3, 9) + rnd.randbytes(max(1, _lengths_at_edges(rnd) - 2))
        else:
            entry = _entry(rnd, delta, local == corrupt_at)
        if not delta and local == corrupt_at:
            delta = True
        if delta:
            if local > start and rnd.random() < 0.5:
                base = rnd.randrange(start, local)  # in the run
            elif local > 0 and rnd.random() < 0.6:
                base = rnd.randrange(0, min(local, start) or local)  # earlier in the layer
            else:
                base = REF_EXTERNAL | rnd.randrange(len(externals))
        else:
            base = REF_NONE
        if rnd.random() < 0.03 and local > start:  # a gap: not back to back
            region += b"\x00"
        rows.append((len(region), len(entry), base))
        region += entry
    # The plan: the earlier layers mostly planned, the layer below the run whole or not.
    ids = BitMap(k for k in range(first) if rnd.random() < 0.8)
    whole = rnd.random() < 0.6
    ids |= BitMap(first + k for k in range(start) if whole or rnd.random() < 0.7)
    ids.add_range(first + start, first + n)
    have = BitMap(k for k in range(first + start) if k not in ids and rnd.random() < 0.7)
    plan = PackPlan(ids, have, (), thin=rnd.random() < 0.7, ofs_delta=rnd.random() < 0.85)
    # Offsets written so far, one per planned id below the run; the run starts at pos0.
    written = len(BitMap(k for k in ids if k < first + start))
    pos0 = rnd.choice([12, 1000, 1 << 20, 1 << 36]) + max(_DISTANCE_EDGES)
    offsets = array("Q", sorted(rnd.randrange(12, pos0) for _ in range(written)))
    if written:  # the last written one (or any) at an encoding edge from pos0
        offsets[rnd.randrange(written)] = pos0 - rnd.choice(_DISTANCE_EDGES)
    off0 = rows[start][0]
    local_end = rnd.choice([len(region), off0 + rnd.randrange(1, 4000), rows[min(stop, n - 1)][0]])
    return {
        "first": first, "rows": _rows(rows[row0:]), "row0": row0, "start": start, "stop": stop,
        "plan": plan, "offsets": offsets, "pos0": pos0, "externals": externals,
        "view_ids": view_ids, "region": bytes(region), "local_end": local_end,
    }  # fmt: skip


def _run(
    case: dict[str, Any], writer: Any, run_bytes_max: int
) -> tuple[Any, bytes, list[int], dict[int, int | None], list[Any], list[Any]]:
    reader = _Reader(case["region"], case["local_end"], case["externals"])
    view = _View(case["view_ids"])
    out = _PackOut(lambda piece: None)
    out.buf += b"\xaa" * (case["pos0"] % 7)
    out.flushed = case["pos0"] - len(out.buf)
    offsets = array("Q", case["offsets"])
    externals: dict[int, int | None] = {}
    serve_run_bytes = serve._RUN_BYTES_MAX
    serve._RUN_BYTES_MAX = run_bytes_max
    try:
        got: Any = writer(
            cast(View, view), case["plan"], cast(LayerReader, reader), case["first"],
            case["rows"], case["row0"], case["start"], case["stop"], out, offsets, externals,
        )  # fmt: skip
    except CorruptData as exc:
        got = ("CorruptData", str(exc))
    finally:
        serve._RUN_BYTES_MAX = serve_run_bytes
    return got, bytes(out.buf), offsets.tolist(), externals, reader.reads, view.asked


def test_compiled_run_matches_the_reference() -> None:
    print(f"ENROUTE_SEED={SEED}")
    rnd = random.Random(SEED)
    taken = rewritten = kept = corrupt = 0
    for round_ in range(ROUNDS):
        case = _draw(rnd)
        run_bytes_max = rnd.choice([1 << 20, 64, 3000])
        compiled = _run(case, serve._write_run, run_bytes_max)
        reference = _run(case, _write_run_reference, run_bytes_max)
        got = compiled[0]
        if isinstance(got, tuple):  # corrupt: the compiled code left it to the reference
            assert got == reference[0], f"round {round_}, ENROUTE_SEED={SEED}"
        else:
            assert compiled == reference, f"round {round_}, ENROUTE_SEED={SEED}"
        if isinstance(got, _RunCounts):
            taken += got.entries > 0
            rewritten += got.rewritten
            kept += got.thin_kept
        else:
            corrupt += 1
    # the draws reach every branch (a test that cannot fail is a defect)
    assert taken > ROUNDS // 4 and rewritten > ROUNDS // 2 and kept > 5 and corrupt > 5, (
        taken, rewritten, kept, corrupt)  # fmt: skip


@pytest.mark.parametrize("distance", _DISTANCE_EDGES)
@pytest.mark.parametrize("size", _SIZE_EDGES)
def test_offset_and_size_edges(distance: int, size: int) -> None:
    """A run whose first entry is a REF_DELTA on an earlier layer's object at
    ``distance`` from it: the header keeps its size bytes, the oid becomes exactly
    ``encode_ofs_distance(distance)``; the second entry's offset moves by the saving."""
    rnd = random.Random(SEED ^ distance ^ size)
    delta = _header(7, size) + rnd.randbytes(20) + b"zlib bytes"
    full = _header(3, 5) + b"hello"
    region = b"PACK" + delta + full
    rows = [(4, len(delta), REF_EXTERNAL | 0), (4 + len(delta), len(full), REF_NONE)]
    pos0 = (1 << 57) + 12
    case = {
        "first": 1, "rows": _rows(rows), "row0": 0, "start": 0, "stop": 2,
        "plan": PackPlan(BitMap([0, 1, 2]), BitMap(), (), thin=False, ofs_delta=True),
        "offsets": array("Q", [pos0 - distance]), "pos0": pos0,
        "externals": [b"\x07" * 20], "view_ids": {b"\x07" * 20: 0},
        "region": region, "local_end": len(region),
    }  # fmt: skip
    compiled = _run(case, serve._write_run, 1 << 20)
    assert compiled == _run(case, _write_run_reference, 1 << 20)
    head = _header(6, size)
    encoded = encode_ofs_distance(distance)
    before = b"\xaa" * (pos0 % 7)
    assert compiled[1] == before + head + encoded + b"zlib bytes" + full
    assert compiled[2] == [pos0 - distance, pos0, pos0 + len(head) + len(encoded) + 10]
