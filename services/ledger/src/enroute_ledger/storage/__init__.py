"""Durable storage of a ledger node: every group's Raft log, hard state and state rows.

:mod:`.api` holds the contract; :class:`SqliteStore` is the implementation
(docs/ledger-storage.md says why, with the figures).
"""

from __future__ import annotations

from .api import GroupId, LogStore, WriteBatch
from .sqlite_store import SqliteStore

__all__ = ["GroupId", "LogStore", "SqliteStore", "WriteBatch"]
