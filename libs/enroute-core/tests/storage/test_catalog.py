"""The node catalog of local copies: a JSON base and an append-only journal.

Seed 004, "Files and tiers" (every local copy recorded in the node catalog:
length, chunk bitmap, linked, which process wrote it) and "Storage service",
Rule (derivable data: a lost record costs a refetch). The byte layout is
docs/formats/catalog.md; the vectors below are its examples. Issue 19: a change
costs one journal line, not a rewrite of every record.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from enroute_core.base.errors import CorruptData
from enroute_core.storage import catalog as catalog_module
from enroute_core.storage.catalog import (
    CATALOG_FILE,
    JOURNAL_FILE,
    Catalog,
    CopyRecord,
    encode_record,
    encode_removal,
    replay,
)

TOKEN = "0123456789abcdef"
A = "r~x/1d5e0f0c8d1a9b6e2c3f4a5b6c7d8e9f0a1b2c3d"
B = "r~x/77aa00bb11cc22dd33ee44ff5566778899aabbcc"

JOURNAL_GOLDEN = (
    b'{"put":"r~x/1d5e0f0c8d1a9b6e2c3f4a5b6c7d8e9f0a1b2c3d","length":3145728,'
    b'"bitmap":"04","linked":false,"writer":"0123456789abcdef"}\n'
    b'{"put":"r~x/77aa00bb11cc22dd33ee44ff5566778899aabbcc","length":4096,'
    b'"bitmap":"","linked":true,"writer":"0123456789abcdef"}\n'
    b'{"put":"r~x/1d5e0f0c8d1a9b6e2c3f4a5b6c7d8e9f0a1b2c3d","length":3145728,'
    b'"bitmap":"07","linked":false,"writer":"0123456789abcdef"}\n'
    b'{"remove":"r~x/77aa00bb11cc22dd33ee44ff5566778899aabbcc"}\n'
)
"""docs/formats/catalog.md, "Journal": a sparse copy of 3 chunks with its last
(metadata) chunk, a linked copy, all three chunks loaded, the linked copy gone."""
BASE_GOLDEN = (
    b'{"version":1,"copies":{"r~x/1d5e0f0c8d1a9b6e2c3f4a5b6c7d8e9f0a1b2c3d":'
    b'{"length":3145728,"bitmap":"07","linked":false,"writer":"0123456789abcdef"}}}'
)
"""The same records folded into a base (docs/formats/catalog.md, "Base")."""


def _catalog(path: Path) -> Catalog:
    c = Catalog(path)
    c.token = TOKEN
    return c


def test_changes_are_appended_as_the_documented_lines(tmp_path: Path) -> None:
    c = _catalog(tmp_path)
    c.put(A, 3 * 1024 * 1024, b"\x04", False)
    c.put(B, 4096, b"", True)
    c.update_bitmap(A, b"\x07")
    c.remove(B)
    c.remove(B)  # nothing to remove: no line
    c.update_bitmap(B, b"\x01")  # no record: no line
    assert (tmp_path / JOURNAL_FILE).read_bytes() == JOURNAL_GOLDEN
    assert not (tmp_path / CATALOG_FILE).exists()
    c.close()
    again = Catalog(tmp_path)  # a restart folds the journal into the base
    assert (tmp_path / CATALOG_FILE).read_bytes() == BASE_GOLDEN
    assert not (tmp_path / JOURNAL_FILE).exists()
    assert again.get(A) == CopyRecord(A, 3 * 1024 * 1024, b"\x07", False, TOKEN)
    assert again.get(B) is None
    assert not again.written_here(again.get(A) or CopyRecord(A, 0, b"", False, TOKEN))


def test_the_documented_lines_decode_to_the_records() -> None:
    records: dict[str, CopyRecord] = {}
    assert replay(records, JOURNAL_GOLDEN) == 4
    assert records == {A: CopyRecord(A, 3 * 1024 * 1024, b"\x07", False, TOKEN)}
    rec = CopyRecord(B, 4096, b"", True, TOKEN)
    assert encode_record(rec) == JOURNAL_GOLDEN.split(b"\n")[1] + b"\n"
    assert encode_removal(B) == JOURNAL_GOLDEN.split(b"\n")[3] + b"\n"


def test_a_base_written_before_the_journal_existed_still_reads(tmp_path: Path) -> None:
    (tmp_path / CATALOG_FILE).write_bytes(BASE_GOLDEN)
    c = Catalog(tmp_path)
    assert c.names() == [A]
    assert c.foreign_in("r~x") == [A]  # another process wrote it


@pytest.mark.parametrize(
    "tail",
    [b'{"put":"r~x/new","length":40', b'{"put":"r~x/new","length":40\n', b"\x00\x00\x00\n"],
    ids=["no newline", "half a line", "zeros"],
)
def test_a_last_line_a_stop_cut_short_is_left_out(tmp_path: Path, tail: bytes) -> None:
    (tmp_path / JOURNAL_FILE).write_bytes(JOURNAL_GOLDEN + tail)
    c = Catalog(tmp_path)
    assert c.names() == [A]
    c.put(B, 1, b"\x01", False)  # the torn line does not spoil what comes after it
    c.close()
    assert Catalog(tmp_path).names() == [A, B]


@pytest.mark.parametrize(
    "bad",
    [b"not json", b"[1]", b'{"remove":"r~x/a","put":"r~x/a"}', b'{"put":"r~x/a","length":"1",'
     b'"bitmap":"","linked":false,"writer":"t"}', b'{"put":"r~x/a","length":1,"bitmap":"0",'
     b'"linked":false,"writer":"t"}'],
)  # fmt: skip
def test_a_bad_line_before_the_last_is_corrupt_data(tmp_path: Path, bad: bytes) -> None:
    (tmp_path / JOURNAL_FILE).write_bytes(bad + b"\n" + JOURNAL_GOLDEN)
    with pytest.raises(CorruptData) as e:
        Catalog(tmp_path)
    assert e.value.section == "catalog" and "line 1" in str(e.value)


def test_a_change_costs_one_line_whatever_the_number_of_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: a publish, an open or a chunk load wrote every record again before
    (O(copies) per push); it appends one line now, and the journal is folded into
    the base once it holds as many lines as there are records (O(1) amortized)."""
    monkeypatch.setattr(catalog_module, "JOURNAL_LINES_MIN", 64)
    c = _catalog(tmp_path)
    for i in range(2000):
        c.put(f"r~{i % 50}/{i:040x}", 4096, b"\x01", False)
    base = tmp_path / CATALOG_FILE
    journal = tmp_path / JOURNAL_FILE
    name = f"r~7/{7:040x}"
    c.update_bitmap(name, b"\x02")  # as many lines as records: this one folds first
    folded = base.stat()
    assert journal.read_bytes().count(b"\n") == 1
    line = encode_record(CopyRecord(name, 4096, b"\x03", False, TOKEN))
    before = journal.stat().st_size
    c.update_bitmap(name, b"\x03")
    assert journal.stat().st_size == before + len(line)
    assert base.stat().st_ino == folded.st_ino and base.stat().st_mtime_ns == folded.st_mtime_ns
    most = inodes = 0
    for i in range(6000):  # three times the records: folded again, the files stay bounded
        c.update_bitmap(f"r~{i % 50}/{i % 2000:040x}", bytes([i % 256]))
        most = max(most, base.stat().st_size + journal.stat().st_size)
        inodes += base.stat().st_ino != folded.st_ino
        folded = base.stat()
    assert inodes == 3  # one fold per 2,000 changes
    assert most <= 2.1 * base.stat().st_size
    c.close()
    assert Catalog(tmp_path).get(name) == CopyRecord(name, 4096, bytes([4007 % 256]), False, TOKEN)


def test_a_stop_between_the_new_base_and_the_old_journals_removal_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base is renamed into place before the journal goes: the old journal,
    replayed over the new base, gives the same records."""
    monkeypatch.setattr(catalog_module, "JOURNAL_LINES_MIN", 4)
    c = _catalog(tmp_path)
    for i in range(4):
        c.put(f"r~a/{i:040x}", 10, b"\x01", False)
    c.remove(f"r~a/{1:040x}")
    kept = tmp_path / "journal.before-fold"
    shutil.copy(tmp_path / JOURNAL_FILE, kept)
    records = {n: c.get(n) for n in c.names()}
    c.put(f"r~a/{9:040x}", 10, b"\x01", False)  # the fifth line: folds first
    c.close()
    (tmp_path / JOURNAL_FILE).unlink()  # the line written after the fold: never written
    os.replace(kept, tmp_path / JOURNAL_FILE)  # as if the fold had stopped before the unlink
    again = Catalog(tmp_path)
    assert {n: again.get(n) for n in again.names()} == records


def test_foreign_records_are_found_by_repository(tmp_path: Path) -> None:
    """A previous run's records (another writer), found per repository without a walk
    of every record; one written here again is this process's."""
    first = Catalog(tmp_path)
    for repo in ("r~a", "r~b"):
        for i in range(3):
            first.put(f"{repo}/{i:040x}", 10, b"\x01", False)
    first.close()
    c = Catalog(tmp_path)
    assert c.foreign_in("r~a") == [f"r~a/{i:040x}" for i in range(3)]
    c.update_bitmap(f"r~a/{0:040x}", b"\x01")
    c.remove(f"r~a/{1:040x}")
    assert c.foreign_in("r~a") == [f"r~a/{2:040x}"]
    assert c.foreign_in("r~b") == [f"r~b/{i:040x}" for i in range(3)]
    assert c.foreign_in("r~c") == []
