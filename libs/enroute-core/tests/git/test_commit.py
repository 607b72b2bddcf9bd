"""Commits: byte-exact round trip, git's parse rules, identities as git reads them."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.base.limits import Limits
from enroute_core.git.commit import Commit, Header, Identity, split_headers
from enroute_core.git.objects import ObjectType, object_id

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))
TREE_HEX = b"4b825dc642cb6eb9a060e54bf8d69288fbee4904"
P1 = b"1111111111111111111111111111111111111111"
P2 = b"2222222222222222222222222222222222222222"
IDENT = b"A U Thor <author@example.com> 1700000000 +0000"


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


def commit_bytes(
    *lines: bytes, message: bytes | None = b"message\n", tree: bytes = TREE_HEX
) -> bytes:
    head = b"tree " + tree + b"\n" + b"".join(line + b"\n" for line in lines)
    return head if message is None else head + b"\n" + message


def round_trips(data: bytes) -> bool:
    """Parse ``data``: either InvalidObject, or a commit that writes back ``data``."""
    try:
        commit = Commit.parse(data)
    except InvalidObject:
        return False
    assert commit.serialize() == data
    assert len(commit.tree) == 20 and all(len(p) == 20 for p in commit.parents)
    for accessor in ("author", "committer", "encoding", "extra_headers"):
        # a malformed identity is refused only when it is read
        with contextlib.suppress(InvalidObject):
            getattr(commit, accessor)
    return True


SIGNATURE = (
    b"gpgsig -----BEGIN PGP SIGNATURE-----\n"
    b" \n"
    b" iQEzBAABCAAdFiEEXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX\n"
    b" =AbCd\n"
    b" -----END PGP SIGNATURE-----"
)
MERGETAG = (
    b"mergetag object " + P2 + b"\n"
    b" type commit\n"
    b" tag v1.0\n"
    b" tagger T Agger <t@example.com> 1700000000 +0100\n"
    b" \n"
    b" Release 1.0\n"
    b" -----BEGIN PGP SIGNATURE-----\n"
    b" \n"
    b" abc=\n"
    b" -----END PGP SIGNATURE-----"
)

# Odd but valid commits: git's parser takes each, so each must come back byte for byte.
ODD: dict[str, bytes] = {
    "plain": commit_bytes(b"author " + IDENT, b"committer " + IDENT),
    "merge": commit_bytes(
        b"parent " + P1, b"parent " + P2, b"author " + IDENT, b"committer " + IDENT
    ),
    "gpgsig": commit_bytes(b"author " + IDENT, b"committer " + IDENT, SIGNATURE),
    "gpgsig_both": commit_bytes(
        b"author " + IDENT,
        b"committer " + IDENT,
        SIGNATURE,
        SIGNATURE.replace(b"gpgsig ", b"gpgsig-sha256 ", 1),
    ),
    "mergetag": commit_bytes(
        b"parent " + P1, b"parent " + P2, b"author " + IDENT, b"committer " + IDENT, MERGETAG
    ),
    "encoding": commit_bytes(
        b"author " + IDENT, b"committer " + IDENT, b"encoding ISO-8859-1", message=b"caf\xe9\n"
    ),
    "unknown_between": commit_bytes(b"author " + IDENT, b"x-custom one two", b"committer " + IDENT),
    "reordered": commit_bytes(b"committer " + IDENT, b"author " + IDENT),
    "no_separator": commit_bytes(b"author " + IDENT, b"committer " + IDENT, message=None),
    "empty_message": commit_bytes(b"author " + IDENT, b"committer " + IDENT, message=b""),
    "no_final_newline": commit_bytes(
        b"author " + IDENT, b"committer " + IDENT, message=b"no newline"
    ),
    "odd_spacing": commit_bytes(
        b"author   Spaced \t Name   <a@x>   1700000000    -0130  ",
        b"committer <only@email.example>",
    ),
    "no_date": commit_bytes(b"author Name <a@x>", b"committer Name <c@x> notadate"),
    "malformed_identity": commit_bytes(b"author Broken a@x 12 +0000", b"committer " + IDENT),
    "keyword_only": commit_bytes(b"author " + IDENT, b"weird", b"committer " + IDENT),
    "empty_value": commit_bytes(b"author " + IDENT, b"committer " + IDENT, b"x-empty "),
    "unterminated_header": (commit_bytes(b"author " + IDENT, message=None) + b"committer " + IDENT),
    "upper_tree": commit_bytes(b"author " + IDENT, b"committer " + IDENT, tree=TREE_HEX.upper()),
    "crlf_and_nul": commit_bytes(
        b"author " + IDENT, b"committer " + IDENT, message=b"line\r\n\0binary\r\n"
    ),
    "octopus": commit_bytes(
        *[b"parent " + bytes([48 + i]) * 40 for i in range(1, 6)],
        b"author " + IDENT,
        b"committer " + IDENT,
    ),
    "late_parent": commit_bytes(b"author " + IDENT, b"parent " + P1, b"committer " + IDENT),
    "continued_parent": commit_bytes(
        b"parent " + P1, b" continued", b"parent " + P2, b"author " + IDENT
    ),
    "blank_continuation": commit_bytes(
        b"author " + IDENT, b"x-multi a", b" ", b" b", b"committer " + IDENT
    ),
    "message_with_headers": commit_bytes(
        b"author " + IDENT, b"committer " + IDENT, message=b"tree x\nparent y\n\n\n"
    ),
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_commits_round_trip(name: str) -> None:
    data = ODD[name]
    commit = Commit.parse(data)
    assert commit.serialize() == data
    assert commit.tree == oid_from_hex(TREE_HEX.lower())


def test_typed_accessors() -> None:
    c = Commit.parse(ODD["mergetag"])
    assert c.parents == (oid_from_hex(P1), oid_from_hex(P2))
    assert c.author == Identity(b"A U Thor", b"author@example.com", 1700000000, b"+0000")
    assert c.message == b"message\n"
    [extra] = c.extra_headers
    assert extra.key == b"mergetag"
    assert extra.value.startswith(b"object " + P2 + b"\ntype commit\n")
    assert b"\n\nRelease 1.0\n" in extra.value  # the " " line is an empty line of the tag

    sig = Commit.parse(ODD["gpgsig"])
    assert sig.header(b"gpgsig") == (
        b"-----BEGIN PGP SIGNATURE-----\n\n"
        b"iQEzBAABCAAdFiEEXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
        b"\n=AbCd\n-----END PGP SIGNATURE-----"
    )
    assert sig.without_headers(b"gpgsig").serialize() == ODD["plain"]
    assert Commit.parse(ODD["encoding"]).encoding == b"ISO-8859-1"
    assert Commit.parse(ODD["no_separator"]).message is None
    assert Commit.parse(ODD["empty_message"]).message == b""
    assert Commit.parse(ODD["late_parent"]).parents == ()
    assert Commit.parse(ODD["continued_parent"]).parents == (oid_from_hex(P1),)
    assert Commit.parse(ODD["octopus"]).parents[4] == ObjectId(b"\x55" * 20)
    odd = Commit.parse(ODD["odd_spacing"])
    assert odd.author == Identity(b"  Spaced \t Name", b"a@x", 1700000000, b"-0130")
    assert odd.committer == Identity(b"", b"only@email.example")
    with pytest.raises(InvalidObject):
        _ = Commit.parse(ODD["malformed_identity"]).author
    assert Commit.parse(ODD["keyword_only"]).headers[2] == Header(b"weird", b"", spaced=False)


def test_create_writes_what_git_writes() -> None:
    author = Identity(b"A U Thor", b"author@example.com", 1700000000, b"+0000")
    c = Commit.create(
        tree=oid_from_hex(TREE_HEX),
        parents=[oid_from_hex(P1), oid_from_hex(P2)],
        author=author,
        committer=author,
        message=b"message\n",
    )
    assert c.serialize() == ODD["merge"]
    with pytest.raises(InvalidObject):
        Identity(b"a<b", b"x").serialize()
    with pytest.raises(InvalidObject):
        Identity(b"a", b"x", 5, None).serialize()


def test_identity_parse_follows_split_ident_line() -> None:
    p = Identity.parse
    assert p(b"N <e> 00017 +0200") == Identity(b"N", b"e", 17, b"+0200")
    assert p(b"N <e> 9" * 1 + b"9" * 5000 + b" +0000").timestamp == 2**64 - 1
    assert p(b"N <e<x> 5 +0000") == Identity(b"N", b"e<x", 5, b"+0000")
    assert p(b"N <e> junk> 5 -0700") == Identity(b"N", b"e", 5, b"-0700")  # date after last '>'
    assert p(b"N <e> 5") == Identity(b"N", b"e")  # no zone: no date at all
    assert p(b"N <e>5+1") == Identity(b"N", b"e", 5, b"+1")
    for bad in (b"N e 5 +0000", b"N <e 5 +0000", b""):
        with pytest.raises(InvalidObject):
            p(bad)


def test_parents_limit() -> None:
    data = ODD["octopus"]
    assert len(Commit.parse(data, limits=Limits(commit_parents_max=5)).parents) == 5
    with pytest.raises(LimitExceeded):
        Commit.parse(data, limits=Limits(commit_parents_max=4))


# --- against git ----------------------------------------------------------------


class Git:
    def __init__(self, tmp_path: Path) -> None:
        from enroute_testing.gitcli import run_git

        self._run = run_git
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.dir = tmp_path / "repo"
        run_git(["init", "-q", str(self.dir)], cwd=tmp_path, home=self.home)

    def __call__(self, *args: str, input: bytes | None = None) -> bytes:
        return self._run(list(args), cwd=self.dir, home=self.home, input=input)

    def hash(self, kind: str, body: bytes, *write: str) -> ObjectId | None:
        """The id git gives ``body``, or None when git's parser refuses it."""
        from enroute_testing.gitcli import GitFailed

        try:
            out = self("hash-object", "-t", kind, *write, "--stdin", input=body)
        except GitFailed:
            return None
        return oid_from_hex(out.strip())


@pytest.fixture
def git(tmp_path: Path) -> Git:
    return Git(tmp_path)


@pytest.mark.interop
def test_commits_made_by_git(git: Git) -> None:
    tree = git("write-tree").strip().decode()
    root = git("commit-tree", tree, "-m", "root").strip().decode()
    root2 = git("commit-tree", tree, "-m", "root 2").strip().decode()
    merge = git("commit-tree", tree, "-p", root, "-p", root2, "-m", "merge").strip().decode()
    latin = (
        git(
            "-c",
            "i18n.commitEncoding=ISO-8859-1",
            "commit-tree",
            tree,
            "-F",
            "-",
            input=b"caf\xe9\n\nbody\n",
        )
        .strip()
        .decode()
    )
    for oid in (root, merge, latin):
        body = git("cat-file", "commit", oid)
        commit = Commit.parse(body)
        assert commit.serialize() == body
        assert object_id(ObjectType.COMMIT, body) == oid_from_hex(oid)
        assert commit.tree == oid_from_hex(tree)
    parents = (oid_from_hex(root), oid_from_hex(root2))
    assert Commit.parse(git("cat-file", "commit", merge)).parents == parents
    assert Commit.parse(git("cat-file", "commit", latin)).encoding == b"ISO-8859-1"


_FORMAT = "%T%x00%P%x00%an%x00%ae%x00%at%x00%cn%x00%ce%x00%ct%x00%e"


@pytest.mark.interop
def test_odd_commits_are_stored_and_read_as_git_does(git: Git) -> None:
    git("hash-object", "-t", "tree", "-w", "--stdin", input=b"")
    for name, data in ODD.items():
        oid = git.hash("commit", data, "-w")
        assert oid is not None, name  # git's parser takes every odd commit
        assert oid == object_id(ObjectType.COMMIT, data), name
        assert git("cat-file", "commit", oid.hex()) == data, name
        if name == "malformed_identity":
            continue
        theirs = git("log", "--no-walk", "--encoding=none", f"--format={_FORMAT}", oid.hex())
        c = Commit.parse(data)
        ours = [c.tree.hex().encode(), b" ".join(p.hex().encode() for p in c.parents)]
        for ident in (c.author, c.committer):
            if ident is None:
                ours += [b"", b"", b""]
            else:
                ts = b"" if ident.timestamp is None else b"%d" % ident.timestamp
                ours += [ident.name, ident.email, ts]
        ours.append(c.encoding or b"")
        assert theirs.rstrip(b"\n").split(b"\0") == ours, name


def _accept_cases() -> list[bytes]:
    t = b"tree " + TREE_HEX + b"\n"
    return [
        b"",
        t,  # git wants a byte after the tree line
        t + b"x",
        t + b"\n",
        t[:-1],
        b"tree " + TREE_HEX + b" \nx",
        b"tree " + TREE_HEX[:39] + b"g\nx",
        b"tree " + TREE_HEX[:39] + b"\nxx",
        b"Tree " + TREE_HEX + b"\nx",
        b"\n" + t + b"x",
        b" " + t + b"x",
        t + b"parent " + P1 + b"\n",  # 48 bytes left: git refuses
        t + b"parent " + P1,  # 47 bytes left: not a parent line at all
        t + b"parent " + P1 + b"\nx",
        t + b"parent " + P1 + b"x\nx",
        t + b"parent abc\n",
        t + b"parent abc\n" + b"y" * 40,
        t + b"parent  " + P1 + b"\nx",
        t + b"parent\n" + b"y" * 60,
        t + b"parent " + P1.upper() + b"\nx",
        t + b"parent " + P1 + b"\n continued\nparent zz\n" + b"y" * 60,
        t + b"parent " + P1 + b"\nparent " + P2 + b"\n",
        t + b"author x\nparent nothex\n" + b"y" * 60,
        t + b" continued tree\n",
    ]


@pytest.mark.interop
def test_parser_refuses_exactly_what_git_refuses(git: Git) -> None:
    verdicts = []
    for data in _accept_cases():
        theirs = git.hash("commit", data) is not None
        assert round_trips(data) == theirs, data
        verdicts.append(theirs)
    assert any(verdicts) and not all(verdicts)


# --- properties and corruption ----------------------------------------------------

keys = st.one_of(
    st.sampled_from([b"author", b"committer", b"encoding", b"gpgsig", b"mergetag", b"x"]),
    st.binary(min_size=1, max_size=8).filter(
        lambda k: b" " not in k and b"\n" not in k and k != b"parent"
    ),
)
values = st.binary(max_size=40)
headers = st.builds(
    lambda k, v, spaced: Header(k, v if spaced else (b"\n" + v if v else b""), spaced),
    keys,
    values,
    st.booleans(),
)


@st.composite
def commits(draw: st.DrawFn) -> Commit:
    tree = Header(b"tree", draw(st.sampled_from([TREE_HEX, TREE_HEX.upper()])))
    parents = [
        Header(b"parent", draw(st.sampled_from([P1, P2]))) for _ in range(draw(st.integers(0, 3)))
    ]
    rest = draw(st.lists(headers, max_size=6))
    message = draw(st.one_of(st.none(), st.binary(max_size=60)))
    header_newline = True if message is not None else draw(st.booleans())
    hs = (tree, *parents, *rest)
    if not rest and message is None:
        # a commit may not end in its tree line or (with LF) in a parent line
        hs = (*hs, Header(b"author", IDENT))
    return Commit(hs, message, header_newline)


@hypothesis_seed(SEED)
@given(commits())
def test_any_commit_round_trips(commit: Commit) -> None:
    data = commit.serialize()
    back = Commit.parse(data)
    assert back == commit
    assert back.serialize() == data
    assert split_headers(data) == (commit.headers, commit.message, commit.header_newline)


@hypothesis_seed(SEED)
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_invalid_object(data: bytes) -> None:
    round_trips(data)
    round_trips(b"tree " + TREE_HEX + b"\n" + data)
    round_trips(b"tree " + TREE_HEX + b"\nparent " + data)


@pytest.mark.parametrize("name", ["gpgsig", "mergetag", "unterminated_header", "odd_spacing"])
def test_every_prefix_and_byte_flip_parses_or_raises(name: str) -> None:
    good = ODD[name]
    refused = 0
    for n in range(len(good)):
        refused += not round_trips(good[:n])
    for i in range(len(good)):
        for x in (0x01, 0x20, 0x0A ^ 0x20, 0xFF):
            bad = bytearray(good)
            bad[i] ^= x
            refused += not round_trips(bytes(bad))
    assert refused > 0
