"""Generate the golden ``ENRLAYR1`` layers (docs/formats/layer.md, "Golden vectors").

Deterministic: fixed Git objects, fixed times, zlib streams made of stored
deflate blocks (so the bytes do not depend on the zlib build), and only the
layer writer. Regenerate from ``libs/enroute-core`` with::

    ../../.venv/bin/python tests/storage/golden/make_golden.py

then review the diff: the test asserts the writer reproduces these bytes.

pushed.layer: a pushed layer with all four kinds, two REF_DELTA entries (one
against a local base, one against a base in an older layer), external refs
(a parent commit, a delta base, a tree entry), base contexts and commits
with segments.

merged.layer: a merged layer of two sources (each with its kind runs), id
runs with a hole inside and one at the end, and a commit graph by
repository ids (the layer's range starts at id 100).
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from enroute_core.base.ids import ObjectId
from enroute_core.git.pack import encode_entry_header
from enroute_core.storage.layer import (
    CommitInfo,
    GraphCommit,
    Kind,
    LayerEntry,
    SealedLayer,
    write_layer,
)

HERE = Path(__file__).resolve().parent
FIRST_ID = 100
"""The merged layer's range starts here (its graph holds repository ids)."""

_TYPE_NAME = {Kind.COMMIT: b"commit", Kind.TREE: b"tree", Kind.BLOB: b"blob", Kind.TAG: b"tag"}
_PACK_TYPE = {Kind.COMMIT: 1, Kind.TREE: 2, Kind.BLOB: 3, Kind.TAG: 4}
_REF_DELTA = 7


@dataclass(frozen=True)
class GitObject:
    kind: Kind
    body: bytes

    @property
    def oid(self) -> ObjectId:
        head = _TYPE_NAME[self.kind] + b" %d\0" % len(self.body)
        return ObjectId(hashlib.sha1(head + self.body).digest())


def zlib_stored(data: bytes) -> bytes:
    """A zlib stream of stored deflate blocks (RFC 1950/1951): the same bytes everywhere."""
    out = bytearray(b"\x78\x01")
    blocks = [data[i : i + 0xFFFF] for i in range(0, len(data), 0xFFFF)] or [b""]
    for n, block in enumerate(blocks):
        out.append(1 if n == len(blocks) - 1 else 0)
        out += len(block).to_bytes(2, "little") + (len(block) ^ 0xFFFF).to_bytes(2, "little")
        out += block
    out += zlib.adler32(data).to_bytes(4, "big")
    return bytes(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def make_delta(base: bytes, target: bytes) -> bytes:
    """Git delta: copy the common prefix of ``base``, insert the rest (gitformat-pack.txt,
    "Deltified representation")."""
    prefix = 0
    while prefix < min(len(base), len(target), 0xFFFF) and base[prefix] == target[prefix]:
        prefix += 1
    out = bytearray(_varint(len(base)) + _varint(len(target)))
    if prefix:
        out += bytes([0x80 | 0x10 | 0x20, prefix & 0xFF, prefix >> 8])  # offset 0, 2 length bytes
    rest = target[prefix:]
    for i in range(0, len(rest), 127):
        out.append(len(rest[i : i + 127]))
        out += rest[i : i + 127]
    return bytes(out)


def full_entry(obj: GitObject, base_context: GitObject | ObjectId | None = None) -> LayerEntry:
    return LayerEntry(
        oid=obj.oid,
        kind=obj.kind,
        entry=encode_entry_header(_PACK_TYPE[obj.kind], len(obj.body)) + zlib_stored(obj.body),
        size=len(obj.body),
        base=None,
        depth=0,
        base_context=_oid(base_context),
    )


def delta_entry(
    obj: GitObject,
    base: GitObject,
    depth: int,
    base_context: GitObject | ObjectId | None = None,
) -> LayerEntry:
    delta = make_delta(base.body, obj.body)
    return LayerEntry(
        oid=obj.oid,
        kind=obj.kind,
        entry=encode_entry_header(_REF_DELTA, len(delta)) + base.oid + zlib_stored(delta),
        size=len(obj.body),
        base=base.oid,
        depth=depth,
        base_context=_oid(base_context),
    )


def _oid(x: GitObject | ObjectId | None) -> ObjectId | None:
    return x.oid if isinstance(x, GitObject) else x


def tree(*entries: tuple[bytes, bytes, ObjectId]) -> GitObject:
    """Entries (mode, name, oid), given in Git's tree order."""
    return GitObject(Kind.TREE, b"".join(m + b" " + n + b"\0" + o for m, n, o in entries))


def commit(tree_oid: ObjectId, parents: tuple[ObjectId, ...], time: int, msg: bytes) -> GitObject:
    lines = [b"tree " + tree_oid.hex().encode()]
    lines += [b"parent " + p.hex().encode() for p in parents]
    lines.append(b"author A U Thor <author@example.com> %d +0000" % (time - 60))
    lines.append(b"committer C O Mitter <committer@example.com> %d +0000" % time)
    return GitObject(Kind.COMMIT, b"\n".join(lines) + b"\n\n" + msg + b"\n")


def tag(target: ObjectId, name: bytes, time: int) -> GitObject:
    body = (
        b"object " + target.hex().encode() + b"\ntype commit\ntag " + name
        + b"\ntagger T A Gger <tagger@example.com> %d +0000\n\nrelease " % time + name + b"\n"
    )  # fmt: skip
    return GitObject(Kind.TAG, body)


@dataclass(frozen=True)
class Golden:
    entries: tuple[LayerEntry, ...]
    commits: tuple[CommitInfo, ...]
    external: tuple[ObjectId, ...]
    merged: bool = False
    id_runs: tuple[tuple[int, int], ...] | None = None
    id_count: int | None = None
    graph: tuple[GraphCommit, ...] | None = None

    def write(self) -> tuple[bytes, SealedLayer]:
        return write_layer(
            self.entries,
            self.commits,
            merged=self.merged,
            id_runs=self.id_runs,
            id_count=self.id_count,
            graph=self.graph,
        )


# Objects stored in older layers: referenced, never stored here.
OLD_COMMIT = commit(ObjectId(b"\x11" * 20), (), 1_600_000_000, b"an older commit").oid
OLD_BLOB = GitObject(Kind.BLOB, b"vendored bytes from an older push\n" * 3)
OLD_BASE = GitObject(Kind.BLOB, b"license text, first version\n" * 4)


def pushed() -> Golden:
    b1 = GitObject(Kind.BLOB, b"# Project\n\nA small project for the golden layer.\n")
    b2 = GitObject(Kind.BLOB, b"int main(void) { return 0; }\n")
    b3 = GitObject(Kind.BLOB, b1.body + b"\nSecond paragraph, added in c2.\n")
    b4 = GitObject(Kind.BLOB, OLD_BASE.body + b"license text, amended\n")
    tsub = tree((b"100644", b"main.c", b2.oid))
    t1 = tree((b"100644", b"README", b1.oid), (b"40000", b"src", tsub.oid))
    t2 = tree(
        (b"100644", b"LICENSE", b4.oid),
        (b"100644", b"README", b3.oid),
        (b"40000", b"src", tsub.oid),
        (b"100644", b"vendor.bin", OLD_BLOB.oid),
    )
    c1 = commit(t1.oid, (OLD_COMMIT,), 1_700_000_000, b"first")
    c2 = commit(t2.oid, (c1.oid,), 1_700_000_100, b"second")
    t = tag(c2.oid, b"v1.0", 1_700_000_200)
    entries = (
        full_entry(c1),
        full_entry(c2, base_context=t),
        full_entry(t1, base_context=c1),
        full_entry(tsub, base_context=t1),
        full_entry(t2, base_context=c2),
        full_entry(b1, base_context=t1),
        full_entry(b2, base_context=tsub),
        delta_entry(b3, b1, 1, base_context=t2),
        delta_entry(b4, OLD_BASE, 2, base_context=t2),
        full_entry(t),
    )
    commits = (
        CommitInfo(c1.oid, t1.oid, (OLD_COMMIT,), 1_700_000_000,
                   (c1.oid, t1.oid, tsub.oid, b1.oid, b2.oid)),
        CommitInfo(c2.oid, t2.oid, (c1.oid,), 1_700_000_100,
                   (b4.oid, c2.oid, t2.oid, b3.oid, OLD_BLOB.oid, c2.oid)),
    )  # fmt: skip
    external = tuple(sorted((OLD_COMMIT, OLD_BLOB.oid, OLD_BASE.oid)))
    return Golden(entries, commits, external)


def merged() -> Golden:
    # source A (ids 100..103)
    a1 = GitObject(Kind.BLOB, b"alpha\n" * 8)
    a2 = GitObject(Kind.BLOB, a1.body + b"beta\n")
    ta = tree((b"100644", b"a.txt", a1.oid), (b"100644", b"b.txt", a2.oid))
    ca = commit(ta.oid, (), 1_700_001_000, b"root of source A")
    # source B (ids 104..109; 106 and 109 were duplicates the merge dropped)
    bb = GitObject(Kind.BLOB, b"gamma\n" * 5)
    tb = tree(
        (b"100644", b"a.txt", a1.oid),
        (b"100644", b"b.txt", bb.oid),
        (b"100644", b"c.txt", OLD_BLOB.oid),
    )
    cb = commit(tb.oid, (ca.oid,), 1_700_002_000, b"on top of A")
    tg = tag(cb.oid, b"v2.0", 1_700_002_100)
    entries = (
        full_entry(ca),
        full_entry(ta, base_context=ca),
        full_entry(a1, base_context=ta),
        delta_entry(a2, a1, 1, base_context=ta),
        full_entry(cb, base_context=tg),
        full_entry(tb, base_context=cb),
        full_entry(bb, base_context=tb),
        full_entry(tg),
    )
    commits = (
        CommitInfo(ca.oid, ta.oid, (), 1_700_001_000, (ca.oid, ta.oid, a1.oid, a2.oid)),
        CommitInfo(cb.oid, tb.oid, (ca.oid,), 1_700_002_000,
                   (cb.oid, tb.oid, bb.oid, OLD_BLOB.oid)),
    )  # fmt: skip
    old_blob_id = 42
    graph = (
        GraphCommit(FIRST_ID, FIRST_ID + 1, 1, 1_700_001_000, (), (100, 101, 102, 103)),
        GraphCommit(FIRST_ID + 4, FIRST_ID + 5, 2, 1_700_002_000, (FIRST_ID,),
                    (old_blob_id, 104, 105, 107)),
    )  # fmt: skip
    return Golden(
        entries,
        commits,
        external=(OLD_BLOB.oid,),
        merged=True,
        id_runs=((0, 0), (6, 7)),
        id_count=10,
        graph=graph,
    )


GOLDENS = {"pushed.layer": pushed, "merged.layer": merged}


def main() -> int:
    for name, make in GOLDENS.items():
        data, sealed = make().write()
        (HERE / name).write_bytes(data)
        sys.stdout.write(f"{name}: {sealed.file_size} bytes, root {sealed.root.hex()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
