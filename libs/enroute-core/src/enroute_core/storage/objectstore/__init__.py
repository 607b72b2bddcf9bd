"""The object store: one async protocol, a ``file://`` and an ``s3://`` backend.

The S3 backend (and aiobotocore with it) loads on first use, so a process on a
``file://`` store never pays for importing botocore.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from enroute_core.storage.objectstore.base import (
    ListPage,
    ObjectInfo,
    ObjectStore,
    StoreOptions,
)
from enroute_core.storage.objectstore.config import (
    FileUrl,
    S3Url,
    open_store,
    options_with_env,
    parse_store_url,
)
from enroute_core.storage.objectstore.file import FileStore

if TYPE_CHECKING:
    from enroute_core.storage.objectstore.s3 import S3Store

__all__ = [
    "FileStore",
    "FileUrl",
    "ListPage",
    "ObjectInfo",
    "ObjectStore",
    "S3Store",
    "S3Url",
    "StoreOptions",
    "open_store",
    "options_with_env",
    "parse_store_url",
]


def __getattr__(name: str) -> object:
    if name == "S3Store":
        return importlib.import_module("enroute_core.storage.objectstore.s3").S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
