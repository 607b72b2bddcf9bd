"""``check_wants``: a want the repository lacks is refused before anything is answered,
with git's message (gitprotocol-pack, "Packfile Negotiation": ``not our ref``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from enroute_core.base.errors import MissingObject
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.engine.serve import check_wants, plan_fetch
from enroute_core.engine.view import View


def _merge_helpers() -> ModuleType:
    path = Path(__file__).with_name("test_merge.py")
    spec = importlib.util.spec_from_file_location("_merge_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_merge_helpers", module)
    spec.loader.exec_module(module)
    return module


def test_known_wants_pass_and_the_first_unknown_one_is_named() -> None:
    h = _merge_helpers().make_history(5, 3)
    view = View(h.layers)
    known = [ObjectId(oid) for oid in list(h.bodies)[:5]]
    check_wants(view, known)
    unknown = ObjectId(b"\xdd" * 20)
    with pytest.raises(MissingObject) as refused:
        check_wants(view, [*known, unknown, ObjectId(b"\xee" * 20)])
    assert refused.value.message == f"upload-pack: not our ref {oid_to_hex(unknown)}"
    assert refused.value.details["oid"] == oid_to_hex(unknown)
    # What check_wants lets through, the planner accepts.
    assert plan_fetch(view, known).ids


def test_an_empty_repository_has_no_object_to_want() -> None:
    with pytest.raises(MissingObject, match="not our ref"):
        check_wants(View(()), [ObjectId(b"\x01" * 20)])
    check_wants(View(()), [])


def test_with_tips_a_want_must_be_a_tip_or_reachable_from_one() -> None:
    h = _merge_helpers().make_history(6, 3)
    view = View(h.layers)
    some = ObjectId(next(iter(h.bodies)))
    check_wants(view, [some], tips=[some])  # a tip itself
    with pytest.raises(MissingObject, match="not our ref"):
        check_wants(view, [some], tips=[])  # present, but nothing advertised reaches it
    check_wants(view, [some])  # protocol v2: any object of the repository
