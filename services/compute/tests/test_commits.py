"""The overlay and commit building of API commits (DESIGN "API commits (borrowed from Graft)").

Each overlay rule of :mod:`enroute_compute.commits` has a test; trees are read
back through the same reader a view gives.
"""

from __future__ import annotations

import pytest

from enroute_compute.commits import (
    CHANGES_MAX,
    CommitRequest,
    FileChange,
    Signature,
    apply_changes,
    build_commit,
    identity,
    split_path,
)
from enroute_core.base.errors import InvalidArgument, InvalidPath, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.git.commit import Commit
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.tree import Tree, is_sorted

Store = dict[ObjectId, tuple[ObjectType, bytes]]
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
HELLO_BLOB = "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object of b"hello\n"


class Reader:
    """A view's ``read`` over a dict, counting the trees it was asked for."""

    def __init__(self) -> None:
        self.store: Store = {}
        self.reads: list[ObjectId] = []

    def __call__(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        self.reads.append(oid)
        return self.store.get(oid)

    def add(self, objects: tuple[tuple[ObjectType, bytes], ...]) -> None:
        for kind, body in objects:
            self.store[object_id(kind, body)] = (kind, body)


def commit(reader: Reader, base: ObjectId | None, changes: dict[bytes, bytes | None]) -> ObjectId:
    result = apply_changes(reader, base, [FileChange(p, c) for p, c in changes.items()])
    reader.add(result.objects)
    return result.tree


def files(reader: Reader, tree: ObjectId, prefix: bytes = b"") -> dict[bytes, tuple[int, bytes]]:
    kind, body = reader.store[tree]
    assert kind is ObjectType.TREE
    parsed = Tree.parse(body)
    assert is_sorted(parsed.entries), "entries are not in git's order"
    out: dict[bytes, tuple[int, bytes]] = {}
    for e in parsed.entries:
        if e.is_tree:
            out.update(files(reader, e.oid, prefix + e.name + b"/"))
        else:
            out[prefix + e.name] = (e.mode, reader.store[e.oid][1])
    return out


@pytest.fixture
def reader() -> Reader:
    return Reader()


@pytest.fixture
def base(reader: Reader) -> ObjectId:
    return commit(
        reader,
        None,
        {b"keep.txt": b"keep\n", b"change.txt": b"v1\n", b"dir/sub/a.txt": b"a\n", b"d/x": b"x\n"},
    )


def test_content_adds_and_creates_directories(reader: Reader, base: ObjectId) -> None:
    tree = commit(reader, base, {b"new/deep/file.txt": b"new\n"})
    got = files(reader, tree)
    assert got[b"new/deep/file.txt"] == (0o100644, b"new\n")
    assert len(got) == 5


def test_content_replaces(reader: Reader, base: ObjectId) -> None:
    assert files(reader, commit(reader, base, {b"change.txt": b"v2\n"}))[b"change.txt"] == (
        0o100644,
        b"v2\n",
    )


def test_no_content_deletes_and_empty_directories_go(reader: Reader, base: ObjectId) -> None:
    tree = commit(reader, base, {b"dir/sub/a.txt": None, b"change.txt": None})
    assert files(reader, tree) == {b"keep.txt": (0o100644, b"keep\n"), b"d/x": (0o100644, b"x\n")}
    assert b"dir" not in {e.name for e in Tree.parse(reader.store[tree][1]).entries}


def test_unnamed_paths_are_inherited_without_reading_their_trees(
    reader: Reader, base: ObjectId
) -> None:
    before = {e.name: e for e in Tree.parse(reader.store[base][1]).entries}
    reader.reads.clear()
    tree = commit(reader, base, {b"keep.txt": b"other\n"})
    after = {e.name: e for e in Tree.parse(reader.store[tree][1]).entries}
    assert after[b"dir"] == before[b"dir"] and after[b"d"] == before[b"d"]
    assert reader.reads == [base], "only the root tree is on a named path"


def test_deleting_a_missing_path_or_below_a_file_changes_nothing(
    reader: Reader, base: ObjectId
) -> None:
    assert commit(reader, base, {b"nothing/here": None, b"keep.txt/below": None}) == base


def test_deleting_a_directory_removes_it_whole(reader: Reader, base: ObjectId) -> None:
    assert set(files(reader, commit(reader, base, {b"dir": None}))) == {
        b"keep.txt",
        b"change.txt",
        b"d/x",
    }


def test_file_and_directory_replace_each_other(reader: Reader, base: ObjectId) -> None:
    got = files(reader, commit(reader, base, {b"dir": b"now a file\n", b"keep.txt/in": b"in\n"}))
    assert got[b"dir"] == (0o100644, b"now a file\n")
    assert got[b"keep.txt/in"] == (0o100644, b"in\n")
    assert b"keep.txt" not in got and b"dir/sub/a.txt" not in got


def test_deleting_everything_leaves_the_empty_tree(reader: Reader, base: ObjectId) -> None:
    tree = commit(reader, base, {b"keep.txt": None, b"change.txt": None, b"dir": None, b"d": None})
    assert tree.hex() == EMPTY_TREE


def test_modes_default_given_and_inherited(reader: Reader) -> None:
    changes = [
        FileChange(b"plain", b"p\n"),
        FileChange(b"run.sh", b"#!/bin/sh\n", 0o100755),
        FileChange(b"link", b"plain", 0o120000),
    ]
    first = apply_changes(reader, None, changes)
    reader.add(first.objects)
    assert {p: m for p, (m, _) in files(reader, first.tree).items()} == {
        b"plain": 0o100644,
        b"run.sh": 0o100755,
        b"link": 0o120000,
    }
    second = commit(reader, first.tree, {b"run.sh": b"#!/bin/sh\nexit 0\n", b"link": b"run.sh"})
    got = files(reader, second)
    assert got[b"run.sh"][0] == 0o100755 and got[b"link"] == (0o120000, b"run.sh")


def test_bad_mode_is_refused(reader: Reader) -> None:
    with pytest.raises(InvalidArgument) as info:
        apply_changes(reader, None, [FileChange(b"x", b"x", 0o40000)])
    assert info.value.details["path"] == "x"


def test_entries_follow_gits_order(reader: Reader) -> None:
    tree = commit(reader, None, {b"a.b": b"1", b"a/c": b"2", b"a-b": b"3", b"a0": b"4"})
    names = [e.name for e in Tree.parse(reader.store[tree][1]).entries]
    assert names == [b"a-b", b"a.b", b"a", b"a0"]  # "a" sorts as "a/"


def test_objects_have_gits_ids(reader: Reader) -> None:
    result = apply_changes(reader, None, [FileChange(b"hello.txt", b"hello\n")])
    assert object_id(ObjectType.BLOB, b"hello\n").hex() == HELLO_BLOB
    assert result.tree.hex() == "aaa96ced2d9a1c8e72c56b253a0e2fe78393feb7"  # git mktree


BAD_PATHS = [b"", b".", b"..", b"/abs", b"a/../b", b"a/./b", b"a//b", b"a/", b".git/config",
             b"x/.git/y", b".GIT/x", b"git~1/x", b"a\0b", b"\xff"]  # fmt: skip


@pytest.mark.parametrize("path", BAD_PATHS, ids=[repr(p) for p in BAD_PATHS])
def test_invalid_paths_are_refused_and_named(reader: Reader, path: bytes) -> None:
    with pytest.raises(InvalidPath) as info:
        apply_changes(reader, None, [FileChange(b"fine", b"f"), FileChange(path, b"bad")])
    assert info.value.details["path"] == path.decode("utf-8", "replace")


GOOD_PATHS = [b"a", b"a/b/c.txt", b".gitignore", b"x/.github/ci.yml", b"\xc3\xa9"]


@pytest.mark.parametrize("path", GOOD_PATHS)
def test_valid_paths_split(path: bytes) -> None:
    assert b"/".join(split_path(path)) == path


@pytest.mark.parametrize(
    "paths", [(b"a", b"a"), (b"a", b"a/b"), (b"a/b", b"a")], ids=["twice", "file-dir", "dir-file"]
)
def test_conflicting_changes_are_refused(reader: Reader, paths: tuple[bytes, bytes]) -> None:
    with pytest.raises(InvalidPath):
        apply_changes(reader, None, [FileChange(p, b"x") for p in paths])


def test_path_limits(reader: Reader) -> None:
    with pytest.raises(InvalidPath):
        split_path(b"/".join([b"d"] * 300))
    with pytest.raises(InvalidPath):
        split_path(b"x" * 5000)
    many = [FileChange(b"f%d" % i, b"") for i in range(CHANGES_MAX + 1)]
    with pytest.raises(LimitExceeded):
        apply_changes(reader, None, many)


def test_identity_time_is_floored_seconds_and_zone_is_hhmm() -> None:
    got = identity(Signature(b"A U Thor ", b"a@example.com", 1_700_000_000_999_999, -90), 0, "x")
    assert got.serialize() == b"A U Thor <a@example.com> 1700000000 -0130"
    assert identity(Signature(b"A", b"e"), 5_000_000, "x").serialize() == b"A <e> 5 +0000"
    for bad in (Signature(b"A <x>", b"e"), Signature(b"A", b"e\n"), Signature(b" ", b"e")):
        with pytest.raises(InvalidArgument):
            identity(bad, 0, "author")


def test_build_commit_on_a_parent(reader: Reader, base: ObjectId) -> None:
    author = Signature(b"A U Thor", b"author@example.com")
    root = CommitRequest("r", b"main", None, b"first", author, None, (FileChange(b"a", b"a"),))
    first = build_commit(reader, root, 1_000_000_000)
    reader.add(first.objects)
    assert first.objects[-1][0] is ObjectType.COMMIT
    parsed = Commit.parse(reader.store[first.oid][1])
    assert parsed.parents == () and parsed.tree == first.tree and parsed.message == b"first\n"
    assert parsed.committer == parsed.author
    assert parsed.author is not None and parsed.author.timestamp == 1000
    child = CommitRequest("r", b"main", first.oid, b"second\n", author, Signature(b"C", b"c"),
                          (FileChange(b"b", b"b"),))  # fmt: skip
    second = build_commit(reader, child, 2_000_000_000)
    reader.add(second.objects)
    parsed = Commit.parse(reader.store[second.oid][1])
    assert parsed.parents == (first.oid,) and parsed.committer is not None
    assert parsed.committer.name == b"C"
    assert set(files(reader, second.tree)) == {b"a", b"b"}
    assert second.pack().startswith(b"PACK")
