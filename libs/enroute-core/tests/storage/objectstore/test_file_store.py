"""The file:// store: key encoding, ETags on disk, corruption, links and leftovers.

Seed 004, "Linked local copies" (hard links, EXDEV turns linking off) and
``docs/objectstore.md``, "file:// layout" (the key encoding).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData, InvalidPath, NotFound, Unavailable
from enroute_core.storage.objectstore import FileStore, StoreOptions
from enroute_core.storage.objectstore.base import check_key, md5_etag
from enroute_core.storage.objectstore.file import (
    NAME_CHUNK_BYTES_MAX,
    XATTR_ETAG,
    decode_components,
    encode_key,
)

SEED = int(os.environ.get("ENROUTE_SEED", "0")) or random.SystemRandom().randrange(1, 2**32)


def test_encoding_examples() -> None:
    assert encode_key("repos/My.Repo/state") == ["repos", "%4Dy.%52epo", "state~"]
    assert encode_key("a/.git/x y") == ["a", "%2Egit", "x%20y~"]
    assert encode_key("a/b~c+d%e") == ["a", "b%7Ec%2Bd%25e~"]
    assert encode_key("\u00fc") == ["%C3%BC~"]
    long = encode_key("r/" + "l" * 256 + "/state")
    assert long == ["r", "l" * 240 + "+", "l" * 16, "state~"]
    # a multi-byte character is never cut inside its %XX triplets' run of bytes
    wide = encode_key("\u00fc" * 128)
    assert all(len(c) <= NAME_CHUNK_BYTES_MAX + 1 for c in wide)
    assert all(not c.startswith(".") for c in wide)


def test_decode_refuses_foreign_names() -> None:
    for components in (
        ["README"],  # no object mark
        ["a", "B~"],  # upper case is always escaped
        ["a~", "b~"],  # an object mark before the end
        ["%zz~"],
        ["%4~"],
        ["a%61~"],  # escapes a letter it keeps
        [".tmp-1-2"],
    ):
        assert decode_components(components) is None, components


segment = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/"),
    min_size=1,
    max_size=300,
).filter(lambda s: s not in (".", ".."))


@settings(max_examples=150, deadline=None)
@given(st.lists(segment, min_size=1, max_size=4))
def test_encoding_round_trips_and_fits_names(segments: list[str]) -> None:
    key = "/".join(segments)
    try:
        check_key(key)
    except InvalidPath:
        return
    components = encode_key(key)
    assert decode_components(components) == key
    for c in components:
        assert 0 < len(c.encode()) <= 255
        assert not c.startswith(".")
        assert re.fullmatch(r"(?:[a-z0-9_.-]|%[0-9A-F]{2})+[~+]?", c), c


PARTS = ["a", "A", "a-b", "a.b", "\u00fc", "b" * 250, "z"]


@settings(max_examples=25, deadline=None)
@given(st.sets(st.lists(st.sampled_from(PARTS), min_size=1, max_size=3).map("/".join),
               min_size=1, max_size=12))  # fmt: skip
def test_listing_order_is_byte_order(
    tmp_path_factory: pytest.TempPathFactory, keys: set[str]
) -> None:
    store = FileStore(tmp_path_factory.mktemp("order"), StoreOptions(fsync=False))

    async def run() -> list[str]:
        for key in keys:
            await store.put(key, b"")
        listed: list[str] = []
        after = None
        for _ in range(len(keys) + 1):
            page = await store.list("", start_after=after, limit=2)
            listed += [i.key for i in page.items]
            if page.next_start_after is None:
                return listed
            after = page.next_start_after
        raise AssertionError("listing did not end")

    assert asyncio.run(run()) == sorted(keys, key=str.encode)


@pytest.mark.asyncio
async def test_etag_is_kept_beside_the_bytes(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    etag = await store.put("repos/r/state", b"state")
    path = store.path_of("repos/r/state")
    assert os.getxattr(path, XATTR_ETAG).decode() == etag == md5_etag(b"state")
    assert os.stat(path).st_mode & 0o777 == 0o444


@pytest.mark.asyncio
async def test_without_xattrs_the_etag_is_computed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store._xattr = False  # as on a filesystem without user xattrs
    etag = await store.put("k", b"bytes")
    with pytest.raises(OSError):
        os.getxattr(store.path_of("k"), XATTR_ETAG)
    info = await store.head("k")
    assert info is not None and info.etag == etag == md5_etag(b"bytes")
    assert (await store.put("k", b"v2", if_match=etag)) == md5_etag(b"v2")


@pytest.mark.asyncio
async def test_corrupt_stored_bytes(tmp_path: Path) -> None:
    """A flipped byte on disk: whole reads fail their ETag, ranged reads return it as is
    (the layer's chunk hashes catch those), and only the typed error escapes."""
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    store = FileStore(tmp_path)
    data = rng.randbytes(4096)
    await store.put("layer", data)
    path = store.path_of("layer")
    os.chmod(path, 0o644)
    for _ in range(8):
        offset = rng.randrange(len(data))
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(bytes([data[offset] ^ 0xFF]))
        with pytest.raises(CorruptData):
            await store.get("layer")
        with pytest.raises(CorruptData):
            await store.get_with_etag("layer")
        got = await store.get("layer", start=offset, end=offset + 1)
        assert got == bytes([data[offset] ^ 0xFF])
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(bytes([data[offset]]))
    assert await store.get("layer") == data


@pytest.mark.asyncio
async def test_foreign_files_are_not_listed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("a/b", b"x")
    (tmp_path / "README").write_text("not an object")
    (tmp_path / "a" / "c").write_text("no object mark")
    (tmp_path / "a" / "Upper~").write_text("not an encoding the store makes")
    (tmp_path / "a" / ".tmp-1-1").write_text("a crashed write")
    os.symlink(tmp_path / "a" / "b~", tmp_path / "a" / "link~")
    page = await store.list("", limit=100)
    assert [i.key for i in page.items] == ["a/b"]


@pytest.mark.asyncio
async def test_delete_prunes_empty_directories(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("repos/x/layers/1.layer", b"1")
    await store.put("repos/y/state", b"s")
    await store.delete("repos/x/layers/1.layer")
    assert not (tmp_path / "repos" / "x").exists()
    assert (tmp_path / "repos" / "y").exists()
    await store.put("repos/x/layers/2.layer", b"2")  # the directories come back
    assert await store.get("repos/x/layers/2.layer") == b"2"


@pytest.mark.asyncio
async def test_put_file_copies_and_leaves_the_source(tmp_path: Path) -> None:
    source = tmp_path / "scratch.layer"
    source.write_bytes(b"layer" * 1000)
    store = FileStore(tmp_path / "store")
    etag = await store.put_file("repos/r/layers/a.layer", source)
    assert etag == md5_etag(b"layer" * 1000)
    assert os.stat(source).st_ino != os.stat(store.path_of("repos/r/layers/a.layer")).st_ino
    with pytest.raises(NotFound):
        await store.get("repos/r/layers/b.layer")


@pytest.mark.asyncio
async def test_exdev_turns_linking_off(tmp_path: Path) -> None:
    """Seed 004: "EXDEV (the store on another filesystem) turns linking off"."""
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to link across")
    store = FileStore(tmp_path)
    await store.put("layer", b"bytes")
    dest = other / f"enroute-link-test-{os.getpid()}"
    try:
        assert await store.link_local("layer", dest) is False
        assert not dest.exists()
        assert store.linking is False
        # off for good: even a link that would work is not tried again
        assert await store.link_local("layer", tmp_path / "same-fs") is False
        assert not (tmp_path / "same-fs").exists()
    finally:
        if dest.exists():
            dest.unlink()


@pytest.mark.asyncio
async def test_link_to_an_existing_name_falls_back(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    await store.put("layer", b"bytes")
    dest = tmp_path / "taken"
    dest.write_bytes(b"other")
    assert await store.link_local("layer", dest) is False
    assert store.linking is True  # only EXDEV turns linking off


@pytest.mark.asyncio
async def test_os_errors_are_typed(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    store = FileStore(blocker)
    with pytest.raises(Unavailable) as caught:
        await store.put("k", b"v")
    assert caught.value.details["errno"] in ("ENOTDIR", "EEXIST")
    good = FileStore(tmp_path / "store")
    with pytest.raises(Unavailable):
        await good.put_file("k", tmp_path / "missing-source")
    assert [p.name for p in (tmp_path / "store").rglob(".tmp*")] == []
