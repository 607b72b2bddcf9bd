"""zlib streams as pack entries hold them: inflate to an exact size, find the stream's end.

Git ``Documentation/gitformat-pack.txt``, "pack-*.pack files have the following
format": each entry's data is one zlib stream (RFC 1950) with no length
prefix, so the only way to learn where an entry ends is to inflate it and see
where zlib stops. The entry header declares the inflated size; anything else
is a corrupt pack.

Reads go through :class:`~enroute_core.git.source.ByteSource` in bounded
windows: memory is one object's inflated size plus one window.
"""

from __future__ import annotations

import zlib

from enroute_core.base.errors import InvalidPack
from enroute_core.git.source import ByteSource

INFLATE_WINDOW_BYTES = 64 * 1024
"""Read window for inflating a stream at a random position."""

DEFLATE_LEVEL_DEFAULT = zlib.Z_DEFAULT_COMPRESSION


def deflate_bound(size: int) -> int:
    """An upper bound of a zlib stream's length for ``size`` input bytes.

    zlib's own ``deflateBound`` for default settings plus slack; used only to
    size the first read, never to judge a stream.
    """
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 64


def deflate(data: bytes | memoryview, level: int = DEFLATE_LEVEL_DEFAULT) -> bytes:
    """One complete zlib stream, as Git writes into loose objects and pack entries."""
    return zlib.compress(data, level)


class ExactInflater:
    """Inflate one zlib stream that must produce exactly ``size`` bytes.

    Push interface: :meth:`feed` bytes until :attr:`done`; :attr:`consumed` is
    then the exact compressed length. Output never exceeds ``size + 1`` bytes
    held at once, whatever the input claims.
    """

    __slots__ = ("_d", "_got", "_parts", "consumed", "done", "size")

    def __init__(self, size: int) -> None:
        self._d = zlib.decompressobj()
        self._parts: list[bytes] = []
        self._got = 0
        self.size = size
        self.consumed = 0
        self.done = False

    def feed(self, chunk: bytes | memoryview) -> None:
        """Feed the next compressed bytes; raises ``InvalidPack`` on a bad stream."""
        assert not self.done
        try:
            out = self._d.decompress(chunk, self.size - self._got + 1)
        except zlib.error as exc:
            raise InvalidPack(f"entry data is not a valid zlib stream: {exc}") from None
        self._got += len(out)
        if self._got > self.size:
            raise InvalidPack(f"entry data inflates to more than its declared size {self.size}")
        if out:
            self._parts.append(out)
        if self._d.eof:
            if self._got != self.size:
                raise InvalidPack(
                    f"entry data inflates to {self._got} bytes, its header says {self.size}"
                )
            self.consumed += len(chunk) - len(self._d.unused_data)
            self.done = True
        else:
            self.consumed += len(chunk)

    def result(self) -> bytes:
        assert self.done
        parts = self._parts
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)


def inflate_exact(data: bytes | memoryview, size: int) -> tuple[bytes, int]:
    """Inflate a stream held wholly in ``data``; return (bytes, compressed length)."""
    inflater = ExactInflater(size)
    inflater.feed(data)
    if not inflater.done:
        raise InvalidPack("entry data is truncated")
    return inflater.result(), inflater.consumed


def inflate_at(
    source: ByteSource,
    offset: int,
    size: int,
    end: int,
    *,
    window_bytes: int = INFLATE_WINDOW_BYTES,
    prefix: bytes | memoryview = b"",
) -> tuple[bytes, int]:
    """Inflate the stream at ``offset``, which must finish before ``end``.

    Return (inflated bytes, compressed length). ``prefix`` holds bytes from
    ``offset`` on that the caller has read already. Further reads are sized
    from :func:`deflate_bound`, so a small entry costs one ``read_at``.
    """
    assert 0 <= offset <= end <= source.size, (offset, end, source.size)
    inflater = ExactInflater(size)
    pos = offset
    if prefix:
        chunk = prefix[: min(len(prefix), end - offset, deflate_bound(size))]
        inflater.feed(chunk)
        pos += len(chunk)
    want = min(deflate_bound(size), window_bytes)
    while not inflater.done:
        length = min(want, end - pos)
        if length <= 0:
            raise InvalidPack("entry data is truncated")
        chunk = source.read_at(pos, length)
        if len(chunk) != length:
            raise InvalidPack("entry data is truncated")
        inflater.feed(chunk)
        pos += length
        want = window_bytes
    return inflater.result(), inflater.consumed
