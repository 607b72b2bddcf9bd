"""Raw smart-HTTP requests and hand-built objects and packs for the hostile-input tests.

Requests are built byte by byte (gitprotocol-pack, "Reference Update Request
and Packfile Transfer"; gitprotocol-v2, "fetch"), so that every field can be
made wrong on purpose.
"""

from __future__ import annotations

import hashlib
import http.client
import struct
import urllib.parse
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from enroute_core.git.pack import encode_entry_header, encode_ofs_distance
from enroute_core.git.pktline import FLUSH_PKT, pkt_line

ZERO = b"0" * 40
IDENT = b"A U Thor <author@example.com> 1700000000 +0000"
TYPE_NAMES = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}
HTTP_TIMEOUT_S = 30.0


def oid_of(type_num: int, body: bytes) -> bytes:
    """Hex object id."""
    header = TYPE_NAMES[type_num] + b" %d\0" % len(body)
    return hashlib.sha1(header + body).hexdigest().encode()


def tree_body(entries: Sequence[tuple[bytes, bytes, bytes]]) -> bytes:
    """Entries (mode, name, hex oid) in the order given: no sorting, no checks."""
    return b"".join(m + b" " + n + b"\0" + bytes.fromhex(o.decode()) for m, n, o in entries)


def commit_body(
    tree: bytes,
    parents: Sequence[bytes] = (),
    *,
    author: bytes | None = IDENT,
    committer: bytes | None = IDENT,
    message: bytes = b"hostile\n",
) -> bytes:
    out = b"tree " + tree + b"\n"
    out += b"".join(b"parent " + p + b"\n" for p in parents)
    if author is not None:
        out += b"author " + author + b"\n"
    if committer is not None:
        out += b"committer " + committer + b"\n"
    return out + b"\n" + message


def tag_body(target: bytes, type_name: bytes = b"commit", name: bytes = b"v1") -> bytes:
    return (
        b"object "
        + target
        + b"\ntype "
        + type_name
        + b"\ntag "
        + name
        + b"\ntagger "
        + IDENT
        + b"\n\nhostile tag\n"
    )


def full_entry(type_num: int, body: bytes, *, size: int | None = None) -> bytes:
    declared = len(body) if size is None else size
    return encode_entry_header(type_num, declared) + zlib.compress(body)


def ref_delta_entry(base_hex: bytes, delta: bytes) -> bytes:
    return (
        encode_entry_header(7, len(delta)) + bytes.fromhex(base_hex.decode()) + zlib.compress(delta)
    )


def ofs_delta_entry(distance: int, delta: bytes) -> bytes:
    return encode_entry_header(6, len(delta)) + encode_ofs_distance(distance) + zlib.compress(delta)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def delta(src_size: int, dst_size: int, ops: bytes) -> bytes:
    return varint(src_size) + varint(dst_size) + ops


def insert_op(data: bytes) -> bytes:
    assert 0 < len(data) < 128
    return bytes([len(data)]) + data


def copy_op(offset: int, size: int) -> bytes:
    """A copy of ``size`` bytes (1..65535) at ``offset`` (under 2**32)."""
    cmd = 0x80
    args = bytearray()
    for i in range(4):
        byte = (offset >> (8 * i)) & 0xFF
        if byte:
            cmd |= 1 << i
            args.append(byte)
    for i in range(2):
        byte = (size >> (8 * i)) & 0xFF
        if byte:
            cmd |= 1 << (4 + i)
            args.append(byte)
    return bytes([cmd]) + bytes(args)


def pack(entries: Sequence[bytes], *, count: int | None = None, version: int = 2) -> bytes:
    """Header, raw entries, SHA-1 trailer."""
    n = len(entries) if count is None else count
    data = b"PACK" + struct.pack(">II", version, n) + b"".join(entries)
    return data + hashlib.sha1(data).digest()


def pack_of(objects: Sequence[tuple[int, bytes]]) -> bytes:
    return pack([full_entry(t, b) for t, b in objects])


def push_body(
    commands: Sequence[tuple[bytes, bytes, bytes]],
    pack_bytes: bytes = b"",
    *,
    caps: bytes = b"report-status",
) -> bytes:
    lines = []
    for index, (old, new, ref) in enumerate(commands):
        line = old + b" " + new + b" " + ref
        if index == 0:
            line += b"\0" + caps
        lines.append(pkt_line(line + b"\n"))
    return b"".join(lines) + FLUSH_PKT + pack_bytes


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Client:
    """One HTTP connection per request (a refused request may leave a connection unusable)."""

    def __init__(self, base_url: str) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        assert parsed.hostname is not None and parsed.port is not None
        self.host = parsed.hostname
        self.port = parsed.port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=HTTP_TIMEOUT_S)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return Reply(response.status, response.read())
        finally:
            conn.close()

    def receive_pack(self, repo: str, body: bytes) -> Reply:
        return self.request(
            "POST",
            f"/{repo}.git/git-receive-pack",
            body,
            {"Content-Type": "application/x-git-receive-pack-request"},
        )

    def upload_pack_v2(self, repo: str, body: bytes) -> Reply:
        return self.request(
            "POST",
            f"/{repo}.git/git-upload-pack",
            body,
            {"Content-Type": "application/x-git-upload-pack-request", "Git-Protocol": "version=2"},
        )

    def refs(self, repo: str) -> dict[bytes, bytes]:
        """Ref name -> hex oid from the v0 upload-pack advertisement (empty when none)."""
        reply = self.request("GET", f"/{repo}.git/info/refs?service=git-upload-pack")
        assert reply.status == 200, (reply.status, reply.body[:300])
        found: dict[bytes, bytes] = {}
        for payload in pkt_payloads(reply.body):
            line = payload.rstrip(b"\n").split(b"\0", 1)[0]
            if line.startswith(b"#") or len(line) < 42:
                continue
            oid, _, name = line.partition(b" ")
            if oid != ZERO:
                found[name] = oid
        return found

    def push(
        self, repo: str, commands: Sequence[tuple[bytes, bytes, bytes]], pack_bytes: bytes
    ) -> Reply:
        return self.receive_pack(repo, push_body(commands, pack_bytes))


def pkt_payloads(data: bytes) -> list[bytes]:
    """Payloads of the pkt-lines in ``data`` (flush and delim dropped), side-band undone."""
    out: list[bytes] = []
    pos = 0
    while pos + 4 <= len(data):
        try:
            size = int(data[pos : pos + 4], 16)
        except ValueError:
            break
        if size < 4:
            pos += 4
            continue
        out.append(data[pos + 4 : pos + size])
        pos += size
    return out


def report_lines(reply: Reply) -> list[bytes]:
    """The report-status lines (``unpack ...``, ``ok ...``, ``ng ...``)."""
    return [p.rstrip(b"\n") for p in pkt_payloads(reply.body)]
