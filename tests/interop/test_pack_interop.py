"""Packs against the real git CLI (gitformat-pack.txt; git-index-pack, git-verify-pack).

1. Packs from ``git pack-objects`` (OFS_DELTA, REF_DELTA, thin) resolve to
   exactly what ``git verify-pack -v`` reports: oid, type, size, size in
   pack, offset, depth and delta base, entry by entry.
2. Packs we write (full objects and deltas, OFS and REF) pass
   ``git index-pack --strict`` / ``git unpack-objects --strict`` and then
   ``git fsck --strict`` once the refs point at them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from enroute_core.base.errors import MissingObject
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.git.objects import ObjectType
from enroute_core.git.pack import OBJ_OFS_DELTA, OBJ_REF_DELTA, iter_entries
from enroute_core.git.packindexer import PackIndexResult, index_pack
from enroute_core.git.packwrite import worthwhile_delta, write_pack
from enroute_core.git.source import BytesSource
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import (
    GeneratedRepo,
    RepoSpec,
    VerifyPackEntry,
    all_objects,
    generate_repo,
    pack_objects,
    verify_pack,
)

pytestmark = pytest.mark.interop

SPEC = RepoSpec(
    seed=11,
    commits=150,
    files=40,
    branches=2,
    merge_every=6,
    binary_files=2,
    large_file_bytes=600_000,  # zlib streams longer than a read window
)
ENTRY_TYPE_NAMES = {
    1: b"commit",
    2: b"tree",
    3: b"blob",
    4: b"tag",
    OBJ_OFS_DELTA: b"ofs-delta",
    OBJ_REF_DELTA: b"ref-delta",
}

Store = dict[ObjectId, tuple[int, bytes]]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("pack-interop") / "repo.git", SPEC)


@pytest.fixture(scope="module")
def store(repo: GeneratedRepo) -> Store:
    return {
        oid_from_hex(oid): (int(ObjectType.from_name(kind)), body)
        for oid, kind, body in all_objects(repo.path)
    }


def _as_verify_pack(result: PackIndexResult) -> list[VerifyPackEntry]:
    return [
        VerifyPackEntry(
            oid=o.oid.hex().encode(),
            type=ObjectType(o.type_num).type_name,
            size=o.size,
            size_in_pack=o.size_in_pack,
            offset=o.offset,
            depth=o.depth,
            base_oid=o.base_oid.hex().encode() if o.base_oid is not None else None,
            pack_type=ENTRY_TYPE_NAMES[o.entry_type],
        )
        for o in result.objects
    ]


@pytest.mark.parametrize("ofs_delta", [True, False], ids=["ofs", "ref"])
def test_full_pack_matches_verify_pack(
    repo: GeneratedRepo, tmp_path: Path, ofs_delta: bool
) -> None:
    pack = pack_objects(repo.path, ofs_delta=ofs_delta)
    result = index_pack(BytesSource(pack))
    expected = verify_pack(pack, tmp_path)
    assert _as_verify_pack(result) == expected
    kinds = {e.pack_type for e in expected}
    assert (b"ofs-delta" if ofs_delta else b"ref-delta") in kinds
    assert max(e.depth for e in expected) >= 2
    assert result.checksum == pack[-20:]
    assert result.external_bases == ()
    # Streams that cross read windows: same entries with a 64 KiB window.
    small = list(iter_entries(BytesSource(pack), window_bytes=64 * 1024))
    assert [(e.offset, e.end, e.data) for e in small] == [
        (e.offset, e.end, e.data) for e in iter_entries(BytesSource(pack))
    ]
    assert max(e.compressed_length for e in small) > 64 * 1024


@pytest.mark.parametrize("ofs_delta", [True, False], ids=["ofs", "ref"])
def test_thin_pack_matches_verify_pack_fix_thin(
    repo: GeneratedRepo, store: Store, tmp_path: Path, ofs_delta: bool
) -> None:
    pack = pack_objects(
        repo.path, thin=True, ofs_delta=ofs_delta, revs=["main"], exclude=["main~25"]
    )
    asked: list[ObjectId] = []

    def lookup(oid: ObjectId) -> tuple[int, bytes] | None:
        asked.append(oid)
        return store.get(oid)

    result = index_pack(BytesSource(pack), external_base=lookup)
    # index-pack --fix-thin appends the missing bases after our entries.
    fixed = verify_pack(pack, tmp_path, fix_thin_from=repo.path)
    ours = [e for e in fixed if e.offset < len(pack) - 20]
    appended = {e.oid for e in fixed if e.offset >= len(pack) - 20}
    assert _as_verify_pack(result) == ours
    assert appended, "the pack should be thin"
    assert {oid.hex().encode() for oid in result.external_bases} == appended
    assert len(result.external_bases) == len(appended)
    assert set(result.external_bases) <= set(asked)


def test_thin_pack_without_its_bases_is_missing_objects(repo: GeneratedRepo) -> None:
    pack = pack_objects(repo.path, thin=True, revs=["main"], exclude=["main~25"])
    with pytest.raises(MissingObject):
        index_pack(BytesSource(pack), external_base=lambda oid: None)


@pytest.fixture(scope="module")
def our_packs(store: Store) -> dict[bool, tuple[bytes, PackIndexResult]]:
    """Packs we write from the repository's objects, keyed by ``ofs_delta``."""
    # Same type and similar size next to each other, so the window finds deltas.
    items = sorted(store.values(), key=lambda item: (item[0], len(item[1])))
    packs = {}
    for ofs_delta in (True, False):
        pack = write_pack(items, delta=worthwhile_delta, ofs_delta=ofs_delta, window=4)
        result = index_pack(BytesSource(pack))
        assert {o.oid for o in result.objects} == set(store)
        kind = OBJ_OFS_DELTA if ofs_delta else OBJ_REF_DELTA
        assert sum(o.entry_type == kind for o in result.objects) > len(store) // 10
        packs[ofs_delta] = (pack, result)
    return packs


def _fsck_with_refs(bare: Path, repo: GeneratedRepo) -> None:
    for name, oid in repo.refs.items():
        run_git(["update-ref", name.decode(), oid.decode()], cwd=bare)
    run_git(["fsck", "--strict", "--no-dangling", "--full"], cwd=bare)


@pytest.mark.parametrize("ofs_delta", [True, False], ids=["ofs", "ref"])
def test_our_pack_passes_index_pack_strict_and_fsck(
    repo: GeneratedRepo,
    our_packs: dict[bool, tuple[bytes, PackIndexResult]],
    tmp_path: Path,
    ofs_delta: bool,
) -> None:
    pack, result = our_packs[ofs_delta]
    bare = tmp_path / "target.git"
    bare.mkdir()
    run_git(["init", "-q", "--bare", "."], cwd=bare)
    out = run_git(["index-pack", "--strict", "--stdin"], cwd=bare, input=pack)
    assert out.split()[-1].decode() == result.checksum.hex()
    listing = verify_pack(pack, tmp_path)
    assert _as_verify_pack(result) == listing
    _fsck_with_refs(bare, repo)


def test_our_pack_passes_unpack_objects_strict(
    repo: GeneratedRepo, our_packs: dict[bool, tuple[bytes, PackIndexResult]], tmp_path: Path
) -> None:
    pack, _ = our_packs[False]
    bare = tmp_path / "loose.git"
    bare.mkdir()
    run_git(["init", "-q", "--bare", "."], cwd=bare)
    run_git(["unpack-objects", "--strict", "-q"], cwd=bare, input=pack)
    _fsck_with_refs(bare, repo)
