"""Large and hostile pushes, for the memory tests and bench/push_memory.py.

A delta bomb (issue 24, finding 2): a blob and one OFS_DELTA whose copy instructions
repeat it until the declared result size (gitformat-pack.txt, "Deltified
representation": copies of up to 0xFFFFFF bytes). Large packs are written to a file
as they are made, so the client never holds them whole.
"""

from __future__ import annotations

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


def write_blob_pack(
    path: Path, blob_sizes: Sequence[int], blob: Callable[[int], bytes] = os.urandom
) -> bytes:
    """Write a pack of one commit, one tree and a blob of each size (``blob(size)`` gives
    its content; random bytes by default, which do not compress) to ``path``, one entry
    at a time, compressed at zlib level 1; return the commit's hex id."""
    entries: list[bytes] = []
    with open(path, "wb") as out:
        writer = PackWriter(out.write, level=1)
        writer.header(len(blob_sizes) + 2)
        for i, size in enumerate(blob_sizes):
            body = blob(size)
            oid = object_id(ObjectType.BLOB, body)
            entries.append(b"100644 f%06d\0" % i + bytes(oid))
            writer.add_full(int(ObjectType.BLOB), body)
            del body
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
