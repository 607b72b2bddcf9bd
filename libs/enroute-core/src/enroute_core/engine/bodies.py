"""Object bodies during one ingest: re-read from the pack or the snapshot, cached in bytes.

Ingest keeps no body it does not need right now (seed 004, "Pages and
memory": a bounded cache per concurrent ingest). A body that fell out of the
cache is rebuilt from the pack along its delta chain (gitformat-pack,
"Deltified representation"), the way the indexer rebuilds its bases, or
read again from the snapshot. Held: the LRU (``ingest_body_cache_bytes_max``)
and the bodies along the one chain being rebuilt. That is the push's own
allowance beside the buffer pool, not a pool charge: a refused charge would
make ingest rebuild chains again and again (docs/buffer-pool.md, "What a
compute's memory is").

A tree the cache drops goes to a spill file when the caller gave one
(:class:`SpillFile`; a push gives a scratch file): the segment diff reads every
new tree and its parents' trees in commit order, while the pack holds them in
its own order as deltas of one another, so on a history whose trees outgrow the
cache a dropped tree was rebuilt along its chain once per commit that read it
(docs/ingest.md, "Speed"). From the spill it is one read of its own length.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

from enroute_core.base.errors import InvalidObject, InvalidPack
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine.snapshot import SnapshotObjects
from enroute_core.git.delta import apply_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.pack import PACK_TRAILER_BYTES, read_entry_at
from enroute_core.git.packindexer import PackObjects
from enroute_core.git.source import ByteSource


class SpillFile(Protocol):
    """Where dropped trees go: appended in order, read by position
    (``storage.localfile.ScratchFile``), removed when closed."""

    @property
    def size(self) -> int: ...

    def append(self, data: bytes | bytearray) -> None: ...

    def read_at(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


_SPILL_LENGTH_BITS = 32  # a spilled tree's place: offset << 32 | length (one int per tree)
_SPILL_MASK = (1 << _SPILL_LENGTH_BITS) - 1
_SPILL_WRITE_BYTES = 1 << 20
"""Spilled trees are appended to the file in writes of about this size: one write per tree
was 277,265 ``pwrite`` calls on the large profile's push (1.84 GiB of trees), several
seconds of system time."""


class BodyCache:
    """LRU of (type, body) by oid, bounded in bytes; a body over the bound is not kept.

    With ``spill`` (a factory, called at the first tree dropped), a tree dropped
    from the LRU is appended to that file once and read back from it on a miss:
    one int per spilled tree in memory, the bodies on disk. Bounded by the
    trees' bytes, which the pack's delta expansion bound limits
    (``pack_delta_expansion_ratio_max``, docs/ingest.md). :meth:`close` removes it.
    """

    __slots__ = (
        "_bytes",
        "_file",
        "_index_of",
        "_items",
        "_keep_read_backs",
        "_max",
        "_on_disk",
        "_pending",
        "_places",
        "_spill",
        "_spilled",
        "_spilled_bytes",
    )

    def __init__(self, max_bytes: int, spill: Callable[[], SpillFile] | None = None) -> None:
        self._items: OrderedDict[ObjectId, tuple[ObjectType, bytes]] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes
        self._spill = spill
        self._file: SpillFile | None = None
        self._spilled: dict[ObjectId, int] = {}
        self._spilled_bytes = 0  # what the spill file held when it was closed
        # Once the pack's oids are indexed (index_spills): spilled places by pack index
        # (0: not spilled), the dict keeping only trees from elsewhere.
        self._index_of: Callable[[ObjectId], int | None] | None = None
        self._places = array("q")
        self._pending = bytearray()
        """Spilled trees not written yet: the file's next bytes (_SPILL_WRITE_BYTES)."""
        self._on_disk: set[ObjectId] = set()
        """Trees in the LRU read back from the spill: dropped again, they write nothing. The
        segment diff reads 326,000 trees back on the large profile's push; asking each
        dropped one where it was spilled (the oid index, then the places) cost a second."""
        self._keep_read_backs = True
        """False once :meth:`shrink` was told ``read_backs=False``."""

    @property
    def spilled_bytes(self) -> int:
        """Bytes of trees written to the spill file (0 without one)."""
        return self._spilled_bytes if self._file is None else self._spill_end()

    def _spill_end(self) -> int:
        assert self._file is not None
        return self._file.size + len(self._pending)

    def get(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        found = self._items.get(oid)
        if found is not None:
            self._items.move_to_end(oid)
            return found
        place = self._place(oid)
        if not place or self._file is None:
            return None
        offset, length = place >> _SPILL_LENGTH_BITS, place & _SPILL_MASK
        written = self._file.size  # a tree is wholly in the file or wholly pending
        if offset < written:
            body = self._file.read_at(offset, length)
        else:
            body = bytes(self._pending[offset - written : offset - written + length])
        if self._keep_read_backs and length <= self._max:
            self._bytes += length
            if self._bytes > self._max:
                self._evict()
            self._items[oid] = found = (ObjectType.TREE, body)
            self._on_disk.add(oid)
            return found
        return ObjectType.TREE, body

    def index_spills(self, index_of: Callable[[ObjectId], int | None], count: int) -> None:
        """Keep spilled places by pack index from now on (``index_of``: an oid's index,
        None for an object not in the pack): a word per pack object instead of a dict
        entry, an oid and an int per spilled tree (about 120 bytes, 270,000 of them on
        the large profile)."""
        places = array("q", [0]) * count
        others: dict[ObjectId, int] = {}
        for oid, place in self._spilled.items():
            index = index_of(oid)
            if index is None:
                others[oid] = place
            else:
                places[index] = place
        self._index_of, self._places, self._spilled = index_of, places, others

    def _place(self, oid: ObjectId) -> int | None:
        if self._index_of is not None:
            index = self._index_of(oid)
            if index is not None:
                return self._places[index]
        return self._spilled.get(oid)

    def close(self) -> None:
        """Drop every body and remove the spill file, if one was made (called again: nothing)."""
        file, self._file = self._file, None
        self._spill = None
        self._spilled.clear()
        self._places = array("q")
        self._index_of = None
        self._items.clear()
        self._on_disk.clear()
        self._bytes = 0
        if file is not None:
            self._spilled_bytes = file.size + len(self._pending)
            file.close()
        self._pending = bytearray()

    def reader(
        self, type_: ObjectType, miss: Callable[[ObjectId], bytes]
    ) -> Callable[[ObjectId], bytes]:
        """A body of ``type_`` by oid: a hit in one call (as :meth:`get`, kept recent), any
        other oid through ``miss``. For callers that ask per tree entry (the segment diff)."""
        get = self._items.get
        move_to_end = self._items.move_to_end

        def read(oid: ObjectId) -> bytes:
            found = get(oid)
            if found is not None and found[0] is type_:
                move_to_end(oid)
                return found[1]
            return miss(oid)

        return read

    def put(self, oid: ObjectId, type_: ObjectType, body: bytes) -> None:
        """Keep ``body`` (called once per tree a push indexes: the test is inline)."""
        items = self._items
        if oid in items:
            return
        size = len(body)
        if size > self._max:
            if self._spill is not None and type_ is ObjectType.TREE:
                self._spill_tree(oid, body)
            return
        self._bytes += size
        if self._bytes > self._max:
            self._evict()
        items[oid] = (type_, body)

    def shrink(self, max_bytes: int, *, read_backs: bool = True) -> None:
        """Bound the cache to ``max_bytes`` from now on, dropping (or spilling) the least
        recently used bodies over it: for a step that needs less than the one before.

        ``read_backs=False`` drops the trees read back from the spill, and answers those
        read from now on without keeping them: for a step that reads each tree once
        (ingest's writing step, which deflates a tree it stores whole; on the large
        profile 2,754 of them filled its 16 MiB share, on top of its peak)."""
        self._max = min(self._max, max_bytes)
        if not read_backs:
            self._keep_read_backs = False
            items = self._items
            for oid in self._on_disk:
                self._bytes -= len(items.pop(oid)[1])
            self._on_disk.clear()
        self._evict()

    def _evict(self) -> None:
        items, on_disk = self._items, self._on_disk
        while self._bytes > self._max:
            old_oid, (old_type, old) = items.popitem(last=False)
            self._bytes -= len(old)
            if old_oid in on_disk:
                on_disk.remove(old_oid)
            elif self._spill is not None and old_type is ObjectType.TREE:
                self._spill_tree(old_oid, old)

    def _spill_tree(self, oid: ObjectId, body: bytes) -> None:
        if self._place(oid) or len(body) > _SPILL_MASK:
            return
        file = self._file
        if file is None:
            assert self._spill is not None
            file = self._file = self._spill()
        place = self._spill_end() << _SPILL_LENGTH_BITS | len(body)
        index = None if self._index_of is None else self._index_of(oid)
        if index is None:
            self._spilled[oid] = place
        else:
            self._places[index] = place
        pending = self._pending
        pending += body
        if len(pending) >= _SPILL_WRITE_BYTES:
            file.append(pending)
            pending.clear()


class ObjectBodies:
    """Bodies of pack objects (first copy of each oid) and of snapshot objects."""

    __slots__ = ("_by_oid", "_cache", "_end", "_limits", "_objects", "_snapshot", "_source")

    def __init__(
        self,
        source: ByteSource,
        objects: PackObjects,
        by_oid: Mapping[ObjectId, int],
        snapshot: SnapshotObjects,
        *,
        limits: Limits = DEFAULT_LIMITS,
        cache: BodyCache | None = None,
    ) -> None:
        self._source = source
        self._objects = objects
        self._by_oid = by_oid
        self._snapshot = snapshot
        self._limits = limits
        self._end = source.size - PACK_TRAILER_BYTES
        self._cache = cache if cache is not None else BodyCache(limits.ingest_body_cache_bytes_max)

    def get(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        """(type, body) from the cache, the pack, then the snapshot; None when nobody has it."""
        found = self._cache.get(oid)
        if found is not None:
            return found
        index = self._by_oid.get(oid)
        if index is not None:
            return self._from_pack(index)
        found = self._snapshot.read(oid)
        if found is not None:
            self._cache.put(oid, found[0], found[1])
        return found

    def tree_reader(self) -> Callable[[ObjectId], bytes]:
        """:meth:`tree` as one callable, a cached tree answered in one call."""
        return self._cache.reader(ObjectType.TREE, self.tree)

    def tree(self, oid: ObjectId) -> bytes:
        """A tree's body; a missing one or another type is an invalid object graph."""
        found = self.get(oid)
        if found is None:
            raise InvalidObject(f"tree {oid_to_hex(oid)} cannot be read", oid=oid_to_hex(oid))
        if found[0] != ObjectType.TREE:
            raise InvalidObject(
                f"object {oid_to_hex(oid)} is a {found[0].name.lower()}, not a tree",
                oid=oid_to_hex(oid),
            )
        return found[1]

    def _from_pack(self, index: int) -> tuple[ObjectType, bytes]:
        """Rebuild along the chain: walk to a cached or full body, then apply deltas back."""
        objects = self._objects
        chain: list[int] = []
        i = index
        while True:
            base_oid = objects.base_oid(i)
            if base_oid is None:
                body = self._entry_data(i)
                break
            chain.append(i)
            if len(chain) > self._limits.delta_chain_depth_max + 1:
                raise InvalidPack("delta chain does not end", offset=objects.offsets[i])
            cached = self._cache.get(base_oid)
            if cached is not None:
                body = cached[1]
                break
            base = self._by_oid.get(base_oid)
            if base is None:
                found = self._snapshot.read(base_oid)
                if found is None:
                    raise InvalidPack(
                        "thin base vanished from the snapshot", offset=objects.offsets[i]
                    )
                body = found[1]
                break
            i = base
        type_ = ObjectType(objects.types[index])
        for j in reversed(chain):
            body = apply_delta(body, self._entry_data(j), limits=self._limits)
            self._cache.put(objects.oid(j), type_, body)
        self._cache.put(objects.oid(index), type_, body)
        return type_, body

    def _entry_data(self, index: int) -> bytes:
        offset = self._objects.offsets[index]
        return read_entry_at(self._source, offset, self._limits, self._end).data
