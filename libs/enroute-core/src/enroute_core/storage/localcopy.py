"""One local copy of a layer file: a sparse file and a bitmap of its 1 MiB chunks.

Seed 004, "Files and tiers": a copy this node wrote has every chunk; a file
opened from the object store starts with none, and loads fill it in.
"Never waiting on the object store", Residency: reading a chunk that is not
present raises :class:`~enroute_core.base.errors.NotLocal`; there is no
fallback to the store. A chunk recorded by a previous run is *unchecked*: it
is not readable until a load checks it against its hash ("A copy found after
a restart ... Each is checked against its hash before first use").

"Linked local copies": a linked copy is opened read-only and has every chunk.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Self

from enroute_core.base.errors import NotLocal
from enroute_core.storage.diskbudget import (
    CHUNK_BYTES,
    bitmap_from_chunks,
    chunk_count_of,
    chunks_for,
    chunks_of_bitmap,
)
from enroute_core.storage.localfile import LocalFile


class LocalCopy:
    """A :class:`~enroute_core.git.source.ByteSource` over the present chunks of one file."""

    def __init__(self, file: LocalFile, size: int, *, linked: bool) -> None:
        """Use :meth:`create_sparse`, :meth:`open_existing` or :meth:`open_linked`."""
        self._file = file
        self._size = size
        self.linked = linked
        self.known = not linked
        """Every chunk it answers is of known state: this process wrote it, or a load
        checked it against its hash before it became readable (seed 004, "Layers": chunk
        hashes check "bytes read by range from the object store, and chunks of a local
        copy of unknown state ... before first use"), so a reader need not check it
        again. A copy's chunks become readable only so (:meth:`open_existing` keeps a
        previous run's chunks unchecked until a load checks them), except the metadata
        a remote open fetches, which the reader checks as it opens. A linked copy is the
        stored file itself, of unknown state unless this process published it
        (``LayerService.publish``)."""
        self.chunk_count = chunk_count_of(size)
        self._present = bytearray(self.chunk_count)
        self._unchecked = bytearray(self.chunk_count)
        self._lock = threading.Lock()

    @classmethod
    def create_sparse(cls, path: str, size: int) -> LocalCopy:
        """A new copy with no chunks: the file has its length and no blocks."""
        f = LocalFile.open_rw(path)
        os.ftruncate(f.fd, 0)
        os.ftruncate(f.fd, size)
        return cls(f, size, linked=False)

    @classmethod
    def open_existing(cls, path: str, size: int, *, present: list[int], checked: bool) -> LocalCopy:
        """A copy on disk; ``present`` chunks are readable at once only when ``checked``."""
        f = LocalFile.open_rw(path, create=False)
        if f.size != size:
            os.ftruncate(f.fd, size)
        copy = cls(f, size, linked=False)
        for c in present:
            if checked:
                copy._present[c] = 1
            else:
                copy._unchecked[c] = 1
        return copy

    @classmethod
    def open_linked(cls, path: str, size: int) -> LocalCopy:
        copy = cls(LocalFile.open_read(path), size, linked=True)
        copy._present[:] = b"\x01" * copy.chunk_count
        return copy

    @property
    def size(self) -> int:
        return self._size

    @property
    def path(self) -> str:
        return self._file.path

    @property
    def fd(self) -> int:
        return self._file.fd

    def is_present(self, chunk: int) -> bool:
        return bool(self._present[chunk])

    def is_unchecked(self, chunk: int) -> bool:
        return bool(self._unchecked[chunk])

    def missing(self, chunks: range | list[int]) -> list[int]:
        """Chunks of ``chunks`` that are not readable yet (absent or unchecked)."""
        with self._lock:
            return [c for c in chunks if not self._present[c]]

    def complete(self) -> bool:
        with self._lock:
            return all(self._present)

    def settled(self) -> bool:
        """Every chunk is readable and stays so: a linked copy, or a complete one that
        no budget can evict from (seed 004, "Disk budget": only budgeted copies lose
        chunks). Readers of a settled copy need no loads, so the load step is skipped."""
        return self.linked or self.complete()

    def mark_present(self, chunks: range | list[int]) -> None:
        with self._lock:
            for c in chunks:
                self._present[c] = 1
                self._unchecked[c] = 0

    def drop(self, chunk: int) -> None:
        with self._lock:
            self._present[chunk] = 0
            self._unchecked[chunk] = 0

    def bitmap(self) -> bytes:
        """The catalog form: checked and unchecked chunks are both on disk."""
        with self._lock:
            on_disk = [c for c in range(self.chunk_count) if self._present[c] or self._unchecked[c]]
        return bitmap_from_chunks(on_disk, self.chunk_count)

    def read_at(self, offset: int, length: int) -> bytes:
        """Local bytes only; a chunk that is not present raises ``NotLocal``."""
        end = min(offset + length, self._size)
        if end <= offset:
            return b""
        need = self.missing(chunks_for(offset, end - offset))
        if need:
            raise NotLocal(
                f"{self.path}: chunks {need[:8]} are not local", offset=offset, length=length
            )
        return self._file.read_at(offset, end - offset)

    def read_raw(self, offset: int, length: int) -> bytes:
        """Bytes on disk whatever the bitmap says (checking unchecked chunks)."""
        return self._file.read_at(offset, length)

    def write_chunks(self, offset: int, data: bytes) -> None:
        """Write fetched bytes (runs in a worker thread); the caller marks them present."""
        self._file.write_at(offset, data)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def chunks_of_record(bitmap: bytes, count: int) -> list[int]:
    """The chunks a catalog bitmap records."""
    return chunks_of_bitmap(bitmap, count)


__all__ = ["CHUNK_BYTES", "LocalCopy", "chunks_of_record"]
