"""Commit segments: the objects a commit introduces (DESIGN "Layers", seed 004 "Layers").

The segment of commit C is the set of objects reachable from C that are not
reachable from its parents; DESIGN allows a superset that adds moved paths.
It is found without walking whole trees: C's root tree is diffed against
every parent's root tree, path by path.

1. C itself is a member. Its root tree is a member unless a parent has the same root tree.
2. An entry of a tree of C is skipped when some parent has the same object id at
   the same path: it is reachable from that parent, so the skip is exact. A
   skipped subtree is not read at all.
3. Any other entry is a member; a subtree is then diffed against the parents'
   subtrees at that path (those that are trees).
4. Gitlinks (mode 160000) name commits of other repositories and are not followed,
   as ``git rev-list --objects`` does not follow them.

What is added beyond the exact set: an object that a parent reaches only at
another path (a move, a copy, an identical file elsewhere). Nothing is
missed: an object not at the same path in any parent is always a member.
Rule 2 compares object ids only, not modes: a mode change keeps the object.

5. Types, for the caller's checks (index-pack's ``check_object``: every object is
   named as the type it is): ``visit`` is called for each member as it is first
   named, and again where an entry names a member, or the object the parent names
   at the same path (rule 2), as another type (a tree or a blob). An object has one
   type, so a valid history never has such a repeat; the caller refuses one. The
   members stay as above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from enroute_core.base.ids import ObjectId
from enroute_core.git.tree import TreeEntry

ReadTree = Callable[[ObjectId], Sequence[TreeEntry]]
"""The entries of a tree (from the pack or the snapshot)."""

_UNNAMED = object()

Visit = Callable[[ObjectId, bool, ObjectId], None]
"""Called once per member below the commit: (oid, is a tree, the tree or commit naming it);
again where it, or an object rule 2 skips, is named as another type (rule 5)."""


def commit_segment(
    commit: ObjectId,
    tree: ObjectId,
    parent_trees: Sequence[ObjectId],
    read_tree: ReadTree,
    visit: Visit,
) -> list[ObjectId]:
    """The members of ``commit``'s segment in walk order (preorder, tree order), no repeats.

    Memory: the parsed entries of one tree and its parents' trees at a time,
    plus the stack of subtrees still to diff.
    """
    members: dict[ObjectId, bool | None] = {commit: None}  # first named as a tree, a blob
    if tree in parent_trees:
        return list(members)
    members[tree] = True
    visit(tree, True, commit)
    first = (tree, tuple(dict.fromkeys(parent_trees)))
    stack = [first]
    diffed = {first}  # a subtree at two paths with the same parents is diffed once
    while stack:
        current, parents = stack.pop()
        parent_maps = [{e.name: e for e in read_tree(p)} for p in parents]
        subtrees: list[tuple[ObjectId, tuple[ObjectId, ...]]] = []
        for entry in read_tree(current):
            if entry.is_gitlink:
                continue
            name, oid = entry.name, entry.oid
            same: TreeEntry | None = None
            for m in parent_maps:
                other = m.get(name)
                if other is not None and other.oid == oid:
                    same = other
                    break
            if same is not None:
                if (same.is_gitlink, same.is_tree) != (False, entry.is_tree):
                    visit(oid, entry.is_tree, current)  # named as another type (rule 5)
                continue
            named = members.get(oid, _UNNAMED)
            if named is _UNNAMED:
                members[oid] = entry.is_tree
            if named is not entry.is_tree:
                visit(oid, entry.is_tree, current)
            if entry.is_tree:
                below = tuple(
                    dict.fromkeys(
                        other.oid
                        for m in parent_maps
                        if (other := m.get(name)) is not None and other.is_tree
                    )
                )
                if (oid, below) not in diffed:
                    diffed.add((oid, below))
                    subtrees.append((oid, below))
        stack.extend(reversed(subtrees))
    return list(members)
