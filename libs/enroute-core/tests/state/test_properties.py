"""Property tests: random command sequences against the invariants and a simple ref model.

Each example applies a random sequence (biased towards commands that can
succeed: current incarnation, current ref values, generations inside the
window, runs of the real manifest) and checks after every step:

- every state invariant (``state_problem``): manifest ranges ascending and
  disjoint and below ``next_id``, valid refs, canonical deleted states;
- version.every_entry: +1 on a live state, a claim +1, nothing else moves;
- ``next_id`` and ``upload_gen`` never decrease, ``last_push`` never moves back
  within an incarnation;
- refs follow compare-and-swap as a dictionary model computes it, with the
  commit's stamp as set time;
- effects replay: the ref changes rebuild the new refs, and the pins taken
  and released account for the pins of the new manifest;
- the checkpoint, every command and every change survive an encode/decode
  round trip, and following the decoded change (``apply_change``, what a
  subscribed compute does) gives the same state as ``apply``.

Then the same commands, applied again and applied after an encode/decode of
each, give equal results and byte-identical checkpoints (what a compute
relies on to follow the ledger). Replay a failure with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import secrets
from collections import Counter
from collections.abc import Iterator

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    ID_SPACE,
    MISSING,
    Activate,
    ApplyResult,
    Command,
    Commit,
    Delete,
    LayerKind,
    NewLayer,
    OutcomeCode,
    PlacedLayer,
    RefChanged,
    RefUpdate,
    ReplaceLayers,
    RepoState,
    apply,
    apply_change,
    decode_change,
    decode_command,
    decode_state,
    encode_change,
    encode_command,
    encode_state,
    state_problem,
)
from enroute_core.state.commands import command_problem

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))

VALID_NAMES = [b"refs/heads/main", b"refs/heads/master", b"refs/heads/a", b"refs/tags/v1"]
INVALID_NAMES = [b"refs/heads/bad..x", b"HEAD"]
OIDS = [ObjectId(bytes([i]) * 20) for i in range(1, 5)]
HEADS = [None, b"refs/heads/main", b"refs/heads/b", b"refs/tags/x"]


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


# -- drawing commands -------------------------------------------------------------------------


def _data(tag: int) -> bytes:
    return tag.to_bytes(8, "big")


def _root(tag: int) -> bytes:
    """Layer ``tag``'s root: the BLAKE3 of its bytes when it is inline (rule inline.root)."""
    return blake3.blake3(_data(tag)).digest()


def _incarnation(rng: random.Random, state: RepoState) -> int:
    current = max(state.incarnation, 1)
    return rng.choice([current] * 6 + [current + 1, max(current - 1, 1)])


def _new_layer(rng: random.Random, state: RepoState, count: int, tag: int) -> NewLayer:
    if rng.random() < 0.5:
        return NewLayer(LayerKind.INLINE, count, 8, 1, _root(tag), data=_data(tag))
    g, w = state.upload_gen, state.upload_window
    gen = rng.choice([g, g, g - 1, g - w + 1, g - w, g + 1])
    return NewLayer(LayerKind.STORED, count, 100, 10, _root(tag), upload_gen=max(gen, 0))


def _commit(rng: random.Random, state: RepoState, tag: int) -> Commit:
    names = rng.sample(VALID_NAMES + INVALID_NAMES, rng.randint(0, 4))
    updates = []
    for name in names:
        current = state.refs.get(name)
        old = rng.choice([None if current is None else current.oid] * 3 + [None, *OIDS])
        new = rng.choice([None, *OIDS])
        updates.append(RefUpdate(name, old, new))
    layer = None
    choice = rng.choice(["none", "none", "small", "small", "edge"])
    if choice == "small":
        layer = _new_layer(rng, state, rng.randint(1, 5), tag)
    elif choice == "edge":  # exactly filling, or one past, the 32-bit id space
        left = ID_SPACE - state.next_id
        count = min(max(left + rng.randint(0, 1), 1), ID_SPACE)
        layer = _new_layer(rng, state, count, tag)
    return Commit(
        incarnation=_incarnation(rng, state),
        ref_updates=tuple(updates),
        new_layer=layer,
        stamp_us=rng.randint(0, 10**6),
        is_push=rng.random() < 0.5,
        atomic=rng.random() < 0.5,
    )


def _replace(rng: random.Random, state: RepoState, tag: int) -> ReplaceLayers:
    inc = _incarnation(rng, state)
    manifest = state.manifest
    if not manifest or rng.randint(0, 9) == 0:
        first = rng.randint(0, 20)
        return ReplaceLayers(inc, first, (_root(rng.randint(0, tag)),), ())
    start = rng.randint(0, len(manifest) - 1)
    count = rng.randint(1, min(3, len(manifest) - start))
    run = manifest[start : start + count]
    low, high = run[0].first_id, run[-1].end_id
    top = min(high - 1, low + 50)
    cuts = {rng.randint(low + 1, top) for _ in range(rng.randint(0, 3))} if top > low else set()
    bounds = [low, *sorted(cuts), high]
    outputs = []
    for i, (start_id, end_id) in enumerate(itertools.pairwise(bounds)):
        if rng.randint(0, 4) == 0:
            continue  # drop the piece: a hole
        first_id = start_id
        if rng.randint(0, 19) == 0:
            first_id = max(start_id - 1, 0)  # an overlap or a start before the run: refused
        ids = end_id - first_id
        objects = rng.randint(1, ids) if ids <= 5 else ids
        outputs.append(PlacedLayer(first_id, ids, _new_layer(rng, state, objects, tag * 8 + i)))
    roots = tuple(e.root for e in run)
    if rng.randint(0, 19) == 0:
        roots = roots[1:] + roots[:1]
    return ReplaceLayers(inc, run[0].first_id, roots, tuple(outputs))


def _command(rng: random.Random, state: RepoState, tag: int) -> Command:
    if not state.live and rng.random() < 0.6:
        return Activate(True, rng.choice(HEADS), rng.choice([1, 4, 64]))
    kind = rng.choice(["commit"] * 12 + ["replace"] * 5 + ["activate", "activate", "delete"])
    if kind == "commit":
        return _commit(rng, state, tag)
    if kind == "replace":
        return _replace(rng, state, tag)
    if kind == "activate":
        window = rng.choice([1, 4, 64])
        return Activate(rng.random() < 0.5, rng.choice(HEADS), window)
    return Delete(_incarnation(rng, state))


# -- the model --------------------------------------------------------------------------------


def _model_refs(before: RepoState, cmd: Commit) -> dict[bytes, ObjectId]:
    refs = {name: value.oid for name, value in before.refs.items()}
    if not before.live or cmd.incarnation != before.incarnation:
        return refs
    layer = cmd.new_layer
    if layer is not None:
        if layer.kind is LayerKind.STORED and not (
            before.upload_gen - before.upload_window < layer.upload_gen <= before.upload_gen
        ):
            return refs
        if before.next_id + layer.object_count > ID_SPACE:
            return refs
    good = [u for u in cmd.ref_updates if u.name in VALID_NAMES and refs.get(u.name) == u.old_oid]
    if len(good) < len(cmd.ref_updates) and (cmd.atomic or not good):
        return refs
    for u in good:
        if u.new_oid is None:
            refs.pop(u.name, None)
        else:
            refs[u.name] = u.new_oid
    return refs


def _check_step(before: RepoState, cmd: Command, result: ApplyResult) -> None:
    after = result.state
    assert state_problem(after) is None, state_problem(after)
    claimed = (
        isinstance(cmd, Activate) and not before.live and result.outcome.code is OutcomeCode.OK
    )
    if before.live:
        assert after.version == before.version + 1
    elif claimed:
        assert after.version == before.version + 1
        assert after.incarnation == before.incarnation + 1
    else:
        assert after == before
    if after.incarnation == before.incarnation:
        assert after.upload_gen >= before.upload_gen
        if after.live:
            assert after.next_id >= before.next_id
            if before.last_push_us is not None:
                assert after.last_push_us is not None
                assert after.last_push_us >= before.last_push_us
    if not result.outcome.ok and before.live:
        assert after == dataclass_replace_version(before, after.version)
    if isinstance(cmd, Commit):
        assert {n: v.oid for n, v in after.refs.items()} == _model_refs(before, cmd)
        for u in cmd.ref_updates:
            value = after.refs.get(u.name)
            if value is not None and value != before.refs.get(u.name):
                assert value.set_time_us == cmd.stamp_us
    if after.live:
        replayed = dict(before.refs)
        for effect in result.effects:
            if isinstance(effect, RefChanged):
                assert replayed.get(effect.name) == effect.old
                if effect.new is None:
                    del replayed[effect.name]
                else:
                    replayed[effect.name] = effect.new
        assert replayed == dict(after.refs)
    held = Counter(before.pins()) + Counter(result.pins_added)
    assert held == Counter(after.pins()) + Counter(result.pins_released)
    assert decode_state(encode_state(after)) == after
    change = decode_change(encode_change(result.change))
    assert change == result.change
    assert apply_change(before, change.effects, version=after.version) == after
    if command_problem(cmd) is None:
        assert decode_command(encode_command(cmd)) == cmd


def dataclass_replace_version(state: RepoState, version: int) -> RepoState:
    return dataclasses.replace(state, version=version)


def _replay(commands: list[Command], via_codec: bool) -> tuple[list[ApplyResult], bytes]:
    state = MISSING
    results = []
    for index, original in enumerate(commands, start=1):
        cmd = original
        if via_codec and command_problem(cmd) is None:
            cmd = decode_command(encode_command(cmd))
        result = apply(state, cmd, log_index=index)
        results.append(result)
        state = result.state
    return results, encode_state(state)


@hypothesis_seed(SEED)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_random_command_sequences_keep_every_invariant_and_replay_identically(
    seed: int, steps: int
) -> None:
    rng = random.Random(seed)
    first = Activate(True, rng.choice(HEADS[:3]), rng.choice([2, 64]))
    commands: list[Command] = [first]
    results = [apply(MISSING, first, log_index=1)]
    _check_step(MISSING, first, results[0])
    state = results[0].state
    for index in range(2, steps + 2):
        cmd = _command(rng, state, index)
        commands.append(cmd)
        result = apply(state, cmd, log_index=index)
        _check_step(state, cmd, result)
        results.append(result)
        state = result.state
    again, checkpoint = _replay(commands, via_codec=False)
    assert again == results and checkpoint == encode_state(state)
    decoded, checkpoint2 = _replay(commands, via_codec=True)
    assert decoded == results and checkpoint2 == checkpoint


@hypothesis_seed(SEED)
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(3, 25), st.floats(0, 1))
def test_checkpoint_restore_then_continue_matches_uninterrupted_apply(
    seed: int, steps: int, cut_at: float
) -> None:
    """A node that restores from a checkpoint mid-log reaches the same state."""
    rng = random.Random(seed)
    state = apply(MISSING, Activate(True, None, 4), log_index=1).state
    commands = []
    for index in range(2, steps):
        cmd = _command(rng, state, index)
        commands.append((index, cmd))
        state = apply(state, cmd, log_index=index).state
    cut = int(cut_at * len(commands))
    restored = apply(MISSING, Activate(True, None, 4), log_index=1).state
    for index, cmd in commands[:cut]:
        restored = apply(restored, cmd, log_index=index).state
    restored = decode_state(encode_state(restored))
    for index, cmd in commands[cut:]:
        restored = apply(restored, cmd, log_index=index).state
    assert restored == state and encode_state(restored) == encode_state(state)
