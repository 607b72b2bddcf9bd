"""Fixtures of the store tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from storemodel import open_store  # noqa: E402

from enroute_ledger.storage import SqliteStore  # noqa: E402

Opener = Callable[[], SqliteStore]


@pytest.fixture
def opener(tmp_path: Path) -> Iterator[Opener]:
    """Opens the store at one directory; every store opened is closed at the end."""
    opened: list[SqliteStore] = []

    def open_() -> SqliteStore:
        s = open_store(tmp_path / "store")
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()
