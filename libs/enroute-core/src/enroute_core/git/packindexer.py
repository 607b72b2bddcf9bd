"""Resolve every entry of a pack: object id, type, size, delta base and depth.

This is what ``git index-pack`` computes and ``git verify-pack -v`` prints
(Git ``Documentation/gitformat-pack.txt``, "Deltified representation";
``git-index-pack``). One streaming pass over the entries in pack order:

1. A full entry (types 1..4) is hashed at once: ``sha1(b"<type> <size>\\0" + body)``.
2. An OFS_DELTA names an earlier entry; a REF_DELTA names an object id that
   may come earlier, later (git allows it) or not at all (a thin pack).
   A delta whose base is resolved is applied at once; one whose base is not
   yet known waits under that base, by entry index or by object id, keeping
   only its offset: its delta is re-read when the base arrives.
3. After the pass, bases that never appeared are asked of the caller
   (:mod:`enroute_core.git.thin`); a base nobody has is ``MissingObject``.

Inflated bodies are kept in an LRU bounded by
``Limits.pack_base_cache_bytes_max``; a base that fell out is rebuilt from
the pack along its chain. Chains longer than ``Limits.delta_chain_depth_max``
raise ``LimitExceeded``. Memory is the cache, the bodies along the chain
being resolved, and a few machine words per entry.

A delta bomb (a few KiB of copy instructions declaring a GiB result) is
charged before it is applied: as each delta is read, in pack order, its
declared result size must be at most ``object_bytes_max``, and the sizes
declared so far may pass ``pack_delta_expansion_free_bytes`` by at most
``pack_delta_expansion_ratio_max`` bytes per byte of the pack
(:func:`expansion_bytes_max`); over either, ``LimitExceeded`` before any
result is allocated.

A full blob entry that inflates to more than ``pack_stream_threshold_bytes``
is hashed as it inflates, a piece at a time, and never held (git's index-pack
streams a blob over ``core.bigFileThreshold`` so): ``on_object`` gets None for
its body, and it enters no cache. A delta on such a blob rebuilds it whole from
the pack, as a base that fell out of the cache is; so a delta's base and result
are still held whole (docs/ingest.md, "Delta bombs and large objects").

``on_object`` sees each object in resolution order, before the trailer is
checked: what it saw is provisional until :func:`index_pack` returns.
docs/formats/pack.md has the whole contract and the measurements.

The pass is compiled code (``enroute_native.pack_index``, docs/native.md),
this algorithm step for step for the usual pack; on anything else it gives
up and :class:`PackIndexer` runs the Python below, the reference, from the
start. ``on_object`` then sees the objects it saw again, in the same order,
so it must not mind seeing an object twice.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, cast, overload

from enroute_native.pack_index import index_pack as _index_compiled

from enroute_core.base.errors import InvalidDelta, InvalidPack, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.delta import apply_delta, delta_sizes
from enroute_core.git.growing import GrowingSource
from enroute_core.git.pack import (
    OBJ_BLOB,
    OBJ_OFS_DELTA,
    PACK_HEADER_BYTES,
    PACK_TRAILER_BYTES,
    SCAN_WINDOW_BYTES,
    TYPE_NAMES,
    PackHeader,
    PackScanner,
    check_pack_end,
    read_entry_at,
    read_exactly,
    read_pack_header,
    scan_bounds,
)
from enroute_core.git.source import ByteSource
from enroute_core.git.thin import ExternalBaseFn, ExternalBases, missing_base

_NO_BASE = -1
_HASH_PREFIX = {t: name + b" " for t, name in TYPE_NAMES.items()}  # "<type> " of the object id
_HASH_JOIN_BYTES_MAX = 64 * 1024  # bodies hashed with their header joined, not copied if larger
_EXTERNAL_BASE = -2
_EXPANSION_UNBOUNDED = (1 << 63) - 1  # what the compiled pass's unsigned 64-bit sum can hold
_ENTRY_BYTES_MIN = 8  # a type byte and a 7-byte zlib stream (pack's room check)

ObjectSink = Callable[[int, ObjectId, int, bytes | None], None]
"""Called once per resolved object, in resolution order: (entry index, oid, type, body);
the body is None for a blob streamed past ``pack_stream_threshold_bytes``."""


class PackObjectInfo(NamedTuple):
    """One entry as ``git verify-pack -v`` describes it, plus where its bytes are.

    ``size`` is the entry's declared inflated size (the delta's size for a
    delta, as verify-pack prints it); ``object_size`` is the object's. A
    NamedTuple, not a frozen dataclass: one is made per object on the hot
    path, and a frozen dataclass costs three times as much to build.
    """

    offset: int
    oid: ObjectId
    type_num: int
    size: int
    object_size: int
    size_in_pack: int
    depth: int
    base_oid: ObjectId | None
    entry_type: int
    header_length: int


_OID_BYTES = 20
_COLUMN_FORMATS = ("q", None, "B", "Q", "Q", "q", "i", None, "B", "B", "i")
"""The compiled pass's columns, in its order (``enroute_native.pack_index``): offsets,
oids, types, sizes, object sizes, lengths, depths, base oids, has a base, entry types,
header lengths; None for 20-byte oid records."""


class PackObjects(Sequence[PackObjectInfo]):
    """Every entry of a pack, in pack order, as columns: a few machine words and two oids
    per entry, no Python object per entry (as index-pack keeps ``struct object_entry``
    arrays). 504,433 entries hold 38 MiB here against 177 MiB as PackObjectInfo tuples.

    Ingest reads the columns; ``objects[i]`` builds a :class:`PackObjectInfo` for
    callers that want one entry whole (tests, rare paths).
    """

    __slots__ = (
        "base_oids",
        "columns",
        "depths",
        "entry_types",
        "has_base",
        "header_lengths",
        "lengths",
        "object_sizes",
        "offsets",
        "oids",
        "sizes",
        "types",
    )

    def __init__(self, columns: tuple[bytes, ...]) -> None:
        if len(columns) != len(_COLUMN_FORMATS):
            raise ValueError("pack object columns: eleven expected")
        self.columns = columns
        offsets, oids, types, sizes, object_sizes, lengths, depths = columns[:7]
        base_oids, has_base, entry_types, header_lengths = columns[7:]
        self.offsets = memoryview(offsets).cast("q")
        self.oids = memoryview(oids)
        self.types = memoryview(types)
        self.sizes = memoryview(sizes).cast("Q")
        self.object_sizes = memoryview(object_sizes).cast("Q")
        self.lengths = memoryview(lengths).cast("q")
        self.depths = memoryview(depths).cast("i")
        self.base_oids = memoryview(base_oids)
        self.has_base = memoryview(has_base)
        self.entry_types = memoryview(entry_types)
        self.header_lengths = memoryview(header_lengths).cast("i")
        n = len(types)
        views = [self.offsets, self.oids, self.types, self.sizes, self.object_sizes]
        views += [self.lengths, self.depths, self.base_oids, self.has_base, self.entry_types]
        for view, fmt in zip([*views, self.header_lengths], _COLUMN_FORMATS, strict=True):
            if len(view) != (n * _OID_BYTES if fmt is None else n):
                raise ValueError("pack object columns of different lengths")

    @classmethod
    def from_infos(cls, infos: Sequence[PackObjectInfo]) -> PackObjects:
        """The columns of ``infos`` (the reference's result)."""
        zero = bytes(_OID_BYTES)
        columns = (
            array("q", [o.offset for o in infos]).tobytes(),
            b"".join(o.oid for o in infos),
            bytes(o.type_num for o in infos),
            array("Q", [o.size for o in infos]).tobytes(),
            array("Q", [o.object_size for o in infos]).tobytes(),
            array("q", [o.size_in_pack for o in infos]).tobytes(),
            array("i", [o.depth for o in infos]).tobytes(),
            b"".join(zero if o.base_oid is None else o.base_oid for o in infos),
            bytes(o.base_oid is not None for o in infos),
            bytes(o.entry_type for o in infos),
            array("i", [o.header_length for o in infos]).tobytes(),
        )
        return cls(columns)

    def __len__(self) -> int:
        return len(self.types)

    def oid(self, index: int) -> ObjectId:
        at = index * _OID_BYTES
        return ObjectId(self.oids[at : at + _OID_BYTES].tobytes())

    def base_oid(self, index: int) -> ObjectId | None:
        """The delta base's oid, None for a full entry."""
        if not self.has_base[index]:
            return None
        at = index * _OID_BYTES
        return ObjectId(self.base_oids[at : at + _OID_BYTES].tobytes())

    def oid_list(self) -> list[ObjectId]:
        """Every entry's oid, in pack order (one bytes object each: for a dict by oid)."""
        raw = self.columns[1]
        # ObjectId is bytes at run time: a call of it per entry was a fifth of this list's cost
        return cast(
            list[ObjectId], [raw[i : i + _OID_BYTES] for i in range(0, len(raw), _OID_BYTES)]
        )

    @overload
    def __getitem__(self, index: int) -> PackObjectInfo: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[PackObjectInfo]: ...

    def __getitem__(self, index: int | slice) -> PackObjectInfo | Sequence[PackObjectInfo]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return PackObjectInfo(
            self.offsets[index], self.oid(index), self.types[index], self.sizes[index],
            self.object_sizes[index], self.lengths[index], self.depths[index],
            self.base_oid(index), self.entry_types[index], self.header_lengths[index],
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PackObjects) and self.columns == other.columns

    def __hash__(self) -> int:
        return hash(self.columns)

    def __repr__(self) -> str:
        return f"PackObjects({len(self)} entries)"


@dataclass(frozen=True, slots=True)
class PackIndexResult:
    header: PackHeader
    objects: PackObjects
    """In pack order."""
    external_bases: tuple[ObjectId, ...]
    """Bases resolved outside the pack (thin pack), in the order first needed."""
    checksum: bytes
    """The pack trailer (SHA-1 of the pack), checked."""
    compiled: bool = True
    """Whether the compiled pass indexed it; False when it gave up and the reference did
    (an unusual pack: a count operators see, ``enroute_engine_reference_indexes_total``)."""


def expansion_bytes_max(limits: Limits, pack_bytes: int) -> int:
    """The result bytes the deltas of a pack of ``pack_bytes`` may declare in all."""
    ratio = limits.pack_delta_expansion_ratio_max
    if not ratio:
        return _EXPANSION_UNBOUNDED
    return min(limits.pack_delta_expansion_free_bytes + ratio * pack_bytes, _EXPANSION_UNBOUNDED)


def charge_delta(delta: bytes, declared: int, allowed: int, limits: Limits) -> int:
    """Add the result size ``delta``'s header declares to ``declared``, before it is applied.

    Over ``object_bytes_max`` or over ``allowed`` (:func:`expansion_bytes_max`):
    ``LimitExceeded``. A header that does not parse is charged nothing: applying it
    raises ``InvalidDelta``.
    """
    try:
        _, size, _ = delta_sizes(delta)
    except InvalidDelta:
        return declared
    if size > limits.object_bytes_max:
        raise LimitExceeded("object_bytes_max", size, limits.object_bytes_max)
    declared += size
    if declared > allowed:
        raise LimitExceeded(
            "pack_delta_expansion_ratio_max",
            declared,
            allowed,
            f"the pack's deltas declare {declared} result bytes, over the {allowed} its size "
            "allows (a delta bomb; pack_delta_expansion_ratio_max, "
            "pack_delta_expansion_free_bytes)",
        )
    return declared


class _BaseCache:
    """LRU of inflated bodies keyed by pack offset (or base oid), bounded in bytes."""

    __slots__ = ("_bytes", "_items", "_max")

    def __init__(self, max_bytes: int) -> None:
        self._items: OrderedDict[int | bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes

    def get(self, key: int | bytes) -> bytes | None:
        body = self._items.get(key)
        if body is not None:
            self._items.move_to_end(key)
        return body

    def put(self, key: int | bytes, body: bytes) -> None:
        size = len(body)
        if size > self._max or key in self._items:
            return
        items = self._items
        self._bytes += size
        while self._bytes > self._max:
            _, old = items.popitem(last=False)
            self._bytes -= len(old)
        items[key] = body


class PackIndexer:
    """One indexing run over one pack; :meth:`run` returns everything it learned."""

    def __init__(
        self,
        source: ByteSource,
        *,
        limits: Limits = DEFAULT_LIMITS,
        external_base: ExternalBaseFn | None = None,
        on_object: ObjectSink | None = None,
        compiled: bool = True,
        threads: int | None = None,
    ) -> None:
        self._source = source
        self._threads = limits.pack_index_threads_max if threads is None else threads
        self._limits = limits
        if isinstance(source, GrowingSource):
            self._header = _growing_header(source, limits)
            self._end = -1  # known once the body ended (_bounds)
            self._expansion_max = -1
        else:
            self._header, self._end = scan_bounds(source, limits)
            self._expansion_max = expansion_bytes_max(limits, source.size)
        self._external_base = external_base
        self._external = ExternalBases(external_base, limits)
        self._on_object = on_object
        self._compiled = compiled
        self._cache = _BaseCache(limits.pack_base_cache_bytes_max)
        # The reference's per-entry state, in pack order: made when the reference runs.
        self._offsets: list[int] = []
        self._entries: list[tuple[int, int, int, int]] = []  # (type, size, header len, end)
        self._types: list[int] = []  # object type; 0 while unresolved
        self._object_sizes: list[int] = []
        self._oids: list[ObjectId | None] = []
        self._depths: list[int] = []
        self._bases: list[int] = []  # base entry index, _NO_BASE or _EXTERNAL_BASE
        self._base_oids: list[ObjectId | None] = []
        self._by_offset: dict[int, int] = {}
        self._by_oid: dict[ObjectId, int] = {}
        self._waiting_on_index: dict[int, list[int]] = {}
        self._waiting_on_oid: dict[ObjectId, list[int]] = {}

    def _start_reference(self) -> None:
        count = self._header.count  # bounded by the pack's size
        self._offsets = [0] * count
        self._types = [0] * count
        self._object_sizes = [0] * count
        self._oids = [None] * count
        self._depths = [0] * count
        self._bases = [_NO_BASE] * count
        self._base_oids = [None] * count

    def run(self) -> PackIndexResult:
        if self._compiled:
            result = self._run_compiled()
            if result is not None:
                return result
        self._bounds()
        return self._run_reference()

    def _bounds(self) -> None:
        """A growing pack's end and expansion bound, once its body ended (waits for it)."""
        if self._end < 0:
            self._header, self._end = scan_bounds(self._source, self._limits)
            self._expansion_max = expansion_bytes_max(self._limits, self._source.size)

    def _run_compiled(self) -> PackIndexResult | None:
        """The compiled pass; None when it gave up (the reference's state is not made yet,
        and its thin bases are asked of a fresh ``ExternalBases``)."""
        source, limits, end = self._source, self._limits, self._end
        trailer = hashlib.sha1()

        read = partial(read_exactly, source)
        expansion_max = self._expansion_max
        if isinstance(source, GrowingSource):  # the end is a bound until a read answers short
            end = limits.pack_bytes_max - PACK_TRAILER_BYTES
            expansion_max = expansion_bytes_max(limits, limits.pack_bytes_max)
            read_seq: Callable[..., bytes] = source.read_entries
        else:
            read_seq = read

        def read_in_order(offset: int, length: int, *minimum: int) -> bytes:
            chunk = read_seq(offset, length, *minimum)
            trailer.update(chunk)
            return chunk

        def check_end(pos: int) -> None:
            self._bounds()
            check_pack_end(source, self._end, pos, trailer.digest())

        external = ExternalBases(self._external_base, limits)
        columns = _index_compiled(
            read_in_order,
            read,
            check_end,
            external.find,
            self._on_object,
            hashlib.sha1,
            self._header.count,
            end,
            min(limits.delta_bytes_max, limits.object_bytes_max),
            limits.object_bytes_max,
            limits.pack_inflate_free_bytes,
            limits.pack_inflate_ratio_max,
            limits.delta_chain_depth_max,
            limits.pack_base_cache_bytes_max,
            SCAN_WINDOW_BYTES,
            expansion_max,
            limits.pack_stream_threshold_bytes,
            self._threads,
            isinstance(source, GrowingSource),
            limits.pack_delta_expansion_free_bytes,
            limits.pack_delta_expansion_ratio_max,
        )
        if columns is None:
            return None
        checksum = source.read_at(self._end, PACK_TRAILER_BYTES)
        return PackIndexResult(self._header, PackObjects(columns), external.used, checksum)

    def _run_reference(self) -> PackIndexResult:
        self._start_reference()
        offsets = self._offsets
        entries = self._entries
        by_offset = self._by_offset
        types = self._types
        bases = self._bases
        cache = self._cache
        settle = self._settle
        declared, allowed, limits = 0, self._expansion_max, self._limits
        streamed: list[hashlib._Hash] = []  # the hash of the entry being streamed

        def stream(type_num: int, size: int) -> Callable[[bytes], object] | None:
            if type_num != OBJ_BLOB:
                return None  # a commit, tree or tag is checked whole
            sha = hashlib.sha1(_HASH_PREFIX[type_num] + b"%d\x00" % size)
            streamed.append(sha)
            return sha.update

        scanner = PackScanner(self._source, self._limits)
        entries_in_order = scanner.entries(stream, limits.pack_stream_threshold_bytes)
        for index, entry in enumerate(entries_in_order):
            offset, type_num, size, hlen, base_offset, base_oid, end, data = entry
            offsets[index] = offset
            by_offset[offset] = index
            entries.append((type_num, size, hlen, end))
            if streamed:
                oid = ObjectId(streamed.pop().digest())
                self._settle(index, type_num, None, 0, (oid, size))
            elif type_num < OBJ_OFS_DELTA:
                settle(index, type_num, data, 0)
            else:
                declared = charge_delta(data, declared, allowed, limits)
                if type_num == OBJ_OFS_DELTA:
                    base = by_offset.get(base_offset, _NO_BASE)
                    if base == _NO_BASE:
                        raise InvalidPack("OFS_DELTA base is not an entry", offset=offset)
                else:
                    assert base_oid is not None
                    self._base_oids[index] = base_oid
                    base = self._by_oid.get(base_oid, _EXTERNAL_BASE)
                bases[index] = base
                if base >= 0 and types[base]:
                    body = cache.get(offsets[base])
                    if body is None:
                        body = self._body(base)
                    settle(index, types[base], self._apply(body, data), self._depths[base] + 1)
                elif base >= 0:
                    self._waiting_on_index.setdefault(base, []).append(index)
                else:
                    assert base_oid is not None
                    self._waiting_on_oid.setdefault(base_oid, []).append(index)
        # The trailer is checked: bases not in the pack are the caller's now.
        self._resolve_external()
        return self._result()

    # -- resolution ---------------------------------------------------------

    def _apply(self, base_body: bytes, delta: bytes) -> bytes:
        return apply_delta(base_body, delta, limits=self._limits)

    def _reload_data(self, index: int) -> bytes:
        """An entry's inflated data, read again (bodies of full entries, deltas of others)."""
        scanner_end = self._source.size - PACK_TRAILER_BYTES
        return read_entry_at(self._source, self._offsets[index], self._limits, scanner_end).data

    def _settle(
        self,
        index: int,
        type_num: int,
        body: bytes | None,
        depth: int,
        hashed: tuple[ObjectId, int] | None = None,
    ) -> None:
        """Record a resolved entry, then every delta waiting on it, depth first.

        A pending item holds its base's body, shared by siblings, so memory is
        one body per level of the chain being walked. A streamed blob comes with
        no body and its (oid, size) ``hashed``; deltas that waited on it get it
        rebuilt whole.
        """
        waiting = self._record(index, type_num, body, depth, hashed)
        if waiting is None:
            return
        if body is None:
            body = self._reload_data(index)
        pending = [(child, type_num, body, depth) for child in reversed(waiting)]
        while pending:
            child, base_type, base_body, base_depth = pending.pop()
            body = self._apply(base_body, self._reload_data(child))
            waiting = self._record(child, base_type, body, base_depth + 1)
            if waiting:
                pending.extend((c, base_type, body, base_depth + 1) for c in reversed(waiting))

    def _record(
        self,
        index: int,
        type_num: int,
        body: bytes | None,
        depth: int,
        hashed: tuple[ObjectId, int] | None = None,
    ) -> list[int] | None:
        """Store what entry ``index`` resolved to; return the deltas that waited on it.

        ``body`` is None for a streamed blob, whose (oid, size) is ``hashed``."""
        if depth:
            if depth > self._limits.delta_chain_depth_max:
                limit = self._limits.delta_chain_depth_max
                raise LimitExceeded("delta_chain_depth_max", depth, limit)
            base = self._bases[index]
            if base >= 0:
                self._base_oids[index] = self._oids[base]
        if body is None:
            assert hashed is not None
            oid, size = hashed
        else:
            size = len(body)
            header = _HASH_PREFIX[type_num] + b"%d\x00" % size
            if size <= _HASH_JOIN_BYTES_MAX:  # one call: cheaper than update for small bodies
                oid = ObjectId(hashlib.sha1(header + body).digest())
            else:
                sha = hashlib.sha1(header)
                sha.update(body)
                oid = ObjectId(sha.digest())
            self._cache.put(self._offsets[index], body)
        self._types[index] = type_num
        self._object_sizes[index] = size
        self._oids[index] = oid
        self._depths[index] = depth
        if self._on_object is not None:
            self._on_object(index, oid, type_num, body)
        waiting = self._waiting_on_index.pop(index, None) if self._waiting_on_index else None
        by_oid = self._by_oid
        if oid not in by_oid:
            by_oid[oid] = index
            by_ref = self._waiting_on_oid.pop(oid, None) if self._waiting_on_oid else None
            if by_ref:
                for child in by_ref:
                    self._bases[child] = index
                waiting = waiting + by_ref if waiting else by_ref
        return waiting

    def _resolve_external(self) -> None:
        """Ask the caller for every base still waited on, in the order first needed.

        An id the caller lacks may still be made by the pack, from a chain that
        starts at a later external base (resolving pops it from ``waiting``);
        so one pass asks each id at most once and only what is left is missing.
        """
        waiting = self._waiting_on_oid
        for oid in list(waiting):
            if oid not in waiting:
                continue
            found = self._external.find(oid)
            if found is None:
                continue
            type_num, body = found
            self._cache.put(oid, body)
            for child in waiting.pop(oid):
                self._settle(child, type_num, self._apply(body, self._reload_data(child)), 1)
        if waiting:
            raise missing_base(next(iter(waiting)))
        unresolved = [i for i, t in enumerate(self._types) if not t]
        if unresolved:
            raise InvalidPack(
                f"{len(unresolved)} deltas have no base", offset=self._offsets[unresolved[0]]
            )

    def _body(self, index: int) -> bytes:
        """Body of a resolved entry that fell out of the cache, rebuilt along its chain."""
        chain: list[int] = []
        i = index
        while True:
            base = self._bases[i]
            if base == _NO_BASE:
                body = self._reload_data(i)  # a full entry: its data is the body
                break
            chain.append(i)
            if base == _EXTERNAL_BASE:
                oid = self._base_oids[i]
                assert oid is not None
                cached = self._cache.get(oid)
                body = cached if cached is not None else self._external.get(oid)[1]
                break
            i = base
            cached = self._cache.get(self._offsets[i])
            if cached is not None:
                body = cached
                break
        for i in reversed(chain):
            body = self._apply(body, self._reload_data(i))
        self._cache.put(self._offsets[index], body)
        return body

    def _result(self) -> PackIndexResult:
        objects: list[PackObjectInfo] = []
        append = objects.append
        oids, types, sizes, depths = self._oids, self._types, self._object_sizes, self._depths
        bases, base_oids = self._bases, self._base_oids
        for i, (offset, (entry_type, size, hlen, end)) in enumerate(
            zip(self._offsets, self._entries, strict=True)
        ):
            oid = oids[i]
            assert oid is not None
            base_oid = base_oids[i] if bases[i] != _NO_BASE else None
            append(
                PackObjectInfo(
                    offset, oid, types[i], size, sizes[i], end - offset, depths[i], base_oid,
                    entry_type, hlen,
                )
            )  # fmt: skip
        end = self._source.size - PACK_TRAILER_BYTES
        checksum = self._source.read_at(end, PACK_TRAILER_BYTES)
        external = self._external.used
        return PackIndexResult(
            self._header, PackObjects.from_infos(objects), external, checksum, compiled=False
        )


def _growing_header(source: GrowingSource, limits: Limits) -> PackHeader:
    """A growing pack's header, once as many bytes are in as its count of entries takes
    (or the body ended): the indexer's tables are sized by the count, so they stay in
    proportion to the bytes received, as they are to the size of a whole pack."""
    least = PACK_HEADER_BYTES + PACK_TRAILER_BYTES
    if source.wait_for(least) >= least:
        header = read_pack_header(source, limits)
        need = PACK_HEADER_BYTES + _ENTRY_BYTES_MIN * header.count + PACK_TRAILER_BYTES
        if source.wait_for(need) >= need:
            return header
    return scan_bounds(source, limits)[0]  # the body ended short: judged as a whole pack


def index_pack(
    source: ByteSource,
    *,
    limits: Limits = DEFAULT_LIMITS,
    external_base: ExternalBaseFn | None = None,
    on_object: ObjectSink | None = None,
    compiled: bool = True,
    threads: int | None = None,
) -> PackIndexResult:
    """Index a whole pack (see the module docstring); raises only typed errors on bad input.

    ``compiled=False`` runs the reference alone (tests compare the two). ``threads`` is the
    compiled pass's (``limits.pack_index_threads_max`` when None; the compiled pass runs at
    most one thread per core the process may use); the result and the ``on_object`` calls
    do not depend on it.
    """
    return PackIndexer(
        source,
        limits=limits,
        external_base=external_base,
        on_object=on_object,
        compiled=compiled,
        threads=threads,
    ).run()
