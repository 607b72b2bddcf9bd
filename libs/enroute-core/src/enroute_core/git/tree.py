"""Tree objects: parse and serialize byte for byte, Git's order, fsck's checks.

Layout (git ``tree-walk.c``, ``decode_tree_entry``)::

    tree   = entry*
    entry  = mode SP name NUL oid
    mode   = octal digits, at least one, no fixed width (git writes 40000, not 040000)
    name   = one or more bytes, no NUL
    oid    = 20 raw bytes

Git writes entries sorted by name, a directory comparing as if its name
ended in ``/`` (``tree.c``, ``base_name_compare``). Old tools left trees
unsorted, with zero-padded modes (``040000``) or group-writable files
(``100664``); such trees still parse, and each entry keeps its mode bytes as
read, so :meth:`Tree.serialize` returns the parsed bytes exactly. What git
fsck would say about a tree is :func:`check_tree`'s job, not the parser's.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import OID_BYTES, ZERO_OID, ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.object_type import ObjectType

MODE_TREE = 0o040000
MODE_FILE = 0o100644
MODE_EXECUTABLE = 0o100755
MODE_SYMLINK = 0o120000
MODE_GITLINK = 0o160000
MODE_FILE_GROUP_WRITABLE = 0o100664  # legacy; fsck --strict calls it bad

_S_IFMT = 0o170000
_S_IFREG = 0o100000
STANDARD_MODES = frozenset({MODE_TREE, MODE_FILE, MODE_EXECUTABLE, MODE_SYMLINK, MODE_GITLINK})

_OCTAL = b"01234567"
_KNOWN_MODE_BYTES = {b"%o" % m: m for m in (*STANDARD_MODES, MODE_FILE_GROUP_WRITABLE)}


def is_tree_mode(mode: int) -> bool:
    """S_ISDIR: what makes git sort an entry as a directory."""
    return mode & _S_IFMT == MODE_TREE


def is_gitlink_mode(mode: int) -> bool:
    """S_ISGITLINK of git's ``canon_mode``: every mode that is not a file, a symlink or a
    directory (160000, and 160644 or any other an old or odd tool wrote).

    git's tree walks read modes through ``canon_mode`` (tree-walk.c ``decode_tree_entry``):
    such an entry is a gitlink, never followed (list-objects.c ``process_tree``, fsck.c
    ``fsck_walk_tree``, index-pack's type checks), and its object need not exist.
    """
    return mode & _S_IFMT not in (_S_IFREG, MODE_SYMLINK, MODE_TREE)


def canonical_mode(mode: int) -> int:
    """git's ``canon_mode``: the mode git acts on for any mode a tree may hold."""
    kind = mode & _S_IFMT
    if kind == _S_IFREG:
        return MODE_EXECUTABLE if mode & 0o100 else MODE_FILE
    if kind in (MODE_SYMLINK, MODE_TREE):
        return kind
    return MODE_GITLINK


def _mode_value(raw: bytes) -> int | None:
    known = _KNOWN_MODE_BYTES.get(raw)
    if known is not None:
        return known
    if not raw or raw.translate(None, _OCTAL):
        return None
    return int(raw, 8)


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One entry. ``mode_bytes`` is the mode as written; empty means git's form of ``mode``."""

    mode: int
    name: bytes
    oid: ObjectId
    mode_bytes: bytes = b""

    def __post_init__(self) -> None:
        if not self.mode_bytes:
            assert self.mode >= 0, self.mode
            object.__setattr__(self, "mode_bytes", b"%o" % self.mode)
        else:
            assert _mode_value(self.mode_bytes) == self.mode, (self.mode_bytes, self.mode)
        assert len(self.oid) == OID_BYTES, self.oid
        assert b"\0" not in self.name, self.name

    @property
    def is_tree(self) -> bool:
        return is_tree_mode(self.mode)

    @property
    def is_gitlink(self) -> bool:
        """A submodule commit, not walked (:func:`is_gitlink_mode`)."""
        return is_gitlink_mode(self.mode)

    @property
    def sort_key(self) -> bytes:
        return tree_sort_key(self.name, self.is_tree)

    def encode(self) -> bytes:
        return self.mode_bytes + b" " + self.name + b"\0" + self.oid


def tree_sort_key(name: bytes, is_tree: bool) -> bytes:
    """The key git sorts tree entries by: a directory compares as ``name + b"/"``."""
    return name + b"/" if is_tree else name


class Order(enum.Enum):
    """How two neighbouring entries compare (fsck.c, ``verify_ordered``)."""

    SORTED = "sorted"
    UNSORTED = "unsorted"
    DUPLICATE = "duplicate"


def entry_order(first: TreeEntry, second: TreeEntry) -> Order:
    """Whether ``first`` may come right before ``second`` in a tree.

    Equal names are duplicates whatever their modes (git-write-tree once
    wrote a blob and a tree under one name).
    """
    a, b = first.name, second.name
    n = min(len(a), len(b))
    if a[:n] != b[:n]:
        return Order.SORTED if a[:n] < b[:n] else Order.UNSORTED
    c1 = a[n] if len(a) > n else 0
    c2 = b[n] if len(b) > n else 0
    if c1 == 0 and c2 == 0:
        return Order.DUPLICATE
    if c1 == 0 and first.is_tree:
        c1 = 0x2F
    if c2 == 0 and second.is_tree:
        c2 = 0x2F
    return Order.SORTED if c1 < c2 else Order.UNSORTED


def is_sorted(entries: Sequence[TreeEntry]) -> bool:
    """Strictly in git's tree order: sorted and no two entries with one name."""
    return all(
        entry_order(entries[i - 1], entries[i]) is Order.SORTED for i in range(1, len(entries))
    )


@dataclass(frozen=True, slots=True)
class Tree:
    """A tree as its entries in stored order (which may not be git's order)."""

    entries: tuple[TreeEntry, ...]

    kind: ClassVar[ObjectType] = ObjectType.TREE

    @classmethod
    def parse(cls, body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Tree:
        """Read every entry; refuse what git's ``decode_tree_entry`` refuses."""
        entries: list[TreeEntry] = []
        pos = 0
        end = len(body)
        entries_max = limits.tree_entries_max
        while pos < end:
            if len(entries) >= entries_max:
                raise LimitExceeded("tree_entries_max", len(entries) + 1, entries_max)
            space = body.find(b" ", pos)
            if space < 0:
                raise InvalidObject("tree entry is truncated in its mode", offset=pos)
            mode_bytes = body[pos:space]
            mode = _mode_value(mode_bytes)
            if mode is None:
                raise InvalidObject("tree entry has a malformed mode", offset=pos)
            nul = body.find(b"\0", space + 1)
            if nul < 0:
                raise InvalidObject("tree entry is truncated in its name", offset=pos)
            if nul == space + 1:
                raise InvalidObject("tree entry has an empty name", offset=pos)
            oid_end = nul + 1 + OID_BYTES
            if oid_end > end:
                raise InvalidObject("tree entry is truncated in its object id", offset=pos)
            name = body[space + 1 : nul]
            entries.append(TreeEntry(mode, name, ObjectId(body[nul + 1 : oid_end]), mode_bytes))
            pos = oid_end
        return cls(tuple(entries))

    @classmethod
    def build(cls, entries: Iterable[TreeEntry]) -> Tree:
        """A tree git would write: entries sorted in git's order, names unique."""
        ordered = sorted(entries, key=lambda e: e.sort_key)
        names = set()
        for e in ordered:
            if not e.name or e.name in names:
                raise InvalidObject("tree entry name is empty or repeated", name=e.name.hex())
            names.add(e.name)
        return cls(tuple(ordered))

    def serialize(self) -> bytes:
        return b"".join([e.encode() for e in self.entries])


class TreeProblem(enum.Enum):
    """What ``git fsck`` reports about a tree; the value is fsck's message id."""

    NULL_SHA1 = "nullSha1"
    FULL_PATHNAME = "fullPathname"
    EMPTY_NAME = "emptyName"
    HAS_DOT = "hasDot"
    HAS_DOTDOT = "hasDotdot"
    HAS_DOTGIT = "hasDotgit"
    ZERO_PADDED_FILEMODE = "zeroPaddedFilemode"
    BAD_FILEMODE = "badFilemode"
    DUPLICATE_ENTRIES = "duplicateEntries"
    TREE_NOT_SORTED = "treeNotSorted"

    @property
    def is_error(self) -> bool:
        """fsck's default severity: errors fail a push, the rest are warnings."""
        return self in (TreeProblem.DUPLICATE_ENTRIES, TreeProblem.TREE_NOT_SORTED)


def check_tree(tree: Tree, *, strict: bool = False) -> tuple[TreeProblem, ...]:
    """The problems git fsck (``fsck.c``, ``fsck_tree``) would find, in its order.

    ``strict`` is ``fsck --strict``: mode 100664 then counts as bad too.
    Duplicates are found anywhere in the tree, not only where fsck's scan of
    a sorted tree finds them, so an unsorted tree cannot hide one.
    """
    found: set[TreeProblem] = set()
    names: set[bytes] = set()
    prev: TreeEntry | None = None
    for e in tree.entries:
        name = e.name
        if e.oid == ZERO_OID:
            found.add(TreeProblem.NULL_SHA1)
        if b"/" in name:
            found.add(TreeProblem.FULL_PATHNAME)
        if not name:
            found.add(TreeProblem.EMPTY_NAME)
        if name == b".":
            found.add(TreeProblem.HAS_DOT)
        if name == b"..":
            found.add(TreeProblem.HAS_DOTDOT)
        if is_dotgit_name(name):
            found.add(TreeProblem.HAS_DOTGIT)
        if e.mode_bytes.startswith(b"0"):
            found.add(TreeProblem.ZERO_PADDED_FILEMODE)
        if e.mode not in STANDARD_MODES and (strict or e.mode != MODE_FILE_GROUP_WRITABLE):
            found.add(TreeProblem.BAD_FILEMODE)
        if name in names:
            found.add(TreeProblem.DUPLICATE_ENTRIES)
        names.add(name)
        if prev is not None and entry_order(prev, e) is Order.UNSORTED:
            found.add(TreeProblem.TREE_NOT_SORTED)
        prev = e
    return tuple(p for p in TreeProblem if p in found)


# Code points HFS+ ignores in names (utf8.c, next_hfs_char).
_HFS_IGNORED = frozenset(
    [0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)


def _hfs_code_points(name: bytes) -> Iterator[int]:
    """Code points as HFS+ compares them; 0 for the end and from the first bad byte on."""
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = name[: exc.start].decode("utf-8")
    for ch in text:
        c = ord(ch)
        if c in (0xFFFE, 0xFFFF):  # git's decoder refuses these
            break
        if c not in _HFS_IGNORED:
            yield c
    yield from itertools.repeat(0)


def is_hfs_dotgit(name: bytes) -> bool:
    """A name HFS+ treats as ``.git`` (utf8.c, ``is_hfs_dotgit``)."""
    chars = _hfs_code_points(name)
    if next(chars) != 0x2E:
        return False
    for want in b"git":
        c = next(chars)
        if c > 127 or chr(c).lower() != chr(want):
            return False
    c = next(chars)
    return c in (0, 0x2F)


def is_ntfs_dotgit(name: bytes) -> bool:
    """A name NTFS treats as ``.git`` (path.c, ``is_ntfs_dotgit``): also ``git~1``,
    trailing dots and spaces, and alternate data streams (``.git::$INDEX_ALLOCATION``).
    """
    if name[:1] == b".":
        if name[1:4].lower() != b"git":
            return False
        rest = name[4:]
    elif name[:3].lower() == b"git" and name[3:5] == b"~1":
        rest = name[5:]
    else:
        return False
    for c in rest:
        if c in b"\\/:":
            return True
        if c not in b". ":
            return False
    return True


def is_dotgit_name(name: bytes) -> bool:
    """Would checking out ``name`` write into ``.git`` on some filesystem (fsck's hasDotgit)?"""
    if is_hfs_dotgit(name) or is_ntfs_dotgit(name):
        return True
    parts = name.split(b"\\")
    return any(is_ntfs_dotgit(p) for p in parts[1:])
