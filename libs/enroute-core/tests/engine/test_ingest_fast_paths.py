"""engine/ingest.py fast paths read what the general parsers read (docs/ingest.md, "Speed").

``_commit_head`` reads a commit headed as git writes it with one regular
expression; every commit, usual or not, must give the tree and parents
``Commit.parse`` gives and the time git's ``parse_commit_date`` gives
(``commit_date``), and fail with the same typed error.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine import ingest
from enroute_core.engine.bodies import BodyCache
from enroute_core.git.commit import Commit, commit_date
from enroute_core.git.fsck import fsck_commit
from enroute_core.git.object_type import ObjectType

TREE = b"4b825dc642cb6eb9a060e54bf8d69288fbee4904"
PARENT = b"ce013625030ba8dba906f756967f9e9ca394464a"


def _slow(body: bytes, limits: Limits) -> object:
    """Tree and parents as ``Commit.parse`` reads them, the time as git's
    ``parse_commit_date`` does (an identity quirk is harmless: docs/security.md)."""
    try:
        commit = Commit.parse(body, limits=limits)
    except EnrouteError as exc:
        return type(exc)
    stamp = commit_date(body, len(commit.parents))
    return (commit.tree, commit.parents, min(stamp, (1 << 63) - 1))


def _fast(body: bytes, limits: Limits) -> object:
    try:
        head = ingest._commit_head(body, limits)
    except EnrouteError as exc:
        return type(exc)
    return (head.tree, head.parents, head.time)


def _commit(parents: int, committer: bytes, *, tree: bytes = TREE, extra: bytes = b"") -> bytes:
    return (
        b"tree "
        + tree
        + b"\n"
        + b"".join(b"parent " + PARENT + b"\n" for _ in range(parents))
        + b"author A <a@example.com> 1700000000 +0000\n"
        + b"committer "
        + committer
        + b"\n"
        + extra
        + b"\nmessage\n"
    )


@pytest.mark.parametrize(
    "committer",
    [
        b"C <c@example.com> 1700000000 +0100",
        b"C <c@example.com> 0 -0000",
        b" <> 1 +0000",
        b"C <c@example.com> 012 +0000",  # zero-padded: the long path
        b"C <c@example.com> 99999999999999999999999 +0000",  # 23 digits: the long path
        b"C <c@example.com>",
        b"C <c@example.com> 5 +01",
        b"C c@example.com> 5 +0000",
        b"C <c@ex>ample.com> 5 +0000",
    ],
)
@pytest.mark.parametrize("parents", [0, 1, 2, 3])
def test_commit_head_matches_commit_parse(committer: bytes, parents: int) -> None:
    limits = Limits(commit_parents_max=2)
    for body in (
        _commit(parents, committer),
        _commit(parents, committer, tree=TREE.upper()),
        _commit(parents, committer, extra=b"gpgsig x\n y\n"),
    ):
        assert _fast(body, limits) == _slow(body, limits), body


def test_commit_head_usual_commit_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> Commit:
        raise AssertionError("the usual commit went through Commit.parse")

    monkeypatch.setattr(ingest.Commit, "parse", refuse)
    head = ingest._commit_head(_commit(2, b"C <c@e> 42 +0000"), DEFAULT_LIMITS)
    assert head.time == 42
    assert [p.hex().encode() for p in head.parents] == [PARENT, PARENT]
    assert head.tree.hex().encode() == TREE


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3), st.binary(max_size=40), st.integers(0, 10**19))
def test_commit_head_any_committer(parents: int, name: bytes, stamp: int) -> None:
    body = _commit(parents, name + b" <x@y> %d +0000" % stamp)
    assert _fast(body, DEFAULT_LIMITS) == _slow(body, DEFAULT_LIMITS)


def test_commit_head_corruptions_agree() -> None:
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    good = _commit(2, b"C <c@example.com> 1700000000 +0100")
    for _ in range(500):
        raw = bytearray(good)
        for _ in range(rng.randrange(1, 3)):
            raw[rng.randrange(len(raw))] = rng.choice(b"\n <>0aA+-" + bytes([rng.randrange(256)]))
        body = bytes(raw[: rng.randrange(len(raw) + 1)] if rng.random() < 0.3 else raw)
        assert _fast(body, DEFAULT_LIMITS) == _slow(body, DEFAULT_LIMITS), body


def test_the_cache_reader_answers_as_get_and_keeps_hits_recent() -> None:
    """``BodyCache.reader``: a cached body of its type in one call, kept recent as ``get``
    keeps it; anything else (absent, another type) through the fallback."""
    tree_a, tree_b, blob = (bytes([i]) * 20 for i in (1, 2, 3))
    cache = BodyCache(64)
    cache.put(ObjectId(tree_a), ObjectType.TREE, b"a" * 20)
    cache.put(ObjectId(tree_b), ObjectType.TREE, b"b" * 20)
    cache.put(ObjectId(blob), ObjectType.BLOB, b"c" * 20)
    missed: list[bytes] = []

    def miss(oid: ObjectId) -> bytes:
        missed.append(oid)
        return b"from the fallback"

    read = cache.reader(ObjectType.TREE, miss)
    assert read(ObjectId(tree_a)) == b"a" * 20
    assert read(ObjectId(blob)) == b"from the fallback"
    assert read(ObjectId(bytes(20))) == b"from the fallback"
    assert missed == [blob, bytes(20)]
    cache.put(ObjectId(bytes([4]) * 20), ObjectType.TREE, b"d" * 20)  # evicts the oldest: b
    assert cache.get(ObjectId(tree_b)) is None
    assert cache.get(ObjectId(tree_a)) is not None


def _clean_agrees(body: bytes, limits: Limits = DEFAULT_LIMITS) -> bool:
    """``_clean_head`` answers only for a commit fsck finds nothing in, and then with the
    header ``_commit_head`` reads; return whether it answered."""
    head = ingest._clean_head(body, limits)
    if head is None:
        return False
    assert fsck_commit(body) == [], body
    assert (head.tree, head.parents, head.time) == _slow(body, limits), body
    return True


@pytest.mark.parametrize(
    "author",
    [b"A <a@example.com> 1700000000 +0000", b" <a@b> 1 +0000", b"A <a@b> 01 +0000",
     b"A <a@b> 1 +00", b"A a@b> 1 +0000", b"A <a@b> 1234567890123456789 +0000", b"A <a@b>"],
)  # fmt: skip
@pytest.mark.parametrize(
    "tail", [b"\nmessage\n", b"\n", b"", b"gpgsig x\n y\n\nsigned\n", b"message", b"\nnul\0\n"]
)
@pytest.mark.parametrize("parents", [0, 1, 3])
def test_clean_head_is_fsck_and_the_header_in_one(author: bytes, tail: bytes, parents: int) -> None:
    body = (
        b"tree " + TREE + b"\n" + b"".join(b"parent " + PARENT + b"\n" for _ in range(parents))
        + b"author " + author + b"\ncommitter C <c@example.com> 1700000000 +0100\n" + tail
    )  # fmt: skip
    _clean_agrees(body, Limits(commit_parents_max=2))
    if author.startswith(b"A <a@example.com>") and tail in (b"\nmessage\n", b"\n"):
        assert _clean_agrees(body), "the commit git writes takes the one read"


def test_clean_head_corruptions_agree() -> None:
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    good = _commit(2, b"C <c@example.com> 1700000000 +0100")
    answered = 0
    for _ in range(2000):
        raw = bytearray(good)
        for _ in range(rng.randrange(1, 3)):
            raw[rng.randrange(len(raw))] = rng.choice(b"\n <>0aA+-\0" + bytes([rng.randrange(256)]))
        body = bytes(raw[: rng.randrange(len(raw) + 1)] if rng.random() < 0.3 else raw)
        answered += _clean_agrees(body)
    assert answered > 100  # the property was tested on clean commits, not only refusals
