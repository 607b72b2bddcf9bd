"""Many Raft groups on one ledger node (DESIGN.md, Processes: multi-Raft).

Pure like ``enroute_ledger.raft``: no clock, disk or network. The driver
ticks :class:`MultiRaft`, feeds it peers' :class:`Batch` values, and works
off each :class:`NodeReady` (persist all groups with one sync, send, apply,
``advance``).
"""

from __future__ import annotations

from .codec import decode_message, encode_message
from .node import MultiRaft, MultiRaftConfig, MultiRaftStats, StorageFactory
from .types import Batch, GroupId, GroupMessage, GroupReady, Heartbeat, NodeReady

__all__ = [
    "Batch",
    "GroupId",
    "GroupMessage",
    "GroupReady",
    "Heartbeat",
    "MultiRaft",
    "MultiRaftConfig",
    "MultiRaftStats",
    "NodeReady",
    "StorageFactory",
    "decode_message",
    "encode_message",
]
