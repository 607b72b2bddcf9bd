"""Real S3 endpoints on 127.0.0.1 (moto, SeaweedFS), fault proxies, and store factories.

Servers are session-scoped and start only when a test asks for them; each
test works under its own key prefix, so tests share buckets safely.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from enroute_core.storage.objectstore import ObjectStore, StoreOptions, open_store
from enroute_testing.faultproxy import FaultProxy
from enroute_testing.s3servers import S3Endpoint, create_bucket, moto_server, seaweedfs_server

BUCKET = "enroute-test"
BACKENDS = ["file", "moto", "seaweedfs"]

StoreFactory = Callable[..., Awaitable[ObjectStore]]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[S3Endpoint]:
    with moto_server() as endpoint:
        create_bucket(endpoint, BUCKET)
        yield endpoint


@pytest.fixture(scope="session")
def seaweed_endpoint() -> Iterator[S3Endpoint]:
    started = time.monotonic()
    with seaweedfs_server(buckets=(BUCKET,)) as endpoint:
        sys.stderr.write(f"\nweed mini ready in {time.monotonic() - started:.2f} s\n")
        yield endpoint


@pytest.fixture(scope="session")
def moto_proxy(moto_endpoint: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint.host, moto_endpoint.port) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def seaweed_proxy(seaweed_endpoint: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed_endpoint.host, seaweed_endpoint.port) as proxy:
        yield proxy


def s3_options(endpoint: S3Endpoint, url: str | None = None, **overrides: Any) -> StoreOptions:
    return StoreOptions(
        endpoint_url=url or endpoint.url,
        region=endpoint.region,
        access_key_id=endpoint.access_key_id,
        secret_access_key=endpoint.secret_access_key,
        **overrides,
    )


def key_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test alone (node ids are unique in a session)."""
    return "t-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]


@pytest.fixture
def endpoint_for(request: pytest.FixtureRequest) -> Callable[[str], S3Endpoint]:
    """The session's S3 endpoint of a backend ("moto" or "seaweedfs"), started on demand."""

    def get(backend: str) -> S3Endpoint:
        fixture = "moto_endpoint" if backend == "moto" else "seaweed_endpoint"
        endpoint: S3Endpoint = request.getfixturevalue(fixture)
        return endpoint

    return get


@pytest_asyncio.fixture
async def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, endpoint_for: Callable[[str], S3Endpoint]
) -> AsyncIterator[Callable[..., Awaitable[ObjectStore]]]:
    """``await make_store(backend, **options)``: a store under this test's own prefix."""
    opened: list[ObjectStore] = []
    prefix = key_prefix(request)

    async def make(backend: str, **overrides: Any) -> ObjectStore:
        if backend == "file":
            store = open_store(f"file://{tmp_path}/store", StoreOptions(**overrides))
        else:
            endpoint = endpoint_for(backend)
            store = open_store(f"s3://{BUCKET}/{prefix}", s3_options(endpoint, **overrides))
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


@pytest_asyncio.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, make_store: Callable[..., Awaitable[ObjectStore]]
) -> ObjectStore:
    backend: str = request.param
    return await make_store(backend)
