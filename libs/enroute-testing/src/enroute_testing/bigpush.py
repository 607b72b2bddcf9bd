"""Large and hostile pushes, for the memory tests and bench/push_memory.py.

A delta bomb (issue 24, finding 2): a blob and one OFS_DELTA whose copy instructions
repeat it until the declared result size (gitformat-pack.txt, "Deltified
representation": copies of up to 0xFFFFFF bytes). Large packs are written to a file
as they are made, so the client never holds them whole.
"""

from __future__ import annotations

import hashlib
import http.client
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from enroute_core.git.delta import encode_varint
from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.packwrite import PackWriter
from enroute_core.git.pktline import FLUSH_PKT, pkt_line

ZERO_HEX = b"0" * 40
IDENT = b"A U Thor <author@example.com> 1700000000 +0000"
_COPY_BYTES_MAX = 0xFFFFFF
_SEND_BYTES = 1 << 20


def _copy(offset: int, size: int) -> bytes:
    """A copy instruction: offset bytes 0-3 and size bytes 0-2 where not zero."""
    assert 0 < size <= _COPY_BYTES_MAX and 0 <= offset < 1 << 32
    cmd, args = 0x80, bytearray()
    for i in range(4):
        byte = (offset >> (8 * i)) & 0xFF
        if byte:
            cmd |= 1 << i
            args.append(byte)
    for i in range(3):
        byte = (size >> (8 * i)) & 0xFF
        if byte:
            cmd |= 1 << (4 + i)
            args.append(byte)
    return bytes([cmd]) + bytes(args)


def delta_bomb(base_bytes: int, result_bytes: int) -> bytes:
    """A pack of a blob of ``base_bytes`` zeros and a delta on it declaring ``result_bytes``
    (copies of the whole base, the last one shorter): some KiB for a GiB object."""
    assert 0 < base_bytes <= _COPY_BYTES_MAX
    copies = bytearray()
    left = result_bytes
    while left:
        size = min(left, base_bytes)
        copies += _copy(0, size)
        left -= size
    delta = encode_varint(base_bytes) + encode_varint(result_bytes) + bytes(copies)
    chunks: list[bytes] = []
    writer = PackWriter(chunks.append)
    writer.header(2)
    base_offset = writer.offset
    writer.add_full(int(ObjectType.BLOB), bytes(base_bytes))
    writer.add_ofs_delta(base_offset, delta)
    writer.finish()
    return b"".join(chunks)


def _grown(base: bytes, tail: bytes) -> tuple[bytes, bytes]:
    """(the delta making ``base + tail`` from ``base``, its oid): copies of the whole base
    and one insert, written without a delta search."""
    size = len(base) + len(tail)
    copies = bytearray(encode_varint(len(base)) + encode_varint(size))
    for offset in range(0, len(base), _COPY_BYTES_MAX):
        copies += _copy(offset, min(_COPY_BYTES_MAX, len(base) - offset))
    assert 0 < len(tail) < 0x80
    copies += bytes([len(tail)]) + tail
    sha = hashlib.sha1(b"blob %d\0" % size)
    sha.update(base)
    sha.update(tail)
    return bytes(copies), sha.digest()


def write_blob_pack(
    path: Path,
    blob_sizes: Sequence[int],
    blob: Callable[[int], bytes] = os.urandom,
    *,
    grow_first: bool = False,
) -> bytes:
    """Write a pack of one commit, one tree and a blob of each size (``blob(size)`` gives
    its content; random bytes by default, which do not compress) to ``path``, one entry
    at a time, compressed at zlib level 1; return the commit's hex id.

    ``grow_first``: one more blob, the first with a line added, as an OFS_DELTA on it (a
    delta against a large base)."""
    entries: list[bytes] = []
    with open(path, "wb") as out:
        writer = PackWriter(out.write, level=1)
        writer.header(len(blob_sizes) + 2 + grow_first)
        for i, size in enumerate(blob_sizes):
            body = blob(size)
            oid = object_id(ObjectType.BLOB, body)
            entries.append(b"100644 f%06d\0" % i + bytes(oid))
            offset = writer.offset
            writer.add_full(int(ObjectType.BLOB), body)
            if grow_first and not i:
                delta, grown = _grown(body, b"one more line\n")
                entries.append(b"100644 g%06d\0" % i + grown)
                writer.add_ofs_delta(offset, delta)
            del body
        entries.sort(key=lambda e: e.split(b"\0", 1)[0].split(b" ", 1)[1])
        tree = b"".join(entries)
        commit = b"tree %s\nauthor %s\ncommitter %s\n\nlarge\n" % (
            bytes(object_id(ObjectType.TREE, tree)).hex().encode(), IDENT, IDENT
        )  # fmt: skip
        writer.add_full(int(ObjectType.TREE), tree)
        writer.add_full(int(ObjectType.COMMIT), commit)
        writer.finish()
    return bytes(object_id(ObjectType.COMMIT, commit)).hex().encode()


def push_command(new_hex: bytes, ref: bytes = b"refs/heads/main") -> bytes:
    """The receive-pack request up to its pack: one create command and a flush."""
    return pkt_line(ZERO_HEX + b" " + new_hex + b" " + ref + b"\0report-status\n") + FLUSH_PKT


def push_file(address: str, repo: str, new_hex: bytes, pack: Path) -> tuple[int, bytes]:
    """Push the pack in ``pack`` to ``repo`` at ``address`` (HOST:PORT), streaming it;
    (HTTP status, body) of the answer."""
    head = push_command(new_hex)
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=3600)
    try:
        conn.putrequest("POST", f"/{repo}.git/git-receive-pack")
        conn.putheader("Content-Type", "application/x-git-receive-pack-request")
        conn.putheader("Content-Length", str(len(head) + pack.stat().st_size))
        conn.endheaders()
        conn.send(head)
        with open(pack, "rb") as f:
            while chunk := f.read(_SEND_BYTES):
                conn.send(chunk)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
