"""The run path of ``write_pack``: consecutive planned entries copied from one read of the
data region (seed 004, "Layers": entries are stored as pack entries in id order).

Every plan is written twice, once with runs and once entry by entry (runs turned
off): the packs, the counts and the progress events must be the same bytes and
values, whatever cuts the runs (plan gaps, the byte bound, bases to resolve). The
full pack is also checked by ``index-pack --strict``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import oid_from_hex
from enroute_core.engine import serve
from enroute_core.engine.serve import (
    BlobNone,
    PackPlan,
    ProgressEvent,
    TreeDepth,
    WriteStats,
    plan_fetch,
    write_pack,
)
from enroute_core.engine.view import View
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.layer.format import RECORD, REF_NONE
from enroute_core.storage.layer.reader import EntryRows
from enroute_testing.gitcli import run_git
from enroute_testing.pushed import rev_parse, three_pushes
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo

pytestmark = pytest.mark.interop

_SPEC = RepoSpec(seed=41, commits=40, branches=2, merge_every=6, files=30, file_bytes=700,
                 rename_rate=0.1, annotated_tags=2, lightweight_tags=1)  # fmt: skip


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("runs") / "full.git", _SPEC)


@pytest.fixture(scope="module")
def view(repo: GeneratedRepo) -> View:
    """Three pushed layers: the first pack, then two thin packs ingested against the view."""
    return View(three_pushes(repo))


def _write(view: View, plan: PackPlan) -> tuple[bytes, WriteStats, list[ProgressEvent]]:
    parts: list[bytes] = []
    events: list[ProgressEvent] = []
    stats = write_pack(view, plan, parts.append, progress=events.append, progress_every=7)
    return b"".join(parts), stats, events


def _plans(repo: GeneratedRepo, view: View) -> dict[str, PackPlan]:
    tips = [oid_from_hex(v) for v in repo.refs.values()]
    main = rev_parse(repo.path, "main")
    count = int(run_git(["rev-list", "--count", "--first-parent", "main"], cwd=repo.path))
    old = rev_parse(repo.path, f"main~{count // 2}")
    return {
        "full-ofs": plan_fetch(view, tips),
        "full-ref": plan_fetch(view, tips, ofs_delta=False),
        "thin": plan_fetch(view, [main], [old], thin=True),
        "not-thin": plan_fetch(view, [main], [old], thin=False),
        "blob-none": plan_fetch(view, tips, filter=BlobNone()),
        "tree-1": plan_fetch(view, [main], filter=TreeDepth(1)),
        "deepen-1": plan_fetch(view, [main], deepen=1),
    }


@pytest.mark.parametrize("run_bytes", [None, 64, 3000])
def test_runs_write_the_same_pack_as_entry_by_entry(
    repo: GeneratedRepo, view: View, monkeypatch: pytest.MonkeyPatch, run_bytes: int | None
) -> None:
    if run_bytes is not None:
        monkeypatch.setattr(serve, "_RUN_BYTES_MAX", run_bytes)
    for name, plan in _plans(repo, view).items():
        with_runs = _write(view, plan)
        with monkeypatch.context() as m:
            m.setattr(serve, "_RUN_MIN", 1 << 40)  # every entry alone
            alone = _write(view, plan)
        assert with_runs[0] == alone[0], name
        assert with_runs[1] == alone[1], name
        assert with_runs[2] == alone[2], name


def test_runs_are_taken_for_a_full_clone(
    repo: GeneratedRepo, view: View, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Most entries go through runs (so the test above compares the two paths), and the
    pack they make passes ``index-pack --strict``."""
    calls: list[int] = []
    real = serve._write_run

    def spy(*args: Any, **kwargs: Any) -> Any:
        counts = real(*args, **kwargs)
        calls.append(counts.entries)
        return counts

    monkeypatch.setattr(serve, "_write_run", spy)
    plan = plan_fetch(view, [oid_from_hex(v) for v in repo.refs.values()])
    pack, stats, _ = _write(view, plan)
    assert sum(calls) > plan.object_count // 2
    assert stats.ofs_rewritten > 0
    fresh = tmp_path / "fresh.git"
    fresh.mkdir()
    run_git(["init", "--quiet", "--bare", "."], cwd=fresh)
    run_git(["index-pack", "--strict", "--stdin"], cwd=fresh, input=pack)


def test_a_delta_record_on_a_full_entry_is_corrupt_in_a_run(
    repo: GeneratedRepo, view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table that calls a full entry a delta is refused, as entry by entry does."""
    real = LayerReader.entry_rows

    def lying(self: LayerReader, start: int, stop: int, intent: Any = None) -> Any:
        rows = real(self, start, stop, intent)
        raw = bytearray(rows.raw)
        for k, (_, _, base) in enumerate(rows):
            if base == REF_NONE and start + k > 0:
                # the base ref at 40 of the record (RECORD): "a delta against local 0"
                struct.pack_into("<I", raw, k * RECORD.size + 40, 0)
                break
        return EntryRows(bytes(raw))

    monkeypatch.setattr(LayerReader, "entry_rows", lying)
    plan = plan_fetch(view, [oid_from_hex(v) for v in repo.refs.values()], ofs_delta=False)
    with pytest.raises(CorruptData):
        write_pack(view, plan, lambda _: None)


def test_a_run_longer_than_a_piece_goes_out_in_pieces(
    repo: GeneratedRepo, view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run past ``_PIECE_BYTES_MAX`` (a large entry alone) is handed on in pieces after
    the buffer instead of joined to it (issue 25: a 64 MiB entry was held twice); the
    pack is the same bytes, no piece passes the bound."""
    plan = plan_fetch(view, [oid_from_hex(v) for v in repo.refs.values()])
    expected = _write(view, plan)
    large: list[int] = []
    real = serve._PackOut.hand_large

    def spy(out: Any, data: bytes) -> None:
        large.append(len(data))
        real(out, data)

    monkeypatch.setattr(serve._PackOut, "hand_large", spy)
    monkeypatch.setattr(serve, "_FLUSH_BYTES", 1000)
    monkeypatch.setattr(serve, "_PIECE_BYTES_MAX", 2000)
    parts: list[bytes] = []
    stats = write_pack(view, plan, parts.append)
    assert large and all(n > 2000 for n in large)
    assert b"".join(parts) == expected[0] and stats == expected[1]
    assert max(len(p) for p in parts) <= 2000 + 20  # the last may carry the trailer
