"""A replacement must cover its run exactly (seed 004, "Stable object numbering":
Assignment): the compute checks the outputs before proposing (``check_replacement``) and
the state machine refuses outputs outside the run, overlapping or over the id space,
whatever the compute sent."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from enroute_core.base.errors import InvalidArgument
from enroute_core.engine.merge import check_replacement
from enroute_core.state import OutcomeCode, apply
from enroute_core.state.commands import PlacedLayer, ReplaceLayers, check_command


def _merge_helpers() -> ModuleType:
    """The history builder of test_merge.py (real objects, concurrent duplicates)."""
    path = Path(__file__).with_name("test_merge.py")
    spec = importlib.util.spec_from_file_location("_merge_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_merge_helpers", module)
    spec.loader.exec_module(module)
    return module


M = _merge_helpers()


def _merged(start: int, stop: int, pushes: int = 8) -> tuple[object, object, ReplaceLayers]:
    h = M.make_history(M.seed_of(), pushes)
    state = M.state_of(h)
    merged, _ = M.merge(h.layers, start, stop)
    return state, merged, merged.replace_command(incarnation=1, upload_gen=3)


def _with_output(cmd: ReplaceLayers, **changes: int) -> ReplaceLayers:
    out = cmd.outputs[0]
    layer_changes = {k: v for k, v in changes.items() if k == "object_count"}
    placed = {k: v for k, v in changes.items() if k in ("first_id", "id_count")}
    new = PlacedLayer(
        placed.get("first_id", out.first_id),
        placed.get("id_count", out.id_count),
        dataclasses.replace(out.layer, **layer_changes),
    )
    return dataclasses.replace(cmd, outputs=(new,))


def test_a_real_merge_covers_its_run_and_is_accepted() -> None:
    state, merged, cmd = _merged(2, 8)
    run = state.manifest[2:8]  # type: ignore[attr-defined]
    check_replacement(run, cmd, dropped=merged.dropped)  # type: ignore[attr-defined]
    assert apply(state, cmd, log_index=50).outcome.code is OutcomeCode.OK  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"first_id_shift": 1}, "starts at id"),
        ({"id_count_delta": -1}, "end at id|more objects than ids"),
        ({"object_count_delta": -1}, "objects"),
        ({"object_count_delta": 1}, "objects"),
    ],
)
def test_outputs_that_miss_ids_or_objects_are_refused_before_proposing(
    change: dict[str, int], why: str
) -> None:
    state, merged, cmd = _merged(2, 8)
    out = cmd.outputs[0]
    bad = cmd
    if "first_id_shift" in change:
        bad = _with_output(cmd, first_id=out.first_id + 1, id_count=out.id_count - 1)
    if "id_count_delta" in change:
        bad = _with_output(cmd, id_count=out.id_count - 1)
    if "object_count_delta" in change:
        bad = _with_output(cmd, object_count=out.layer.object_count + change["object_count_delta"])
    run = state.manifest[2:8]  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match=why) as refused:
        check_replacement(run, bad, dropped=merged.dropped)  # type: ignore[attr-defined]
    assert refused.value.details.get("reason") == "replacement"


def test_a_replacement_of_other_layers_or_a_wrong_dropped_count_is_refused() -> None:
    state, merged, cmd = _merged(2, 8)
    run = state.manifest[2:8]  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match="other layers"):
        check_replacement(run, dataclasses.replace(cmd, run_roots=cmd.run_roots[::-1]), dropped=0)
    with pytest.raises(InvalidArgument, match="objects"):
        check_replacement(run, cmd, dropped=merged.dropped + 1)  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match="empty"):
        check_replacement((), cmd, dropped=0)
    # No outputs is right only when every object of the run was a duplicate.
    with pytest.raises(InvalidArgument, match="objects"):
        check_replacement(run, dataclasses.replace(cmd, outputs=()), dropped=0)
    everything = sum(e.object_count for e in run)
    check_replacement(run, dataclasses.replace(cmd, outputs=()), dropped=everything)


def test_the_state_machine_refuses_outputs_outside_the_run_or_overlapping() -> None:
    state, _, cmd = _merged(2, 8)
    out = cmd.outputs[0]
    run = state.manifest[2:8]  # type: ignore[attr-defined]
    low, high = run[0].first_id, run[-1].end_id
    past = _with_output(cmd, id_count=high - low + 1)
    before = _with_output(cmd, first_id=low - 1, id_count=out.id_count) if low else None
    half = out.id_count // 2
    overlapping = dataclasses.replace(
        cmd,
        outputs=(
            PlacedLayer(low, half + 1, out.layer),
            PlacedLayer(low + half, out.id_count - half, out.layer),
        ),
    )
    for bad in (past, before, overlapping):
        if bad is None:
            continue
        result = apply(state, bad, log_index=60)  # type: ignore[arg-type]
        assert result.outcome.code is OutcomeCode.INVALID_ARGUMENT, result.outcome
        assert result.state.manifest == state.manifest  # type: ignore[attr-defined]
    # An output with more objects than ids is malformed on its own.
    crowded = _with_output(cmd, object_count=out.id_count + 1)
    with pytest.raises(InvalidArgument):
        check_command(crowded)
    # A run whose roots changed under the merge is stale, not applied.
    stale = dataclasses.replace(cmd, run_roots=(b"\x01" * 32, *cmd.run_roots[1:]))
    assert apply(state, stale, log_index=61).outcome.code is OutcomeCode.STALE_RUN  # type: ignore[arg-type]
