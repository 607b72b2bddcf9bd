"""Fuzz target: what a pack's entries hold, the delta instructions and the object bodies.

gitformat-pack, "Deltified representation"; gitformat-object (commit, tree,
tag layouts). These are the parsers the indexer and ingest run on every
entry. Inputs: the real objects of the seed packs (``git pack-objects``
output and our writer's) and real deltas between them, mutated byte by byte
and spliced, plus raw bytes. Properties:

1. ``apply_delta`` (dulwich's compiled routine behind a guard, or the join
   path) and ``apply_delta_py`` agree: the same bytes, or both refuse with
   ``InvalidDelta`` / ``LimitExceeded``;
2. ``parse_object`` raises only ``InvalidObject`` / ``LimitExceeded``; what it
   accepts serializes back to the same bytes, and every accessor of the
   parsed value (tree, parents, identities, entries, tag fields) answers or
   raises ``InvalidObject``.
"""

from __future__ import annotations

import pytest
from fuzzkit import fuzz_bytes, fuzz_settings, mutated, typed_errors
from hypothesis import event as tally
from hypothesis import example, given
from hypothesis import strategies as st
from packmodel import KNOWN, KNOWN_OIDS

from enroute_core.base.errors import InvalidDelta, InvalidObject, LimitExceeded
from enroute_core.base.limits import Limits
from enroute_core.git.commit import Commit
from enroute_core.git.delta import apply_delta, apply_delta_py, create_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import parse_object
from enroute_core.git.tag import Tag
from enroute_core.git.tree import Tree, check_tree

pytestmark = pytest.mark.fuzz

BODIES = [body for _, body in KNOWN.values()]
BASES = st.sampled_from(BODIES) | st.binary(max_size=64)


@st.composite
def _deltas(draw: st.DrawFn) -> tuple[bytes, bytes]:
    base = draw(BASES)
    target = draw(st.sampled_from(BODIES) | st.just(base[::-1] + base) | st.binary(max_size=64))
    delta = create_delta(base, target)
    if draw(st.integers(0, 3)) != 3:
        delta = draw(mutated([delta], 3))
    if draw(st.integers(0, 5)) == 3:
        base = draw(mutated([base], 1))
    return base, delta


LIMITS = st.sampled_from([Limits(), Limits(object_bytes_max=100)])


@fuzz_settings(600)
@given(pair=st.one_of(_deltas(), st.tuples(BASES, st.binary(max_size=64))), limits=LIMITS)
@example(pair=(b"abcd", b"\x04\x04\x90\x00"), limits=Limits())  # copy of 0x10000: past the base
@example(pair=(b"", b"\x00\x7f\x7f" + b"x" * 127), limits=Limits())
def test_apply_delta_agrees_with_the_reference(pair: tuple[bytes, bytes], limits: Limits) -> None:
    base, delta = pair
    with typed_errors(InvalidDelta, LimitExceeded) as fast_error:
        fast = apply_delta(base, delta, limits=limits)
    with typed_errors(InvalidDelta, LimitExceeded) as slow_error:
        slow = apply_delta_py(base, delta, limits=limits)
    tally("refused" if slow_error else "applied")
    assert [type(e) for e in fast_error] == [type(e) for e in slow_error], (fast_error, slow_error)
    if not slow_error:
        assert fast == slow


OBJECTS = [(ObjectType(t), body) for t, body in KNOWN.values()]


@st.composite
def _objects(draw: st.DrawFn) -> tuple[ObjectType, bytes]:
    kind, body = draw(st.sampled_from(OBJECTS))
    if draw(st.integers(0, 5)) == 3:
        kind = draw(st.sampled_from(list(ObjectType)))
    same_kind = [b for k, b in OBJECTS if k is kind]
    return kind, draw(fuzz_bytes(same_kind or [body], 4))


def _use(value: object) -> None:
    """Every accessor of a parsed object, as ingest and serving call them."""
    if isinstance(value, Commit):
        value.tree  # noqa: B018 (accessors that parse)
        value.parents  # noqa: B018
        value.author  # noqa: B018
        value.committer  # noqa: B018
        value.encoding  # noqa: B018
        value.extra_headers  # noqa: B018
    elif isinstance(value, Tree):
        check_tree(value, strict=True)
        for entry in value.entries:
            entry.encode()
    elif isinstance(value, Tag):
        value.object  # noqa: B018
        value.tagger  # noqa: B018


@fuzz_settings(600)
@given(obj=_objects(), limits=st.sampled_from([Limits(), Limits(tree_entries_max=1)]))
def test_parse_object(obj: tuple[ObjectType, bytes], limits: Limits) -> None:
    kind, body = obj
    with typed_errors(InvalidObject, LimitExceeded) as caught:
        value = parse_object(kind, body, limits=limits)
        assert value.serialize() == body
        _use(value)
    tally(f"{kind.name}: {type(caught[0]).__name__ if caught else 'parsed'}")


def test_seed_objects_all_parse() -> None:
    """The seeds are valid: a mutation target that starts from garbage tests little."""
    for oid in KNOWN_OIDS:
        kind, body = KNOWN[oid]
        _use(parse_object(ObjectType(kind), body))
