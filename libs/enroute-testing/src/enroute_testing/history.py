"""The recorded history of a cluster workload and the checker of its invariants.

Every operation a client runs is recorded with its invocation and completion
(a shared tick, so the order of events is real-time order across threads, and
monotonic seconds for the report) and its result: ``ok`` with an output,
``fail`` (certainly no effect) or ``info`` (unknown: timeout, crash,
connection lost).

Model (:class:`RepoRefs`): one repository is a map of branch -> commit id.
A push or an API commit is a compare-and-swap on one branch (old value
``None``: the branch must not exist; new ``None``: delete it); ls-refs, a
fetch and a clone read the whole map; deleting the repository empties it.
A missing repository reads as an empty map (a push creates one implicitly,
so "missing" and "empty" cannot be told apart by the operations we check).
Repositories are independent, so each is checked alone
(:func:`enroute_testing.linearizability.check_operations`, keyed by repo).

Every new commit carries a unique token in its message, so every value
written is unique: a value read that no write produced, or an old
incarnation's commit served after the delete, is caught.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from enroute_testing.linearizability import (
    UNKNOWN,
    CheckResult,
    Operation,
    Verdict,
    check_operations,
)

RefMap = tuple[tuple[str, str], ...]
"""A repository's branches as sorted (ref, hex oid) pairs: the model state."""


class RepoRefs:
    """The model of one repository's refs (see the module docstring).

    Inputs: ``("cas", ref, old, new)`` -> bool; ``("read",)`` -> RefMap;
    ``("delete",)`` -> None; ``("create",)`` -> anything (a no-op on the map).
    """

    def init(self) -> Hashable:
        return ()

    def step(self, state: Hashable, op_input: Any, output: Any) -> tuple[bool, Hashable]:
        assert isinstance(state, tuple)
        kind = op_input[0]
        if kind == "read":
            return (output is UNKNOWN or output == state), state
        if kind == "delete":
            return True, ()
        if kind == "create":
            return True, state
        if kind == "cas":
            _, ref, old, new = op_input
            refs = dict(state)
            swapped = refs.get(ref) == old
            if output is not UNKNOWN and output != swapped:
                return False, state
            if not swapped:
                return True, state
            if new is None:
                refs.pop(ref, None)
            else:
                refs[ref] = new
            return True, tuple(sorted(refs.items()))
        raise ValueError(f"unknown operation {kind!r}")


@dataclass(slots=True)
class Record:
    """One operation of one client."""

    op_id: int
    client: int
    kind: str  # push, api_commit, fetch, ls_refs, clone, create, delete, final
    repo: str
    input: tuple[Any, ...]
    call: int
    call_s: float
    how: str = ""  # "ok" | "fail" | "info" ("" while running)
    output: Any = None
    ret: int = 0
    ret_s: float = 0.0
    detail: str = ""
    token: str = ""  # the unique token of the commit this op writes, if any

    @property
    def latency_s(self) -> float:
        return self.ret_s - self.call_s if self.how else 0.0


class Recorder:
    """Thread-safe history; ticks order events in real time across clients."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tick = 0
        self.records: list[Record] = []
        self.anomalies: list[str] = []
        self._t0 = time.monotonic()

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    def invoke(
        self, client: int, kind: str, repo: str, op_input: tuple[Any, ...], token: str = ""
    ) -> Record:
        with self._lock:
            rec = Record(
                len(self.records),
                client,
                kind,
                repo,
                op_input,
                self._next(),
                time.monotonic() - self._t0,
                token=token,
            )
            self.records.append(rec)
            return rec

    def complete(self, rec: Record, how: str, output: Any = None, detail: str = "") -> None:
        assert how in ("ok", "fail", "info") and not rec.how, (how, rec)
        with self._lock:
            rec.how, rec.output, rec.detail = how, output, detail[-500:]
            rec.ret, rec.ret_s = self._next(), time.monotonic() - self._t0

    def now(self) -> float:
        """Seconds on the clock of ``call_s``/``ret_s``."""
        return time.monotonic() - self._t0

    def anomaly(self, text: str) -> None:
        with self._lock:
            self.anomalies.append(text)

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for r in self.records:
                row = out.setdefault(r.kind, {})
                row[r.how or "open"] = row.get(r.how or "open", 0) + 1
        return out


@dataclass(slots=True)
class Report:
    """What the checker found; ``ok`` when nothing."""

    linearizable: CheckResult
    problems: list[str] = field(default_factory=list)
    operations: int = 0
    resolve: dict[str, str] = field(default_factory=dict)
    """Tokens of writes of unknown outcome -> the commit found carrying them."""
    acknowledged: int = 0
    """Acknowledged writes whose survival was checked (an ancestor of their branch)."""

    @property
    def ok(self) -> bool:
        return self.linearizable.ok and not self.problems

    def explain(self, records: list[Record], limit: int = 60) -> str:
        lines = [f"{self.operations} operations; {len(self.problems)} problems"]
        lines += [f"  problem: {p}" for p in self.problems[:20]]
        if not self.linearizable.ok:
            lines.append(
                f"  not linearizable ({self.linearizable.verdict.value}) in repo "
                f"{self.linearizable.key!r}; its operations in call order:"
            )
            ids = {op.op_id for op in self.linearizable.operations}
            shown = [r for r in records if r.op_id in ids]
            shown.sort(key=lambda r: r.call)
            for r in shown[:limit]:
                lines.append(
                    f"    #{r.op_id} c{r.client} {r.kind} {_short(r.input)} -> {r.how} "
                    f"{_short(r.output)} [{r.call_s:.3f}-{r.ret_s:.3f}] {r.detail[:120]!r}"
                )
        return "\n".join(lines)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 200 else text[:200] + "..."


def to_operations(records: list[Record], resolve: dict[str, str]) -> list[Operation]:
    """Records as checker operations; ``resolve`` maps the tokens of writes of unknown
    outcome (their new value was never answered) to the commit found carrying them."""
    ops: list[Operation] = []
    for r in records:
        if r.how == "fail" or r.kind not in ("push", "api_commit", "fetch", "ls_refs", "clone",
                                             "create", "delete", "final"):  # fmt: skip
            continue
        op_input = r.input
        if op_input[0] == "cas" and op_input[3] == PENDING:
            op_input = (*op_input[:3], resolve.get(r.token, "unresolved:" + r.token))
        if r.how == "ok":
            ops.append(Operation(r.op_id, r.repo, op_input, r.output, r.call, r.ret))
        else:
            ops.append(Operation(r.op_id, r.repo, op_input, UNKNOWN, r.call, None))
    return ops


PENDING = "<pending>"
"""The new value of a write that has not been answered yet (an API commit's oid)."""


def check_records(
    records: list[Record],
    resolve: dict[str, str],
    *,
    steps_max: int = 2_000_000,
) -> CheckResult:
    ops = to_operations(records, resolve)
    return check_operations(ops, RepoRefs(), steps_max=steps_max)


def acknowledged_writes(records: list[Record]) -> list[Record]:
    """Writes answered ok that nothing invoked later may have removed.

    A branch delete or a repository delete invoked after a write was
    invoked may linearize after it; such writes are skipped (every other
    update is a fast-forward of the value it expects, so an acknowledged
    commit must stay an ancestor of its branch).
    """
    out = []
    for w in records:
        if w.kind not in ("push", "api_commit") or w.how != "ok" or w.output is not True:
            continue
        _, ref, _, new = w.input
        if new is None or new == PENDING:
            continue
        removed = any(
            r.repo == w.repo
            and r.how != "fail"
            and r.call > w.call
            and (r.kind == "delete" or (r.input[0] == "cas" and r.input[1] == ref
                                        and r.input[3] is None))
            for r in records
        )  # fmt: skip
        if not removed:
            out.append(w)
    return out


def verdict_ok(result: CheckResult) -> bool:
    return result.verdict is Verdict.LINEARIZABLE


def rejected_but_applied(records: list[Record]) -> list[Record]:
    """Writes answered "rejected" (CAS lost) whose new commit some read later returned.

    Every commit is new, so a read can only return it if the write took effect:
    the answer was wrong. (Known failure: a receive-pack replayed to a second
    compute after the first committed it; docs/reliability.md.)
    """
    seen: dict[str, int] = {}
    for r in records:
        if r.how == "ok" and r.input[0] == "read" and isinstance(r.output, tuple):
            for _, oid in r.output:
                seen.setdefault(oid, r.call)
                seen[oid] = min(seen[oid], r.call)
    return [
        w
        for w in records
        if w.how == "ok"
        and w.output is False
        and w.input[0] == "cas"
        and w.input[3] not in (None, PENDING)
        and w.input[3] in seen
    ]
