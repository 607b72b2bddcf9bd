"""Pack files, version 2: header, entry headers, and a streaming pass over entries.

Git ``Documentation/gitformat-pack.txt``, "pack-*.pack files have the
following format"::

    pack     = header entry{count} trailer
    header   = "PACK" version:u32be count:u32be          (12 bytes; version 2 or 3)
    entry    = type_size [base] zlib_stream
    type_size: first byte  = M ttt ssss               ttt = type, ssss = size bits 0..3
               next bytes  = M sssssss                  size bits 4+7(n-1) .. 10+7(n-1)
               (M = 1: another byte follows; the size is the INFLATED length of the
                entry's data: the object for types 1..4, the delta for 6 and 7)
    base     = OFS_DELTA (6): distance, big-endian base-128 with a bias:
                   d = b0 & 0x7f; while b & 0x80: d = ((d + 1) << 7) | (b_next & 0x7f)
                   base offset = entry offset - d  (an earlier entry)
               REF_DELTA (7): 20-byte object id of the base
    trailer  = SHA-1 of every byte before it                (20 bytes)

Types: 1 commit, 2 tree, 3 blob, 4 tag, 6 OFS_DELTA, 7 REF_DELTA; 0 and 5
are invalid. Git writes version 2 and accepts 2 and 3, which share this
layout, so we do the same.

Readers go through :class:`~enroute_core.git.source.ByteSource` only, in
bounded windows; nothing assumes the pack is in memory. Bad input raises
``InvalidPack`` (or ``LimitExceeded`` when over a :class:`Limits` bound).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from enroute_native.pack_entry import inflate_entry

from enroute_core.base.errors import InvalidPack, LimitExceeded
from enroute_core.base.ids import OID_BYTES, ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.object_type import ObjectType
from enroute_core.git.source import ByteSource
from enroute_core.git.zstream import deflate_bound, inflate_at

PACK_MAGIC = b"PACK"
PACK_VERSIONS = frozenset({2, 3})
PACK_VERSION_WRITTEN = 2
PACK_HEADER_BYTES = 12
PACK_TRAILER_BYTES = 20

# Entry type numbers (gitformat-pack, "Object types"); 1..4 are ObjectType's values.
OBJ_COMMIT = int(ObjectType.COMMIT)
OBJ_TREE = int(ObjectType.TREE)
OBJ_BLOB = int(ObjectType.BLOB)
OBJ_TAG = int(ObjectType.TAG)
OBJ_OFS_DELTA = 6
OBJ_REF_DELTA = 7
OBJECT_TYPES = frozenset(int(t) for t in ObjectType)
ENTRY_TYPES = OBJECT_TYPES | {OBJ_OFS_DELTA, OBJ_REF_DELTA}

TYPE_NAMES: dict[int, bytes] = {int(t): t.type_name for t in ObjectType}
"""Type number to the name object ids hash (``b"commit"``); a dict for the hot path."""

ENTRY_HEADER_BYTES_MAX = 30
"""Longest entry header we parse: 10 size bytes plus a 20-byte base id."""
_SIZE_BYTES_MAX = 10  # 4 + 9 * 7 = 67 bits: any 64-bit size
_OFS_BYTES_MAX = 10

_HEAD_READ_BYTES = 512  # a random entry read starts with this: most entries fit whole

SCAN_WINDOW_BYTES = 1024 * 1024
"""Sequential read window of the streaming pass."""

_HEADER = struct.Struct(">4sII")


@dataclass(frozen=True, slots=True)
class PackHeader:
    version: int
    count: int


def encode_pack_header(count: int, version: int = PACK_VERSION_WRITTEN) -> bytes:
    assert version in PACK_VERSIONS and 0 <= count < 2**32, (version, count)
    return _HEADER.pack(PACK_MAGIC, version, count)


def decode_pack_header(data: bytes | memoryview, limits: Limits = DEFAULT_LIMITS) -> PackHeader:
    """Check magic, version and count (gitformat-pack, "A header appears at the beginning")."""
    if len(data) < PACK_HEADER_BYTES:
        raise InvalidPack("pack header is truncated")
    magic, version, count = _HEADER.unpack_from(data, 0)
    if magic != PACK_MAGIC:
        raise InvalidPack(f"bad pack signature {bytes(magic)!r}")
    if version not in PACK_VERSIONS:
        raise InvalidPack(f"unsupported pack version {version}")
    if count > limits.pack_objects_max:
        raise LimitExceeded("pack_objects_max", count, limits.pack_objects_max)
    return PackHeader(version, count)


def read_pack_header(source: ByteSource, limits: Limits = DEFAULT_LIMITS) -> PackHeader:
    return decode_pack_header(source.read_at(0, PACK_HEADER_BYTES), limits)


@dataclass(frozen=True, slots=True)
class PackEntryHeader:
    """What an entry's header says; the data (a zlib stream) starts at ``data_offset``."""

    offset: int
    type_num: int
    size: int
    header_length: int
    base_offset: int | None = None
    base_oid: ObjectId | None = None

    @property
    def data_offset(self) -> int:
        return self.offset + self.header_length


@dataclass(frozen=True, slots=True)
class PackEntry:
    """One entry with its data inflated; ``compressed_length`` is its zlib stream's exact length.

    The raw entry (to copy verbatim) is ``[header.offset, end)``; ``data`` is
    the object for types 1..4 and the delta for 6 and 7.
    """

    header: PackEntryHeader
    compressed_length: int
    data: bytes

    @property
    def offset(self) -> int:
        return self.header.offset

    @property
    def type_num(self) -> int:
        return self.header.type_num

    @property
    def end(self) -> int:
        return self.header.offset + self.header.header_length + self.compressed_length


def encode_entry_header(type_num: int, size: int) -> bytes:
    """The type-and-size bytes (gitformat-pack, "Size encoding" of the entry header)."""
    assert type_num in ENTRY_TYPES and size >= 0, (type_num, size)
    out = bytearray()
    byte = (type_num << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def encode_ofs_distance(distance: int) -> bytes:
    """The OFS_DELTA base distance (gitformat-pack, "offset encoding"), most significant first."""
    assert distance > 0, distance
    out = bytearray([distance & 0x7F])
    distance >>= 7
    while distance:
        distance -= 1
        out.append(0x80 | (distance & 0x7F))
        distance >>= 7
    out.reverse()
    return bytes(out)


def ref_delta_as_ofs(out: bytearray, entry: bytes | memoryview, pos: int, distance: int) -> int:
    """Append the header of the REF_DELTA at ``entry[pos:]`` (the entry's bytes end where
    ``entry`` does) rewritten as an OFS_DELTA's whose base lies ``distance`` bytes back
    (gitformat-pack, "Pack file entry" and "offset encoding"): the type bits flipped, the
    size bytes kept, the base distance where the base oid was; the zlib bytes after the
    oid are the caller's to copy. Answers the type-and-size bytes, or -1 (nothing
    appended) for a header :func:`parse_entry_header` refuses: size bytes past ten, no
    room for the base oid.

    The one REF-to-OFS rewrite of serving; ``enroute_native.pack_run`` is its compiled
    copy (``test_serve_runs_native.py`` compares them). One- and two-byte distances are
    written here, longer ones by :func:`encode_ofs_distance`.
    """
    end = len(entry)
    hlen = 1
    while entry[pos + hlen - 1] & 0x80:
        hlen += 1
        if hlen > _SIZE_BYTES_MAX or pos + hlen + OID_BYTES > end:
            return -1
    if pos + hlen + OID_BYTES > end:
        return -1
    out.append(entry[pos] ^ 0x10)  # type 7 (REF_DELTA) becomes 6 (OFS_DELTA)
    out += entry[pos + 1 : pos + hlen]
    if distance < 0x80:
        out.append(distance)
    elif distance < 0x4080:  # two bytes: the second adds 2**7 to the range
        out.append(0x80 | ((distance >> 7) - 1))
        out.append(distance & 0x7F)
    else:
        out += encode_ofs_distance(distance)
    return hlen


RawHeader = tuple[int, int, int, int, ObjectId | None]
"""(type, size, header length, base offset or 0, base oid or None): a header, unboxed."""


def parse_entry_header(data: bytes | memoryview, pos: int, offset: int) -> RawHeader:
    """Parse the entry header at ``data[pos:]``, which sits at pack offset ``offset``.

    ``data`` must hold the whole header or end where the entry region ends;
    a header cut short raises ``InvalidPack``. The tuple form is the hot
    path's; :func:`decode_entry_header` gives the same as a value.

    The normative reader of an entry header. ``packfmt.h``'s ``parse_header`` is
    its compiled fast path: it reads only the usual header and leaves any other to
    this, whose error is the one raised. Differential tests: ``test_pack.py``
    (``header_is`` against ``_header_is_reference``, built on this, over every type,
    size, cut and non-minimal header) and ``tests/fuzz/test_fuzz_pack_entry.py``
    (scans with and without the compiled entry reader). The fuzz model
    (``tests/fuzz/packmodel.py``) writes headers its own way on purpose: it checks
    this one.
    """
    end = len(data)
    start = pos
    if pos >= end:
        raise InvalidPack("entry header is truncated", offset=offset)
    byte = data[pos]
    pos += 1
    type_num = (byte >> 4) & 7
    size = byte & 0x0F
    shift = 4
    while byte & 0x80:
        if pos >= end:
            raise InvalidPack("entry header is truncated", offset=offset)
        if pos - start >= _SIZE_BYTES_MAX:
            raise InvalidPack("entry size is too long", offset=offset)
        byte = data[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        shift += 7
    if type_num < OBJ_OFS_DELTA:
        if not type_num or type_num == 5:
            raise InvalidPack(f"invalid entry type {type_num}", offset=offset)
        return type_num, size, pos - start, 0, None
    if type_num == OBJ_REF_DELTA:
        if pos + OID_BYTES > end:
            raise InvalidPack("entry header is truncated", offset=offset)
        base_oid = ObjectId(bytes(data[pos : pos + OID_BYTES]))
        return type_num, size, pos + OID_BYTES - start, 0, base_oid
    ofs_start = pos
    if pos >= end:
        raise InvalidPack("entry header is truncated", offset=offset)
    byte = data[pos]
    pos += 1
    distance = byte & 0x7F
    while byte & 0x80:
        if pos >= end:
            raise InvalidPack("entry header is truncated", offset=offset)
        if pos - ofs_start >= _OFS_BYTES_MAX:
            raise InvalidPack("OFS_DELTA offset is too long", offset=offset)
        byte = data[pos]
        pos += 1
        distance = ((distance + 1) << 7) | (byte & 0x7F)
    base_offset = offset - distance
    if distance == 0 or base_offset < PACK_HEADER_BYTES:
        raise InvalidPack("OFS_DELTA base is outside the pack", offset=offset)
    return type_num, size, pos - start, base_offset, None


def decode_entry_header(data: bytes | memoryview, pos: int, offset: int) -> PackEntryHeader:
    """:func:`parse_entry_header` as a :class:`PackEntryHeader`."""
    type_num, size, header_length, base_offset, base_oid = parse_entry_header(data, pos, offset)
    return PackEntryHeader(
        offset, type_num, size, header_length, base_offset if base_offset else None, base_oid
    )


def check_entry_size(type_num: int, size: int, limits: Limits) -> None:
    """Refuse an entry whose declared size is over its bound, before inflating it."""
    if type_num >= OBJ_OFS_DELTA:
        if size > limits.delta_bytes_max:
            raise LimitExceeded("delta_bytes_max", size, limits.delta_bytes_max)
    elif size > limits.object_bytes_max:
        raise LimitExceeded("object_bytes_max", size, limits.object_bytes_max)


def entries_end(source: ByteSource, limits: Limits = DEFAULT_LIMITS) -> int:
    """Offset where the entry region ends and the trailer starts."""
    size = source.size
    if size > limits.pack_bytes_max:
        raise LimitExceeded("pack_bytes_max", size, limits.pack_bytes_max)
    if size < PACK_HEADER_BYTES + PACK_TRAILER_BYTES:
        raise InvalidPack("pack is truncated")
    return size - PACK_TRAILER_BYTES


def read_entry_at(
    source: ByteSource, offset: int, limits: Limits = DEFAULT_LIMITS, end: int | None = None
) -> PackEntry:
    """Read and inflate the entry at ``offset`` (a random read, as serving and base reloads do)."""
    if end is None:
        end = entries_end(source, limits)
    if not PACK_HEADER_BYTES <= offset < end:
        raise InvalidPack("entry offset is outside the pack", offset=offset)
    head = source.read_at(offset, min(_HEAD_READ_BYTES, end - offset))
    header = decode_entry_header(head, 0, offset)
    check_entry_size(header.type_num, header.size, limits)
    prefix = memoryview(head)[header.header_length :]
    data, compressed = inflate_at(source, header.data_offset, header.size, end, prefix=prefix)
    return PackEntry(header, compressed, data)


RawEntry = tuple[int, int, int, int, int, ObjectId | None, int, bytes]
"""(offset, type, size, header length, base offset or 0, base oid or None, end, data)."""

StreamFn = Callable[[int, int], Callable[[bytes], object] | None]
"""``(type, size)`` of an entry over the stream threshold: a sink that takes its inflated
data piece by piece (the entry then comes with empty data), or None to have it whole."""
STREAM_PIECE_BYTES = 1 << 20
"""Most inflated bytes one step hands to a stream's sink (git's index-pack hashes a big
blob through a 64 KiB buffer)."""


class PackScanner:
    """The streaming pass over a pack's entries, in pack order (the hot path of indexing).

    One sequential window of ``window_bytes`` slides over the entry region;
    every byte is read once and fed to the trailer's SHA-1 as it is read.
    Each entry is inflated with one ``decompressobj``, fed first with at most
    :func:`~enroute_core.git.zstream.deflate_bound` of its size so that the
    bytes zlib leaves unused stay proportional to the entry. Memory: one
    entry's data plus the window.

    The usual entry (a sound header, a size under every bound, a stream that
    ends inside the window) is read in one call of compiled code,
    ``enroute_native.pack_entry`` (docs/native.md); this class reads every
    other entry itself and is the reference a test compares it with.
    """

    __slots__ = (
        "_buf",
        "_buf_start",
        "_end",
        "_limits",
        "_read_pos",
        "_sha",
        "_source",
        "_view",
        "_window",
        "header",
    )

    def __init__(
        self,
        source: ByteSource,
        limits: Limits = DEFAULT_LIMITS,
        window_bytes: int = SCAN_WINDOW_BYTES,
    ) -> None:
        self._source = source
        self._limits = limits
        self._end = entries_end(source, limits)
        self._window = window_bytes
        self._buf = b""
        self._view = memoryview(self._buf)
        self._buf_start = 0
        self._read_pos = 0
        self._sha = hashlib.sha1()
        self._fill(0, PACK_HEADER_BYTES)
        self.header = decode_pack_header(self._buf[:PACK_HEADER_BYTES], limits)
        _check_room(self.header, self._end)

    def _fill(self, pos: int, need: int) -> None:
        """Make the window hold ``[pos, pos + need)`` (clipped to the entry region)."""
        buf_end = self._buf_start + len(self._buf)
        want_end = min(pos + need, self._end)
        if pos >= self._buf_start and want_end <= buf_end:
            return
        keep = self._buf[pos - self._buf_start :] if self._buf_start <= pos < buf_end else b""
        start = pos + len(keep)
        assert start == self._read_pos, (start, self._read_pos)
        length = min(max(self._window, want_end - start), self._end - start)
        chunk = read_exactly(self._source, start, length) if length > 0 else b""
        self._sha.update(chunk)
        self._read_pos = start + length
        self._buf = keep + chunk if keep else chunk
        self._view = memoryview(self._buf)
        self._buf_start = pos

    def _inflate(
        self, pos: int, size: int, offset: int, sink: Callable[[bytes], object] | None = None
    ) -> tuple[bytes, int]:
        """Inflate the stream at ``pos`` to exactly ``size`` bytes; return (data, its end).

        With a ``sink``, the data goes to it in pieces of at most
        :data:`STREAM_PIECE_BYTES` and comes back empty: memory is the window and a piece.
        """
        d = zlib.decompressobj()
        piece = STREAM_PIECE_BYTES if sink is not None else 0
        parts: list[bytes] = []
        emit = sink if sink is not None else parts.append
        got = 0
        limit = deflate_bound(size)
        # A zlib bomb: past the free bytes, output is capped at ratio x input fed so far.
        free = self._limits.pack_inflate_free_bytes
        ratio = self._limits.pack_inflate_ratio_max if size > free else 0
        start = pos
        while True:
            rel = pos - self._buf_start
            avail = len(self._buf) - rel
            if avail <= 0:
                if pos >= self._end:
                    raise InvalidPack("entry data is truncated", offset=offset)
                self._fill(pos, min(limit, self._window))
                continue
            n = avail if avail < limit else limit
            cap = min(size, free + ratio * (pos + n - start)) if ratio else size
            try:
                if piece:
                    out = d.decompress(self._view[rel : rel + n], min(cap - got + 1, piece))
                    # A full piece may leave input unread or output pending in zlib: go on.
                    while len(out) == piece and not d.eof and got + piece <= cap:
                        got += piece
                        emit(out)
                        out = d.decompress(d.unconsumed_tail, min(cap - got + 1, piece))
                else:
                    out = d.decompress(self._view[rel : rel + n], cap - got + 1)
            except zlib.error as exc:
                raise InvalidPack(
                    f"entry data is not a valid zlib stream: {exc}", offset=offset
                ) from None
            got += len(out)
            if got > size:
                raise InvalidPack(f"entry inflates past its declared size {size}", offset=offset)
            if got > cap:
                raise LimitExceeded(
                    "pack_inflate_ratio_max",
                    got // (pos + n - start),
                    ratio,
                    f"pack entry at offset {offset} inflates over {ratio} times its "
                    f"{pos + n - start} deflated bytes (a zlib bomb; pack_inflate_ratio_max)",
                )
            if d.eof:
                if got != size:
                    raise InvalidPack(
                        f"entry inflates to {got} bytes, its header says {size}", offset=offset
                    )
                end = pos + n - len(d.unused_data)
                if piece:
                    emit(out)
                    return b"", end
                if not parts:
                    return out, end
                parts.append(out)
                return b"".join(parts), end
            emit(out)
            pos += n
            limit = self._window

    def entries(
        self, stream: StreamFn | None = None, stream_bytes_min: int = 0
    ) -> Iterator[RawEntry]:
        """Every entry, then the trailer check (so exhaust it before trusting the entries).

        ``stream`` is asked about each entry that inflates to more than
        ``stream_bytes_min`` (:data:`StreamFn`).
        """
        limits = self._limits
        end = self._end
        pos = PACK_HEADER_BYTES
        # Entries no bound can refuse and no zlib-bomb check applies to may take the
        # compiled path; it answers None for anything else, which is read here.
        usual_max = min(
            limits.delta_bytes_max, limits.object_bytes_max, limits.pack_inflate_free_bytes
        )
        if stream is not None:
            usual_max = min(usual_max, stream_bytes_min)
        for _ in range(self.header.count):
            if pos >= end:
                raise InvalidPack("pack has fewer entries than its header says")
            self._fill(pos, ENTRY_HEADER_BYTES_MAX)
            usual = inflate_entry(self._buf, pos - self._buf_start, pos, usual_max)
            if usual is not None:
                type_num, size, header_length, base_offset, raw_base, data, used = usual
                base_oid = None if raw_base is None else ObjectId(raw_base)
                entry_end = pos + used
            else:
                type_num, size, header_length, base_offset, base_oid = parse_entry_header(
                    self._buf, pos - self._buf_start, pos
                )
                if size > limits.delta_bytes_max or size > limits.object_bytes_max:
                    check_entry_size(type_num, size, limits)
                sink = None
                if stream is not None and size > stream_bytes_min:
                    sink = stream(type_num, size)
                data, entry_end = self._inflate(pos + header_length, size, pos, sink)
            yield pos, type_num, size, header_length, base_offset, base_oid, entry_end, data
            pos = entry_end
        self._check_trailer(pos)

    def _check_trailer(self, pos: int) -> None:
        assert pos != self._end or self._read_pos == self._end, (self._read_pos, self._end)
        check_pack_end(self._source, self._end, pos, self._sha.digest())


def read_exactly(source: ByteSource, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of a pack whose ``size`` promised them."""
    chunk = source.read_at(offset, length)
    if len(chunk) != length:
        raise InvalidPack("pack is shorter than its source says")
    return chunk


def scan_bounds(source: ByteSource, limits: Limits = DEFAULT_LIMITS) -> tuple[PackHeader, int]:
    """The header and where the entry region ends, checked before a scan reads an entry."""
    end = entries_end(source, limits)
    header = read_pack_header(source, limits)
    _check_room(header, end)
    return header, end


def _check_room(header: PackHeader, end: int) -> None:
    # Every entry takes at least 8 bytes (a type byte and a 7-byte zlib stream).
    room = (end - PACK_HEADER_BYTES) // 8
    if header.count > room:
        raise InvalidPack(f"pack claims {header.count} entries in room for {room}")


def check_pack_end(source: ByteSource, end: int, pos: int, digest: bytes) -> None:
    """After the last entry (at ``pos``): no stray bytes, and the trailer is the SHA-1
    (``digest``) of everything before it."""
    if pos != end:
        raise InvalidPack(f"pack has {end - pos} stray bytes after its last entry")
    trailer = source.read_at(end, PACK_TRAILER_BYTES)
    if len(trailer) != PACK_TRAILER_BYTES or digest != trailer:
        raise InvalidPack("pack trailer does not match")


def iter_entries(
    source: ByteSource,
    limits: Limits = DEFAULT_LIMITS,
    window_bytes: int = SCAN_WINDOW_BYTES,
) -> Iterator[PackEntry]:
    """Every entry in pack order, inflated, then the trailer check.

    Memory: one entry's inflated data plus one read window. The trailer
    (SHA-1 of everything before it) and the absence of stray bytes are
    checked after the last entry, so a caller must exhaust the iterator
    before trusting what it yielded.
    """
    scanner = PackScanner(source, limits, window_bytes)
    for offset, type_num, size, hlen, base_offset, base_oid, end, data in scanner.entries():
        header = PackEntryHeader(
            offset, type_num, size, hlen, base_offset if base_offset else None, base_oid
        )
        yield PackEntry(header, end - offset - hlen, data)
