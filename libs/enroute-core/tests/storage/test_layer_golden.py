"""Golden layers: the writer reproduces the committed bytes, the reader reads back the
inputs, and every flipped byte or cut prefix is a CorruptData naming its section.

Seed 004, "Layers" (format, "Chunk hashes verify any chunk on its own": the
chunk hashes check everything before the index region, the crc32s the rest)
and "Stable object numbering" (id runs). Regenerate the vectors with
``python tests/storage/golden/make_golden.py`` (docs/formats/layer.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import struct
import sys
import zlib
from pathlib import Path
from types import ModuleType

import blake3
import pytest

from enroute_core.base.errors import CorruptData
from enroute_core.git.delta import apply_delta
from enroute_core.git.pack import parse_entry_header
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer import REF_EXTERNAL, REF_NONE, Kind, LayerReader
from enroute_core.storage.layer.format import FOOTER_BYTES, MAGIC

GOLDEN = Path(__file__).resolve().parent / "golden"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_golden"] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
NAMES = ["pushed.layer", "merged.layer"]
# Every hashed section of each golden file lies in chunk 0 (they are small).
CHUNK0_SECTIONS = {
    "pushed.layer": "data region, object table, oid index, external oids, commit section",
    "merged.layer": (
        "data region, object table, oid index, external oids, commit section, commit graph"
    ),
}


def _golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


def _open(data: bytes, meta_size: int | None = None) -> LayerReader:
    return LayerReader.open(BytesSource(data), meta_size=meta_size)


@pytest.mark.parametrize("name", NAMES)
def test_writer_reproduces_the_committed_bytes(name: str) -> None:
    data, sealed = gen.GOLDENS[name]().write()
    assert data == _golden(name), f"{name} changed: regenerate and review (make_golden.py)"
    assert sealed.root == blake3.blake3(data).digest()
    assert sealed.file_size == len(data)


@pytest.mark.parametrize("name", NAMES)
def test_footer_bytes_are_where_the_layout_says(name: str) -> None:
    """Hand-computed layout: docs/formats/layer.md, "Sections"."""
    data = _golden(name)
    g = gen.GOLDENS[name]()
    assert data[-8:] == MAGIC
    footer = data[-FOOTER_BYTES:]
    offsets = struct.unpack_from("<7Q", footer)
    data_end = sum(len(e.entry) for e in g.entries)
    n = len(g.entries)
    assert offsets[0] == data_end
    assert offsets[1] == 4096  # data region < 4 KiB, padded
    assert offsets[2] == 4096 + ((n * 52 + 4095) // 4096) * 4096
    assert offsets[3] == offsets[2] + 4096  # fewer than 170 objects: one index page
    assert offsets[4] == offsets[3] + 20 * len(g.external)
    assert data[offsets[0] : offsets[1]] == bytes(offsets[1] - offsets[0])
    assert zlib.crc32(footer[:120]) == int.from_bytes(footer[120:124], "little")
    region = data[offsets[6] : -FOOTER_BYTES]
    assert zlib.crc32(region) == int.from_bytes(footer[116:120], "little")
    assert region[-32:] == hashlib.sha256(data[: offsets[6]]).digest()  # one chunk


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("use_meta_size", [False, True])
def test_reader_reads_back_the_inputs(name: str, use_meta_size: bool) -> None:
    g = gen.GOLDENS[name]()
    data, sealed = g.write()
    r = _open(data, sealed.meta_size if use_meta_size else None)
    r.verify()
    assert r.object_count == len(g.entries)
    assert r.is_merged == g.merged
    assert r.meta_size == sealed.meta_size
    assert r.external_oids == g.external
    counts = [0, 0, 0, 0]
    for i, e in enumerate(g.entries):
        counts[e.kind] += 1
        assert r.lookup(e.oid) == i
        assert r.lookup(e.oid, e.kind) == i
        assert r.kind_of(i) == e.kind
        rec = r.record(i)
        assert (rec.oid, rec.size, rec.depth, rec.length) == (e.oid, e.size, e.depth, len(e.entry))
        assert r.entry_bytes(i) == e.entry
        if e.base is None:
            assert rec.base_ref == REF_NONE
        else:
            assert r.ref_oid(rec.base_ref) == e.base
        if e.base_context is None:
            assert rec.base_context_ref == REF_NONE
        else:
            assert r.ref_oid(rec.base_context_ref) == e.base_context
    assert r.kind_counts == tuple(counts)
    for oid in g.external:
        assert r.lookup(oid) is None
    infos = list(r.commit_infos())
    assert [c.oid for c in infos] == [c.oid for c in g.commits]
    for got, want in zip(infos, g.commits, strict=True):
        assert (got.tree, got.parents, got.time) == (want.tree, want.parents, want.time)
        assert sorted(got.segment) == sorted(set(want.segment))


def _inflate_object(r: LayerReader, i: int, objects: dict[bytes, bytes]) -> bytes:
    entry = r.entry_bytes(i)
    ptype, size, hlen, _, base_oid = parse_entry_header(entry, 0, 0)
    if ptype == 7:
        assert base_oid is not None
        return apply_delta(objects[base_oid], zlib.decompress(entry[hlen:]))
    body = zlib.decompress(entry[hlen:])
    assert len(body) == size
    return body


@pytest.mark.parametrize("name", NAMES)
def test_entries_are_real_pack_entries(name: str) -> None:
    """Inflating (and resolving REF_DELTAs) gives bodies that hash to their oids."""
    g = gen.GOLDENS[name]()
    r = _open(_golden(name))
    objects: dict[bytes, bytes] = {gen.OLD_BASE.oid: gen.OLD_BASE.body}
    type_names = {Kind.COMMIT: b"commit", Kind.TREE: b"tree", Kind.BLOB: b"blob", Kind.TAG: b"tag"}
    for i, e in enumerate(g.entries):
        body = _inflate_object(r, i, objects)
        header = type_names[e.kind] + b" %d\0" % len(body)
        assert hashlib.sha1(header + body).digest() == e.oid
        assert len(body) == e.size
        objects[e.oid] = body


def test_pushed_golden_refs_and_ids() -> None:
    r = _open(_golden("pushed.layer"))
    assert r.id_runs == ((0, 0),)
    assert r.id_count == r.object_count == 10
    assert [r.id_of(i) for i in range(10)] == list(range(10))
    assert r.local_of(10) is None
    assert r.commit_graph() is None
    assert r.kind_runs == (
        (0, 2, Kind.COMMIT),
        (2, 5, Kind.TREE),
        (5, 9, Kind.BLOB),
        (9, 10, Kind.TAG),
    )
    c1, c2 = r.commits()
    ext = {oid: REF_EXTERNAL | j for j, oid in enumerate(r.external_oids)}
    assert c1.parent_refs == (ext[gen.OLD_COMMIT],)
    assert c1.segment_refs == (0, 2, 3, 5, 6)
    assert c2.parent_refs == (0,)
    assert c2.segment_refs == (1, 4, 7, 8, ext[gen.OLD_BLOB.oid])  # sorted, deduplicated
    b4 = r.record(8)
    assert b4.base_ref == ext[gen.OLD_BASE.oid] and b4.depth == 2


def test_merged_golden_id_runs_and_graph() -> None:
    r = _open(_golden("merged.layer"))
    assert r.id_runs == ((0, 0), (6, 7))
    assert r.id_count == 10 and r.object_count == 8
    assert [r.id_of(i) for i in range(8)] == [0, 1, 2, 3, 4, 5, 7, 8]
    assert [r.local_of(x) for x in range(11)] == [0, 1, 2, 3, 4, 5, None, 6, 7, None, None]
    assert [k for _, _, k in r.kind_runs] == [0, 1, 2, 0, 1, 2, 3]
    graph = r.commit_graph()
    assert graph is not None and len(graph) == 2
    assert list(graph.commit_ids) == [100, 104]
    assert graph.rank_of(104) == 1 and graph.rank_of(105) is None
    assert graph.commit(1) == gen.merged().graph[1]
    assert list(graph.parents(1)) == [100] and list(graph.segment(1)) == [42, 104, 105, 107]


# -- corruption -------------------------------------------------------------------------------


def _expected_section(data: bytes, name: str, pos: int) -> str:
    index_region_off = struct.unpack_from("<Q", data, len(data) - FOOTER_BYTES + 48)[0]
    if pos >= len(data) - FOOTER_BYTES:
        return "footer"
    if pos >= index_region_off:
        return "index region"
    return CHUNK0_SECTIONS[name]


def _open_and_verify(data: bytes, meta_size: int | None) -> None:
    r = _open(data, meta_size)
    r.verify()


@pytest.mark.parametrize("name", NAMES)
def test_every_flipped_byte_names_its_section(name: str) -> None:
    data = _golden(name)
    meta_size = len(data) - struct.unpack_from("<Q", data, len(data) - FOOTER_BYTES)[0]
    buf = bytearray(data)
    for pos in range(len(data)):
        buf[pos] ^= 0xFF
        want = _expected_section(data, name, pos)
        modes = (None, meta_size) if pos % 5 == 0 or pos >= len(data) - 400 else (None,)
        for mode in modes:
            with pytest.raises(CorruptData) as info:
                _open_and_verify(bytes(buf), mode)
            assert info.value.section == want, (pos, mode, info.value.message)
            if want == CHUNK0_SECTIONS[name]:
                assert info.value.details["chunk"] == 0
        buf[pos] ^= 0xFF


@pytest.mark.parametrize("name", NAMES)
def test_every_cut_prefix_is_corrupt(name: str) -> None:
    data = _golden(name)
    meta_size = len(data) - struct.unpack_from("<Q", data, len(data) - FOOTER_BYTES)[0]
    for cut in range(len(data)):
        for mode in (None, meta_size):
            with pytest.raises(CorruptData) as info:
                _open_and_verify(data[:cut], mode)
            assert info.value.section == "footer"


@pytest.mark.parametrize("name", NAMES)
def test_trailing_bytes_are_corrupt(name: str) -> None:
    """A layer is exactly its bytes: anything after the magic breaks the footer."""
    data = _golden(name)
    for tail in (b"\0", b"ENRLAYR1", data[-FOOTER_BYTES:]):
        try:
            _open_and_verify(data + tail, None)
        except CorruptData as err:
            assert err.section in {"footer", "index region"} or "chunk" in err.details
        else:
            raise AssertionError(f"trailing {tail[:8]!r} was accepted")
