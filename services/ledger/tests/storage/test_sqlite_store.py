"""Damage to the SQLite store's files: torn or damaged WAL, damaged rows, damaged pages.

A torn or damaged WAL (a crash during a commit, lost writes) must leave the
state of some prefix of the committed rounds: SQLite stops at the first frame
whose checksum fails. Damage elsewhere must surface as ``CorruptData`` and
nothing else (STYLE rule 3); rows carry crcs because SQLite's pages do not.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from storemodel import Model, check_equal, entry, open_store, seed_from_env

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_ledger.raft.types import ConfState, HardState, SnapshotMetadata
from enroute_ledger.storage import SqliteStore
from enroute_ledger.storage.api import GroupId, WriteBatch
from enroute_ledger.storage.sqlite_store import DB_NAME

G1 = GroupId(b"team/app", 1)
G2 = GroupId(b"team/lib", 3)


def _rounds(store: SqliteStore, count: int) -> list[Model]:
    """``count`` committed rounds; the model after each (index 0: nothing)."""
    models = [Model()]
    for n in range(1, count + 1):
        m = _copy(models[-1])
        b = WriteBatch()
        for g in (G1, G2):
            b.append(g, [entry(n, 1 + n // 3, b"entry %d of %r" % (n, g.repo) * 8)])
            b.set_hard_state(g, HardState(Term(1 + n // 3), NodeId(2), LogIndex(n)))
            b.put_state(g, b"refs/heads/main", bytes([n]) * 28)
        if n % 3 == 0:
            b.set_snapshot(
                G1, SnapshotMetadata(LogIndex(n - 1), Term(1 + (n - 1) // 3), ConfState())
            )
            b.compact(G1, LogIndex(n - 1), keep=[LogIndex(n - 1)])
        assert m.commit(b)
        store.commit(b)
        models.append(m)
    return models


def _copy(m: Model) -> Model:
    import copy

    return copy.deepcopy(m)


def _snapshot_files(src: Path, dst: Path) -> None:
    """Copy the database and its WAL as a crash would leave them (no shared-memory index)."""
    dst.mkdir()
    for name in (DB_NAME, DB_NAME + "-wal"):
        if (src / name).exists():
            shutil.copyfile(src / name, dst / name)


def _matching_prefix(store: SqliteStore, models: list[Model]) -> int:
    for k in range(len(models) - 1, -1, -1):
        try:
            check_equal(store, models[k])
        except AssertionError:
            continue
        return k
    raise AssertionError("the store holds no prefix of the committed rounds")


def test_torn_wal_leaves_a_prefix_of_rounds(tmp_path: Path) -> None:
    live = tmp_path / "live"
    s = open_store(live)
    models = _rounds(s, 6)
    frozen = tmp_path / "frozen"
    _snapshot_files(live, frozen)  # taken while the store is open: nothing checkpointed
    s.close()
    wal = (frozen / (DB_NAME + "-wal")).read_bytes()
    assert len(wal) > 4096
    seen = []
    for cut in [*range(0, len(wal), 1531), len(wal)]:
        work = tmp_path / f"cut{cut}"
        _snapshot_files(frozen, work)
        (work / (DB_NAME + "-wal")).write_bytes(wal[:cut])
        store = open_store(work)
        seen.append(_matching_prefix(store, models))
        store.close()
        shutil.rmtree(work)
    assert seen == sorted(seen)  # a longer WAL never holds fewer rounds
    assert seen[0] == 0 and seen[-1] == 6


def test_damaged_wal_frame_drops_it_and_the_rest(tmp_path: Path) -> None:
    live = tmp_path / "live"
    s = open_store(live)
    models = _rounds(s, 6)
    frozen = tmp_path / "frozen"
    _snapshot_files(live, frozen)
    s.close()
    wal = (frozen / (DB_NAME + "-wal")).read_bytes()
    rng = random.Random(seed_from_env(77))
    for at in sorted(rng.sample(range(len(wal)), 40)):
        work = tmp_path / f"flip{at}"
        _snapshot_files(frozen, work)
        damaged = bytearray(wal)
        damaged[at] ^= 0x10
        (work / (DB_NAME + "-wal")).write_bytes(bytes(damaged))
        try:
            store = open_store(work)
        except CorruptData:
            shutil.rmtree(work)
            continue
        _matching_prefix(store, models)
        store.close()
        shutil.rmtree(work)


def _read_everything(store: SqliteStore) -> None:
    for g in store.groups():
        first, last = store.first_index(g), store.last_index(g)
        if last >= first:
            store.entries(g, first, LogIndex(last + 1), 1 << 30)
        for k in store.kept_indexes(g):
            store.entry(g, k)
        store.state_rows(g)
        store.hard_state(g)


def test_damaged_pages_raise_only_corrupt_data(tmp_path: Path) -> None:
    """Flip sampled bytes of the checkpointed database: open and read, only CorruptData escapes."""
    live = tmp_path / "live"
    s = open_store(live)
    models = _rounds(s, 8)
    s.close()  # the last connection checkpoints the WAL into the database
    db = (live / DB_NAME).read_bytes()
    rng = random.Random(seed_from_env(99))
    caught = 0
    for at in sorted(rng.sample(range(len(db)), min(len(db), 250))):
        work = tmp_path / "work"
        work.mkdir()
        damaged = bytearray(db)
        damaged[at] ^= 1 << rng.randrange(8)
        (work / DB_NAME).write_bytes(bytes(damaged))
        try:
            store = open_store(work)
            try:
                _read_everything(store)
            finally:
                store.close()
        except CorruptData:
            caught += 1
        shutil.rmtree(work)
    assert caught > 0
    store = open_store(live)
    check_equal(store, models[-1])
    store.close()


@pytest.mark.parametrize(
    ("sql", "when"),
    [
        ("UPDATE log SET data = x'00' || data WHERE idx = 2", "read"),
        ("UPDATE log SET term = term + 1 WHERE idx = 4", "read"),
        ("UPDATE state SET value = x'01' WHERE key = x'72656673'", "never"),
        ("UPDATE state SET value = x'01'", "read"),
        ("UPDATE groups SET hs_commit = hs_commit + 1", "open"),
        ("UPDATE groups SET base_index = base_index - 1", "open"),
        ("DELETE FROM log WHERE idx = 5", "open"),
        ("DELETE FROM log WHERE idx = 5 AND gid = 1", "open"),  # the kept entry of G1
    ],
)
def test_rows_changed_behind_the_store_are_caught(tmp_path: Path, sql: str, when: str) -> None:
    s = open_store(tmp_path)
    _rounds(s, 6)
    s.close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute(sql)
    conn.commit()
    conn.close()
    if when == "open":
        with pytest.raises(CorruptData):
            open_store(tmp_path)
        return
    store = open_store(tmp_path)
    try:
        if when == "read":
            with pytest.raises(CorruptData):
                _read_everything(store)
        else:
            _read_everything(store)
    finally:
        store.close()


def test_not_a_database_is_corrupt_data(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"this is not an SQLite file" * 100)
    with pytest.raises(CorruptData):
        open_store(tmp_path)


def test_page_cache_is_the_configured_size(tmp_path: Path) -> None:
    """Both connections cache ``ledger_store_page_cache_bytes`` of pages (SQLite's
    ``cache_size``, negative = KiB; https://sqlite.org/pragma.html#pragma_cache_size):
    SQLite's default 2,000 KiB each filled as the store grew and showed as RSS per idle
    repository (issue 19)."""
    limits = dataclasses.replace(DEFAULT_LIMITS, ledger_store_page_cache_bytes=384 * 1024)
    store = SqliteStore.open(tmp_path, limits=limits)
    try:
        for conn in (store._w, store._r):
            assert conn.execute("PRAGMA cache_size").fetchone()[0] == -384
    finally:
        store.close()
