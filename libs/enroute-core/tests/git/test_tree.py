"""Trees: exact round trip, git's order, git's parser and git fsck's tree checks."""

from __future__ import annotations

import os
import random
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import ZERO_OID, ObjectId, oid_from_hex
from enroute_core.base.limits import Limits
from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.tree import (
    MODE_EXECUTABLE,
    MODE_FILE,
    MODE_GITLINK,
    MODE_SYMLINK,
    MODE_TREE,
    Order,
    Tree,
    TreeEntry,
    TreeProblem,
    canonical_mode,
    check_tree,
    entry_order,
    is_dotgit_name,
    is_gitlink_mode,
    is_sorted,
    tree_sort_key,
)

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))
OID_A = ObjectId(bytes(range(20)))
OID_B = ObjectId(bytes(range(20, 40)))


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


def raw_entry(mode: bytes, name: bytes, oid: bytes) -> bytes:
    return mode + b" " + name + b"\0" + oid


def only_typed_errors(parse: Callable[[bytes], Tree], data: bytes) -> bool:
    """Parse ``data``: either InvalidObject, or a tree that writes back ``data``."""
    try:
        tree = parse(data)
    except InvalidObject:
        return False
    assert tree.serialize() == data
    return True


class Git:
    def __init__(self, tmp_path: Path) -> None:
        from enroute_testing.gitcli import run_git

        self._run = run_git
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.dir = tmp_path / "repo"
        run_git(["init", "-q", str(self.dir)], cwd=tmp_path, home=self.home)

    def __call__(self, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        return self._run(list(args), cwd=self.dir, home=self.home, input=input, check=check)

    def write(self, kind: str, body: bytes, *, literally: bool = False) -> ObjectId:
        extra = ["--literally"] if literally else []
        out = self("hash-object", "-t", kind, "-w", *extra, "--stdin", input=body)
        return oid_from_hex(out.strip())

    def accepts(self, kind: str, body: bytes) -> bool:
        """git's own parser (hash-object's format check) takes ``body``."""
        from enroute_testing.gitcli import GitFailed

        try:
            self("hash-object", "-t", kind, "--stdin", input=body)
        except GitFailed:
            return False
        return True


@pytest.fixture
def git(tmp_path: Path) -> Git:
    return Git(tmp_path)


# --- parsing ---------------------------------------------------------------------


def test_empty_tree() -> None:
    tree = Tree.parse(b"")
    assert tree.entries == ()
    assert object_id(ObjectType.TREE, tree.serialize()) == oid_from_hex(
        "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    )


def test_odd_modes_keep_their_bytes() -> None:
    body = (
        raw_entry(b"100644", b"b", OID_A)
        + raw_entry(b"040000", b"a", OID_B)  # zero-padded and out of order
        + raw_entry(b"100664", b"c", OID_A)
        + raw_entry(b"0000100755", b"d", OID_B)
    )
    tree = Tree.parse(body)
    assert [(e.mode, e.mode_bytes) for e in tree.entries] == [
        (MODE_FILE, b"100644"),
        (MODE_TREE, b"040000"),
        (0o100664, b"100664"),
        (MODE_EXECUTABLE, b"0000100755"),
    ]
    assert tree.serialize() == body
    assert TreeEntry(MODE_TREE, b"a", OID_B).mode_bytes == b"40000"  # git's own form
    assert TreeEntry(MODE_TREE, b"a", OID_B) != tree.entries[1]


@pytest.mark.parametrize(
    "body",
    [
        raw_entry(b"100644", b"", OID_A),  # empty name
        raw_entry(b"", b"a", OID_A),  # empty mode
        raw_entry(b"10064x", b"a", OID_A),
        raw_entry(b"100648", b"a", OID_A),
        raw_entry(b"100644", b"a", OID_A[:19]),  # short oid
        raw_entry(b"100644", b"a", OID_A) + b"x",  # trailing data
        b"100644 a",  # no NUL
        b"100644",  # no space
        b" 100644 a\0" + OID_A,
    ],
)
def test_malformed_trees(body: bytes) -> None:
    with pytest.raises(InvalidObject):
        Tree.parse(body)


def test_entries_limit() -> None:
    body = b"".join(raw_entry(b"100644", b"%d" % i, OID_A) for i in range(5))
    assert len(Tree.parse(body, limits=Limits(tree_entries_max=5)).entries) == 5
    with pytest.raises(LimitExceeded):
        Tree.parse(body, limits=Limits(tree_entries_max=4))


def test_canonical_mode_is_gits_canon_mode() -> None:
    assert canonical_mode(0o100664) == MODE_FILE
    assert canonical_mode(0o100700) == MODE_EXECUTABLE
    assert canonical_mode(0o120777) == MODE_SYMLINK
    assert canonical_mode(0o040755) == MODE_TREE
    assert canonical_mode(0o170000) == MODE_GITLINK
    assert canonical_mode(0) == MODE_GITLINK


@pytest.mark.parametrize(
    ("mode", "gitlink"),
    [(0o160000, True), (0o160644, True), (0o170000, True), (0o010644, True), (0, True),
     (0o100644, False), (0o100664, False), (0o120000, False), (0o040000, False)],
)  # fmt: skip
def test_gitlink_is_what_canon_mode_makes_a_gitlink(mode: int, gitlink: bool) -> None:
    """S_ISGITLINK(canon_mode(mode)): what git's tree walks skip (tree-walk.c)."""
    assert is_gitlink_mode(mode) is gitlink
    assert TreeEntry(mode, b"x", OID_A).is_gitlink is gitlink


# --- order ------------------------------------------------------------------------


def test_directories_sort_as_if_ending_in_slash() -> None:
    d = TreeEntry(MODE_TREE, b"foo", OID_A)
    dash = TreeEntry(MODE_FILE, b"foo-bar", OID_A)
    zero = TreeEntry(MODE_FILE, b"foo0", OID_A)
    assert entry_order(dash, d) is Order.SORTED  # '-' < '/'
    assert entry_order(d, zero) is Order.SORTED  # '/' < '0'
    assert entry_order(d, dash) is Order.UNSORTED
    assert entry_order(d, TreeEntry(MODE_FILE, b"foo", OID_B)) is Order.DUPLICATE
    gitlink = TreeEntry(MODE_GITLINK, b"foo", OID_A)
    assert entry_order(gitlink, dash) is Order.SORTED  # a gitlink sorts as a file
    assert tree_sort_key(b"foo", True) == b"foo/"
    built = Tree.build([zero, d, dash])
    assert [e.name for e in built.entries] == [b"foo-bar", b"foo", b"foo0"]
    assert is_sorted(built.entries)
    with pytest.raises(InvalidObject):
        Tree.build([d, TreeEntry(MODE_FILE, b"foo", OID_B)])


# --- fsck checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dotgit"),
    [
        (b".git", True),
        (b".GiT", True),
        (b"git~1", True),
        (b"GIT~1", True),
        (b".git.", True),
        (b".git . .", True),
        (b".git::$INDEX_ALLOCATION", True),
        (b"a\\.git", True),
        (b"a\\GIT~1\\b", True),
        (".g\u200cit".encode(), True),  # HFS+ ignores zero-width joiners
        (".git\ufeff".encode(), True),
        (b".git\xff", True),  # HFS+: a bad byte ends the name
        (b".gitx", False),
        (b"git~2", False),
        (b"git", False),
        (b".gi", False),
        (b"x.git", False),
        (".gi\u0074\u0301".encode(), False),
    ],
)
def test_dotgit_names(name: bytes, dotgit: bool) -> None:
    assert is_dotgit_name(name) is dotgit


def test_check_tree_reports_each_problem() -> None:
    e = TreeEntry
    tree = Tree(
        (
            e(MODE_FILE, b"b", OID_A),
            e(MODE_FILE, b"a", ZERO_OID),  # unsorted, null
            e(MODE_FILE, b"", OID_A),
            e(MODE_FILE, b"x/y", OID_A),
            e(MODE_TREE, b".", OID_A),
            e(MODE_TREE, b"..", OID_A),
            e(MODE_TREE, b".Git", OID_A),
            e(MODE_FILE, b"z", OID_A, b"0100644"),
            e(0o100600, b"z1", OID_A),
            e(MODE_FILE, b"b", OID_A),  # a duplicate far from its twin
        )
    )
    assert check_tree(tree) == tuple(TreeProblem)
    assert [p for p in TreeProblem if p.is_error] == [
        TreeProblem.DUPLICATE_ENTRIES,
        TreeProblem.TREE_NOT_SORTED,
    ]
    legacy = Tree((e(0o100664, b"a", OID_A),))
    assert check_tree(legacy) == ()
    assert check_tree(legacy, strict=True) == (TreeProblem.BAD_FILEMODE,)


# --- golden vectors and differential tests against git ------------------------------


@pytest.mark.interop
def test_all_modes_from_git(git: Git) -> None:
    blob = git.write("blob", b"hello\n")
    sub = git.write("tree", raw_entry(b"100644", b"inner", blob))
    index = [
        f"100644,{blob.hex()},file",
        f"100755,{blob.hex()},exec.sh",
        f"120000,{blob.hex()},link",
        f"160000,{'1' * 40},module",
        f"100644,{blob.hex()},dir/inner",
        f"100644,{blob.hex()},dir-",
        f"100644,{blob.hex()},dir0",
    ]
    for info in index:
        git("update-index", "--add", "--cacheinfo", info)
    oid = oid_from_hex(git("write-tree").strip())
    body = git("cat-file", "tree", oid.hex())
    tree = Tree.parse(body)
    assert tree.serialize() == body
    assert object_id(ObjectType.TREE, body) == oid
    assert Tree.build(tree.entries) == tree  # git wrote it in our order
    assert [e.name for e in tree.entries] == [
        b"dir-",
        b"dir",
        b"dir0",
        b"exec.sh",
        b"file",
        b"link",
        b"module",
    ]
    modes = {e.mode_bytes for e in tree.entries}
    assert modes == {b"100644", b"100755", b"120000", b"160000", b"40000"}
    assert tree.entries[1].oid == sub
    assert check_tree(tree) == ()
    assert is_sorted(tree.entries)


@pytest.mark.interop
def test_legacy_tree_is_stored_and_hashed_as_is(git: Git) -> None:
    blob = git.write("blob", b"x")
    sub = git.write("tree", raw_entry(b"100644", b"f", blob))
    body = (
        raw_entry(b"100664", b"zz", blob)
        + raw_entry(b"040000", b"dir", sub)
        + raw_entry(b"100644", b"a", blob)
    )
    oid = git.write("tree", body, literally=True)
    assert git("cat-file", "tree", oid.hex()) == body
    tree = Tree.parse(body)
    assert object_id(ObjectType.TREE, tree.serialize()) == oid
    assert check_tree(tree) == (TreeProblem.ZERO_PADDED_FILEMODE, TreeProblem.TREE_NOT_SORTED)


@pytest.mark.interop
def test_build_matches_git_mktree(git: Git) -> None:
    blob = git.write("blob", b"content\n")
    sub = git.write("tree", raw_entry(b"100644", b"f", blob))
    dirs = [b"a", b"b", b"foo", b"\xc3\xa9"]
    files = [
        b"a-b",
        b"a.b",
        b"a0",
        b"b-",
        b"b0",
        b"foo.txt",
        b"foo-bar",
        b"foo0",
        b"A",
        b"\xc3\xa9t\xc3\xa9",
        b"~",
        b"a b",
        b"_",
        b"\xc3\xa9-",
        b"\xc3\xa90",
    ]
    entries = [TreeEntry(MODE_TREE, d, sub) for d in dirs]
    entries += [TreeEntry(MODE_FILE, f, blob) for f in files]
    random.Random(SEED).shuffle(entries)
    lines = b"".join(
        e.mode_bytes
        + (b" tree " if e.is_tree else b" blob ")
        + e.oid.hex().encode()
        + b"\t"
        + e.name
        + b"\0"
        for e in entries
    )
    oid = oid_from_hex(git("mktree", "-z", input=lines).strip())
    built = Tree.build(entries)
    assert object_id(ObjectType.TREE, built.serialize()) == oid
    assert git("cat-file", "tree", oid.hex()) == built.serialize()


def _fsck_corpus(blob: ObjectId, sub: ObjectId) -> list[list[tuple[bytes, bytes, bytes]]]:
    b, t = blob, sub
    return [
        [(b"100644", b"a", b), (b"40000", b"d", t)],
        [(b"100644", b"b", b), (b"100644", b"a", b)],
        [(b"100644", b"a", b), (b"100644", b"a", b)],
        [(b"100644", b"foo", b), (b"100644", b"foo.bar", b), (b"40000", b"foo", t)],
        [(b"100644", b"foo", b), (b"100644", b"foo.bar", b), (b"40000", b"foo.bar", t)],
        [(b"40000", b"a", t), (b"100644", b"a-", b)],
        [(b"100644", b"a-", b), (b"40000", b"a", t)],
        [(b"160000", b"sub", b), (b"100644", b"sub-", b)],
        [(b"40000", b".", t)],
        [(b"40000", b"..", t)],
        [(b"40000", b".git", t)],
        [(b"100644", b".GIT", b)],
        [(b"100644", b"git~1", b)],
        [(b"100644", b".git. ", b)],
        [(b"100644", b".git::$INDEX_ALLOCATION", b)],
        [(b"100644", b"a\\.git", b)],
        [(b"100644", ".g\u200cit".encode(), b)],
        [(b"100644", b".git\xff", b)],
        [(b"100644", b".gitx", b)],
        [(b"100644", b"git~2", b)],
        [(b"0100644", b"a", b)],
        [(b"040000", b"d", t)],
        [(b"100664", b"a", b)],
        [(b"100600", b"a", b)],
        [(b"0", b"a", b)],
        [(b"100644", b"a", ZERO_OID)],
        [(b"100644", b"a/b", b)],
        [(b"120000", b"l", b), (b"100755", b"x", b), (b"160000", b"z", b)],
        [(b"100644", b"b", b), (b"100644", b"c", b), (b"100644", b"b", b)],
    ]


_FSCK_LINE = re.compile(rb"^(?:error|warning) in tree ([0-9a-f]{40}): (\w+): ", re.M)


@pytest.mark.interop
@pytest.mark.parametrize("strict", [False, True])
def test_check_tree_agrees_with_git_fsck(git: Git, strict: bool) -> None:
    blob = git.write("blob", b"x")
    sub = git.write("tree", raw_entry(b"100644", b"f", blob))
    ours: dict[str, set[str]] = {}
    sorted_oids = set()
    for case in _fsck_corpus(blob, sub):
        body = b"".join(raw_entry(*e) for e in case)
        oid = git.write("tree", body, literally=True).hex()
        problems = check_tree(Tree.parse(body), strict=strict)
        ours[oid] = {p.value for p in problems}
        if TreeProblem.TREE_NOT_SORTED not in problems:
            sorted_oids.add(oid)
    report = _fsck_report(git, strict)
    theirs = {oid: set() for oid in ours}
    for m in _FSCK_LINE.finditer(report):
        theirs.setdefault(m.group(1).decode(), set()).add(m.group(2).decode())
    assert set(theirs) == set(ours)
    assert any(theirs.values())
    for oid, found in ours.items():
        if oid in sorted_oids:
            assert found == theirs[oid], oid
        else:
            # fsck finds duplicates only where a sorted tree would hold them
            assert theirs[oid] <= found and found - theirs[oid] <= {"duplicateEntries"}, oid


def _fsck_report(git: Git, strict: bool) -> bytes:
    import subprocess

    from enroute_testing.gitcli import git_env

    args = ["git", "fsck", "--no-dangling", *(["--strict"] if strict else [])]
    done = subprocess.run(
        args, cwd=git.dir, env=git_env(git.home), capture_output=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


@pytest.mark.interop
def test_parser_refuses_what_git_refuses(git: Git) -> None:
    cases = [
        b"",
        raw_entry(b"100644", b"a", OID_A),
        raw_entry(b"100644", b"", OID_A),
        raw_entry(b"", b"a", OID_A),
        raw_entry(b"10064x", b"a", OID_A),
        raw_entry(b"8", b"a", OID_A),
        raw_entry(b"0", b"a", OID_A),
        raw_entry(b"7777777777777777777777", b"a", OID_A),
        raw_entry(b"100644", b"a b/c\xff", OID_A),
        raw_entry(b"100644", b"a", OID_A[:19]),
        raw_entry(b"100644", b"a", OID_A) + b"x",
        raw_entry(b"100644", b"a", OID_A) + b"100644 b\0",
        b"100644 a",
        b"100644",
        b" 100644 a\0" + OID_A,
        raw_entry(b"100644", b"a", b"\0" * 20) + raw_entry(b"100644", b"b", OID_B),
    ]
    for body in cases:
        ok = only_typed_errors(Tree.parse, body)
        assert ok == git.accepts("tree", body), body


# --- properties and corruption ----------------------------------------------------

mode_bytes = st.one_of(
    st.sampled_from(
        [
            b"100644",
            b"100755",
            b"40000",
            b"040000",
            b"120000",
            b"160000",
            b"100664",
            b"0",
            b"00000100644",
        ]
    ),
    st.text("01234567", min_size=1, max_size=12).map(str.encode),
)
names = st.binary(min_size=1, max_size=24).map(lambda b: b.replace(b"\0", b"_"))
entries = st.lists(st.tuples(mode_bytes, names, st.binary(min_size=20, max_size=20)), max_size=12)


@hypothesis_seed(SEED)
@given(entries)
def test_any_entries_round_trip(raw: list[tuple[bytes, bytes, bytes]]) -> None:
    body = b"".join(raw_entry(*e) for e in raw)
    tree = Tree.parse(body)
    assert [(e.mode_bytes, e.name, e.oid) for e in tree.entries] == raw
    assert tree.serialize() == body
    assert Tree.parse(tree.serialize()) == tree


@hypothesis_seed(SEED)
@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_invalid_object(data: bytes) -> None:
    only_typed_errors(Tree.parse, data)
    only_typed_errors(Tree.parse, raw_entry(b"100644", b"a", OID_A) + data)


@hypothesis_seed(SEED)
@given(entries)
def test_build_gives_a_tree_fsck_calls_sorted(raw: list[tuple[bytes, bytes, bytes]]) -> None:
    unique = {name: (mode, oid) for mode, name, oid in raw}
    tree = Tree.build(TreeEntry(int(m, 8), n, ObjectId(o)) for n, (m, o) in unique.items())
    assert is_sorted(tree.entries)
    problems = check_tree(tree)
    assert TreeProblem.TREE_NOT_SORTED not in problems
    assert TreeProblem.DUPLICATE_ENTRIES not in problems
    # git's own form has no leading zero; only mode 0 is written as "0"
    zero = any(e.mode == 0 for e in tree.entries)
    assert (TreeProblem.ZERO_PADDED_FILEMODE in problems) == zero


GOOD = (
    raw_entry(b"100644", b".gitignore", OID_A)
    + raw_entry(b"40000", b"src", OID_B)
    + raw_entry(b"100755", b"run.sh", OID_A)
    + raw_entry(b"120000", b"link", OID_B)
)


def test_every_prefix_parses_or_raises() -> None:
    boundaries = {0}
    for e in Tree.parse(GOOD).entries:
        boundaries.add(max(boundaries) + len(e.encode()))
    for n in range(len(GOOD) + 1):
        assert only_typed_errors(Tree.parse, GOOD[:n]) == (n in boundaries), n


def test_every_byte_flip_parses_or_raises() -> None:
    refused = 0
    for i in range(len(GOOD)):
        for x in (0x01, 0x20, 0x80, 0xFF):
            bad = bytearray(GOOD)
            bad[i] ^= x
            refused += not only_typed_errors(Tree.parse, bytes(bad))
    assert refused > 0
