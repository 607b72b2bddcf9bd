"""Write pack files, version 2, as a stream of byte chunks.

Git ``Documentation/gitformat-pack.txt``, "pack-*.pack files have the
following format" (the byte layout is in :mod:`enroute_core.git.pack`).
:class:`PackWriter` does no I/O: every call returns the bytes it adds and
hands them to an optional sink, while a running SHA-1 builds the trailer.
Serving copies stored entries verbatim with :meth:`PackWriter.add_raw_entry`;
nothing is buffered beyond one entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from enroute_core.base.ids import OID_BYTES, ObjectId
from enroute_core.git.delta import create_delta
from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.pack import (
    OBJ_OFS_DELTA,
    OBJ_REF_DELTA,
    OBJECT_TYPES,
    PACK_HEADER_BYTES,
    encode_entry_header,
    encode_ofs_distance,
    encode_pack_header,
)
from enroute_core.git.zstream import DEFLATE_LEVEL_DEFAULT, deflate

ChunkSink = Callable[[bytes], object]


class PackWriter:
    """Header, then exactly ``count`` entries, then :meth:`finish` (the trailer).

    Misuse (entries before the header, a wrong count, a base offset that is
    not behind the writer) is a programmer error and fails an assertion.
    """

    __slots__ = ("_count", "_entries", "_finished", "_level", "_offset", "_sha", "_sink")

    def __init__(
        self, sink: ChunkSink | None = None, *, level: int = DEFLATE_LEVEL_DEFAULT
    ) -> None:
        self._sink = sink
        self._level = level
        self._sha = hashlib.sha1()
        self._offset = 0
        self._count = -1
        self._entries = 0
        self._finished = False

    @property
    def offset(self) -> int:
        """Bytes written so far: the offset the next entry will have."""
        return self._offset

    def _emit(self, chunk: bytes) -> bytes:
        assert not self._finished
        self._sha.update(chunk)
        self._offset += len(chunk)
        if self._sink is not None:
            self._sink(chunk)
        return chunk

    def _entry(self, chunk: bytes) -> bytes:
        assert 0 <= self._entries < self._count, (self._entries, self._count)
        self._entries += 1
        return self._emit(chunk)

    def header(self, count: int) -> bytes:
        assert self._offset == 0 and count >= 0, (self._offset, count)
        self._count = count
        return self._emit(encode_pack_header(count))

    def add_full(self, type_num: int, body: bytes | memoryview) -> bytes:
        assert type_num in OBJECT_TYPES, type_num
        head = encode_entry_header(type_num, len(body))
        return self._entry(head + deflate(body, self._level))

    def add_ref_delta(self, base_oid: ObjectId, delta: bytes | memoryview) -> bytes:
        assert len(base_oid) == OID_BYTES
        head = encode_entry_header(OBJ_REF_DELTA, len(delta)) + base_oid
        return self._entry(head + deflate(delta, self._level))

    def add_ofs_delta(self, base_offset: int, delta: bytes | memoryview) -> bytes:
        assert PACK_HEADER_BYTES <= base_offset < self._offset, (base_offset, self._offset)
        head = encode_entry_header(OBJ_OFS_DELTA, len(delta))
        head += encode_ofs_distance(self._offset - base_offset)
        return self._entry(head + deflate(delta, self._level))

    def add_raw_entry(self, raw: bytes | memoryview) -> bytes:
        """Copy a stored entry verbatim (header and zlib stream).

        An OFS_DELTA entry stays valid only if its base sits at the same
        distance behind it here as where it was read; the caller keeps that.
        """
        return self._entry(bytes(raw))

    def finish(self) -> bytes:
        """The 20-byte trailer: SHA-1 of every byte written before it."""
        assert self._entries == self._count, (self._entries, self._count)
        trailer = self._emit(self._sha.digest())
        self._finished = True
        return trailer


DeltaFn = Callable[[bytes, bytes], bytes | None]
"""(base, target) -> delta, or None when a delta is not worth it."""


def worthwhile_delta(base: bytes, target: bytes) -> bytes | None:
    """A delta of ``target`` against ``base`` if it is under half the target's size."""
    return create_delta(base, target, max_delta_bytes=max(0, (len(target) - 1) // 2))


@dataclass(frozen=True, slots=True)
class PackObject:
    type_num: int
    body: bytes


def write_pack(
    objects: Iterable[tuple[int, bytes]],
    *,
    sink: ChunkSink | None = None,
    delta: DeltaFn | None = None,
    ofs_delta: bool = True,
    window: int = 10,
    depth_max: int = 50,
    level: int = DEFLATE_LEVEL_DEFAULT,
) -> bytes:
    """A whole pack of ``(type, body)`` objects in the given order; returns its bytes.

    With ``delta`` (:func:`worthwhile_delta`, say), each object is tried
    against the last ``window`` objects of its type written before it (so
    every base precedes its delta, as OFS_DELTA requires) and stored as the
    smallest delta under half its size whose chain stays within
    ``depth_max``. REF_DELTA is used when ``ofs_delta`` is false. With a
    ``sink``, chunks go there as they are made and the return value is empty.
    """
    items = [PackObject(t, bytes(b)) for t, b in objects]
    out: list[bytes] = []
    writer = PackWriter(sink if sink is not None else out.append, level=level)
    writer.header(len(items))
    # per type: recent (offset, oid, body, depth), newest last
    recent: dict[int, list[tuple[int, ObjectId, bytes, int]]] = {t: [] for t in OBJECT_TYPES}
    for item in items:
        oid = object_id(ObjectType(item.type_num), item.body)
        offset = writer.offset
        best: tuple[bytes, int, ObjectId, int] | None = None
        if delta is not None and item.body:
            for base_offset, base_oid, base_body, base_depth in reversed(recent[item.type_num]):
                if base_depth >= depth_max:
                    continue
                made = delta(base_body, item.body)
                if made is None or 2 * len(made) >= len(item.body):
                    continue
                if best is None or len(made) < len(best[0]):
                    best = (made, base_offset, base_oid, base_depth + 1)
        depth = 0
        if best is None:
            writer.add_full(item.type_num, item.body)
        elif ofs_delta:
            writer.add_ofs_delta(best[1], best[0])
            depth = best[3]
        else:
            writer.add_ref_delta(best[2], best[0])
            depth = best[3]
        if delta is not None:
            kept = recent[item.type_num]
            kept.append((offset, oid, item.body, depth))
            if len(kept) > window:
                del kept[0]
    writer.finish()
    return b"".join(out)
