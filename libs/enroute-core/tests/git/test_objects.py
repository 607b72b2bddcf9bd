"""Object types, headers, ids and the incremental hasher (loose-object format)."""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import oid_from_hex
from enroute_core.base.limits import Limits
from enroute_core.git.blob import Blob
from enroute_core.git.commit import Commit
from enroute_core.git.objects import (
    ObjectHasher,
    ObjectHeader,
    ObjectType,
    object_header,
    object_id,
    object_id_of,
    parse_object,
    parse_object_header,
)
from enroute_core.git.tag import Tag
from enroute_core.git.tree import Tree

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


def test_type_numbers_and_names_are_gits() -> None:
    assert [(int(t), t.type_name) for t in ObjectType] == [
        (1, b"commit"),
        (2, b"tree"),
        (3, b"blob"),
        (4, b"tag"),
    ]
    assert ObjectType.from_name(b"tag") is ObjectType.TAG
    assert ObjectType.from_number(2) is ObjectType.TREE
    for bad in (0, 5, 6, 7):
        with pytest.raises(InvalidObject):
            ObjectType.from_number(bad)
    with pytest.raises(InvalidObject):
        ObjectType.from_name(b"Commit")


# Ids every git installation agrees on.
KNOWN_IDS = [
    (ObjectType.BLOB, b"", "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"),
    (ObjectType.BLOB, b"hello\n", "ce013625030ba8dba906f756967f9e9ca394464a"),
    (ObjectType.TREE, b"", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"),
]


@pytest.mark.parametrize(("kind", "body", "hex_"), KNOWN_IDS)
def test_known_ids(kind: ObjectType, body: bytes, hex_: str) -> None:
    assert object_id(kind, body) == oid_from_hex(hex_)
    hasher = ObjectHasher(kind, len(body))
    hasher.update(body)
    assert hasher.digest() == oid_from_hex(hex_)


def test_header_round_trip_with_trailing_body() -> None:
    raw = object_header(ObjectType.COMMIT, 1234) + b"body bytes"
    assert raw.startswith(b"commit 1234\0")
    assert parse_object_header(raw) == ObjectHeader(ObjectType.COMMIT, 1234, 12)
    assert parse_object_header(memoryview(raw)) == ObjectHeader(ObjectType.COMMIT, 1234, 12)


def test_header_size_zero() -> None:
    assert parse_object_header(b"blob 0\0") == ObjectHeader(ObjectType.BLOB, 0, 7)


@pytest.mark.parametrize(
    "raw",
    [
        b"blob 010\0",  # git: not canonical decimal
        b"blob 00\0",
        b"blob\0",
        b"blob \0",
        b"blob  1\0",
        b"blob 1 \0",
        b"blob -1\0",
        b"blob +1\0",
        b"blob 1x\0",
        b"blob \xd9\xa1\0",  # a non-ASCII digit
        b"bl0b 1\0",
        b" blob 1\0",
        b"BLOB 1\0",
        b"delta 1\0",
        b"\0",
    ],
)
def test_bad_headers(raw: bytes) -> None:
    with pytest.raises(InvalidObject):
        parse_object_header(raw)


def test_every_prefix_of_a_header_is_truncated() -> None:
    raw = b"tree 98765\0"
    for n in range(len(raw)):
        with pytest.raises(InvalidObject):
            parse_object_header(raw[:n])


def test_every_byte_flip_of_a_header_is_refused_or_a_header() -> None:
    raw = b"commit 4096\0"
    for i in range(len(raw)):
        for x in (0x01, 0x10, 0x20, 0x80, 0xFF):
            bad = bytearray(raw)
            bad[i] ^= x
            try:
                h = parse_object_header(bytes(bad))
            except InvalidObject:
                continue
            # the few flips that still parse keep the layout: name, space, digits, NUL
            assert bytes(bad[: h.length]) == object_header(h.type, h.size)


def test_header_limits() -> None:
    limits = Limits(object_header_bytes_max=9, object_bytes_max=100)
    with pytest.raises(LimitExceeded):
        parse_object_header(b"blob 12345\0", limits=limits)  # 10 bytes
    with pytest.raises(InvalidObject):
        parse_object_header(b"blob 123", limits=limits)  # short of the bound: truncated
    with pytest.raises(LimitExceeded):
        parse_object_header(b"blob 101\0", limits=limits)
    assert parse_object_header(b"blob 100\0", limits=limits).size == 100
    with pytest.raises(LimitExceeded):
        parse_object(ObjectType.BLOB, b"x" * 101, limits=limits)


def test_hasher_refuses_a_size_that_lied() -> None:
    h = ObjectHasher(ObjectType.BLOB, 3)
    h.update(b"ab")
    with pytest.raises(InvalidObject):
        h.digest()
    with pytest.raises(InvalidObject):
        h.update(b"cd")
    h.update(b"c")
    assert h.digest() == object_id(ObjectType.BLOB, b"abc")
    assert h.digest() == object_id(ObjectType.BLOB, b"abc")  # repeatable


@hypothesis_seed(SEED)
@given(st.binary(max_size=4096), st.lists(st.integers(0, 4096), max_size=8))
def test_hasher_equals_one_shot_for_any_split(body: bytes, cuts: list[int]) -> None:
    h = ObjectHasher(ObjectType.BLOB, len(body))
    points = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    for a, b in itertools.pairwise(points):
        h.update(memoryview(body)[a:b])
    assert h.digest() == object_id(ObjectType.BLOB, body)


def test_parse_object_dispatches_by_type() -> None:
    tree = bytes.fromhex("4b825dc642cb6eb9a060e54bf8d69288fbee4904").hex().encode()
    commit = b"tree " + tree + b"\nauthor A <a@x> 1 +0000\ncommitter A <a@x> 1 +0000\n\nm\n"
    tag = b"object " + tree + b"\ntype tree\ntag t\ntagger A <a@x> 1 +0000\n\nm\n"
    cases = [
        (ObjectType.BLOB, b"data", Blob),
        (ObjectType.TREE, b"", Tree),
        (ObjectType.COMMIT, commit, Commit),
        (ObjectType.TAG, tag, Tag),
        (3, b"int type", Blob),
    ]
    for kind, body, cls in cases:
        obj = parse_object(ObjectType.from_number(kind), body)
        assert isinstance(obj, cls)
        assert obj.kind == kind
        assert obj.serialize() == body
        assert object_id_of(obj) == object_id(ObjectType.from_number(kind), body)
    with pytest.raises(InvalidObject):
        parse_object(ObjectType.COMMIT, b"data")


@pytest.mark.interop
def test_blob_ids_match_git_hash_object(tmp_path: Path) -> None:
    from enroute_testing.gitcli import run_git

    bodies = [b"", b"\n", b"\0\xff" * 100, bytes(range(256)) * 300, b"x" * 65537]
    paths = []
    for i, body in enumerate(bodies):
        p = tmp_path / f"b{i}"
        p.write_bytes(body)
        paths.append(str(p))
    home = tmp_path / "home"
    home.mkdir()
    out = run_git(["hash-object", "--no-filters", *paths], cwd=tmp_path, home=home)
    theirs = [oid_from_hex(line) for line in out.split()]
    assert theirs == [object_id(ObjectType.BLOB, b) for b in bodies]
