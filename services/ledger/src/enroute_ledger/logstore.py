"""The one place the runtime opens its durable ``LogStore``.

``enroute_ledger.storage`` declares :class:`SqliteStore` its implementation
(docs/ledger-storage.md); the runtime only sees the ``LogStore`` protocol.
"""

from __future__ import annotations

from pathlib import Path

from .storage import LogStore, SqliteStore


def open_log_store(path: Path) -> LogStore:
    """Open (or create) the node's store under ``path``; refuses a directory in use."""
    return SqliteStore.open(path)
