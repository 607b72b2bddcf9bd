"""Hostile pushes and fetches against a real `enroute dev` (docs/security.md, one test per row).

Each case sends one hand-built request (gitprotocol-pack "Reference Update
Request and Packfile Transfer", gitprotocol-v2 "fetch") and checks three
things: the error the client sees (HTTP status plus the ``unpack``/``ng``/
plain-text reason), that the repository's refs did not move, and that the
node still serves (a normal push right after succeeds).

Print the table of what each row sees: ``HOSTILE_PRINT=1 pytest -s``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hostile_wire import (
    IDENT,
    ZERO,
    Client,
    Reply,
    commit_body,
    copy_op,
    delta,
    full_entry,
    insert_op,
    ofs_delta_entry,
    oid_of,
    pack,
    pack_of,
    push_body,
    ref_delta_entry,
    report_lines,
    tag_body,
    tree_body,
)

from enroute_core.git.pack import encode_entry_header
from enroute_core.git.pktline import FLUSH_PKT, pkt_line

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

BASE_REPO = "hostile/base"
ALIVE_REPO = "hostile/alive"
MAIN = b"refs/heads/main"
BLOB = b"hello\n"


@dataclass(frozen=True)
class Base:
    blob: bytes
    tree: bytes
    commit: bytes


def _objects_for_tree(
    base: Base, tree: bytes, extra: list[tuple[int, bytes]], ref: bytes = MAIN
) -> bytes:
    """A pack of ``extra`` objects plus a commit on ``base`` over ``tree``; returns the body.
    Another ``ref`` than main is created (a harmless problem is taken: main stays)."""
    commit = commit_body(oid_of(2, tree), [base.commit])
    objects = [*extra, (2, tree), (1, commit)]
    old = base.commit if ref == MAIN else ZERO
    return push_body([(old, oid_of(1, commit), ref)], pack_of(objects))


def _bad_tree(entries: list[tuple[bytes, bytes]], ref: bytes = MAIN) -> Callable[[Base], bytes]:
    """A commit over a tree of (mode, name) entries, each naming the base blob."""

    def build(base: Base) -> bytes:
        tree = tree_body([(m, n, base.blob) for m, n in entries])
        return _objects_for_tree(base, tree, [], ref)

    return build


def _raw_tree(raw: bytes) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        return _objects_for_tree(base, raw, [])

    return build


def _bad_commit(make: Callable[[Base], bytes], ref: bytes = MAIN) -> Callable[[Base], bytes]:
    """A push of the commit ``make`` builds: main moved to it, or ``ref`` created (a harmless
    problem is taken, docs/security.md: main must not move under the other rows)."""

    def build(base: Base) -> bytes:
        body = make(base)
        old = base.commit if ref == MAIN else ZERO
        return push_body([(old, oid_of(1, body), ref)], pack_of([(1, body)]))

    return build


def _bad_tag(
    make: Callable[[Base], bytes], ref: bytes = b"refs/tags/v1"
) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        body = make(base)
        return push_body([(ZERO, oid_of(4, body), ref)], pack_of([(4, body)]))

    return build


def _commit_on(base: Base, tree: bytes | None = None) -> bytes:
    return commit_body(tree or base.tree, [base.commit], message=b"next\n")


def _pack_push(make_pack: Callable[[Base], bytes], new: Callable[[Base], bytes] | None = None):
    """A push of ``refs/heads/main`` to a new commit with the pack ``make_pack`` builds."""

    def build(base: Base) -> bytes:
        target = new(base) if new else oid_of(1, _commit_on(base))
        return push_body([(base.commit, target, MAIN)], make_pack(base))

    return build


def _good_pack(base: Base) -> bytes:
    return pack_of([(1, _commit_on(base))])


def _flip_last(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def _blob_delta_pack(make_delta: Callable[[bytes], bytes]) -> Callable[[Base], bytes]:
    """A base blob then a REF_DELTA on it (``make_delta`` gets the base body)."""

    def build(base: Base) -> bytes:
        body = b"base blob contents\n" * 4
        return pack([full_entry(3, body), ref_delta_entry(oid_of(3, body), make_delta(body))])

    return build


def _deep_trees(depth: int) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        objects: list[tuple[int, bytes]] = []
        inner = base.tree
        for _ in range(depth):
            body = tree_body([(b"40000", b"d", inner)])
            objects.append((2, body))
            inner = oid_of(2, body)
        commit = commit_body(inner, [base.commit])
        objects.append((1, commit))
        return push_body([(base.commit, oid_of(1, commit), MAIN)], pack_of(objects))

    return build


def _laughs(levels: int, width: int) -> Callable[[Base], bytes]:
    """Each tree names the one below ``width`` times: width**levels paths, levels objects."""

    def build(base: Base) -> bytes:
        objects: list[tuple[int, bytes]] = []
        inner = base.tree
        for _ in range(levels):
            names = sorted(b"d%04d" % i for i in range(width))
            body = tree_body([(b"40000", n, inner) for n in names])
            objects.append((2, body))
            inner = oid_of(2, body)
        commit = commit_body(inner, [base.commit])
        objects.append((1, commit))
        return push_body([(ZERO, oid_of(1, commit), b"refs/heads/laughs")], pack_of(objects))

    return build


def _delta_chain(length: int) -> Callable[[Base], bytes]:
    """A blob, then ``length`` OFS_DELTAs, each on the one before (one byte longer)."""

    def build(base: Base) -> bytes:
        body = b"chain base\n"
        entries = [full_entry(3, body)]
        offsets = [12]
        offset = 12 + len(entries[0])
        size = len(body)
        for _ in range(length):
            step = delta(size, size + 1, copy_op(0, size) + insert_op(b"+"))
            entry = ofs_delta_entry(offset - offsets[-1], step)
            offsets.append(offset)
            entries.append(entry)
            offset += len(entry)
            size += 1
        return pack(entries)

    return build


def _tag_of_tree(base: Base) -> bytes:
    """A tag that says it names a commit, naming a tree of the same pack."""
    tree = b"100644 q\0" + bytes.fromhex(base.blob.decode())
    tag = tag_body(oid_of(2, tree))
    return push_body([(ZERO, oid_of(4, tag), b"refs/tags/v1")], pack_of([(2, tree), (4, tag)]))


def _branch_to_tree(base: Base) -> bytes:
    """``refs/heads/main`` moved to a tree of the pack instead of a commit."""
    tree = b"100644 r\0" + bytes.fromhex(base.blob.decode())
    return push_body([(base.commit, oid_of(2, tree), MAIN)], pack_of([(2, tree)]))


def _parent_is_blob(base: Base) -> bytes:
    blob = b"p\n"
    commit = commit_body(base.tree, [oid_of(3, blob)])
    return push_body([(base.commit, oid_of(1, commit), MAIN)], pack_of([(3, blob), (1, commit)]))


def _gitmodules(content: bytes, mode: bytes = b"100644") -> Callable[[Base], bytes]:
    """A commit whose tree has a .gitmodules entry with ``content``."""

    def build(base: Base) -> bytes:
        if mode == b"40000":  # a tree of its own, in the pack
            inner = tree_body([(b"100644", b"f", base.blob)])
            tree = tree_body([(mode, b".gitmodules", oid_of(2, inner))])
            return _objects_for_tree(base, tree, [(2, inner)])
        tree = tree_body([(mode, b".gitmodules", oid_of(3, content))])
        return _objects_for_tree(base, tree, [(3, content)])

    return build


def _many_haves(count: int) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        lines = [pkt_line(b"command=fetch\n"), b"0001", pkt_line(b"want " + base.commit + b"\n")]
        lines += [pkt_line(b"have %040x\n" % i) for i in range(1, count + 1)]
        return b"".join(lines) + pkt_line(b"done\n") + FLUSH_PKT

    return build


def _fetch(*lines: bytes) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        body = [pkt_line(b"command=fetch\n"), b"0001"]
        body += [pkt_line(line.replace(b"BASE", base.commit) + b"\n") for line in lines]
        return b"".join(body) + pkt_line(b"done\n") + FLUSH_PKT

    return build


def _commands(*commands: tuple[bytes, bytes, bytes]) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        tokens = {b"BASE": base.commit, b"NEW": _new_main(base)}
        fixed = [(tokens.get(o, o), tokens.get(n, n), r) for o, n, r in commands]
        return push_body(fixed, _good_pack(base))

    return build


def _new_main(base: Base) -> bytes:
    return oid_of(1, _commit_on(base))


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    build: Callable[[Base], bytes]
    status: int
    expect: bytes
    """A substring of what the client sees (report lines or the plain-text reason)."""
    service: str = "receive"
    accepted_ref: bytes | None = None
    """For an input that is fine to take: the ref it creates (else refs must not move)."""
    path: str | None = None
    """A raw URL path (a hostile repository name) instead of the base repository's."""


def _c(
    name: str, what: str, build: Callable[[Base], bytes], status: int, expect: bytes, **kw: object
) -> Case:
    return Case(name, what, build, status, expect, **kw)  # type: ignore[arg-type]


UNPACK = b"unpack "
CASES = [
    # -- packs --------------------------------------------------------------------------------
    _c(
        "zero-length-pack",
        "commands that need a pack, and no pack",
        _pack_push(lambda b: b""),
        400,
        b"no pack",
    ),
    _c(
        "truncated-pack",
        "pack cut in the middle of its only entry",
        _pack_push(lambda b: _good_pack(b)[:30]),
        200,
        b"truncated",
    ),
    _c(
        "pack-header-only",
        "12-byte header, no entries, no trailer",
        _pack_push(lambda b: _good_pack(b)[:12]),
        200,
        b"truncated",
    ),
    _c(
        "bad-signature",
        "pack starts with PACX",
        _pack_push(lambda b: b"PACX" + _good_pack(b)[4:]),
        200,
        b"signature",
    ),
    _c(
        "bad-version",
        "pack version 4",
        _pack_push(lambda b: pack([full_entry(1, _commit_on(b))], version=4)),
        200,
        b"version",
    ),
    _c(
        "wrong-trailer",
        "last byte of the SHA-1 trailer flipped",
        _pack_push(lambda b: _flip_last(_good_pack(b))),
        200,
        b"trailer does not match",
    ),
    _c(
        "count-too-high",
        "header says 3 entries, pack has 1",
        _pack_push(lambda b: pack([full_entry(1, _commit_on(b))], count=3)),
        200,
        b"entries",
    ),
    _c(
        "count-too-low",
        "header says 1 entry, pack has 2",
        _pack_push(lambda b: pack([full_entry(3, b"x"), full_entry(1, _commit_on(b))], count=1)),
        200,
        b"stray bytes",
    ),
    _c(
        "type-code-5",
        "entry with the reserved type code 5",
        _pack_push(lambda b: pack([bytes([0x53]) + zlib.compress(b"abc")])),
        200,
        b"type",
    ),
    _c(
        "type-code-0",
        "entry with type code 0",
        _pack_push(lambda b: pack([bytes([0x03]) + zlib.compress(b"abc")])),
        200,
        b"type",
    ),
    _c(
        "not-zlib",
        "entry data that is not a zlib stream",
        _pack_push(lambda b: pack([encode_entry_header(3, 8) + b"\x00not zlib data"])),
        200,
        b"zlib",
    ),
    _c(
        "size-short",
        "entry inflates to fewer bytes than its header says",
        _pack_push(lambda b: pack([full_entry(1, _commit_on(b), size=500)])),
        200,
        b"inflates to",
    ),
    _c(
        "size-long",
        "entry inflates past its declared size",
        _pack_push(lambda b: pack([full_entry(1, _commit_on(b), size=10)])),
        200,
        b"past its declared",
    ),
    _c(
        "deflate-bomb",
        "blob declared 64 MiB, 64 KiB of zlib (1000:1)",
        _pack_push(lambda b: pack([full_entry(3, bytes(64 << 20))])),
        200,
        b"zlib bomb",
    ),
    _c(
        "oversized-object",
        "blob declared 3 GiB (object_bytes_max is 2 GiB)",
        _pack_push(lambda b: pack([encode_entry_header(3, 3 << 30) + zlib.compress(b"x" * 64)])),
        200,
        b"object_bytes_max",
    ),
    _c(
        "ofs-before-pack",
        "OFS_DELTA whose base offset is before the pack",
        _pack_push(lambda b: pack([ofs_delta_entry(1000, delta(1, 1, insert_op(b"x")))])),
        200,
        b"outside the pack",
    ),
    _c(
        "ofs-mid-entry",
        "OFS_DELTA pointing into the middle of an entry",
        _pack_push(
            lambda b: pack(
                [full_entry(3, b"x" * 200), ofs_delta_entry(5, delta(1, 1, insert_op(b"x")))]
            )
        ),
        200,
        b"not an entry",
    ),
    _c(
        "ref-delta-missing-base",
        "REF_DELTA to a base neither side has",
        _pack_push(lambda b: pack([ref_delta_entry(b"ab" * 20, delta(1, 1, insert_op(b"x")))])),
        200,
        b"ab" * 20,
    ),
    _c(
        "delta-cycle",
        "two REF_DELTAs, each the other's base",
        _pack_push(
            lambda b: pack(
                [
                    ref_delta_entry(b"cd" * 20, delta(1, 1, insert_op(b"x"))),
                    ref_delta_entry(b"ef" * 20, delta(1, 1, insert_op(b"y"))),
                ]
            )
        ),
        200,
        b"neither in the pack nor in the repository",
    ),
    _c(
        "delta-src-size",
        "delta's base size differs from the base",
        _pack_push(_blob_delta_pack(lambda body: delta(len(body) + 7, 1, insert_op(b"x")))),
        200,
        b"base",
    ),
    _c(
        "delta-result-size",
        "delta declares 100 result bytes, makes 1",
        _pack_push(_blob_delta_pack(lambda body: delta(len(body), 100, insert_op(b"x")))),
        200,
        b"delta",
    ),
    _c(
        "delta-copy-out-of-range",
        "delta copies past the end of its base",
        _pack_push(_blob_delta_pack(lambda body: delta(len(body), 16, copy_op(len(body) - 4, 16)))),
        200,
        b"delta",
    ),
    _c(
        "delta-opcode-0",
        "delta with the reserved opcode 0",
        _pack_push(
            _blob_delta_pack(lambda body: delta(len(body), 8, b"\x00" + insert_op(b"12345678")))
        ),
        200,
        b"delta",
    ),
    _c(
        "count-huge",
        "header claims 4,000,000,000 entries in a 200-byte pack",
        _pack_push(lambda b: pack([full_entry(1, _commit_on(b))], count=4_000_000_000)),
        200,
        b"pack_objects_max",
    ),
    _c(
        "count-no-room",
        "header claims 1,000 entries in a 200-byte pack",
        _pack_push(lambda b: pack([full_entry(1, _commit_on(b))], count=1000)),
        200,
        b"entries in room for",
    ),
    _c(
        "delta-chain-too-deep",
        "10,001 OFS_DELTAs, each on the one before (limit 10,000)",
        _pack_push(_delta_chain(10_001)),
        200,
        b"delta_chain_depth_max",
    ),
    _c(
        "duplicate-objects",
        "the same blob twice in one pack (index-pack --strict refuses it)",
        lambda b: push_body(
            [(ZERO, oid_of(1, _commit_on(b)), b"refs/heads/dup")],
            pack_of([(3, BLOB), (3, BLOB), (1, _commit_on(b))]),
        ),
        200,
        b"appears twice in the pack | ng refs/heads/dup unpacker error",
    ),
    # -- trees (fsck_tree) --------------------------------------------------------------------
    _c(
        "tree-unsorted",
        "tree entries out of git's order",
        _bad_tree([(b"100644", b"b"), (b"100644", b"a")]),
        200,
        b"treeNotSorted",
    ),
    _c(
        "tree-duplicate",
        "two entries with one name",
        _bad_tree([(b"100644", b"a"), (b"100644", b"a")]),
        200,
        b"duplicateEntries",
    ),
    _c(
        "tree-zero-padded-mode",
        "mode 0100644 (harmless: taken, with a warning)",
        _bad_tree([(b"0100644", b"a")], b"refs/heads/legacy/tree-zero-padded-mode"),
        200,
        b"ok refs/heads/legacy/tree-zero-padded-mode",
        accepted_ref=b"refs/heads/legacy/tree-zero-padded-mode",
    ),
    _c(
        "tree-bad-mode",
        "mode with a non-octal digit (10064x)",
        _bad_tree([(b"10064x", b"a")]),
        200,
        b"badTree",
    ),
    _c("tree-dotgit", "entry named .git", _bad_tree([(b"100644", b".git")]), 200, b"hasDotgit"),
    _c(
        "tree-dotgit-case", "entry named .GIT", _bad_tree([(b"100644", b".GIT")]), 200, b"hasDotgit"
    ),
    _c(
        "tree-dotgit-short",
        "entry named GIT~1 (NTFS short name)",
        _bad_tree([(b"100644", b"GIT~1")]),
        200,
        b"hasDotgit",
    ),
    _c(
        "tree-dotgit-trailing",
        "entry named '.git. .' (NTFS drops trailing dots and spaces)",
        _bad_tree([(b"100644", b".git. .")]),
        200,
        b"hasDotgit",
    ),
    _c(
        "tree-dotgit-ads",
        "entry named .git::$INDEX_ALLOCATION (NTFS stream)",
        _bad_tree([(b"40000", b".git::$INDEX_ALLOCATION")]),
        200,
        b"hasDotgit",
    ),
    _c(
        "tree-dotgit-hfs",
        "entry named .g\\u200cit (HFS+ ignores U+200C)",
        _bad_tree([(b"100644", ".g\u200cit".encode())]),
        200,
        b"hasDotgit",
    ),
    _c(
        "tree-dotgit-backslash",
        "entry named a\\\\.git (a path on Windows)",
        _bad_tree([(b"100644", b"a\\.git")]),
        200,
        b"hasDotgit",
    ),
    _c("tree-dotdot", "entry named ..", _bad_tree([(b"100644", b"..")]), 200, b"hasDotdot"),
    _c("tree-dot", "entry named .", _bad_tree([(b"100644", b".")]), 200, b"hasDot"),
    _c("tree-slash", "entry name with '/'", _bad_tree([(b"100644", b"a/b")]), 200, b"fullPathname"),
    _c(
        "tree-empty-name",
        "entry with an empty name",
        _raw_tree(b"100644 \0" + bytes(20)),
        200,
        b"badTree",
    ),
    _c(
        "tree-truncated",
        "entry cut inside its object id",
        _raw_tree(b"100644 a\0" + bytes(7)),
        200,
        b"badTree",
    ),
    _c(
        "tree-null-sha1",
        "entry naming the all-zero object id",
        _raw_tree(b"100644 a\0" + bytes(20)),
        200,
        b"nullSha1",
    ),
    _c(
        "tree-gitmodules-symlink",
        ".gitmodules as a symbolic link",
        _bad_tree([(b"120000", b".gitmodules")]),
        200,
        b"gitmodulesSymlink",
    ),
    _c(
        "tree-long-name",
        "entry name of 5000 bytes",
        _bad_tree([(b"100644", b"n" * 5000)]),
        200,
        b"largePathname",
    ),
    _c(
        "tree-too-deep",
        "trees nested 2100 deep (tree_depth_max is 2048)",
        _deep_trees(2100),
        200,
        b"tree_depth_max",
    ),
    _c(
        "tree-laughs",
        "10 trees, each naming the next 200 times (200**10 paths; taken)",
        _laughs(10, 200),
        200,
        b"ok refs/heads/laughs",
        accepted_ref=b"refs/heads/laughs",
    ),
    _c(
        "gitmodules-name-dotdot",
        ".gitmodules naming a submodule ../../modules/x (CVE-2018-11235)",
        _gitmodules(b'[submodule "../../modules/x"]\n\tpath = x\n\turl = https://e.com/x\n'),
        200,
        b"gitmodulesName",
    ),
    _c(
        "gitmodules-url-option",
        ".gitmodules url '--upload-pack=touch x' (CVE-2018-17456)",
        _gitmodules(b'[submodule "x"]\n\tpath = x\n\turl = --upload-pack=touch x\n'),
        200,
        b"gitmodulesUrl",
    ),
    _c(
        "gitmodules-path-option",
        ".gitmodules path '-x'",
        _gitmodules(b'[submodule "x"]\n\tpath = -x\n\turl = https://e.com/x\n'),
        200,
        b"gitmodulesPath",
    ),
    _c(
        "gitmodules-update-command",
        ".gitmodules update '!sh -c ...'",
        _gitmodules(b'[submodule "x"]\n\tpath = x\n\tupdate = !sh -c id\n'),
        200,
        b"gitmodulesUpdate",
    ),
    _c(
        "gitmodules-is-tree",
        ".gitmodules that is a tree",
        _gitmodules(b"", mode=b"40000"),
        200,
        b"gitmodulesBlob",
    ),
    # -- commits (fsck_commit, fsck_ident) ----------------------------------------------------
    _c(
        "commit-no-tree",
        "commit without a tree line",
        _bad_commit(lambda b: b"parent " + b.commit + b"\nauthor " + IDENT + b"\n\nm\n"),
        200,
        b"missingTree",
    ),
    _c(
        "commit-bad-tree",
        "tree line with 39 hex digits",
        _bad_commit(lambda b: b"tree " + b.tree[:39] + b"\nauthor x\n\nm\n"),
        200,
        b"badTreeSha1",
    ),
    _c(
        "commit-bad-parent",
        "parent line that is not an object id",
        _bad_commit(lambda b: commit_body(b.tree, [b"zz" * 20])),
        200,
        b"badParentSha1",
    ),
    _c(
        "commit-no-author",
        "commit without an author line (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], author=None),
            b"refs/heads/legacy/commit-no-author",
        ),
        200,
        b"ok refs/heads/legacy/commit-no-author",
        accepted_ref=b"refs/heads/legacy/commit-no-author",
    ),
    _c(
        "commit-two-authors",
        "two author lines (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], author=IDENT + b"\nauthor " + IDENT),
            b"refs/heads/legacy/commit-two-authors",
        ),
        200,
        b"ok refs/heads/legacy/commit-two-authors",
        accepted_ref=b"refs/heads/legacy/commit-two-authors",
    ),
    _c(
        "commit-no-committer",
        "commit without a committer line (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], committer=None),
            b"refs/heads/legacy/commit-no-committer",
        ),
        200,
        b"ok refs/heads/legacy/commit-no-committer",
        accepted_ref=b"refs/heads/legacy/commit-no-committer",
    ),
    _c(
        "commit-bad-email",
        "author email without '>' (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], author=b"A <a@example.com 1 +0000"),
            b"refs/heads/legacy/commit-bad-email",
        ),
        200,
        b"ok refs/heads/legacy/commit-bad-email",
        accepted_ref=b"refs/heads/legacy/commit-bad-email",
    ),
    _c(
        "commit-no-name",
        "author line starting with '<' (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], author=b"<a@example.com> 1 +0000"),
            b"refs/heads/legacy/commit-no-name",
        ),
        200,
        b"ok refs/heads/legacy/commit-no-name",
        accepted_ref=b"refs/heads/legacy/commit-no-name",
    ),
    _c(
        "commit-bad-timezone",
        "time zone +02 (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], author=b"A <a@b> 1 +02"),
            b"refs/heads/legacy/commit-bad-timezone",
        ),
        200,
        b"ok refs/heads/legacy/commit-bad-timezone",
        accepted_ref=b"refs/heads/legacy/commit-bad-timezone",
    ),
    _c(
        "commit-zero-padded-date",
        "date 0001700000000 (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], author=b"A <a@b> 01 +0000"),
            b"refs/heads/legacy/commit-zero-padded-date",
        ),
        200,
        b"ok refs/heads/legacy/commit-zero-padded-date",
        accepted_ref=b"refs/heads/legacy/commit-zero-padded-date",
    ),
    _c(
        "commit-date-overflow",
        "date of 30 digits (harmless: taken, with a warning)",
        _bad_commit(
            lambda b: commit_body(b.tree, [b.commit], author=b"A <a@b> " + b"9" * 30 + b" +0000"),
            b"refs/heads/legacy/commit-date-overflow",
        ),
        200,
        b"ok refs/heads/legacy/commit-date-overflow",
        accepted_ref=b"refs/heads/legacy/commit-date-overflow",
    ),
    _c(
        "commit-nul-in-header",
        "NUL byte inside the author line",
        _bad_commit(lambda b: commit_body(b.tree, [b.commit], author=b"A\0 <a@b> 1 +0000")),
        200,
        b"nulInHeader",
    ),
    _c(
        "commit-tree-is-blob",
        "commit whose tree line names a blob",
        lambda b: push_body(
            [(b.commit, oid_of(1, commit_body(b.blob, [b.commit])), MAIN)],
            pack_of([(1, commit_body(b.blob, [b.commit]))]),
        ),
        200,
        b"is a blob, expected a tree",
    ),
    _c(
        "commit-parent-is-blob",
        "commit whose parent line names a blob of the pack",
        _parent_is_blob,
        200,
        b"is a blob, expected a commit",
    ),
    _c(
        "commit-missing-tree",
        "commit whose tree is in neither the pack nor the repository",
        lambda b: push_body(
            [(b.commit, oid_of(1, commit_body(b"12" * 20, [b.commit])), MAIN)],
            pack_of([(1, commit_body(b"12" * 20, [b.commit]))]),
        ),
        200,
        b"missing necessary objects",
    ),
    _c(
        "ref-to-absent-object",
        "ref set to an object the push does not bring",
        _commands((b"BASE", b"34" * 20, MAIN)),
        200,
        b"missing necessary objects",
    ),
    # -- tags (fsck_tag) ----------------------------------------------------------------------
    _c(
        "tag-no-object",
        "tag without an object line",
        _bad_tag(lambda b: b"type commit\ntag v1\ntagger " + IDENT + b"\n\n" + b"m" * 40 + b"\n"),
        200,
        b"missingObject",
    ),
    _c(
        "tag-bad-type",
        "tag of type 'commot'",
        _bad_tag(lambda b: tag_body(b.commit, b"commot")),
        200,
        b"badType",
    ),
    _c(
        "tag-no-tag-line",
        "tag without a tag line",
        _bad_tag(lambda b: b"object " + b.commit + b"\ntype commit\ntagger " + IDENT + b"\n\nm\n"),
        200,
        b"missingTagEntry",
    ),
    _c(
        "tag-type-mismatch",
        "tag says 'commit' and names a tree of the pack",
        _tag_of_tree,
        200,
        b"is a tree, expected a commit",
    ),
    _c(
        "branch-names-tree",
        "refs/heads/main set to a tree of the pack",
        _branch_to_tree,
        200,
        b"must name a commit",
    ),
    _c(
        "tag-bad-tagger",
        "tagger without an email (harmless: taken, with a warning)",
        _bad_tag(
            lambda b: tag_body(b.commit).replace(IDENT, b"Nobody 1 +0000"),
            b"refs/tags/legacy-tag-bad-tagger",
        ),
        200,
        b"ok refs/tags/legacy-tag-bad-tagger",
        accepted_ref=b"refs/tags/legacy-tag-bad-tagger",
    ),
    # -- ref names and commands ---------------------------------------------------------------
    _c(
        "ref-dotdot",
        "ref name refs/heads/a..b",
        _commands((b"BASE", b"NEW", b"refs/heads/a..b")),
        200,
        b"unpack ok | ng refs/heads/a..b funny refname",
    ),
    _c(
        "ref-control-byte",
        "ref name with byte 0x01",
        _commands((ZERO, b"NEW", b"refs/heads/a\x01b")),
        200,
        b"ng refs/heads/a\x01b funny refname",
    ),
    _c(
        "ref-too-long",
        "ref name of 5000 bytes (ref_name_bytes_max is 4096)",
        _commands((ZERO, b"NEW", b"refs/heads/" + b"r" * 5000)),
        200,
        b"r funny refname",
    ),
    _c(
        "ref-outside-refs",
        "ref name HEAD/x (not under refs/)",
        _commands((ZERO, b"NEW", b"HEAD/x")),
        200,
        b"ng HEAD/x funny refname",
    ),
    _c(
        "ref-lock-suffix",
        "ref name ending in .lock",
        _commands((ZERO, b"NEW", b"refs/heads/x.lock")),
        200,
        b"ng refs/heads/x.lock funny refname",
    ),
    _c(
        "ref-mixed",
        "one valid ref and refs/heads/a..b in one push (the valid one lands)",
        _commands((ZERO, b"NEW", b"refs/heads/mixed"), (ZERO, b"NEW", b"refs/heads/a..b")),
        200,
        b"unpack ok | ok refs/heads/mixed | ng refs/heads/a..b funny refname",
        accepted_ref=b"refs/heads/mixed",
    ),
    _c(
        "ref-mixed-atomic",
        "the same, with the atomic capability (nothing lands)",
        lambda b: push_body(
            [(ZERO, _new_main(b), b"refs/heads/atomic"), (ZERO, _new_main(b), b"refs/heads/a..b")],
            _good_pack(b),
            caps=b"report-status atomic",
        ),
        200,
        b"ng refs/heads/atomic atomic push failure | ng refs/heads/a..b funny refname",
    ),
    _c(
        "old-oid-not-hex",
        "old-oid of 40 'z'",
        _commands((b"z" * 40, b"NEW", MAIN)),
        400,
        b"old-oid",
    ),
    _c(
        "stale-old-oid",
        "old-oid that is not the ref's value",
        _commands((b"56" * 20, b"NEW", MAIN)),
        200,
        b"ng refs/heads/main",
    ),
    _c(
        "too-many-commands",
        "100,001 commands (protocol_push_commands_max is 100,000)",
        lambda b: push_body([(ZERO, b.commit, b"refs/heads/m%06d" % i) for i in range(100_001)]),
        413,
        b"protocol_push_commands_max",
    ),
    _c(
        "pkt-length-garbage",
        "pkt-line length 'zzzz'",
        lambda b: b"zzzz" + b"x" * 60,
        400,
        b"pkt-line",
    ),
    _c(
        "pkt-length-short",
        "pkt-line length 0002 (reserved)",
        lambda b: b"0002" + FLUSH_PKT,
        400,
        b"response-end",
    ),
    _c(
        "pkt-truncated",
        "pkt-line says 0100, body ends after 10 bytes",
        lambda b: b"0100" + b"x" * 10,
        400,
        b"pkt-line",
    ),
    _c(
        "push-cert",
        "signed push (push-cert)",
        lambda b: pkt_line(b"push-cert\0report-status\n") + FLUSH_PKT,
        400,
        b"push-cert",
    ),
    # -- fetch (upload-pack, protocol v2) ------------------------------------------------------
    _c(
        "want-not-hex",
        "want of 40 'g'",
        _fetch(b"want " + b"g" * 40),
        400,
        b"want",
        service="upload",
    ),
    _c(
        "want-unknown",
        "want of an object the repository lacks",
        _fetch(b"want " + b"78" * 20),
        200,
        b"ERR upload-pack: not our ref " + b"78" * 20,
        service="upload",
    ),
    _c(
        "have-short",
        "have of 39 hex digits",
        _fetch(b"want BASE", b"have " + b"a" * 39),
        400,
        b"have",
        service="upload",
    ),
    _c(
        "haves-100001",
        "100,001 haves (protocol_haves_max is 100,000)",
        _many_haves(100_001),
        413,
        b"protocol_haves_max",
        service="upload",
    ),
    _c(
        "fetch-pkt-garbage",
        "upload-pack body with length 'zzzz'",
        lambda b: b"zzzz",
        400,
        b"pkt-line",
        service="upload",
    ),
    _c(
        "fetch-deepen-garbage",
        "deepen with a non-number",
        _fetch(b"want BASE", b"deepen lots"),
        400,
        b"deepen",
        service="upload",
    ),
    _c(
        "fetch-v0-want-not-hex",
        "protocol v0 want of 40 'g'",
        lambda b: (
            pkt_line(b"want " + b"g" * 40 + b" multi_ack\n") + FLUSH_PKT + pkt_line(b"done\n")
        ),
        400,
        b"want",
        service="upload-v0",
    ),
    _c(
        "push-shallow-not-hex",
        "push with a shallow line that is not an object id",
        lambda b: (
            pkt_line(b"shallow " + b"q" * 40 + b"\n")
            + push_body([(b.commit, _new_main(b), MAIN)], _good_pack(b))
        ),
        400,
        b"shallow",
    ),
    _c(
        "duplicate-ref-command",
        "one push updates refs/heads/main twice",
        _commands((b"BASE", b"NEW", MAIN), (b"BASE", b"NEW", MAIN)),
        200,
        b"ng refs/heads/main",
    ),
    # -- repository names in the URL (DESIGN "Repository names") -------------------------------
    _c(
        "repo-dotdot",
        "repository path a/../hostile/base",
        lambda b: push_body([(ZERO, _new_main(b), b"refs/heads/x")], _good_pack(b)),
        400,
        b"invalid repository name",
        path="/a/../hostile/base.git/git-receive-pack",
    ),
    _c(
        "repo-encoded-dotdot",
        "repository path %2e%2e/x (percent-encoded '..')",
        lambda b: push_body([(ZERO, _new_main(b), b"refs/heads/x")], _good_pack(b)),
        400,
        b"invalid repository name",
        path="/%2e%2e/x.git/git-receive-pack",
    ),
    _c(
        "repo-too-long",
        "repository name of 300 bytes",
        lambda b: push_body([(ZERO, _new_main(b), b"refs/heads/x")], _good_pack(b)),
        400,
        b"longer than 256",
        path="/" + "n" * 300 + ".git/git-receive-pack",
    ),
    _c(
        "repo-bad-char",
        "repository name with '~'",
        lambda b: push_body([(ZERO, _new_main(b), b"refs/heads/x")], _good_pack(b)),
        400,
        b"invalid repository name",
        path="/a~b.git/git-receive-pack",
    ),
    _c(
        "repo-double-git",
        "repository path x.git.git (name would end in .git)",
        lambda b: push_body([(ZERO, _new_main(b), b"refs/heads/x")], _good_pack(b)),
        400,
        b".git",
        path="/x.git.git/git-receive-pack",
    ),
]


@pytest.fixture(scope="module")
def client(enroute_url: str) -> Client:
    return Client(enroute_url)


@pytest.fixture(scope="module")
def base(client: Client) -> Base:
    blob_oid = oid_of(3, BLOB)
    tree = tree_body([(b"100644", b"README", blob_oid)])
    commit = commit_body(oid_of(2, tree))
    reply = client.push(
        BASE_REPO, [(ZERO, oid_of(1, commit), MAIN)], pack_of([(3, BLOB), (2, tree), (1, commit)])
    )
    assert reply.status == 200 and b"ok refs/heads/main" in reply.body, reply
    return Base(blob_oid, oid_of(2, tree), oid_of(1, commit))


def _send(client: Client, case: Case, base: Base) -> Reply:
    body = case.build(base)
    if case.path is not None:
        kind = "upload" if case.service == "upload" else "receive"
        headers = {"Content-Type": f"application/x-git-{kind}-pack-request"}
        return client.request("POST", case.path, body, headers)
    if case.service == "upload-v0":
        return client.request(
            "POST",
            f"/{BASE_REPO}.git/git-upload-pack",
            body,
            {"Content-Type": "application/x-git-upload-pack-request"},
        )
    if case.service == "upload":
        return client.upload_pack_v2(BASE_REPO, body)
    return client.receive_pack(BASE_REPO, body)


def _still_serves(client: Client, tag: str) -> None:
    """A normal push of a fresh commit to another repository succeeds."""
    blob = b"alive " + tag.encode() + b"\n"
    tree = tree_body([(b"100644", b"f", oid_of(3, blob))])
    commit = commit_body(oid_of(2, tree))
    ref = b"refs/heads/" + tag.encode()
    reply = client.push(
        ALIVE_REPO, [(ZERO, oid_of(1, commit), ref)], pack_of([(3, blob), (2, tree), (1, commit)])
    )
    assert reply.status == 200 and b"ok " + ref in reply.body, reply
    assert client.refs(ALIVE_REPO)[ref] == oid_of(1, commit)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(client: Client, base: Base, case: Case) -> None:
    before = client.refs(BASE_REPO)
    reply = _send(client, case, base)
    seen = b" | ".join(report_lines(reply)) if reply.status == 200 else reply.body[:400]
    if os.environ.get("HOSTILE_PRINT"):
        print(f"\nROW {case.name} :: {reply.status} :: {seen.decode('utf-8', 'replace')}")
    # A refusal (the table's 4xx) reaches git in the answer: a 200 holding one ERR
    # packet, which git shows as "remote error: <reason>" (issue 23, item 4)
    lines = report_lines(reply) if reply.status == 200 else []
    in_band = len(lines) == 1 and lines[0].startswith(b"ERR ")
    assert (case.status if in_band and 400 <= case.status < 500 else reply.status) == case.status, (
        reply.status,
        seen,
    )
    assert case.expect in seen, seen
    after = client.refs(BASE_REPO)
    if case.accepted_ref is None:
        assert after == before
        if reply.status == 200 and case.service == "receive":
            lines = report_lines(reply)
            assert not any(line.startswith(b"ok ") for line in lines), lines
    else:
        assert case.accepted_ref in after
        taken = (case.accepted_ref, case.accepted_ref + b"^{}")  # a tag is advertised peeled too
        assert {k: v for k, v in after.items() if k not in taken} == before
    _still_serves(client, case.name)


def test_at_least_40_rows() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 40
