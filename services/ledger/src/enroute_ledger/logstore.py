"""The one place the runtime opens its durable ``LogStore``.

``enroute_ledger.storage`` declares :class:`SqliteStore` its implementation
(docs/ledger-storage.md); the runtime only sees the ``LogStore`` protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from enroute_core.base.limits import DEFAULT_LIMITS, Limits

from .storage import LogStore, SqliteStore


def open_log_store(
    path: Path, *, clock: Callable[[], float] | None = None, limits: Limits = DEFAULT_LIMITS
) -> LogStore:
    """Open (or create) the node's store under ``path``; refuses a directory in use.

    ``clock`` (seconds, monotonic) times the store's write rounds for /metrics.
    """
    return SqliteStore.open(path, limits=limits, clock=clock)
