"""storage/layer/writer.py: REF_DELTA entries checked inline accept and refuse exactly as
``LayerWriter._check_entry`` does (seed 004, "Layers": REF_DELTA only, a base before its
delta, same kind, depth one more than the base's).

Every entry of a random sequence, good or broken, is appended to two writers: one as
usual, one with the inline check turned off. Both must accept it or both refuse it
with the same error, and end with the same bytes. Prints its seed; ENROUTE_SEED=
replays.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from functools import partial

import pytest

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.pack import encode_entry_header as header
from enroute_core.storage.layer import Kind, LayerWriter

KINDS = [Kind.COMMIT, Kind.TREE, Kind.BLOB, Kind.TAG]
PACK_TYPE = {Kind.COMMIT: 1, Kind.TREE: 2, Kind.BLOB: 3, Kind.TAG: 4}


def oid(n: int) -> ObjectId:
    return ObjectId(hashlib.sha1(b"%d" % n).digest())


class _Checked(LayerWriter):
    """A writer whose every delta goes through ``_check_entry``."""

    def _is_usual_delta(self, *args: object, **kwargs: object) -> bool:
        return False


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


@pytest.mark.parametrize("round_", range(3))
def test_inline_delta_checks_match_check_entry(round_: int) -> None:
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed + round_)
    limits = Limits(delta_chain_depth_max=10)
    out_a: list[bytes] = []
    out_b: list[bytes] = []
    fast = LayerWriter(out_a.append, limits=limits)
    slow = _Checked(out_b.append, limits=limits)
    outcomes = set()
    for n in range(300):
        args, kw = _random_entry(rng, n)
        got = _outcome(partial(fast.append, *args, **kw))  # type: ignore[arg-type]
        assert got == _outcome(partial(slow.append, *args, **kw)), (n, args, kw)  # type: ignore[arg-type]
        outcomes.add(got.split(":")[0])
    # an accepted commit entry has no commit record here: both then refuse to finish
    assert _outcome(fast.finish) == _outcome(slow.finish)
    assert b"".join(out_a) == b"".join(out_b)
    assert "ok" in outcomes and len(outcomes) > 1  # both sides of the check were taken


def test_good_delta_chain_takes_the_inline_path() -> None:
    calls: list[object] = []

    class Spy(LayerWriter):
        def _check_entry(self, e: object) -> None:
            calls.append(e)
            super()._check_entry(e)  # type: ignore[arg-type]

    w = Spy(lambda b: None)
    w.append(oid(1), Kind.BLOB, header(3, 3) + b"x", 3)
    w.append(oid(2), Kind.BLOB, header(7, 9) + oid(1) + b"d", 5, base=oid(1), depth=1)
    w.append(oid(3), Kind.BLOB, header(7, 9) + oid(9) + b"d", 5, base=oid(9), depth=1)
    assert calls == []
    with pytest.raises(EnrouteError, match="its base's is 1"):
        w.append(oid(4), Kind.BLOB, header(7, 9) + oid(2) + b"d", 5, base=oid(2), depth=1)
    assert len(calls) == 1
