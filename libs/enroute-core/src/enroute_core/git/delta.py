"""Git delta instructions: apply (and, beside it, create).

Format (Git ``Documentation/gitformat-pack.txt``, "Deltified representation"):

    delta    = src_size:varint dst_size:varint instruction*
    varint   = little-endian base-128, 7 bits a byte, high bit = more follows
    copy     = 1oooosss  [off0][off1][off2][off3][len0][len1][len2]
               bits o select which offset bytes follow, bits s which length
               bytes; a length of 0 means 0x10000
    insert   = 0nnnnnnn  then n literal bytes (n in 1..127)
    reserved = 0x00      (an error)
"""

from __future__ import annotations

from enroute_core.base.errors import InvalidDelta


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
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


def delta_sizes(delta: bytes | memoryview) -> tuple[int, int, int]:
    """Return (source size, target size, offset of the first instruction)."""
    src_size, pos = read_varint(delta, 0)
    dst_size, pos = read_varint(delta, pos)
    return src_size, dst_size, pos


def apply_delta_py(base: bytes | memoryview, delta: bytes | memoryview) -> bytes:
    """Reference implementation in Python; :func:`apply_delta` may use a faster one."""
    src_size, dst_size, pos = delta_sizes(delta)
    if src_size != len(base):
        raise InvalidDelta(f"delta expects a base of {src_size} bytes, got {len(base)}")
    out = bytearray()
    end = len(delta)
    while pos < end:
        op = delta[pos]
        pos += 1
        if op & 0x80:
            offset = 0
            length = 0
            for i in range(4):
                if op & (1 << i):
                    if pos >= end:
                        raise InvalidDelta("copy instruction is truncated")
                    offset |= delta[pos] << (8 * i)
                    pos += 1
            for i in range(3):
                if op & (0x10 << i):
                    if pos >= end:
                        raise InvalidDelta("copy instruction is truncated")
                    length |= delta[pos] << (8 * i)
                    pos += 1
            if length == 0:
                length = 0x10000
            if offset + length > src_size:
                raise InvalidDelta("copy instruction reads past the end of the base")
            out += base[offset : offset + length]
        elif op:
            if pos + op > end:
                raise InvalidDelta("insert instruction is truncated")
            out += delta[pos : pos + op]
            pos += op
        else:
            raise InvalidDelta("reserved delta opcode 0")
        if len(out) > dst_size:
            raise InvalidDelta("delta produces more bytes than its header says")
    if len(out) != dst_size:
        raise InvalidDelta(f"delta produced {len(out)} bytes, header says {dst_size}")
    return bytes(out)


apply_delta = apply_delta_py
