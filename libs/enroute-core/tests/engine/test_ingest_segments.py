"""Ingest's segment diff equals :func:`commit_segment` (DESIGN "Layers": segments).

Ingest diffs raw tree bodies in compiled code (``enroute_native.segment_diff``,
docs/native.md); :mod:`enroute_core.engine.segments` is the reference. Checked:
every commit of a generated repository (real git), trees with the modes old
tools wrote (``040000``, ``100664``) and gitlinks, and corruption tests proving
the compiled parser accepts exactly what ``Tree.parse`` accepts, reads the same
entries, and raises only its typed errors. Randomised: prints its seed,
replays with ``ENROUTE_SEED=``.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from pathlib import Path

import pytest

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine import ingest
from enroute_core.engine.segments import commit_segment
from enroute_core.git.commit import Commit
from enroute_core.git.tree import MODE_GITLINK, Tree, TreeEntry
from enroute_testing.repogen import RepoSpec, all_objects, generate_repo


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={value}")
    return value


Seen = list[tuple[ObjectId, bool, ObjectId]]


def _both(
    bodies: dict[ObjectId, bytes],
    commit: ObjectId,
    tree: ObjectId,
    parents: list[ObjectId],
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[Seen, Seen]:
    """Both diffs; either both raise a typed error (then two empty lists) or both agree."""
    seen_ref: Seen = []
    seen_fast: Seen = []
    try:
        ref: list[ObjectId] | None = commit_segment(
            commit,
            tree,
            parents,
            lambda t: Tree.parse(bodies[t], limits=limits).entries,
            lambda o, is_tree, via: seen_ref.append((o, is_tree, via)),
        )
    except EnrouteError:
        ref = None
    try:
        fast: list[ObjectId] | None = ingest._segment(
            commit,
            tree,
            parents,
            bodies.__getitem__,
            lambda o, is_tree, via: seen_fast.append((o, is_tree, via)),
            limits=limits,
        )
    except EnrouteError:
        fast = None
    assert fast == ref
    if ref is None:
        return [], []
    return seen_ref, seen_fast


@pytest.mark.interop
def test_segments_equal_the_reference_on_a_generated_repository(tmp_path: Path) -> None:
    repo = generate_repo(tmp_path / "r.git", RepoSpec(seed=3, commits=120, files=30, symlinks=2))
    bodies: dict[ObjectId, bytes] = {}
    commits: list[ObjectId] = []
    for hex_oid, type_name, body in all_objects(repo.path):
        oid = oid_from_hex(hex_oid.decode())
        bodies[oid] = body
        if type_name == b"commit":
            commits.append(oid)
    assert len(commits) == 120
    for c in commits:
        parsed = Commit.parse(bodies[c])
        parents = [Commit.parse(bodies[p]).tree for p in parsed.parents]
        seen_ref, seen_fast = _both(bodies, c, parsed.tree, parents)
        assert seen_fast == seen_ref


def _tree(entries: list[TreeEntry]) -> tuple[ObjectId, bytes]:
    body = Tree(tuple(entries)).serialize()
    return ObjectId(bytes(random.Random(body).randbytes(20))), body


def test_unusual_modes_and_gitlinks_go_through_tree_parse(seed: int) -> None:
    rng = random.Random(seed)

    def oid() -> ObjectId:
        return ObjectId(rng.randbytes(20))

    blob, sub_blob, link = oid(), oid(), oid()
    sub_old = _tree([TreeEntry(0o100644, b"x", oid())])
    sub_new = _tree([TreeEntry(0o100644, b"x", sub_blob)])
    old = _tree(
        [
            TreeEntry(0o040000, b"d", sub_old[0], b"040000"),
            TreeEntry(0o100664, b"g", oid(), b"100664"),
        ]
    )
    new = _tree(
        [
            TreeEntry(0o040000, b"d", sub_new[0], b"040000"),
            TreeEntry(0o100664, b"g", blob, b"100664"),
            TreeEntry(MODE_GITLINK, b"m", link),
        ]
    )
    bodies = dict([sub_old, sub_new, old, new])
    seen_ref, seen_fast = _both(bodies, oid(), new[0], [old[0]])
    assert seen_fast == seen_ref
    assert {o for o, _, _ in seen_fast} == {new[0], sub_new[0], blob, sub_blob}


def test_compiled_parse_accepts_what_tree_parse_accepts(seed: int) -> None:
    """Flip bytes of and cut good trees: the same verdict and the same entries, only
    typed errors. Diffed against the good tree (names and oids must match to be
    skipped) and against nothing (every entry visited)."""
    rng = random.Random(seed)
    good = Tree.build(
        [TreeEntry(0o100644, b"file %d" % i, ObjectId(rng.randbytes(20))) for i in range(5)]
        + [TreeEntry(0o040000, b"dir", ObjectId(rng.randbytes(20)))]
        + [TreeEntry(MODE_GITLINK, b"sub", ObjectId(rng.randbytes(20)))]
    ).serialize()
    cases = [good[:n] for n in range(len(good) + 1)]
    for _ in range(400):
        body = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            body[rng.randrange(len(body))] = rng.choice(b" \x000146a/")
        cases.append(bytes(body))
    cases += [rng.randbytes(rng.randrange(200)) for _ in range(100)]
    old, new, commit = (ObjectId(rng.randbytes(20)) for _ in range(3))
    for body in cases:
        bodies = defaultdict(bytes, {old: good, new: body})  # any subtree: empty
        for parents in ([old], []):
            seen_ref, seen_fast = _both(bodies, commit, new, parents)
            assert seen_fast == seen_ref, body


def test_compiled_parse_keeps_the_entry_limit() -> None:
    body = Tree.build(
        [TreeEntry(0o100644, b"f%d" % i, ObjectId(bytes([i]) * 20)) for i in range(5)]
    )
    tree, commit = ObjectId(b"t" * 20), ObjectId(b"c" * 20)
    bodies = {tree: body.serialize()}
    with pytest.raises(EnrouteError):
        ingest._segment(
            commit, tree, [], bodies.__getitem__, lambda *a: None, limits=Limits(tree_entries_max=4)
        )
    assert len(_both(bodies, commit, tree, [], Limits(tree_entries_max=5))[1]) == 6


def test_compiled_diff_keeps_the_depth_limit() -> None:
    """A chain of trees nested over ``tree_depth_max`` raises the typed limit error."""
    bodies: dict[ObjectId, bytes] = {}
    leaf = Tree(()).serialize()
    below = ObjectId(bytes(19) + b"\x01")
    bodies[below] = leaf
    for depth in range(6):
        body = Tree((TreeEntry(0o040000, b"d", below),)).serialize()
        below = ObjectId(bytes(19) + bytes([depth + 2]))
        bodies[below] = body
    commit = ObjectId(b"c" * 20)
    seen: Seen = []
    members = ingest._segment(
        commit,
        below,
        [],
        bodies.__getitem__,
        lambda *a: seen.append(a),
        limits=Limits(tree_depth_max=6),
    )
    assert len(members) == 8 and len(seen) == 7
    with pytest.raises(EnrouteError, match="tree_depth_max"):
        ingest._segment(
            commit, below, [], bodies.__getitem__, lambda *a: None, limits=Limits(tree_depth_max=5)
        )


def test_octopus_merges_with_repeated_parent_trees_agree_with_the_reference(seed: int) -> None:
    """Many parents, some with the same root tree or the same subtree: the repeats are
    dropped in parent order (dict.fromkeys), as the reference drops them."""
    rng = random.Random(seed)

    def oid() -> ObjectId:
        return ObjectId(rng.randbytes(20))

    subs = [_tree([TreeEntry(0o100644, b"x", oid())]) for _ in range(3)]
    roots = [
        _tree([TreeEntry(0o040000, b"d", rng.choice(subs)[0]), TreeEntry(0o100644, b"f", oid())])
        for _ in range(4)
    ]
    bodies = dict(subs + roots)
    new_sub = _tree([TreeEntry(0o100644, b"x", oid())])
    new = _tree([TreeEntry(0o040000, b"d", new_sub[0]), TreeEntry(0o100644, b"f", oid())])
    bodies.update([new_sub, new])
    for _ in range(20):
        parents = [rng.choice(roots)[0] for _ in range(rng.randint(1, 12))]
        seen_ref, seen_fast = _both(bodies, oid(), new[0], parents)
        assert seen_fast == seen_ref


def test_an_object_named_as_another_type_is_visited_again_as_the_reference_does(
    seed: int,
) -> None:
    """Rule 5 of :mod:`~enroute_core.engine.segments`: a member named again as another
    type, or an object the parent names at the same path with a mode of another type
    (rule 2 skips it), is visited again as named; the members stay the same."""
    rng = random.Random(seed)

    def oid() -> ObjectId:
        return ObjectId(rng.randbytes(20))

    blob, gitlinked = oid(), oid()
    sub = _tree([TreeEntry(0o100644, b"x", blob)])
    old = _tree(
        [
            TreeEntry(0o100644, b"a", blob),
            TreeEntry(0o040000, b"d", sub[0]),
            TreeEntry(MODE_GITLINK, b"m", gitlinked),
        ]
    )
    new = _tree(
        [
            TreeEntry(0o040000, b"a", blob),  # a blob at the same path, now as a tree
            TreeEntry(0o100644, b"d", sub[0]),  # a tree at the same path, now as a file
            TreeEntry(0o100644, b"m", gitlinked),  # a gitlink, now a file
            TreeEntry(0o040000, b"t", sub[0]),  # first named as a tree here...
            TreeEntry(0o120000, b"u", sub[0]),  # ...then as a blob
        ]
    )
    bodies = dict([sub, old, new])
    commit = oid()
    seen_ref, seen_fast = _both(bodies, commit, new[0], [old[0]])
    assert seen_fast == seen_ref
    assert seen_fast == [
        (new[0], True, commit),
        (blob, True, new[0]),
        (sub[0], False, new[0]),
        (gitlinked, False, new[0]),
        (sub[0], True, new[0]),
        (sub[0], False, new[0]),
        (blob, False, sub[0]),  # then t's subtree is diffed: a member as first named
    ]
