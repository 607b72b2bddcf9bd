"""Store URLs (``file:///path``, ``s3://bucket/prefix``) and ``open_store``.

STYLE rule 7: no ambient environment or randomness below ``main.py``. The
environment is a mapping the caller passes (``os.environ`` in ``main.py``);
values set in the options win over it. The backoff jitter draws from the
``random.Random`` given, or from one with a fixed seed.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from enroute_core.base.errors import InvalidArgument, InvalidPath
from enroute_core.storage.objectstore.base import ObjectStore, StoreOptions, check_key
from enroute_core.storage.objectstore.file import FileStore

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class FileUrl:
    path: str


@dataclass(frozen=True, slots=True)
class S3Url:
    bucket: str
    prefix: str  # no leading or trailing "/"; "" for the whole bucket


def parse_store_url(url: str) -> FileUrl | S3Url:
    """Parse a store URL or raise ``InvalidArgument`` saying what is wrong with it."""
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment:
        raise InvalidArgument("store URL takes no query or fragment", url=url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgument("file:// store URL must name a local path", url=url)
        path = urllib.parse.unquote(parts.path)
        if not path.startswith("/") or "\x00" in path:
            raise InvalidArgument("file:// store URL needs an absolute path", url=url)
        return FileUrl(path)
    if parts.scheme == "s3":
        if not _BUCKET.match(parts.netloc):
            raise InvalidArgument("s3:// store URL needs a valid bucket name", url=url)
        prefix = urllib.parse.unquote(parts.path).strip("/")
        if prefix:
            try:
                check_key(prefix)
            except InvalidPath:
                raise InvalidArgument("s3:// store URL has an invalid prefix", url=url) from None
        return S3Url(parts.netloc, prefix)
    raise InvalidArgument("store URL must start with file:// or s3://", url=url)


def options_with_env(options: StoreOptions, env: Mapping[str, str]) -> StoreOptions:
    """Fill the connection fields left as None from ``AWS_*`` variables."""

    def pick(current: str | None, *names: str) -> str | None:
        if current is not None:
            return current
        for name in names:
            value = env.get(name)
            if value:
                return value
        return None

    return dataclasses.replace(
        options,
        endpoint_url=pick(options.endpoint_url, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        region=pick(options.region, "AWS_REGION", "AWS_DEFAULT_REGION"),
        access_key_id=pick(options.access_key_id, "AWS_ACCESS_KEY_ID"),
        secret_access_key=pick(options.secret_access_key, "AWS_SECRET_ACCESS_KEY"),
        session_token=pick(options.session_token, "AWS_SESSION_TOKEN"),
    )


def open_store(
    url: str,
    options: StoreOptions | None = None,
    *,
    env: Mapping[str, str] | None = None,
    rng: random.Random | None = None,
) -> ObjectStore:
    """The store a URL names. Nothing is opened yet; the S3 client starts on first use."""
    opts = options_with_env(options or StoreOptions(), env or {})
    opts.check()
    parsed = parse_store_url(url)
    if isinstance(parsed, FileUrl):
        return FileStore(parsed.path, opts)
    s3 = importlib.import_module("enroute_core.storage.objectstore.s3")  # botocore on demand
    store: ObjectStore = s3.S3Store(parsed.bucket, parsed.prefix, opts, rng=rng or random.Random(0))
    return store
