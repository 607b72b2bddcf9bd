"""RefMap against a dict: the same refs, in ascending byte order, and old maps untouched.

Random changes (inserts, overwrites, deletes, deletes of absent names, whole
leaves emptied) run against a plain dict as the model, with leaves of 4 refs
so that splits, empty leaves and the rebuild after many deletions happen
often, and with the default leaf size. Replay a failure with ``ENROUTE_SEED=<n>``.
"""

from __future__ import annotations

import os
import random
import secrets

import pytest

from enroute_core.base.ids import ObjectId
from enroute_core.state import refmap
from enroute_core.state.head import repair_head
from enroute_core.state.model import RefValue
from enroute_core.state.refmap import RefMap


def _seed() -> int:
    seed = int(os.environ.get("ENROUTE_SEED") or secrets.randbits(32))
    print(f"ENROUTE_SEED={seed}")
    return seed


def _value(rng: random.Random) -> RefValue:
    return RefValue(ObjectId(rng.randbytes(20)), rng.randrange(1 << 40))


def _check(m: RefMap, model: dict[bytes, RefValue]) -> None:
    assert len(m) == len(model)
    assert list(m) == sorted(model)
    assert list(m.items()) == sorted(model.items())
    assert list(m.values()) == [model[k] for k in sorted(model)]
    assert m == model and model == m
    for name, value in model.items():
        assert m[name] == value and m.get(name) == value and name in m
    for leaf in m.leaves():
        assert leaf and list(leaf) == sorted(leaf)


@pytest.mark.parametrize("leaf_refs", [4, refmap.LEAF_REFS])
def test_random_changes_match_a_dict(monkeypatch: pytest.MonkeyPatch, leaf_refs: int) -> None:
    monkeypatch.setattr(refmap, "LEAF_REFS", leaf_refs)
    rng = random.Random(_seed())
    universe = [b"refs/%s/%d" % (rng.choice([b"heads", b"tags", b"x"]), i) for i in range(1000)]
    m, model = RefMap(), {}
    history: list[tuple[RefMap, dict[bytes, RefValue]]] = []
    for step in range(60):
        changes: dict[bytes, RefValue | None] = {}
        mode = rng.random()
        for _ in range(rng.choice([1, 2, 10, 100, 300])):
            name = rng.choice(universe)
            if mode < 0.3 and step > 10:  # a burst of deletions empties leaves
                changes[name] = None
            else:
                changes[name] = None if rng.random() < 0.2 else _value(rng)
        m = m.updated(changes)
        for name, change in changes.items():
            if change is None:
                model.pop(name, None)
            else:
                model[name] = change
        _check(m, model)
        history.append((m, dict(model)))
    for old, old_model in history:  # persistence: no later change reached an older map
        _check(old, old_model)


def test_lookups_of_names_outside_the_map() -> None:
    m = RefMap.from_ascending([(b"refs/heads/b", RefValue(ObjectId(b"\1" * 20), 1))])
    for name in (b"", b"refs/heads/a", b"refs/heads/c", b"zzz"):
        assert name not in m and m.get(name) is None
        with pytest.raises(KeyError):
            m[name]
    assert "refs/heads/b" not in m  # type: ignore[comparison-overlap]  # str, not bytes
    assert RefMap().get(b"refs/heads/b") is None and b"refs/heads/b" not in RefMap()
    assert m.updated({}) is m
    assert len(m.updated({b"refs/heads/b": None})) == 0


def test_first_from_and_head_repair_match_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """head.repair's first branch in byte order, found by the sorted map without a scan,
    is the one a scan of every name finds (DESIGN, "External interfaces": HEAD rules)."""
    monkeypatch.setattr(refmap, "LEAF_REFS", 4)
    rng = random.Random(_seed())
    for _ in range(200):
        names = {
            b"refs/%s/%d" % (rng.choice([b"heads", b"tags", b"a", b"z"]), rng.randrange(50))
            for _ in range(rng.randrange(40))
        }
        model = {name: RefValue(ObjectId(b"\1" * 20), 1) for name in names}
        m = RefMap.of(model)
        low = rng.choice([b"refs/heads/", b"refs/", b"refs/tags/3", b"s"])
        assert m.first_from(low) == min((n for n in names if n >= low), default=None)
        head = b"refs/heads/gone"
        assert repair_head(head, False, m) == repair_head(head, False, model)
