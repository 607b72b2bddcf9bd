"""The S3 store behind a loopback fault proxy: retries, timeouts and damaged bodies.

``docs/objectstore.md``, "Retries and timeouts": bounded attempts with backoff,
then a typed error; never wrong bytes from a short read. Seed 004, "Layers":
chunk hashes catch flipped bytes the store cannot see, so the proxy's flips
are checked here to reach the caller as they are.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
import pytest_asyncio

from enroute_core.base.errors import CorruptData, PreconditionFailed, Timeout, Unavailable
from enroute_core.storage.objectstore import S3Store, StoreOptions, open_store
from enroute_core.storage.objectstore.base import MiB, md5_etag
from enroute_testing.faultproxy import FaultKind, FaultProxy, FaultRule
from enroute_testing.s3servers import S3Endpoint, pending_uploads, s3_client

pytestmark = pytest.mark.asyncio
BUCKET = "enroute-test"  # created by conftest.py
ATTEMPTS = 3
READ_TIMEOUT_MS = 300


def options(endpoint: S3Endpoint, proxy: FaultProxy, **overrides: object) -> StoreOptions:
    settings: dict[str, object] = {
        "endpoint_url": proxy.url,
        "region": endpoint.region,
        "access_key_id": endpoint.access_key_id,
        "secret_access_key": endpoint.secret_access_key,
        "connect_timeout_ms": 1000,
        "read_timeout_ms": READ_TIMEOUT_MS,
        "attempt_timeout_ms": 3000,
        "attempts_max": ATTEMPTS,
        "backoff_base_ms": 5,
        "backoff_max_ms": 20,
    }
    settings.update(overrides)
    return StoreOptions(**settings)  # type: ignore[arg-type]


def prefix_of(request: pytest.FixtureRequest) -> str:
    return "f-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]


@pytest_asyncio.fixture
async def faulty(
    request: pytest.FixtureRequest, moto_endpoint: S3Endpoint, moto_proxy: FaultProxy
) -> AsyncIterator[S3Store]:
    """An S3 store on moto through the proxy; the proxy's rules are dropped afterwards."""
    moto_proxy.reset()
    store = open_store(f"s3://{BUCKET}/{prefix_of(request)}", options(moto_endpoint, moto_proxy))
    assert isinstance(store, S3Store)
    try:
        yield store
    finally:
        moto_proxy.clear()
        await store.close()


async def timed(call: Awaitable[object]) -> tuple[object, float]:
    started = time.monotonic()
    result = await call
    return result, time.monotonic() - started


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def test_slowdown_then_success(faulty: S3Store, moto_proxy: FaultProxy) -> None:
    data = blob(1, 4096)
    await faulty.put("obj", data)
    moto_proxy.add(FaultRule(FaultKind.STATUS, method="GET", times=ATTEMPTS - 1))
    assert await faulty.get("obj") == data
    assert await faulty.get("obj", start=10, end=20) == data[10:20]  # rule used up
    assert moto_proxy.faults(FaultKind.STATUS) == ATTEMPTS - 1
    assert faulty.retries == ATTEMPTS - 1


async def test_500_on_put_and_429_on_list_are_retried(
    faulty: S3Store, moto_proxy: FaultProxy
) -> None:
    moto_proxy.add(
        FaultRule(FaultKind.STATUS, method="PUT", status=500, code="InternalError"),
        FaultRule(FaultKind.STATUS, query_contains="list-type", status=429, code="TooManyRequests"),
    )
    etag = await faulty.put("obj", b"payload", if_none_match=True)
    assert etag == md5_etag(b"payload")
    page = await faulty.list("", limit=10)
    assert [i.key for i in page.items] == ["obj"]
    assert moto_proxy.faults() == 2


async def test_slowdown_that_persists_is_unavailable(
    faulty: S3Store, moto_proxy: FaultProxy
) -> None:
    await faulty.put("obj", b"x")
    moto_proxy.add(FaultRule(FaultKind.STATUS, method="GET", times=ATTEMPTS))
    with pytest.raises(Unavailable) as caught:
        await faulty.get("obj")
    assert caught.value.details["attempts"] == ATTEMPTS
    assert moto_proxy.faults() == ATTEMPTS  # bounded: no attempt beyond the limit


async def test_precondition_is_never_retried(faulty: S3Store, moto_proxy: FaultProxy) -> None:
    await faulty.put("state", b"v1", if_none_match=True)
    before = len(moto_proxy.exchanges())
    with pytest.raises(PreconditionFailed):
        await faulty.put("state", b"v2", if_none_match=True)
    assert len(moto_proxy.exchanges()) == before + 1
    assert faulty.retries == 0


async def test_delay_past_read_timeout_is_retried(faulty: S3Store, moto_proxy: FaultProxy) -> None:
    data = blob(2, 1000)
    await faulty.put("obj", data)
    moto_proxy.add(FaultRule(FaultKind.DELAY, method="GET", delay_s=2.0))
    got, elapsed = await timed(faulty.get("obj", start=100, end=200))
    assert got == data[100:200]
    assert moto_proxy.faults(FaultKind.DELAY) == 1
    assert READ_TIMEOUT_MS / 1000 <= elapsed < 2.5


async def test_delay_that_persists_is_a_timeout(faulty: S3Store, moto_proxy: FaultProxy) -> None:
    await faulty.put("obj", b"x")
    moto_proxy.add(FaultRule(FaultKind.DELAY, method="GET", delay_s=2.0, times=ATTEMPTS))
    started = time.monotonic()
    with pytest.raises(Timeout) as caught:
        await faulty.get("obj")
    elapsed = time.monotonic() - started
    assert caught.value.details["attempts"] == ATTEMPTS
    assert ATTEMPTS * READ_TIMEOUT_MS / 1000 <= elapsed < 4.0


async def test_conditional_put_that_landed_but_timed_out(
    faulty: S3Store, moto_proxy: FaultProxy
) -> None:
    """The write reaches the server, its answer is late; the retry's 412 is our own write."""
    moto_proxy.add(FaultRule(FaultKind.DELAY_RESPONSE, method="PUT", delay_s=2.0))
    etag = await faulty.put("state", b"v1", if_none_match=True)
    assert etag == md5_etag(b"v1")
    assert moto_proxy.faults(FaultKind.DELAY_RESPONSE) == 1
    assert await faulty.get_with_etag("state") == (b"v1", etag)
    # a real loser is still a loser after a late answer
    moto_proxy.add(FaultRule(FaultKind.DELAY_RESPONSE, method="PUT", delay_s=2.0))
    with pytest.raises(PreconditionFailed):
        await faulty.put("state", b"v2", if_none_match=True)


@pytest.mark.parametrize("ranged", [True, False])
async def test_truncated_body_is_retried(
    faulty: S3Store, moto_proxy: FaultProxy, ranged: bool
) -> None:
    data = blob(3, 64 * 1024)
    await faulty.put("obj", data)
    moto_proxy.add(FaultRule(FaultKind.TRUNCATE, method="GET", times=ATTEMPTS - 1))
    start, end = (1000, 50_000) if ranged else (None, None)
    assert await faulty.get("obj", start=start, end=end) == data[start:end]
    assert moto_proxy.faults(FaultKind.TRUNCATE) == ATTEMPTS - 1


async def test_truncated_body_that_persists_is_unavailable(
    faulty: S3Store, moto_proxy: FaultProxy
) -> None:
    data = blob(4, 64 * 1024)
    await faulty.put("obj", data)
    moto_proxy.add(FaultRule(FaultKind.TRUNCATE, method="GET", keep_bytes=1, times=ATTEMPTS))
    with pytest.raises(Unavailable):
        await faulty.get("obj", start=0, end=40_000)


async def test_reset_connection_is_retried(faulty: S3Store, moto_proxy: FaultProxy) -> None:
    await faulty.put("a", b"1")
    moto_proxy.add(FaultRule(FaultKind.RESET, times=ATTEMPTS - 1))
    assert [i.key for i in (await faulty.list("", limit=5)).items] == ["a"]
    assert await faulty.head("a") is not None


async def test_flipped_bytes_in_a_range_reach_the_caller(
    faulty: S3Store, moto_proxy: FaultProxy
) -> None:
    """The store cannot see a flip inside a range; the layer's chunk hashes do."""
    data = blob(5, 8192)
    await faulty.put("layer", data)
    moto_proxy.add(FaultRule(FaultKind.FLIP, method="GET", flip_offset=7, flip_mask=0x80))
    got = await faulty.get("layer", start=1000, end=2000)
    diff = [i for i in range(1000) if got[i] != data[1000 + i]]
    assert diff == [7] and got[7] == data[1007] ^ 0x80
    assert await faulty.get("layer", start=1000, end=2000) == data[1000:2000]


async def test_flipped_bytes_in_a_whole_object_fail_its_md5(
    faulty: S3Store, moto_proxy: FaultProxy
) -> None:
    data = blob(6, 2048)
    etag = await faulty.put("state", data)
    moto_proxy.add(FaultRule(FaultKind.FLIP, method="GET", times=ATTEMPTS - 1))
    assert await faulty.get_with_etag("state") == (data, etag)  # retried past the flips
    moto_proxy.add(FaultRule(FaultKind.FLIP, method="GET", times=ATTEMPTS))
    with pytest.raises(CorruptData):
        await faulty.get("state")


@pytest_asyncio.fixture
async def seaweed_faulty(
    request: pytest.FixtureRequest, seaweed_endpoint: S3Endpoint, seaweed_proxy: FaultProxy
) -> AsyncIterator[S3Store]:
    seaweed_proxy.reset()
    store = open_store(
        f"s3://{BUCKET}/{prefix_of(request)}", options(seaweed_endpoint, seaweed_proxy)
    )
    assert isinstance(store, S3Store)
    try:
        yield store
    finally:
        seaweed_proxy.clear()
        await store.close()


async def test_flipped_request_body_fails_content_md5(
    seaweed_faulty: S3Store, seaweed_proxy: FaultProxy, seaweed_endpoint: S3Endpoint
) -> None:
    """Content-MD5 on PUT: SeaweedFS refuses the damaged body (BadDigest) and the retry lands."""
    data = blob(7, 4096)
    seaweed_proxy.add(FaultRule(FaultKind.FLIP_REQUEST, method="PUT"))
    etag = await seaweed_faulty.put("obj", data)
    assert etag == md5_etag(data)
    assert seaweed_proxy.exchanges()[-2].status == 400  # the refused attempt
    client = s3_client(seaweed_endpoint)  # read around the proxy
    try:
        full_key = seaweed_faulty.url.removeprefix(f"s3://{BUCKET}/") + "obj"
        stored = client.get_object(Bucket=BUCKET, Key=full_key)["Body"].read()
    finally:
        client.close()
    assert stored == data


async def test_failed_multipart_upload_is_aborted(
    faulty: S3Store, moto_proxy: FaultProxy, moto_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    store = S3Store(
        BUCKET,
        faulty.url.removeprefix(f"s3://{BUCKET}/"),
        options(
            moto_endpoint,
            moto_proxy,
            multipart_threshold_bytes=5 * MiB,
            multipart_part_bytes=5 * MiB,
        ),
        rng=random.Random(0),
    )
    source = tmp_path / "big"
    source.write_bytes(blob(8, 11 * MiB))
    moto_proxy.add(
        FaultRule(FaultKind.STATUS, method="PUT", query_contains="partNumber=2", times=ATTEMPTS)
    )
    try:
        with pytest.raises(Unavailable):
            await store.put_file("layer", source)
    finally:
        await store.close()
    assert pending_uploads(moto_endpoint, BUCKET, prefix_of_store(faulty)) == []
    assert await faulty.head("layer") is None


def prefix_of_store(store: S3Store) -> str:
    return store.url.removeprefix(f"s3://{BUCKET}/")
