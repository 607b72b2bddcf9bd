"""Seed 001 (Lifecycle) as executable scenario files: ``testdata/scenarios/*.txt``.

Each file walks one of the hardest lifecycle paths through the pure state machine
(``enroute_core.state.apply``, applied by every voter to its copy of the log) and
the maintenance lease (``enroute_core.engine.maintenance.RepoMaintainer`` over a
``file://`` store in a temporary directory). No process, network or Raft: a voter is
a state and the length of the log prefix it has applied, so a lagging voter is one
that was left out of ``to=``. The files cite the seed section each case checks;
docs/flows.md says where each step lives in the services.

The directives (arguments ``key=value``, ``key=(a,b)``; object ids are short names
such as ``c1``, shown back by name):

- ``voters a b c``: the ledger members.
- ``create [head=refs/heads/x] [on=(a,b)] [window=W]``: a claim (Lifecycle._claim):
  the activate command applied to the state object (missing or deleted), the result
  put back by compare-and-swap, and the claim's entry applied by the voters ``on``
  (default all), which drop the incarnations it supersedes.
- ``commit inc=E refs/heads/x=OLD:NEW ... [push] [stamp=S] [nonatomic] [layer=L]
  [stored=L gen=G] [to=(a,b)]``: a compute's command, appended to the log of the
  live incarnation and applied by the voters ``to`` (default all; the first one
  answers). ``-`` is "no value". ``layer=`` adds an inline layer of one object.
- ``delete [inc=E] [to=(a,b)]``: the tombstone of the live incarnation (or of ``E``)
  through the log, then the deleted state swapped into the state object
  (Lifecycle.delete).
- ``catch-up a``: voter ``a`` applies the entries it missed.
- ``join a [inc=E]``: a peer's message reaches ``a`` for a group it lacks.
- ``restart a``: voter ``a`` starts again and drops every incarnation the state
  object says is ended (Lifecycle.startup).
- ``list``: each voter's hosted state and the merge a compute makes of them.
- ``state [voter=a | object]``: a voter's state, or the state object.
- ``lease holder=h now=T``: the maintainer of compute ``h`` takes or renews the lease.
- ``plan holder=h run=(L1,L2) as=M``: ``h`` plans a merge of a run of layers.
- ``submit holder=h now=T [skewed]``: ``h`` proposes its planned merge if it still
  holds the lease at ``T`` (``skewed``: its clock says it does, whatever the time).

``REWRITE=1`` rewrites the expected outputs (then review the diff).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import pytest

from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.engine.maintenance import MaintenanceSettings, RepoMaintainer
from enroute_core.state import (
    DEFAULT_UPLOAD_WINDOW,
    MISSING,
    Activate,
    ApplyResult,
    Command,
    Commit,
    Delete,
    LayerKind,
    NewLayer,
    PlacedLayer,
    RefUpdate,
    ReplaceLayers,
    RepoState,
    apply,
)
from enroute_core.storage.objectstore.file import FileStore
from enroute_testing.datadriven import TestData, run_file

SCENARIOS = sorted((Path(__file__).parent / "testdata" / "scenarios").glob("*.txt"))
REPO = "team/app"
S_US = 1_000_000


@dataclass
class Voter:
    """One ledger member: per hosted incarnation, its state and how much of the log it applied."""

    hosted: dict[int, tuple[RepoState, int]] = field(default_factory=dict)

    def newest(self) -> RepoState | None:
        return self.hosted[max(self.hosted)][0] if self.hosted else None


@dataclass
class Log:
    base: RepoState  # what the claim's entry (entry 0) applies to
    entries: list[Command] = field(default_factory=list)


class World:
    """The scenario's ledger, state object and computes; every output is text."""

    def __init__(self, tmp: Path) -> None:
        self.voters: dict[str, Voter] = {}
        self.obj: RepoState = MISSING  # the state object, repos/<repo>/state
        self.logs: dict[int, Log] = {}
        self.names: dict[ObjectId, str] = {}
        self.layers: dict[str, NewLayer] = {}
        self.plans: dict[str, ReplaceLayers] = {}
        self.store = FileStore(tmp / "store")
        self.maintainers: dict[str, RepoMaintainer] = {}
        self.settings = MaintenanceSettings(lease_duration_us=60 * S_US, lease_margin_us=10 * S_US)
        self.loop = asyncio.new_event_loop()

    # -- names ----------------------------------------------------------------------------

    def oid(self, name: str) -> ObjectId | None:
        if name == "-":
            return None
        oid = ObjectId(hashlib.sha1(name.encode()).digest())
        self.names[oid] = name
        return oid

    def shown(self, text: str) -> str:
        for oid, name in self.names.items():
            text = text.replace(oid_to_hex(oid), name)
        for name, layer in self.layers.items():
            text = text.replace(layer.root.hex(), name)
        return text

    def layer(self, name: str, *, objects: int = 1, gen: int | None = None) -> NewLayer:
        if gen is None:
            data = f"inline layer {name} ".encode() * 4
            layer = NewLayer(
                LayerKind.INLINE, objects, len(data), 0, blake3.blake3(data).digest(), 0, data
            )
        else:
            root = blake3.blake3(name.encode()).digest()
            layer = NewLayer(LayerKind.STORED, objects, 4096, 64, root, gen)
        self.layers[name] = layer
        return layer

    def layer_name(self, root: bytes) -> str:
        return next((n for n, layer in self.layers.items() if layer.root == root), root.hex()[:8])

    # -- the log --------------------------------------------------------------------------

    def live(self) -> int:
        return max(self.logs) if self.logs else 0

    def chosen(self, d: TestData, key: str) -> list[str]:
        chosen = list(d.values(key)) or list(self.voters)
        unknown = [v for v in chosen if v not in self.voters]
        if unknown:
            raise d.fail(f"unknown voters {unknown}")
        return chosen

    def catch_up(self, name: str, inc: int) -> ApplyResult | None:
        """Voter ``name`` applies what it lacks of the log of ``inc``; the last result."""
        voter, log = self.voters[name], self.logs[inc]
        state, applied = voter.hosted.get(inc, (log.base, 0))
        result = None
        for index in range(applied, len(log.entries)):
            result = apply(state, log.entries[index], log_index=index + 1)
            state = result.state
        voter.hosted[inc] = (state, len(log.entries))
        return result

    def append(self, d: TestData, command: Command) -> ApplyResult:
        inc = self.live()
        if inc == 0:
            raise d.fail("no incarnation has a log yet")
        self.logs[inc].entries.append(command)
        results = [self.catch_up(v, inc) for v in self.chosen(d, "to")]
        first = results[0]
        assert first is not None
        return first

    # -- output ---------------------------------------------------------------------------

    def describe(self, state: RepoState | None) -> str:
        if state is None:
            return "hosts nothing"
        if not state.exists:
            return "missing"
        status = "deleted" if state.deleted else "live"
        lines = [f"incarnation={state.incarnation} {status} version={state.version}"]
        if state.live:
            kept = " (kept)" if state.head_kept else ""
            lines.append(f"HEAD {state.head.decode()}{kept}")
            for ref, value in sorted(state.refs.items()):
                lines.append(f"{ref.decode()} {self.shown(oid_to_hex(value.oid))}")
            if state.manifest:
                lines.append("layers " + " ".join(
                    f"{self.layer_name(e.root)}[{e.first_id}+{e.end_id - e.first_id}]"
                    for e in state.manifest
                ))  # fmt: skip
            if state.last_push_us is not None:
                lines.append(f"last push {state.last_push_us // S_US}s")
        lines.append(f"upload_gen={state.upload_gen} window={state.upload_window}")
        return "\n".join(lines)

    def result(self, result: ApplyResult) -> str:
        o = result.outcome
        lines = [o.code.value + (f": {o.message}" if o.message else "")]
        for r in result.refs:
            reason = f" ({r.reason})" if r.reason else ""
            lines.append(f"  {r.name.decode()} {r.status.value}{reason}")
        return self.shown("\n".join(lines))

    # -- directives -----------------------------------------------------------------------

    def run(self, d: TestData) -> str:
        handler: Callable[[TestData], str] | None = getattr(
            self, "do_" + d.cmd.replace("-", "_"), None
        )
        if handler is None:
            raise d.fail("unknown directive")
        return handler(d)

    def do_voters(self, d: TestData) -> str:
        self.voters = {a.key: Voter() for a in d.args}
        return f"{len(self.voters)} voters: {' '.join(self.voters)}"

    def do_create(self, d: TestData) -> str:
        head = d.get("head", "").encode() or None
        window = int(d.get("window", str(DEFAULT_UPLOAD_WINDOW)))
        cmd = Activate(create=True, head=head, upload_window=window)
        if self.obj.live:  # Lifecycle.activate hosts it and answers, proposing nothing
            leader = self.voters[self.chosen(d, "on")[0]].newest()
            return "exists: nothing changes\n" + self.describe(leader)
        claim = apply(self.obj, cmd, log_index=0)
        if not claim.outcome.ok:
            return self.result(claim)
        base, self.obj = self.obj, claim.state  # the CAS into the state object
        self.logs[claim.state.incarnation] = Log(base, [cmd])
        for name in self.chosen(d, "on"):
            voter = self.voters[name]
            for older in [i for i in voter.hosted if i < claim.state.incarnation]:
                del voter.hosted[older]  # seed 001: hosting E + 1 drops E
            self.catch_up(name, claim.state.incarnation)
        return "claimed by compare-and-swap on the state object\n" + self.describe(claim.state)

    def do_commit(self, d: TestData) -> str:
        updates = []
        for a in d.args:
            if a.key.startswith("refs/"):
                old, _, new = a.value.partition(":")
                updates.append(RefUpdate(a.key.encode(), self.oid(old), self.oid(new)))
        layer = None
        if d.has("layer"):
            layer = self.layer(d.get("layer"), objects=int(d.get("objects", "1")))
        elif d.has("stored"):
            layer = self.layer(d.get("stored"), gen=int(d.get("gen")))
        cmd = Commit(
            incarnation=int(d.get("inc")),
            ref_updates=tuple(updates),
            new_layer=layer,
            stamp_us=int(d.get("stamp", "1")) * S_US,
            is_push=d.has("push"),
            atomic=not d.has("nonatomic"),
        )
        result = self.append(d, cmd)
        return self.result(result) + f"\nversion={result.state.version}"

    def do_delete(self, d: TestData) -> str:
        inc = int(d.get("inc", str(self.live())))
        result = self.append(d, Delete(inc))
        out = [self.result(result)]
        if result.state.deleted:
            self.obj = result.state  # finish_deletion: trash marker, then the CAS
            out.append(f"trash marker trash/{REPO}/{inc} last_upload_gen={result.state.upload_gen}")
            out.append("state object: " + self.describe(self.obj).split("\n")[0])
        return "\n".join(out)

    def do_catch_up(self, d: TestData) -> str:
        out = []
        for a in d.args:
            voter = self.voters[a.key]
            for inc in sorted(voter.hosted):
                self.catch_up(a.key, inc)
            out.append(f"{a.key}: " + self.describe(voter.newest()).replace("\n", "\n   "))
        return "\n".join(out)

    def do_restart(self, d: TestData) -> str:
        out = []
        for a in d.args:
            voter = self.voters[a.key]
            for inc in sorted(voter.hosted):
                if voter.hosted[inc][0].is_ended_by(self.obj):
                    del voter.hosted[inc]
                    out.append(f"{a.key} drops incarnation {inc} (ended by the state object)")
            if not out:
                out.append(f"{a.key} keeps what it hosts")
        return "\n".join(out)

    def do_join(self, d: TestData) -> str:
        """A peer's message names incarnation ``inc`` (default: the live one) of a group the
        voter lacks; it joins only what the state object says is live (Lifecycle._join)."""
        name, inc = d.args[0].key, int(d.get("inc", str(self.live())))
        if inc != self.obj.incarnation or self.obj.deleted:
            return f"{name} does not join incarnation {inc}: the state object says it has ended"
        self.catch_up(name, inc)
        return f"{name}: " + self.describe(self.voters[name].newest()).replace("\n", "\n   ")

    def do_list(self, d: TestData) -> str:
        answers = {n: v.newest() for n, v in self.voters.items()}
        out = [f"{n}: {self.describe(s).splitlines()[0]}" for n, s in answers.items()]
        known = [s for s in answers.values() if s is not None]
        if known:
            best = max(known, key=RepoState.advancement)
            listed = "not listed (deleted)" if best.deleted else f"{REPO} listed"
            out.append(f"merged: incarnation={best.incarnation} version={best.version}: {listed}")
        return "\n".join(out)

    def do_state(self, d: TestData) -> str:
        if d.has("object"):
            return "state object: " + self.describe(self.obj)
        name = d.get("voter", next(iter(self.voters)))
        return f"{name}: " + self.describe(self.voters[name].newest())

    # -- maintenance ----------------------------------------------------------------------

    def maintainer(self, holder: str) -> RepoMaintainer:
        if holder not in self.maintainers:
            self.maintainers[holder] = RepoMaintainer(self.store, REPO, holder, self.settings)
        return self.maintainers[holder]

    def do_lease(self, d: TestData) -> str:
        m, now = self.maintainer(d.get("holder")), _seconds(d.get("now"))
        had = m.held
        got = self.loop.run_until_complete(m.acquire(now))
        if not got or m.held is None:
            lost = "lost its lease (taken over); " if had is not None else ""
            return f"{m.holder}: {lost}refused (another compute holds it)"
        lease = m.held.lease
        return (
            f"{m.holder}: holds term={lease.term} until {lease.expires_us // S_US}s "
            f"(acts until {(lease.expires_us - self.settings.lease_margin_us) // S_US}s)"
        )

    def do_plan(self, d: TestData) -> str:
        leader = self.voters[next(iter(self.voters))].newest()
        assert leader is not None
        run = [self.layers[n].root for n in d.values("run")]
        start = next(i for i, e in enumerate(leader.manifest) if e.root == run[0])
        entries = leader.manifest[start : start + len(run)]
        ids = entries[-1].end_id - entries[0].first_id
        merged = self.layer(d.get("as"), objects=ids)
        self.plans[d.get("holder")] = ReplaceLayers(
            leader.incarnation,
            entries[0].first_id,
            tuple(run),
            (PlacedLayer(entries[0].first_id, ids, merged),),
        )
        return (
            f"{d.get('holder')}: merge {' '.join(d.values('run'))} into {d.get('as')} ({ids} ids)"
        )

    def do_submit(self, d: TestData) -> str:
        m, now = self.maintainer(d.get("holder")), _seconds(d.get("now"))
        if not m.holds(now) and not d.has("skewed"):
            return f"{m.holder}: no longer holds the lease at {now // S_US}s: drops its output"
        return self.result(self.append(d, self.plans.pop(m.holder)))


def _seconds(text: str) -> int:
    return int(float(text.removesuffix("s")) * S_US)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.loop.close()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, world: World) -> None:
    run_file(path, world.run)


def test_the_scenarios_are_there_and_cite_their_seed() -> None:
    for path in SCENARIOS:  # the leading comment names the seed 001 section it checks
        lines = path.read_text(encoding="utf-8").split("\n")
        header = " ".join(line for line in lines[: lines.index("")] if line.startswith("#"))
        assert "seed 001, " in header.lower(), path.name
    names = {p.stem for p in SCENARIOS}
    assert {
        "delete_recreate_stale_push",
        "lagging_voter_listing",
        "kept_head_deleted_branch",
        "concurrent_pushes_one_ref",
        "maintenance_lease_takeover",
    } <= names, names
