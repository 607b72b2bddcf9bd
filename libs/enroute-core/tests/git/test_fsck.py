"""git/fsck.py: each check named by its git message id (Documentation/fsck-msgids.adoc).

Golden objects written by the real git CLI pass; every corruption of them
gives problems or passes, never another exception.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git import fsck as fsck_module
from enroute_core.git.fsck import (
    SpecialBlob,
    check_object,
    check_special_blob,
    fsck_commit,
    fsck_gitmodules,
    fsck_ident,
    fsck_object,
    fsck_tag,
    fsck_tree,
    special_blobs,
)

IDENT = b"A U Thor <author@example.com> 1700000000 +0100"
BLOB = bytes.fromhex("ce013625030ba8dba906f756967f9e9ca394464a")
TREE_HEX = b"4b825dc642cb6eb9a060e54bf8d69288fbee4904"
OID = ObjectId(bytes(19) + b"\x01")
GITMODULES, GITATTRIBUTES = SpecialBlob.GITMODULES, SpecialBlob.GITATTRIBUTES


def tree(*entries: tuple[bytes, bytes]) -> bytes:
    return b"".join(m + b" " + n + b"\0" + BLOB for m, n in entries)


def commit(*, author: bytes = IDENT, committer: bytes = IDENT, head: bytes = b"") -> bytes:
    return (
        b"tree "
        + TREE_HEX
        + b"\n"
        + head
        + b"author "
        + author
        + b"\ncommitter "
        + committer
        + b"\n\nmessage\n"
    )


def tag(tagger: bytes = IDENT, type_name: bytes = b"commit", name: bytes = b"v1") -> bytes:
    return (
        b"object "
        + TREE_HEX
        + b"\ntype "
        + type_name
        + b"\ntag "
        + name
        + b"\ntagger "
        + tagger
        + b"\n\nmessage\n"
    )


def ids(problems: list) -> list[str]:  # type: ignore[type-arg]
    return [p.msg.value for p in problems]


# -- trees ----------------------------------------------------------------------------------------


def test_good_tree_has_no_problem() -> None:
    body = tree((b"100644", b"a"), (b"100755", b"b"), (b"40000", b"c"), (b"120000", b"d"))
    body += b"160000 e\0" + BLOB
    assert fsck_tree(body) == []


@pytest.mark.parametrize(
    ("entries", "msg"),
    [
        ([(b"100644", b"b"), (b"100644", b"a")], "treeNotSorted"),
        ([(b"40000", b"a"), (b"100644", b"a.c")], "treeNotSorted"),  # a tree sorts as "a/"
        ([(b"100644", b"a"), (b"100644", b"a")], "duplicateEntries"),
        ([(b"100644", b"a"), (b"100644", b"a-b"), (b"40000", b"a")], "duplicateEntries"),
        ([(b"0100644", b"a")], "zeroPaddedFilemode"),
        ([(b"100600", b"a")], "badFilemode"),
        ([(b"100644", b".git")], "hasDotgit"),
        ([(b"100644", b".GiT")], "hasDotgit"),
        ([(b"100644", b"git~1")], "hasDotgit"),
        ([(b"100644", b".git . ")], "hasDotgit"),
        ([(b"40000", b".git::$INDEX_ALLOCATION")], "hasDotgit"),
        ([(b"100644", ".gi\u200dt".encode())], "hasDotgit"),
        ([(b"100644", ".\u200cGIT".encode())], "hasDotgit"),
        ([(b"100644", b"x\\git~1")], "hasDotgit"),
        ([(b"100644", b".")], "hasDot"),
        ([(b"100644", b"..")], "hasDotdot"),
        ([(b"100644", b"a/b")], "fullPathname"),
        ([(b"120000", b".gitmodules")], "gitmodulesSymlink"),
        ([(b"120000", b".GITMODULES. ")], "gitmodulesSymlink"),
        ([(b"120000", b"gitmod~1")], "gitmodulesSymlink"),
        ([(b"100644", b"n" * 4097)], "largePathname"),
    ],
)
def test_tree_check(entries: list[tuple[bytes, bytes]], msg: str) -> None:
    assert msg in ids(fsck_tree(tree(*entries)))


@pytest.mark.parametrize(
    "name", [b".gitx", b"git~2", b"a.git", b".gitignore", b"gi", b"..a", b"git~1x"]
)
def test_names_that_are_not_dotgit(name: bytes) -> None:
    assert fsck_tree(tree((b"100644", name))) == []


def test_null_sha1() -> None:
    assert ids(fsck_tree(b"100644 a\0" + bytes(20))) == ["nullSha1"]


@pytest.mark.parametrize(
    "raw",
    [
        b"100644 \0" + BLOB,
        b"100644 a\0" + BLOB[:5],
        b"10064x a\0" + BLOB,
        b" a\0" + BLOB,
        b"100644a",
        b"100644 a",
    ],
)
def test_bad_tree(raw: bytes) -> None:
    assert ids(fsck_tree(raw)) == ["badTree"]


def test_tree_entries_bounded() -> None:
    body = b"".join(b"100644 %05d\0" % i + BLOB for i in range(11))
    with pytest.raises(LimitExceeded):
        fsck_tree(body, limits=Limits(tree_entries_max=10))


# -- identities and commits -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        (IDENT, None),
        (b"A <a@b> 0 +0000", None),
        (b"<a@b> 1 +0000", "missingNameBeforeEmail"),
        (b"A> <a@b> 1 +0000", "badName"),
        (b"A a@b 1 +0000", "missingEmail"),
        (b"A<a@b> 1 +0000", "missingSpaceBeforeEmail"),
        (b"A <a@b 1 +0000", "badEmail"),
        (b"A <a<b> 1 +0000", "badEmail"),
        (b"A <a@b>1 +0000", "missingSpaceBeforeDate"),
        (b"A <a@b> 01 +0000", "zeroPaddedDate"),
        (b"A <a@b> " + b"9" * 25 + b" +0000", "badDateOverflow"),
        (b"A <a@b> x +0000", "badDate"),
        (b"A <a@b> 1+0000", "badDate"),
        (b"A <a@b> 1 +000", "badTimezone"),
        (b"A <a@b> 1 0000x", "badTimezone"),
        (b"A <a@b> 1 +0000 ", "badTimezone"),
    ],
)
def test_ident(line: bytes, msg: str | None) -> None:
    problem = fsck_ident(line)
    assert (None if problem is None else problem.msg.value) == msg


def test_good_commit() -> None:
    assert fsck_commit(commit()) == []
    assert fsck_commit(commit(head=b"parent " + TREE_HEX + b"\n")) == []
    assert ids(fsck_commit(commit() + b"more\0")) == ["nulInCommit"]


@pytest.mark.parametrize(
    ("body", "msg"),
    [
        (b"author " + IDENT + b"\n\n", "missingTree"),
        (b"tree " + TREE_HEX[:39] + b"\nauthor x\n\n", "badTreeSha1"),
        (b"tree " + TREE_HEX + b"\nparent zz\n\n", "badParentSha1"),
        (b"tree " + TREE_HEX + b"\ncommitter " + IDENT + b"\n\n", "missingAuthor"),
        (commit(head=b"author " + IDENT + b"\n"), "multipleAuthors"),
        (b"tree " + TREE_HEX + b"\nauthor " + IDENT + b"\n\n", "missingCommitter"),
        (commit(committer=b"C <c@d> 1 +01"), "badTimezone"),
        (b"tree " + TREE_HEX + b"\nauthor A\0 <a@b> 1 +0000\n\n", "nulInHeader"),
        (b"tree " + TREE_HEX + b"\nauthor " + IDENT, "unterminatedHeader"),
    ],
)
def test_commit_check(body: bytes, msg: str) -> None:
    assert ids(fsck_commit(body)) == [msg]


# -- tags -------------------------------------------------------------------------------------


def test_good_tag() -> None:
    assert fsck_tag(tag()) == []


@pytest.mark.parametrize(
    ("body", "msg"),
    [
        (b"type commit\ntag v\n\n", "missingObject"),
        (b"object " + TREE_HEX[:-1] + b"\ntype commit\n\n", "badObjectSha1"),
        (b"object " + TREE_HEX + b"\ntag v\n\n", "missingTypeEntry"),
        (b"object " + TREE_HEX + b"\ntype commit", "unterminatedHeader"),
        (tag(type_name=b"commot"), "badType"),
        (b"object " + TREE_HEX + b"\ntype tree\ntagger " + IDENT + b"\n\n", "missingTagEntry"),
        (tag(tagger=b"T 1 +0000"), "missingEmail"),
        (tag(name=b"a..b"), "badTagName"),
        (b"object " + TREE_HEX + b"\ntype tree\ntag v\n\nm\n", "missingTaggerEntry"),
    ],
)
def test_tag_check(body: bytes, msg: str) -> None:
    assert msg in ids(fsck_tag(body))


def test_gitmodules_parse_bytes_are_bounded_per_push() -> None:
    """ingest_gitmodules_bytes_max: only .gitmodules blobs that will be parsed count."""
    limits = Limits(gitmodules_bytes_max=100, ingest_gitmodules_bytes_max=150)
    modules, attributes = SpecialBlob.GITMODULES, SpecialBlob.GITATTRIBUTES
    count = fsck_module.gitmodules_parse_bytes
    assert count(modules, 3, 100, 50, limits) == 100  # 150 in all: at the bound
    assert count(modules, 3, 101, 149, limits) == 0  # gitmodulesLarge, never read
    assert count(modules, 2, 90, 149, limits) == 0  # a tree: gitmodulesBlob
    assert count(attributes, 3, 90, 149, limits) == 0
    with pytest.raises(LimitExceeded, match="push the history in parts") as info:
        count(modules, 3, 1, 150, limits)
    assert info.value.limit == "ingest_gitmodules_bytes_max"


SIGNED_HEAD = tag().split(b"\n\n")[0] + b"\n"
SIGNATURE = b"gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEz\n -----END PGP SIGNATURE-----\n"


@pytest.mark.parametrize("prefix", [b"gpgsig ", b"gpgsig-sha256 "])
def test_signed_tag_headers_are_clean(prefix: bytes) -> None:
    """fsck.c fsck_tag_standalone reads a gpgsig header and its continuation lines."""
    body = SIGNED_HEAD + SIGNATURE.replace(b"gpgsig ", prefix) + b"\nmessage\n"
    assert fsck_tag(body) == []


@pytest.mark.parametrize(
    ("tail", "msg"),
    [
        (b"gpgsig -----BEGIN", "badGpgsig"),
        (b"gpgsig-sha256 x", "badGpgsig"),
        (b"gpgsig x\n iQEz", "badHeaderContinuation"),
        (b"gpgsig x\n a\n b", "badHeaderContinuation"),
    ],
)
def test_truncated_signature_header(tail: bytes, msg: str) -> None:
    """git's checks after the tagger (fsck_tag_standalone, t1450 'tag with bad gpgsig'); a
    whole tag cut there is unterminatedHeader first (verify_headers), in git and here."""
    found = fsck_module._signature_header(SIGNED_HEAD + tail, len(SIGNED_HEAD))
    assert found is not None and found.msg.value == msg
    assert ids(fsck_tag(SIGNED_HEAD + tail)) == ["unterminatedHeader"]
    # a later blank line ends the header: the signature lines are whole again
    assert fsck_module._signature_header(SIGNED_HEAD + tail + b"\n\nm\n", len(SIGNED_HEAD)) is None


# -- policy and check_object --------------------------------------------------------------------


def test_check_object_message_names_the_msg_id() -> None:
    with pytest.raises(InvalidObject) as info:
        check_object(OID, 2, tree((b"100644", b".git")))
    assert info.value.message == (
        f"object {OID.hex()}: hasDotgit: contains '.git' "
        "(refused; receive.fsck.hasDotgit: warn lowers it)"
    )
    assert info.value.details["msg_id"] == "hasDotgit"
    check_object(OID, 2, tree((b"100600", b"a")))  # badFilemode is INFO
    check_object(OID, 3, b"anything at all")  # blobs are not looked into


# -- golden objects from real git, and their corruptions --------------------------------------


def _git(repo: Path, *args: str, input_: bytes | None = None) -> bytes:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "A U Thor",
        "GIT_AUTHOR_EMAIL": "author@example.com",
        "GIT_AUTHOR_DATE": "1700000000 +0100",
        "GIT_COMMITTER_NAME": "C O Mitter",
        "GIT_COMMITTER_EMAIL": "committer@example.com",
        "GIT_COMMITTER_DATE": "1700000001 -0230",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=env, input=input_, capture_output=True, check=True
    ).stdout


def _golden(tmp_path: Path) -> list[tuple[int, bytes]]:
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_bytes(b"a\n")
    (repo / "dir").mkdir()
    (repo / "dir" / "x.sh").write_bytes(b"#!/bin/sh\n")
    (repo / "dir" / "x.sh").chmod(0o755)
    (repo / "link").symlink_to("a.txt")
    (repo / ".gitignore").write_bytes(b"*.o\n")
    _git(repo, "config", "-f", ".gitmodules", "submodule.lib.path", "lib")
    _git(repo, "config", "-f", ".gitmodules", "submodule.lib.url", "https://example.com/l.git")
    _git(repo, "config", "-f", ".gitmodules", "submodule.lib.update", "rebase")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    (repo / "a.txt").write_bytes(b"b\n")
    _git(repo, "commit", "-q", "-am", "two\n\nbody")
    _git(repo, "tag", "-a", "v1", "-m", "release")
    _git(repo, "checkout", "-q", "-b", "side", "HEAD~1")
    (repo / "side.txt").write_bytes(b"s\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "side")
    _git(repo, "checkout", "-q", "-")
    _git(repo, "merge", "-q", "--no-edit", "side")
    listing = _git(repo, "cat-file", "--batch-all-objects", "--batch-check")
    codes = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}
    out = []
    for line in listing.splitlines():
        hex_oid, kind, _ = line.split()
        out.append((codes[kind], _git(repo, "cat-file", kind.decode(), hex_oid.decode())))
    return out


@pytest.mark.interop
def test_golden_objects_from_git_pass_and_corruptions_stay_typed(tmp_path: Path) -> None:
    objects = _golden(tmp_path)
    assert {t for t, _ in objects} == {1, 2, 3, 4}
    gitmodules_seen = False
    for type_num, body in objects:
        assert fsck_object(type_num, body) == [], body[:80]
        if body.startswith(b"[submodule"):
            assert fsck_gitmodules(body) == [], body
            gitmodules_seen = True
        oid = ObjectId(hashlib.sha1(b"x").digest())
        check_object(oid, type_num, body)
    assert gitmodules_seen
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(2**32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    for type_num, body in objects:
        if type_num == 3 and body.startswith(b"[submodule"):
            for cut in range(len(body)):
                fsck_gitmodules(body[:cut])
            for i in range(len(body)):
                for bit in range(8):
                    fsck_gitmodules(body[:i] + bytes([body[i] ^ (1 << bit)]) + body[i + 1 :])
        if type_num == 3:
            continue
        for cut in range(len(body)):
            fsck_object(type_num, body[:cut])
        for _ in range(200):
            i = rng.randrange(len(body))
            broken = body[:i] + bytes([body[i] ^ (1 << rng.randrange(8))]) + body[i + 1 :]
            fsck_object(type_num, broken)
            with contextlib.suppress(InvalidObject):
                check_object(OID, type_num, broken)


# -- the bulk path for usual trees agrees with the entry-by-entry path --------------------------

_NAMES = [
    b"a",
    b"b",
    b"a.c",
    b"a-b",
    b"ab",
    b".",
    b"..",
    b".git",
    b".GIT",
    b"GIT~1",
    b".git. ",
    b".gitignore",
    b".keep",
    b".gitmodules",
    b"gitmod~1",
    ".g\u200cit".encode(),
    b"a\\.git",
    b"x\\y",
    "\u00e9".encode(),
    b"n" * 40,
]
_MODES = [b"40000", b"100644", b"100755", b"120000", b"160000"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_MODES), st.sampled_from(_NAMES), st.booleans()),
        max_size=8,
    ),
    st.booleans(),
)
def test_bulk_path_matches_entry_by_entry(
    entries: list[tuple[bytes, bytes, bool]], sort: bool
) -> None:
    if sort:
        entries = sorted(entries, key=lambda e: e[1] + b"/" if e[0] == b"40000" else e[1])
    body = b"".join(m + b" " + n + b"\0" + (bytes(20) if z else BLOB) for m, n, z in entries)
    limits = Limits(tree_entry_name_bytes_max=32)
    bulk = fsck_module._usual_tree(body, limits)
    assert bulk is not None  # every mode and name here is a usual one
    assert sorted(ids(bulk)) == sorted(ids(fsck_module._tree_by_entry(body, limits)))


# -- .gitmodules --------------------------------------------------------------------------------

GOOD_GITMODULES = b"""[submodule "lib"]
\tpath = lib
\turl = https://example.com/lib.git ; a comment
[submodule "a/b"]
\tpath = "a b"
\turl = ../sibling.git
\tupdate = rebase
\tshallow
# done
"""


def test_good_gitmodules() -> None:
    assert fsck_gitmodules(GOOD_GITMODULES) == []


@pytest.mark.parametrize(
    ("body", "msg"),
    [
        (b'[submodule "../../modules/evil"]\n\tpath = x\n', "gitmodulesName"),
        (b'[submodule "a\\\\..\\\\b"]\n\tpath = x\n', "gitmodulesName"),
        (b'[submodule ".."]\n\tactive\n', "gitmodulesName"),
        (b'[submodule "x"]\n\turl = --upload-pack=touch /tmp/pwned\n', "gitmodulesUrl"),
        (b'[submodule "x"]\n\turl = "-u"\n', "gitmodulesUrl"),
        (b'[submodule "x"]\n\turl = https://a%0a.example.com/\n', "gitmodulesUrl"),
        (b'[submodule "x"]\n\tpath = -x\n', "gitmodulesPath"),
        (b'[SubModule "x"]\n\tUpdate = !rm -rf ~\n', "gitmodulesUpdate"),
        (b'[submodule "x"\n\tpath = y\n', "gitmodulesParse"),
        (b'[submodule "x"]\n\tpath = "y\n', "gitmodulesParse"),
    ],
)
def test_gitmodules_check(body: bytes, msg: str) -> None:
    assert msg in ids(fsck_gitmodules(body))


def test_special_blobs_found_in_trees() -> None:
    body = tree((b"100644", b".gitmodules"), (b"100644", b"models"))
    assert special_blobs(body) == [(GITMODULES, ObjectId(BLOB))]
    hfs = ".gitmod\u200cules".encode()
    assert special_blobs(tree((b"100644", hfs))) == [(GITMODULES, ObjectId(BLOB))]
    assert special_blobs(tree((b"100644", b"GITMOD~1"))) == [(GITMODULES, ObjectId(BLOB))]
    assert special_blobs(tree((b"120000", b".gitmodules"))) == []  # gitmodulesSymlink's job
    assert special_blobs(tree((b"100644", b"a"))) == []


def test_check_gitmodules() -> None:
    def check(type_num: int, body: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
        check_special_blob(GITMODULES, OID, type_num, lambda: body, len(body), limits=limits)

    check(3, GOOD_GITMODULES)
    check(3, b"[broken")  # gitmodulesParse is INFO
    with pytest.raises(InvalidObject, match="gitmodulesBlob"):
        check(2, b"")
    with pytest.raises(InvalidObject, match="gitmodulesName"):
        check(3, b'[submodule "../x"]\n\tpath = x\n')
    check(3, b'[submodule "../x"]\n')  # a name with no variable is never read
    with pytest.raises(InvalidObject, match="gitmodulesLarge"):
        check(3, GOOD_GITMODULES, Limits(gitmodules_bytes_max=10))


# -- .gitattributes (fsck.c fsck_tree's gitattributes_found, fsck_blob; t1450, t0003) -----------

# Spellings git's utf8.c/path.c read as .gitattributes: HFS+ ignorable code points, NTFS
# trailing dots and spaces, an alternate data stream, the 8.3 short names GITATT~1..4 and
# the hashed fallback GI7D29~n (t0060's is_ntfs_dotgitattributes cases).
_ATTRIBUTES_SPELLINGS = [
    b".gitattributes",
    b".GITATTRIBUTES",
    b".gitattributes ",
    b".gitattributes. .",
    b".gitattributes::$DATA",
    b"gitatt~1",
    b"GITATT~4",
    b"gi7d29~1",
    b"GI7D29~12",
    ".gitattri\u200cbutes".encode(),
    "\ufeff.gitattributes".encode(),
]
_NOT_ATTRIBUTES = [
    b"gitattributes",
    b"a.gitattributes",
    b".gitattributesx",
    b"gitatt~5",
    b"gi7d29~",
]


@pytest.mark.parametrize("name", _ATTRIBUTES_SPELLINGS)
def test_gitattributes_spellings_are_collected(name: bytes) -> None:
    assert fsck_module.is_dotgitattributes_name(name)
    assert special_blobs(tree((b"100644", name))) == [(GITATTRIBUTES, ObjectId(BLOB))]
    assert fsck_module.check_tree(OID, tree((b"100644", name))) == [(GITATTRIBUTES, ObjectId(BLOB))]


@pytest.mark.parametrize("name", _NOT_ATTRIBUTES)
def test_other_names_are_not_gitattributes(name: bytes) -> None:
    assert not fsck_module.is_dotgitattributes_name(name)
    assert special_blobs(tree((b"100644", name))) == []


def test_gitattributes_symlink_is_not_read() -> None:
    """git collects no symlink's id (it reports gitattributesSymlink, INFO): the link's
    target is a path, not attributes."""
    assert special_blobs(tree((b"120000", b".gitattributes"))) == []


def test_a_tree_may_name_both_special_files() -> None:
    body = tree((b"100644", b".gitattributes"), (b"100644", b".gitmodules"))
    assert fsck_module.check_tree(OID, body) == [
        (GITATTRIBUTES, ObjectId(BLOB)),
        (GITMODULES, ObjectId(BLOB)),
    ]


def _check_attributes(type_num: int, body: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    check_special_blob(GITATTRIBUTES, OID, type_num, lambda: body, len(body), limits=limits)


def test_gitattributes_blob_is_refused_when_not_a_blob() -> None:
    for type_num in (1, 2, 4):  # commit, tree, tag: t1450 'fsck error on gitattributes ...'
        with pytest.raises(
            InvalidObject, match=r"gitattributesBlob: non-blob found at \.gitattributes"
        ):
            _check_attributes(type_num, b"")


def test_gitattributes_line_length() -> None:
    """t1450 'fsck error on gitattributes with excessive line lengths': ``pattern %02048d``
    is a 2056-byte line; git refuses a line of ATTR_MAX_LINE_LENGTH (2048) bytes or more."""
    _check_attributes(3, b"*.c diff=cpp\n" + b"x" * 2047 + b"\n")
    _check_attributes(3, b"x" * 2047)
    with pytest.raises(InvalidObject, match="gitattributesLineLength"):
        _check_attributes(3, b"pattern " + b"%02048d" % 1)
    with pytest.raises(InvalidObject, match="gitattributesLineLength"):
        _check_attributes(3, b"*.c diff\n" + b"x" * 2048)
    with pytest.raises(InvalidObject, match="gitattributesLineLength"):
        _check_attributes(3, b"a\r\n" + b"x" * 2047 + b"\r\n")  # the CR counts, as in git
    # git reads the blob as a C string: nothing after a NUL is checked
    _check_attributes(3, b"a\0" + b"x" * 4096)


def test_gitattributes_line_length_against_splitting_lines() -> None:
    """The block scan of ``_has_line_of`` against the plain reading (split at the first NUL,
    then at newlines), on random line lengths around the bound."""
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(2**32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    for _ in range(300):
        lines = [b"x" * rng.choice([0, 1, 1023, 1024, 2046, 2047, 2048, 2049, 3000])]
        lines += [b"y" * rng.randrange(2100) for _ in range(rng.randrange(4))]
        body = b"\n".join(lines) + rng.choice([b"", b"\n", b"\0" + b"z" * 2048])
        plain = any(len(line) >= 2048 for line in body.split(b"\0")[0].split(b"\n"))
        found = fsck_module.fsck_gitattributes(body)
        assert bool(found) == plain, (seed, [len(line) for line in lines])


def test_gitattributes_large() -> None:
    """t1450 'fsck error on gitattributes with excessive size': over 100 MiB
    (ATTR_MAX_FILE_SIZE); the body is never read."""
    assert DEFAULT_LIMITS.gitattributes_bytes_max == 100 * 1024 * 1024

    def unread() -> bytes:
        raise AssertionError("read")

    size = 100 * 1024 * 1024 + 1
    with pytest.raises(InvalidObject, match="gitattributesLarge"):
        check_special_blob(GITATTRIBUTES, OID, 3, unread, size)
    with pytest.raises(InvalidObject, match="gitattributesLarge"):
        _check_attributes(3, b"*.c diff\n", Limits(gitattributes_bytes_max=8))
    _check_attributes(3, b"*.c diff\n", Limits(gitattributes_bytes_max=9))


# -- check_tree: fsck and .gitmodules ids from one parse -----------------------------------------


def _both(
    body: bytes, limits: Limits
) -> tuple[str | None, list[tuple[SpecialBlob, ObjectId]] | None]:
    """(refused msg id or None, special blobs) as check_object + special_blobs give them."""
    try:
        check_object(OID, 2, body, limits=limits)
    except InvalidObject as exc:
        return str(exc), None
    return None, special_blobs(body, limits=limits)


def _check_tree(
    body: bytes, limits: Limits
) -> tuple[str | None, list[tuple[SpecialBlob, ObjectId]] | None]:
    try:
        return None, fsck_module.check_tree(OID, body, limits=limits)
    except InvalidObject as exc:
        return str(exc), None


_GITMODULES_NAMES = [
    b".gitmodules",
    b".GITMODULES",
    b"gitmod~1",
    b"GI7EBA~9",
    b".gitmodules. .",
    ".gitmod\u200cules".encode(),
    b"a.gitmodules",
    b"gitmodules",
    b".gitattributes",
    b".GitAttributes",
    b"gitatt~1",
    b"GI7D29~9",
    b".gitattributes. .",
    ".gitattri\u200cbutes".encode(),
    b"a.gitattributes",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*_MODES, b"100664", b"0100644", b"644"]),
            st.sampled_from([*_NAMES, *_GITMODULES_NAMES, b"a/b", b"~x", b"x~"]),
            st.booleans(),
        ),
        max_size=8,
    ),
    st.booleans(),
)
def test_check_tree_matches_check_object_and_special_blobs(
    entries: list[tuple[bytes, bytes, bool]], sort: bool
) -> None:
    if sort:
        entries = sorted(entries, key=lambda e: e[1] + b"/" if e[0] == b"40000" else e[1])
    body = b"".join(m + b" " + n + b"\0" + (bytes(20) if z else BLOB) for m, n, z in entries)
    limits = Limits(tree_entry_name_bytes_max=32)
    assert _check_tree(body, limits) == _both(body, limits)


def test_check_tree_finds_gitmodules_and_refuses_like_check_object() -> None:
    body = tree((b"100644", b".gitmodules"), (b"100644", b"models"))
    assert fsck_module.check_tree(OID, body) == [(GITMODULES, ObjectId(BLOB))]
    assert fsck_module.check_tree(OID, tree((b"100644", "\u00e9".encode()))) == []
    assert fsck_module.check_tree(OID, b"") == []
    for bad in (tree((b"100644", b".git")), tree((b"100644", b"b"), (b"100644", b"a"))):
        with pytest.raises(InvalidObject) as caught:
            fsck_module.check_tree(OID, bad)
        assert _both(bad, DEFAULT_LIMITS) == (str(caught.value), None)


def test_check_tree_corruptions_agree() -> None:
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    good = tree(
        (b"100644", b".gitmodules"), (b"40000", b"dir"), (b"100755", b"run"), (b"120000", b"x~")
    )
    for _ in range(400):
        raw = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] = rng.choice(
                b"./~\\\x00 \x80gG1" + bytes([rng.randrange(256)])
            )
        body = bytes(raw[: rng.randrange(len(raw) + 1)] if rng.random() < 0.2 else raw)
        assert _check_tree(body, DEFAULT_LIMITS) == _both(body, DEFAULT_LIMITS), body


# -- TreeCheckMemo: trees that differ only in ids share their checks ------------------------------


def _with_memo(
    body: bytes, memo: fsck_module.TreeCheckMemo, limits: Limits
) -> tuple[str | None, list[tuple[SpecialBlob, ObjectId]] | None]:
    try:
        return None, fsck_module.check_tree(OID, body, limits=limits, memo=memo)
    except InvalidObject as exc:
        return str(exc), None


def test_memo_answers_as_check_tree_over_related_trees() -> None:
    """Versions of one tree (ids changed, null ids, names or modes changed, bytes flipped,
    prefixes cut) checked with one memo agree with the checks made without one."""
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    limits = Limits(tree_entry_name_bytes_max=12)
    answered: list[bytes] = []

    class Counting(fsck_module.TreeCheckMemo):
        def get(self, skeleton: bytes) -> object:  # type: ignore[override]
            found = super().get(skeleton)
            if found is not None:
                answered.append(skeleton)
            return found

    memo = Counting(1 << 20)
    names = [*_NAMES, *_GITMODULES_NAMES, b"n" * 13, b"a", b"b", b"c"]
    for _ in range(60):
        entries = sorted(
            {rng.choice(names): rng.choice(_MODES) for _ in range(rng.randrange(1, 6))}.items()
        )
        for _ in range(15):
            ids = [
                bytes(20) if rng.random() < 0.1 else rng.randbytes(20) for _ in range(len(entries))
            ]
            raw = bytearray(
                b"".join(m + b" " + n + b"\0" + i for (n, m), i in zip(entries, ids, strict=True))
            )
            if rng.random() < 0.3:
                raw[rng.randrange(len(raw))] = rng.choice(b"\0 ./4" + bytes([rng.randrange(256)]))
            body = bytes(raw[: rng.randrange(len(raw) + 1)] if rng.random() < 0.15 else raw)
            got = _with_memo(body, memo, limits)
            assert got == _check_tree(body, limits) == _both(body, limits), body
    assert len(answered) > 100  # the memo answered many of them


def test_memo_does_not_take_a_cut_tree_for_a_whole_one() -> None:
    """A tree cut inside its last id has the skeleton of the whole tree, but a NUL
    without its 20 bytes: the memo must not answer it."""
    memo = fsck_module.TreeCheckMemo(1 << 20)
    whole = tree((b"100644", b"a"), (b"100644", b"b"))
    assert fsck_module.check_tree(OID, whole, memo=memo) == []
    cut = whole[:-20]
    with pytest.raises(InvalidObject, match="badTree"):
        fsck_module.check_tree(OID, cut, memo=memo)
    null = tree((b"100644", b"a")) + b"100644 b\0" + bytes(20)
    with pytest.raises(InvalidObject, match="nullSha1"):
        fsck_module.check_tree(OID, null, memo=memo)


def test_memo_stays_within_its_bound() -> None:
    """With names the compiled clean test leaves to Python (a '~'), so that the memo
    is asked."""
    memo = fsck_module.TreeCheckMemo(2000)
    for i in range(200):
        fsck_module.check_tree(OID, tree((b"100644", b"f~%d" % i)), memo=memo)
        assert memo._bytes <= 2000
    assert 0 < len(memo._items) < 200
