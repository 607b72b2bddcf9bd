"""Stores for the maintenance tests: file://, moto and SeaweedFS (started on demand).

Each test works under its own key prefix, so tests share the session's buckets.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from enroute_core.storage.objectstore import ObjectStore, StoreOptions, open_store
from enroute_testing.s3servers import S3Endpoint, create_bucket, moto_server, seaweedfs_server

BUCKET = "enroute-maint"
StoreFactory = Callable[[str], Awaitable[ObjectStore]]


@pytest.fixture(scope="session")
def maint_moto() -> Iterator[S3Endpoint]:
    with moto_server() as endpoint:
        create_bucket(endpoint, BUCKET)
        yield endpoint


@pytest.fixture(scope="session")
def maint_seaweed() -> Iterator[S3Endpoint]:
    with seaweedfs_server(buckets=(BUCKET,)) as endpoint:
        yield endpoint


@pytest_asyncio.fixture
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """``await make_store(backend)``: a new client on this test's store (same keys)."""
    opened: list[ObjectStore] = []
    prefix = "t-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]

    async def make(backend: str) -> ObjectStore:
        if backend == "file":
            store = open_store(f"file://{tmp_path}/store", StoreOptions())
        else:
            fixture = "maint_moto" if backend == "moto" else "maint_seaweed"
            ep: S3Endpoint = request.getfixturevalue(fixture)
            options = StoreOptions(
                endpoint_url=ep.url,
                region=ep.region,
                access_key_id=ep.access_key_id,
                secret_access_key=ep.secret_access_key,
            )
            store = open_store(f"s3://{BUCKET}/{prefix}", options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()
