"""A sans-IO Raft core in the manner of etcd-io/raft: no clock, no disk, no network.

The caller drives it through :class:`RawNode` and owns every side effect; the
contract it must keep is docs/raft.md. Ids, terms and indexes are the
``NodeId``, ``Term`` and ``LogIndex`` of ``enroute_core.base.ids``.
"""

from __future__ import annotations

from .config import RaftConfig, RandomSource, SplitMix64
from .errors import (
    Compacted,
    DropReason,
    EntriesUnavailable,
    SnapshotOutOfDate,
    SnapshotTemporarilyUnavailable,
    StorageSignal,
)
from .progress import ProgressState
from .raft import TRANSFER_CONTEXT, Raft
from .rawnode import ProgressView, RawNode, Status
from .storage import MemoryStorage, Storage
from .types import (
    EMPTY_HARD_STATE,
    EMPTY_SNAPSHOT,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Hibernation,
    Message,
    MessageType,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMetadata,
    SoftState,
)

__all__ = [
    "EMPTY_HARD_STATE",
    "EMPTY_SNAPSHOT",
    "TRANSFER_CONTEXT",
    "Compacted",
    "ConfChange",
    "ConfChangeType",
    "ConfState",
    "DropReason",
    "EntriesUnavailable",
    "Entry",
    "EntryType",
    "HardState",
    "Hibernation",
    "MemoryStorage",
    "Message",
    "MessageType",
    "ProgressState",
    "ProgressView",
    "Raft",
    "RaftConfig",
    "RandomSource",
    "RawNode",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotMetadata",
    "SnapshotOutOfDate",
    "SnapshotTemporarilyUnavailable",
    "SoftState",
    "SplitMix64",
    "Status",
    "Storage",
    "StorageSignal",
]
