"""ReadIndex bookkeeping (thesis §6.4): reads waiting for a heartbeat round.

The leader records its commit index when a read arrives, then tags the next
heartbeats with the read's context. Once a quorum of voters has answered a
heartbeat carrying that context, the leader knows it was still the leader
when the read arrived, so every read up to and including it may be served at
the recorded index. Reads are answered in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from enroute_core.base.ids import LogIndex, NodeId

from .types import Message


@dataclass(slots=True)
class ReadRequest:
    index: LogIndex
    request: Message
    acks: set[NodeId] = field(default_factory=set)


_NO_READS: dict[bytes, ReadRequest] = {}  # shared, never written: see add_request
_NO_QUEUE: list[bytes] = []


class ReadOnly:
    __slots__ = ("_pending", "_queue")

    def __init__(self) -> None:
        # made at the first read: every group holds one of these, and most never read
        self._pending: dict[bytes, ReadRequest] = _NO_READS
        self._queue: list[bytes] = _NO_QUEUE

    def __len__(self) -> int:
        return len(self._queue)

    def add_request(self, index: LogIndex, m: Message) -> None:
        if m.context in self._pending:
            return  # a duplicate of a read already waiting
        if self._pending is _NO_READS:
            self._pending, self._queue = {}, []
        self._pending[m.context] = ReadRequest(index, m)
        self._queue.append(m.context)

    def recv_ack(self, node: NodeId, context: bytes) -> set[NodeId] | None:
        req = self._pending.get(context)
        if req is None:
            return None
        req.acks.add(node)
        return req.acks

    def advance(self, context: bytes) -> list[ReadRequest]:
        """Release every read queued up to and including ``context``."""
        if context not in self._pending:
            return []
        n = self._queue.index(context) + 1
        released = [self._pending.pop(c) for c in self._queue[:n]]
        del self._queue[:n]
        return released

    def last_context(self) -> bytes:
        return self._queue[-1] if self._queue else b""
