"""Many subscriptions on one stream: the member's side of ``Ledger.Follow``.

docs/rpc.md, "Follow"; docs/fleet.md, "One stream per compute and member". A
``Subscribe`` call costs the member a gRPC call and a task per followed
repository, and the compute a cancelled call per evicted view, which ``grpc.aio``
leaks (grpc/grpc#43360). On a ``Follow`` stream a followed repository is a
:class:`Cursor`: its name, incarnation, the last version sent and the group it
reads, about 150 bytes and no task. The group's change notice
(:meth:`~enroute_ledger.group.Group.notify`) calls the cursors registered on it,
which mark their stream due; the stream's one sender (the servicer's response
generator) takes the due cursors in turn and sends what each has: the changes
after its version, or the next part of a snapshot. A cursor with more left goes
to the back of the line, so a large snapshot leaves in parts between other
repositories' changes.

A parked cursor reads only the group's summary (its version and deleted flag),
so a followed idle group hibernates and stays asleep (docs/raft.md, "Parked
subscriptions") until a change wakes it. Work that waits (hosting the group,
reading a snapshot's inline layers) runs in a task of its own for as long as it
takes, so one slow repository does not hold the others back.

The rules are those of :meth:`enroute_ledger.lifecycle.Lifecycle.subscribe`: a
snapshot first when the caller's version is 0, of another incarnation or older
than the log; then every change in version order; the end (OK) after the change
that deletes the repository or when the group is dropped here (follow again).
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import itertools
import logging
from collections import deque
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from enroute_core.base.errors import EnrouteError, Internal, NotFound
from enroute_core.state import RepoState, encode_state

from .group import Group
from .lifecycle import Lifecycle, SnapshotOut

log = logging.getLogger("enroute.ledger.follow")

SNAPSHOT_PART_BYTES = 1 << 20
"""Bytes of a checkpoint per snapshot part (a message well under the gRPC cap)."""
MESSAGE_BYTES = 1 << 20
"""A response carries events of several follows until it holds about this many bytes."""


@dataclass(frozen=True, slots=True)
class InlineOut:
    """An inline layer's file, sent before the snapshot that names it."""

    root: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class PartOut:
    """One part of a snapshot's checkpoint."""

    incarnation: int
    version: int
    data: bytes
    last: bool


@dataclass(frozen=True, slots=True)
class ChangesOut:
    """Changes in a row: (version, encoded Change)."""

    changes: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class EndOut:
    """The follow ended: OK (``error`` None: deleted, or dropped here) or an error."""

    error: EnrouteError | None


Piece = InlineOut | PartOut | ChangesOut | EndOut


def snapshot_pieces(
    ev: SnapshotOut, part_bytes: int = SNAPSHOT_PART_BYTES
) -> Iterator[InlineOut | PartOut]:
    """A snapshot's inline layers, then its parts (at least one, so a follower always
    sees the snapshot end). Subscribe sends the same pieces, one per message."""
    for root, layer in ev.inline:
        yield InlineOut(root, layer)
    data = ev.checkpoint
    for i in range(0, max(len(data), 1), part_bytes):
        last = i + part_bytes >= len(data)
        yield PartOut(ev.incarnation, ev.version, data[i : i + part_bytes], last)


def _version(entry: tuple[int, bytes]) -> int:
    return entry[0]


def _size(p: Piece) -> int:
    if isinstance(p, InlineOut | PartOut):
        return len(p.data) + 32
    if isinstance(p, ChangesOut):
        return sum(len(c) + 16 for _, c in p.changes)
    return 64


class Cursor:
    """One followed repository on a stream: where it is, nothing else while parked."""

    __slots__ = ("closed", "group", "id", "incarnation", "job", "pending", "repo", "sent", "stream")

    def __init__(
        self, stream: FollowStream, id_: int, repo: str, incarnation: int, after_version: int
    ) -> None:
        self.stream = stream
        self.id = id_
        self.repo = repo
        self.incarnation = incarnation
        self.sent = after_version
        """The last version the follower has (sent, or its own ``after_version``)."""
        self.group: Group | None = None
        self.pending: deque[Piece] | None = None
        """Pieces made and not sent yet (a snapshot's parts, an end)."""
        self.job: asyncio.Task[None] | None = None
        self.closed = False

    def due(self) -> None:
        """The group changed (or a job ended): the stream's sender looks at this cursor."""
        if not self.closed:
            self.stream.mark(self)


class FollowStream:
    """The follows of one ``Ledger.Follow`` call and the order they are served in."""

    def __init__(
        self,
        lc: Lifecycle,
        message_bytes: int = MESSAGE_BYTES,
        part_bytes: int = SNAPSHOT_PART_BYTES,
    ) -> None:
        self.lc = lc
        self.message_bytes = message_bytes
        self.part_bytes = part_bytes
        self.cursors: dict[int, Cursor] = {}
        self._due: dict[Cursor, None] = {}  # an ordered set: served front to back
        self._wake = asyncio.Event()
        self.ended = False

    # -- what the caller sends ----------------------------------------------------------------

    def follow(self, id_: int, repo: str, incarnation: int, after_version: int) -> None:
        """Follow ``repo`` under ``id_`` (again from ``after_version`` if it was followed)."""
        old = self.cursors.pop(id_, None)
        if old is not None:
            self._forget(old)
        c = self.cursors[id_] = Cursor(self, id_, repo, incarnation, after_version)
        self.lc.rt.subscriptions += 1  # each follow counts as a subscription (open, ended)
        self.mark(c)

    def unfollow(self, id_: int) -> None:
        """Send nothing more of ``id_``; an unknown id (ended already) is no error."""
        c = self.cursors.pop(id_, None)
        if c is not None:
            self._forget(c)

    def refuse(self, id_: int, repo: str, err: EnrouteError) -> None:
        """Answer a follow with its end at once (a draining member)."""
        self.follow(id_, repo, 0, 0)
        c = self.cursors[id_]
        c.pending = deque([EndOut(err)])

    def end(self) -> None:
        """The caller closed its side: :meth:`next_batch` answers no more events."""
        self.ended = True
        self._wake.set()

    def close(self) -> None:
        """The call ended: forget every follow (no group keeps a cursor of it)."""
        for c in self.cursors.values():
            self._forget(c)
        self.cursors.clear()

    def _forget(self, c: Cursor) -> None:
        c.closed = True
        self._due.pop(c, None)
        g = c.group
        if g is not None and g.followers is not None:
            g.followers.remove(c.due)
            if not g.followers:
                g.followers = None
        c.group = None
        c.pending = None
        if c.job is not None:
            c.job.cancel()
            c.job = None
        self.lc.rt.subscriptions_ended += 1

    def mark(self, c: Cursor) -> None:
        self._due[c] = None
        self._wake.set()

    # -- what the member sends ----------------------------------------------------------------

    async def next_batch(self) -> list[tuple[int, Piece]]:
        """The next message's events: due cursors in turn until about ``message_bytes``;
        empty once the stream has ended (:meth:`end`)."""
        while not self.ended:
            self._wake.clear()
            out: list[tuple[int, Piece]] = []
            size = 0
            while self._due and size < self.message_bytes:
                c = next(iter(self._due))
                del self._due[c]
                more = False
                for piece in self._advance(c, self.message_bytes - size):
                    if piece is None:
                        more = True
                        continue
                    out.append((c.id, piece))
                    size += _size(piece)
                if more and not c.closed:
                    self._due[c] = None  # to the back of the line: the others go first
            if out:
                return out
            if not self._due:
                await self._wake.wait()
        return []

    def _advance(self, c: Cursor, room: int) -> Iterator[Piece | None]:
        """What ``c`` can send now within about ``room`` bytes; None means it has more.

        Never waits: hosting the group and reading a snapshot run in ``c.job``,
        which marks the cursor due when it is done.
        """
        if c.job is not None or c.closed:
            return
        if c.pending:
            while c.pending and room > 0:
                piece = c.pending.popleft()
                room -= _size(piece)
                yield piece
                if isinstance(piece, EndOut):
                    self._end(c)
                    return
            if c.pending:
                yield None
            return
        g = c.group
        if g is None:
            self._start(c, self._resolve(c))
            return
        if g.dropped:  # a new incarnation here, or the group left this member
            yield EndOut(None)
            self._end(c)
            return
        # the summary only: a parked follow does not wake a hibernated group
        if g.version <= c.sent:
            if g.deleted:
                yield EndOut(None)
                self._end(c)
            return
        history = g.history
        if not history or history[0][0] > c.sent + 1:  # compacted past the follower
            self._start(c, self._snapshot(c, g))
            return
        changes: list[tuple[int, bytes]] = []
        start = bisect.bisect_right(history, c.sent, key=_version)
        for version, change in itertools.islice(history, start, None):
            if changes and room <= 0:
                break
            changes.append((version, change))
            room -= len(change) + 16
        c.sent = changes[-1][0]
        yield ChangesOut(tuple(changes))
        if c.sent < g.version:
            yield None
        elif g.deleted:  # the change that deleted it is the follow's last event
            yield EndOut(None)
            self._end(c)

    def _end(self, c: Cursor) -> None:
        if self.cursors.get(c.id) is c:
            del self.cursors[c.id]
            self._forget(c)

    def _start(self, c: Cursor, work: Coroutine[Any, Any, None]) -> None:
        # no caller's request id in its log lines: the stream is shared by every view
        c.job = asyncio.get_running_loop().create_task(work, context=contextvars.Context())

    async def _resolve(self, c: Cursor) -> None:
        """Host the group (Subscribe's first step) and register the cursor on it."""
        try:
            got = await self.lc._hosted_for_read(c.repo)
            if c.closed:
                return
            if isinstance(got, RepoState):  # deleted and not hosted: its state, the end
                snap = SnapshotOut(got.incarnation, got.version, encode_state(got), ())
                c.pending = deque([*snapshot_pieces(snap, self.part_bytes), EndOut(None)])
                return
            g = got
            incarnation = c.incarnation or g.incarnation  # 0: the current one
            if incarnation > g.incarnation:
                raise NotFound("no such incarnation here", repo=c.repo, incarnation=incarnation)
            c.group = g
            g.followers = [*(g.followers or ()), c.due]
            if c.sent == 0 or incarnation != g.incarnation:
                await self._snapshot(c, g)  # c.job stays set: nothing else starts one
        except EnrouteError as e:
            if not c.closed:
                c.pending = deque([EndOut(e)])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: the follow ends as a call would, the stream stays
            log.exception("follow of %s failed", c.repo)
            if not c.closed:
                c.pending = deque([EndOut(Internal(str(e)))])
        finally:
            c.job = None
            c.due()

    async def _snapshot(self, c: Cursor, g: Group) -> None:
        """The group's snapshot in pieces; the follow goes on from its version."""
        try:
            snap = await self.lc._snapshot(g, g.state)
            if c.closed:
                return
            c.incarnation = snap.incarnation
            c.sent = snap.version
            c.pending = deque(snapshot_pieces(snap, self.part_bytes))
        except EnrouteError as e:
            if not c.closed:
                c.pending = deque([EndOut(e)])
        finally:
            c.job = None
            c.due()
