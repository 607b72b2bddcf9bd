"""The linearizability checker: hand-made histories, and a differential test against
brute force over every order (Herlihy and Wing's definition, checked literally)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidArgument
from enroute_testing.linearizability import (
    UNKNOWN,
    CasRegister,
    History,
    Operation,
    Verdict,
    check_history,
    check_operations,
)


def test_sequential_history_is_linearizable() -> None:
    h = History()
    h.invoke(1, "k", "write", 1)
    h.ok(1)
    h.invoke(2, "k", "read")
    h.ok(2, 1)
    h.invoke(3, "k", "cas", 1, 2)
    h.ok(3, True)
    h.invoke(4, "k", "cas", 1, 3)
    h.ok(4, False)
    h.invoke(5, "k", "read")
    h.ok(5, 2)
    assert check_history(h).ok


def test_stale_read_after_a_completed_write_is_illegal() -> None:
    h = History()
    h.invoke(1, "k", "write", 1)
    h.ok(1)
    h.invoke(2, "k", "write", 2)
    h.ok(2)
    h.invoke(3, "k", "read")
    h.ok(3, 1)
    result = check_history(h)
    assert result.verdict is Verdict.ILLEGAL and result.key == "k"


def test_concurrent_operations_may_take_either_order() -> None:
    h = History()
    h.invoke(1, "k", "write", 1)
    h.invoke(2, "k", "read")
    h.ok(2, 1)  # the read saw the write that had not returned yet
    h.ok(1)
    assert check_history(h).ok


def test_a_cas_that_reports_the_wrong_outcome_is_illegal() -> None:
    h = History()
    h.invoke(1, "k", "cas", None, 5)
    h.ok(1, False)  # the register was None: the swap had to succeed
    assert not check_history(h).ok


def test_unknown_outcome_may_or_may_not_have_happened() -> None:
    took_effect = History()
    took_effect.invoke(1, "k", "write", 7)
    took_effect.info(1)
    took_effect.invoke(2, "k", "read")
    took_effect.ok(2, 7)
    assert check_history(took_effect).ok

    did_not = History()
    did_not.invoke(1, "k", "write", 7)
    did_not.invoke(2, "k", "read")
    did_not.ok(2, None)
    assert check_history(did_not).ok  # never completed: same as unknown


def test_failed_operation_had_no_effect() -> None:
    h = History()
    h.invoke(1, "k", "write", 7)
    h.fail(1)
    h.invoke(2, "k", "read")
    h.ok(2, 7)
    assert not check_history(h).ok


def test_keys_are_checked_independently() -> None:
    h = History()
    h.invoke(1, "a", "write", 1)
    h.ok(1)
    h.invoke(2, "b", "read")
    h.ok(2, None)
    h.invoke(3, "a", "read")
    h.ok(3, 1)
    assert check_history(h).ok
    h.invoke(4, "b", "read")
    h.ok(4, 1)
    result = check_history(h)
    assert not result.ok and result.key == "b"


def test_search_budget_gives_unknown() -> None:
    h = History()
    for i in range(12):
        h.invoke(i, "k", "write", i)
    for i in range(12):
        h.ok(i)
    h.invoke(99, "k", "read")
    h.ok(99, 100)
    assert check_history(h, steps_max=10).verdict is Verdict.UNKNOWN


def test_history_misuse_is_refused() -> None:
    h = History()
    h.invoke(1, "k", "read")
    with pytest.raises(InvalidArgument):
        h.invoke(1, "k", "read")
    h.ok(1, None)
    with pytest.raises(InvalidArgument):
        h.ok(1, None)
    with pytest.raises(InvalidArgument):
        h.info(2)
    with pytest.raises(InvalidArgument):
        CasRegister().step(None, ("delete",), None)


# -- differential test against brute force ---------------------------------------------------------


def _brute_force(ops: list[Operation]) -> bool:
    model = CasRegister()
    known = [o for o in ops if o.ret is not None]
    unknown = [o for o in ops if o.ret is None]
    for r in range(len(unknown) + 1):
        for chosen in itertools.combinations(unknown, r):
            for order in itertools.permutations(known + list(chosen)):
                if _respects_real_time(order) and _legal(model, order):
                    return True
    return False


def _respects_real_time(order: tuple[Operation, ...]) -> bool:
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if b.ret is not None and b.ret < a.call:
                return False
    return True


def _legal(model: CasRegister, order: tuple[Operation, ...]) -> bool:
    state: Any = model.init()
    for op in order:
        ok, state = model.step(state, op.input, op.output)
        if not ok:
            return False
    return True


@st.composite
def _histories(draw: st.DrawFn) -> list[Operation]:
    n = draw(st.integers(1, 5))
    times = draw(st.permutations(list(range(1, 2 * n + 1))))
    ops = []
    for i in range(n):
        call, ret = sorted(times[2 * i : 2 * i + 2])
        kind = draw(st.sampled_from(["read", "write", "cas"]))
        v = st.sampled_from([None, 1, 2])
        if kind == "read":
            op_input: tuple[Any, ...] = ("read",)
            output = draw(v)
        elif kind == "write":
            op_input = ("write", draw(st.sampled_from([1, 2])))
            output = None
        else:
            op_input = ("cas", draw(v), draw(st.sampled_from([1, 2])))
            output = draw(st.booleans())
        unknown = draw(st.integers(0, 4)) == 0
        ops.append(
            Operation(
                i, "k", op_input, UNKNOWN if unknown else output, call, None if unknown else ret
            )
        )
    return ops


@settings(max_examples=250, deadline=None)
@given(_histories())
def test_agrees_with_brute_force(ops: list[Operation]) -> None:
    assert check_operations(ops, CasRegister()).ok == _brute_force(ops)
