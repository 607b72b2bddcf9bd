"""An in-process :class:`~enroute_compute.ledger_port.LedgerPort`: a TEST SEAM.

It applies commands with the real ``enroute_core.state.apply`` and keeps every
repository's state and the changes of its current incarnation in memory, with
no Raft, no disk and no object store. It exists so that the compute's push and
fetch paths can be tested without a ledger process; the contract tests run the
same cases against the gRPC client and a real ledger when one is available.
Nothing here is replicated or durable, so it lives in the test kit, which no
production module may import (the import contracts, pyproject.toml).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType

from enroute_compute.ledger_port import (
    Activated,
    BarrierPoint,
    ChangeEvent,
    CreateMode,
    FollowEvent,
    ListPage,
    Proposed,
    RepoSummary,
    SnapshotEvent,
)
from enroute_core.base.errors import CorruptData, IncarnationEnded, InvalidArgument, NotFound
from enroute_core.state import (
    DEFAULT_UPLOAD_WINDOW,
    MISSING,
    Activate,
    Change,
    Command,
    Delete,
    Deleted,
    LayerKind,
    RepoState,
    added_layers,
    apply,
)
from enroute_core.state.names import check_repo_name

LIST_LIMIT_MAX = 1000


def summary_of(name: str, state: RepoState) -> RepoSummary:
    return RepoSummary(
        name=name,
        incarnation=state.incarnation,
        version=state.version,
        deleted=state.deleted,
        head=state.head,
        head_kept=state.head_kept,
        last_push_us=state.last_push_us,
    )


class _Repo:
    __slots__ = ("changes", "pinned", "state")

    def __init__(self) -> None:
        self.state: RepoState = MISSING
        self.changes: list[tuple[int, Change]] = []  # of the current incarnation
        self.pinned: dict[int, Command] = {}  # log index -> command, for the manifest's pins

    def inline_layers(self) -> Mapping[bytes, bytes]:
        """(root -> file) of the manifest's inline layers, read at their pins as the ledger does."""
        out: dict[bytes, bytes] = {}
        for entry in self.state.manifest:
            if entry.kind is not LayerKind.INLINE:
                continue
            out[entry.root] = _inline_layer_of(self.pinned.get(entry.pin), entry.root)
        return MappingProxyType(out)


def _inline_layer_of(command: Command | None, root: bytes) -> bytes:
    for layer in added_layers(command):
        if layer.kind is LayerKind.INLINE and layer.root == root:
            return layer.data
    raise CorruptData(f"no pinned entry holds inline layer {root.hex()[:16]}", section="view")


DEDUP_WINDOW = 4096
"""Request ids remembered (the ledger keeps its last ``dedup_window_entries``)."""


class LocalLedger:
    """Test seam: see the module docstring."""

    def __init__(self, *, upload_window: int = DEFAULT_UPLOAD_WINDOW) -> None:
        self._repos: dict[str, _Repo] = {}
        self._window = upload_window
        self._log_index = 0
        self._changed = asyncio.Condition()
        self.proposals = 0
        # request id -> first answer, as the ledger's dedup window (docs/raft.md,
        # "Applying each id once"); bounded like it
        self.done: dict[bytes, Proposed] = {}

    def _repo(self, name: str) -> _Repo:
        check_repo_name(name)
        return self._repos.setdefault(name, _Repo())

    async def _apply(self, name: str, repo: _Repo, command: Command) -> Proposed:
        self._log_index += 1
        result = apply(repo.state, command, log_index=self._log_index)
        if result.state.incarnation != repo.state.incarnation:
            repo.changes = []
        repo.state = result.state
        repo.pinned[self._log_index] = command
        pins = set(result.state.pins())
        repo.pinned = {i: c for i, c in repo.pinned.items() if i in pins}
        change = result.change
        repo.changes.append((result.state.version, change))
        async with self._changed:
            self._changed.notify_all()
        return Proposed(result.state.version, change)

    async def activate(self, name: str, create: CreateMode, head: bytes) -> Activated:
        repo = self._repo(name)
        if repo.state.live:
            return Activated(summary_of(name, repo.state), False)
        if create is CreateMode.NONE:
            raise NotFound(f"repository {name} not found", name=name)
        command = Activate(
            create=True,
            head=head if create is CreateMode.EXPLICIT else None,
            upload_window=self._window,
        )
        done = await self._apply(name, repo, command)
        error = done.change.outcome.error()
        if error is not None:
            raise error
        return Activated(summary_of(name, repo.state), True)

    async def describe(self, name: str) -> RepoSummary:
        repo = self._repo(name)
        if not repo.state.exists:
            raise NotFound(f"repository {name} not found", name=name)
        return summary_of(name, repo.state)

    async def list(self, start_after: str, limit: int) -> list[ListPage]:
        if limit < 0:
            raise InvalidArgument("limit must not be negative")
        limit = min(limit or 100, LIST_LIMIT_MAX)
        names = sorted(
            (n for n, r in self._repos.items() if r.state.exists and n > start_after),
            key=lambda n: n.encode(),
        )
        page = tuple(summary_of(n, self._repos[n].state) for n in names[:limit])
        return [ListPage(page, len(names) > limit)]

    async def delete(self, name: str) -> RepoSummary | None:
        repo = self._repo(name)
        if not repo.state.exists:
            return None
        if repo.state.live:
            await self._apply(name, repo, Delete(repo.state.incarnation))
        return summary_of(name, repo.state)

    async def propose(
        self, name: str, incarnation: int, command: Command, request_id: bytes = b""
    ) -> Proposed:
        first = self.done.get(request_id) if request_id else None
        if first is not None:
            return first
        got = await self._propose(name, incarnation, command)
        if request_id:
            self.done[request_id] = got
            while len(self.done) > DEDUP_WINDOW:
                del self.done[next(iter(self.done))]
        return got

    async def _propose(self, name: str, incarnation: int, command: Command) -> Proposed:
        repo = self._repo(name)
        if not repo.state.exists:
            raise NotFound(f"repository {name} not found", name=name)
        if repo.state.deleted or repo.state.incarnation != incarnation:
            reason = "deleted" if repo.state.deleted else "not this incarnation"
            raise IncarnationEnded(f"incarnation {incarnation} of {name} ended", reason=reason)
        return await self._apply(name, repo, command)

    async def subscribe(
        self, name: str, incarnation: int, after_version: int
    ) -> AsyncIterator[FollowEvent]:
        repo = self._repo(name)
        if not repo.state.exists:
            raise NotFound(f"repository {name} not found", name=name)
        following = repo.state.incarnation
        if incarnation not in (0, following) or after_version == 0:
            # As the ledger: the current checkpoint plus its inline layers' bytes.
            state = repo.state
            yield SnapshotEvent(state, repo.inline_layers())
            after_version = state.version
            if state.deleted:
                return
        while True:
            if repo.state.incarnation != following:
                return  # superseded: the follower follows again
            for version, change in list(repo.changes):
                if version <= after_version:
                    continue
                yield ChangeEvent(version, change)
                after_version = version
                if any(isinstance(e, Deleted) for e in change.effects):
                    return
            async with self._changed:
                if repo.changes and repo.changes[-1][0] > after_version:
                    continue
                await self._changed.wait()

    async def barrier(self, name: str) -> BarrierPoint:
        repo = self._repo(name)
        if not repo.state.exists:
            raise NotFound(f"repository {name} not found", name=name)
        s = repo.state
        return BarrierPoint(s.incarnation, s.version, s.deleted)

    async def close(self) -> None:
        return None
