"""A linearizability checker for histories of operations on a key-value map.

The search is Wing and Gong's, with Lowe's memoization as Porcupine uses it:
walk the history in real-time order, try to linearize each pending call whose
effect the model accepts, backtrack when a return is reached before its call
was linearized, and never revisit a (set of linearized operations, model
state) pair. Operations on different keys commute, so each key's history is
checked alone (Herlihy and Wing's locality; Porcupine's partitioning).

An operation whose outcome is unknown (the client crashed or timed out) may
have taken effect at any point after its invocation or not at all: it is
given an infinitely late return and accepts any output, so the search may
place it anywhere after its call, including after every other operation,
which is the same as never. An operation known to have failed without effect
is left out.

Models are plain objects with ``init()`` and ``step(state, input, output)``;
:class:`CasRegister` is a register with read, write and compare-and-swap.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from enroute_core.base.errors import InvalidArgument


class _Unknown:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()
"""The output of an operation whose response was never seen."""


class Model(Protocol):
    def init(self) -> Hashable: ...

    def step(self, state: Hashable, op_input: Any, output: Any) -> tuple[bool, Hashable]:
        """Whether ``op_input`` applied to ``state`` may yield ``output``, and the next state."""
        ...


class CasRegister:
    """One register. Inputs: ``("read",)``, ``("write", v)``, ``("cas", old, new)``.

    Outputs: the value read, ``None`` for a write, a bool for a CAS (did it swap).
    A register starts as ``None``.
    """

    def init(self) -> Hashable:
        return None

    def step(self, state: Hashable, op_input: Any, output: Any) -> tuple[bool, Hashable]:
        kind = op_input[0]
        if kind == "read":
            return (output is UNKNOWN or output == state), state
        if kind == "write":
            return True, op_input[1]
        if kind == "cas":
            swapped = state == op_input[1]
            if output is not UNKNOWN and output != swapped:
                return False, state
            return True, (op_input[2] if swapped else state)
        raise InvalidArgument("unknown register operation", kind=kind)


@dataclass(frozen=True, slots=True)
class Operation:
    op_id: int
    key: Hashable
    input: tuple[Any, ...]
    output: Any
    call: int
    ret: int | None
    """None when the outcome is unknown."""


class Verdict(enum.Enum):
    LINEARIZABLE = "linearizable"
    ILLEGAL = "illegal"
    UNKNOWN = "unknown"
    """The search ran out of its step budget."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    verdict: Verdict
    key: Hashable = None
    """The first key whose history failed (or ran out of budget)."""
    steps: int = 0
    operations: tuple[Operation, ...] = ()
    """The failing key's operations, for the report."""

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.LINEARIZABLE


class History:
    """Records invoke and response events in the order they happen.

    The order of calls on this object is real time: an event recorded later
    happened later. Each operation is invoked once and then completed at most
    once: ``ok`` (with its output), ``fail`` (it certainly had no effect) or
    ``info`` (unknown). Operations never completed count as unknown.
    """

    def __init__(self) -> None:
        self._clock = 0
        self._calls: dict[int, tuple[Hashable, tuple[Any, ...], int]] = {}
        self._done: dict[int, tuple[str, Any, int]] = {}

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def invoke(self, op_id: int, key: Hashable, *op_input: Any) -> None:
        if op_id in self._calls:
            raise InvalidArgument("operation invoked twice", op_id=op_id)
        self._calls[op_id] = (key, tuple(op_input), self._tick())

    def _complete(self, op_id: int, how: str, output: Any) -> None:
        if op_id not in self._calls:
            raise InvalidArgument("completion of an operation never invoked", op_id=op_id)
        if op_id in self._done:
            raise InvalidArgument("operation completed twice", op_id=op_id)
        self._done[op_id] = (how, output, self._tick())

    def ok(self, op_id: int, output: Any = None) -> None:
        self._complete(op_id, "ok", output)

    def fail(self, op_id: int) -> None:
        self._complete(op_id, "fail", None)

    def info(self, op_id: int) -> None:
        self._complete(op_id, "info", None)

    def is_open(self, op_id: int) -> bool:
        return op_id in self._calls and op_id not in self._done

    def operations(self) -> list[Operation]:
        ops = []
        for op_id, (key, op_input, call) in self._calls.items():
            how, output, at = self._done.get(op_id, ("info", None, 0))
            if how == "fail":
                continue
            if how == "ok":
                ops.append(Operation(op_id, key, op_input, output, call, at))
            else:
                ops.append(Operation(op_id, key, op_input, UNKNOWN, call, None))
        return ops


def check_operations(
    operations: Iterable[Operation], model: Model, *, steps_max: int = 1_000_000
) -> CheckResult:
    """Check each key's history; the first failure is reported."""
    by_key: dict[Hashable, list[Operation]] = {}
    for op in operations:
        by_key.setdefault(op.key, []).append(op)
    total = 0
    for key in sorted(by_key, key=repr):
        ops = by_key[key]
        verdict, steps = _check_one(ops, model, steps_max)
        total += steps
        if verdict is not Verdict.LINEARIZABLE:
            return CheckResult(verdict, key, total, tuple(ops))
    return CheckResult(Verdict.LINEARIZABLE, None, total)


def check_history(history: History, *, steps_max: int = 1_000_000) -> CheckResult:
    """Check a recorded key-value history against a CAS register per key."""
    return check_operations(history.operations(), CasRegister(), steps_max=steps_max)


class _Node:
    """A call or return event in the doubly linked list the search edits."""

    __slots__ = ("is_call", "match", "next", "op", "prev")

    def __init__(self, op: int, is_call: bool) -> None:
        self.op = op
        self.is_call = is_call
        self.match: _Node | None = None
        self.prev: _Node | None = None
        self.next: _Node | None = None


def _build_list(ops: list[Operation]) -> _Node:
    inf = 1 << 62
    events: list[tuple[int, int, int, bool]] = []
    for i, op in enumerate(ops):
        ret = op.ret if op.ret is not None else inf
        if ret <= op.call:
            raise InvalidArgument("operation returns before its call", op_id=op.op_id)
        events.append((op.call, 0, i, True))
        events.append((ret, 1, i, False))
    events.sort()
    head = _Node(-1, False)
    calls: dict[int, _Node] = {}
    prev = head
    for _, _, i, is_call in events:
        node = _Node(i, is_call)
        if is_call:
            calls[i] = node
        else:
            calls[i].match = node
        node.prev = prev
        prev.next = node
        prev = node
    return head


def _lift(call: _Node) -> None:
    """Take a call and its return out of the list."""
    assert call.prev is not None and call.match is not None
    call.prev.next = call.next
    if call.next is not None:
        call.next.prev = call.prev
    ret = call.match
    assert ret.prev is not None
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(call: _Node) -> None:
    """Put them back (in the reverse order of ``_lift``)."""
    ret = call.match
    assert ret is not None and ret.prev is not None and call.prev is not None
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    call.prev.next = call
    if call.next is not None:
        call.next.prev = call


def _check_one(ops: list[Operation], model: Model, steps_max: int) -> tuple[Verdict, int]:
    if not ops:
        return Verdict.LINEARIZABLE, 0
    head = _build_list(ops)
    state = model.init()
    linearized = 0
    seen: set[tuple[int, Hashable]] = set()
    stack: list[tuple[_Node, Hashable]] = []
    entry = head.next
    steps = 0
    while head.next is not None:
        steps += 1
        if steps > steps_max:
            return Verdict.UNKNOWN, steps
        assert entry is not None
        if entry.is_call:
            op = ops[entry.op]
            legal, new_state = model.step(state, op.input, op.output)
            if legal:
                bits = linearized | (1 << entry.op)
                if (bits, new_state) not in seen:
                    seen.add((bits, new_state))
                    stack.append((entry, state))
                    state = new_state
                    linearized = bits
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            # A return whose call is still in the list: undo the last choice.
            if not stack:
                return Verdict.ILLEGAL, steps
            call, state = stack.pop()
            linearized &= ~(1 << call.op)
            _unlift(call)
            entry = call.next
    return Verdict.LINEARIZABLE, steps
