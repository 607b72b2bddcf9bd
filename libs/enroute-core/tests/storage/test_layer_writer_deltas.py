"""storage/layer/writer.py: the compiled check of a run of entries
(``enroute_native.layer_append``) takes a run only where ``LayerWriter._check_entry``,
the one home of the rule, takes every entry of it (seed 004, "Layers": kinds grouped,
REF_DELTA only, a base before its delta, same kind, depth one more than the base's).

Drawn runs of clean and broken entries go to two writers, one through ``append_many``
and one through ``append`` entry by entry: both must accept them or refuse them with
the same error at the same entry, and end with the same columns and bytes. Prints its
seed; ENROUTE_SEED= replays.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from functools import partial

import pytest
from enroute_native.layer_append import append_run

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.pack import encode_entry_header as header
from enroute_core.storage.layer import EntryRun, Kind, LayerWriter
from enroute_core.storage.layer import writer as writer_module

KINDS = [Kind.COMMIT, Kind.TREE, Kind.BLOB, Kind.TAG]
PACK_TYPE = {Kind.COMMIT: 1, Kind.TREE: 2, Kind.BLOB: 3, Kind.TAG: 4}


def oid(n: int) -> ObjectId:
    return ObjectId(hashlib.sha1(b"%d" % n).digest())


def _outcome(step: Callable[[], object]) -> str:
    try:
        step()
    except EnrouteError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _random_entry(rng: random.Random, n: int) -> tuple[tuple[object, ...], dict[str, object]]:
    me = oid(n)
    kind = rng.choice(KINDS[1:3]) if rng.random() < 0.9 else rng.choice(KINDS)
    base = oid(rng.randrange(max(n, 1) + 2))
    depth = rng.choice([1, 1, 2, 3, 0, 50])
    size = rng.choice([5, 0, 7, -1, 1 << 40])
    if rng.random() < 0.25:
        entry = header(PACK_TYPE[kind], size if size >= 0 else 0) + b"x"
        return (me, kind, entry, size), {"base": None, "depth": 0}
    entry = header(7, 9) + base + b"delta"
    mutation = rng.randrange(12)
    if mutation == 0:
        entry = header(6, 9) + b"\x05delta"
    elif mutation == 1:
        entry = header(7, 9) + oid(n + 999) + b"delta"
    elif mutation == 2:
        entry = header(7, 9) + base  # nothing after the header
    elif mutation == 3:
        entry = entry[: rng.randrange(len(entry))]
    elif mutation == 4:
        me = base
    kw: dict[str, object] = {"base": base, "depth": depth}
    if mutation == 5:
        kw["base_context"] = me
    elif mutation == 6:
        kw["base_context"] = oid(n + 5)
    elif mutation == 7:
        kw["base"] = b"short"
    return (me, kind, entry, size), kw


def _two_writers(
    round_: int, first: type[LayerWriter], second: type[LayerWriter]
) -> tuple[random.Random, tuple[LayerWriter, list[bytes]], tuple[LayerWriter, list[bytes]]]:
    """The seeded generator of a round (it prints its seed) and two writers to compare."""
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    limits = Limits(delta_chain_depth_max=10)
    out_a: list[bytes] = []
    out_b: list[bytes] = []
    return (
        random.Random(seed + round_),
        (first(out_a.append, limits=limits), out_a),
        (second(out_b.append, limits=limits), out_b),
    )


# -- append_many: whole runs checked at once, the same outcomes as append one by one --------


def _clean_entry(
    rng: random.Random, n: int, stored: dict[ObjectId, int]
) -> tuple[tuple[object, ...], dict[str, object]]:
    """A blob the writer takes: whole, or a delta on a stored or an outside base."""
    me = oid(n)
    context = oid(n + 10_000) if rng.random() < 0.5 else None
    if not stored or rng.random() < 0.3:
        stored[me] = 0
        entry = header(3, 5) + b"x"
        return (me, Kind.BLOB, entry, 5), {"base": None, "depth": 0, "base_context": context}
    if rng.random() < 0.2:
        base, depth = oid(rng.randrange(n) + 20_000), 1  # outside the layer
    else:
        base = rng.choice(list(stored))
        depth = stored[base] + 1
        if depth > 10:
            base, depth = oid(n + 20_000), 1
    stored[me] = depth
    entry = header(7, 9) + base + b"delta"
    return (me, Kind.BLOB, entry, 5), {"base": base, "depth": depth, "base_context": context}


def _broken_entry(
    rng: random.Random, n: int, stored: dict[ObjectId, int]
) -> tuple[tuple[object, ...], dict[str, object]]:
    """An entry append refuses, or one that only looks like a clean one."""
    args, kw = _clean_entry(rng, n, dict(stored))
    choice = rng.randrange(5)
    if choice == 0:  # an outside base that a delta waits on, stored after it
        me = oid(rng.randrange(n) + 20_000)
        return (me, Kind.BLOB, header(3, 5) + b"x", 5), {"base": None, "depth": 0}
    if choice == 1 and kw["base"] is not None:  # one deeper or shallower than its base's
        depth = int(kw["depth"]) + rng.choice([1, -1])  # type: ignore[call-overload]
        return args, {**kw, "depth": depth}
    if choice == 2 and stored:  # an object added twice
        me = rng.choice(list(stored))
        return (me, Kind.BLOB, header(3, 5) + b"x", 5), {"base": None, "depth": 0}
    if choice == 3:  # its own base context
        return args, {**kw, "base_context": args[0]}
    return _random_entry(rng, n)


def _append_one_by_one(
    writer: LayerWriter, run: list[tuple[tuple[object, ...], dict[str, object]]]
) -> None:
    for args, kw in run:
        writer.append(*args, **kw)  # type: ignore[arg-type]


def _append_many(
    writer: LayerWriter, run: list[tuple[tuple[object, ...], dict[str, object]]]
) -> None:
    columns = [[args[k] for args, _ in run] for k in range(4)]
    named = [[kw.get(k) for _, kw in run] for k in ("base", "depth", "base_context")]
    named[1] = [d or 0 for d in named[1]]
    writer.append_many(EntryRun(*columns, *named))  # type: ignore[arg-type]


@pytest.mark.parametrize("round_", range(3))
def test_append_many_matches_append(monkeypatch: pytest.MonkeyPatch, round_: int) -> None:
    """Runs of clean and broken entries: append_many (``enroute_native.layer_append``)
    refuses what append refuses, with the same error at the same entry, and ends with
    the same bytes and columns; clean runs are taken whole."""
    rng, (many, out_a), (one, out_b) = _two_writers(round_, LayerWriter, LayerWriter)
    whole_runs = 0

    def counted(*args: object) -> object:
        nonlocal whole_runs
        found = append_run(*args)  # type: ignore[arg-type]
        whole_runs += found is not None
        return found

    monkeypatch.setattr(writer_module, "append_run", counted)
    stored: dict[ObjectId, int] = {}
    n = 0
    outcomes = set()
    for k in range(60):
        run = []
        for _ in range(rng.randrange(1, 12)):
            n += 1
            run.append(_clean_entry(rng, n, stored))
        in_run = {args[0]: i for i, (args, _) in enumerate(run)}
        pairs = [(in_run[kw["base"]], j) for j, (_, kw) in enumerate(run) if kw["base"] in in_run]
        # the first run stays clean: a refusal can end the writer, and every run after it
        # goes entry by entry, so a seed whose first run broke it took no run whole
        if k and pairs and rng.random() < 0.3:  # a delta moved before its base in the run
            i, j = rng.choice(pairs)
            run[i], run[j] = run[j], run[i]
        elif k and rng.random() < 0.5:  # one broken entry somewhere in the run
            n += 1
            run.insert(rng.randrange(len(run) + 1), _broken_entry(rng, n, stored))
        got = _outcome(partial(_append_many, many, run))
        assert got == _outcome(partial(_append_one_by_one, one, run)), (n, run)
        outcomes.add(got.split(":")[0])
        stored = {o: d for o, d in stored.items() if o in one._index}
    columns = (
        "_oids", "_index", "_kinds", "_kind_oids", "_kind_runs", "_offsets", "_lengths",
        "_sizes", "_depths", "_base_refs", "_context_refs", "_later", "_pending_bases",
    )  # fmt: skip
    assert [getattr(many, c) for c in columns] == [getattr(one, c) for c in columns]
    assert _outcome(many.finish) == _outcome(one.finish)
    assert b"".join(out_a) == b"".join(out_b)
    assert whole_runs > 0 and "ok" in outcomes and len(outcomes) > 1
