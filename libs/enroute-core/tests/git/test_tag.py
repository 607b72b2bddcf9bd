"""Annotated tags: byte-exact round trip and git's parse rules (tag.c, parse_tag_buffer)."""

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

from enroute_core.base.errors import InvalidObject
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.git.commit import Header, Identity
from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.tag import Tag

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))
OBJ = b"1111111111111111111111111111111111111111"
TAGGER = b"T Agger <t@example.com> 1700000000 +0100"
PGP = (
    b"-----BEGIN PGP SIGNATURE-----\n\n"
    b"iQEzBAABCAAdFiEEXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX\n"
    b"=AbCd\n-----END PGP SIGNATURE-----\n"
)


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


def tag_bytes(
    *lines: bytes, message: bytes | None = b"release\n", obj: bytes = OBJ, kind: bytes = b"commit"
) -> bytes:
    head = b"object " + obj + b"\ntype " + kind + b"\n" + b"".join(ln + b"\n" for ln in lines)
    return head if message is None else head + b"\n" + message


def round_trips(data: bytes) -> bool:
    """Parse ``data``: either InvalidObject, or a tag that writes back ``data``."""
    try:
        tag = Tag.parse(data)
    except InvalidObject:
        return False
    assert tag.serialize() == data
    assert len(tag.object) == 20 and isinstance(tag.object_type, ObjectType)
    assert isinstance(tag.name, bytes)
    with contextlib.suppress(InvalidObject):  # a bad tagger is refused only when read
        _ = tag.tagger
    return True


ODD: dict[str, bytes] = {
    "plain": tag_bytes(b"tag v1.0", b"tagger " + TAGGER),
    "no_tagger": tag_bytes(b"tag v0.99", message=b"Old style tag\n"),
    "signed": tag_bytes(b"tag v2.0", b"tagger " + TAGGER, message=b"Release 2.0\n" + PGP),
    "extra_header": tag_bytes(
        b"tag v3",
        b"tagger " + TAGGER,
        b"gpgsig-sha256 -----BEGIN PGP SIGNATURE-----",
        b" ",
        b" abc=",
        b" -----END PGP SIGNATURE-----",
    ),
    "no_separator": tag_bytes(b"tag v4", b"tagger " + TAGGER, message=None),
    "empty_message": tag_bytes(b"tag v5", b"tagger " + TAGGER, message=b""),
    "odd_name": tag_bytes(b"tag with spaces \xff and\ttab", b"tagger " + TAGGER),
    "empty_name": tag_bytes(b"tag ", b"tagger " + TAGGER),
    "malformed_tagger": tag_bytes(b"tag v6", b"tagger nobody at all"),
    "header_before_tagger": tag_bytes(b"tag v7", b"x-foo bar", b"tagger " + TAGGER),
    "upper_object": tag_bytes(b"tag v8", b"tagger " + TAGGER, obj=OBJ.replace(b"1", b"A")),
    "of_tree": tag_bytes(b"tag t", b"tagger " + TAGGER, kind=b"tree"),
    "of_blob": tag_bytes(b"tag b", b"tagger " + TAGGER, kind=b"blob"),
    "of_tag": tag_bytes(b"tag n", b"tagger " + TAGGER, kind=b"tag"),
    "unterminated": tag_bytes(b"tag v9", message=None) + b"tagger " + TAGGER,
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_tags_round_trip(name: str) -> None:
    data = ODD[name]
    assert Tag.parse(data).serialize() == data


def test_typed_accessors() -> None:
    t = Tag.parse(ODD["signed"])
    assert t.object == oid_from_hex(OBJ)
    assert t.object_type is ObjectType.COMMIT
    assert t.name == b"v2.0"
    assert t.tagger == Identity(b"T Agger", b"t@example.com", 1700000000, b"+0100")
    assert t.message is not None and t.message.endswith(PGP)  # the signature stays in place
    assert Tag.parse(ODD["no_tagger"]).tagger is None
    assert Tag.parse(ODD["header_before_tagger"]).tagger is None  # git looks right after "tag"
    assert Tag.parse(ODD["of_tree"]).object_type is ObjectType.TREE
    assert Tag.parse(ODD["empty_name"]).name == b""
    [extra] = Tag.parse(ODD["extra_header"]).extra_headers
    assert extra.key == b"gpgsig-sha256"
    assert extra.value == b"-----BEGIN PGP SIGNATURE-----\n\nabc=\n-----END PGP SIGNATURE-----"
    with pytest.raises(InvalidObject):
        _ = Tag.parse(ODD["malformed_tagger"]).tagger


def test_create_writes_what_git_writes() -> None:
    t = Tag.create(
        object=oid_from_hex(OBJ),
        object_type=ObjectType.COMMIT,
        name=b"v1.0",
        tagger=Identity(b"T Agger", b"t@example.com", 1700000000, b"+0100"),
        message=b"release\n",
    )
    assert t.serialize() == ODD["plain"]
    with pytest.raises(InvalidObject):  # 63 bytes: git would refuse it
        Tag.create(
            object=oid_from_hex(OBJ), object_type=ObjectType.TAG, name=b"", tagger=None, message=b""
        )
    made = Tag.create(
        object=oid_from_hex(OBJ),
        object_type=ObjectType.TAG,
        name=b"",
        tagger=None,
        message=b"m",
        extra=[Header(b"x-y", b"z")],
    )
    assert made.extra_headers == (Header(b"x-y", b"z"),)


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
def test_tags_made_by_git(git: Git) -> None:
    tree = git("write-tree").strip().decode()
    commit = git("commit-tree", tree, "-m", "c").strip().decode()
    blob = git("hash-object", "-w", "--stdin", input=b"blob\n").strip().decode()
    made = []
    for name, target in (("v1", commit), ("t-tree", tree), ("t-blob", blob)):
        git("tag", "-a", name, "-m", f"tag {name}", target)
        made.append((name, target))
    git("tag", "-a", "outer", "-m", "nested", "v1")
    for name in ("v1", "t-tree", "t-blob", "outer"):
        oid = git("rev-parse", f"refs/tags/{name}").strip().decode()
        body = git("cat-file", "tag", oid)
        tag = Tag.parse(body)
        assert tag.serialize() == body
        assert object_id(ObjectType.TAG, body) == oid_from_hex(oid)
        assert tag.name == name.encode()
        assert tag.tagger is not None and tag.tagger.timestamp == 1700000000
    v1 = Tag.parse(git("cat-file", "tag", "v1"))
    assert (v1.object, v1.object_type) == (oid_from_hex(commit), ObjectType.COMMIT)
    outer = Tag.parse(git("cat-file", "tag", "outer"))
    assert outer.object_type is ObjectType.TAG


@pytest.mark.interop
def test_odd_tags_are_stored_as_git_stores_them(git: Git) -> None:
    for name, data in ODD.items():
        oid = git.hash("tag", data, "-w")
        assert oid is not None, name
        assert oid == object_id(ObjectType.TAG, data), name
        assert git("cat-file", "tag", oid.hex()) == data, name


def _accept_cases() -> list[bytes]:
    head = b"object " + OBJ + b"\ntype tag\ntag \n"  # 62 bytes
    return [
        b"",
        head + b"\n",  # 63 bytes
        head + b"\nx",  # 64 bytes
        head + b"xx",
        tag_bytes(b"tag v", kind=b"commits"),
        tag_bytes(b"tag v", kind=b"Commit"),
        tag_bytes(b"tag v", kind=b""),
        tag_bytes(b" continued", b"tag v"),
        tag_bytes(b"tagger " + TAGGER),
        tag_bytes(b"tagname v", b"tagger " + TAGGER),
        tag_bytes(b"tag", b"tagger " + TAGGER),
        tag_bytes(message=None) + b"tag " + b"v" * 30,
        tag_bytes(message=None) + b"tag " + b"v" * 30 + b"\n",
        tag_bytes(b"tag v", obj=OBJ[:39] + b"g"),
        tag_bytes(b"tag v", obj=OBJ + b"1"),
        b"type commit\nobject " + OBJ + b"\ntag v\n\nmessage message\n",
        b"object " + OBJ + b"\n continued\ntype commit\ntag v\n\nmessage\n",
        b"object  " + OBJ + b"\ntype commit\ntag v\n\nmessage message\n",
        tag_bytes(b"tag v\n continued", b"tagger " + TAGGER),
    ]


@pytest.mark.interop
def test_parser_refuses_exactly_what_git_refuses(git: Git) -> None:
    verdicts = []
    for data in _accept_cases():
        theirs = git.hash("tag", data) is not None
        assert round_trips(data) == theirs, data
        verdicts.append(theirs)
    assert any(verdicts) and not all(verdicts)


# --- properties and corruption ----------------------------------------------------

values = st.binary(max_size=40)
keys = st.binary(min_size=1, max_size=8).filter(lambda k: b" " not in k and b"\n" not in k)


@st.composite
def tags(draw: st.DrawFn) -> Tag:
    kind = draw(st.sampled_from(list(ObjectType)))
    hs = [
        Header(b"object", draw(st.sampled_from([OBJ, OBJ.upper(), b"ab" * 20]))),
        Header(b"type", kind.type_name),
        Header(b"tag", draw(values)),
    ]
    if draw(st.booleans()):
        hs.append(Header(b"tagger", draw(st.sampled_from([TAGGER, b"x", b""]))))
    hs += draw(st.lists(st.builds(Header, keys, values), max_size=4))
    message = draw(st.one_of(st.none(), st.binary(max_size=60)))
    header_newline = True if message is not None else draw(st.booleans())
    if not header_newline and len(hs) == 3 and not hs[2].has_continuation:
        header_newline = True  # the tag line must end in LF
    tag = Tag(tuple(hs), message, header_newline)
    return tag


@hypothesis_seed(SEED)
@given(tags())
def test_any_tag_round_trips(tag: Tag) -> None:
    data = tag.serialize()
    if len(data) < 64:
        with pytest.raises(InvalidObject):
            Tag.parse(data)
        return
    back = Tag.parse(data)
    assert back == tag
    assert back.serialize() == data


@hypothesis_seed(SEED)
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_invalid_object(data: bytes) -> None:
    round_trips(data)
    round_trips(b"object " + OBJ + b"\ntype commit\ntag " + data)


@pytest.mark.parametrize("name", ["signed", "extra_header", "unterminated"])
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
