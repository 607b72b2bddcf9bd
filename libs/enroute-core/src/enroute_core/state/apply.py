"""``apply``: the one entry point of the repository state machine.

Pure and deterministic (STYLE rules 7 and 8): the next state depends only on
the state, the command and the log index of its entry. Times come inside
commands, the upload window inside the activate command. The ledger applies
committed entries with it; computes apply the same commands to keep their
views, and reach the same state. Every rule below has a name, used by
``docs/state-machine.md`` and by the tests that check it.

version.every_entry
    Every entry applied to a live state advances ``version`` by one, refused
    or not (as a Raft applied index does), so a version names a log position
    and a checkpoint at version v covers exactly the entries up to it. A
    missing or deleted state never changes except by a claim: every replica
    that applied the tombstone holds the same final state.
inline.root
    An inline layer a command adds must hash (BLAKE3) to the root it names;
    otherwise the command is refused as ``corrupt_data`` and its bytes are
    never used (seed 004, "Storage service": an inline layer is read "after
    it checks them against the root").
incarnation.gate
    Commit and replace_layers name their incarnation; a missing state answers
    ``not_found``, a deleted one or another incarnation ``incarnation_ended``
    (seed 001, "Commands prepared against a deleted incarnation").
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import blake3

from enroute_core.base.ids import LogIndex, oid_to_hex
from enroute_core.state.commands import (
    Activate,
    Command,
    Commit,
    Delete,
    NewLayer,
    ReplaceLayers,
    added_layers,
    command_problem,
)
from enroute_core.state.effects import (
    ApplyResult,
    Created,
    Deleted,
    Effect,
    HeadChanged,
    LastPushChanged,
    LayersChanged,
    Outcome,
    OutcomeCode,
    PinsChanged,
    RefChanged,
    RefResult,
    RefStatus,
    UploadGenAdvanced,
)
from enroute_core.state.head import IMPLICIT_HEAD, repair_head
from enroute_core.state.model import (
    ID_SPACE,
    U64_MAX,
    LayerEntry,
    LayerKind,
    RefValue,
    RepoState,
    branch_problem,
    updatable_ref_problem,
)
from enroute_core.state.refmap import RefMap

ATOMIC_FAILURE = "atomic push failure"  # git receive-pack's reason for the other refs


def apply(state: RepoState, command: Command, *, log_index: int) -> ApplyResult:
    """Apply one committed log entry at ``log_index`` (the pin of an inline layer it adds)."""
    assert log_index >= 0, log_index
    problem = command_problem(command)
    if problem is not None:
        outcome = Outcome(
            OutcomeCode.INVALID_ARGUMENT, f"invalid command: {problem}", _details(reason=problem)
        )
        return _refuse(state, outcome, _aborted(command, outcome))
    corrupt = _inline_corruption(command)
    if corrupt is not None:
        return _refuse(state, corrupt, _aborted(command, corrupt))
    if isinstance(command, Activate):
        return _activate(state, command)
    if isinstance(command, Delete):
        return _delete(state, command)
    ended = _gate(state, command.incarnation)
    if ended is not None:
        return _refuse(state, ended)
    if isinstance(command, Commit):
        return _commit(state, command, LogIndex(log_index))
    return _replace_layers(state, command, LogIndex(log_index))


# -- shared -----------------------------------------------------------------------------------


def _details(**items: object) -> MappingProxyType[str, object]:
    return MappingProxyType(items)


def _tick(state: RepoState) -> RepoState:
    """Rule version.every_entry."""
    return dataclasses.replace(state, version=state.version + 1) if state.live else state


def _refuse(state: RepoState, outcome: Outcome, refs: tuple[RefResult, ...] = ()) -> ApplyResult:
    return ApplyResult(_tick(state), outcome, refs)


def _aborted(command: Command, outcome: Outcome) -> tuple[RefResult, ...]:
    """Every ref of a commit refused as a whole, so a push can report each one."""
    if not isinstance(command, Commit):
        return ()
    return tuple(
        RefResult(u.name, RefStatus.ABORTED, None, outcome.message) for u in command.ref_updates
    )


def _gate(state: RepoState, incarnation: int) -> Outcome | None:
    """Rule incarnation.gate."""
    if not state.exists:
        return Outcome(OutcomeCode.NOT_FOUND, "repository does not exist")
    if incarnation == state.incarnation and not state.deleted:
        return None
    if incarnation == state.incarnation:
        reason = "deleted"
    else:
        reason = "superseded" if incarnation < state.incarnation else "not this incarnation"
    return Outcome(
        OutcomeCode.INCARNATION_ENDED,
        f"incarnation {incarnation} has ended ({reason})",
        _details(incarnation=incarnation, current_incarnation=state.incarnation, reason=reason),
    )


def _inline_corruption(command: Command) -> Outcome | None:
    """Rule inline.root: the first inline layer whose bytes do not hash to its root."""
    for layer in added_layers(command):
        if layer.kind is not LayerKind.INLINE:
            continue
        found = blake3.blake3(layer.data).digest()
        if found != layer.root:
            return Outcome(
                OutcomeCode.CORRUPT_DATA,
                f"inline layer {layer.root.hex()[:16]}: its bytes hash to {found.hex()[:16]}",
                _details(section="inline", root=layer.root.hex()),
            )
    return None


def _window_refusal(state: RepoState, gen: int) -> Outcome:
    return Outcome(
        OutcomeCode.UPLOAD_WINDOW,
        f"layer generation {gen} is outside the upload window "
        f"({state.upload_gen - state.upload_window}, {state.upload_gen}]",
        _details(
            upload_gen=gen, current_upload_gen=state.upload_gen, upload_window=state.upload_window
        ),
    )


def _entry(layer: NewLayer, first_id: int, id_count: int, log_index: LogIndex) -> LayerEntry:
    inline = layer.kind is LayerKind.INLINE
    assert not inline or log_index >= 1, "an inline layer needs the log index that holds it"
    return LayerEntry(
        kind=layer.kind,
        first_id=first_id,
        id_count=id_count,
        object_count=layer.object_count,
        upload_gen=0 if inline else layer.upload_gen,
        file_size=layer.file_size,
        meta_size=layer.meta_size,
        root=layer.root,
        pin=log_index if inline else LogIndex(0),
    )


# -- activate (seed 001, "Creation") ----------------------------------------------------------


def _activate(state: RepoState, cmd: Activate) -> ApplyResult:
    """Rules activate.exists, activate.not_found, activate.claim, head.kept."""
    if state.live:
        code = OutcomeCode.EXISTS if cmd.create else OutcomeCode.OK
        return ApplyResult(_tick(state), Outcome(code, "", _details(incarnation=state.incarnation)))
    if not cmd.create:
        return ApplyResult(state, Outcome(OutcomeCode.NOT_FOUND, "repository does not exist"))
    head = IMPLICIT_HEAD if cmd.head is None else cmd.head
    problem = branch_problem(head)
    if problem is not None:
        shown = head[:200].decode("utf-8", "replace")
        outcome = Outcome(
            OutcomeCode.INVALID_REF_NAME,
            f"invalid HEAD {shown!r}: {problem}",
            _details(name=shown, reason=problem),
        )
        return ApplyResult(state, outcome)
    upload_gen = state.upload_gen + cmd.upload_window + 1
    if upload_gen > U64_MAX:
        outcome = Outcome(
            OutcomeCode.LIMIT_EXCEEDED,
            "upload generations are exhausted",
            _details(limit="upload_gen", value=upload_gen, maximum=U64_MAX),
        )
        return ApplyResult(state, outcome)
    claimed = RepoState(
        incarnation=state.incarnation + 1,
        version=state.version + 1,
        head=head,
        head_kept=cmd.head is not None,
        upload_gen=upload_gen,
        upload_window=cmd.upload_window,
    )
    created = Created(
        claimed.incarnation, claimed.version, upload_gen, cmd.upload_window, head, claimed.head_kept
    )
    return ApplyResult(
        claimed,
        Outcome(OutcomeCode.OK, "", _details(incarnation=claimed.incarnation)),
        effects=(created,),
    )


# -- delete (seed 001, "Deletion") ------------------------------------------------------------


def _delete(state: RepoState, cmd: Delete) -> ApplyResult:
    """Rules delete.tombstone, delete.idempotent."""
    if not state.live or cmd.incarnation < state.incarnation:
        outcome = Outcome(OutcomeCode.ALREADY_DELETED, "", _details(incarnation=cmd.incarnation))
        return ApplyResult(_tick(state), outcome)
    if cmd.incarnation != state.incarnation:
        ended = _gate(state, cmd.incarnation)
        assert ended is not None
        return _refuse(state, ended)
    tombstone = RepoState(
        incarnation=state.incarnation,
        deleted=True,
        version=state.version + 1,
        upload_gen=state.upload_gen,
        upload_window=state.upload_window,
    )
    effects: list[Effect] = []
    pins = state.pins()
    if pins:
        effects.append(PinsChanged(added=(), released=pins))
    effects.append(Deleted(state.incarnation, state.upload_gen))
    outcome = Outcome(OutcomeCode.OK, "", _details(incarnation=state.incarnation))
    return ApplyResult(tombstone, outcome, effects=tuple(effects))


# -- commit -----------------------------------------------------------------------------------


def _check_refs(state: RepoState, cmd: Commit) -> list[RefResult]:
    """Rules refs.name and refs.cas, each ref on its own."""
    results = []
    for update in cmd.ref_updates:
        current = state.refs.get(update.name)
        problem = updatable_ref_problem(update.name)
        if problem is not None:
            results.append(
                RefResult(
                    update.name, RefStatus.INVALID_NAME, current, f"invalid ref name: {problem}"
                )
            )
        elif (None if current is None else current.oid) != update.old_oid:
            results.append(RefResult(update.name, RefStatus.STALE, current, "stale ref"))
        else:
            results.append(RefResult(update.name, RefStatus.OK, current))
    return results


def _ref_refusal(first: RefResult) -> Outcome:
    shown = first.name[:200].decode("utf-8", "replace")
    if first.status is RefStatus.INVALID_NAME:
        return Outcome(
            OutcomeCode.INVALID_REF_NAME,
            f"{shown}: {first.reason}",
            _details(name=shown, reason=first.reason),
        )
    current = None if first.current is None else oid_to_hex(first.current.oid)
    return Outcome(
        OutcomeCode.STALE_REF,
        f"{shown} is at {current or 'nothing (unborn)'}, not the expected value",
        _details(ref=shown, current_oid=current),
    )


def _commit(state: RepoState, cmd: Commit, log_index: LogIndex) -> ApplyResult:
    """Rules layer.window, layer.id_space, refs.atomic, refs.independent, refs.set_time,
    last_push.monotonic, layer.assign, upload_gen.advance, head.repair."""
    layer = cmd.new_layer
    if layer is not None:
        refusal = None
        if layer.kind is LayerKind.STORED and not state.accepts_upload_gen(layer.upload_gen):
            refusal = _window_refusal(state, layer.upload_gen)
        elif state.next_id + layer.object_count > ID_SPACE:
            end = state.next_id + layer.object_count
            refusal = Outcome(
                OutcomeCode.LIMIT_EXCEEDED,
                f"the layer would end at id {end}, past the 32-bit id space",
                _details(limit="object_id_space", value=end, maximum=ID_SPACE),
            )
        if refusal is not None:
            return _refuse(state, refusal, _aborted(cmd, refusal))

    results = _check_refs(state, cmd)
    failed = [r for r in results if r.status is not RefStatus.OK]
    if failed and (cmd.atomic or len(failed) == len(results)):
        outcome = _ref_refusal(failed[0])
        if cmd.atomic:
            results = [
                dataclasses.replace(r, status=RefStatus.ABORTED, reason=ATOMIC_FAILURE)
                if r.status is RefStatus.OK
                else r
                for r in results
            ]
        return _refuse(state, outcome, tuple(results))

    # only the refs this commit names are touched: the map shares the rest (refmap.py)
    changes: dict[bytes, RefValue | None] = {}
    effects: list[Effect] = []
    moved = False
    for update, result in zip(cmd.ref_updates, results, strict=True):
        if result.status is not RefStatus.OK:
            continue
        old = result.current  # names are unique in a commit (command_problem)
        if update.new_oid is None:
            if old is not None:
                changes[update.name] = None
                effects.append(RefChanged(update.name, old, None))
                moved = True
            continue
        value = RefValue(update.new_oid, cmd.stamp_us)
        changes[update.name] = value
        effects.append(RefChanged(update.name, old, value))
        moved = moved or old is None or old.oid != update.new_oid
    refs = RefMap.of(state.refs).updated(changes)

    manifest, next_id, upload_gen = state.manifest, state.next_id, state.upload_gen
    if layer is not None:
        entry = _entry(layer, state.next_id, layer.object_count, log_index)
        manifest, next_id = (*manifest, entry), entry.end_id
        effects.append(LayersChanged(removed=(), added=(entry,), added_data=(layer.data,)))
        if entry.kind is LayerKind.INLINE:
            effects.append(PinsChanged(added=(entry.pin,), released=()))
        else:
            upload_gen += 1
            effects.append(UploadGenAdvanced(upload_gen))
    last_push = state.last_push_us
    if cmd.is_push and moved and (last_push is None or cmd.stamp_us > last_push):
        effects.append(LastPushChanged(last_push, cmd.stamp_us))
        last_push = cmd.stamp_us
    head = repair_head(state.head, state.head_kept, refs)
    if head != state.head:
        effects.append(HeadChanged(state.head, head))
    new_state = dataclasses.replace(
        state,
        version=state.version + 1,
        head=head,
        refs=refs,
        manifest=manifest,
        next_id=next_id,
        upload_gen=upload_gen,
        last_push_us=last_push,
    )
    outcome = Outcome(OutcomeCode.OK)
    return ApplyResult(new_state, outcome, tuple(results), tuple(effects))


# -- replace_layers (seed 004, "Stable object numbering": Assignment) --------------------------


def _replace_layers(state: RepoState, cmd: ReplaceLayers, log_index: LogIndex) -> ApplyResult:
    """Rules replace.run, replace.outputs, layer.window, replace.pins, upload_gen.advance."""
    start = state.layer_index(cmd.run_first_id)
    count = len(cmd.run_roots)
    run = () if start is None else state.manifest[start : start + count]
    if start is None or tuple(e.root for e in run) != cmd.run_roots:
        return _refuse(
            state,
            Outcome(
                OutcomeCode.STALE_RUN,
                f"the manifest has no run of {count} layers from id {cmd.run_first_id} "
                "with these roots",
                _details(run_first_id=cmd.run_first_id, run_layers=count),
            ),
        )
    assert start is not None
    low, high = run[0].first_id, run[-1].end_id
    end = low
    for out in cmd.outputs:
        if out.first_id < end or out.first_id + out.id_count > high:
            return _refuse(
                state,
                Outcome(
                    OutcomeCode.INVALID_ARGUMENT,
                    f"output ranges must be ascending, disjoint and within the run's ids "
                    f"[{low}, {high})",
                    _details(
                        reason="outputs", run_low=low, run_high=high, output_first_id=out.first_id
                    ),
                ),
            )
        end = out.first_id + out.id_count
        if out.layer.kind is LayerKind.STORED and not state.accepts_upload_gen(
            out.layer.upload_gen
        ):
            return _refuse(state, _window_refusal(state, out.layer.upload_gen))

    added = tuple(_entry(o.layer, o.first_id, o.id_count, log_index) for o in cmd.outputs)
    manifest = (*state.manifest[:start], *added, *state.manifest[start + count :])
    data = tuple(o.layer.data for o in cmd.outputs)
    effects: list[Effect] = [LayersChanged(removed=tuple(run), added=added, added_data=data)]
    pins_added = tuple(e.pin for e in added if e.kind is LayerKind.INLINE)
    pins_released = tuple(e.pin for e in run if e.kind is LayerKind.INLINE)
    if pins_added or pins_released:
        effects.append(PinsChanged(added=pins_added, released=pins_released))
    upload_gen = state.upload_gen
    if any(e.kind is LayerKind.STORED for e in added):
        upload_gen += 1
        effects.append(UploadGenAdvanced(upload_gen))
    new_state = dataclasses.replace(
        state, manifest=manifest, upload_gen=upload_gen, version=state.version + 1
    )
    return ApplyResult(new_state, Outcome(OutcomeCode.OK), (), tuple(effects))
