"""Store URLs, options and the environment (STYLE rule 7: the environment is passed in)."""

from __future__ import annotations

import random

import pytest

from enroute_core.base.errors import InvalidArgument
from enroute_core.storage.objectstore import (
    FileStore,
    FileUrl,
    S3Store,
    S3Url,
    StoreOptions,
    open_store,
    options_with_env,
    parse_store_url,
)
from enroute_core.storage.objectstore.base import MiB


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("file:///var/lib/enroute", FileUrl("/var/lib/enroute")),
        ("file://localhost/data%20dir", FileUrl("/data dir")),
        ("s3://enroute-layers", S3Url("enroute-layers", "")),
        ("s3://enroute-layers/", S3Url("enroute-layers", "")),
        ("s3://enroute-layers/prod/eu/", S3Url("enroute-layers", "prod/eu")),
        ("s3://my.bucket-1/p", S3Url("my.bucket-1", "p")),
    ],
)
def test_parse_good_urls(url: str, parsed: FileUrl | S3Url) -> None:
    assert parse_store_url(url) == parsed


@pytest.mark.parametrize(
    "url",
    [
        "",
        "/var/lib/enroute",
        "file://host/path",
        "file:relative",
        "file:///a?x=1",
        "s3://",
        "s3://UPPER",
        "s3://ab",
        "s3://bucket/a//b",
        "s3://bucket/a/../b",
        "gs://bucket",
        "http://127.0.0.1:9000/bucket",
    ],
)
def test_parse_bad_urls(url: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_store_url(url)


def test_environment_fills_only_what_options_leave_open() -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "env-id",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://env:9000",
    }
    filled = options_with_env(StoreOptions(access_key_id="cfg-id"), env)
    assert filled.access_key_id == "cfg-id"
    assert filled.secret_access_key == "env-secret"
    assert (filled.region, filled.endpoint_url) == ("eu-west-1", "http://env:9000")
    assert options_with_env(StoreOptions(), {"AWS_DEFAULT_REGION": "x"}).region == "x"
    assert options_with_env(StoreOptions(), {}) == StoreOptions()
    assert "env-secret" not in repr(filled)  # secrets stay out of logs


@pytest.mark.parametrize(
    "bad",
    [
        {"multipart_part_bytes": 5 * MiB - 1},
        {"attempts_max": 0},
        {"attempts_max": 21},
        {"read_timeout_ms": 0},
        {"backoff_base_ms": 10, "backoff_max_ms": 5},
        {"lock_timeout_ms": 0},
    ],
)
def test_bad_options_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(InvalidArgument):
        open_store("file:///tmp/x", StoreOptions(**bad))  # type: ignore[arg-type]


def test_open_store_picks_the_backend(tmp_path: object) -> None:
    assert isinstance(open_store(f"file://{tmp_path}"), FileStore)
    s3 = open_store("s3://bucket/prefix", rng=random.Random(1))
    assert isinstance(s3, S3Store)
    assert s3.url == "s3://bucket/prefix/"


def test_backoff_is_full_jitter_within_its_cap() -> None:
    options = StoreOptions(backoff_base_ms=100, backoff_max_ms=1000)
    store = S3Store("bucket", "", options, rng=random.Random(5))
    again = S3Store("bucket", "", options, rng=random.Random(5))
    for attempt in range(1, 12):
        cap_s = min(1000, 100 * 2 ** (attempt - 1)) / 1000
        delays = [store._backoff_s(attempt) for _ in range(50)]
        assert all(0 <= d <= cap_s for d in delays)
        assert max(delays) > cap_s / 2  # jitter spreads over the range
        assert delays == [again._backoff_s(attempt) for _ in range(50)]  # seeded
