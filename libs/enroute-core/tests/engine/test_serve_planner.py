"""The pack planner of serving, alone (``serve.PackPlanner``): what each planned entry is
sent as, by the module's rules 1-4 (gitformat-pack, "Deltified representation"; seed
004, "Layers": entries are stored as pack entries in id order, so serving copies them).

Two small layers written in memory (no file, no process, no output: the planner's
instructions are read as values): layer one holds blob A whole and blob B, a delta on A;
layer two holds blob C, a delta on B (an external base), and blob D whole. Plans are
made by hand, so each rule is met once: a base in the pack (rewritten, or kept without
``ofs-delta``), a base the client has (kept in a thin pack), a base neither sent nor had
(resolved), and the run path, resumption at a limit, and the emitter's share of a run.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Generator, Sequence

import pytest
from pyroaring import BitMap

from enroute_core.base.ids import ObjectId
from enroute_core.engine import serve
from enroute_core.engine.serve import (
    Copy,
    Instruction,
    PackPlan,
    PackPlanner,
    Resolved,
    Rewrite,
    Run,
)
from enroute_core.engine.view import View
from enroute_core.git.pack import encode_entry_header
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer import Kind, LayerReader
from enroute_core.storage.layer.writer import LayerEntry, write_layer
from enroute_testing.pushed import inline_entry

BODIES = {name: (name * 40).encode() for name in "ABCD"}


def _oid(name: str) -> ObjectId:
    body = BODIES[name]
    return ObjectId(hashlib.sha1(b"blob %d\0" % len(body) + body).digest())


def _full(name: str) -> LayerEntry:
    body = BODIES[name]
    entry = encode_entry_header(3, len(body)) + zlib.compress(body)
    return LayerEntry(_oid(name), Kind.BLOB, entry, len(body), None, 0)


def _delta(name: str, base: str, depth: int) -> LayerEntry:
    """An insert-only delta (gitformat-pack, "Deltified representation"): the whole body."""
    body, source = BODIES[name], BODIES[base]
    delta = bytes([len(source), len(body), len(body)]) + body
    entry = encode_entry_header(7, len(delta)) + _oid(base) + zlib.compress(delta)
    return LayerEntry(_oid(name), Kind.BLOB, entry, len(body), _oid(base), depth)


def _layer(entries: list[LayerEntry], first_id: int, pin: int) -> tuple[object, LayerReader]:
    data, sealed = write_layer(entries)
    reader = LayerReader.open(BytesSource(data), meta_size=sealed.meta_size)
    return inline_entry(sealed, first_id, pin), reader


@pytest.fixture(scope="module")
def view() -> View:
    one = _layer([_full("A"), _delta("B", "A", 1)], 0, 1)
    two = _layer([_delta("C", "B", 2), _full("D")], 2, 2)
    return View([one, two])  # type: ignore[list-item]


def _plan(
    ids: list[int], *, have: Sequence[int] = (), thin: bool = False, ofs: bool = True
) -> PackPlan:
    return PackPlan(BitMap(ids), BitMap(have), (), thin=thin, ofs_delta=ofs)


def _drive(steps: Generator[Instruction, int | None, None], answer: int = 0) -> list[Instruction]:
    """Every instruction, each :class:`Run` answered with ``answer`` entries sent."""
    out: list[Instruction] = []
    try:
        step = next(steps)
        while True:
            out.append(step)
            step = steps.send(answer if isinstance(step, Run) else None)
    except StopIteration:
        return out


def _data(step: Instruction) -> bytes:
    assert not isinstance(step, Run)
    return bytes(step.data)


def _stored(view: View, object_id: int) -> bytes:
    first, _, reader = view.layer_of(object_id)
    offset, length, _ = reader.entry_row(object_id - first)
    return reader.data_bytes(offset, length)


def test_a_full_clone_copies_and_rewrites(view: View) -> None:
    """Rule 1: full entries as stored; rule 2: a base earlier in the pack makes an
    OFS_DELTA, named by its place among the pack's entries (B on A: entry 0; C on B, an
    external base of its layer: entry 1)."""
    steps = _drive(PackPlanner(view, _plan([0, 1, 2, 3])).instructions())
    assert [type(s) for s in steps] == [Copy, Rewrite, Rewrite, Copy]
    assert [(s.base, s.object_id) for s in steps if isinstance(s, Rewrite)] == [(0, 1), (1, 2)]
    assert [_data(s) for s in steps] == [_stored(view, i) for i in range(4)]
    assert not any(s.thin for s in steps if isinstance(s, Copy))


def test_without_ofs_delta_the_deltas_go_as_stored(view: View) -> None:
    steps = _drive(PackPlanner(view, _plan([0, 1, 2, 3], ofs=False)).instructions())
    assert [type(s) for s in steps] == [Copy] * 4
    assert [_data(s) for s in steps] == [_stored(view, i) for i in range(4)]


def test_a_thin_pack_keeps_a_delta_on_a_base_the_client_has(view: View) -> None:
    """Rule 3 (gitprotocol-v2 "fetch", thin-pack): C's base B is the client's."""
    plan = _plan([2, 3], have=[0, 1], thin=True)
    steps = _drive(PackPlanner(view, plan).instructions())
    assert [type(s) for s in steps] == [Copy, Copy]
    assert [s.thin for s in steps if isinstance(s, Copy)] == [True, False]


@pytest.mark.parametrize("thin", [False, True])
def test_a_delta_on_a_base_neither_sent_nor_had_is_resolved(view: View, thin: bool) -> None:
    """Rule 4: without a thin pack, or with a base the client lacks, C goes whole."""
    plan = _plan([2, 3], have=[0, 1] if not thin else [], thin=thin)
    steps = _drive(PackPlanner(view, plan).instructions())
    assert [type(s) for s in steps] == [Resolved, Copy]
    entry = _data(steps[0])
    assert entry[:2] == encode_entry_header(3, len(BODIES["C"]))
    assert zlib.decompress(entry[2:]) == BODIES["C"]


def test_the_planner_stops_at_a_limit_and_goes_on_from_there(view: View) -> None:
    planner = PackPlanner(view, _plan([0, 1, 2, 3]))
    assert [type(s) for s in _drive(planner.instructions(2))] == [Copy, Rewrite]
    assert planner.object_id == 2
    assert [type(s) for s in _drive(planner.instructions())] == [Rewrite, Copy]
    assert planner.object_id < 0


def test_an_entry_not_taken_is_planned_again(view: View) -> None:
    """The planner moves past an entry only once its instruction was carried out, so a
    writer stopped there (a read that raised) asks for it again."""
    planner = PackPlanner(view, _plan([0, 1, 2, 3]))
    steps = planner.instructions()
    assert type(next(steps)) is Copy
    assert type(steps.send(None)) is Rewrite
    steps.close()  # the emitter did not carry out the rewrite of id 1
    assert planner.object_id == 1
    assert [type(s) for s in _drive(planner.instructions())] == [Rewrite, Rewrite, Copy]


def test_consecutive_entries_of_a_layer_make_a_run(
    view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run for each layer's planned entries in a row; the entries the emitter sends
    back as sent are skipped, the others come one by one."""
    monkeypatch.setattr(serve, "_RUN_MIN", 2)
    steps = _drive(PackPlanner(view, _plan([0, 1, 2, 3])).instructions(), answer=2)
    assert [(type(s), s.start, s.stop) for s in steps if isinstance(s, Run)] == [
        (Run, 0, 2),
        (Run, 0, 2),
    ]
    assert len(steps) == 2
    steps = _drive(PackPlanner(view, _plan([0, 1, 2, 3])).instructions(), answer=0)
    assert [type(s) for s in steps] == [Run, Copy, Rewrite, Run, Rewrite, Copy]
