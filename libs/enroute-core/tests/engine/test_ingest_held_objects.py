"""Pushed objects that name objects the repository already holds are checked as git checks them.

``index-pack --strict`` (what ``receive.fsckObjects`` runs) looks past the
pack: ``check_object`` (builtin/index-pack.c) asks the object database the type
of every object a pushed tree, commit or tag names ("object %s: expected type
%s, found %s"), and ``fsck_finish`` (fsck.c) reads every blob a pushed tree
names ``.gitmodules`` or ``.gitattributes`` from the object database, wherever
it is stored. Each
case pushes a first layer, then a second pack against a real
:class:`~enroute_core.engine.view.View` of it, so the snapshot's answers are
the layers' own (kinds from id runs, sizes from the object table).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidObject, MissingObject
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine import ingest
from enroute_core.engine.ingest import IngestResult, ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT, SnapshotObjects
from enroute_core.engine.view import View
from enroute_core.git.object_type import ObjectType
from enroute_core.git.packwrite import write_pack
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer import CommitInfo, LayerReader
from enroute_testing.pushed import inline_entry, three_pushes
from enroute_testing.repogen import RepoSpec, all_objects, generate_repo

IDENT = b"A U Thor <a@example.com> 1700000000 +0000"
HOSTILE = b'[submodule "x"]\n\tpath = x\n\turl = --upload-pack=touch x\n'
README = b"hello\n"


def oid(type_num: int, body: bytes) -> ObjectId:
    name = ObjectType(type_num).type_name
    return ObjectId(hashlib.sha1(name + b" %d\0" % len(body) + body).digest())


def tree(*entries: tuple[bytes, bytes, ObjectId]) -> bytes:
    return b"".join(m + b" " + n + b"\0" + o for m, n, o in sorted(entries, key=_git_order))


def _git_order(entry: tuple[bytes, bytes, ObjectId]) -> bytes:
    mode, name, _ = entry
    return name + (b"/" if mode == b"40000" else b"")


def commit(tree_oid: ObjectId, parents: Sequence[ObjectId] = (), message: bytes = b"m\n") -> bytes:
    head = b"tree " + tree_oid.hex().encode() + b"\n"
    head += b"".join(b"parent " + p.hex().encode() + b"\n" for p in parents)
    return head + b"author " + IDENT + b"\ncommitter " + IDENT + b"\n\n" + message


def tag(target: ObjectId, type_name: bytes) -> bytes:
    return (
        b"object " + target.hex().encode() + b"\ntype " + type_name
        + b"\ntag v1\ntagger " + IDENT + b"\n\nt\n"
    )  # fmt: skip


class Recorded:
    """The view, noting which bodies ingest reads (a type or size is never a body read)."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.reads: list[ObjectId] = []

    def contains(self, oid: ObjectId) -> bool:
        return self.view.contains(oid)

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        return self.view.type_of(oid)

    def size_of(self, oid: ObjectId) -> int | None:
        return self.view.size_of(oid)

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        self.reads.append(oid)
        return self.view.read(oid)


class Repo:
    """The first push: a commit over ``notes.txt`` (the hostile text as a harmless file),
    ``README`` and ``dir/README``; a view of its layer is the snapshot of every case."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, held: bytes = HOSTILE) -> None:
        self.blob = oid(3, held)
        self.readme = oid(3, README)
        sub = tree((b"100644", b"README", self.readme))
        self.subtree = oid(2, sub)
        root = tree(
            (b"100644", b"notes.txt", self.blob),
            (b"100644", b"README", self.readme),
            (b"40000", b"dir", self.subtree),
        )
        self.tree = oid(2, root)
        first = commit(self.tree)
        self.commit = oid(1, first)
        objects = [(1, first), (2, root), (2, sub), (3, held), (3, README)]
        result = ingest_pack(BytesSource(write_pack(objects)), [self.commit], EMPTY_SNAPSHOT)
        assert result.data is not None and result.sealed is not None
        reader = LayerReader.open(BytesSource(result.data), meta_size=result.sealed.meta_size)
        self.snapshot = Recorded(View([(inline_entry(result.sealed, 0, 1), reader)]))
        self.limits = limits

    def push_tree(
        self, entries: Sequence[tuple[bytes, bytes, ObjectId]], **kw: object
    ) -> IngestResult:
        """A commit on the first over a new root tree of ``entries`` (the tree and commit only)."""
        body = tree(*entries)
        top = commit(oid(2, body), [self.commit], b"next\n")
        return self.push([(2, body), (1, top)], oid(1, top), **kw)

    def push(self, objects: list[tuple[int, bytes]], tip: ObjectId, **kw: object) -> IngestResult:
        snapshot: SnapshotObjects = self.snapshot
        return ingest_pack(
            BytesSource(write_pack(objects)),
            [tip],
            snapshot,
            limits=self.limits,
            **kw,  # type: ignore[arg-type]
        )


# -- .gitmodules that arrives under another name (fsck.c fsck_finish) ---------------------------


@pytest.mark.parametrize(
    "name", [b".gitmodules", b".GitModules", b"GITMOD~1", b".gitmodules\xe2\x80\x8c"]
)
def test_a_held_blob_renamed_gitmodules_is_checked(name: bytes) -> None:
    repo = Repo()
    with pytest.raises(InvalidObject, match="gitmodulesUrl") as info:
        repo.push_tree([(b"100644", name, repo.blob)])
    assert info.value.details["msg_id"] == "gitmodulesUrl"
    assert repo.snapshot.reads.count(repo.blob) == 1  # read from the view, once
    repo.push_tree([(b"100644", name, repo.blob)], fsck=None)  # the check is what refused it


def test_a_held_gitmodules_over_the_bound_is_refused_unread() -> None:
    repo = Repo(Limits(gitmodules_bytes_max=len(HOSTILE) - 1))
    with pytest.raises(InvalidObject, match="gitmodulesLarge"):
        repo.push_tree([(b"100644", b".gitmodules", repo.blob)])
    assert repo.blob not in repo.snapshot.reads  # its size came from the layer's table


def test_a_held_tree_named_gitmodules_is_not_a_blob() -> None:
    repo = Repo()
    with pytest.raises(InvalidObject, match="gitmodulesBlob"):
        repo.push_tree([(b"40000", b".gitmodules", repo.subtree)])
    assert repo.subtree not in repo.snapshot.reads


def test_a_gitmodules_blob_neither_side_holds_is_missing() -> None:
    """index-pack's ``check_objects`` dies on an entry naming an object it did not receive,
    before ``fsck_finish`` reads .gitmodules blobs."""
    repo = Repo()
    absent = oid(3, b"absent\n")
    with pytest.raises(MissingObject, match=absent.hex()):
        repo.push_tree([(b"100644", b".gitmodules", absent)])


def test_a_harmless_held_gitmodules_is_accepted() -> None:
    repo = Repo()
    result = repo.push_tree([(b"100644", b".gitmodules", repo.readme)])
    assert result.object_count == 2  # the new tree and commit; the blob stays where it is


# -- .gitattributes that arrives under another name (fsck.c fsck_blob, t1450) ------------------

# t1450 'fsck error on gitattributes with excessive line lengths': "pattern %02048d"
LONG_LINE_ATTRIBUTES = b"*.c diff=cpp\npattern " + b"%02048d" % 1 + b"\n"


@pytest.mark.parametrize(
    "name", [b".gitattributes", b".GitAttributes", b"GITATT~1", b"gi7d29~1", b".gitattributes."]
)
def test_a_held_blob_renamed_gitattributes_is_checked(name: bytes) -> None:
    repo = Repo(held=LONG_LINE_ATTRIBUTES)
    with pytest.raises(InvalidObject, match="gitattributesLineLength") as info:
        repo.push_tree([(b"100644", name, repo.blob)])
    assert info.value.details["oid"] == repo.blob.hex()
    assert repo.snapshot.reads.count(repo.blob) == 1  # read from the view, once
    repo.push_tree([(b"100644", name, repo.blob)], fsck=None)  # the check is what refused it


def test_a_held_gitattributes_over_the_bound_is_refused_unread() -> None:
    limits = Limits(gitattributes_bytes_max=len(LONG_LINE_ATTRIBUTES) - 1)
    repo = Repo(limits, held=LONG_LINE_ATTRIBUTES)
    with pytest.raises(InvalidObject, match="gitattributesLarge"):
        repo.push_tree([(b"100644", b".gitattributes", repo.blob)])
    assert repo.blob not in repo.snapshot.reads  # its size came from the layer's table


def test_a_held_tree_named_gitattributes_is_not_a_blob() -> None:
    repo = Repo()
    with pytest.raises(InvalidObject, match="gitattributesBlob"):
        repo.push_tree([(b"40000", b".gitattributes", repo.subtree)])
    assert repo.subtree not in repo.snapshot.reads


def test_a_held_gitmodules_text_is_harmless_as_gitattributes() -> None:
    """Each name gets its own check: the hostile .gitmodules text has no long line."""
    repo = Repo()
    result = repo.push_tree([(b"100644", b".gitattributes", repo.blob)])
    assert result.object_count == 2


# -- wrong-type references to held objects (index-pack.c check_object) -------------------------


@pytest.mark.parametrize(
    ("mode", "target", "message"),
    [
        (b"100644", "commit", "is a commit, expected a blob"),
        (b"100755", "tree", "is a tree, expected a blob"),
        (b"120000", "tree", "is a tree, expected a blob"),
        (b"40000", "blob", "is a blob, expected a tree"),
        (b"40000", "commit", "is a commit, expected a tree"),
    ],
)
def test_a_tree_entry_naming_a_held_object_of_another_type_is_refused(
    mode: bytes, target: str, message: str
) -> None:
    repo = Repo()
    named = {"commit": repo.commit, "tree": repo.subtree, "blob": repo.readme}[target]
    with pytest.raises(InvalidObject, match=message) as info:
        repo.push_tree([(mode, b"x", named), (b"100644", b"README", repo.readme)])
    assert info.value.details["oid"] == named.hex()
    if named != repo.commit:  # the parent commit is read for its tree, as for any push
        assert named not in repo.snapshot.reads  # told by the layer's kinds, no body read


def test_a_gitlink_to_a_held_object_is_not_checked() -> None:
    """git's fsck_walk_tree skips gitlinks: a submodule's commit is not in this repository."""
    repo = Repo()
    repo.push_tree([(b"160000", b"sub", repo.readme)])


def test_a_tag_naming_a_held_object_of_another_type_is_refused() -> None:
    repo = Repo()
    for type_name, got in ((b"blob", "commit"), (b"commit", "tree"), (b"tree", "blob")):
        target = {"commit": repo.commit, "tree": repo.tree, "blob": repo.readme}[got]
        body = tag(target, type_name)
        expected = type_name.decode()
        with pytest.raises(InvalidObject, match=f"is a {got}, expected a {expected}"):
            repo.push([(4, body)], oid(4, body))
        good = tag(target, got.encode())
        assert repo.push([(4, good)], oid(4, good)).object_count == 1


def test_a_parent_naming_a_held_tree_is_refused() -> None:
    repo = Repo()
    body = commit(repo.tree, [repo.subtree])
    with pytest.raises(InvalidObject, match="is a tree, expected a commit"):
        repo.push([(1, body)], oid(1, body))


def test_a_branch_naming_a_held_blob_is_refused_unread() -> None:
    repo = Repo()
    with pytest.raises(InvalidObject, match="must name a commit"):
        repo.push([], repo.readme, refs=[(b"refs/heads/main", repo.readme)])
    assert repo.readme not in repo.snapshot.reads


def test_a_tree_a_tag_names_is_checked_against_held_objects() -> None:
    """A tree reached through a tag, not a commit, is walked whole; its entries too."""
    repo = Repo()
    body = tree((b"100644", b"x", repo.commit))
    top = tag(oid(2, body), b"tree")
    with pytest.raises(InvalidObject, match="is a commit, expected a blob"):
        repo.push([(2, body), (4, top)], oid(4, top))


# -- the same object named as two types: a repeat the segment diff skips (segments, rule 5) ----


@pytest.mark.parametrize(
    ("name", "mode", "target", "message"),
    [
        (b"dir", b"100644", "tree", "is a tree, expected a blob"),  # was 40000 in the parent
        (b"dir", b"120000", "tree", "is a tree, expected a blob"),
        (b"README", b"40000", "blob", "is a blob, expected a tree"),  # was 100644
    ],
)
def test_a_mode_of_another_type_at_the_same_path_is_refused(
    name: bytes, mode: bytes, target: str, message: str
) -> None:
    """The parent names the same id at the same path, so the segment diff skips it as
    unchanged (rule 2); git's walk still names it as the new mode says."""
    repo = Repo()
    named = {"tree": repo.subtree, "blob": repo.readme}[target]
    others = [(b"100644", b"README", repo.readme), (b"40000", b"dir", repo.subtree)]
    entries = [e for e in others if e[1] != name] + [(mode, name, named)]
    with pytest.raises(InvalidObject, match=message):
        repo.push_tree(entries)


def test_a_gitlink_made_a_file_names_an_object_neither_side_holds() -> None:
    """A submodule's commit is not in this repository: as a file it is missing."""
    repo = Repo()
    absent = oid(1, b"a submodule's commit")
    repo.push_tree([(b"160000", b"sub", absent)])  # as a gitlink it is not followed
    link = tree((b"160000", b"sub", absent))
    first = commit(oid(2, link), [repo.commit], b"link\n")
    file = tree((b"100644", b"sub", absent))
    second = commit(oid(2, file), [oid(1, first)], b"file\n")
    objects = [(2, link), (1, first), (2, file), (1, second)]
    with pytest.raises(MissingObject, match=absent.hex()):
        repo.push(objects, oid(1, second))


@pytest.mark.parametrize("held", [True, False])
def test_one_object_named_as_a_tree_and_as_a_blob_in_one_commit_is_refused(held: bool) -> None:
    """The segment diff visits an object once per commit; named again as another type
    in the same commit, it is visited again (rule 5) and refused, held or new alike."""
    repo = Repo()
    extra: list[tuple[int, bytes]] = []
    subtree = repo.subtree
    if not held:
        body = tree((b"100644", b"new", repo.readme))
        subtree = oid(2, body)
        extra = [(2, body)]
    body = tree((b"40000", b"a", subtree), (b"100644", b"b", subtree))
    top = commit(oid(2, body), [repo.commit], b"twice\n")
    with pytest.raises(InvalidObject, match="is a tree, expected a blob"):
        repo.push([*extra, (2, body), (1, top)], oid(1, top))


# -- the snapshot's answers (SnapshotObjects) against git's own ---------------------------------


@pytest.mark.interop
def test_the_views_types_and_sizes_are_gits(tmp_path: Path) -> None:
    """``View.type_of`` and ``size_of`` answer as ``git cat-file --batch-check`` does for
    every object of a history pushed in three layers (thin packs, deltas across layers),
    and None for an object the view lacks; ``contains`` agrees."""
    repo = generate_repo(tmp_path / "r.git", RepoSpec(seed=5, commits=40, files=12))
    view = View(three_pushes(repo))
    objects = all_objects(repo.path)
    assert objects
    for hex_oid, type_name, body in objects:
        held = ObjectId(bytes.fromhex(hex_oid.decode()))
        assert view.type_of(held) == ObjectType.from_name(type_name), hex_oid
        assert view.size_of(held) == len(body), hex_oid
        assert view.contains(held)
    absent = oid(3, b"not in the repository\n")
    assert view.type_of(absent) is None and view.size_of(absent) is None
    assert not view.contains(absent)


# -- what a segment keeps (ingest._Walk.segment) ----------------------------------------------


def test_a_segment_keeps_the_pack_s_own_oid_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit's segment holds the oid objects the oid index holds (one bytes object per
    pack object, however many structures name it: docs/ingest.md, "Memory"), whether
    every member is the pack's (the first push: mapped at C speed) or one is the
    snapshot's (``README`` again under a new name: mapped one by one)."""
    kept: list[tuple[CommitInfo, list[bool]]] = []
    segment = ingest._Walk.segment

    def recorded(walk: ingest._Walk, commit: ObjectId) -> CommitInfo:
        info = segment(walk, commit)  # asked now: the oid index goes before the ingest ends
        indexes = [walk.by_oid.get(m) for m in info.segment]
        own = [i is None or m is walk.keys[i] for m, i in zip(info.segment, indexes, strict=True)]
        kept.append((info, own))
        return info

    monkeypatch.setattr(ingest._Walk, "segment", recorded)
    repo = Repo()
    new = oid(3, b"new\n")
    body = tree((b"100644", b"copy.txt", repo.readme), (b"100644", b"new.txt", new))
    top = commit(oid(2, body), [repo.commit], b"next\n")
    repo.push([(2, body), (1, top), (3, b"new\n")], oid(1, top))
    assert [len(info.segment) for info, _ in kept] == [5, 4]  # the commit, trees, blobs
    assert repo.readme in kept[1][0].segment  # the snapshot's, a member under its new name
    assert [own for _, own in kept] == [[True] * 5, [True] * 4]
