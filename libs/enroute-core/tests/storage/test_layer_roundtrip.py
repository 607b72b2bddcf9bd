"""Layers written then read: any objects, refs, commits and id runs come back.

Seed 004, "Layers" ("One order", "Lookup reads one page", "Refs inside a
layer", "Chunk hashes verify any chunk on its own") and "Stable object
numbering" (id runs: one per hole). Randomised parts print their seed and
accept ENROUTE_SEED=.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData, InvalidArgument, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.pack import encode_entry_header as header
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer import (
    CHUNK_BYTES,
    REF_EXTERNAL,
    REF_NONE,
    CommitInfo,
    EntryRun,
    GraphCommit,
    Kind,
    LayerEntry,
    LayerReader,
    LayerWriter,
    layer_key_name,
    root_of,
    write_layer,
)
from enroute_core.storage.layer import writer as writer_module
from enroute_core.storage.layer.bloom import (
    bloom_bits_for,
    bloom_may_contain,
    build_bloom,
    build_bloom_py,
)
from enroute_core.storage.layer.format import FOOTER_BYTES, Footer, Layout
from enroute_core.storage.pool import BufferPool
from enroute_testing.synthlayer import median_lookup_seconds, reseal, synthetic_layer

SEED = int(os.environ.get("ENROUTE_SEED", "20240601"))
PACK_TYPE = {Kind.COMMIT: 1, Kind.TREE: 2, Kind.BLOB: 3, Kind.TAG: 4}


def full(
    oid: bytes,
    kind: Kind,
    payload: bytes = b"x",
    size: int = 3,
    base_context: ObjectId | None = None,
) -> LayerEntry:
    entry = header(PACK_TYPE[kind], size) + payload
    return LayerEntry(ObjectId(oid), kind, entry, size, None, 0, base_context)


def delta(oid: bytes, kind: Kind, base: bytes, depth: int, size: int = 5) -> LayerEntry:
    return LayerEntry(
        ObjectId(oid),
        kind,
        header(7, 9) + base + b"delta",
        size,
        ObjectId(base),
        depth,
    )


class CountingSource:
    """A ByteSource that counts reads (the reader's only way to the bytes)."""

    def __init__(self, data: bytes) -> None:
        self.inner = BytesSource(data)
        self.reads: list[tuple[int, int]] = []

    @property
    def size(self) -> int:
        return self.inner.size

    def read_at(self, offset: int, length: int) -> bytes:
        self.reads.append((offset, length))
        return self.inner.read_at(offset, length)


# -- a random layer model ----------------------------------------------------------------------


@dataclass
class Model:
    entries: list[LayerEntry] = field(default_factory=list)
    commits: list[CommitInfo] = field(default_factory=list)
    external: set[bytes] = field(default_factory=set)
    merged: bool = False
    id_runs: list[tuple[int, int]] | None = None
    id_count: int | None = None
    graph: list[GraphCommit] | None = None

    def ids(self) -> list[int]:
        n = len(self.entries)
        if not self.id_runs:
            return list(range(n))
        out = []
        for r, (first, rel) in enumerate(self.id_runs):
            end = self.id_runs[r + 1][0] if r + 1 < len(self.id_runs) else n
            out += [rel + i - first for i in range(first, end)]
        return out


def random_model(rng: random.Random, n: int, merged: bool) -> Model:
    oids = [ObjectId(rng.randbytes(20)) for _ in range(n)]
    outside = [ObjectId(rng.randbytes(20)) for _ in range(rng.randint(0, 6))]
    if merged:
        kinds = [rng.choice(list(Kind)) for _ in range(n)]
    else:
        kinds = sorted(rng.choice(list(Kind)) for _ in range(n))
    m = Model(merged=merged)
    depth: dict[bytes, int] = {}
    ext_used: set[bytes] = set()

    def pick_ref() -> ObjectId | None:
        choice = rng.random()
        if choice < 0.3 and m.entries:
            return rng.choice(m.entries).oid
        if choice < 0.45 and outside:
            ext = rng.choice(outside)
            ext_used.add(ext)
            return ext
        return None

    for oid, kind in zip(oids, kinds, strict=True):
        ctx = pick_ref()
        ctx = None if ctx == oid else ctx
        same_kind = [e for e in m.entries if e.kind == kind]
        roll = rng.random()
        payload = rng.randbytes(rng.randint(1, 40))
        if roll < 0.2 and same_kind:
            base = rng.choice(same_kind)
            e = LayerEntry(
                oid,
                kind,
                header(7, len(payload)) + base.oid + payload,
                rng.randint(0, 1000),
                base.oid,
                depth[base.oid] + 1,
                ctx,
            )
        elif roll < 0.3 and outside:
            base_oid = rng.choice(outside)
            ext_used.add(base_oid)
            entry = header(7, len(payload)) + base_oid + payload
            size = rng.randint(0, 1000)
            e = LayerEntry(oid, kind, entry, size, base_oid, rng.randint(1, 50), ctx)
        else:
            size = rng.choice([0, 1, 15, 16, 300, 70000])
            e = LayerEntry(oid, kind, header(PACK_TYPE[kind], size) + payload, size, None, 0, ctx)
        depth[oid] = e.depth
        m.entries.append(e)
    commit_oids = [e.oid for e in m.entries if e.kind == Kind.COMMIT]
    trees = [e.oid for e in m.entries if e.kind == Kind.TREE]
    order = list(commit_oids)
    for c in order:
        earlier = order[: order.index(c)]
        parents = tuple(rng.sample(earlier, min(len(earlier), rng.randint(0, 2))))
        if outside and rng.random() < 0.3:
            parents += (rng.choice(outside),)
            ext_used.add(parents[-1])
        if trees and rng.random() < 0.8:
            tree = rng.choice(trees)
        else:
            tree = rng.choice(outside) if outside else ObjectId(rng.randbytes(20))
            ext_used.add(tree)
        pool = [e.oid for e in m.entries] + outside
        segment = (*(rng.choice(pool) for _ in range(rng.randint(0, 8))), c)
        ext_used.update(s for s in segment if s in outside)
        m.commits.append(CommitInfo(c, tree, parents, rng.randint(-(2**40), 2**40), segment))
    m.external = ext_used
    if merged:
        runs: list[tuple[int, int]] = []
        rel = rng.randint(0, 3)
        for i in range(n):
            if i == 0 or rng.random() < 0.1:
                if i:
                    rel += rng.randint(1, 4)
                runs.append((i, rel))
            rel += 1
        m.id_runs = runs
        m.id_count = rel + rng.randint(0, 3) if n else rng.randint(0, 3)
        ids = m.ids()
        id_of = {e.oid: ids[i] + 1000 for i, e in enumerate(m.entries)}
        m.graph = []
        gens: dict[int, int] = {}
        for info in sorted(m.commits, key=lambda c: id_of[c.oid]):
            cid = id_of[info.oid]
            parents_ids = tuple(id_of[p] for p in info.parents if p in id_of)
            if any(p not in id_of for p in info.parents):
                parents_ids += (5,)  # an id in an older layer
            gen = 1 + max((gens.get(p, 0) for p in parents_ids), default=0)
            gens[cid] = gen
            seg = tuple(sorted({id_of.get(s, 7) for s in info.segment}))
            m.graph.append(GraphCommit(cid, 1, gen, info.time, parents_ids, seg))
    return m


def write_model(m: Model) -> tuple[bytes, LayerReader]:
    data, sealed = write_layer(
        m.entries,
        m.commits,
        merged=m.merged,
        id_runs=m.id_runs,
        id_count=m.id_count,
        graph=m.graph,
    )
    assert sealed.root == blake3.blake3(data).digest() == root_of(BytesSource(data))
    assert sealed.meta_size == len(data) - Footer.decode(data[-FOOTER_BYTES:]).data_end
    source = CountingSource(data)
    r = LayerReader.open(source, meta_size=sealed.meta_size)
    assert len(source.reads) == 1, "a remote open is one ranged read"
    assert (r.object_count, r.id_count) == (sealed.object_count, sealed.id_count)
    return data, r


def check_model(m: Model, r: LayerReader, rng: random.Random) -> None:
    r.verify()
    ids = m.ids()
    assert r.external_oids == tuple(sorted(m.external))
    for i, e in enumerate(m.entries):
        assert r.lookup(e.oid) == i
        assert r.lookup(e.oid, e.kind) == i
        assert r.lookup(e.oid, Kind((e.kind + 1) % 4)) is None
        assert r.kind_of(i) == e.kind
        rec = r.record(i)
        assert (rec.oid, rec.length, rec.size, rec.depth) == (e.oid, len(e.entry), e.size, e.depth)
        assert r.entry_bytes(i) == e.entry
        assert (rec.base_ref == REF_NONE) == (e.base is None)
        if e.base is not None:
            assert r.ref_oid(rec.base_ref) == e.base
        if e.base_context is not None:
            assert r.ref_oid(rec.base_context_ref) == e.base_context
        assert r.id_of(i) == ids[i]
        assert r.local_of(ids[i]) == i
    present = set(ids)
    for rel in range(r.id_count + 2):
        if rel not in present:
            assert r.local_of(rel) is None
    for _ in range(50):
        assert r.lookup(rng.randbytes(20)) is None
    for oid in m.external:
        assert r.lookup(oid) is None
    columns = r.commit_columns()
    assert columns is not None and len(columns) == r.commit_count
    assert list(columns.records()) == [r.commit(k) for k in range(r.commit_count)]
    infos = list(r.commit_infos())
    assert [(c.oid, c.tree, c.parents, c.time) for c in infos] == [
        (c.oid, c.tree, c.parents, c.time) for c in m.commits
    ]
    for got, want in zip(infos, m.commits, strict=True):
        assert set(got.segment) == set(want.segment) and len(got.segment) == len(set(want.segment))
    graph = r.commit_graph()
    if m.merged:
        assert graph is not None and [graph.commit(k) for k in range(len(graph))] == m.graph
    else:
        assert graph is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(0, 420), merged=st.booleans())
def test_any_layer_round_trips(seed: int, n: int, merged: bool) -> None:
    rng = random.Random(seed)
    m = random_model(rng, n, merged)
    _, r = write_model(m)
    check_model(m, r, rng)


def test_seeded_round_trip_prints_its_seed() -> None:
    print(f"ENROUTE_SEED={SEED}")
    rng = random.Random(SEED)
    for merged in (False, True):
        m = random_model(rng, 900, merged)
        _, r = write_model(m)
        check_model(m, r, rng)


def test_empty_layers() -> None:
    for merged, kw in ((False, {}), (True, {"id_runs": [], "id_count": 3, "graph": []})):
        data, sealed = write_layer([], merged=merged, **kw)  # type: ignore[arg-type]
        r = LayerReader.open(BytesSource(data))
        r.verify()
        assert r.object_count == 0 and r.chunk_count == 0
        assert r.lookup(b"\0" * 20) is None and r.local_of(0) is None
        assert sealed.meta_size == len(data)


# -- lookup against many pages -----------------------------------------------------------------


def test_lookup_with_adversarial_oids() -> None:
    """Clustered oids defeat interpolation: lookup must still walk to the right page."""
    rng = random.Random(SEED)
    oids = sorted({bytes(7) + rng.randbytes(13) for _ in range(3000)})
    oids += [b"\xff" * 19 + bytes([i]) for i in range(40)]
    oids += [bytes(20)]
    oids.sort()
    rng.shuffle(oids)
    entries = [full(o, Kind.BLOB) for o in oids]
    data, _ = write_layer(entries)
    r = LayerReader.open(BytesSource(data))
    for i, o in enumerate(oids):
        assert r.lookup(o) == i
    for _ in range(2000):
        probe = bytes(7) + rng.randbytes(13)
        assert (r.lookup(probe) is not None) == (probe in set(oids))
    assert r.lookup(b"\xff" * 20) is None
    r.verify()


def test_synthetic_layer_and_measurement_run() -> None:
    data, sealed, oids = synthetic_layer(5000)
    r = LayerReader.open(BytesSource(data), meta_size=sealed.meta_size)
    for i in range(0, 5000, 7):
        assert r.lookup(oids[i]) == i
    r.verify()
    ticks = iter(range(10**9))
    assert median_lookup_seconds(lambda: float(next(ticks)), 2000, 100, 0.25) == 1.0


# -- chunks ------------------------------------------------------------------------------------


def big_layer() -> tuple[bytes, list[LayerEntry], Layout]:
    """About 2.6 MiB of data: three chunks of data, the metadata in the third."""
    rng = random.Random(7)
    entries = [full(rng.randbytes(20), Kind.BLOB, rng.randbytes(60_000), 60_000) for _ in range(46)]
    data, _ = write_layer(entries)
    return data, entries, Layout.of_footer(Footer.decode(data[-FOOTER_BYTES:]))


def test_entry_reads_check_each_chunk_once() -> None:
    data, entries, layout = big_layer()
    source = CountingSource(data)
    r = LayerReader.open(source)
    assert r.chunk_count == 3 and layout.data_end > 2 * CHUNK_BYTES
    assert len(source.reads) == 2  # footer, then metadata from the chunk holding data_end
    assert source.reads[1][0] == 2 * CHUNK_BYTES
    assert r.entry_bytes(0) == entries[0].entry
    after_first = len(source.reads)
    assert r.entry_bytes(1) == entries[1].entry
    rec = r.record(1)
    pages = (rec.offset + rec.length - 1) // 65536 - rec.offset // 65536 + 1
    assert len(source.reads) - after_first == pages == 2  # chunk 0 verified: only its pages
    rec = r.record(17)
    assert r.data_chunks_for(rec.offset, rec.length) == range(
        rec.offset // CHUNK_BYTES, (rec.offset + rec.length - 1) // CHUNK_BYTES + 1
    )
    assert r.data_chunks_for(0, 1) == range(0, 1)
    assert r.data_chunks_for(CHUNK_BYTES - 1, 2) == range(0, 2)
    with pytest.raises(ValueError):
        r.data_chunks_for(0, layout.index_region_off + 1)


def test_flip_in_a_data_chunk_fails_only_its_reads() -> None:
    data, entries, _ = big_layer()
    buf = bytearray(data)
    buf[100] ^= 0x01  # chunk 0, data only
    r = LayerReader.open(BytesSource(bytes(buf)))  # metadata chunks are fine
    with pytest.raises(CorruptData) as info:
        r.entry_bytes(0)
    assert info.value.section == "data region" and info.value.details["chunk"] == 0
    last = len(entries) - 1
    assert r.entry_bytes(last) == entries[last].entry  # chunk 2 is good
    with pytest.raises(CorruptData) as info:
        r.verify()
    assert info.value.details["chunk"] == 0


def test_flip_in_a_metadata_chunk_names_its_sections() -> None:
    data, _, layout = big_layer()
    for pos, want in (
        (layout.table_off + 3, "data region, object table, oid index"),
        (layout.data_end - 1, "data region, object table, oid index"),
    ):
        buf = bytearray(data)
        buf[pos] ^= 0x80
        with pytest.raises(CorruptData) as info:
            LayerReader.open(BytesSource(bytes(buf)))
        assert info.value.section == want and info.value.details["chunk"] == 2


# -- structural nonsense that passes the checksums ----------------------------------------------


def exercise(data: bytes, oids: list[bytes]) -> None:
    """Every read of the API on ``data``: only CorruptData may escape."""
    try:
        r = LayerReader.open(BytesSource(data))
    except CorruptData:
        return

    def refs(i: int) -> list[bytes]:
        rec = r.record(i)
        return [r.ref_oid(x) for x in (rec.base_ref, rec.base_context_ref) if x != REF_NONE]

    calls: list[Callable[[], object]] = [
        r.verify,
        lambda: list(r.commit_infos()),
        r.commit_graph,
        lambda: r.external_oids,
    ]
    calls += [partial(r.lookup, o) for o in oids]
    for i in range(r.object_count):
        calls += [partial(f, i) for f in (r.entry_bytes, r.kind_of, r.id_of, refs)]
    calls += [partial(r.local_of, x) for x in range(min(r.id_count, 40) + 1)]
    for call in calls:
        with contextlib.suppress(CorruptData):
            call()


@settings(max_examples=300, deadline=None)
@given(
    which=st.sampled_from(["pushed", "merged"]),
    pos=st.integers(0, 2**20),
    value=st.integers(1, 255),
)
def test_resealed_corruption_raises_only_corrupt_data(which: str, pos: int, value: int) -> None:
    data = GOLDEN[which]
    buf = bytearray(data)
    buf[pos % len(buf)] ^= value
    exercise(reseal(buf), ORACLE_OIDS[which])


def _golden_files() -> dict[str, bytes]:
    from pathlib import Path

    here = Path(__file__).resolve().parent / "golden"
    return {n: (here / f"{n}.layer").read_bytes() for n in ("pushed", "merged")}


GOLDEN = _golden_files()
ORACLE_OIDS = {
    n: [bytes(LayerReader.open(BytesSource(d)).record(i).oid) for i in range(8)] + [bytes(20)]
    for n, d in GOLDEN.items()
}


def test_resealed_table_offset_past_data_is_corrupt() -> None:
    data = bytearray(GOLDEN["pushed"])
    r = LayerReader.open(BytesSource(bytes(data)))
    table_off = struct.unpack_from("<Q", data, len(data) - FOOTER_BYTES + 8)[0]
    struct.pack_into("<Q", data, table_off + 20, 10**9)  # record 0's offset
    bad = LayerReader.open(BytesSource(reseal(data)))
    with pytest.raises(CorruptData) as info:
        bad.entry_bytes(0)
    assert info.value.section == "object table"
    assert r.entry_bytes(0)


def test_resealed_unsorted_index_fails_verify() -> None:
    data = bytearray(GOLDEN["merged"])
    index_off = struct.unpack_from("<Q", data, len(data) - FOOTER_BYTES + 16)[0]
    a = bytes(data[index_off : index_off + 24])
    data[index_off : index_off + 24] = data[index_off + 24 : index_off + 48]
    data[index_off + 24 : index_off + 48] = a
    bad = LayerReader.open(BytesSource(reseal(data)))
    with pytest.raises(CorruptData) as info:
        bad.verify()
    assert info.value.section in {"oid index", "index region"}


# -- the commit section, whole and record by record -------------------------------------------

_N, _E = 10, 3  # the pushed golden's objects and externals: refs name 0..9 and 0x80000000..2
_BAD_REF = [
    ("record1", 1, _N, 1),  # a tree ref past the table
    ("record0", 1, REF_EXTERNAL | _E, 0),  # an external index past the external oids
    ("record1", 1, REF_NONE, 1),
    ("parents", 0, REF_EXTERNAL - 1, 0),  # between the last local and the first external
    ("members", 9, REF_EXTERNAL | _E, 1),
]


@pytest.mark.parametrize(
    ("name", "edits", "rank", "fragment"),
    [
        ("pushed", [("record1", 0, 2)], 1, "names no commit entry"),  # a tree
        ("pushed", [("record0", 0, _N)], 0, "names no commit entry"),  # past the table
        ("merged", [("record1", 0, 5)], 1, "names no commit entry"),  # commits in two runs
        *(("pushed", [(w, slot, v)], rank, "invalid ref") for w, slot, v, rank in _BAD_REF),
        ("pushed", [("record0", 5, 3)], 0, "run past their arrays"),  # 3 of 2 parents
        ("pushed", [("record0", 4, 0xFFFFFFFF)], 0, "run past their arrays"),
        ("pushed", [("record1", 6, 10)], 1, "run past their arrays"),
        ("pushed", [("record1", 7, 6)], 1, "run past their arrays"),
        ("pushed", [("record1", 7, 6), ("record0", 1, _N)], 0, "invalid ref"),  # the first
        # No error: a bad ref in a slot no range covers, a commit in the merged
        # golden's second commit run named twice.
        ("pushed", [("record1", 7, 4), ("members", 9, REF_NONE)], None, ""),
        ("merged", [("record0", 0, 4)], None, ""),
    ],
)
def test_resealed_commit_section_reads_as_record_by_record(
    name: str, edits: list[tuple[str, int, int]], rank: int | None, fragment: str
) -> None:
    """The bulk decode (``commit_columns``) gives what ``commit(rank)`` gives for every
    rank: the same records, or the same ``CorruptData`` for the first bad record after
    the good ones before it (docs/formats/layer.md, "Commit section")."""
    data = bytearray(GOLDEN[name])
    footer = Footer.decode(bytes(data[-FOOTER_BYTES:]))
    records = Layout.of_footer(footer).commit_off
    parents = records + footer.commit_count * 32
    at = {
        "record0": records,
        "record1": records + 32,
        "parents": parents,
        "members": parents + footer.commit_parent_count * 4,
    }
    for where, slot, value in edits:
        struct.pack_into("<I", data, at[where] + 4 * slot, value)
    resealed = reseal(data)
    for pool in (None, BufferPool(1 << 20)):
        r = LayerReader.open(BytesSource(resealed), pool=pool)
        try:
            want = [r.commit(k) for k in range(r.commit_count)]
        except CorruptData as exc:
            assert rank is not None, exc
            assert (exc.section, exc.details["rank"]) == ("commit section", rank)
            assert fragment in str(exc)
            before = [r.commit(k) for k in range(rank)]
            assert list(itertools.islice(r.commits(), rank)) == before
            for read in (r.commits, r.commit_infos):
                with pytest.raises(CorruptData) as info:
                    list(read())
                assert (str(info.value), info.value.details) == (str(exc), exc.details)
            assert r.commit_columns() is None
        else:
            assert rank is None
            assert list(r.commits()) == want
            assert len(list(r.commit_infos())) == len(want)


# -- writer refusals ---------------------------------------------------------------------------


def oid(n: int) -> bytes:
    return hashlib.sha1(b"%d" % n).digest()


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([full(oid(1), Kind.TREE), full(oid(2), Kind.COMMIT)], "groups kinds"),
        ([delta(oid(1), Kind.BLOB, oid(2), 1), full(oid(2), Kind.BLOB)], "a delta against it"),
        ([full(oid(1), Kind.BLOB), full(oid(1), Kind.BLOB)], "added twice"),
        ([full(oid(1), Kind.BLOB), delta(oid(2), Kind.BLOB, oid(1), 2)], "its base's is 0"),
        ([full(oid(1), Kind.TREE), delta(oid(2), Kind.BLOB, oid(1), 1)], "another kind"),
        ([delta(oid(1), Kind.BLOB, oid(1), 1)], "its own delta base"),
        ([delta(oid(1), Kind.BLOB, oid(2), 0)], "depth at least 1"),
        (
            [LayerEntry(ObjectId(oid(1)), Kind.BLOB, header(6, 3) + b"\x01x", 3, None, 0)],
            "OFS_DELTA",
        ),
        (
            [LayerEntry(ObjectId(oid(1)), Kind.BLOB, header(2, 3) + b"x", 3, None, 0)],
            "is not a BLOB",
        ),
        (
            [LayerEntry(ObjectId(oid(1)), Kind.BLOB, header(3, 4) + b"x", 3, None, 0)],
            "header size",
        ),
        (
            [LayerEntry(ObjectId(oid(1)), Kind.BLOB, header(3, 3) + b"x", 3, None, 1)],
            "depth 0",
        ),
        (
            [
                LayerEntry(
                    ObjectId(oid(1)),
                    Kind.BLOB,
                    header(7, 3) + oid(3) + b"x",
                    3,
                    ObjectId(oid(2)),
                    1,
                )
            ],
            "does not name its base",
        ),
        ([LayerEntry(ObjectId(oid(1)), Kind.BLOB, b"\xb3", 3, None, 0)], "truncated"),
        ([LayerEntry(ObjectId(oid(1)), Kind.BLOB, b"", 3, None, 0)], "entry length"),
        (
            [LayerEntry(ObjectId(b"short"), Kind.BLOB, header(3, 3), 3, None, 0)],
            "20-byte",
        ),
        ([full(oid(1), Kind.BLOB, base_context=ObjectId(oid(1)))], "own base context"),
    ],
)
def test_writer_refuses_bad_entries(entries: list[LayerEntry], fragment: str) -> None:
    w = LayerWriter(lambda b: None)
    with pytest.raises(InvalidArgument, match=fragment):
        for e in entries:
            w.add(e)


def test_a_refused_entry_leaves_the_writer_usable() -> None:
    parts: list[bytes] = []
    w = LayerWriter(parts.append)
    w.add(full(oid(1), Kind.TREE))
    with pytest.raises(InvalidArgument):
        w.add(full(oid(2), Kind.COMMIT))
    w.add(full(oid(3), Kind.BLOB))
    w.finish()
    r = LayerReader.open(BytesSource(b"".join(parts)))
    assert r.lookup(oid(3)) == 1 and r.lookup(oid(2)) is None
    with pytest.raises(InvalidArgument, match="already finished"):
        w.add(full(oid(4), Kind.BLOB))


def commit_info(c: int, tree: int, parents: tuple[int, ...] = ()) -> CommitInfo:
    parent_oids = tuple(ObjectId(oid(p)) for p in parents)
    return CommitInfo(ObjectId(oid(c)), ObjectId(oid(tree)), parent_oids, 0, ())


@pytest.mark.parametrize(
    ("commits", "fragment"),
    [
        ([commit_info(2, 9, (1,)), commit_info(1, 9)], "comes before its parent"),
        ([commit_info(1, 9)], "1 commit entries have no commit record"),
        ([commit_info(3, 9), commit_info(1, 9), commit_info(2, 9)], "not a commit entry"),
        ([commit_info(1, 3), commit_info(2, 9)], "its tree is not a tree"),
        ([commit_info(1, 9), commit_info(2, 9, (3,))], "a parent is not a commit"),
    ],
)
def test_writer_refuses_bad_commits(commits: list[CommitInfo], fragment: str) -> None:
    w = LayerWriter(lambda b: None)
    w.add(full(oid(1), Kind.COMMIT))
    w.add(full(oid(2), Kind.COMMIT))
    w.add(full(oid(3), Kind.BLOB))
    for c in commits:
        w.add_commit(c)
    with pytest.raises(InvalidArgument, match=fragment):
        w.finish()


def test_writer_refuses_a_commit_twice_and_bad_times() -> None:
    w = LayerWriter(lambda b: None)
    w.add_commit(commit_info(1, 2))
    with pytest.raises(InvalidArgument, match="twice"):
        w.add_commit(commit_info(1, 2))
    with pytest.raises(InvalidArgument, match="i64"):
        w.add_commit(CommitInfo(ObjectId(oid(5)), ObjectId(oid(2)), (), 2**63, ()))


@pytest.mark.parametrize(
    "bad",
    [oid(3)[:19], oid(3) + b"\0", bytearray(oid(3)), memoryview(oid(3)), oid(3).hex(), None],
)
@pytest.mark.parametrize("where", ["parent", "segment"])
def test_writer_refuses_a_commit_naming_no_object_id(bad: object, where: str) -> None:
    """add_commit checks every parent and segment member at once (``_all_oids``, the
    push's path: a segment names each tree and blob stored) and one by one when that
    check fails, so a bad one among good ones is still refused and named."""
    w = LayerWriter(lambda b: None)
    good = tuple(ObjectId(oid(i)) for i in range(10, 20))
    named = (*good[:4], bad, *good[4:])
    parents, segment = (named, ()) if where == "parent" else ((), named)
    info = CommitInfo(ObjectId(oid(1)), ObjectId(oid(2)), parents, 0, segment)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="is not a 20-byte object id"):
        w.add_commit(info)
    w.add_commit(CommitInfo(ObjectId(oid(1)), ObjectId(oid(2)), (), 0, good))  # all good: taken


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"id_runs": [(0, 0), (2, 2)], "id_count": 4}, "leaves no hole"),
        ({"id_runs": [(1, 0)], "id_count": 4}, "start at local index 0"),
        ({"id_runs": [(0, 0), (3, 9)], "id_count": 4}, "ascend inside"),
        ({"id_runs": [(0, 0)], "id_count": 2}, "does not cover"),
        ({"id_runs": [(0, 0)]}, "needs its id runs"),
    ],
)
def test_merged_writer_refuses_bad_id_runs(kw: dict[str, object], fragment: str) -> None:
    w = LayerWriter(lambda b: None, merged=True)
    for n in range(3):
        w.add(full(oid(n), Kind.BLOB))
    with pytest.raises(InvalidArgument, match=fragment):
        w.finish(graph=[], **kw)  # type: ignore[arg-type]
    w.finish(id_runs=[(0, 0), (2, 5)], id_count=6, graph=[])  # still usable


@pytest.mark.parametrize(
    ("graph", "fragment"),
    [
        ([GraphCommit(5, 1, 1, 0, (), ()), GraphCommit(4, 1, 1, 0, (), ())], "must ascend"),
        ([GraphCommit(5, 1, 1, 0, (6,), ()), GraphCommit(6, 1, 1, 0, (), ())], "not older"),
        ([GraphCommit(5, 1, 2, 0, (), ()), GraphCommit(6, 1, 2, 0, (5,), ())], "generation"),
        ([GraphCommit(5, 1, 1, 0, (), (3, 2)), GraphCommit(6, 1, 2, 0, (), ())], "sorted"),
        ([GraphCommit(5, 1, 1, 0, (), ())], "graph has 1 commits"),
        ([GraphCommit(5, 1, 0, 0, (), ()), GraphCommit(6, 1, 1, 0, (), ())], "at least 1"),
    ],
)
def test_merged_writer_refuses_bad_graphs(graph: list[GraphCommit], fragment: str) -> None:
    w = LayerWriter(lambda b: None, merged=True)
    w.add(full(oid(1), Kind.COMMIT))
    w.add(full(oid(2), Kind.COMMIT))
    w.add_commit(commit_info(1, 9))
    w.add_commit(commit_info(2, 9, (1,)))
    with pytest.raises(InvalidArgument, match=fragment):
        w.finish(id_runs=[(0, 0)], id_count=2, graph=graph)


def test_pushed_writer_refuses_merged_arguments() -> None:
    w = LayerWriter(lambda b: None)
    with pytest.raises(InvalidArgument, match="pushed layer"):
        w.finish(id_runs=[(0, 0)], id_count=1)
    with pytest.raises(InvalidArgument, match="only merged"):
        w.finish(graph=[])


def test_limits_bound_the_writer_and_reader() -> None:
    w = LayerWriter(lambda b: None, limits=Limits(layer_objects_max=2))
    w.add(full(oid(1), Kind.BLOB))
    w.add(full(oid(2), Kind.BLOB))
    with pytest.raises(LimitExceeded):
        w.add(full(oid(3), Kind.BLOB))
    w = LayerWriter(lambda b: None, limits=Limits(delta_chain_depth_max=3))
    with pytest.raises(LimitExceeded):
        w.add(delta(oid(1), Kind.BLOB, oid(2), 4))
    data = GOLDEN["pushed"]
    with pytest.raises(LimitExceeded):
        LayerReader.open(BytesSource(data), limits=Limits(layer_meta_bytes_max=100))
    with pytest.raises(LimitExceeded):
        LayerReader.open(BytesSource(data), limits=Limits(layer_objects_max=5))


def test_streaming_sink_sees_entries_before_finish() -> None:
    parts: list[bytes] = []
    w = LayerWriter(parts.append)
    rng = random.Random(1)
    for _ in range(40):
        w.add(full(rng.randbytes(20), Kind.BLOB, rng.randbytes(50_000), 50_000))
    assert sum(map(len, parts)) >= CHUNK_BYTES  # flushed in 1 MiB blocks as entries come
    w.finish()
    LayerReader.open(BytesSource(b"".join(parts))).verify()


@pytest.mark.parametrize("merged", [False, True])
def test_later_contexts_and_finish_in_pieces(monkeypatch: pytest.MonkeyPatch, merged: bool) -> None:
    """A base context may name an object the layer stores after the entry (docs/formats/
    layer.md: the object through which it was first reached): the writer keeps its oid
    until finish, appended one by one or in runs (``append_many``), and the table's ref is
    that object's local index. The object table and the oid index built a few rows at a
    time (how finish bounds its memory) are the bytes built in larger pieces."""
    print(f"ENROUTE_SEED={SEED}")
    rng = random.Random(SEED)
    m = random_model(rng, 900, merged)
    free = [i for i, e in enumerate(m.entries[:-1]) if e.base_context is None]
    for i in rng.sample(free, min(len(free), 300)):
        later = rng.choice(m.entries[i + 1 :])
        m.entries[i] = replace(m.entries[i], base_context=later.oid)
    whole, r = write_model(m)
    check_model(m, r, rng)
    monkeypatch.setattr(writer_module, "_TABLE_ROWS", 7)
    monkeypatch.setattr(writer_module, "_INDEX_PAGES", 1)
    assert write_model(m)[0] == whole
    parts: list[bytes] = []
    w = LayerWriter(parts.append, merged=merged)
    for a in range(0, len(m.entries), 64):
        fields = [(e.oid, e.kind, e.entry, e.size, e.base, e.depth, e.base_context)
                  for e in m.entries[a : a + 64]]  # fmt: skip
        w.append_many(EntryRun(*(list(column) for column in zip(*fields, strict=True))))
    for c in m.commits:
        w.add_commit(c)
    w.finish(id_runs=m.id_runs, id_count=m.id_count, graph=m.graph)
    assert b"".join(parts) == whole


# -- small codecs ------------------------------------------------------------------------------


def test_layer_key_name() -> None:
    root = bytes(range(32))
    assert layer_key_name(0x2A, root) == "000000000000002a-000102030405060708090a0b0c0d0e0f.layer"


def test_bloom_reader_and_writer_agree() -> None:
    rng = random.Random(SEED)
    oids = [rng.randbytes(20) for _ in range(2000)]
    bits = bloom_bits_for(len(oids))
    assert bits == 20032 and bloom_bits_for(0) == 64 and bloom_bits_for(7) == 128
    filt = build_bloom(oids, bits)
    for probes in (7, 3):
        f = build_bloom(oids, bits, probes)
        assert all(bloom_may_contain(f, bits, probes, o) for o in oids)
    assert all(bloom_may_contain(filt, bits, 7, o) for o in oids)
    false = sum(bloom_may_contain(filt, bits, 7, rng.randbytes(20)) for _ in range(20000))
    assert false < 20000 * 0.02  # about 0.8% at 10 bits and 7 probes
    # Bit positions are (h1 + i*h2) mod m from the oid's bytes (docs/formats/layer.md).
    one = bytes(range(20))
    h1 = int.from_bytes(one[:8], "little")
    h2 = int.from_bytes(one[8:16], "little") | 1
    f = build_bloom([one], 64)
    want = 0
    for i in range(7):
        want |= 1 << ((h1 + i * h2) % 64)
    assert int.from_bytes(f, "little") == want


@pytest.mark.parametrize("count", [0, 1, 2, 7, 170, 2000])
def test_bloom_compiled_builds_what_the_reference_builds(count: int) -> None:
    """``build_bloom`` (compiled, enroute_native.layer_bloom) against ``build_bloom_py``:
    random oids, oids whose hashes sit at 2**64 - 1 (exact sums, no wrap), sizes on and
    off the 64-bit grain, every probe count up to the bound."""
    rng = random.Random(SEED + count)
    edge = [b"\xff" * 20, b"\xff" * 8 + b"\x00" * 12, b"\x00" * 8 + b"\xff" * 12, bytes(20)]
    oids = [rng.randbytes(20) for _ in range(count)] + edge[: min(count, 4)]
    for bits in {bloom_bits_for(len(oids)), 64, 64 * 1021}:
        for probes in (1, 2, 7, 13, 32):
            assert build_bloom(oids, bits, probes) == build_bloom_py(oids, bits, probes)
