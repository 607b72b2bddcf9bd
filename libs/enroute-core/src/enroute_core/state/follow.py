"""Follow the ledger: rebuild the next state from the effects of one applied entry.

A compute's subscription delivers, per applied entry, its version and its
encoded :class:`~enroute_core.state.effects.Change` (``docs/rpc.md``,
Subscribe). :func:`apply_change` turns the state the compute holds into the
state the ledger holds after that entry, without the command: effects carry
every changed value (ref values with their times, whole layer entries and
inline layer bytes, HEAD, counters). The property tests check that following
the changes gives exactly the states ``apply`` gives.

A change that does not fit the state (a ref's old value differs, a removed
run is not in the manifest, a version that does not follow) means the
follower missed something: :class:`CorruptData` (section ``change``), and the
caller takes a snapshot again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from enroute_core.base.errors import CorruptData
from enroute_core.state.effects import (
    Created,
    Deleted,
    Effect,
    HeadChanged,
    LastPushChanged,
    LayersChanged,
    PinsChanged,
    RefChanged,
    UploadGenAdvanced,
)
from enroute_core.state.model import LayerEntry, RefValue, RepoState
from enroute_core.state.refmap import RefMap


def _diverged(what: str) -> CorruptData:
    return CorruptData(f"change does not follow the state: {what}", section="change")


def _splice(
    manifest: tuple[LayerEntry, ...], next_id: int, change: LayersChanged
) -> tuple[tuple[LayerEntry, ...], int]:
    if not change.removed:
        for entry in change.added:
            if entry.first_id != next_id:
                raise _diverged(f"pushed layer starts at {entry.first_id}, not {next_id}")
            next_id = entry.end_id
        return (*manifest, *change.added), next_id
    first = change.removed[0].first_id
    starts = [e.first_id for e in manifest]
    if first not in starts:
        raise _diverged(f"no layer starts at id {first}")
    start = starts.index(first)
    end = start + len(change.removed)
    if manifest[start:end] != change.removed:
        raise _diverged(f"the run at id {first} differs")
    return (*manifest[:start], *change.added, *manifest[end:]), next_id


def apply_change(state: RepoState, effects: Iterable[Effect], *, version: int) -> RepoState:
    """The state after the entry whose effects are ``effects`` and whose version is
    ``version``. An entry with no effects on a live state only advances the version
    (rule version.every_entry); on a missing or deleted state it changes nothing."""
    effects = tuple(effects)
    if effects and isinstance(effects[0], Created):
        created = effects[0]
        if len(effects) != 1 or created.version != version or state.live:
            raise _diverged("a claim is the only effect of its entry, on a state not live")
        return RepoState(
            incarnation=created.incarnation,
            version=created.version,
            head=created.head,
            head_kept=created.head_kept,
            upload_gen=created.upload_gen,
            upload_window=created.upload_window,
        )
    if not state.live:
        if effects:
            raise _diverged("effects on a missing or deleted state")
        return state
    if version != state.version + 1:
        raise _diverged(f"version {version} does not follow {state.version}")
    # the refs the effects name, made on the state's map at the end (refmap.py)
    changes: dict[bytes, RefValue | None] = {}
    head, manifest, next_id = state.head, state.manifest, state.next_id
    upload_gen, last_push = state.upload_gen, state.last_push_us
    for effect in effects:
        if isinstance(effect, RefChanged):
            name = effect.name
            current = changes[name] if name in changes else state.refs.get(name)
            if current != effect.old:
                raise _diverged(f"ref {effect.name[:100]!r} is not at its old value")
            changes[effect.name] = effect.new
        elif isinstance(effect, HeadChanged):
            if head != effect.old:
                raise _diverged("HEAD is not at its old value")
            head = effect.new
        elif isinstance(effect, LayersChanged):
            manifest, next_id = _splice(manifest, next_id, effect)
        elif isinstance(effect, LastPushChanged):
            if last_push != effect.old_us:
                raise _diverged("last push is not at its old value")
            last_push = effect.new_us
        elif isinstance(effect, UploadGenAdvanced):
            upload_gen = effect.upload_gen
        elif isinstance(effect, Deleted):
            if effect.incarnation != state.incarnation:
                raise _diverged("tombstone of another incarnation")
            return RepoState(
                incarnation=state.incarnation,
                deleted=True,
                version=version,
                upload_gen=effect.last_upload_gen,
                upload_window=state.upload_window,
            )
        elif not isinstance(effect, PinsChanged):  # pins follow from the manifest
            raise _diverged(f"unexpected effect {type(effect).__name__}")
    return dataclasses.replace(
        state,
        version=version,
        head=head,
        refs=RefMap.of(state.refs).updated(changes) if changes else state.refs,
        manifest=manifest,
        next_id=next_id,
        upload_gen=upload_gen,
        last_push_us=last_push,
    )
