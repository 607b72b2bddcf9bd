"""Fuzz target: the compiled segment diff (``enroute_native.segment_diff``) on bad trees.

DESIGN "Layers" (segments); docs/native.md. The compiled diff reads tree
bodies as they lie, in C, so its parser meets untrusted bytes. Inputs: the
real trees of the seed packs, mutated byte by byte and spliced, plus raw
bytes, as the current tree and as a parent's tree, and subtrees read as
either. Property: ingest's compiled diff and the Python reference
(:func:`~enroute_core.engine.segments.commit_segment` over ``Tree.parse``)
agree: the same members and visits, or both raise a typed error.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fuzzkit import fuzz_bytes, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from packmodel import KNOWN

from enroute_core.base.errors import EnrouteError, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.engine import ingest
from enroute_core.engine.segments import commit_segment
from enroute_core.git.tree import Tree

pytestmark = pytest.mark.fuzz

TREES = [body for type_num, body in KNOWN.values() if type_num == 2]
LIMITS = st.sampled_from([Limits(), Limits(tree_entries_max=3, tree_depth_max=2)])
COMMIT, CURRENT, PARENT = (ObjectId(bytes([n]) * 20) for n in (1, 2, 3))


Outcome = tuple[list[ObjectId], list[tuple[ObjectId, bool, ObjectId]]] | EnrouteError


def _run(compiled: bool, read: Callable[[ObjectId], bytes], limits: Limits) -> Outcome:
    """Members and visits, or the typed error; any other exception fails the test."""
    seen: list[tuple[ObjectId, bool, ObjectId]] = []

    def visit(oid: ObjectId, is_tree: bool, via: ObjectId) -> None:
        seen.append((oid, is_tree, via))

    try:
        if compiled:
            members = ingest._segment(COMMIT, CURRENT, [PARENT], read, visit, limits=limits)
        else:
            members = commit_segment(
                COMMIT,
                CURRENT,
                [PARENT],
                lambda t: Tree.parse(read(t), limits=limits).entries,
                visit,
            )
    except EnrouteError as exc:
        return exc
    return members, seen


@fuzz_settings(400)
@given(
    current=fuzz_bytes(TREES),
    parent=fuzz_bytes(TREES),
    sub=fuzz_bytes(TREES),
    limits=LIMITS,
)
def test_compiled_diff_agrees_with_the_reference(
    current: bytes, parent: bytes, sub: bytes, limits: Limits
) -> None:
    bodies = {CURRENT: current, PARENT: parent}

    def read(oid: ObjectId) -> bytes:
        return bodies.get(oid, sub)  # every other tree: one more fuzzed body

    compiled = _run(True, read, limits)
    reference = _run(False, read, limits)
    if isinstance(compiled, LimitExceeded) and "tree_depth_max" in str(compiled):
        return  # the reference has no depth bound; nothing else may differ
    if isinstance(compiled, EnrouteError) or isinstance(reference, EnrouteError):
        assert type(compiled) is type(reference), (compiled, reference)
        assert str(compiled) == str(reference)
        return
    assert compiled == reference
