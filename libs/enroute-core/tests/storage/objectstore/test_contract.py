"""The ObjectStore contract, run against file://, moto and SeaweedFS over real HTTP.

DESIGN, "Object store layout": state objects change only by compare-and-swap
(If-None-Match: * to create, If-Match to replace); the file:// store gives the
same guarantees. Each test states one guarantee of ``docs/objectstore.md``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidArgument, InvalidPath, NotFound, PreconditionFailed
from enroute_core.storage.objectstore import FileStore, ObjectStore
from enroute_core.storage.objectstore.base import MiB, md5_etag
from enroute_testing.s3servers import S3Endpoint, pending_uploads

pytestmark = pytest.mark.asyncio
BACKENDS = ["file", "moto", "seaweedfs"]
BUCKET = "enroute-test"  # the bucket conftest.py creates
StoreFactory = Callable[..., Awaitable[ObjectStore]]


async def list_all(store: ObjectStore, prefix: str, page: int) -> list[str]:
    keys: list[str] = []
    after: str | None = None
    for _ in range(100):
        result = await store.list(prefix, start_after=after, limit=page)
        assert len(result.items) <= page
        keys.extend(i.key for i in result.items)
        if result.next_start_after is None:
            return keys
        after = result.next_start_after
    raise AssertionError("listing did not end")


async def test_put_get_head_delete(store: ObjectStore) -> None:
    data = b"state object \x00\xff bytes"
    etag = await store.put("repos/a/state", data)
    assert etag.strip('"') == md5_etag(data).strip('"')  # single-part ETag is the MD5
    assert await store.get("repos/a/state") == data
    assert await store.get_with_etag("repos/a/state") == (data, etag)
    info = await store.head("repos/a/state")
    assert info is not None
    assert (info.key, info.size, info.etag) == ("repos/a/state", len(data), etag)
    assert abs(info.last_modified_us / 1e6 - time.time()) < 3600
    await store.delete("repos/a/state")
    assert await store.head("repos/a/state") is None
    with pytest.raises(NotFound):
        await store.get("repos/a/state")
    with pytest.raises(NotFound):
        await store.get_with_etag("repos/a/state")
    await store.delete("repos/a/state")  # deleting a missing key is fine


async def test_empty_object_and_overwrite(store: ObjectStore) -> None:
    first = await store.put("k", b"")
    assert await store.get("k") == b""
    assert await store.get("k", start=0, end=0) == b""
    second = await store.put("k", b"new")
    assert first != second
    assert await store.get_with_etag("k") == (b"new", second)


RANGES = [
    (0, None), (0, 1), (0, 1000), (1, 999), (500, 501), (999, 1000), (999, None),
    (250, 250), (998, 2000), (1000, None), (1000, 1001), (5000, None), (5000, 6000),
    (None, 10),
]  # fmt: skip


async def test_ranged_get_is_a_slice(store: ObjectStore) -> None:
    data = random.Random(4).randbytes(1000)
    await store.put("layer", data)
    for start, end in RANGES:
        got = await store.get("layer", start=start, end=end)
        assert got == data[start or 0 : end], (start, end)


async def test_ranged_get_of_missing_key(store: ObjectStore) -> None:
    for start, end in [(0, 10), (5, 5), (3, None)]:
        with pytest.raises(NotFound):
            await store.get("nothing", start=start, end=end)


async def test_bad_arguments_are_typed(store: ObjectStore) -> None:
    for key in ["", "/a", "a/", "a//b", "a/./b", "a/../b", "a\nb", "x" * 1025, "\udc80"]:
        with pytest.raises(InvalidPath):
            await store.put(key, b"x")
    with pytest.raises(InvalidArgument):
        await store.get("k", start=5, end=4)
    with pytest.raises(InvalidArgument):
        await store.get("k", start=-1)
    with pytest.raises(InvalidArgument):
        await store.put("k", b"x", if_none_match=True, if_match='"abc"')
    with pytest.raises(InvalidArgument):
        await store.list("", limit=0)
    with pytest.raises(InvalidArgument):
        await store.list("", limit=1001)


KEYS = [
    "a", "a/1", "a/10", "a/2", "a/b/c", "a-b", "ab", "b", "A/B", "a/\u00fc", "a/\u00fcx/y",
    "a/" + "l" * 250, "a/" + "l" * 250 + "/z", "a/.dot", "a/%41",
]  # fmt: skip


async def test_list_is_lexicographic_and_paginates(
    store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    # SeaweedFS lists directory by directory ("a/..." before "a-b"): complete and
    # stable, but not byte order (docs/objectstore.md, "Listing")
    exact = request.node.callspec.params["store"] != "seaweedfs"
    for key in KEYS:
        await store.put(key, key.encode())
    by_bytes = sorted(KEYS, key=lambda k: k.encode())
    full = await list_all(store, "", page=1000)
    assert sorted(full, key=str.encode) == by_bytes
    assert full == by_bytes or not exact
    for page in (1, 2, 3):
        assert await list_all(store, "", page=page) == full, page
    for prefix in ["a/", "a", "a/l", "b", "A", "zzz", "a/\u00fc"]:
        expected = [k for k in by_bytes if k.startswith(prefix)]
        got = await list_all(store, prefix, page=2)
        assert got == [k for k in full if k.startswith(prefix)], prefix
        assert sorted(got, key=str.encode) == expected, prefix
    result = await store.list("a/1", limit=1000)
    assert [(i.key, i.size) for i in result.items] == [("a/1", 3), ("a/10", 4)]
    assert all(i.etag == md5_etag(i.key.encode()) for i in result.items)
    if not exact:
        return
    for after in ["a/1", "a/", "a-", "a", "a/b", "a/zz", "0", "\u00ff"]:
        result = await store.list("", start_after=after, limit=1000)
        assert [i.key for i in result.items] == [k for k in by_bytes if k > after], after


@pytest.mark.parametrize("backend", BACKENDS)
async def test_long_segments(backend: str, make_store: StoreFactory) -> None:
    """Repository names (inner segments) may be 256 bytes and more; SeaweedFS takes at most
    255 bytes in the last segment, which the layout keeps short."""
    store = await make_store(backend)
    keys = ["r/" + "l" * 255, "r/" + "\u00fc" * 128 + "/state", "r/" + "m" * 600 + "/state"]
    for key in keys:
        await store.put(key, b"x")
    assert await list_all(store, "r/", page=1) == sorted(keys, key=str.encode)
    long_key = "r/" + "l" * 256
    if backend == "seaweedfs":
        with pytest.raises(InvalidPath):
            await store.put(long_key, b"y")
    else:
        await store.put(long_key, b"y")
        assert await store.get(long_key) == b"y"


async def test_if_none_match_creates_once(store: ObjectStore) -> None:
    etag = await store.put("repos/r/state", b"v1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await store.put("repos/r/state", b"v2", if_none_match=True)
    assert await store.get_with_etag("repos/r/state") == (b"v1", etag)


async def test_if_match_replaces_only_the_current_etag(store: ObjectStore) -> None:
    e1 = await store.put("repos/r/state", b"v1", if_none_match=True)
    e2 = await store.put("repos/r/state", b"v2", if_match=e1)
    with pytest.raises(PreconditionFailed):
        await store.put("repos/r/state", b"v3", if_match=e1)  # stale
    assert await store.get("repos/r/state") == b"v2"
    e3 = await store.put("repos/r/state", b"v3", if_match=e2.strip('"'))  # quotes do not matter
    assert await store.get_with_etag("repos/r/state") == (b"v3", e3)


async def test_if_match_on_a_missing_key_fails(store: ObjectStore) -> None:
    # SeaweedFS answers 412, AWS and moto 404: both are a lost condition
    with pytest.raises(PreconditionFailed):
        await store.put("repos/none/state", b"v1", if_match=md5_etag(b"v0"))
    assert await store.head("repos/none/state") is None


@pytest.mark.parametrize("backend", BACKENDS)
async def test_multipart_put_file_and_ranges_across_parts(
    backend: str,
    make_store: StoreFactory,
    endpoint_for: Callable[[str], S3Endpoint],
    tmp_path: Path,
) -> None:
    part = 5 * MiB
    store = await make_store(
        backend, multipart_threshold_bytes=part, multipart_part_bytes=part, verify_md5=True
    )
    data = random.Random(12).randbytes(12 * MiB + 12345)
    source = tmp_path / "layer.bin"
    source.write_bytes(data)
    etag = await store.put_file("repos/r/layers/0001.layer", source, if_none_match=True)
    info = await store.head("repos/r/layers/0001.layer")
    assert info is not None and info.size == len(data) and info.etag == etag
    if backend != "file":
        assert etag.endswith('-3"')  # three parts: 5, 5 and 2 MiB
    for start, end in [
        (part - 3, part + 3),
        (2 * part - 1, 2 * part + 1),
        (part - 100, 2 * part + 100),
        (0, part),
        (len(data) - 7, None),
    ]:
        assert await store.get("repos/r/layers/0001.layer", start=start, end=end) == data[start:end]
    assert await store.get("repos/r/layers/0001.layer") == data
    with pytest.raises(PreconditionFailed):
        await store.put_file("repos/r/layers/0001.layer", source, if_none_match=True)
    if backend != "file":
        assert pending_uploads(endpoint_for(backend), BUCKET) == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_small_put_file_is_one_put(
    backend: str, make_store: StoreFactory, tmp_path: Path
) -> None:
    store = await make_store(backend)
    source = tmp_path / "small"
    source.write_bytes(b"small layer")
    etag = await store.put_file("layers/small", source)
    assert etag == md5_etag(b"small layer")
    assert await store.get("layers/small") == b"small layer"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_link_local(backend: str, make_store: StoreFactory, tmp_path: Path) -> None:
    """Seed 004, "Linked local copies": file:// links share the stored inode; S3 cannot."""
    store = await make_store(backend)
    await store.put("repos/r/layers/x.layer", b"layer bytes")
    dest = tmp_path / "copy"
    linked = await store.link_local("repos/r/layers/x.layer", dest)
    assert linked is (backend == "file")
    if linked:
        assert dest.read_bytes() == b"layer bytes"
        assert isinstance(store, FileStore)
        stored = os.stat(store.path_of("repos/r/layers/x.layer"))
        assert os.stat(dest).st_ino == stored.st_ino
        assert not os.access(dest, os.W_OK) or os.geteuid() == 0  # stored files are read-only
        with pytest.raises(NotFound):
            await store.link_local("repos/r/layers/missing", tmp_path / "other")
    # "If a link cannot be made again but the old one shares the inode of the stored file"
    assert await store.same_file("repos/r/layers/x.layer", dest) is linked
    (tmp_path / "copied").write_bytes(b"layer bytes")
    assert await store.same_file("repos/r/layers/x.layer", tmp_path / "copied") is False
    assert await store.same_file("repos/r/layers/x.layer", tmp_path / "missing") is False
