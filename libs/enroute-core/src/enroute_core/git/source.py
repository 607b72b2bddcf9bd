"""The positional-read interface every random-access format reads through.

Seed 004, "Layering": "The Git formats read bytes through a positional-read
interface, and know nothing else." Storage implements it over pool pages and
local files; tests and in-memory layers use :class:`BytesSource`.
"""

from __future__ import annotations

from typing import Protocol


class ByteSource(Protocol):
    @property
    def size(self) -> int:
        """Total length in bytes."""
        ...

    def read_at(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``, or fewer only at the end of the source."""
        ...


class BytesSource:
    """A :class:`ByteSource` over bytes held in memory."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = bytes(data)

    @property
    def size(self) -> int:
        return len(self._data)

    @property
    def data(self) -> bytes:
        """The bytes themselves, for compiled code that reads them where they lie."""
        return self._data

    def read_at(self, offset: int, length: int) -> bytes:
        assert offset >= 0 and length >= 0, (offset, length)
        return self._data[offset : offset + length]
