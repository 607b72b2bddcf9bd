"""Ingest's segment diff equals :func:`commit_segment` (DESIGN "Layers": segments).

Ingest diffs trees parsed by one regular expression into (mode, name NUL oid)
pairs (docs/ingest.md, "Speed"); :mod:`enroute_core.engine.segments` is the
reference. Checked: every commit of a generated repository (real git), trees
with the modes old tools wrote (``040000``, ``100664``) and gitlinks, and a
corruption test proving the fast parser accepts exactly what ``Tree.parse``
accepts and raises only its typed errors. Randomised: prints its seed,
replays with ``ENROUTE_SEED=``.
"""

from __future__ import annotations

import os
import random
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


def _both(
    bodies: dict[ObjectId, bytes], commit: ObjectId, tree: ObjectId, parents: list[ObjectId]
) -> tuple[list[tuple[ObjectId, bool, ObjectId]], list[tuple[ObjectId, bool, ObjectId]]]:
    seen_ref: list[tuple[ObjectId, bool, ObjectId]] = []
    seen_fast: list[tuple[ObjectId, bool, ObjectId]] = []
    ref = commit_segment(
        commit,
        tree,
        parents,
        lambda t: Tree.parse(bodies[t]).entries,
        lambda o, is_tree, via: seen_ref.append((o, is_tree, via)),
    )
    fast = ingest._segment(
        commit,
        tree,
        parents,
        lambda t: ingest._parse_tree(bodies[t], DEFAULT_LIMITS),
        lambda o, is_tree, via: seen_fast.append((o, is_tree, via)),
    )
    assert fast == ref
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


def test_fast_parse_accepts_what_tree_parse_accepts(seed: int) -> None:
    """Flip bytes and cut prefixes of good trees: same verdict, only typed errors."""
    rng = random.Random(seed)
    good = Tree.build(
        [TreeEntry(0o100644, b"file %d" % i, ObjectId(rng.randbytes(20))) for i in range(5)]
        + [TreeEntry(0o040000, b"dir", ObjectId(rng.randbytes(20)))]
    ).serialize()
    cases = [good[:n] for n in range(len(good) + 1)]
    for _ in range(300):
        body = bytearray(good)
        body[rng.randrange(len(body))] = rng.choice(b" \x000479a")
        cases.append(bytes(body))
    for body in cases:
        try:
            expected = [(e.name, e.oid, e.is_tree, e.mode == MODE_GITLINK) for e in
                        Tree.parse(body).entries]  # fmt: skip
        except EnrouteError:
            expected = None
        try:
            parsed = ingest._parse_tree(body, DEFAULT_LIMITS)
            got = [
                (key[:-21], key[-20:], mode == b"40000", mode == b"160000")
                for mode, key in parsed.entries
            ]
        except EnrouteError:
            got = None
        assert got == expected, body


def test_fast_parse_keeps_the_entry_limit() -> None:
    body = Tree.build([TreeEntry(0o100644, b"f%d" % i, ObjectId(bytes(20))) for i in range(5)])
    with pytest.raises(EnrouteError):
        ingest._parse_tree(body.serialize(), Limits(tree_entries_max=4))
