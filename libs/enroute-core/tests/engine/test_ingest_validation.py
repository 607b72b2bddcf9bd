"""Ingest refuses what git fsck and git's limits refuse (docs/security.md).

Every pushed commit, tree and tag goes through :mod:`enroute_core.git.fsck`;
tree nesting is bounded by ``tree_depth_max``; a branch names a commit; a tag
names an object of the type it says.
"""

from __future__ import annotations

import hashlib

import pytest

from enroute_core.base.errors import InvalidObject, InvalidPack, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.config import load_config
from enroute_core.engine.ingest import ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT
from enroute_core.git.object_type import ObjectType
from enroute_core.git.packwrite import write_pack
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer import LayerReader

IDENT = b"A U Thor <a@example.com> 1700000000 +0000"


def oid(type_num: int, body: bytes) -> ObjectId:
    name = ObjectType(type_num).type_name
    return ObjectId(hashlib.sha1(name + b" %d\0" % len(body) + body).digest())


def tree(*entries: tuple[bytes, bytes, ObjectId]) -> bytes:
    return b"".join(m + b" " + n + b"\0" + o for m, n, o in entries)


def commit(tree_oid: ObjectId, *, author: bytes = IDENT) -> bytes:
    return (
        b"tree "
        + tree_oid.hex().encode()
        + b"\nauthor "
        + author
        + b"\ncommitter "
        + IDENT
        + b"\n\nm\n"
    )


BLOB = b"hello\n"
GOOD_TREE = tree((b"100644", b"a", oid(3, BLOB)))


def ingest(objects: list[tuple[int, bytes]], tip: ObjectId, **kw: object):  # type: ignore[no-untyped-def]
    source = BytesSource(write_pack(objects))
    return ingest_pack(source, [tip], EMPTY_SNAPSHOT, **kw)  # type: ignore[arg-type]


def test_good_push_passes() -> None:
    c = commit(oid(2, GOOD_TREE))
    result = ingest([(3, BLOB), (2, GOOD_TREE), (1, c)], oid(1, c))
    assert result.object_count == 3


@pytest.mark.parametrize(
    ("bad_tree", "msg"),
    [
        (tree((b"100644", b".git", oid(3, BLOB))), "hasDotgit"),
        (tree((b"100644", b"b", oid(3, BLOB)), (b"100644", b"a", oid(3, BLOB))), "treeNotSorted"),
        (tree((b"100644", b"..", oid(3, BLOB))), "hasDotdot"),
    ],
)
def test_fsck_refuses_bad_trees(bad_tree: bytes, msg: str) -> None:
    c = commit(oid(2, bad_tree))
    objects = [(3, BLOB), (2, bad_tree), (1, c)]
    with pytest.raises(InvalidObject, match=msg) as info:
        ingest(objects, oid(1, c))
    assert info.value.details["msg_id"] == msg
    ingest(objects, oid(1, c), fsck=None)  # the checks are what refused it


def test_harmless_commit_is_taken_with_a_warning_unless_raised() -> None:
    """badTimezone is harmless (docs/security.md): taken, counted; raised to error, refused."""
    c = commit(oid(2, GOOD_TREE), author=b"A <a@example.com> 1700000000 +00")
    objects = [(3, BLOB), (2, GOOD_TREE), (1, c)]
    result = ingest(objects, oid(1, c))
    assert [(w.msg_id, w.count, w.example) for w in result.warnings] == [
        ("badTimezone", 1, oid(1, c))
    ]
    config = load_config("receive:\n  fsck:\n    badTimezone: error\n", {})
    with pytest.raises(InvalidObject, match=r"badTimezone: .* warn lowers it"):
        ingest(objects, oid(1, c), fsck=config.receive.fsck_policy())


def test_legacy_commits_keep_the_time_git_gives_them() -> None:
    """A commit an old tool wrote still has its time (commit.c ``parse_commit_date``: the
    number after the committer's last '>', the zone not read); none without a committer."""
    base = b"tree " + oid(2, GOOD_TREE).hex().encode() + b"\n"
    bodies = {
        1300000001: base + b"author A <a@x> 1 --700\ncommitter C <c@x> 1300000001 --700\n\nm\n",
        1300000002: base + b"author A 1 +0000\ncommitter C <c@x>1300000002 +051800\n\nm\n",
        0: base + b"author A <a@x> 1 +0000\n\nno committer\n",
    }
    objects = [(3, BLOB), (2, GOOD_TREE), *((1, b) for b in bodies.values())]
    source = BytesSource(write_pack(objects))
    tips = [oid(1, b) for b in bodies.values()]
    result = ingest_pack(source, tips, EMPTY_SNAPSHOT)
    assert result.data is not None and result.sealed is not None
    reader = LayerReader.open(BytesSource(result.data), meta_size=result.sealed.meta_size)
    times = {info.oid: info.time for info in reader.commit_infos()}
    assert times == {oid(1, b): t for t, b in bodies.items()}


def test_tree_depth_is_bounded() -> None:
    objects: list[tuple[int, bytes]] = [(3, BLOB), (2, GOOD_TREE)]
    inner = oid(2, GOOD_TREE)
    for _ in range(5):
        body = tree((b"40000", b"d", inner))
        objects.append((2, body))
        inner = oid(2, body)
    c = commit(inner)
    objects.append((1, c))
    ingest(objects, oid(1, c), limits=Limits(tree_depth_max=5))
    with pytest.raises(LimitExceeded) as info:
        ingest(objects, oid(1, c), limits=Limits(tree_depth_max=4))
    assert info.value.limit == "tree_depth_max"
    # a tree a ref names directly is walked with the same bound
    with pytest.raises(LimitExceeded):
        ingest(objects[:-1], inner, limits=Limits(tree_depth_max=4))


def test_branch_must_name_a_commit() -> None:
    tree_oid = oid(2, GOOD_TREE)
    objects = [(3, BLOB), (2, GOOD_TREE)]
    ingest(objects, tree_oid, refs=[(b"refs/tags/t", tree_oid)])
    with pytest.raises(InvalidObject, match="must name a commit"):
        ingest(objects, tree_oid, refs=[(b"refs/heads/main", tree_oid)])


def test_tag_must_name_the_type_it_says() -> None:
    tree_oid = oid(2, GOOD_TREE)
    tag = (
        b"object "
        + tree_oid.hex().encode()
        + b"\ntype commit\ntag v1\ntagger "
        + IDENT
        + b"\n\nt\n"
    )
    with pytest.raises(InvalidObject, match="is a tree, expected a commit"):
        ingest([(3, BLOB), (2, GOOD_TREE), (4, tag)], oid(4, tag))
    good = tag.replace(b"type commit", b"type tree")
    ingest([(3, BLOB), (2, GOOD_TREE), (4, good)], oid(4, good))


def test_zlib_bomb_is_refused_while_inflating() -> None:
    bomb = bytes(200_000)  # zeros deflate about 1000:1
    c = commit(oid(2, GOOD_TREE))
    objects = [(3, bomb), (3, BLOB), (2, GOOD_TREE), (1, c)]
    tight = Limits(pack_inflate_free_bytes=4096, pack_inflate_ratio_max=100)
    with pytest.raises(LimitExceeded) as info:
        ingest(objects, oid(1, c), limits=tight)
    assert info.value.limit == "pack_inflate_ratio_max"
    # zlib's best ratio (about 1032:1) always passes; so does an entry under the free bytes
    ingest(
        objects, oid(1, c), limits=Limits(pack_inflate_free_bytes=4096, pack_inflate_ratio_max=1032)
    )
    ingest(
        objects, oid(1, c), limits=Limits(pack_inflate_free_bytes=200_000, pack_inflate_ratio_max=1)
    )


def test_fsck_policy_from_configuration_lets_zero_padded_modes_in() -> None:
    padded = tree((b"0100644", b"a", oid(3, BLOB)))
    c = commit(oid(2, padded))
    objects = [(3, BLOB), (2, padded), (1, c)]
    assert ingest(objects, oid(1, c)).warnings[0].msg_id == "zeroPaddedFilemode"
    config = load_config("receive:\n  fsck:\n    zeroPaddedFilemode: error\n", {})
    with pytest.raises(InvalidObject, match="zeroPaddedFilemode"):
        ingest(objects, oid(1, c), fsck=config.receive.fsck_policy())
    for severity, warned in (("ignore", 0), ("warn", 1)):  # a severity set explicitly stands
        config = load_config(f"receive:\n  fsck:\n    zeroPaddedFilemode: {severity}\n", {})
        result = ingest(objects, oid(1, c), fsck=config.receive.fsck_policy())
        assert result.object_count == 3 and len(result.warnings) == warned
    # the other checks keep their classes
    config = load_config("receive:\n  fsck:\n    zeroPaddedFilemode: ignore\n", {})
    dotgit = tree((b"0100644", b".git", oid(3, BLOB)))
    c2 = commit(oid(2, dotgit))
    with pytest.raises(InvalidObject, match="hasDotgit"):
        ingest([(3, BLOB), (2, dotgit), (1, c2)], oid(1, c2), fsck=config.receive.fsck_policy())


def test_duplicate_objects_are_refused_when_checking() -> None:
    c = commit(oid(2, GOOD_TREE))
    objects = [(3, BLOB), (3, BLOB), (2, GOOD_TREE), (1, c)]
    with pytest.raises(InvalidPack, match=f"the same object {oid(3, BLOB).hex()} appears twice"):
        ingest(objects, oid(1, c))
    # git without --strict takes them; so does ingest without the checks, storing one copy
    assert ingest(objects, oid(1, c), fsck=None).object_count == 3
