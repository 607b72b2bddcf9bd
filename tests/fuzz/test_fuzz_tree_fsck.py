"""Fuzz target: the compiled clean-tree test (``enroute_native.tree_fsck``) against fsck.

git's fsck.c ``fsck_tree``; docs/native.md. ``check_tree`` skips its own
checks for a tree the compiled code calls clean. Inputs: trees built from
entries whose names mix plain bytes with the ones fsck cares about ('.', '..',
'.git' and its NTFS and HFS+ spellings, '.gitmodules' in any case, '~', '\\',
'/', non-ASCII, empty names, names at and over the length bound), with every
mode git writes and odd ones (zero-padded, unknown), ids of zeros, in git's
order, shuffled or with repeated names (a blob and a tree of one name among
them); and those trees' bytes mutated. Property: a tree called clean is one
fsck's entry-by-entry reference finds nothing in, that names no
``.gitmodules`` and that ``check_tree`` accepts without a memo; and a tree of
plain names in git's order is called clean.
"""

from __future__ import annotations

import pytest
from fuzzkit import fuzz_bytes, fuzz_settings
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.fsck import _tree_by_entry, check_tree, special_blobs, tree_clean

pytestmark = pytest.mark.fuzz

LIMITS = Limits(tree_entries_max=12, tree_entry_name_bytes_max=16)
OID = ObjectId(b"\x01" * 20)
_PLAIN = [b"a", b"b", b"a-b", b"a.b", b"a0", b"src", b"README", b"x" * 16, b"a b", b"A", b"\x01"]
_ODD = [b"x" * 17, b"", b".", b"..", b".git", b".GIT", b"git~1", b"GIT~1", b".gitmodules",
        b".GitModules", b"gitmod", b"GITMO~1", b"gi7eba~1", b"a\\b", b"a/b", b"\xe2\x80\x8c.git",
        b"caf\xc3\xa9", b"~", b"a~", b".keep", b".gitattributes", b"GITATT~1",
        b"gi7d29~1", b".github", b".GitHub", b".gi", b"...", b".git.", b".git ", b".git:x",
        b".gitmodules ", b".Gitattributes.", b".gitignore", b".mailmap", b".a"]  # fmt: skip
NAMES = st.sampled_from(_PLAIN) | st.sampled_from(_PLAIN) | st.sampled_from(_ODD)
_GIT_MODES = [b"40000", b"100644", b"100755", b"120000", b"160000"]
MODES = st.sampled_from(_GIT_MODES) | st.sampled_from([b"040000", b"100664", b"644", b"1"])
_USUAL_OID = bytes(range(1, 21))
OIDS = st.just(_USUAL_OID) | st.sampled_from(
    [bytes(20), b"\x00" * 19 + b"\x01", b" 0\x00" * 6 + b"zz"]
)
# Names fsck has nothing to say of, as the compiled test reads them: a dotfile too, but
# not '.', '..' or one starting with '.git' in any case (the reference decides those).
_PLAIN_NAMES = (
    st.text(st.characters(min_codepoint=1, max_codepoint=127, exclude_characters="/~\\"),
            min_size=1, max_size=16)
    .map(str.encode)
    .filter(lambda n: n not in (b".", b"..") and not n.lower().startswith(b".git"))
)  # fmt: skip


def _key(entry: tuple[bytes, bytes, bytes]) -> bytes:
    mode, name, _ = entry
    return name + b"/" if mode in (b"40000", b"040000") else name


@st.composite
def trees(draw: st.DrawFn) -> bytes:
    plain = st.tuples(st.sampled_from(_GIT_MODES), st.sampled_from(_PLAIN), st.just(_USUAL_OID))
    entries = draw(st.lists(plain, max_size=10))
    for _ in range(draw(st.integers(0, 2))):  # at most two odd entries: most trees are near clean
        entries.insert(draw(st.integers(0, len(entries))), draw(st.tuples(MODES, NAMES, OIDS)))
    order = draw(st.sampled_from(["git", "as drawn"]))
    if order == "git":
        entries.sort(key=_key)
    return b"".join(mode + b" " + name + b"\0" + oid for mode, name, oid in entries)


def _reference_clean(body: bytes) -> bool:
    """What the clean test claims, by the reference: no problem, no .gitmodules or
    .gitattributes, no limit."""
    try:
        return not _tree_by_entry(body, LIMITS) and not special_blobs(body, limits=LIMITS)
    except EnrouteError:
        return False


def _check(body: bytes) -> bool:
    """A clean tree is one the reference finds nothing in (the property); return clean."""
    clean = tree_clean(body, LIMITS.tree_entries_max, LIMITS.tree_entry_name_bytes_max)
    if clean:
        assert _reference_clean(body), body
        assert check_tree(OID, body, limits=LIMITS) == []
    return clean


@fuzz_settings(1500)
@given(body=trees())
def test_a_clean_tree_is_one_fsck_finds_nothing_in(body: bytes) -> None:
    tally(f"clean: {_check(body)}")


_SEEDS = [
    b"100644 a\0" + bytes(range(1, 21)) + b"40000 b\0" + bytes(range(2, 22)),
    b"100644 a\0" + bytes(range(1, 21)) + b"100644 a-b\0" + bytes(range(3, 23))
    + b"40000 a\0" + bytes(range(2, 22)),
]  # fmt: skip


@fuzz_settings(800)
@given(body=fuzz_bytes(_SEEDS, max_mutations=3))
def test_mutated_trees(body: bytes) -> None:
    tally(f"clean: {_check(body)}")


@fuzz_settings(400)
@given(
    entries=st.lists(
        st.tuples(st.sampled_from(_GIT_MODES), _PLAIN_NAMES), max_size=12, unique_by=lambda e: e[1]
    )
)
def test_plain_names_in_git_order_are_clean(entries: list[tuple[bytes, bytes]]) -> None:
    """The other side: the compiled test is not merely cautious, it takes the usual tree."""
    rows = sorted(((m, n, _USUAL_OID) for m, n in entries), key=_key)
    body = b"".join(m + b" " + n + b"\0" + oid for m, n, oid in rows)
    assert tree_clean(body, LIMITS.tree_entries_max, LIMITS.tree_entry_name_bytes_max)
    assert _reference_clean(body)


def test_a_blob_and_a_tree_of_one_name_are_not_clean() -> None:
    """git's order puts 'a-b' between blob 'a' and tree 'a' (as 'a/'): strictly ordered keys,
    one name twice."""
    oid = bytes(range(1, 21))
    body = b"100644 a\0" + oid + b"100644 a-b\0" + oid + b"40000 a\0" + oid
    assert not tree_clean(body, 10, 100)
    assert _tree_by_entry(body, Limits())  # duplicateEntries


def test_every_odd_name_mode_and_id_alone_and_among_plain_ones() -> None:
    """Directed, not drawn: each name, mode and id fsck cares about, in a tree of its own
    and between plain neighbours, in git's order and reversed."""
    plain = [(b"100644", b"a", _USUAL_OID), (b"40000", b"src", _USUAL_OID)]
    for mode in [*_GIT_MODES, b"040000", b"100664", b"644"]:
        for name in [*_ODD, *_PLAIN]:
            for oid in (_USUAL_OID, bytes(20)):
                for rows in ([(mode, name, oid)], [*plain, (mode, name, oid)]):
                    for ordered in (sorted(rows, key=_key), sorted(rows, key=_key)[::-1]):
                        _check(b"".join(m + b" " + n + b"\0" + o for m, n, o in ordered))


def test_order_edges_bounds_and_counts() -> None:
    """A tree named like a blob's prefix ('a' as 'a/' against 'a-b' and 'a0'), names at and
    one over the length bound, and trees at and one over the entry bound."""
    oid = _USUAL_OID
    for first, second in [(b"40000 a", b"100644 a-b"), (b"100644 a-b", b"40000 a"),
                          (b"40000 a", b"100644 a0"), (b"100644 a0", b"40000 a"),
                          (b"40000 a", b"40000 a-b"), (b"100644 a", b"100644 a-b")]:  # fmt: skip
        _check(first + b"\0" + oid + second + b"\0" + oid)
    for length in (15, 16, 17):
        _check(b"100644 " + b"n" * length + b"\0" + oid)
    for count in (11, 12, 13):
        names = sorted(b"f%02d" % i for i in range(count))
        body = b"".join(b"100644 " + n + b"\0" + oid for n in names)
        _check(body)
        assert tree_clean(body, LIMITS.tree_entries_max, 16) == (count <= 12)
