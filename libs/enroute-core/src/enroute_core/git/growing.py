"""A pack read while it is still arriving: what the indexer asks of it.

A push's ingest starts at the body's first chunk, as ``git index-pack --stdin``
indexes what ``pack-objects`` sends while it sends it (docs/ingest.md, "Speed").
Its source (``enroute_core.storage.growing.GrowingSpool``, over the push's spool)
answers a read once the bytes asked are in, waiting meanwhile; the pack's size
is known only once the body ended, so :attr:`GrowingSource.size` waits for it
and the compiled index pass reads the entry region through
:meth:`GrowingSource.read_entries`, which never hands out the trailer's bytes
before the end tells where they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class BodyCut(Exception):
    """Raised to a reader of a :class:`GrowingSource` whose body will not complete (the
    client went, the body went over a bound, its receive deadline passed). Never reaches
    a client: the receive loop that cut the body answers for it."""


class GrowingSource(ABC):
    """A :class:`~enroute_core.git.source.ByteSource` whose bytes are still arriving.

    Every read waits for its bytes (or the body's end) and raises :class:`BodyCut`
    once the body is cut. A base class, not a protocol: the indexer tells one apart
    with ``isinstance``, which must not touch :attr:`size` (it waits)."""

    @property
    @abstractmethod
    def size(self) -> int:
        """The pack's size, once the body ended (waits for it)."""

    @abstractmethod
    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``, fewer only at the pack's end."""

    @abstractmethod
    def wait_for(self, need: int) -> int:
        """Wait until ``need`` bytes are in (``-1``: the whole body) or the body ended;
        the bytes in then."""

    @abstractmethod
    def read_entries(self, offset: int, length: int, minimum: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` of the entry region (the pack less its
        20-byte trailer), as many as have arrived: at least ``minimum``, fewer only where
        the region ends, which is known once the body ended."""
