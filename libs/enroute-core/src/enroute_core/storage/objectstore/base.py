"""The object-store seam: one async protocol, its values, and the rules both backends share.

DESIGN, "Object store layout": state objects change only by compare-and-swap
(``If-None-Match: *`` to create, ``If-Match: <etag>`` to replace); layer files
are written once. Seed 004, "Linked local copies": a ``file://`` store hands
out hard links to its files. Everything else about a backend (paths, HTTP,
retries) stays behind :class:`ObjectStore`.

Keys are ``str``: they are names in the store layout (``repos/<repo>/state``),
made of safe repository names, and the store is an edge where text is fine.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self

from enroute_core.base.errors import InvalidArgument, InvalidPath
from enroute_core.base.limits import GiB, MiB

KEY_BYTES_MAX = 1024  # the S3 limit; the file:// encoding is built to hold it too
LIST_LIMIT_MAX = 1000  # ListObjectsV2 never returns more in one page
PART_BYTES_MIN = 5 * MiB  # S3: every part but the last
PART_BYTES_MAX = 5 * GiB
PARTS_MAX = 10_000

_MD5_ETAG = re.compile(r'^"?[0-9a-f]{32}"?$')


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified_us: int


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of keys in lexicographic (UTF-8 byte) order.

    ``next_start_after`` is the ``start_after`` of the next page, or None when
    this page is the last.
    """

    items: tuple[ObjectInfo, ...]
    next_start_after: str | None


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Validated settings of one store; units last in names (STYLE rule 5).

    Credentials, endpoint and region left as None are filled from the
    environment mapping given to ``open_store`` (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    # None: path-style addressing when an endpoint is given (local S3 servers)
    path_style: bool | None = None
    connect_timeout_ms: int = 5_000
    read_timeout_ms: int = 30_000
    # one attempt as a whole, so a server that drips bytes cannot hold a call forever
    attempt_timeout_ms: int = 120_000
    attempts_max: int = 5
    backoff_base_ms: int = 100
    backoff_max_ms: int = 10_000
    multipart_threshold_bytes: int = 16 * MiB
    multipart_part_bytes: int = 16 * MiB
    multipart_concurrency_max: int = 4
    connections_max: int = 32
    get_bytes_max: int = 256 * MiB
    # compare whole-object GETs with an MD5 ETag; send Content-MD5 on every PUT
    verify_md5: bool = True
    # file:// only
    fsync: bool = True
    lock_timeout_ms: int = 30_000

    def check(self) -> None:
        """Raise ``InvalidArgument`` naming the first bad field."""
        positive = (
            "connect_timeout_ms",
            "read_timeout_ms",
            "attempt_timeout_ms",
            "attempts_max",
            "multipart_threshold_bytes",
            "multipart_concurrency_max",
            "connections_max",
            "get_bytes_max",
            "lock_timeout_ms",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise InvalidArgument(f"object store option {name} must be at least 1", field=name)
        if self.attempts_max > 20:
            raise InvalidArgument("attempts_max must be at most 20", field="attempts_max")
        if not 0 <= self.backoff_base_ms <= self.backoff_max_ms:
            raise InvalidArgument(
                "backoff needs 0 <= backoff_base_ms <= backoff_max_ms", field="backoff_base_ms"
            )
        if not PART_BYTES_MIN <= self.multipart_part_bytes <= PART_BYTES_MAX:
            raise InvalidArgument(
                f"multipart_part_bytes must be in [{PART_BYTES_MIN}, {PART_BYTES_MAX}]",
                field="multipart_part_bytes",
            )


class ObjectStore(Protocol):
    """An S3-like store: whole-object writes, ranged reads, CAS, paginated listing.

    Guarantees both backends give (``docs/objectstore.md``):

    1. ``put`` is atomic: a reader sees the old bytes or the new, never a mix.
    2. ``if_none_match=True`` creates only if the key is absent; ``if_match=etag``
       replaces only if the current ETag is ``etag``; a missing key never
       matches. A lost condition raises ``PreconditionFailed``; two writers
       racing on one condition: exactly one wins.
    3. Errors are typed: ``NotFound``, ``PreconditionFailed``, ``Timeout`` and
       ``Unavailable`` (after bounded retries), ``CorruptData``,
       ``InvalidPath`` for a key outside the key rules.
    """

    @property
    def url(self) -> str: ...

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` clipped to the object, like a slice; NotFound if absent."""
        ...

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The whole object and the ETag of exactly those bytes (for CAS on state objects)."""
        ...

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """Store ``data`` and return its new ETag."""
        ...

    async def put_file(
        self, key: str, path: str | os.PathLike[str], *, if_none_match: bool = False
    ) -> str:
        """Store a local file (a layer) without holding it in memory; multipart on S3."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is fine."""
        ...

    async def head(self, key: str) -> ObjectInfo | None: ...

    async def list(self, prefix: str, *, start_after: str | None = None, limit: int) -> ListPage:
        """Keys starting with ``prefix`` and greater than ``start_after``, at most ``limit``."""
        ...

    async def link_local(self, key: str, dest_path: str | os.PathLike[str]) -> bool:
        """Hard-link the stored file to ``dest_path``; False when linking is impossible.

        Seed 004, "Linked local copies": only a ``file://`` store can link;
        EXDEV turns linking off for the store's life.
        """
        ...

    async def same_file(self, key: str, path: str | os.PathLike[str]) -> bool:
        """True when ``path`` is the stored file of ``key`` (the same inode, so a link).

        Seed 004, "Linked local copies": a copy recorded as linked is trusted
        only when it still shares the inode of the stored file; a store that
        cannot link answers False.
        """
        ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def check_key(key: str) -> bytes:
    """Return the UTF-8 of a valid key, or raise ``InvalidPath``.

    Both backends take the same keys: 1 to 1024 UTF-8 bytes, ``/``-separated
    segments, none empty, ``.`` or ``..``, no control characters. S3 would take
    more; the ``file://`` backend could not.
    """
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPath("object key is not valid UTF-8", key=repr(key)) from None
    if not 0 < len(raw) <= KEY_BYTES_MAX:
        raise InvalidPath(f"object key must be 1 to {KEY_BYTES_MAX} bytes", key=key)
    if any(b < 0x20 or b == 0x7F for b in raw):
        raise InvalidPath("object key holds a control character", key=repr(key))
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidPath("object key has an empty, '.' or '..' segment", key=key)
    return raw


def check_prefix(prefix: str) -> None:
    """A list prefix is any start of a valid key (it may end inside a segment)."""
    if prefix:
        check_key(prefix + "x")


def check_list_limit(limit: int) -> None:
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise InvalidArgument(f"list limit must be in [1, {LIST_LIMIT_MAX}]", limit=limit)


def check_range(start: int | None, end: int | None) -> tuple[int, int | None]:
    """Normalise a ``[start, end)`` request; negative or reversed bounds are caller bugs."""
    first = 0 if start is None else start
    if first < 0 or (end is not None and end < first):
        raise InvalidArgument("byte range must satisfy 0 <= start <= end", start=start, end=end)
    return first, end


def check_conditions(if_none_match: bool, if_match: str | None) -> None:
    if if_none_match and if_match is not None:
        raise InvalidArgument("if_none_match and if_match exclude each other")
    if if_match is not None and strip_etag(if_match) == "":
        raise InvalidArgument("if_match needs an ETag")


def md5_etag(data: bytes | bytearray | memoryview) -> str:
    """The ETag S3 gives a single-part object: its MD5 in hex, in quotes."""
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


def strip_etag(etag: str) -> str:
    """ETags compare without their quotes (and without a weak ``W/`` mark), as S3 does."""
    return etag.removeprefix("W/").strip('"')


def etag_is_md5(etag: str) -> bool:
    """True for a single-part ETag, which is the MD5 of the bytes (not multipart, not SSE-KMS)."""
    return _MD5_ETAG.match(etag) is not None
