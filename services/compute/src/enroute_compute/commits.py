"""API commits: a change set applied as an overlay on a parent tree, then a commit object.

DESIGN "API commits (borrowed from Graft)" and seed 003, "The index is an
overlay on HEAD": an entry with content adds or replaces a path, an entry
without content deletes it, a path not named is inherited. Paths are
normalized UTF-8 relative paths (seed 003, "A repository path is normalized
UTF-8 relative to the worktree"); empty paths, ``.``, ``..``, absolute paths
and any path through ``.git`` are refused with :class:`InvalidPath`.

Everything here is pure: objects are read through an :data:`ObjectReader`
(the view's ``read``) and the new objects are returned, never stored. The
host writes them as a pack and ingests it like a push, so they land in an
inline or stored layer before the branch moves ("Objects are written before
the ref moves").

Rules of the overlay, each decided here:

1. Unchanged subtrees keep their object id; only trees on a named path are read.
2. A file named where the parent has a directory replaces the directory, and a
   path under a parent file replaces the file with a directory (git's
   ``update-index --replace``); within one change set a path that is both a
   file and a directory, or is named twice, is refused.
3. Deleting a path removes the entry there, file or directory; deleting a path
   that is absent changes nothing. A directory left empty disappears; the root
   may become the empty tree.
4. Without a mode, a replaced file keeps its mode in the parent (100644,
   100755 or 120000); anything else gets 100644.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from enroute_core.base.errors import CorruptData, InvalidArgument, InvalidPath
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.git.commit import Commit, Identity
from enroute_core.git.fsck import FsckWarning
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.packwrite import write_pack
from enroute_core.git.tree import (
    MODE_EXECUTABLE,
    MODE_FILE,
    MODE_SYMLINK,
    MODE_TREE,
    Tree,
    TreeEntry,
    canonical_mode,
    is_dotgit_name,
)

FILE_MODES = frozenset({MODE_FILE, MODE_EXECUTABLE, MODE_SYMLINK})
CHANGES_MAX = 100_000
"""Entries in one change set."""
PATH_BYTES_MAX = 4096
"""Bytes of one path (PATH_MAX of most systems)."""
PATH_DEPTH_MAX = 256
"""Segments of one path; bounds the recursion over directories."""
TZ_OFFSET_MINUTES_MAX = 24 * 60

ObjectReader = Callable[[ObjectId], "tuple[ObjectType, bytes] | None"]
"""An object's type and body by id, None when absent (``View.read``)."""


@dataclass(frozen=True, slots=True)
class FileChange:
    """One overlay entry: ``content`` None deletes ``path``."""

    path: bytes
    content: bytes | None
    mode: int | None = None


@dataclass(frozen=True, slots=True)
class Signature:
    """A commit identity; ``time_us`` None takes the compute's clock."""

    name: bytes
    email: bytes
    time_us: int | None = None
    tz_offset_minutes: int = 0


@dataclass(frozen=True, slots=True)
class CommitRequest:
    repo: str
    branch: bytes
    expected_oid: ObjectId | None
    message: bytes
    author: Signature
    committer: Signature | None
    changes: tuple[FileChange, ...]


@dataclass(frozen=True, slots=True)
class BuiltCommit:
    """The new commit and every object it adds, in pack order (blobs, trees, the commit)."""

    oid: ObjectId
    tree: ObjectId
    objects: tuple[tuple[ObjectType, bytes], ...]
    warnings: tuple[FsckWarning, ...] = ()
    """Harmless fsck findings on ``objects``, known once they are ingested (the caller sees
    them, as a pusher does)."""

    def pack(self) -> bytes:
        """The objects as one pack, ingested like a push."""
        return write_pack((int(t), body) for t, body in self.objects)


# -- paths -------------------------------------------------------------------------------------


def _shown(path: bytes) -> str:
    return path[:PATH_BYTES_MAX].decode("utf-8", "replace")


def split_path(path: bytes) -> tuple[bytes, ...]:
    """The segments of a normalized relative path; :class:`InvalidPath` names anything else."""
    shown = _shown(path)

    def refuse(why: str) -> InvalidPath:
        return InvalidPath(f"path {shown!r} {why}", path=shown, reason=why)

    if len(path) > PATH_BYTES_MAX:
        raise refuse(f"is longer than {PATH_BYTES_MAX} bytes")
    try:
        path.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse("is not UTF-8") from None
    if not path:
        raise refuse("is empty")
    if path.startswith(b"/"):
        raise refuse("is absolute")
    if b"\0" in path:
        raise refuse("contains a NUL byte")
    segments = tuple(path.split(b"/"))
    if len(segments) > PATH_DEPTH_MAX:
        raise refuse(f"has more than {PATH_DEPTH_MAX} segments")
    for segment in segments:
        if not segment:
            raise refuse("is not normalized (an empty segment)")
        if segment in (b".", b".."):
            raise refuse(f"has a {segment.decode()!r} segment")
        if is_dotgit_name(segment):
            raise refuse("goes through .git")
    return segments


# -- the overlay -------------------------------------------------------------------------------

_Node = dict[bytes, "FileChange | _Node"]


def _trie(changes: Sequence[FileChange]) -> _Node:
    """The change set as nested directories; refuses repeats and file/directory clashes."""
    check_limit("commit_changes_max", len(changes), CHANGES_MAX)
    root: _Node = {}
    for change in changes:
        segments = split_path(change.path)
        if change.mode is not None and change.mode not in FILE_MODES:
            raise InvalidArgument(
                f"mode {change.mode:o} of {_shown(change.path)!r} is not 100644, 100755 or 120000",
                path=_shown(change.path),
                field="mode",
            )
        node = root
        for segment in segments[:-1]:
            child = node.setdefault(segment, {})
            if isinstance(child, FileChange):
                raise _clash(change.path)
            node = child
        if segments[-1] in node:
            raise _clash(change.path)
        node[segments[-1]] = change
    return root


def _clash(path: bytes) -> InvalidPath:
    shown = _shown(path)
    return InvalidPath(
        f"path {shown!r} is named twice, or as both a file and a directory",
        path=shown,
        reason="conflicting change",
    )


class _Overlay:
    def __init__(self, read: ObjectReader, limits: Limits) -> None:
        self.read = read
        self.limits = limits
        self.blobs: dict[ObjectId, bytes] = {}
        self.trees: dict[ObjectId, bytes] = {}

    def entries(self, tree: ObjectId) -> dict[bytes, TreeEntry]:
        found = self.read(tree)
        if found is None or found[0] is not ObjectType.TREE:
            raise CorruptData(f"tree {tree.hex()} of the parent is not readable", section="view")
        # each entry with the mode git would write for it (canon_mode), as git's index
        # holds it: a tree rewritten here is in git's form even when an old tool wrote
        # the parent's (040000, 100664), as a commit from a git checkout would be
        return {
            e.name: TreeEntry(canonical_mode(e.mode), e.name, e.oid)
            for e in Tree.parse(found[1], limits=self.limits).entries
        }

    def build(self, tree: ObjectId | None, node: _Node) -> ObjectId | None:
        """The new tree for ``tree`` overlaid with ``node``; None when it ends up empty."""
        entries = self.entries(tree) if tree is not None else {}
        for name, sub in node.items():
            old = entries.get(name)
            if isinstance(sub, FileChange):
                if sub.content is None:
                    entries.pop(name, None)
                    continue
                oid = object_id(ObjectType.BLOB, sub.content)
                self.blobs.setdefault(oid, sub.content)
                entries[name] = TreeEntry(_mode_of(sub, old), name, oid)
                continue
            base = old.oid if old is not None and old.is_tree else None
            new = self.build(base, sub)
            if new is not None:
                entries[name] = TreeEntry(MODE_TREE, name, new)
            elif base is not None:
                del entries[name]
        if not entries:
            return None
        return self.add_tree(Tree.build(entries.values()))

    def add_tree(self, tree: Tree) -> ObjectId:
        body = tree.serialize()
        oid = object_id(ObjectType.TREE, body)
        self.trees.setdefault(oid, body)
        return oid


def _mode_of(change: FileChange, old: TreeEntry | None) -> int:
    if change.mode is not None:
        return change.mode
    if old is not None and old.mode in FILE_MODES:
        return old.mode
    return MODE_FILE


@dataclass(frozen=True, slots=True)
class OverlayResult:
    tree: ObjectId
    objects: tuple[tuple[ObjectType, bytes], ...]
    """New blobs, then new trees (children before parents)."""


def apply_changes(
    read: ObjectReader,
    base_tree: ObjectId | None,
    changes: Sequence[FileChange],
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> OverlayResult:
    """The tree of ``base_tree`` (None: empty) overlaid with ``changes`` (module rules 1-4)."""
    trie = _trie(changes)
    overlay = _Overlay(read, limits)
    tree = overlay.build(base_tree, trie)
    if tree is None:
        tree = overlay.add_tree(Tree(()))
    objects = [(ObjectType.BLOB, b) for b in overlay.blobs.values()]
    objects += [(ObjectType.TREE, b) for b in overlay.trees.values()]
    return OverlayResult(tree, tuple(objects))


# -- the commit --------------------------------------------------------------------------------


def identity(sig: Signature, now_us: int, field: str) -> Identity:
    """A Git identity; the time is whole seconds (floor), the zone ``+HHMM``."""
    name = sig.name.strip()
    for part, what in ((name, "name"), (sig.email, "email")):
        if any(c in part for c in (b"<", b">", b"\n", b"\0")):
            raise InvalidArgument(
                f"{field}.{what} contains '<', '>', a newline or NUL", field=f"{field}.{what}"
            )
    if not name:
        raise InvalidArgument(f"{field}.name is empty", field=f"{field}.name")
    time_us = now_us if sig.time_us is None else sig.time_us
    if time_us < 0:
        raise InvalidArgument(f"{field} time is before 1970", field=f"{field}.time_us")
    offset = sig.tz_offset_minutes
    if abs(offset) > TZ_OFFSET_MINUTES_MAX:
        raise InvalidArgument(
            f"{field} zone offset {offset} is out of range", field=f"{field}.tz_offset_minutes"
        )
    sign = b"-" if offset < 0 else b"+"
    tz = sign + b"%02d%02d" % divmod(abs(offset), 60)
    return Identity(name, sig.email, time_us // 1_000_000, tz)


def commit_message(message: bytes) -> bytes:
    """The message with a final newline, as ``git commit`` writes it."""
    if b"\0" in message:
        raise InvalidArgument("the commit message contains NUL", field="message")
    if message and not message.endswith(b"\n"):
        return message + b"\n"
    return message


def parent_tree(read: ObjectReader, parent: ObjectId) -> ObjectId:
    """The tree of the parent commit the branch points at."""
    found = read(parent)
    if found is None:
        raise CorruptData(f"commit {parent.hex()} of the branch is not readable", section="view")
    if found[0] is not ObjectType.COMMIT:
        raise InvalidArgument(f"the branch points at {parent.hex()}, which is not a commit")
    return Commit.parse(found[1]).tree


def build_commit(
    read: ObjectReader,
    request: CommitRequest,
    now_us: int,
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> BuiltCommit:
    """The commit of ``request`` on its expected parent, with every object it adds."""
    author = identity(request.author, now_us, "author")
    committer = identity(request.committer or request.author, now_us, "committer")
    message = commit_message(request.message)
    parent = request.expected_oid
    base = parent_tree(read, parent) if parent is not None else None
    overlay = apply_changes(read, base, request.changes, limits=limits)
    commit = Commit.create(
        tree=overlay.tree,
        parents=(parent,) if parent is not None else (),
        author=author,
        committer=committer,
        message=message,
    )
    body = commit.serialize()
    oid = object_id(ObjectType.COMMIT, body)
    return BuiltCommit(oid, overlay.tree, (*overlay.objects, (ObjectType.COMMIT, body)))
