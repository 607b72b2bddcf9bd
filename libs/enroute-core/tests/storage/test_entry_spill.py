"""The node's spill of rewritten full entries (storage/pool.py ``EntrySpill``).

A depth-1 clone of the `large` profile rewrites 155 MB of stored deltas whose bases
it does not send, more than the entry cache holds (issue 25, docs/serving.md,
"Rewritten deltas"): the spill keeps them in one unlinked file under the node's data
directory, bounded by ``serve_entry_spill_bytes_max``, started afresh when full. Every
byte goes through a real file in ``tmp_path``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from enroute_core.storage.pool import SPILL_ENTRY_BYTES_MIN, EntrySpill


def test_an_entry_put_is_read_back_and_leaves_no_file_name(tmp_path: Path) -> None:
    spill = EntrySpill(str(tmp_path / "rewrites"), 1000, entry_bytes_min=1)
    assert spill.get((1, 5)) is None
    spill.put((1, 5), b"a" * 100)
    spill.put((1, 6), b"b" * 200)
    spill.put((2, 5), b"c" * 50)  # another lineage's id 5
    assert spill.get((1, 5)) == b"a" * 100
    assert spill.get((1, 6)) == b"b" * 200
    assert spill.get((2, 5)) == b"c" * 50
    assert os.listdir(tmp_path / "rewrites") == [], "the file is unlinked: a crash leaves none"
    s = spill.stats()
    assert (s["used_bytes"], s["entries"], s["hits"], s["misses"]) == (350, 3, 3, 1)


def test_past_its_cap_the_file_starts_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bounded disk: an entry that would pass the cap empties the spill first; one larger
    than the cap is not kept; a reader that looked an entry up before the restart still
    reads its bytes (it holds the old file)."""
    spill = EntrySpill(str(tmp_path), 300, entry_bytes_min=1)
    spill.put((1, 1), b"x" * 200)
    spill.put((1, 2), b"y" * 100)
    assert spill.stats()["used_bytes"] == 300
    with caplog.at_level(logging.INFO, logger="enroute_core.storage.pool"):
        spill.put((1, 3), b"z" * 10)
    assert "spill full (2 entries, 300 bytes, cap 300): started afresh" in caplog.text
    assert spill.get((1, 1)) is None and spill.get((1, 2)) is None
    assert spill.get((1, 3)) == b"z" * 10
    spill.put((1, 4), b"w" * 301)
    assert spill.get((1, 4)) is None
    s = spill.stats()
    assert (s["used_bytes"], s["entries"], s["resets"]) == (10, 1, 1)


def test_a_discarded_key_is_gone_and_a_second_put_keeps_the_first(tmp_path: Path) -> None:
    spill = EntrySpill(str(tmp_path), 1000, entry_bytes_min=1)
    spill.put((1, 1), b"first")
    spill.put((1, 1), b"other")
    assert spill.get((1, 1)) == b"first"
    spill.discard((1, 1))
    assert spill.get((1, 1)) is None


def test_small_entries_count_as_the_minimum_so_the_index_stays_small(tmp_path: Path) -> None:
    """The index is in memory: entries smaller than ``SPILL_ENTRY_BYTES_MIN`` are charged
    that much, so a cap of four minimums keeps at most four entries whatever their size."""
    spill = EntrySpill(str(tmp_path), 4 * SPILL_ENTRY_BYTES_MIN)
    for i in range(10):
        assert spill.put((1, i), b"e" * 10)
    s = spill.stats()
    assert (s["entries"], s["used_bytes"], s["resets"]) == (2, 20, 2)
    assert spill.get((1, 9)) == b"e" * 10 and spill.get((1, 7)) is None


def test_a_spill_with_no_room_for_its_file_refuses_instead_of_failing(tmp_path: Path) -> None:
    """A directory that cannot be made (here a file stands in its way; in production a
    full or read-only disk) costs the memo, never the fetch that wanted to keep it."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"x")
    spill = EntrySpill(str(blocker / "rewrites"), 1000, entry_bytes_min=1)
    assert spill.put((1, 5), b"a" * 100) is False
    assert spill.get((1, 5)) is None
