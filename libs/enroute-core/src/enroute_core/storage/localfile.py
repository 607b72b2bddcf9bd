"""Positional reads and writes of local files, and hole punching.

Seed 004, "Pages and memory": the disk space manager "gives positional and
sequential reads and scratch files", and "Nothing is memory-mapped": every
byte comes from ``os.pread`` on a descriptor, so a disk error is an
``OSError`` in the reading thread, never a SIGBUS.

Seed 004, "Disk budget": eviction frees the blocks of a chunk by punching a
hole (``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)``). Python has no
binding for ``fallocate`` with a mode, so it is called through ctypes on
Linux. Elsewhere, and on filesystems that refuse it, :func:`punch_hole` raises
:class:`HolePunchUnsupported` and the budget stops evicting (see
``diskbudget.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import itertools
import os
import secrets
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Self

from enroute_core.base.errors import CorruptData

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

# A pread never returns more than this per call; reads loop over it.
_PREAD_BYTES_MAX = 1 << 30


class HolePunchUnsupported(OSError):
    """The platform or the filesystem cannot punch holes."""


def pread_full(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``, or fewer only at end of file.

    ``os.pread`` may return short reads; the loop is bounded because every
    round either advances or stops at end of file.
    """
    assert offset >= 0 and length >= 0, (offset, length)
    first = os.pread(fd, min(length, _PREAD_BYTES_MAX), offset)
    if len(first) == length or not first:
        return first
    parts = [first]
    got = len(first)
    while got < length:
        part = os.pread(fd, min(length - got, _PREAD_BYTES_MAX), offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def pwrite_full(fd: int, offset: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote nothing at {offset + done}")
        done += n


class LocalFile:
    """One open descriptor with positional reads; a :class:`ByteSource` over a local file.

    Seed 004, "Files and tiers": a local copy is opened once and read by
    position from any thread; ``os.pread`` keeps no shared file offset, so
    concurrent reads need no lock.
    """

    __slots__ = ("_fd", "_path", "_writable")

    def __init__(self, fd: int, path: str, writable: bool) -> None:
        """Use :meth:`open_read` or :meth:`open_rw`."""
        self._fd = fd
        self._path = path
        self._writable = writable

    @classmethod
    def open_read(cls, path: str | os.PathLike[str]) -> LocalFile:
        name = os.fspath(path)
        return cls(os.open(name, os.O_RDONLY | os.O_CLOEXEC), name, False)

    @classmethod
    def open_rw(cls, path: str | os.PathLike[str], *, create: bool = True) -> LocalFile:
        """Read and write; scratch files and local copies that loads fill in."""
        name = os.fspath(path)
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        return cls(os.open(name, flags, 0o600), name, True)

    @property
    def fd(self) -> int:
        assert self._fd >= 0, "file is closed"
        return self._fd

    @property
    def path(self) -> str:
        return self._path

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def read_at(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``, or fewer only at end of file."""
        return pread_full(self.fd, offset, length)

    def read_exact(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes; a short read means the file was cut."""
        data = pread_full(self.fd, offset, length)
        if len(data) != length:
            raise CorruptData(
                f"{self._path}: {len(data)} bytes at {offset}, wanted {length}",
                section="local file",
                offset=offset,
                length=length,
            )
        return data

    def read_padded(self, offset: int, length: int) -> bytes:
        """``length`` bytes, zeros past end of file: scratch pages never written back."""
        data = pread_full(self.fd, offset, length)
        return data + bytes(length - len(data)) if len(data) < length else data

    def write_at(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        assert self._writable, f"{self._path} is open read-only"
        pwrite_full(self.fd, offset, data)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ScratchFile:
    """A file for one operation: appended in order, read by position, removed when closed.

    Seed 004, "Storage service": scratch holds spooled request bodies and layer
    builders for one operation, and "a finished layer is sealed ... in a
    scratch file that publishing moves into place". :meth:`append` writes at
    the end, :meth:`read_at` makes it a :class:`~enroute_core.git.source.ByteSource`
    (reads stop at what was appended), and :meth:`close` removes the file if it
    is still there (publishing may have moved it into place).
    """

    __slots__ = ("_fd", "_path", "_size")

    def __init__(self, directory: str | os.PathLike[str], prefix: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(os.fspath(directory), scratch_name(prefix))
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        self._fd = os.open(self._path, flags, 0o600)
        self._size = 0

    @property
    def path(self) -> str:
        return self._path

    @property
    def size(self) -> int:
        return self._size

    def append(self, data: bytes | bytearray | memoryview) -> None:
        assert self._fd >= 0, "scratch file is closed"
        pwrite_full(self._fd, self._size, data)
        self._size += len(data)

    def read_at(self, offset: int, length: int) -> bytes:
        """Appended bytes only; fewer than ``length`` only at the end."""
        assert self._fd >= 0, "scratch file is closed"
        assert offset >= 0 and length >= 0, (offset, length)
        length = min(length, self._size - offset)
        return pread_full(self._fd, offset, length) if length > 0 else b""

    def read_all(self) -> bytes:
        return self.read_at(0, self._size)

    def close(self) -> None:
        """Close and remove the file (gone already when publishing moved it)."""
        path = self._path
        self._release()
        self._path = ""
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_scratch_counter = itertools.count()


def scratch_name(prefix: str) -> str:
    """A new scratch file name: ``<prefix>-<pid>-<counter>-<random>``.

    Pid and counter keep names apart in this run; the random part, from a crashed
    run's leftovers (``O_EXCL`` refuses a name that exists). The pid tells this
    process's files from an earlier run's (:func:`remove_scratch_leftovers`).
    """
    return f"{prefix}-{os.getpid()}-{next(_scratch_counter)}-{secrets.token_hex(4)}"


def remove_scratch_leftovers(directory: str | os.PathLike[str]) -> tuple[int, int]:
    """Remove the files an earlier run left in a scratch directory; (files, bytes).

    Seed 004, "Storage service": scratch holds files for one operation (spooled
    packs, layer builders, links and copies on their way into place), so a file
    of another process (its name does not hold this pid, or holds none) belongs
    to a run that stopped during that operation: a crash, or a shutdown while a
    link into place was being made. One node's directory serves one process.
    """
    ours = f"-{os.getpid()}-"
    files = size = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if ours in entry.name or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                held = entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
                files += 1
                size += held
    return files, size


# -- hole punching ---------------------------------------------------------------------------


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    func = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if func is None:
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    func.restype = ctypes.c_int
    fallocate: Callable[[int, int, int, int], int] = func
    return fallocate


_FALLOCATE = _load_fallocate()
_UNSUPPORTED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.ENOTSUP})


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the blocks of ``[offset, offset + length)``; the file keeps its size.

    Reads of the range return zeros afterwards, which is why the disk budget
    clears a chunk's bit and bumps the file's epoch first (seed 004, "Disk
    budget", "Races").
    """
    assert offset >= 0 and length > 0, (offset, length)
    if _FALLOCATE is None:
        raise HolePunchUnsupported(errno.EOPNOTSUPP, "fallocate is not available here")
    mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    if _FALLOCATE(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        if err in _UNSUPPORTED_ERRNOS:
            raise HolePunchUnsupported(err, os.strerror(err))
        raise OSError(err, os.strerror(err))


def hole_punch_supported(directory: str | os.PathLike[str]) -> bool:
    """Probe ``directory``'s filesystem once: can it punch holes? (The layer service
    asks at start, so a budget that cannot evict is said before it is needed.)"""
    probe = os.path.join(os.fspath(directory), f".enroute-punch-probe-{os.getpid()}")
    fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        pwrite_full(fd, 0, b"\x01" * 8192)
        punch_hole(fd, 0, 4096)
    except HolePunchUnsupported:
        return False
    finally:
        os.close(fd)
        os.unlink(probe)
    return True
