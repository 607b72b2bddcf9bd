"""The ``s3://`` object store over aiobotocore, with our own bounded retries.

DESIGN, "Object store layout": state objects change by ``If-None-Match: *``
and ``If-Match: <etag>`` conditional writes; layer files are written once.
botocore's own retries are off: one loop here owns the policy
(``docs/objectstore.md``, "Retries and timeouts"):

1. An attempt is bounded by the connect and read timeouts of the HTTP client
   and by ``attempt_timeout_ms`` as a whole.
2. Retried: 429, 5xx, SlowDown, RequestTimeout, BadDigest, 409 conflicts of
   concurrent conditional writes, timeouts, refused or reset connections,
   bodies shorter than their Content-Length or Content-Range, and whole-object
   bodies that do not match their MD5 ETag.
3. Never retried: 412 (and 404 on ``If-Match``), 404, 416, 403 and any other
   4xx. A lost condition is ``PreconditionFailed``.
4. At most ``attempts_max`` attempts, with full-jitter exponential backoff
   drawn from the injected ``random.Random``; then ``Timeout`` when the last
   attempt timed out, ``CorruptData`` when the bytes kept failing their MD5,
   else ``Unavailable``.
5. A conditional write whose earlier attempt failed without an answer may
   have landed; when its retry loses the condition, a HEAD that finds our own
   ETag turns the loss into the success it was.

Listing pages by the server's continuation token when the caller asks for the
page after one this store returned, and by ``StartAfter`` otherwise: SeaweedFS
lists directory by directory, and ``StartAfter`` naming a key that is also a
directory (``a`` beside ``a/b``) skips that directory there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import enum
import functools
import hashlib
import os
import random
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp
from aiobotocore.config import AioConfig  # type: ignore[import-untyped]
from aiobotocore.session import AioSession  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    IncompleteReadError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    Internal,
    InvalidPath,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    Timeout,
    Unavailable,
)
from enroute_core.storage.objectstore.base import (
    PART_BYTES_MAX,
    PARTS_MAX,
    ListPage,
    ObjectInfo,
    StoreOptions,
    check_conditions,
    check_key,
    check_list_limit,
    check_prefix,
    check_range,
    etag_is_md5,
    md5_etag,
    strip_etag,
)

T = TypeVar("T")

_RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
_RETRY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "BadDigest",
        "IncompleteBody",
        "XAmzContentSHA256Mismatch",
        "ConditionalRequestConflict",
    }
)
_TRANSIENT = (
    HTTPClientError,
    BotoConnectionError,
    IncompleteReadError,
    aiohttp.ClientError,
    ConnectionError,
)
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MD5_IN_THREAD_BYTES = 1 << 20
LIST_TOKENS_MAX = 256


_Parts = list[tuple[int, str, bytes]]  # (part number, ETag, MD5)


class _Fault(enum.Enum):
    TIMEOUT = "timeout"
    TRANSIENT = "transient"
    CORRUPT = "corrupt"


class _Retry(Exception):
    """An attempt failed in a way another attempt may fix."""

    def __init__(self, fault: _Fault, reason: str) -> None:
        super().__init__(reason)
        self.fault = fault
        self.reason = reason


@dataclass(slots=True)
class _Trace:
    failed_attempts: int = 0


class S3Store:
    """An :class:`~enroute_core.storage.objectstore.base.ObjectStore` on an S3 bucket."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        options: StoreOptions,
        *,
        rng: random.Random,
    ) -> None:
        options.check()
        self._bucket = bucket
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._options = options
        self._rng = rng
        self._stack = contextlib.AsyncExitStack()
        self._s3: Any = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        # (prefix, last key of a page) -> the server's continuation token for the next page
        self._list_tokens: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.retries = 0  # attempts that were retried, for /status and tests

    @property
    def url(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}"

    # -- reads

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        first, stop = check_range(start, end)
        check_key(key)
        if stop is not None and stop == first:
            if await self.head(key) is None:
                raise NotFound("object not found", key=key)
            return b""
        data, _ = await self._attempts("get", key, lambda c: self._get_once(c, key, first, stop))
        return data

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        check_key(key)
        return await self._attempts("get", key, lambda c: self._get_once(c, key, 0, None))

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        params = {"Bucket": self._bucket, "Key": self._full(key)}
        try:
            resp = await self._attempts("head", key, lambda c: c.head_object(**params))
        except NotFound:
            return None
        return ObjectInfo(
            key, int(resp["ContentLength"]), str(resp["ETag"]), _us(resp["LastModified"])
        )

    async def list(self, prefix: str, *, start_after: str | None = None, limit: int) -> ListPage:
        check_prefix(prefix)
        check_list_limit(limit)
        params: dict[str, Any] = {
            "Bucket": self._bucket,
            "Prefix": self._prefix + prefix,
            "MaxKeys": limit,
        }
        token = self._list_tokens.get((prefix, start_after)) if start_after else None
        if token is not None:
            params["ContinuationToken"] = token
        elif start_after:
            params["StartAfter"] = self._prefix + start_after
        resp = await self._attempts("list", prefix, lambda c: c.list_objects_v2(**params))
        if token is not None and start_after:
            self._list_tokens.pop((prefix, start_after), None)
        cut = len(self._prefix)
        items = tuple(
            ObjectInfo(str(o["Key"])[cut:], int(o["Size"]), str(o["ETag"]), _us(o["LastModified"]))
            for o in resp.get("Contents", ())
        )
        truncated = bool(resp.get("IsTruncated"))
        if truncated and not items:
            raise Unavailable("object store sent an empty page that is not the last", prefix=prefix)
        if truncated and resp.get("NextContinuationToken"):
            while len(self._list_tokens) >= LIST_TOKENS_MAX:
                self._list_tokens.popitem(last=False)
            self._list_tokens[(prefix, items[-1].key)] = str(resp["NextContinuationToken"])
        return ListPage(items, items[-1].key if truncated else None)

    # -- writes

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        check_key(key)
        check_conditions(if_none_match, if_match)
        md5 = await _md5(data)
        params: dict[str, Any] = {"Bucket": self._bucket, "Key": self._full(key), "Body": data}
        if self._options.verify_md5:
            params["ContentMD5"] = base64.b64encode(md5).decode("ascii")
        if if_none_match:
            params["IfNoneMatch"] = "*"
        if if_match is not None:
            params["IfMatch"] = if_match
        trace = _Trace()
        try:
            resp = await self._attempts(
                "put",
                key,
                lambda c: c.put_object(**params),
                missing_is_precondition=if_match is not None,
                trace=trace,
            )
        except PreconditionFailed:
            expected = '"' + md5.hex() + '"'
            if trace.failed_attempts and await self._landed(key, expected):
                return expected
            raise
        return str(resp["ETag"])

    async def put_file(
        self, key: str, path: str | os.PathLike[str], *, if_none_match: bool = False
    ) -> str:
        check_key(key)
        source = os.fspath(path)
        size = await _local(key, os.path.getsize, source)
        if size < self._options.multipart_threshold_bytes:
            data = await _local(key, _read_file, source)
            return await self.put(key, data, if_none_match=if_none_match)
        part_bytes = max(self._options.multipart_part_bytes, -(-size // PARTS_MAX))
        if part_bytes > PART_BYTES_MAX:
            raise LimitExceeded("multipart_part_bytes", part_bytes, PART_BYTES_MAX)
        return await self._multipart(key, source, size, part_bytes, if_none_match)

    async def delete(self, key: str) -> None:
        check_key(key)
        params = {"Bucket": self._bucket, "Key": self._full(key)}
        with contextlib.suppress(NotFound):
            await self._attempts("delete", key, lambda c: c.delete_object(**params))

    async def link_local(self, key: str, dest_path: str | os.PathLike[str]) -> bool:
        return False

    async def same_file(self, key: str, path: str | os.PathLike[str]) -> bool:
        return False

    async def close(self) -> None:
        self._closed = True
        await self._stack.aclose()
        self._s3 = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- one attempt of each operation

    async def _get_once(
        self, client: Any, key: str, start: int, end: int | None
    ) -> tuple[bytes, str]:
        params = {"Bucket": self._bucket, "Key": self._full(key)}
        ranged = start > 0 or end is not None
        if ranged:
            params["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        try:
            resp = await client.get_object(**params)
        except ClientError as e:
            if ranged and _status(e) == 416:
                return b"", ""  # start at or past the end: an empty slice
            raise
        body = resp["Body"]
        try:
            length = int(resp.get("ContentLength", -1))
            if length > self._options.get_bytes_max:
                raise LimitExceeded("get_bytes_max", length, self._options.get_bytes_max)
            data = bytes(await body.read())
        finally:
            body.close()
        if 0 <= length != len(data):
            raise _Retry(_Fault.TRANSIENT, f"body of {len(data)} bytes, {length} announced")
        etag = str(resp.get("ETag", ""))
        if ranged:
            return _check_range_reply(resp.get("ContentRange"), data, start, end), etag
        verify = self._options.verify_md5 and etag_is_md5(etag)
        if verify and strip_etag(md5_etag(data)) != strip_etag(etag):
            raise _Retry(_Fault.CORRUPT, "body does not match its MD5 ETag")
        return data, etag

    async def _multipart(
        self, key: str, source: str, size: int, part_bytes: int, if_none_match: bool
    ) -> str:
        full = self._full(key)
        created = await self._attempts(
            "create_multipart_upload",
            key,
            lambda c: c.create_multipart_upload(Bucket=self._bucket, Key=full),
        )
        upload_id = str(created["UploadId"])
        try:
            parts = await self._upload_parts(key, source, size, part_bytes, upload_id)
            joined = b"".join(md5 for _, _, md5 in parts)
            expected = f'"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(parts)}"'
            params: dict[str, Any] = {
                "Bucket": self._bucket,
                "Key": full,
                "UploadId": upload_id,
                "MultipartUpload": {
                    "Parts": [{"PartNumber": n, "ETag": etag} for n, etag, _ in parts]
                },
            }
            if if_none_match:
                params["IfNoneMatch"] = "*"
            trace = _Trace()
            try:
                resp = await self._attempts(
                    "complete_multipart_upload",
                    key,
                    lambda c: c.complete_multipart_upload(**params),
                    trace=trace,
                )
            except (PreconditionFailed, NotFound):
                # an unanswered earlier attempt may have completed it (then: NoSuchUpload / 412)
                if trace.failed_attempts and await self._landed(key, expected):
                    return expected
                raise
            return str(resp["ETag"])
        except BaseException:
            await self._abort(key, upload_id)
            raise

    async def _upload_parts(
        self, key: str, source: str, size: int, part_bytes: int, upload_id: str
    ) -> _Parts:
        count = -(-size // part_bytes)
        done: dict[int, tuple[int, str, bytes]] = {}
        numbers = iter(range(1, count + 1))
        fd = await _local(key, os.open, source, os.O_RDONLY | os.O_CLOEXEC)

        async def worker() -> None:
            for number in numbers:
                offset = (number - 1) * part_bytes
                length = min(part_bytes, size - offset)
                chunk = await _local(key, os.pread, fd, length, offset)
                if len(chunk) != length:
                    raise Internal("file shrank while it was uploaded", key=key, path=source)
                md5 = await _md5(chunk)
                etag = await self._attempts(
                    "upload_part",
                    key,
                    functools.partial(
                        self._part_once,
                        key=key,
                        upload_id=upload_id,
                        number=number,
                        chunk=chunk,
                        md5=md5,
                    ),
                )
                done[number] = (number, etag, md5)

        try:
            workers = min(self._options.multipart_concurrency_max, count)
            async with asyncio.TaskGroup() as group:
                for _ in range(workers):
                    group.create_task(worker())
        except BaseExceptionGroup as failures:
            raise _first_error(failures) from None
        finally:
            os.close(fd)
        return [done[n] for n in range(1, count + 1)]

    async def _part_once(
        self, client: Any, *, key: str, upload_id: str, number: int, chunk: bytes, md5: bytes
    ) -> str:
        params: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": self._full(key),
            "UploadId": upload_id,
            "PartNumber": number,
            "Body": chunk,
        }
        if self._options.verify_md5:
            params["ContentMD5"] = base64.b64encode(md5).decode("ascii")
        resp = await client.upload_part(**params)
        etag = str(resp["ETag"])
        if self._options.verify_md5 and etag_is_md5(etag) and strip_etag(etag) != md5.hex():
            raise _Retry(_Fault.CORRUPT, f"part {number} stored with another MD5")
        return etag

    async def _abort(self, key: str, upload_id: str) -> None:
        """Best effort: a failed abort leaves parts that a bucket lifecycle rule removes."""
        params = {"Bucket": self._bucket, "Key": self._full(key), "UploadId": upload_id}
        with contextlib.suppress(EnrouteError):
            await self._attempts(
                "abort_multipart_upload", key, lambda c: c.abort_multipart_upload(**params)
            )

    async def _landed(self, key: str, expected_etag: str) -> bool:
        try:
            info = await self.head(key)
        except EnrouteError:
            return False
        return info is not None and strip_etag(info.etag) == strip_etag(expected_etag)

    # -- the retry loop

    async def _attempts(
        self,
        op: str,
        key: str,
        attempt: Callable[[Any], Awaitable[T]],
        *,
        missing_is_precondition: bool = False,
        trace: _Trace | None = None,
    ) -> T:
        last = _Retry(_Fault.TRANSIENT, "no attempt made")
        for n in range(self._options.attempts_max):
            if n:
                self.retries += 1
                if trace is not None:
                    trace.failed_attempts += 1
                await asyncio.sleep(self._backoff_s(n))
            client = await self._client()
            try:
                async with asyncio.timeout(self._options.attempt_timeout_ms / 1000):
                    return await attempt(client)
            except _Retry as e:
                last = e
            except ClientError as e:
                last = _classify(op, key, e, missing_is_precondition)
            except (TimeoutError, ConnectTimeoutError, ReadTimeoutError) as e:
                last = _Retry(_Fault.TIMEOUT, f"{type(e).__name__}: {e}")
            except _TRANSIENT as e:
                last = _Retry(_Fault.TRANSIENT, f"{type(e).__name__}: {e}")
            except BotoCoreError as e:  # no credentials, bad parameters: ours to fix
                raise Internal(f"object store {op}: {e}", op=op, key=key) from e
        details: dict[str, object] = {
            "op": op,
            "key": key,
            "attempts": self._options.attempts_max,
            "last": last.reason,
        }
        if last.fault is _Fault.TIMEOUT:
            raise Timeout(f"object store {op} timed out", **details)
        if last.fault is _Fault.CORRUPT:
            raise CorruptData(
                f"object store {op} kept failing MD5", section="objectstore", **details
            )
        raise Unavailable(f"object store {op} failed", **details)

    def _backoff_s(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2^(attempt-1))]."""
        o = self._options
        cap_ms = min(o.backoff_max_ms, o.backoff_base_ms * (1 << min(attempt - 1, 30)))
        return self._rng.uniform(0, cap_ms) / 1000

    async def _client(self) -> Any:
        if self._closed:
            raise Internal("object store is closed", url=self.url)
        if self._s3 is None:
            async with self._open_lock:
                if self._s3 is None:
                    client = await self._stack.enter_async_context(self._create_client())
                    client.meta.events.register_last("before-call.s3", _no_expect_header)
                    self._s3 = client
        return self._s3

    def _create_client(self) -> Any:
        o = self._options
        path_style = o.path_style if o.path_style is not None else o.endpoint_url is not None
        config = AioConfig(
            signature_version="s3v4",
            s3={"addressing_style": "path" if path_style else "auto"},
            connect_timeout=o.connect_timeout_ms / 1000,
            read_timeout=o.read_timeout_ms / 1000,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=o.connections_max,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            ignore_configured_endpoint_urls=True,
        )
        kwargs: dict[str, Any] = {"region_name": o.region or "us-east-1", "config": config}
        if o.endpoint_url is not None:
            kwargs["endpoint_url"] = o.endpoint_url
        if o.access_key_id is not None and o.secret_access_key is not None:
            kwargs["aws_access_key_id"] = o.access_key_id
            kwargs["aws_secret_access_key"] = o.secret_access_key
            if o.session_token is not None:
                kwargs["aws_session_token"] = o.session_token
        return _session().create_client("s3", **kwargs)

    def _full(self, key: str) -> str:
        return self._prefix + key


def _no_expect_header(params: Any, **_: Any) -> None:
    """No ``Expect: 100-continue``: bodies are small or parts, and a conditional PUT that
    the server refuses before reading the body then stalls the client for a second."""
    params.get("headers", {}).pop("Expect", None)


_SESSION: list[Any] = []


def _session() -> Any:
    """One botocore session per process: it caches the parsed S3 model (0.3 s a load)."""
    if not _SESSION:
        _SESSION.append(AioSession())
    return _SESSION[0]


def _classify(op: str, key: str, e: Any, missing_is_precondition: bool) -> _Retry:
    """The retry kind of an S3 error reply, or the typed error it stands for."""
    code = str(e.response.get("Error", {}).get("Code", ""))
    status = _status(e)
    if status == 412 or code == "PreconditionFailed":
        raise PreconditionFailed("object store condition failed", op=op, key=key) from None
    if status == 404 and code != "NoSuchBucket":
        if missing_is_precondition:  # If-Match on a missing key: AWS says 404
            raise PreconditionFailed("object missing for If-Match", op=op, key=key) from None
        raise NotFound("object not found", op=op, key=key, code=code) from None
    if status in _RETRY_STATUSES or code in _RETRY_CODES:
        return _Retry(_Fault.TRANSIENT, f"{status} {code}")
    if code == "KeyTooLongError":  # SeaweedFS: a segment over 255 bytes
        raise InvalidPath("object key too long for this store", op=op, key=key) from None
    raise Internal(f"object store refused {op}", op=op, key=key, status=status, code=code) from None


def _status(e: Any) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _check_range_reply(content_range: object, data: bytes, start: int, end: int | None) -> bytes:
    """Never hand back a short ranged read as if it were the whole range."""
    if content_range is None:
        return data[start:end]  # the server ignored Range and sent the whole object
    m = _CONTENT_RANGE.match(str(content_range))
    if m is None:
        raise _Retry(_Fault.TRANSIENT, f"unreadable Content-Range {content_range!r}")
    first, last, total = (int(g) for g in m.groups())
    stop = total if end is None else min(end, total)
    if first != start or last + 1 != stop or len(data) != stop - start:
        raise _Retry(_Fault.TRANSIENT, f"range {first}-{last}/{total} for [{start}, {end})")
    return data


def _us(value: object) -> int:
    if not isinstance(value, dt.datetime):
        raise Internal("object store sent no modification time", value=repr(value))
    aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    return (aware - _EPOCH) // dt.timedelta(microseconds=1)


async def _local(key: str, call: Callable[..., T], *args: object) -> T:
    """Read the local file in a worker thread; an OS error becomes ``Unavailable``."""
    try:
        return await asyncio.to_thread(call, *args)
    except OSError as e:
        raise Unavailable(f"reading the file to upload: {e}", key=key) from e


async def _md5(data: bytes) -> bytes:
    if len(data) >= _MD5_IN_THREAD_BYTES:
        return await asyncio.to_thread(_md5_sync, data)
    return _md5_sync(data)


def _md5_sync(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    typed = [e for e in leaves if isinstance(e, EnrouteError)]
    return (typed or leaves)[0]
