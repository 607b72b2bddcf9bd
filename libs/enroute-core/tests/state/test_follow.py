"""Following the ledger from changes (``apply_change``): what a subscribed compute does.

The property test (``test_properties.py``) checks that following every change
gives the state ``apply`` gives; these check that a change that does not fit
the follower's state is refused as diverged, never applied halfway.
"""

from __future__ import annotations

import blake3
import pytest

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    MISSING,
    Activate,
    Commit,
    Delete,
    LayerKind,
    NewLayer,
    RefUpdate,
    ReplaceLayers,
    RepoState,
    apply,
    apply_change,
    decode_change,
    encode_change,
)

A, B = ObjectId(b"\x01" * 20), ObjectId(b"\x02" * 20)
MAIN = b"refs/heads/main"


def _data(tag: int) -> bytes:
    return b"abc" + bytes([tag])


def _root(tag: int) -> bytes:
    """The BLAKE3 of inline layer ``tag``'s bytes (rule inline.root)."""
    return blake3.blake3(_data(tag)).digest()


def _inline(tag: int) -> NewLayer:
    return NewLayer(LayerKind.INLINE, 2, 4, 1, _root(tag), data=_data(tag))


def _follow(state: RepoState, cmd: object, index: int) -> tuple[RepoState, RepoState]:
    """(the applied state, the followed state) after ``cmd``."""
    result = apply(state, cmd, log_index=index)  # type: ignore[arg-type]
    change = decode_change(encode_change(result.change))
    return result.state, apply_change(state, change.effects, version=result.state.version)


def test_a_whole_lifecycle_is_followed_exactly() -> None:
    state = MISSING
    commands = [
        Activate(True, None, 8),
        Commit(1, (RefUpdate(MAIN, None, A),), _inline(1), 10, True),
        Commit(1, (RefUpdate(b"refs/heads/x", None, B),), _inline(2), 11, True),
        Commit(1, (RefUpdate(MAIN, B, A),), None, 12, True),  # refused: version only
        ReplaceLayers(1, 0, (_root(1), _root(2)), ()),
        Delete(1),
        Activate(True, MAIN, 8),
    ]
    for index, cmd in enumerate(commands, start=1):
        applied, followed = _follow(state, cmd, index)
        assert followed == applied, cmd
        state = applied
    assert state.incarnation == 2 and state.head_kept


def test_inline_layer_bytes_reach_the_follower() -> None:
    live = apply(MISSING, Activate(True), log_index=1).state
    result = apply(live, Commit(1, (), _inline(3), 5, True), log_index=2)
    change = decode_change(encode_change(result.change))
    layers = [e for e in change.effects if type(e).__name__ == "LayersChanged"]
    assert layers and layers[0].added_data == (_data(3),)  # type: ignore[union-attr]


def _diverges(state: RepoState, effects: tuple[object, ...], version: int) -> None:
    with pytest.raises(CorruptData) as info:
        apply_change(state, effects, version=version)  # type: ignore[arg-type]
    assert info.value.section == "change"


def test_a_change_that_does_not_fit_is_refused_as_diverged() -> None:
    live = apply(MISSING, Activate(True), log_index=1).state
    pushed = apply(live, Commit(1, (RefUpdate(MAIN, None, A),), _inline(1), 5, True), log_index=2)
    effects = pushed.change.effects
    v = pushed.state.version
    _diverges(live, effects, v + 1)  # a version skipped
    moved = apply(live, Commit(1, (RefUpdate(MAIN, None, B),), None, 5, True), log_index=2).state
    _diverges(moved, effects, moved.version + 1)  # the ref is elsewhere
    layered = apply(live, Commit(1, (), _inline(9), 5, True), log_index=2).state
    _diverges(layered, effects[1:], layered.version + 1)  # pushed layer not at next_id
    replaced = apply(pushed.state, ReplaceLayers(1, 0, (_root(1),), ()), log_index=3).change.effects
    _diverges(layered, replaced, layered.version + 1)  # a run the follower lacks
    claim = apply(MISSING, Activate(True), log_index=1).change.effects
    _diverges(live, claim, live.version + 1)  # a claim on a live state
    gone = apply(live, Delete(1), log_index=2).state
    _diverges(gone, effects, gone.version + 1)  # effects after the tombstone
