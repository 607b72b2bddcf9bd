"""A push of one ref costs the same in a repository of N refs as in one of 4N.

What the ledger does for each entry (``decode_command``, ``apply``,
``encode_change``) and what a compute does to follow it (``decode_change``,
``apply_change``) is measured for a commit of one ref into states of
``N = 25,000`` and ``4N`` refs, by two counts that do not depend on the
machine's speed or load: the Python lines executed (``sys.settrace``) and
the peak of the memory allocated (``tracemalloc``). A copy of the ref map
shows in the second (a dict of 100,000 refs is megabytes), a scan of every
ref in the first. The bound is a generous ratio; the counts are the same
on every run.

Issue "Bounded work", item 4 (refs at scale): the nightly run of 300,000 refs
in ``tests/interop/test_many_refs.py`` timed out in the ledger when each entry
copied the whole map.
"""

from __future__ import annotations

import hashlib
import sys
import tracemalloc
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Commit,
    RefUpdate,
    RefValue,
    RepoState,
    apply,
    apply_change,
    decode_change,
    decode_command,
    encode_change,
    encode_command,
)
from enroute_core.state.refmap import RefMap

N = 25_000
RATIO_MAX = 1.5
SLACK_LINES = 200
SLACK_BYTES = 64 * 1024


def _state(count: int, *, with_main: bool) -> RepoState:
    items = [
        (b"refs/tags/t%07d" % i, RefValue(ObjectId(hashlib.sha1(b"%d" % i).digest()), 1))
        for i in range(count)
    ]
    if with_main:
        items.append((b"refs/heads/main", RefValue(ObjectId(b"\2" * 20), 1)))
    return RepoState(
        incarnation=1,
        version=7,
        head=b"refs/heads/main",
        refs=RefMap.from_ascending(sorted(items)),
        upload_gen=65,
        upload_window=64,
    )


def _cost(fn: Callable[[], object]) -> tuple[int, int]:
    """(Python lines run, peak bytes allocated) by ``fn()``."""
    lines = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += event == "line"
        return tracer

    tracemalloc.start()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return lines, peak


def _one_ref_push(state: RepoState) -> tuple[int, int]:
    """The cost of the ledger's apply and a compute's follow of a push of one new ref
    (``refs/tags/t0012345x`` sorts into the middle of the tags)."""
    cmd = Commit(
        incarnation=1,
        ref_updates=(RefUpdate(b"refs/tags/t0012345x", None, ObjectId(b"\1" * 20)),),
        new_layer=None,
        stamp_us=5,
        is_push=True,
        atomic=False,
    )
    entry = encode_command(cmd)

    def ledger_then_compute() -> None:
        result = apply(state, decode_command(entry), log_index=9)
        change = decode_change(encode_change(result.change))
        followed = apply_change(state, change.effects, version=state.version + 1)
        assert followed.refs.get(b"refs/tags/t0012345x") is not None
        assert len(followed.refs) == len(state.refs) + 1

    return _cost(ledger_then_compute)


@pytest.mark.parametrize("with_main", [True, False], ids=["main", "head-gone"])
def test_one_ref_push_costs_the_same_at_4n_refs(with_main: bool) -> None:
    """``head-gone``: no main, so each commit repairs HEAD (rule head.repair) and looks
    for the first branch among the refs."""
    lines_n, bytes_n = _one_ref_push(_state(N, with_main=with_main))
    lines_4n, bytes_4n = _one_ref_push(_state(4 * N, with_main=with_main))
    print(f"{N} refs: {lines_n} lines, {bytes_n} B; {4 * N} refs: {lines_4n} lines, {bytes_4n} B")
    assert lines_4n <= RATIO_MAX * lines_n + SLACK_LINES
    assert bytes_4n <= RATIO_MAX * bytes_n + SLACK_BYTES
