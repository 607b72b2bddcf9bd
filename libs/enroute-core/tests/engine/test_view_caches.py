"""Views take the node's object and entry caches, charged to the buffer pool.

Seed 004, "Pages and memory": "object payloads stay in the object and entry
caches (variable size, keyed by object id), but they are charged to the same
budget"; "Why a pool": the object cache is 3/4 of node.cache, the entry cache
1/4, and the pool gives one global limit. The views read a real generated
repository pushed in three layers; the pool's pages come from a real file
read with ``os.pread``.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from enroute_core.base.limits import Limits
from enroute_core.config import load_config
from enroute_core.engine import view as view_module
from enroute_core.engine.view import ScanPages, View
from enroute_core.git import zstream
from enroute_core.git.pack import parse_entry_header
from enroute_core.state.model import LayerEntry
from enroute_core.storage.layer import Kind, LayerReader
from enroute_core.storage.layer.format import REF_NONE
from enroute_core.storage.pool import BufferPool, EntrySpill, Intent, NodeCaches
from enroute_testing.pushed import three_pushes
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo

pytestmark = pytest.mark.interop

KiB = 1024
MiB = 1024 * KiB
_SPEC = RepoSpec(seed=5, commits=40, branches=2, merge_every=5, files=24, file_bytes=1500)


@pytest.fixture(scope="module")
def layers(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[LayerEntry, LayerReader]]:
    repo: GeneratedRepo = generate_repo(tmp_path_factory.mktemp("caches") / "r.git", _SPEC)
    return three_pushes(repo)


def _fill_with_pages(pool: BufferPool, tmp_path: Path, size: int) -> None:
    """Every byte of the pool's budget in point-read pages of a real file."""
    path = tmp_path / "pages"
    path.write_bytes(os.urandom(size))
    fd = os.open(path, os.O_RDONLY)

    def load(offset: int, length: int, intent: Intent) -> bytes:
        return os.pread(fd, length, offset)

    f = pool.open_file("pages", size, load)
    for offset in range(0, size, 64 * KiB):
        pool.read(f, offset, 1, Intent.POINT)


def _ids(view: View) -> list[int]:
    return sorted(i for kind in Kind for i in view.kind_ids(kind))


def _read_everything(view: View) -> int:
    """Every body, and a full entry of every tree: bytes read."""
    total = 0
    for object_id in _ids(view):
        total += len(view.read_id(object_id))
    for object_id in view.kind_ids(Kind.TREE):
        total += len(view.full_entry(object_id))
    return total


def test_views_fill_the_node_caches_and_the_pool_evicts_pages(
    layers: list[tuple[LayerEntry, LayerReader]], tmp_path: Path
) -> None:
    """The caches grow into the pool's budget by evicting pages (a charge evicts by
    CLOCK); what they hold is charged, the pool never passes its budget, and each
    cache stays under its share of ``node.cache``."""
    pool = BufferPool(512 * KiB)
    _fill_with_pages(pool, tmp_path, 512 * KiB)
    assert pool.stats().page_bytes == 512 * KiB and pool.stats().charged_bytes == 0
    caches = NodeCaches(pool, 128 * KiB)
    assert (caches.objects.cap_bytes, caches.entries.cap_bytes) == (96 * KiB, 32 * KiB)
    view = View(layers, caches=caches)
    assert _read_everything(view) > 128 * KiB, "the caches must be filled past their caps"
    s = pool.stats()
    assert s.charged_bytes == caches.used_bytes > 64 * KiB
    assert caches.objects.used_bytes <= 96 * KiB and caches.entries.used_bytes <= 32 * KiB
    assert s.used_bytes <= s.budget_bytes
    assert s.evictions >= 2 and s.page_bytes <= 512 * KiB - s.charged_bytes
    # Least recently used first: the last body read is kept, the first one went.
    ids = _ids(view)
    assert caches.objects.get((1, ids[-1])) is not None
    assert caches.objects.get((1, ids[0])) is None


def test_views_of_one_lineage_share_the_caches(
    layers: list[tuple[LayerEntry, LayerReader]],
) -> None:
    """A pushed layer joining (or a compaction swapping layers) keeps the lineage's
    scope: what one view cached, the next one hits, and nothing is charged twice. A
    view built whole takes its own scope."""
    pool = BufferPool(8 * MiB)
    caches = NodeCaches(pool, 4 * MiB)
    first = View(layers[:2], caches=caches)
    ids = _ids(first)
    for object_id in ids:
        first.read_id(object_id)
    charged = pool.stats().charged_bytes
    hits = caches.objects.stats()["hits"]
    grown = first.with_layers((), layers[2:])
    for object_id in ids:
        assert grown.read_id(object_id) == first.read_id(object_id)
    assert caches.objects.stats()["hits"] >= hits + 2 * len(ids)
    assert pool.stats().charged_bytes == charged
    other = View(layers, caches=caches)
    misses = caches.objects.stats()["misses"]
    other.read_id(ids[0])
    assert caches.objects.stats()["misses"] > misses
    assert pool.stats().charged_bytes > charged


def test_node_cache_configures_the_caches() -> None:
    """``node.cache`` sizes the caches (3/4, 1/4); the pool's one budget is
    ``node.page_cache + node.cache`` (docs/buffer-pool.md)."""
    node = load_config("node:\n  cache: 8MiB\n  page_cache: 8MiB\n", {}).node
    assert node.pool_bytes == 16 * MiB
    pool = BufferPool(node.pool_bytes)
    caches = NodeCaches(pool, node.cache)
    assert caches.objects.cap_bytes == 6 * MiB and caches.entries.cap_bytes == 2 * MiB
    env = load_config(None, {"ENROUTE_NODE__CACHE": "1GiB"}).node
    assert env.pool_bytes == env.page_cache + 1024 * MiB
    stats = caches.stats()
    assert stats["objects"]["cap_bytes"] == 6 * MiB and stats["entries"]["used_bytes"] == 0


def _pooled(
    layers: list[tuple[LayerEntry, LayerReader]],
) -> tuple[View, BufferPool, NodeCaches]:
    """A view whose layers read through a pool of their own, with caches of their own."""
    pool = BufferPool(8 * MiB)
    caches = NodeCaches(pool, 4 * MiB)
    readers = [(e, LayerReader.open(r._source, pool=pool)) for e, r in layers]
    return View(readers, caches=caches), pool, caches


@pytest.mark.parametrize("scan_min", [64, 1 << 30])
def test_a_large_tree_walk_is_a_scan(
    layers: list[tuple[LayerEntry, LayerReader]], monkeypatch: pytest.MonkeyPatch, scan_min: int
) -> None:
    """Issue 25: a tree walk of ``SCAN_OBJECTS_MIN`` trees or more (a depth-1 clone of the
    `large` profile read 45,000 trees once, and kept 82 MiB of data pages and 146 MiB of
    bodies nobody read again) reads its entries through the pool (seed 004, "Intent
    steers eviction": a scan) and takes the bodies it cached back out when it ends; a
    smaller walk reads points, and its pages and bodies stay for the next read. Both
    answer what a walk without a pool answers."""
    monkeypatch.setattr(view_module, "SCAN_OBJECTS_MIN", scan_min)
    plain = View(layers)
    trees = list(plain.kind_ids(Kind.TREE))
    assert len(trees) >= 64
    view, pool, caches = _pooled(layers)
    assert view.tree_closure(trees) == plain.tree_closure(trees)
    kept = pool.stats().page_bytes
    if scan_min > len(trees):  # points: pages and bodies kept
        assert pool.stats().read_through_bytes == 0 and caches.objects.used_bytes > 0
        return
    assert pool.stats().read_through_bytes > 0
    assert caches.objects.used_bytes == 0 and caches.objects.stats()["misses"] >= len(trees)
    monkeypatch.setattr(view_module, "SCAN_OBJECTS_MIN", 1 << 30)
    point, point_pool, _ = _pooled(layers)
    point.tree_closure(trees)
    assert kept < point_pool.stats().page_bytes, "the entries' pages are not kept"


def test_a_large_tree_walk_reads_a_page_once(
    layers: list[tuple[LayerEntry, LayerReader]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large walk keeps the last data pages it read for itself (``_ScanPages``): read
    through the pool entry by entry, the `large` profile's depth-1 clone took 2.5 s more
    CPU (a pread through the pool for each of 55,000 entries). Here the three layers'
    entries lie in a few 64 KiB pages, so the walk's reads are a few, not one a tree."""
    monkeypatch.setattr(view_module, "SCAN_OBJECTS_MIN", 64)
    reads: list[tuple[int, int]] = []  # (reader, offset)
    data_bytes = LayerReader.data_bytes

    def counted(self: LayerReader, offset: int, length: int, intent: Intent | None = None) -> bytes:
        reads.append((id(self), offset))
        return data_bytes(self, offset, length, intent)

    plain = View(layers)
    trees = list(plain.kind_ids(Kind.TREE))
    expected = plain.tree_closure(trees)
    view, _, _ = _pooled(layers)
    monkeypatch.setattr(LayerReader, "data_bytes", counted)
    assert view.tree_closure(trees) == expected
    pages = {(reader, offset // (64 * KiB)) for reader, offset in reads}
    assert len(reads) <= 2 * len(pages) + 3 < len(trees) // 4, (len(reads), len(trees))


def test_a_full_entry_read_as_a_scan_keeps_the_entry_only(
    layers: list[tuple[LayerEntry, LayerReader]],
) -> None:
    """What a large pack resolves (``PackWriter``'s scan intent) keeps its deflated entry,
    which a repeated shallow fetch reads, and neither the bodies of its chain nor the
    pages they came from: a depth-1 clone of the `large` profile left 139 MiB of them
    in the object cache that no later read hit (issue 25). A point read keeps both."""
    plain = View(layers)
    located = {i: plain.locate(i) for i in _ids(plain)}
    deltas = [i for i, (r, local) in located.items() if r.entry_row(local)[2] != REF_NONE]
    assert deltas, "the layers hold deltas"
    scan, pool, caches = _pooled(layers)
    for object_id in deltas:
        assert scan.full_entry(object_id, Intent.SCAN) == plain.full_entry(object_id)
    assert caches.entries.used_bytes > 0 and caches.objects.used_bytes == 0
    assert pool.stats().read_through_bytes > 0
    point, point_pool, point_caches = _pooled(layers)
    for object_id in deltas:
        assert point.full_entry(object_id) == plain.full_entry(object_id)
    assert point_caches.objects.used_bytes > 0 and point_pool.stats().read_through_bytes == 0
    assert pool.stats().page_bytes < point_pool.stats().page_bytes


def test_a_packs_resolved_deltas_read_their_pages_once(
    layers: list[tuple[LayerEntry, LayerReader]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deltas a large pack resolves read their chains through the writer's own pages
    (``PackPlanner.pages``, a ``ScanPages``): a page per read, not a pread per entry of
    every chain, and the entries are the same."""
    plain = View(layers)
    located = {i: plain.locate(i) for i in _ids(plain)}
    deltas = [i for i, (r, local) in located.items() if r.entry_row(local)[2] != REF_NONE]
    expected = {i: plain.full_entry(i) for i in deltas}
    reads: list[tuple[int, int]] = []  # (reader, offset)
    data_bytes = LayerReader.data_bytes

    def counted(self: LayerReader, offset: int, length: int, intent: Intent | None = None) -> bytes:
        reads.append((id(self), offset))
        return data_bytes(self, offset, length, intent)

    view, _, caches = _pooled(layers)
    monkeypatch.setattr(LayerReader, "data_bytes", counted)
    pages = ScanPages()
    for object_id in deltas:
        assert view.full_entry(object_id, Intent.SCAN, pages) == expected[object_id]
    assert caches.objects.used_bytes == 0
    kept = {(reader, offset // (64 * KiB)) for reader, offset in reads}
    assert len(reads) <= 2 * len(kept) + 3 < len(deltas), (len(reads), len(deltas))


def test_a_resolved_delta_is_deflated_at_the_serve_level(
    layers: list[tuple[LayerEntry, LayerReader]],
) -> None:
    """A stored delta a fetch sends whole is deflated at ``serve_deflate_level``: nearly all
    of a depth-1 clone's CPU (docs/serving.md, "Rewritten deltas"). RFC 1950 section 2.2:
    a stream's second byte carries FLEVEL (0 fastest, 2 zlib's default, 6), so the
    level shows in the entry; each inflates to the object's body either way."""
    plain = View(layers)
    located = {i: plain.locate(i) for i in _ids(plain)}
    deltas = [i for i, (r, local) in located.items() if r.entry_row(local)[2] != REF_NONE]
    assert deltas, "the layers hold deltas"
    for level, flevel in ((None, 0), (1, 0), (6, 2), (9, 3)):
        limits = Limits() if level is None else Limits(serve_deflate_level=level)
        view = View(layers, limits=limits)
        for object_id in deltas:
            entry = view.full_entry(object_id, Intent.SCAN)
            hlen = parse_entry_header(entry, 0, 0)[2]
            assert entry[hlen + 1] >> 6 == flevel, (level, entry[hlen : hlen + 2].hex())
            assert zlib.decompress(entry[hlen:]) == plain.read_id(object_id)


def test_a_repeated_large_fetch_reads_its_rewritten_entries_from_the_spill(
    layers: list[tuple[LayerEntry, LayerReader]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The deltas a large pack resolves (a scan) are deflated once: a later view of the
    lineage, or of a new one built whole again, reads the same entries from the node's
    spill while the entry cache is too small to hold them (a repeated depth-1 clone of
    the `large` profile: 11 s of compute CPU, then 0.9 s; docs/serving.md). A point read
    does not write the spill."""
    plain = View(layers)
    located = {i: plain.locate(i) for i in _ids(plain)}
    deltas = [i for i, (r, local) in located.items() if r.entry_row(local)[2] != REF_NONE]
    expected = {i: plain.full_entry(i) for i in deltas}
    deflates: list[int] = []
    deflate = zstream.deflate

    def counted(data: bytes | memoryview, level: int = 6) -> bytes:
        deflates.append(len(data))
        return deflate(data, level)

    monkeypatch.setattr(view_module, "deflate", counted)
    spill = EntrySpill(str(tmp_path / "rewrites"), 64 * MiB, entry_bytes_min=1)
    caches = NodeCaches(BufferPool(8 * MiB), 0, spill)  # no entry cache at all
    point = View(layers, caches=caches)
    for object_id in deltas:
        assert point.full_entry(object_id) == expected[object_id]
    assert len(deflates) == len(deltas) and spill.stats()["entries"] == 0
    view = View(layers, caches=caches)
    for object_id in deltas:
        assert view.full_entry(object_id, Intent.SCAN) == expected[object_id]
    assert len(deflates) == 2 * len(deltas) and spill.stats()["entries"] == len(deltas)
    again = View(layers, caches=caches)  # a new scope reads its own keys
    for _ in range(2):
        for object_id in deltas:
            assert again.full_entry(object_id, Intent.SCAN) == expected[object_id]
        assert len(deflates) == 3 * len(deltas)
    assert spill.stats()["hits"] == len(deltas)
    again.forget_cached()  # a lineage gone takes the keys it remembers out of the spill
    kept = spill.stats()["entries"]
    assert len(deltas) <= kept < 2 * len(deltas)
    assert again.full_entry(deltas[0]) == expected[deltas[0]]
    assert spill.stats()["entries"] == kept  # a point read does not spill


def test_a_fetchs_names_and_tag_targets_are_remembered_within_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``named_id`` answers as ``id_of_oid`` and asks the layers once per oid; a tag's
    target is parsed once; both memos stay within ``_MEMO_MAX``."""
    spec = RepoSpec(seed=9, commits=12, files=6, file_bytes=200, annotated_tags=3)
    repo = generate_repo(tmp_path / "r.git", spec)
    view = View(three_pushes(repo))
    oids = [view.oid_of_id(i) for i in _ids(view)]
    asked: list[bytes] = []
    lookup = view_module._lookup

    def counted(layers: object, oid: bytes, kind: Kind | None = None) -> int | None:
        asked.append(oid)
        return lookup(layers, oid, kind)  # type: ignore[arg-type]

    monkeypatch.setattr(view_module, "_lookup", counted)
    for _ in range(2):
        assert [view.named_id(o) for o in oids] == [view.id_of_oid(o) for o in oids]
    assert view.named_id(b"\x01" * 20) is None and view.named_id(b"\x01" * 20) is None
    named = len(oids) + 1
    assert len(asked) == named + 2 * len(oids)  # named_id once per oid; id_of_oid each time
    tags = list(view.kind_ids(Kind.TAG))
    assert tags
    reads: list[int] = []
    read_id = View.read_id

    def read(self: View, object_id: int) -> bytes:
        reads.append(object_id)
        return read_id(self, object_id)

    monkeypatch.setattr(View, "read_id", read)
    targets = [view.tag_target(t) for t in tags]
    assert [view.tag_target(t) for t in tags] == targets and len(reads) == len(tags)
    monkeypatch.setattr(view_module, "_MEMO_MAX", len(view._ids) + 4)
    for i in range(10):  # ids of oids the view lacks, remembered too, never over the bound
        assert view.named_id(bytes([i + 2]) * 20) is None
        assert len(view._ids) <= len(oids) + 5
