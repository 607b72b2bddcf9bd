"""Repositories hosted by this compute: views kept current from the ledger.

DESIGN "Processes" and docs/rpc.md, "Compute". Per repository the host keeps
the :class:`RepoState` and a :class:`View` over its layers (inline layers from
the bytes the changes carry, stored layers through the :class:`LayerService`),
fed by a Subscribe to the ledger. Seed 001, "Compute nodes": a change marking
the repository deleted drops the view; a state of another incarnation
replaces it. Reads go through a barrier (DESIGN "Read path"); the Git
protocol and API commits live beside it in ``fetch`` and ``push``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from enroute_compute.ledger_port import (
    Activated,
    ChangeEvent,
    CreateMode,
    LedgerPort,
    SnapshotEvent,
)
from enroute_core.base.clock import Clock
from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    NotFound,
    Unavailable,
)
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, KiB, Limits
from enroute_core.engine.ingest import IngestResult
from enroute_core.engine.view import View
from enroute_core.git.object_type import ObjectType
from enroute_core.git.source import BytesSource
from enroute_core.git.tag import Tag
from enroute_core.protocol._common import Ref, RefSnapshot
from enroute_core.state import (
    MISSING,
    Deleted,
    LayerEntry,
    LayerKind,
    LayersChanged,
    NewLayer,
    RepoState,
    apply_change,
)
from enroute_core.state.names import check_repo_name, layer_key, storage_segment
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.layer.format import layer_key_name
from enroute_core.storage.layers import LayerService

log = logging.getLogger(__name__)

INLINE_LAYER_BYTES_MAX = 512 * KiB
"""Default of ``layers.inline_max``: pushed layers up to this size travel in the log entry."""
DEFAULT_HEAD = b"refs/heads/main"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent read of a repository: its state and the view of that state."""

    name: str
    state: RepoState
    view: View


class _Repo:
    """One hosted repository: state, view and the follower that keeps them current."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state: RepoState = MISSING
        self.view = View(())
        self.readers: dict[bytes, LayerReader] = {}
        self.inline: dict[bytes, bytes] = {}
        self.changed = asyncio.Condition()
        self.dead = False
        self.error: EnrouteError | None = None
        self.task: asyncio.Task[None] | None = None

    def snapshot(self) -> Snapshot:
        return Snapshot(self.name, self.state, self.view)


class RepositoryHost:
    """Every repository this compute serves, by name."""

    def __init__(
        self,
        ledger: LedgerPort,
        layers: LayerService | None,
        clock: Clock,
        *,
        limits: Limits = DEFAULT_LIMITS,
        inline_max_bytes: int = INLINE_LAYER_BYTES_MAX,
        wait_s: float = 30.0,
    ) -> None:
        self.ledger = ledger
        self.layers = layers
        self.clock = clock
        self.limits = limits
        self.inline_max_bytes = inline_max_bytes
        self.wait_s = wait_s
        self._repos: dict[str, _Repo] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self.pushes = 0
        self.fetches = 0

    # -- hosting --------------------------------------------------------------------------

    @property
    def hosted(self) -> tuple[str, ...]:
        return tuple(sorted(self._repos))

    async def open(self, name: str, create: CreateMode = CreateMode.NONE) -> _Repo:
        """The hosted repository, activating and following it first when needed."""
        check_repo_name(name)
        repo = self._repos.get(name)
        if repo is not None and not repo.dead:
            return repo
        lock = self._opening.setdefault(name, asyncio.Lock())
        async with lock:
            repo = self._repos.get(name)
            if repo is not None and not repo.dead:
                return repo
            activated = await self.ledger.activate(name, create, DEFAULT_HEAD)
            return await self._follow(name, activated)

    async def _follow(self, name: str, activated: Activated) -> _Repo:
        if activated.state.deleted:
            raise NotFound(f"repository {name} not found", name=name)
        repo = _Repo(name)
        self._repos[name] = repo
        repo.task = asyncio.create_task(self._run_follower(repo, activated.state.incarnation))
        await self._wait_version(repo, activated.state.version)
        return repo

    def drop(self, name: str) -> None:
        """Forget a repository at once (deleted, or superseded by a new incarnation)."""
        repo = self._repos.pop(name, None)
        if repo is not None:
            repo.dead = True
            if repo.task is not None:
                repo.task.cancel()

    async def close(self) -> None:
        for name in list(self._repos):
            self.drop(name)

    async def _wait_version(self, repo: _Repo, version: int) -> None:
        async def reached() -> None:
            async with repo.changed:
                await repo.changed.wait_for(lambda: repo.dead or repo.state.version >= version)

        try:
            await asyncio.wait_for(reached(), self.wait_s)
        except TimeoutError:
            raise Unavailable(
                f"view of {repo.name} did not reach version {version}", name=repo.name
            ) from None
        if repo.dead:
            raise repo.error or NotFound(f"repository {repo.name} not found", name=repo.name)

    async def _run_follower(self, repo: _Repo, incarnation: int) -> None:
        after = 0
        try:
            while not repo.dead:
                async for event in self.ledger.subscribe(repo.name, incarnation, after):
                    if isinstance(event, SnapshotEvent):
                        repo.inline.update(event.inline)
                        await self._set_state(repo, event.state, rebuild=True)
                    elif isinstance(event, ChangeEvent):
                        await self._apply(repo, event)
                    after = repo.state.version
                    if repo.state.deleted:
                        self._end(repo, NotFound(f"repository {repo.name} was deleted"))
                        return
                await asyncio.sleep(0.05)  # the stream ended: follow again from here
        except asyncio.CancelledError:
            raise
        except EnrouteError as exc:
            self._end(repo, exc)
        except Exception as exc:  # a follower must never die silently
            log.exception("follower of %s failed", repo.name)
            self._end(repo, CorruptData(f"following {repo.name} failed: {exc}", section="view"))

    def _end(self, repo: _Repo, error: EnrouteError) -> None:
        repo.dead = True
        repo.error = error
        if self._repos.get(repo.name) is repo:
            del self._repos[repo.name]
        asyncio.get_running_loop().create_task(self._notify(repo))

    @staticmethod
    async def _notify(repo: _Repo) -> None:
        async with repo.changed:
            repo.changed.notify_all()

    async def _apply(self, repo: _Repo, event: ChangeEvent) -> None:
        rebuild = False
        for effect in event.change.effects:
            if isinstance(effect, LayersChanged):
                rebuild = True
                for entry, data in zip(effect.added, effect.added_data, strict=True):
                    if entry.kind is LayerKind.INLINE:
                        repo.inline[entry.root] = data
            if isinstance(effect, Deleted):
                rebuild = False
        state = apply_change(repo.state, event.change.effects, version=event.version)
        await self._set_state(repo, state, rebuild=rebuild)

    async def _set_state(self, repo: _Repo, state: RepoState, *, rebuild: bool) -> None:
        if rebuild and state.live:
            pairs = [(e, await self._reader(repo, e)) for e in state.manifest]
            view = await asyncio.to_thread(View, pairs, limits=self.limits)
            keep = {e.root for e in state.manifest}
            repo.readers = {k: v for k, v in repo.readers.items() if k in keep}
            repo.inline = {k: v for k, v in repo.inline.items() if k in keep}
            repo.view = view
        elif not state.live:
            repo.view = View(())
        repo.state = state
        async with repo.changed:
            repo.changed.notify_all()

    async def _reader(self, repo: _Repo, entry: LayerEntry) -> LayerReader:
        reader = repo.readers.get(entry.root)
        if reader is not None:
            return reader
        if entry.kind is LayerKind.INLINE:
            data = repo.inline.get(entry.root)
            if data is None:
                raise CorruptData(
                    f"bytes of inline layer {entry.root.hex()[:16]} are not known here",
                    section="view",
                )
            reader = LayerReader.open(
                BytesSource(data), meta_size=entry.meta_size, limits=self.limits
            )
        else:
            if self.layers is None or entry.key is None:
                raise Unavailable("no layer storage configured for stored layers")
            key = layer_key(repo.name, entry.key)
            opened = await self.layers.open_layer(
                storage_segment(repo.name), key, entry.file_size, entry.meta_size
            )
            data_end = entry.file_size - entry.meta_size
            pins = await self.layers.load(opened, ranges=[(0, data_end)] if data_end else [])
            pins.release()
            reader = opened.reader
        repo.readers[entry.root] = reader
        return reader

    async def read(self, name: str) -> Snapshot:
        """A snapshot after a read barrier (DESIGN "Read path")."""
        repo = await self.open(name)
        point = await self.ledger.barrier(name)
        if point.deleted:
            self.drop(name)
            raise NotFound(f"repository {name} not found", name=name)
        if point.incarnation != repo.state.incarnation:
            self.drop(name)
            repo = await self.open(name)
        await self._wait_version(repo, point.version)
        return repo.snapshot()

    async def read_or_empty(self, name: str) -> Snapshot | None:
        try:
            return await self.read(name)
        except NotFound:
            return None

    async def wait_applied(self, name: str, version: int) -> None:
        repo = self._repos.get(name)
        if repo is not None:
            with contextlib.suppress(EnrouteError):
                await self._wait_version(repo, version)

    async def store_layer(self, name: str, snap: Snapshot, result: IngestResult) -> NewLayer | None:
        """The new layer of a push or API commit: inline when small, else published.

        DESIGN "Repository state": a stored layer is named with the state's
        ``upload_gen`` so the ledger accepts it only inside the upload window.
        """
        sealed = result.sealed
        if sealed is None:
            return None
        assert result.data is not None
        if sealed.file_size <= self.inline_max_bytes or self.layers is None:
            repo = self._repos.get(name)
            if repo is not None:
                repo.inline[sealed.root] = result.data
            return result.new_layer(inline=True)
        gen = snap.state.upload_gen
        key = layer_key(name, layer_key_name(gen, sealed.root))
        await self.layers.publish(storage_segment(name), key, result.data)
        return result.new_layer(inline=False, upload_gen=gen)

    # -- refs -----------------------------------------------------------------------------

    def ref_snapshot(self, snap: Snapshot | None) -> RefSnapshot:
        if snap is None or not snap.state.live:
            return RefSnapshot((), None)
        refs = tuple(
            Ref(name, value.oid, _peel(snap.view, value.oid))
            for name, value in sorted(snap.state.refs.items())
        )
        return RefSnapshot(refs, snap.state.head or None)


def _peel(view: View, oid: ObjectId) -> ObjectId | None:
    """What an annotated tag finally names (None for anything else)."""
    found = view.read(oid)
    if found is None or found[0] is not ObjectType.TAG:
        return None
    target = oid
    for _ in range(64):
        found = view.read(target)
        if found is None or found[0] is not ObjectType.TAG:
            return target
        target = Tag.parse(found[1]).object
    return target
