"""A pushed layer's commit graph in ids, whole arrays against ref by ref.

Seed 004, "Pages and memory" (the commit graph in ids) and "Stable object
numbering" (a first push's ids are its range start plus its local indexes).
A repository's first push is resolved a whole array at a time
(``_first_graph``); every other layer, and anything the array way does not
recognise, ref by ref (``_resolved_graph``). Both must give the same graph, or
the same ``CorruptData``, for the same layer, including commit sections that
pass every checksum but are wrong (docs/formats/layer.md, "Commit section").
Randomised: prints its seed, replays with ``ENROUTE_SEED=``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import struct
from collections.abc import Callable

import pytest

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import LogIndex, ObjectId
from enroute_core.engine.view import View, _first_graph, _pushed_graph, _resolved_graph
from enroute_core.git.pack import encode_entry_header
from enroute_core.git.source import BytesSource
from enroute_core.state.model import LayerEntry as ManifestEntry
from enroute_core.state.model import LayerKind as ManifestKind
from enroute_core.storage.layer import (
    CommitGraph,
    CommitInfo,
    Kind,
    LayerEntry,
    LayerReader,
    write_layer,
)
from enroute_core.storage.layer.format import COMMIT_RECORD, FOOTER_BYTES, Footer, Layout
from enroute_testing.synthlayer import reseal

PACK_TYPE = {Kind.COMMIT: 1, Kind.TREE: 2, Kind.BLOB: 3}


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={value}")
    return value


@pytest.fixture
def first_push(seed: int) -> bytes:
    """A first push: 40 commits (merges among them), a tree each, 60 blobs, segments of
    any objects, no externals."""
    rng = random.Random(seed)
    counts = {Kind.COMMIT: 40, Kind.TREE: 40, Kind.BLOB: 60}
    oids = {k: [ObjectId(rng.randbytes(20)) for _ in range(n)] for k, n in counts.items()}
    entries = [
        LayerEntry(oid, kind, encode_entry_header(PACK_TYPE[kind], 1) + b"x", 1, None, 0)
        for kind in counts
        for oid in oids[kind]
    ]
    every = [e.oid for e in entries]
    commits = []
    for k, c in enumerate(oids[Kind.COMMIT]):
        parents = tuple(rng.sample(oids[Kind.COMMIT][:k], min(k, rng.choice([1, 1, 1, 2]))))
        segment = (c, oids[Kind.TREE][k], *rng.sample(every, rng.randint(0, 6)))
        commits.append(CommitInfo(c, oids[Kind.TREE][k], parents, rng.randint(0, 2**40), segment))
    data, _ = write_layer(entries, commits)
    return data


def _open(data: bytes) -> tuple[ManifestEntry, LayerReader]:
    reader = LayerReader.open(BytesSource(data))
    entry = ManifestEntry(
        ManifestKind.INLINE, 0, reader.object_count, reader.object_count, 0, len(data),
        reader.meta_size, hashlib.sha256(data).digest(), LogIndex(1),
    )  # fmt: skip
    return entry, reader


def _outcome(build: Callable[[], CommitGraph]) -> CommitGraph | tuple[str, str, object]:
    try:
        return build()
    except CorruptData as exc:
        return (str(exc), exc.section, exc.details)


def test_a_first_push_maps_whole_arrays(first_push: bytes) -> None:
    entry, reader = _open(first_push)
    columns = reader.commit_columns()
    assert columns is not None and reader.external_count == 0
    for first in (0, 1000):
        at = dataclasses.replace(entry, first_id=first)
        fast = _first_graph(first, columns)
        assert fast is not None
        assert fast == _pushed_graph((), at, reader) == _resolved_graph((), at, reader)
        assert View([(at, reader)])._layers[0].graph == fast


def _section(data: bytes) -> tuple[int, int, int]:
    footer = Footer.decode(data[-FOOTER_BYTES:])
    records = Layout.of_footer(footer).commit_off
    parents = records + footer.commit_count * COMMIT_RECORD.size
    return records, parents, parents + footer.commit_parent_count * 4


def _record(data: bytes, rank: int) -> tuple[int, ...]:
    return COMMIT_RECORD.unpack_from(data, _section(data)[0] + rank * COMMIT_RECORD.size)


def _last_merge(data: bytes) -> int:
    """The last merge that is not the last record."""
    count = Footer.decode(data[-FOOTER_BYTES:]).commit_count
    return max(k for k in range(count - 1) if _record(data, k)[4] >= 2)


def _parent_of(data: bytes, value: Callable[[bytes], int]) -> bytes:
    """The first parent of the last merge set to ``value(data)``."""
    buf = bytearray(data)
    rank = _last_merge(data)
    struct.pack_into("<I", buf, _section(data)[1] + 4 * _record(data, rank)[3], value(data))
    return reseal(buf)


def _later_parent(data: bytes) -> bytes:
    """A parent whose record comes after its child's (not topological)."""
    return _parent_of(data, lambda d: _record(d, _last_merge(d) + 1)[0])


def _tree_parent(data: bytes) -> bytes:
    return _parent_of(data, lambda d: _record(d, 0)[1])


def _unsorted_run(data: bytes) -> bytes:
    """Two members of a segment swapped: the run no longer ascends."""
    buf = bytearray(data)
    rank = next(k for k in range(40) if _record(data, k)[6] >= 2)
    at = _section(data)[2] + 4 * _record(data, rank)[5]
    buf[at : at + 8] = buf[at + 4 : at + 8] + buf[at : at + 4]
    return reseal(buf)


def _repeated_record(data: bytes) -> bytes:
    """The last record names the commit of the one before: skipped as a duplicate."""
    buf = bytearray(data)
    at = _section(data)[0] + 39 * COMMIT_RECORD.size
    struct.pack_into("<I", buf, at, _record(data, 38)[0])
    return reseal(buf)


def _tree_past_the_table(data: bytes) -> bytes:
    buf = bytearray(data)
    struct.pack_into("<I", buf, _section(data)[0] + 3 * COMMIT_RECORD.size + 4, 10**6)
    return reseal(buf)


@pytest.mark.parametrize(
    ("corrupt", "fast_path", "section"),
    [
        (_later_parent, True, "view"),
        (_tree_parent, True, "view"),
        (_unsorted_run, False, None),
        (_repeated_record, False, None),
        (_tree_past_the_table, False, "commit section"),
    ],
)
def test_wrong_commit_sections_give_what_ref_by_ref_gives(
    first_push: bytes,
    corrupt: Callable[[bytes], bytes],
    fast_path: bool,
    section: str | None,
) -> None:
    entry, reader = _open(corrupt(first_push))
    columns = reader.commit_columns()
    if fast_path:
        assert columns is not None
    else:
        assert columns is None or _first_graph(0, columns) is None
    got = _outcome(lambda: _pushed_graph((), entry, reader))
    assert got == _outcome(lambda: _resolved_graph((), entry, reader))
    if section is None:
        assert isinstance(got, CommitGraph)
    else:
        assert isinstance(got, tuple) and got[1] == section
