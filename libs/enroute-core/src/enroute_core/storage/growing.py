"""The push's spool read while the receive loop still writes it (docs/ingest.md, "Speed").

The receive loop appends each chunk of the pack to its spool and says so
(:meth:`GrowingSpool.grew`), then that the body ended (:meth:`~GrowingSpool.end`)
or that it never will (:meth:`~GrowingSpool.cut`); the ingest thread reads through
the :class:`~enroute_core.git.growing.GrowingSource` methods, which wait, the
interpreter lock released, until the bytes asked are there or the body ended.
"""

from __future__ import annotations

import threading

from enroute_core.git.growing import BodyCut, GrowingSource
from enroute_core.git.pack import PACK_TRAILER_BYTES
from enroute_core.git.source import ByteSource

READ_BYTES_MIN = 64 * 1024
"""The least a sequential read waits for (unless the body ends first)."""


class GrowingSpool(GrowingSource):
    """A :class:`~enroute_core.git.growing.GrowingSource` over a spool still being written.

    One writer (the receive loop: :meth:`grew`, :meth:`end`, :meth:`cut`), any reader
    threads. The spool's ``read_at`` is called only below what :meth:`grew` reported.
    """

    __slots__ = ("_arrived", "_changed", "_cut", "_ended", "_read_max", "_spool", "_wanted")

    def __init__(self, spool: ByteSource) -> None:
        self._spool = spool
        self._changed = threading.Condition(threading.Lock())
        self._arrived = 0
        self._wanted = 0  # what a waiting reader needs: below it, a chunk wakes nobody
        self._ended = False
        self._cut: str | None = None
        self._read_max = 0

    # -- the writer ------------------------------------------------------------------------

    def grew(self, arrived: int) -> None:
        """The spool now holds ``arrived`` bytes."""
        with self._changed:
            self._arrived = arrived
            if arrived >= self._wanted:
                self._changed.notify_all()

    def end(self) -> None:
        """The body is all in: the spool's size is the pack's."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def cut(self, reason: str) -> None:
        """The body will not complete: every read from now on raises :class:`BodyCut`."""
        with self._changed:
            if self._cut is None:
                self._cut = reason
            self._changed.notify_all()

    # -- readers ---------------------------------------------------------------------------

    @property
    def arrived(self) -> int:
        """The bytes in so far (no wait)."""
        return self._arrived

    @property
    def ended(self) -> bool:
        """Whether the body is all in (no wait)."""
        return self._ended

    @property
    def consumed(self) -> int:
        """The furthest byte a reader was handed so far (tests prove the overlap with it)."""
        return self._read_max

    @property
    def size(self) -> int:
        """The pack's size, once the body ended (waits for it)."""
        return self.wait_for(-1)

    def wait_for(self, need: int) -> int:
        """Wait until ``need`` bytes are in (``-1``: the whole body) or the body ended;
        the bytes in then. Raises :class:`BodyCut` once the body is cut."""
        changed = self._changed
        with changed:
            while True:
                if self._cut is not None:
                    raise BodyCut(self._cut)
                if self._ended or (0 <= need <= self._arrived):
                    return self._arrived
                self._wanted = need if need >= 0 else 1 << 62
                changed.wait()
                self._wanted = 0

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``, fewer only at the pack's end.

        Once the body is all in (and not cut) nothing can change but a cut, so no lock is
        taken: ingest's later steps read the spool an entry at a time (504,433 reads on the
        large profile's push), and the wait's lock was 0.4 s of them."""
        if self._ended and self._cut is None:
            return self._read(offset, min(length, self._arrived - offset))
        arrived = self.wait_for(offset + length)
        return self._read(offset, min(length, arrived - offset))

    def read_entries(self, offset: int, length: int, minimum: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` of the entry region (the pack less its
        trailer), as many as have arrived: at least ``minimum``, fewer only where the
        region ends, which is known once the body ended. The compiled index pass's
        sequential read; it waits for :data:`READ_BYTES_MIN` at least (or ``length``), so
        that a body arriving in small pieces is not read a piece a call."""
        want = max(minimum, min(length, READ_BYTES_MIN))
        arrived = self.wait_for(offset + want + PACK_TRAILER_BYTES)
        return self._read(offset, min(length, arrived - PACK_TRAILER_BYTES - offset))

    def _read(self, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        data = self._spool.read_at(offset, length)
        self._read_max = max(self._read_max, offset + len(data))
        return data
