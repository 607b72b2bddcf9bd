"""One test per rule of the repository state machine (``docs/state-machine.md``).

Test names cite the rule: ``seed001_*`` for seed 001 (Lifecycle), ``seed004_*``
for seed 004 ("Stable object numbering": Assignment), ``design_*`` for DESIGN,
"Repository state".
"""

from __future__ import annotations

import dataclasses

import blake3
import pytest

from enroute_core.base.errors import (
    CorruptData,
    IncarnationEnded,
    InvalidArgument,
    InvalidRefName,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    StaleRef,
)
from enroute_core.base.ids import LogIndex, ObjectId
from enroute_core.state import (
    ID_SPACE,
    MISSING,
    Activate,
    ApplyResult,
    Commit,
    Created,
    Delete,
    Deleted,
    HeadChanged,
    LastPushChanged,
    LayerEntry,
    LayerKind,
    LayersChanged,
    NewLayer,
    OutcomeCode,
    PinsChanged,
    PlacedLayer,
    RefChanged,
    RefStatus,
    RefUpdate,
    RefValue,
    ReplaceLayers,
    RepoState,
    UploadGenAdvanced,
    added_layers,
    apply,
    state_problem,
)
from enroute_core.state.head import branch_ref, repair_head

A, B, C, D = (ObjectId(bytes([i]) * 20) for i in (1, 2, 3, 4))
MAIN, MASTER = b"refs/heads/main", b"refs/heads/master"


def root(i: int) -> bytes:
    """The root of layer ``i``: the BLAKE3 of its bytes when it is inline (rule inline.root)."""
    return blake3.blake3(bytes([i]) * 8).digest()


def inline(count: int, r: int = 9) -> NewLayer:
    return NewLayer(LayerKind.INLINE, count, 8, 2, root(r), data=bytes([r]) * 8)


def stored(count: int, gen: int, r: int = 7) -> NewLayer:
    return NewLayer(LayerKind.STORED, count, 1000, 100, root(r), upload_gen=gen)


def run(state: RepoState, cmd: object, log_index: int = 10) -> ApplyResult:
    result = apply(state, cmd, log_index=log_index)  # type: ignore[arg-type]
    assert state_problem(result.state) is None, state_problem(result.state)
    return result


def create(head: bytes | None = None, window: int = 64, state: RepoState = MISSING) -> RepoState:
    result = run(state, Activate(create=True, head=head, upload_window=window), log_index=1)
    assert result.outcome.code is OutcomeCode.OK
    return result.state


def commit(
    state: RepoState,
    *updates: RefUpdate,
    layer: NewLayer | None = None,
    stamp: int = 1000,
    is_push: bool = True,
    atomic: bool = True,
    incarnation: int | None = None,
    log_index: int = 10,
) -> ApplyResult:
    inc = state.incarnation if incarnation is None else incarnation
    return run(state, Commit(inc, updates, layer, stamp, is_push, atomic), log_index)


def set_ref(state: RepoState, name: bytes, oid: ObjectId, stamp: int = 1000) -> RepoState:
    old = state.refs.get(name)
    result = commit(state, RefUpdate(name, None if old is None else old.oid, oid), stamp=stamp)
    assert result.outcome.ok, result.outcome
    return result.state


def unchanged_but_version(before: RepoState, after: RepoState) -> bool:
    return dataclasses.replace(after, version=before.version) == before


# -- activate ---------------------------------------------------------------------------------


def test_seed001_create_claims_incarnation_one_from_missing() -> None:
    result = run(MISSING, Activate(create=True, head=MAIN, upload_window=64))
    s = result.state
    assert (s.incarnation, s.version, s.deleted, s.head, s.head_kept) == (1, 1, False, MAIN, True)
    assert (s.upload_gen, s.upload_window, s.next_id, dict(s.refs), s.manifest) == (
        65, 64, 0, {}, ()
    )  # fmt: skip
    assert s.last_push_us is None
    assert result.effects == (Created(1, 1, 65, 64, MAIN, True),)


def test_seed001_recreate_claims_next_incarnation_from_deleted_state() -> None:
    s = set_ref(create(MAIN), MAIN, A)
    s = commit(s, layer=stored(3, s.upload_gen)).state
    s = commit(s, layer=inline(2), log_index=30).state
    gone = run(s, Delete(1)).state
    again = run(gone, Activate(create=True, head=MASTER, upload_window=16)).state
    assert again.incarnation == 2 and again.live
    assert again.version == gone.version + 1  # "one more than the last version of E"
    assert again.upload_gen == gone.upload_gen + 16 + 1  # "plus the upload window, plus 1"
    assert (dict(again.refs), again.manifest, again.next_id, again.last_push_us) == (
        {}, (), 0, None
    )  # fmt: skip
    assert again.head == MASTER and again.head_kept


def test_seed001_stored_layer_of_ended_incarnation_is_below_new_window() -> None:
    s = create(window=8)
    last_gen_of_e = s.upload_gen
    gone = run(s, Delete(1)).state
    again = create(state=gone, window=8)
    assert not again.accepts_upload_gen(last_gen_of_e)
    assert again.sweepable_gen_max >= last_gen_of_e
    result = commit(again, RefUpdate(MAIN, None, A), layer=stored(1, last_gen_of_e))
    assert result.outcome.code is OutcomeCode.UPLOAD_WINDOW


def test_seed001_creating_an_existing_repository_changes_nothing_and_answers_exists() -> None:
    s = set_ref(create(MAIN), MAIN, A)
    result = run(s, Activate(create=True, head=MASTER, upload_window=3))
    assert result.outcome.code is OutcomeCode.EXISTS and result.outcome.ok
    assert unchanged_but_version(s, result.state) and result.effects == ()
    plain = run(s, Activate(create=False))
    assert plain.outcome.code is OutcomeCode.OK and unchanged_but_version(s, plain.state)


def test_seed001_activate_without_create_on_missing_or_deleted_is_not_found() -> None:
    gone = run(create(), Delete(1)).state
    for state in (MISSING, gone):
        result = run(state, Activate(create=False))
        assert result.outcome.code is OutcomeCode.NOT_FOUND
        assert result.state == state
        assert isinstance(result.outcome.error(), NotFound)


def test_activate_invalid_head_is_refused_and_claims_nothing() -> None:
    for head in (b"refs/tags/v1", b"refs/heads/", b"refs/heads/a..b", b"main"):
        result = run(MISSING, Activate(create=True, head=head))
        assert result.outcome.code is OutcomeCode.INVALID_REF_NAME, head
        assert result.state == MISSING
        assert isinstance(result.outcome.error(), InvalidRefName)


def test_activate_claim_refused_when_upload_generations_run_out() -> None:
    gone = RepoState(incarnation=1, deleted=True, version=5, upload_gen=2**64 - 10, upload_window=1)
    result = run(gone, Activate(create=True, upload_window=64))
    assert result.outcome.code is OutcomeCode.LIMIT_EXCEEDED and result.state == gone


# -- HEAD (seed 001, "Creation"; DESIGN HEAD rules) ------------------------------------------


def test_seed001_creation_kept_head_stays_on_unborn_branch() -> None:
    s = set_ref(create(MAIN), b"refs/heads/dev", A)
    assert s.head == MAIN and MAIN not in s.refs


def test_seed001_creation_kept_head_stays_on_deleted_branch() -> None:
    s = set_ref(set_ref(create(MAIN), MAIN, A), MASTER, B)
    result = commit(s, RefUpdate(MAIN, A, None))
    assert result.outcome.ok and result.state.head == MAIN
    assert not any(isinstance(e, HeadChanged) for e in result.effects)


def test_seed001_push_created_head_repairs_to_main_then_master_then_first() -> None:
    s = create()  # implicit create: HEAD refs/heads/main, not kept
    assert s.head == MAIN and not s.head_kept
    s = set_ref(s, b"refs/heads/zeta", A)
    assert s.head == b"refs/heads/zeta"  # the only branch
    s = set_ref(set_ref(s, b"refs/heads/alpha", B), MASTER, C)
    result = commit(s, RefUpdate(b"refs/heads/zeta", A, None))
    assert result.state.head == MASTER  # master before the first in byte order
    assert HeadChanged(b"refs/heads/zeta", MASTER) in result.effects
    s = set_ref(result.state, MAIN, D)
    s = commit(s, RefUpdate(MASTER, C, None)).state
    assert s.head == MAIN
    s = commit(s, RefUpdate(MAIN, D, None)).state
    assert s.head == b"refs/heads/alpha"  # the first branch in byte order


def test_head_repair_keeps_unborn_head_when_no_branch_exists() -> None:
    s = set_ref(create(), b"refs/tags/v1", A)
    assert s.head == MAIN
    assert repair_head(MAIN, False, {b"refs/tags/a": 1, b"refs/notes/x": 2}) == MAIN
    assert repair_head(MAIN, False, {b"refs/tags/a": 1, b"refs/heads/x": 2}) == b"refs/heads/x"


def test_branch_ref_takes_short_and_full_names() -> None:
    assert branch_ref(b"main") == MAIN
    assert branch_ref(b"feature/x") == b"refs/heads/feature/x"
    assert branch_ref(MAIN) == MAIN
    bad_names = (b"refs/tags/v1", b"a..b", b"", b"refs/heads/", b"HEAD", b"refs/heads/HEAD", b"-x")
    for bad in bad_names:
        with pytest.raises(InvalidRefName):
            branch_ref(bad)


# -- incarnation gate and version ----------------------------------------------------------------


def test_seed001_commands_after_tombstone_are_refused_as_deleted() -> None:
    gone = run(set_ref(create(), MAIN, A), Delete(1)).state
    for cmd in (
        Commit(1, (RefUpdate(MAIN, None, B),), None, 5, True),
        ReplaceLayers(1, 0, (root(1),), ()),
    ):
        result = run(gone, cmd)
        assert result.outcome.code is OutcomeCode.INCARNATION_ENDED
        assert result.outcome.details["reason"] == "deleted"
        assert result.state == gone  # deleted.final
        assert isinstance(result.outcome.error(), IncarnationEnded)


def test_seed001_command_from_other_incarnation_is_refused() -> None:
    second = create(state=run(create(), Delete(1)).state)
    for inc in (1, 3):
        result = commit(second, RefUpdate(MAIN, None, A), incarnation=inc)
        assert result.outcome.code is OutcomeCode.INCARNATION_ENDED
        assert MAIN not in result.state.refs
        assert [r.status for r in result.refs] == []
    assert run(second, Delete(3)).outcome.code is OutcomeCode.INCARNATION_ENDED


def test_commands_on_missing_repository_are_not_found() -> None:
    result = run(MISSING, Commit(1, (RefUpdate(MAIN, None, A),), None, 5, True))
    assert result.outcome.code is OutcomeCode.NOT_FOUND and result.state == MISSING


def test_version_advances_for_every_entry_on_a_live_state_refused_ones_too() -> None:
    s = set_ref(create(), MAIN, A)
    v = s.version
    refused = commit(s, RefUpdate(MAIN, B, C))
    assert refused.outcome.code is OutcomeCode.STALE_REF
    assert refused.state.version == v + 1 and unchanged_but_version(s, refused.state)
    invalid = run(s, Commit(1, (RefUpdate(MAIN, A, B), RefUpdate(MAIN, A, C)), None, 1, True))
    assert invalid.outcome.code is OutcomeCode.INVALID_ARGUMENT
    assert invalid.state.version == v + 1
    other = commit(s, RefUpdate(MAIN, A, B), incarnation=7)
    assert other.state.version == v + 1


def test_deleted_state_is_final() -> None:
    gone = run(create(), Delete(1)).state
    for cmd in (Delete(1), Delete(2), Activate(create=False), Commit(1, (), None, 1, False)):
        assert run(gone, cmd).state == gone


# -- delete ---------------------------------------------------------------------------------


def test_seed001_delete_drops_refs_manifest_and_releases_inline_pins() -> None:
    s = set_ref(create(MAIN), MAIN, A)
    s = commit(s, layer=inline(2, r=1), log_index=20).state
    s = commit(s, layer=stored(2, s.upload_gen)).state
    s = commit(s, layer=inline(2, r=2), log_index=22).state
    result = run(s, Delete(1))
    gone = result.state
    assert gone.deleted and gone.incarnation == 1 and not gone.live
    assert (dict(gone.refs), gone.manifest, gone.head, gone.last_push_us) == ({}, (), b"", None)
    assert gone.upload_gen == s.upload_gen  # the trash marker's generation
    assert gone.version == s.version + 1
    assert result.pins_released == (LogIndex(20), LogIndex(22))
    assert result.effects[-1] == Deleted(1, s.upload_gen)


def test_seed001_deleting_missing_or_deleted_repository_succeeds() -> None:
    gone = run(create(), Delete(1)).state
    for state in (MISSING, gone):
        result = run(state, Delete(1))
        assert result.outcome.code is OutcomeCode.ALREADY_DELETED and result.outcome.ok
        assert result.state == state and result.effects == ()
    second = create(state=gone)
    older = run(second, Delete(1))
    assert older.outcome.code is OutcomeCode.ALREADY_DELETED and older.state.live


# -- refs -----------------------------------------------------------------------------------


def test_design_ref_cas_create_requires_absence_and_reports_current() -> None:
    s = set_ref(create(), MAIN, A)
    result = commit(s, RefUpdate(MAIN, None, B))
    assert result.outcome.code is OutcomeCode.STALE_REF
    assert result.refs[0].status is RefStatus.STALE
    assert result.refs[0].current == RefValue(A, 1000)
    error = result.outcome.error()
    assert isinstance(error, StaleRef) and error.details["current_oid"] == A.hex()


def test_design_ref_cas_stale_on_unborn_reports_null_current() -> None:
    result = commit(create(), RefUpdate(MAIN, A, B))
    assert result.outcome.code is OutcomeCode.STALE_REF
    assert result.outcome.details["current_oid"] is None


def test_design_ref_cas_update_and_delete_with_matching_old() -> None:
    s = set_ref(create(), MAIN, A)
    s = commit(s, RefUpdate(MAIN, A, B)).state
    assert s.refs[MAIN].oid == B
    result = commit(s, RefUpdate(MAIN, B, None))
    assert result.outcome.ok and MAIN not in result.state.refs
    assert RefChanged(MAIN, RefValue(B, 1000), None) in result.effects


def test_ref_delete_of_absent_ref_expected_absent_is_a_noop_success() -> None:
    s = create()
    result = commit(s, RefUpdate(MAIN, None, None))
    assert result.outcome.ok and dict(result.state.refs) == {}
    assert not any(isinstance(e, RefChanged) for e in result.effects)


def test_design_ref_atomic_commit_is_all_or_nothing() -> None:
    s = set_ref(create(), MAIN, A)
    result = commit(s, RefUpdate(b"refs/heads/x", None, B), RefUpdate(MAIN, C, D), layer=inline(2))
    assert result.outcome.code is OutcomeCode.STALE_REF
    assert unchanged_but_version(s, result.state)
    assert [(r.status, r.reason) for r in result.refs] == [
        (RefStatus.ABORTED, "atomic push failure"),
        (RefStatus.STALE, "stale ref"),
    ]
    assert result.effects == ()


def test_design_ref_non_atomic_refs_succeed_or_fail_alone() -> None:
    s = set_ref(create(), MAIN, A)
    result = commit(
        s,
        RefUpdate(b"refs/heads/x", None, B),
        RefUpdate(MAIN, C, D),
        RefUpdate(b"refs/heads/bad..name", None, B),
        layer=inline(2),
        atomic=False,
    )
    assert result.outcome.code is OutcomeCode.OK
    assert [r.status for r in result.refs] == [
        RefStatus.OK,
        RefStatus.STALE,
        RefStatus.INVALID_NAME,
    ]
    assert result.state.refs[b"refs/heads/x"].oid == B and result.state.refs[MAIN].oid == A
    assert len(result.state.manifest) == 1


def test_non_atomic_commit_whose_refs_all_fail_changes_nothing() -> None:
    s = set_ref(create(), MAIN, A)
    result = commit(s, RefUpdate(MAIN, C, D), layer=inline(2), atomic=False)
    assert result.outcome.code is OutcomeCode.STALE_REF
    assert unchanged_but_version(s, result.state)


def test_ref_names_are_checked_with_check_ref_format_and_under_refs() -> None:
    s = create()
    for name in (b"HEAD", b"heads/main", b"refs/heads/a..b", b"refs/heads/x.lock", b"", b"refs"):
        result = commit(s, RefUpdate(name, None, A))
        assert result.outcome.code is OutcomeCode.INVALID_REF_NAME, name
        assert result.refs[0].status is RefStatus.INVALID_NAME
        assert isinstance(result.outcome.error(), InvalidRefName)


def test_seed001_ref_set_time_is_commit_stamp_also_for_same_value() -> None:
    s = set_ref(create(), MAIN, A, stamp=500)
    s = commit(s, RefUpdate(MAIN, A, A), stamp=400).state  # clocks may go back
    assert s.refs[MAIN] == RefValue(A, 400)
    s = commit(s, RefUpdate(MAIN, A, B), RefUpdate(b"refs/heads/y", None, C), stamp=900).state
    assert s.refs[MAIN].set_time_us == 900 and s.refs[b"refs/heads/y"].set_time_us == 900


def test_seed001_refused_ref_update_leaves_set_time() -> None:
    s = set_ref(create(), MAIN, A, stamp=500)
    s = commit(s, RefUpdate(MAIN, B, C), stamp=999).state
    assert s.refs[MAIN] == RefValue(A, 500)


def test_seed001_deleted_ref_drops_its_time() -> None:
    s = set_ref(create(), MAIN, A, stamp=500)
    s = commit(s, RefUpdate(MAIN, A, None), stamp=600).state
    s = commit(s, RefUpdate(MAIN, None, A), stamp=700).state
    assert s.refs[MAIN] == RefValue(A, 700)


# -- last push (seed 001, "Last push") -------------------------------------------------------


def test_seed001_last_push_is_set_by_a_push_that_moves_a_ref() -> None:
    s = commit(create(), RefUpdate(MAIN, None, A), stamp=100).state
    assert s.last_push_us == 100
    result = commit(s, RefUpdate(MAIN, A, B), stamp=200)
    assert result.state.last_push_us == 200
    assert LastPushChanged(100, 200) in result.effects


def test_seed001_last_push_never_moves_back() -> None:
    s = commit(create(), RefUpdate(MAIN, None, A), stamp=500).state
    s = commit(s, RefUpdate(MAIN, A, B), stamp=300).state
    assert s.last_push_us == 500 and s.refs[MAIN].set_time_us == 300


def test_seed001_refused_push_leaves_last_push() -> None:
    s = commit(create(), RefUpdate(MAIN, None, A), stamp=100).state
    s = commit(s, RefUpdate(MAIN, C, B), stamp=900).state
    assert s.last_push_us == 100


def test_seed001_api_commits_and_maintenance_do_not_stamp_last_push() -> None:
    s = commit(create(), RefUpdate(MAIN, None, A), stamp=100, is_push=False).state
    assert s.last_push_us is None
    s = commit(s, layer=inline(3), stamp=200).state
    s = run(s, ReplaceLayers(1, 0, (root(9),), (PlacedLayer(0, 3, stored(3, s.upload_gen)),)))
    assert s.state.last_push_us is None


def test_push_setting_a_ref_to_its_own_value_moves_nothing_and_leaves_last_push() -> None:
    s = commit(create(), RefUpdate(MAIN, None, A), stamp=100).state
    s = commit(s, RefUpdate(MAIN, A, A), stamp=200).state
    assert s.last_push_us == 100 and s.refs[MAIN].set_time_us == 200


# -- pushed layers (seed 004, "Stable object numbering") --------------------------------------


def test_seed004_pushed_layer_takes_next_ids_and_advances_the_counter() -> None:
    s = create()
    r1 = commit(s, RefUpdate(MAIN, None, A), layer=inline(5), log_index=40)
    first = r1.state.manifest[0]
    assert (first.first_id, first.id_count, first.object_count, first.pin) == (0, 5, 5, 40)
    assert r1.state.next_id == 5
    assert r1.pins_added == (LogIndex(40),)
    r2 = commit(r1.state, layer=stored(3, r1.state.upload_gen), log_index=41)
    second = r2.state.manifest[1]
    assert (second.first_id, second.id_count, second.pin, second.kind) == (
        5, 3, 0, LayerKind.STORED
    )  # fmt: skip
    assert r2.state.next_id == 8
    assert r2.state.layer_of_id(4) == first and r2.state.layer_of_id(5) == second
    assert r2.state.layer_of_id(8) is None
    assert LayersChanged((), (second,), (b"",)) in r2.effects


def test_seed004_commit_past_32bit_id_space_fails() -> None:
    s = dataclasses.replace(create(), next_id=ID_SPACE - 4)
    over = commit(s, RefUpdate(MAIN, None, A), layer=inline(5))
    assert over.outcome.code is OutcomeCode.LIMIT_EXCEEDED
    assert unchanged_but_version(s, over.state)
    assert [r.status for r in over.refs] == [RefStatus.ABORTED]
    error = over.outcome.error()
    assert isinstance(error, LimitExceeded) and error.limit == "object_id_space"
    fits = commit(s, RefUpdate(MAIN, None, A), layer=inline(4))
    assert fits.outcome.ok and fits.state.next_id == ID_SPACE


def test_design_stored_layer_only_within_upload_window() -> None:
    s = create(window=4)
    g = s.upload_gen
    for gen, ok in ((g + 1, False), (g, True), (g - 3, True), (g - 4, False)):
        result = commit(s, RefUpdate(MAIN, None, A), layer=stored(1, gen))
        assert result.outcome.ok is ok, gen
        if not ok:
            assert result.outcome.code is OutcomeCode.UPLOAD_WINDOW
            assert isinstance(result.outcome.error(), PreconditionFailed)
            assert MAIN not in result.state.refs


def test_design_every_commit_adding_a_stored_layer_advances_upload_gen() -> None:
    s = create()
    g = s.upload_gen
    r = commit(s, layer=stored(1, g))
    assert r.state.upload_gen == g + 1 and UploadGenAdvanced(g + 1) in r.effects
    assert commit(r.state, layer=inline(1)).state.upload_gen == g + 1
    assert commit(r.state, RefUpdate(MAIN, None, A)).state.upload_gen == g + 1


def test_added_layers_are_a_commits_layer_or_a_replacements_outputs() -> None:
    """What the manifest gains from a command: the one home of that rule (apply's
    inline.root check and the inline-layer lookups of ledger and local ledger)."""
    one, two = inline(2, r=1), inline(3, r=2)
    assert added_layers(Commit(1, (), one, 0, is_push=True)) == (one,)
    assert added_layers(Commit(1, (), None, 0, is_push=True)) == ()
    merged = ReplaceLayers(1, 0, (root(1),), (PlacedLayer(0, 2, one), PlacedLayer(2, 3, two)))
    assert added_layers(merged) == (one, two)
    assert (
        added_layers(Activate(create=True)) == added_layers(Delete(1)) == added_layers(None) == ()
    )


def test_inline_layer_pins_its_log_index() -> None:
    result = commit(create(), layer=inline(2), log_index=77)
    assert result.state.manifest[0].pin == 77 and result.state.pins() == (77,)
    assert PinsChanged(added=(LogIndex(77),), released=()) in result.effects


# -- replace_layers (seed 004, Assignment) ------------------------------------------------------


def layered(*counts: int) -> RepoState:
    """A live state with one inline layer per count, roots 1, 2, ..., pins 100, 101, ..."""
    s = create()
    for i, count in enumerate(counts):
        s = commit(s, layer=inline(count, r=i + 1), log_index=100 + i).state
    return s


def test_seed004_replace_layers_swaps_a_run_and_releases_its_pins() -> None:
    s = layered(2, 3, 4)  # ids [0,2) [2,5) [5,9)
    out = PlacedLayer(2, 7, stored(6, s.upload_gen, r=50))  # holes: 7 ids, 6 objects
    result = run(s, ReplaceLayers(1, 2, (root(2), root(3)), (out,)), log_index=300)
    assert result.outcome.ok
    new = result.state
    assert [(e.first_id, e.id_count, e.kind) for e in new.manifest] == [
        (0, 2, LayerKind.INLINE),
        (2, 7, LayerKind.STORED),
    ]
    assert new.next_id == s.next_id == 9
    assert result.pins_released == (LogIndex(101), LogIndex(102)) and result.pins_added == ()
    assert new.pins() == (100,)
    assert new.upload_gen == s.upload_gen + 1
    assert LayersChanged(s.manifest[1:], new.manifest[1:], (b"",)) in result.effects


def test_inline_layer_bytes_must_match_their_root() -> None:
    """Rule inline.root (seed 004, "Storage service", Read: an inline layer is read "after
    it checks them against the root"): a commit or a replace whose inline layer's bytes
    do not hash to its root is refused as corrupt_data and changes nothing."""
    s = set_ref(create(MAIN), MAIN, A)
    bad = dataclasses.replace(inline(2, r=5), data=b"\x06" * 8)  # root(5), bytes of 6
    result = commit(s, RefUpdate(MAIN, A, B), layer=bad, log_index=50)
    assert result.outcome.code is OutcomeCode.CORRUPT_DATA
    assert unchanged_but_version(s, result.state)
    assert result.pins_added == ()
    assert [r.status for r in result.refs] == [RefStatus.ABORTED]
    error = result.outcome.error()
    assert isinstance(error, CorruptData) and error.section == "inline"
    s = commit(s, layer=inline(2, r=1), log_index=51).state
    replace = ReplaceLayers(1, 0, (root(1),), (PlacedLayer(0, 2, bad),))
    result = run(s, replace, log_index=52)
    assert result.outcome.code is OutcomeCode.CORRUPT_DATA
    assert unchanged_but_version(s, result.state)
    good = ReplaceLayers(1, 0, (root(1),), (PlacedLayer(0, 2, inline(2, r=6)),))
    assert run(s, good, log_index=53).outcome.ok


def test_seed004_replace_outputs_may_leave_holes_and_be_inline() -> None:
    s = layered(4, 4)
    outputs = (
        PlacedLayer(0, 2, inline(1, r=60)),
        PlacedLayer(3, 4, inline(4, r=61)),
    )
    result = run(s, ReplaceLayers(1, 0, (root(1), root(2)), outputs), log_index=400)
    assert result.outcome.ok
    assert [(e.first_id, e.end_id, e.pin) for e in result.state.manifest] == [
        (0, 2, 400), (3, 7, 400)
    ]  # fmt: skip
    assert result.pins_added == (LogIndex(400), LogIndex(400))
    assert result.state.upload_gen == s.upload_gen  # no stored output


def test_seed004_replace_rejects_layers_that_are_not_a_run_of_the_manifest() -> None:
    s = layered(2, 3, 4)
    bad_runs = [
        (1, (root(1),)),  # no layer starts at id 1
        (0, (root(1), root(3))),  # not consecutive
        (0, (root(2),)),  # another layer's root
        (5, (root(3), root(4))),  # runs off the end
    ]
    for first_id, roots in bad_runs:
        result = run(s, ReplaceLayers(1, first_id, roots, ()))
        assert result.outcome.code is OutcomeCode.STALE_RUN, (first_id, roots)
        assert unchanged_but_version(s, result.state)
        assert isinstance(result.outcome.error(), PreconditionFailed)


def test_seed004_replace_rejects_outputs_not_ascending_disjoint_within_the_run() -> None:
    s = layered(2, 3, 4)  # run [2, 9) = layers 2 and 3
    run_roots = (root(2), root(3))
    g = s.upload_gen
    bad_outputs = [
        (PlacedLayer(1, 2, stored(2, g)),),  # starts before the run
        (PlacedLayer(8, 2, stored(2, g)),),  # ends after the run
        (PlacedLayer(5, 2, stored(2, g)), PlacedLayer(2, 2, stored(2, g))),  # descending
        (PlacedLayer(2, 3, stored(2, g)), PlacedLayer(4, 2, stored(2, g))),  # overlapping
    ]
    for outputs in bad_outputs:
        result = run(s, ReplaceLayers(1, 2, run_roots, outputs))
        assert result.outcome.code is OutcomeCode.INVALID_ARGUMENT, outputs
        assert unchanged_but_version(s, result.state)
        assert isinstance(result.outcome.error(), InvalidArgument)
    touching = (PlacedLayer(2, 3, stored(2, g)), PlacedLayer(5, 4, stored(4, g)))
    assert run(s, ReplaceLayers(1, 2, run_roots, touching)).outcome.ok


def test_replace_checks_the_upload_window_of_stored_outputs() -> None:
    s = layered(2)
    out = PlacedLayer(0, 2, stored(2, s.upload_gen - s.upload_window))
    result = run(s, ReplaceLayers(1, 0, (root(1),), (out,)))
    assert result.outcome.code is OutcomeCode.UPLOAD_WINDOW


def test_replace_with_no_outputs_drops_the_run() -> None:
    s = layered(2, 3)
    result = run(s, ReplaceLayers(1, 0, (root(1),), ()))
    assert result.outcome.ok and [e.first_id for e in result.state.manifest] == [2]
    assert result.state.next_id == 5


# -- malformed commands -----------------------------------------------------------------------


def test_malformed_commands_are_refused_as_invalid_argument() -> None:
    s = set_ref(create(), MAIN, A)
    zero = ObjectId(b"\0" * 20)
    bad = [
        Commit(1, (RefUpdate(MAIN, A, zero),), None, 5, True),
        Commit(1, (RefUpdate(MAIN, A, ObjectId(b"x")),), None, 5, True),
        Commit(1, (), None, -1, True),
        Commit(1, (), NewLayer(LayerKind.INLINE, 1, 8, 2, root(1), data=b"short"), 5, True),
        Commit(1, (), NewLayer(LayerKind.STORED, 1, 8, 2, root(1), data=b"x" * 8), 5, True),
        Commit(1, (), NewLayer(LayerKind.STORED, 0, 8, 2, root(1)), 5, True),
        Commit(1, (), NewLayer(LayerKind.STORED, 1, 8, 9, root(1)), 5, True),
        Commit(1, (), NewLayer(LayerKind.STORED, 1, 8, 2, b"short"), 5, True),
        ReplaceLayers(1, 0, (), ()),
        ReplaceLayers(1, 0, (root(1),), (PlacedLayer(0, 1, inline(2)),)),
        Activate(create=True, upload_window=0),
        Delete(0),
    ]
    for cmd in bad:
        result = run(s, cmd)
        assert result.outcome.code is OutcomeCode.INVALID_ARGUMENT, cmd
        assert unchanged_but_version(s, result.state)


# -- predicates for the ledger (seed 001) -----------------------------------------------------


def test_seed001_superseded_and_ended_predicates() -> None:
    e1 = create()
    e1_gone = run(e1, Delete(1)).state
    e2 = create(state=e1_gone)
    assert e1.is_superseded_by(e2) and not e1.is_superseded_by(e1_gone)
    assert e1.is_ended_by(e1_gone) and e1.is_ended_by(e2)
    assert not e1.is_ended_by(e1) and not e2.is_ended_by(e1_gone)
    assert not e2.is_superseded_by(e1)


def test_seed001_listing_prefers_newest_incarnation_then_deleted_then_version() -> None:
    e1 = set_ref(create(), MAIN, A)
    e1_later = set_ref(e1, MAIN, B)
    e1_gone = run(e1, Delete(1)).state
    e2 = create(state=e1_gone)
    assert max([e1, e1_later], key=RepoState.advancement) is e1_later
    assert max([e1_later, e1_gone], key=RepoState.advancement) is e1_gone
    assert max([e1_gone, e2, e1_later], key=RepoState.advancement) is e2


def test_layer_entry_key_names_the_stored_file() -> None:
    from enroute_core.storage.layer.format import layer_key_name

    entry = LayerEntry(LayerKind.STORED, 0, 1, 1, 0x1234, 10, 5, bytes(range(32)), LogIndex(0))
    assert entry.key == layer_key_name(0x1234, bytes(range(32)))
    assert entry.key == "0000000000001234-000102030405060708090a0b0c0d0e0f.layer"
    assert (
        dataclasses.replace(entry, kind=LayerKind.INLINE, upload_gen=0, pin=LogIndex(1)).key is None
    )
