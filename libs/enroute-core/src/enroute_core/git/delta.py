"""Git delta instructions: apply and create.

Format (Git ``Documentation/gitformat-pack.txt``, "Deltified representation"):

    delta    = src_size:varint dst_size:varint instruction*
    varint   = little-endian base-128, 7 bits a byte, high bit = more follows
    copy     = 1sssoooo  [off0][off1][off2][off3][len0][len1][len2]
               (bit 7 first) bit i of oooo says offset byte i follows, bit i
               of sss says length byte i follows; absent bytes are 0, and a
               length of 0 means 0x10000
    insert   = 0nnnnnnn  then n literal bytes (n in 1..127)
    reserved = 0x00      (an error)

Application checks what Git's ``patch-delta.c`` checks: the delta has at least
4 bytes, the base has exactly ``src_size`` bytes, no copy reads past the base,
no instruction is cut short, and the output has exactly ``dst_size`` bytes.
Any failure is :class:`InvalidDelta`; an output over
``Limits.object_bytes_max`` is :class:`LimitExceeded`. docs/formats/delta.md
has the byte layout with an example; docs/delta-apply.md has the
measurements behind :func:`apply_delta`.
"""

from __future__ import annotations

from typing import Final, overload

from enroute_core.base.errors import InvalidDelta, LimitExceeded
from enroute_core.base.limits import DEFAULT_LIMITS, Limits

try:  # dulwich's compiled routine is pure computation; without it we use ours.
    from dulwich._pack import apply_delta as _compiled_apply
    from dulwich.errors import ApplyDeltaError as _CompiledDeltaError
except ImportError:  # pragma: no cover - dulwich ships wheels with the extension
    _compiled_apply = None

Buffer = bytes | bytearray | memoryview

# git's patch-delta.c refuses shorter deltas (DELTA_SIZE_MIN), even those of
# an empty target; create_delta pads such headers up to it.
_DELTA_BYTES_MIN: Final = 4
# A copy reads at most 0xFFFFFF bytes, an insert writes at most 127: no
# instruction byte can stand for more output than this (used to refuse
# headers that promise more than the instructions could ever write).
_COPY_BYTES_MAX: Final = 0xFFFFFF
_INSERT_BYTES_MAX: Final = 0x7F
# Git writes copies of at most 0x10000 bytes (pack v2 readers need no more).
_COPY_CHUNK_BYTES: Final = 0x10000
# Copy offsets are 32 bits: bytes of the base past 4 GiB cannot be referenced.
_COPY_OFFSET_END: Final = 1 << 32

# Joining slices in Python beats the compiled routine, which zero-fills its
# output and copies it once more into a bytes object, on large outputs written
# by few instructions (docs/delta-apply.md has the measurements).
_JOIN_FROM_BYTES: Final = 1 << 20
_JOIN_BYTES_PER_DELTA_BYTE: Final = 512
# See _apply_compiled: an insert of 127 zero bytes.
_GUARD_BYTES: Final = _INSERT_BYTES_MAX
_GUARD: Final = bytes([_GUARD_BYTES]) + bytes(_GUARD_BYTES)


def read_varint(data: Buffer, pos: int) -> tuple[int, int]:
    """Decode a delta-header size at ``pos``; return (value, next position)."""
    value = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise InvalidDelta("delta header is truncated")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
        if shift > 63:
            raise InvalidDelta("delta header size is too long")


def encode_varint(value: int) -> bytes:
    """Encode a delta-header size (the inverse of :func:`read_varint`)."""
    assert value >= 0, value
    out = bytearray()
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_short(value: int) -> bytes:
    """:func:`encode_varint`, quicker for the sizes of small objects."""
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    return encode_varint(value)


def delta_sizes(delta: Buffer) -> tuple[int, int, int]:
    """Return (source size, target size, offset of the first instruction)."""
    src_size, pos = read_varint(delta, 0)
    dst_size, pos = read_varint(delta, pos)
    return src_size, dst_size, pos


def _check_header(base: Buffer, delta: Buffer, limits: Limits) -> tuple[int, int, int]:
    """Read the header sizes and check them against the base, the limits and what
    the instructions could ever write (so no output is sized from a lie).
    """
    if len(delta) < _DELTA_BYTES_MIN:
        raise InvalidDelta(f"delta of {len(delta)} bytes is shorter than git accepts")
    try:  # read_varint inlined twice: this runs once per object read
        byte = delta[0]
        src_size = byte & 0x7F
        pos = 1
        if byte & 0x80:
            shift = 7
            while True:
                byte = delta[pos]
                pos += 1
                src_size |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise InvalidDelta("delta header size is too long")
        byte = delta[pos]
        pos += 1
        dst_size = byte & 0x7F
        if byte & 0x80:
            shift = 7
            while True:
                byte = delta[pos]
                pos += 1
                dst_size |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise InvalidDelta("delta header size is too long")
    except IndexError:
        raise InvalidDelta("delta header is truncated") from None
    if src_size != len(base):
        raise InvalidDelta(f"delta expects a base of {src_size} bytes, got {len(base)}")
    if dst_size > (len(delta) - pos) * _INSERT_BYTES_MAX:  # passes cheaply when small
        per_byte_max = min(max(src_size, _INSERT_BYTES_MAX), _COPY_BYTES_MAX)
        if dst_size > (len(delta) - pos) * per_byte_max:
            raise InvalidDelta(f"delta header promises {dst_size} bytes, more than it can write")
    if dst_size > limits.object_bytes_max:
        raise LimitExceeded("object_bytes_max", dst_size, limits.object_bytes_max)
    return src_size, dst_size, pos


def _apply_join(base: Buffer, delta: Buffer, src_size: int, dst_size: int, pos: int) -> bytes:
    """Apply in Python: one slice per instruction, one join (one copy per byte)."""
    src = memoryview(base)
    ops = memoryview(delta)
    parts: list[memoryview] = []
    append = parts.append
    end = len(delta)
    written = 0
    try:
        while pos < end:
            op = ops[pos]
            pos += 1
            if op & 0x80:
                offset = 0
                if op & 0x01:
                    offset = ops[pos]
                    pos += 1
                if op & 0x02:
                    offset |= ops[pos] << 8
                    pos += 1
                if op & 0x04:
                    offset |= ops[pos] << 16
                    pos += 1
                if op & 0x08:
                    offset |= ops[pos] << 24
                    pos += 1
                length = 0
                if op & 0x10:
                    length = ops[pos]
                    pos += 1
                if op & 0x20:
                    length |= ops[pos] << 8
                    pos += 1
                if op & 0x40:
                    length |= ops[pos] << 16
                    pos += 1
                if length == 0:
                    length = 0x10000
                if offset + length > src_size:
                    raise InvalidDelta("copy instruction reads past the end of the base")
                append(src[offset : offset + length])
                written += length
            elif op:
                if pos + op > end:
                    raise InvalidDelta("insert instruction is truncated")
                append(ops[pos : pos + op])
                pos += op
                written += op
            else:
                raise InvalidDelta("reserved delta opcode 0")
            if written > dst_size:
                raise InvalidDelta("delta writes more bytes than its header says")
    except IndexError:
        raise InvalidDelta("copy instruction is truncated") from None
    if written != dst_size:
        raise InvalidDelta(f"delta wrote {written} bytes, header says {dst_size}")
    return b"".join(parts)


def _apply_compiled(base: Buffer, delta: Buffer, src_size: int, dst_size: int, pos: int) -> bytes:
    """Apply with dulwich's compiled routine; only :class:`InvalidDelta` escapes.

    The routine skips a copy it finds out of range instead of failing, so a
    complete delta followed by one bad copy would pass. A guard insert of 127
    zero bytes is appended (and counted in the header): it is reached only if
    every instruction before it ran, and an instruction cut short swallows
    part of it and then meets opcode 0 (copies take at most 7 argument bytes,
    inserts at most 127 literal bytes, the guard is 128 bytes long).
    """
    assert _compiled_apply is not None
    src = base if type(base) is bytes else bytes(base)
    head = _varint_short(src_size) + _varint_short(dst_size + _GUARD_BYTES)
    try:
        chunks = _compiled_apply(src, head + delta[pos:] + _GUARD)
    except _CompiledDeltaError as exc:
        raise InvalidDelta(f"invalid delta: {exc}") from None
    out: bytes = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    # The routine checked the size; the guard, parsed last, wrote the tail.
    if len(out) != dst_size + _GUARD_BYTES:
        raise InvalidDelta(f"delta wrote {len(out) - _GUARD_BYTES} bytes, header says {dst_size}")
    return out[:dst_size]


def apply_delta_py(base: Buffer, delta: Buffer, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """:func:`apply_delta` in Python alone (the fallback, and a test oracle)."""
    src_size, dst_size, pos = _check_header(base, delta, limits)
    return _apply_join(base, delta, src_size, dst_size, pos)


def apply_delta(base: Buffer, delta: Buffer, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Rebuild the target of ``delta`` from ``base`` (gitformat-pack.txt, "Deltified
    representation"). Raises :class:`InvalidDelta` for any malformed delta and
    :class:`LimitExceeded` for a target over ``limits.object_bytes_max``.

    dulwich's compiled routine is several times faster per instruction; joining
    slices wins on large targets made of few long copies, where the compiled
    routine's zero-fill and second copy dominate (docs/delta-apply.md).
    """
    src_size, dst_size, pos = _check_header(base, delta, limits)
    if _compiled_apply is None or (
        dst_size >= _JOIN_FROM_BYTES and dst_size >= _JOIN_BYTES_PER_DELTA_BYTE * len(delta)
    ):
        return _apply_join(base, delta, src_size, dst_size, pos)
    return _apply_compiled(base, delta, src_size, dst_size, pos)


# --- create ---------------------------------------------------------------

# Blocks of the base are indexed at multiples of this; a run of at least
# this many equal bytes is the shortest match looked for (git's diff-delta.c
# uses a 16-byte window too).
_BLOCK_BYTES: Final = 16
# Inside a run of unmatched target bytes, every position is looked up for
# this many bytes; after that only every 15th. 15 and 16 are coprime, so one
# position in any 240 lands on an indexed block: matches of 255 bytes or more
# are still always found, at a fifteenth of the cost on dissimilar data.
_DENSE_PROBE_BYTES: Final = 1024
_SPARSE_STRIDE: Final = 15
# A hit found after a give-up point may still extend back this far.
_GIVE_UP_SLACK_BYTES: Final = _BLOCK_BYTES * (_SPARSE_STRIDE + 2)
# Slices compared at once while extending a match; bigger slices stop paying
# once the temporaries leave the allocator's arenas.
_COMPARE_BYTES_MAX: Final = 256 * 1024


def _extend_forward(a: bytes, i: int, b: bytes, j: int, limit: int) -> int:
    """Length of the common prefix of ``a[i:]`` and ``b[j:]``, at most ``limit``.

    Gallops with growing slices, then bisects the first unequal slice: no
    Python loop per byte.
    """
    n = 0
    step = 32
    while True:
        size = min(step, limit - n)
        if size <= 0:
            return n
        if a[i + n : i + n + size] != b[j + n : j + n + size]:
            break
        n += size
        step = min(step * 2, _COMPARE_BYTES_MAX)
    while size > 1:  # a difference lies in [n, n + size)
        half = size // 2
        if a[i + n : i + n + half] == b[j + n : j + n + half]:
            n += half
            size -= half
        else:
            size = half
    return n


def _extend_backward(a: bytes, i: int, b: bytes, j: int, limit: int) -> int:
    """Length of the common suffix of ``a[:i]`` and ``b[:j]``, at most ``limit``."""
    n = 0
    step = 32
    while True:
        size = min(step, limit - n)
        if size <= 0:
            return n
        if a[i - n - size : i - n] != b[j - n - size : j - n]:
            break
        n += size
        step = min(step * 2, _COMPARE_BYTES_MAX)
    while size > 1:  # a difference lies in the `size` bytes before n
        half = size // 2
        if a[i - n - half : i - n] == b[j - n - half : j - n]:
            n += half
            size -= half
        else:
            size = half
    return n


def _emit_insert(out: bytearray, target: bytes, start: int, end: int) -> None:
    while start < end:
        size = min(end - start, _INSERT_BYTES_MAX)
        out.append(size)
        out += target[start : start + size]
        start += size


def _emit_copy(out: bytearray, offset: int, length: int) -> None:
    while length > 0:
        size = min(length, _COPY_CHUNK_BYTES)
        op = 0x80
        args = bytearray()
        for i in range(4):
            byte = (offset >> (8 * i)) & 0xFF
            if byte:
                op |= 1 << i
                args.append(byte)
        for i in range(2):  # size <= 0x10000; 0x10000 is written as no bytes
            byte = (size >> (8 * i)) & 0xFF
            if byte:
                op |= 0x10 << i
                args.append(byte)
        out.append(op)
        out += args
        offset += size
        length -= size


def _index_blocks(base: bytes) -> dict[bytes, int]:
    """Map each aligned 16-byte block of the base to its first offset."""
    last = min(len(base), _COPY_OFFSET_END) - _BLOCK_BYTES
    first = last - last % _BLOCK_BYTES
    # Walk backwards so that the lowest offset of a repeated block wins.
    return {base[o : o + _BLOCK_BYTES]: o for o in range(first, -1, -_BLOCK_BYTES)}


@overload
def create_delta(base: Buffer, target: Buffer, *, max_delta_bytes: None = None) -> bytes: ...


@overload
def create_delta(base: Buffer, target: Buffer, *, max_delta_bytes: int) -> bytes | None: ...


def create_delta(
    base: Buffer, target: Buffer, *, max_delta_bytes: int | None = None
) -> bytes | None:
    """Encode ``target`` as copies from ``base`` and inserts (gitformat-pack.txt,
    "Deltified representation"), for any two inputs.

    Like git's ``diff-delta.c``: aligned 16-byte blocks of the base are indexed,
    the target is looked up block by block, and each hit is extended backwards
    into the pending literal and forwards as far as both agree. Copies are
    written in pieces of at most 0x10000 bytes and inserts of at most 127, as
    git writes them; the delta of an empty target writes its size 0 in more
    bytes than needed, up to the 4 bytes git requires of any delta. With
    ``max_delta_bytes``, returns None as soon as the delta is known to be
    longer (a pack writer's "not worth it").
    """
    src = base if type(base) is bytes else bytes(base)
    dst = target if type(target) is bytes else bytes(target)
    budget = -1 if max_delta_bytes is None else max_delta_bytes
    out = bytearray(encode_varint(len(src)))
    out += encode_varint(len(dst))
    usable = min(len(src), _COPY_OFFSET_END)
    index = _index_blocks(src) if usable >= _BLOCK_BYTES else {}
    lookup = index.get
    probe_end = len(dst) - _BLOCK_BYTES + 1  # positions j with a whole block at j
    literal = 0  # start of the target bytes not yet written
    j = 0
    while j < probe_end and index:
        stop = probe_end
        if budget >= 0:
            # A literal of n bytes costs more than n bytes: past this, give up.
            stop = min(stop, literal + budget - len(out) + _GIVE_UP_SLACK_BYTES)
        dense_stop = min(stop, literal + _DENSE_PROBE_BYTES)
        offset = -1
        while j < stop:
            found = lookup(dst[j : j + _BLOCK_BYTES])
            if found is not None:
                offset = found
                break
            j += 1 if j < dense_stop else _SPARSE_STRIDE
        if offset < 0:
            if stop < probe_end:
                return None
            break
        ahead = _extend_forward(
            src,
            offset + _BLOCK_BYTES,
            dst,
            j + _BLOCK_BYTES,
            min(usable - offset, len(dst) - j) - _BLOCK_BYTES,
        )
        back = _extend_backward(src, offset, dst, j, min(offset, j - literal))
        _emit_insert(out, dst, literal, j - back)
        _emit_copy(out, offset - back, back + _BLOCK_BYTES + ahead)
        j += _BLOCK_BYTES + ahead
        literal = j
        if 0 <= budget < len(out):
            return None
    _emit_insert(out, dst, literal, len(dst))
    if len(out) < _DELTA_BYTES_MIN:  # an empty target: write its size 0 in more bytes
        assert not dst and out[-1] == 0, out
        out[-1:] = b"\x80" * (_DELTA_BYTES_MIN - len(out)) + b"\x00"
    if 0 <= budget < len(out):
        return None
    return bytes(out)
