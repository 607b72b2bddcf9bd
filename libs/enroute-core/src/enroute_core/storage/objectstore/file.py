"""The ``file://`` object store: a directory with the guarantees of S3 conditional writes.

DESIGN, "Object store layout": "The ``file://`` store gives the same
guarantees with a lock plus rename." Seed 004, "Linked local copies": stored
files are written once (to a temporary name, then renamed) and never changed,
so a compute may hard-link them as its local copies.

Key to path (``docs/objectstore.md``)::

    key       "repos/My.Repo/state"
    segments  "repos" / "My.Repo" / "state"
    encoded   "repos" / "%4Dy.%52epo" / "state~"

1. A segment keeps ``a-z 0-9 - _ .`` and writes every other UTF-8 byte as
   ``%XX`` (upper-case hex). Upper-case letters are escaped too, so two keys
   never share a path on a case-insensitive filesystem; a ``.`` that starts a
   name is escaped, so names starting with ``.`` belong to the store
   (temporary files, ``.enroute-store/`` locks).
2. The last segment (the object) ends with ``~``; directories never do. A key
   may therefore be both an object and a prefix of others (``a`` and ``a/b``),
   as on S3.
3. A name holds at most 240 bytes of encoding (most filesystems allow 255).
   A longer segment is split into chunks; every chunk but the last is a
   directory whose name ends with ``+`` and continues the same segment.

Writes go to ``.tmp-*`` in the target directory, are fsynced, then
``os.replace``-d under a lock, and the directory is fsynced. The lock is a
per-store ``asyncio.Lock`` plus an ``fcntl.flock`` on a lock file, one of 64
stripes chosen by key, so processes sharing the directory are serialised too.
ETags are the MD5 of the content in quotes (what S3 gives a single-part
object), kept in the ``user.enroute.etag`` extended attribute where the
filesystem has them and computed from the bytes where it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import heapq
import itertools
import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self, TypeVar

from enroute_core.base.errors import (
    CorruptData,
    InvalidPath,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    Timeout,
    Unavailable,
)
from enroute_core.storage.objectstore.base import (
    ListPage,
    ObjectInfo,
    StoreOptions,
    check_conditions,
    check_key,
    check_list_limit,
    check_prefix,
    check_range,
    md5_etag,
    strip_etag,
)

NAME_CHUNK_BYTES_MAX = 240
FILE_MARK = "~"
CONTINUE_MARK = "+"
STORE_DIR = ".enroute-store"
LOCK_STRIPES = 64
XATTR_ETAG = "user.enroute.etag"
COPY_BLOCK_BYTES = 1 << 20
_LITERAL = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")
_HEX = frozenset(b"0123456789ABCDEF")
_DIR_ATTEMPTS_MAX = 5  # makedirs against a concurrent delete pruning empty directories
_tmp_counter = itertools.count()
T = TypeVar("T")


def encode_key(key: str) -> list[str]:
    """Path components (relative to the root) of a key; see the module docstring."""
    check_key(key)
    segments = key.split("/")
    components: list[str] = []
    for i, segment in enumerate(segments):
        chunks = _encode_segment(segment.encode("utf-8"))
        components.extend(chunk + CONTINUE_MARK for chunk in chunks[:-1])
        last = i == len(segments) - 1
        components.append(chunks[-1] + (FILE_MARK if last else ""))
    return components


def _encode_segment(raw: bytes) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for b in raw:
        token = chr(b) if b in _LITERAL and not (size == 0 and b == 0x2E) else f"%{b:02X}"
        if size + len(token) > NAME_CHUNK_BYTES_MAX:
            chunks.append("".join(current))
            current, size = [], 0
            token = chr(b) if b in _LITERAL and b != 0x2E else f"%{b:02X}"
        current.append(token)
        size += len(token)
    chunks.append("".join(current))
    return chunks


def _unquote(name: str) -> bytes | None:
    """Strict inverse of the segment encoding; None for a name the store never writes."""
    out = bytearray()
    raw = name.encode("ascii", errors="replace")
    i = 0
    while i < len(raw):
        b = raw[i]
        if b == 0x25:  # %
            pair = raw[i + 1 : i + 3]
            if len(pair) != 2 or not all(c in _HEX for c in pair):
                return None
            out.append(int(pair, 16))
            i += 3
        elif b in _LITERAL:
            out.append(b)
            i += 1
        else:
            return None
    return bytes(out)


def decode_components(components: list[str]) -> str | None:
    """The key a path names, or None when the path is not one ``encode_key`` makes."""
    raw = bytearray()
    for i, name in enumerate(components):
        last = i == len(components) - 1
        is_file = name.endswith(FILE_MARK)
        is_continued = name.endswith(CONTINUE_MARK)
        part = _unquote(name[:-1] if is_file or is_continued else name)
        if part is None or is_file != last:
            return None
        raw += part
        if not (is_file or is_continued):
            raw += b"/"
    try:
        key = raw.decode("utf-8")
        ok = encode_key(key) == components
    except (UnicodeDecodeError, InvalidPath):
        return None
    return key if ok else None


class FileStore:
    """An :class:`~enroute_core.storage.objectstore.base.ObjectStore` over a local directory."""

    def __init__(self, root: str | os.PathLike[str], options: StoreOptions | None = None) -> None:
        self._root = os.path.abspath(os.fspath(root))
        self._options = options or StoreOptions()
        self._options.check()
        self._locks = [asyncio.Lock() for _ in range(LOCK_STRIPES)]
        self._xattr = hasattr(os, "setxattr")
        self._linking = True
        self._closed = False

    @property
    def url(self) -> str:
        return "file://" + self._root

    @property
    def root(self) -> str:
        return self._root

    @property
    def linking(self) -> bool:
        """False once a link failed with EXDEV (the store is on another filesystem)."""
        return self._linking

    def path_of(self, key: str) -> str:
        return os.path.join(self._root, *encode_key(key))

    # -- reads

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        first, stop = check_range(start, end)
        path = self.path_of(key)
        whole = first == 0 and stop is None
        data, _ = await _io("get", key, self._read_sync, path, key, first, stop, whole)
        return data

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return await _io("get", key, self._read_sync, self.path_of(key), key, 0, None, True)

    async def head(self, key: str) -> ObjectInfo | None:
        return await _io("head", key, self._info_sync, self.path_of(key), key)

    async def list(self, prefix: str, *, start_after: str | None = None, limit: int) -> ListPage:
        check_prefix(prefix)
        check_list_limit(limit)
        after = None if start_after is None else start_after.encode("utf-8")
        return await _io("list", prefix, self._list_sync, prefix.encode("utf-8"), after, limit)

    # -- writes

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        check_conditions(if_none_match, if_match)
        path = self.path_of(key)
        tmp, etag = await _io("put", key, self._write_tmp_sync, path, data, None)
        return await self._commit(
            key, tmp=tmp, final=path, etag=etag, if_none_match=if_none_match, if_match=if_match
        )

    async def put_file(
        self, key: str, path: str | os.PathLike[str], *, if_none_match: bool = False
    ) -> str:
        final = self.path_of(key)
        tmp, etag = await _io("put", key, self._write_tmp_sync, final, None, os.fspath(path))
        return await self._commit(
            key, tmp=tmp, final=final, etag=etag, if_none_match=if_none_match, if_match=None
        )

    async def delete(self, key: str) -> None:
        path = self.path_of(key)
        async with self._locks[_stripe(key)]:
            await _io("delete", key, self._delete_sync, key, path)

    async def link_local(self, key: str, dest_path: str | os.PathLike[str]) -> bool:
        if not self._linking:
            return False
        dest = os.fspath(dest_path)
        return await _io("link", key, self._link_sync, key, self.path_of(key), dest)

    async def same_file(self, key: str, path: str | os.PathLike[str]) -> bool:
        return await _io("stat", key, _same_inode, self.path_of(key), os.fspath(path))

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- blocking halves, run in a worker thread

    def _read_sync(
        self, path: str, key: str, start: int, end: int | None, whole: bool
    ) -> tuple[bytes, str]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound("object not found", key=key) from None
        try:
            size = os.fstat(fd).st_size
            stop = size if end is None else min(end, size)
            length = max(0, stop - start)
            if length > self._options.get_bytes_max:
                raise LimitExceeded("get_bytes_max", length, self._options.get_bytes_max)
            data = _pread_all(fd, start, length)
            if not whole:
                return data, ""
            etag = md5_etag(data)
            stored = self._stored_etag(fd)
            if self._options.verify_md5 and stored is not None and stored != etag:
                raise CorruptData(
                    "stored object does not match its ETag", section="objectstore", key=key
                )
            return data, etag
        finally:
            os.close(fd)

    def _info_sync(self, path: str, key: str) -> ObjectInfo | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            etag = self._etag_of_fd(fd)
        finally:
            os.close(fd)
        return ObjectInfo(key, st.st_size, etag, st.st_mtime_ns // 1000)

    def _stored_etag(self, fd: int) -> str | None:
        if not self._xattr:
            return None
        try:
            value = os.getxattr(fd, XATTR_ETAG).decode("ascii", errors="replace")
        except OSError:
            return None
        return value if len(value) == 34 else None

    def _etag_of_fd(self, fd: int) -> str:
        stored = self._stored_etag(fd)
        if stored is not None:
            return stored
        digest = hashlib.md5(usedforsecurity=False)
        offset = 0
        while block := os.pread(fd, COPY_BLOCK_BYTES, offset):
            digest.update(block)
            offset += len(block)
        return '"' + digest.hexdigest() + '"'

    def _current_etag(self, path: str) -> str | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return self._etag_of_fd(fd)
        finally:
            os.close(fd)

    def _write_tmp_sync(
        self, final: str, data: bytes | None, source: str | None
    ) -> tuple[str, str]:
        directory = os.path.dirname(final)
        tmp = os.path.join(directory, f".tmp-{os.getpid()}-{next(_tmp_counter)}")
        for attempt in range(_DIR_ATTEMPTS_MAX):
            self._makedirs(directory)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
                break
            except FileNotFoundError:
                if attempt == _DIR_ATTEMPTS_MAX - 1:
                    raise
        try:
            if data is not None:
                _write_all(fd, data)
                etag = md5_etag(data)
            else:
                assert source is not None
                etag = _copy_into(fd, source)
            if self._xattr:
                try:
                    os.setxattr(fd, XATTR_ETAG, etag.encode("ascii"))
                except OSError as e:
                    if e.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
                        raise
                    self._xattr = False
            if self._options.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp, etag

    async def _commit(
        self,
        key: str,
        *,
        tmp: str,
        final: str,
        etag: str,
        if_none_match: bool,
        if_match: str | None,
    ) -> str:
        try:
            async with self._locks[_stripe(key)]:
                await _io("put", key, self._commit_sync, key, tmp, final, if_none_match, if_match)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return etag

    def _commit_sync(
        self, key: str, tmp: str, final: str, if_none_match: bool, if_match: str | None
    ) -> None:
        lock_fd = self._flock(key)
        try:
            if if_none_match or if_match is not None:
                current = self._current_etag(final)
                if if_none_match and current is not None:
                    raise PreconditionFailed("object exists", key=key)
                if if_match is not None and (
                    current is None or strip_etag(current) != strip_etag(if_match)
                ):
                    raise PreconditionFailed("object changed or is missing", key=key)
            os.replace(tmp, final)
            if self._options.fsync:
                _fsync_dir(os.path.dirname(final))
        finally:
            os.close(lock_fd)  # closing the descriptor releases the flock

    def _delete_sync(self, key: str, path: str) -> None:
        lock_fd = self._flock(key)
        try:
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                return
            directory = os.path.dirname(path)
            if self._options.fsync:
                _fsync_dir(directory)
            # prune emptied directories so listing stays cheap; writers retry makedirs
            while directory != self._root:
                try:
                    os.rmdir(directory)
                except OSError:
                    break
                directory = os.path.dirname(directory)
        finally:
            os.close(lock_fd)

    def _link_sync(self, key: str, path: str, dest: str) -> bool:
        try:
            os.link(path, dest)
        except OSError as e:
            if e.errno == errno.EXDEV:
                self._linking = False
                return False
            if not os.path.exists(path):
                raise NotFound("object not found", key=key) from None
            return False
        return True

    def _makedirs(self, directory: str) -> None:
        """``makedirs`` that fsyncs every parent it adds an entry to."""
        missing: list[str] = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            if self._options.fsync:
                _fsync_dir(os.path.dirname(d))

    def _flock(self, key: str) -> int:
        lock_dir = os.path.join(self._root, STORE_DIR, "locks")
        self._makedirs(lock_dir)
        path = os.path.join(lock_dir, f"{_stripe(key):02d}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + self._options.lock_timeout_ms / 1000
        pause_s = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise Timeout("object store lock not acquired in time", key=key) from None
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 0.02)

    def _list_sync(self, prefix: bytes, start_after: bytes | None, limit: int) -> ListPage:
        """Keys in byte order by a best-first walk: a directory is opened only when its
        lower bound (the key prefix it stands for) is the smallest thing left."""
        heap: list[tuple[bytes, int, int, str]] = [(b"", 1, 0, self._root)]
        seq = itertools.count(1)
        items: list[ObjectInfo] = []
        while heap:
            bound, kind, _, path = heapq.heappop(heap)
            if kind == 0:
                info = self._listed_info(path, bound)
                if info is None:
                    continue
                if len(items) == limit:
                    return ListPage(tuple(items), items[-1].key)
                items.append(info)
                continue
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                child = _child(entry, bound)
                if child is None:
                    continue
                child_bound, child_kind = child
                if _wanted(child_bound, child_kind, prefix, start_after):
                    heapq.heappush(heap, (child_bound, child_kind, next(seq), entry.path))
        return ListPage(tuple(items), None)

    def _listed_info(self, path: str, raw_key: bytes) -> ObjectInfo | None:
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            return None
        rel = os.path.relpath(path, self._root).split(os.sep)
        if decode_components(rel) != key:
            return None
        return self._info_sync(path, key)


async def _io(op: str, key: str, call: Callable[..., T], *args: object) -> T:
    """Run blocking file I/O in a worker thread; an OS error becomes ``Unavailable``."""
    try:
        return await asyncio.to_thread(call, *args)
    except OSError as e:
        name = errno.errorcode.get(e.errno or 0, "EIO")
        raise Unavailable(f"object store {op}: {e.strerror}", op=op, key=key, errno=name) from e


def _child(entry: os.DirEntry[str], bound: bytes) -> tuple[bytes, int] | None:
    """(lower bound of the keys under ``entry``, 0 for an object / 1 for a directory)."""
    name = entry.name
    if name.startswith("."):
        return None
    mark = name[-1]
    if mark == FILE_MARK:
        part = _unquote(name[:-1])
        if part is None or not entry.is_file(follow_symlinks=False):
            return None
        return bound + part, 0
    if not entry.is_dir(follow_symlinks=False):
        return None
    if mark == CONTINUE_MARK:
        part = _unquote(name[:-1])
        return None if part is None else (bound + part, 1)
    part = _unquote(name)
    return None if part is None else (bound + part + b"/", 1)


def _wanted(bound: bytes, kind: int, prefix: bytes, start_after: bytes | None) -> bool:
    if kind == 0:
        return bound.startswith(prefix) and (start_after is None or bound > start_after)
    if not (bound.startswith(prefix) or prefix.startswith(bound)):
        return False
    # every key below starts with ``bound`` and is longer than it
    return start_after is None or bound > start_after or start_after.startswith(bound)


def _stripe(key: str) -> int:
    return hashlib.md5(key.encode("utf-8"), usedforsecurity=False).digest()[0] % LOCK_STRIPES


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    parts: list[bytes] = []
    done = 0
    while done < length:
        block = os.pread(fd, min(length - done, 64 << 20), offset + done)
        if not block:
            break  # stored files never shrink; a short file is read as it is
        parts.append(block)
        done += len(block)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _copy_into(fd: int, source: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while block := os.read(src, COPY_BLOCK_BYTES):
            digest.update(block)
            _write_all(fd, block)
    finally:
        os.close(src)
    return '"' + digest.hexdigest() + '"'


def _same_inode(a: str, b: str) -> bool:
    """Both paths name one file (device and inode); a missing one is not the same."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
