"""Repositories hosted by this compute: views kept current from the ledger.

DESIGN "Processes" and docs/rpc.md, "Compute". Per repository the host keeps
the :class:`RepoState` and a :class:`View` over its layers (inline layers from
the bytes the changes carry, stored layers through the :class:`LayerService`),
fed by a Subscribe to the ledger. Seed 001, "Compute nodes": a change marking
the repository deleted drops the view; a state of another incarnation
replaces it. Reads go through a barrier (DESIGN "Read path"); the Git
protocol and API commits live beside it in ``fetch`` and ``push``.

Views are a cache (issue 19, docs/fleet.md): a view unused for
``limits.view_idle_ms_max`` is evicted and its subscription ended, and so are the
least recently used while more than ``limits.views_open_max`` are open or their
bytes pass ``limits.views_bytes_max``. The next request opens the view again: an
Activate, then a follow from version 0, whose snapshot is the current state. Every
view follows its repository on the one Follow call its compute keeps to a member
(docs/rpc.md, Follow): eviction sends Unfollow, and no gRPC call is opened or
cancelled per view.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import TypeVar, cast

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
    InvalidArgument,
    NotFound,
    NotLocal,
    Timeout,
    Unavailable,
)
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, KiB, Limits, check_limit
from enroute_core.engine.cancel import abandoned_when
from enroute_core.engine.ingest import IngestResult
from enroute_core.engine.snapshot import SnapshotObjects
from enroute_core.engine.view import View
from enroute_core.git.fsck import RECEIVE_POLICY, FsckPolicy
from enroute_core.git.object_type import ObjectType
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
from enroute_core.state.refmap import RefMap
from enroute_core.storage.budgeted import LoadPins
from enroute_core.storage.heap import release_free_heap
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.layer.format import layer_key_name
from enroute_core.storage.layers import LOAD_KIND, LayerService, open_inline
from enroute_core.storage.localfile import ScratchFile
from enroute_core.storage.machines import Restartable, Ticket, drive, ticket_of
from enroute_core.storage.pool import BufferPool, NodeCaches

log = logging.getLogger(__name__)
REQUEST_ID: contextvars.ContextVar[bytes] = contextvars.ContextVar("request_id", default=b"")
"""The id of the Git request being served (set by the servicer): failures log it."""
_T = TypeVar("_T")

INLINE_LAYER_BYTES_MAX = 512 * KiB
"""Default of ``layers.inline_max``: pushed layers up to this size travel in the log entry."""
DEFAULT_HEAD = b"refs/heads/main"
FOLLOW_RETRIES_MAX = 40
"""Subscriptions in a row that may fail (unavailable, timeout) before a view is dropped."""
FOLLOW_BACKOFF_S = 0.05
FOLLOW_BACKOFF_MAX_S = 2.0
FIRST_BYTE_SAMPLES = 256
"""Fetches whose time to the first pack byte ``/status`` summarizes."""
VIEW_FIXED_BYTES = 24 * KiB
"""What a view costs beyond its layers' metadata and inline bytes, charged against
``views_bytes_max``: its state, follower task and subscription stream (docs/fleet.md:
about 23 KiB per followed repository measured on a compute before eviction)."""
EVICTION_PERIOD_S_MAX = 10.0
"""Longest wait between two looks for idle views (a tenth of the idle time when shorter)."""
READ_REOPENS_MAX = 3
"""Times a read opens a view again that was evicted while it waited (then Unavailable)."""
MEMORY_RELEASE_PERIOD_S = 60.0
"""Longest an evicting compute keeps the free memory of its C allocator before giving
it back to the system (at once when the last view goes): ``release_free_heap``."""
INGEST_OBJECT_BYTES = 1024
"""What an ingest holds per pack object, as its budget counts it (docs/ingest.md, "Memory")."""
VIEW_OBJECT_BYTES = 128
"""What building the view of a new layer leaves free in the C heap per layer object (the
commit section's columns read whole; over older layers, the ref-by-ref graph's lists),
for :meth:`RepositoryHost.release_after`'s threshold. The view of the `large` profile's
504,433-object push holds about 6 MiB; building it took 12 MiB more in one process (58
MiB with the graph mapped in Python), and the compute gave 9-20 MiB back after it
(issue 25)."""
PLAN_OBJECT_BYTES = 256
"""What a fetch holds per planned object while it plans and writes (a walk's oids met, the
pack writer's offsets), for :meth:`RepositoryHost.release_after_fetch`'s threshold: a
fetch of 128 Ki objects or more (``heap_trim_threshold_bytes``, 32 MiB) is followed by a
collection and a trim."""


class _Evicted(Unavailable):
    """The view a caller waited on was evicted meanwhile: open it again."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent read of a repository: its state and the view of that state."""

    name: str
    state: RepoState
    view: View


class _Repo:
    """One hosted repository: state, view and the follower that keeps them current."""

    def __init__(self, name: str, caches: NodeCaches) -> None:
        self.name = name
        self.state: RepoState = MISSING
        self.view = View((), caches=caches)
        self.readers: dict[bytes, LayerReader] = {}
        self.inline: dict[bytes, bytes] = {}
        self.peeled: tuple[RefMap, dict[int, tuple[Ref, ...]]] | None = None
        """The refs of the last ref snapshot, per leaf (``RepositoryHost.ref_snapshot``)."""
        self.changed = asyncio.Condition()
        self.dead = False
        self.evicted = False
        self.error: EnrouteError | None = None
        self.task: asyncio.Task[None] | None = None
        self.waiters = 0
        """Callers waiting for a state of this view: it is not evicted under them."""
        self.bytes = VIEW_FIXED_BYTES
        """What the view is charged against ``views_bytes_max``."""

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
        fsck: FsckPolicy = RECEIVE_POLICY,
        inline_max_bytes: int = INLINE_LAYER_BYTES_MAX,
        wait_s: float = 30.0,
        caches: NodeCaches | None = None,
    ) -> None:
        self.ledger = ledger
        self.layers = layers
        if caches is None:  # sized as a view's own caches, charged to the node's pool
            pool = layers.pool if layers is not None else BufferPool()
            caches = NodeCaches(pool, limits.view_body_cache_bytes_max)
        self.caches = caches
        """The node's object and entry caches (``node.cache``), shared by every view."""
        self.clock = clock
        self.limits = limits
        self.fsck = fsck
        """What pushed objects are checked with (``receive.fsck`` in the configuration)."""
        self.inline_max_bytes = inline_max_bytes
        self.wait_s = wait_s
        self._repos: dict[str, _Repo] = {}
        """Hosted views, least recently used first (a use moves one to the end)."""
        self._used_us: dict[str, int] = {}
        """When each hosted view was last used (clock us)."""
        self._in_use: Counter[str] = Counter()
        """Reads and pushes in flight per repository (:meth:`pin_reads`): never evicted."""
        self.view_bytes = 0
        """Bytes of the hosted views, as charged against ``views_bytes_max``."""
        self.evictions = 0
        """Views evicted (idle, or over the count or byte budget) since start."""
        self.reopens = 0
        """Views opened again after an eviction (each paid a subscribe and a state fetch)."""
        self._evicted_names: dict[str, None] = {}
        """Names evicted lately (bounded by ``views_open_max``): a later open is a re-open."""
        self._evictor: asyncio.Task[None] | None = None
        self._evicted_since_release = False
        self._released_at_s = 0.0
        self._releasing: asyncio.Task[None] | None = None
        self._release_next: str | None = None
        """What asked for a release while one ran: it runs once more after (the next one
        would otherwise miss what was freed after the running one's trim)."""
        self.memory_released_bytes = 0
        """Resident bytes given back to the system after evictions and large pushes
        (``release_free_heap``)."""
        self._opening: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._start_counters()
        self._retired: dict[tuple[str, str], int] = {}
        """Stored layers that left a manifest here: (segment, key) -> when (clock us)."""
        self._read_pins: Counter[tuple[str, str]] = Counter()
        """Reads in flight per stored layer: a pinned layer's local copy stays."""
        self._closing: dict[tuple[str, str], str] = {}
        """Stored layers of evicted views that reads still pinned when their view went:
        (segment, key) -> repository, closed once the last pin goes (:meth:`_close_layers`)."""
        self._swept_leftovers: set[str] = set()
        """Repositories whose copies left by a previous run were looked for once."""
        self.state_listeners: list[Callable[[str], None]] = []
        """Told a repository's name each time its view takes a new state (the
        maintainer visits only repositories that changed: issue 19)."""
        self.unhost_listeners: list[Callable[[str], None]] = []
        """Told a repository's name when its view goes (evicted, deleted, replaced, ended):
        what others keep per view (the fetch path's ref snapshots and plans, by state)
        goes with it, so an evicted repository leaves nothing (issue 19)."""

    def _start_counters(self) -> None:
        """What ``/status`` and the metrics count for this host, all from zero."""
        self.pushes = 0
        self.fetches = 0
        self.view_builds = 0
        """Views built whole (a snapshot: opening a repository, a new incarnation)."""
        self.view_updates = 0
        """Changes that updated a view in place (layers appended or a stretch swapped)."""
        self.reference_indexes = 0
        """Pushes whose pack the Python indexer read because the compiled pass gave up."""
        self.refs_peeled = 0
        """Refs whose object a ref snapshot read to peel it (one leaf of the ref map per
        ref a push changed, not every ref: ``ref_snapshot``)."""
        self.fsck_warnings: Counter[str] = Counter()
        """Objects pushes brought with a harmless fsck problem, by message id (let in)."""
        self.local_copies_deleted = 0
        self.local_copy_bytes_deleted = 0
        self.load_rounds: Counter[str] = Counter()
        """Tickets parked by reads that needed loads (seed 004, "Machines"), by request kind."""
        self.first_pack_byte_s: deque[float] = deque(maxlen=FIRST_BYTE_SAMPLES)
        """Seconds from the start of a pack to its first bytes, the latest fetches."""
        self.first_pack_byte_loaded_bytes = 0
        """Bytes loaded between the start of the latest pack and its first bytes (all
        loads of the node meanwhile: exact when that fetch ran alone)."""

    # -- hosting --------------------------------------------------------------------------

    @property
    def hosted(self) -> tuple[str, ...]:
        return tuple(sorted(self._repos))

    async def open(
        self, name: str, create: CreateMode = CreateMode.NONE, *, use: bool = True
    ) -> _Repo:
        """The hosted repository, activating and following it first when needed.

        ``use=False`` (layer maintenance) leaves an open view where it is in the
        least-recently-used order: background work does not keep an idle view open.
        """
        check_repo_name(name)
        repo = self._repos.get(name)
        if repo is not None and not repo.dead:
            if use:
                self._touch(repo)
            if repo.state is MISSING:  # another caller is still loading it: its first state
                loading = repo
                await self._wait_until(
                    loading, lambda: loading.state is not MISSING, "its first state"
                )
            return repo
        # one lock per name being opened (not per name ever opened): counted by its users
        entry = self._opening.setdefault(name, (asyncio.Lock(), [0]))
        entry[1][0] += 1
        try:
            async with entry[0]:
                repo = self._repos.get(name)
                if repo is not None and not repo.dead:
                    self._touch(repo)
                    return repo
                activated = await self.ledger.activate(name, create, DEFAULT_HEAD)
                repo = await self._follow(name, activated)
        finally:
            entry[1][0] -= 1
            if entry[1][0] == 0:
                del self._opening[name]
        if name in self._evicted_names:
            del self._evicted_names[name]
            self.reopens += 1
        self._start_evictor()
        self.evict(self.clock.now_us(), keep=repo)
        return repo

    async def _follow(self, name: str, activated: Activated) -> _Repo:
        if activated.state.deleted:
            raise NotFound(f"repository {name} not found", name=name)
        repo = _Repo(name, self.caches)
        self._repos[name] = repo
        self._used_us[name] = self.clock.now_us()
        self.view_bytes += repo.bytes
        # a context of its own: the follower outlives the request that opened the view, and
        # its log lines must not carry that request's id (enroute_proto.logs)
        repo.task = asyncio.create_task(
            self._run_follower(repo, activated.state.incarnation), context=contextvars.Context()
        )
        await self._wait_version(repo, activated.state.version)
        return repo

    def drop(self, name: str) -> None:
        """Forget a repository at once (deleted, or superseded by a new incarnation).

        Seed 001, "Compute nodes": the compute that asked for a deletion drops its view
        at once. Waiters on the view are woken so they answer not found now.
        """
        repo = self._repos.get(name)
        if repo is not None:
            self._unhost(repo)
            repo.dead = True
            self._retire(repo.name, repo.state, MISSING)
            if repo.task is not None:
                repo.task.cancel()
            with contextlib.suppress(RuntimeError):  # no running loop: nobody can wait
                asyncio.get_running_loop().create_task(self._notify(repo))

    def _unhost(self, repo: _Repo) -> None:
        """Take ``repo`` out of the hosted views (and their byte count). A later open
        looks for copies left behind again, so that set holds hosted names only."""
        if self._repos.get(repo.name) is repo:
            del self._repos[repo.name]
            del self._used_us[repo.name]
            self.view_bytes -= repo.bytes
            self._swept_leftovers.discard(repo.name)
            repo.view.forget_cached()  # its scope's cache entries would never be hit again
            for listener in self.unhost_listeners:
                listener(repo.name)

    def _touch(self, repo: _Repo) -> None:
        """A use of ``repo``'s view: it becomes the most recently used."""
        if self._repos.get(repo.name) is repo:
            del self._repos[repo.name], self._used_us[repo.name]
            self._repos[repo.name] = repo
            self._used_us[repo.name] = self.clock.now_us()

    # -- the view cache (issue 19) ----------------------------------------------------------

    def evict(self, now_us: int, *, keep: _Repo | None = None) -> int:
        """Evict idle views and, over a budget, the least recently used; answers how many.

        A view is kept while a caller waits on it, a read or push uses it (its pins), its
        first state is still loading, or it is ``keep`` (just opened for a caller); such a
        view counts as used now. Eviction ends
        the follower, and with it the follow: the compute sends Unfollow on its Follow
        call to the member, which forgets the cursor (docs/rpc.md, Follow) and whose
        group hibernates with nobody following it (docs/raft.md, "Parked
        subscriptions"). Its stored layers are closed in the layer service
        (:meth:`_close_layers`) but not retired: their local copies stay on disk for the
        next open, which loads their metadata only.
        """
        limits = self.limits
        idle_us = limits.view_idle_ms_max * 1000
        evicted = 0
        for item in [k for k in self._closing if self._read_pins.get(k, 0) <= 0]:
            self._close_layers(self._closing[item], [item])  # were being opened: again
        for _ in range(len(self._repos)):  # each view looked at once at most
            name = next(iter(self._repos), None)
            if name is None:
                break
            repo = self._repos[name]
            over = len(self._repos) > limits.views_open_max or (
                self.view_bytes > limits.views_bytes_max
            )
            if not over and now_us - self._used_us[name] < idle_us:
                break  # the rest were used later still
            if repo is keep or repo.waiters or self._in_use[name] or repo.state is MISSING:
                self._touch(repo)  # busy: counts as used now
                continue
            self._evict(repo)
            evicted += 1
        if evicted:
            log.info(
                "evicted %d views (%d open, %d bytes; views_open_max %d, views_bytes_max %d, "
                "view_idle_ms_max %d)",
                evicted,
                len(self._repos),
                self.view_bytes,
                limits.views_open_max,
                limits.views_bytes_max,
                limits.view_idle_ms_max,
            )
        return evicted

    def _evict(self, repo: _Repo) -> None:
        self._unhost(repo)
        repo.dead = repo.evicted = True
        self.evictions += 1
        self._evicted_names[repo.name] = None
        if len(self._evicted_names) > self.limits.views_open_max:
            del self._evicted_names[next(iter(self._evicted_names))]
        if repo.task is not None:
            repo.task.cancel()  # sends Unfollow (FollowMux.follow's finally), no call cancelled
        self._close_layers(repo.name, _stored_keys(repo.name, repo.state))
        asyncio.get_running_loop().create_task(self._notify(repo))

    def _close_layers(self, name: str, keys: Iterable[tuple[str, str]]) -> None:
        """Close the stored layers ``keys`` of ``name`` in the layer service, now or once
        the last read pinning one lets go; never while a view of ``name`` is hosted
        (a re-opened view shares them).

        An evicted view must leave nothing behind (issue 19, docs/fleet.md): the layer
        service keeps every layer it opened (seed 004, "Files and tiers") with its
        metadata in memory ("Metadata is always local"). A read or push that still
        uses the evicted view holds read pins on its layers (:meth:`pin_reads`), so a
        pinned layer is closed when its last pin goes instead; a re-open opens it again
        from its local copy, loading its metadata only.
        """
        if self.layers is None:
            return
        for item in dict.fromkeys(keys):
            if name in self._repos:
                self._closing.pop(item, None)  # hosted again: the new view uses it
            elif self._read_pins.get(item, 0) > 0 or not self.layers.close_layer(*item):
                self._closing[item] = name  # read, or being opened: later
            else:
                self._closing.pop(item, None)

    def _start_evictor(self) -> None:
        if self._evictor is None or self._evictor.done():
            self._evictor = asyncio.get_running_loop().create_task(
                self._evict_idle(), context=contextvars.Context()
            )

    async def _evict_idle(self) -> None:
        """Look for idle views every tenth of the idle time (at most
        ``EVICTION_PERIOD_S_MAX``) while any view is open: an idle fleet sends no
        request that would look for them."""
        period_s = min(self.limits.view_idle_ms_max / 10_000, EVICTION_PERIOD_S_MAX)
        loop = asyncio.get_running_loop()
        while self._repos:
            await asyncio.sleep(max(period_s, 0.01))
            try:
                if self.evict(self.clock.now_us()):
                    self._evicted_since_release = True
            except Exception:  # the loop must outlive any one failure
                log.exception("view eviction failed")
            if self._evicted_since_release and (
                not self._repos or loop.time() - self._released_at_s >= MEMORY_RELEASE_PERIOD_S
            ):
                self._evicted_since_release = False
                self._released_at_s = loop.time()
                await self._release_memory()

    def release_after_ingest(self, object_count: int) -> None:
        """Give a large ingest's memory back once it is freed (issue 25): the walk's dicts,
        the oid index and the layer writer's tables, about ``INGEST_OBJECT_BYTES`` an
        object, go when the ingest returns, after its own last trim, and its Python
        objects' arenas and the C heap's holes stayed in the compute's resident set (about
        150 MiB after the `large` profile's 504,433-object push) into the peak of the next
        request. Scheduled while the push's commit goes to the ledger, after the ingest's
        frames are gone (:meth:`release_after`)."""
        self.release_after("a push", object_count * INGEST_OBJECT_BYTES)

    def release_after_fetch(self, object_count: int) -> None:
        """The same after a large fetch, once its pack is written: its plan's walk (the
        oids it met, a set of bytes per tree entry) and the pack writer's offsets and
        pieces, about ``PLAN_OBJECT_BYTES`` a planned object, stayed in the compute's
        resident set after a depth-1 clone of the `large` profile (issue 25)."""
        self.release_after("a fetch", object_count * PLAN_OBJECT_BYTES)

    def release_after(self, what: str, held_bytes: int) -> None:
        """Collect and give the free heap back after a large piece of work that held about
        ``held_bytes`` (:meth:`_release_memory`, logged with ``what``). Scheduled, not
        awaited, and at most one at a time: asked while one runs, one more follows it;
        work smaller than what the allocator keeps free anyway
        (``heap_trim_threshold_bytes``) skips it."""
        if held_bytes < self.limits.heap_trim_threshold_bytes:
            return
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.get_running_loop().create_task(
                self._releases(what), context=contextvars.Context()
            )
        else:
            self._release_next = what

    async def _releases(self, what: str | None) -> None:
        while what is not None:
            await self._release_memory(what)
            what, self._release_next = self._release_next, None

    async def _release_memory(self, after: str = "evictions") -> None:
        """Give the allocator's free memory back once views went (issue 19), or after a
        large push or fetch (:meth:`release_after`).

        What the evicted views and the requests that used them allocated is free now,
        but the C allocator keeps freed pages inside its heaps: how much it keeps
        depends on where the last large block lay, so an idle compute held several MiB
        more or less from one hour to the next, more than its idle repositories cost
        (docs/fleet.md, "Measuring"). Released when the last view goes, and at most every
        ``MEMORY_RELEASE_PERIOD_S`` while views are being evicted; a full collection
        first (tens of milliseconds at that rate).
        """
        # Garbage in reference cycles first (a cancelled follower's task, its exception and
        # frames): an idle process allocates nothing, so the collector would not run.
        gc.collect()
        freed = await asyncio.to_thread(release_free_heap)
        if freed is None:
            return
        self.memory_released_bytes += freed
        log.info(
            "gave %d KiB of free memory back to the system after %s (%d views open)",
            freed // 1024,
            after,
            len(self._repos),
        )

    async def close(self) -> None:
        if self._evictor is not None:
            self._evictor.cancel()
        if self._releasing is not None:
            await asyncio.gather(self._releasing, return_exceptions=True)
        tasks = [r.task for r in self._repos.values() if r.task is not None]
        for name in list(self._repos):
            self.drop(name)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait_version(self, repo: _Repo, version: int) -> None:
        await self._wait_until(repo, lambda: repo.state.version >= version, f"version {version}")

    async def _wait_until(self, repo: _Repo, done: Callable[[], bool], what: str) -> None:
        """Until ``done()`` holds for the view, or it is dropped (NotFound or its error)."""

        if not (repo.dead or done()):  # a view already there (most reads) waits for nothing
            repo.waiters += 1
            try:
                async with asyncio.timeout(self.wait_s), repo.changed:
                    await repo.changed.wait_for(lambda: repo.dead or done())
            except TimeoutError:
                raise Unavailable(
                    f"view of {repo.name} did not reach {what}", name=repo.name
                ) from None
            finally:
                repo.waiters -= 1
        if repo.evicted:
            raise _Evicted(f"view of {repo.name} was evicted", name=repo.name)
        if repo.dead:
            raise repo.error or NotFound(f"repository {repo.name} not found", name=repo.name)

    async def _run_follower(self, repo: _Repo, incarnation: int) -> None:
        """Keep ``repo`` current until it is deleted (seed 001, "Compute nodes").

        1. The change (or snapshot) marking the repository deleted ends following and
           drops the view; later requests activate the name again.
        2. A stream that ends without it (the member restarting, or E dropped there)
           is followed again from the last applied version, after a short backoff;
           ``FOLLOW_RETRIES_MAX`` failed calls in a row end following instead.
        3. A snapshot of another incarnation replaces the view: nothing of the old
           incarnation (layer readers, inline bytes) is kept for the new one. A
           snapshot older than the view (a lagging member) is ignored.
        """
        failures = 0
        try:
            while not repo.dead:
                try:
                    async for event in self.ledger.subscribe(
                        repo.name, incarnation, repo.state.version
                    ):
                        if isinstance(event, SnapshotEvent):
                            if event.state.version < repo.state.version:
                                continue
                            if repo.state.exists and (
                                event.state.incarnation != repo.state.incarnation
                            ):
                                repo.readers, repo.inline = {}, {}
                            repo.inline.update(event.inline)
                            await self._set_state(repo, event.state, rebuild=True)
                        elif isinstance(event, ChangeEvent):
                            await self._apply(repo, event)
                        failures = 0
                        incarnation = repo.state.incarnation
                        if repo.state.deleted:
                            self._end(repo, NotFound(f"repository {repo.name} was deleted"))
                            return
                except (Unavailable, Timeout):
                    failures += 1
                    if failures > FOLLOW_RETRIES_MAX:
                        raise
                await asyncio.sleep(min(FOLLOW_BACKOFF_S * 2**failures, FOLLOW_BACKOFF_MAX_S))
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
        self._retire(repo.name, repo.state, MISSING)
        self._unhost(repo)
        asyncio.get_running_loop().create_task(self._notify(repo))

    @staticmethod
    async def _notify(repo: _Repo) -> None:
        async with repo.changed:
            repo.changed.notify_all()

    async def _apply(self, repo: _Repo, event: ChangeEvent) -> None:
        changes: list[LayersChanged] = []
        for effect in event.change.effects:
            if isinstance(effect, LayersChanged):
                changes.append(effect)
                for entry, data in zip(effect.added, effect.added_data, strict=True):
                    if entry.kind is LayerKind.INLINE:
                        repo.inline[entry.root] = data
            if isinstance(effect, Deleted):
                changes = []
        state = apply_change(repo.state, event.change.effects, version=event.version)
        await self._set_state(repo, state, rebuild=False, changes=changes)

    async def _set_state(
        self,
        repo: _Repo,
        state: RepoState,
        *,
        rebuild: bool,
        changes: Sequence[LayersChanged] = (),
    ) -> None:
        """Bring the view to ``state`` (seed 004, "Effects").

        A snapshot (``rebuild``) builds the whole view; a change updates it: a pushed
        layer joins at the end, a flush or compaction swaps its stretch, and every
        other layer's view is kept. A view that does not end up with the manifest's
        layers (a change it cannot place) is built whole instead.
        """
        if not state.live:
            repo.view.forget_cached()
            repo.view = View((), caches=self.caches)
        elif rebuild or changes:
            view: View | None = None
            built = 0  # objects of the layers whose views were built
            if not rebuild and _entries(repo.view) == repo.state.manifest:
                view = repo.view
                for change in changes:
                    added = [(e, await self._reader(repo, e)) for e in change.added]
                    built += sum(e.object_count for e in change.added)
                    try:
                        view = await asyncio.to_thread(view.with_layers, change.removed, added)
                    except (InvalidArgument, CorruptData) as exc:
                        log.warning("view of %s: a layer change did not fit: %s", repo.name, exc)
                        view = None
                        break
                if view is not None and _entries(view) != state.manifest:
                    view = None
                if view is not None:
                    self.view_updates += 1
            if view is None:
                pairs = [(e, await self._reader(repo, e)) for e in state.manifest]
                view = await asyncio.to_thread(
                    partial(View, pairs, limits=self.limits, caches=self.caches)
                )
                self.view_builds += 1
                built = sum(e.object_count for e in state.manifest)
                repo.view.forget_cached()  # a new lineage: the old one's entries are dead
            self.release_after("a view", built * VIEW_OBJECT_BYTES)
            keep = {e.root for e in state.manifest}
            repo.readers = {k: v for k, v in repo.readers.items() if k in keep}
            repo.inline = {k: v for k, v in repo.inline.items() if k in keep}
            repo.view = view
        self._retire(repo.name, repo.state, state)
        repo.state = state
        self._charge(repo)
        for listener in self.state_listeners:
            listener(repo.name)
        async with repo.changed:
            repo.changed.notify_all()

    def _charge(self, repo: _Repo) -> None:
        """Recount what ``repo``'s view is charged: its layers' metadata (held in memory
        while a layer is open), the inline layers' bytes and ``VIEW_FIXED_BYTES``."""
        size = VIEW_FIXED_BYTES + sum(len(b) for b in repo.inline.values())
        if repo.state.live:
            size += sum(e.meta_size for e in repo.state.manifest if e.kind is LayerKind.STORED)
        if self._repos.get(repo.name) is repo:
            self.view_bytes += size - repo.bytes
        repo.bytes = size

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
            try:
                reader = open_inline(data, entry.root, entry.meta_size, limits=self.limits)
            except CorruptData:
                repo.inline.pop(entry.root, None)  # never used, never kept
                log.error("%s: inline layer %s refused", repo.name, entry.root.hex()[:16])
                raise
        else:
            if self.layers is None or entry.key is None:
                raise Unavailable("no layer storage configured for stored layers")
            # Seed 004, "Metadata is always local": opening is one ranged read of the
            # metadata; entry bytes are loaded by the reads that need them ("Machines"),
            # or in the background without a disk budget ("Files and tiers").
            key = layer_key(repo.name, entry.key)
            opened = await self.layers.open_layer(
                storage_segment(repo.name), key, entry.file_size, entry.meta_size
            )
            reader = opened.reader
        repo.readers[entry.root] = reader
        return reader

    async def run_read(
        self,
        view: View,
        step: Callable[[], _T],
        *,
        kind: str,
        executor: Executor | None = None,
    ) -> _T:
        """``step`` (a read of ``view``: planning, peeling, an API commit's trees) with
        every byte it reads loaded first (seed 004, "Never waiting on the object store").

        A view whose layers are all here runs ``step`` at once in a worker thread. Any
        other runs it as a :class:`~enroute_core.storage.machines.Restartable` under
        :func:`~enroute_core.storage.machines.drive`: a read of bytes that are not
        local raises ``NotLocal`` naming them (a tree walk, a whole level), they are
        loaded and pinned, and the step runs again; so no ``NotLocal`` reaches a
        client. ``kind`` labels the chunks it loads (``/status``, metrics).

        A caller cancelled meanwhile (its request went) stops the step's walks at their
        next commit or tree (``engine/cancel.py``): the thread is not waited for, it
        holds no file of the request, and it ends soon after.
        """
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        step = partial(_abandoned_when, cancelled, step)
        try:
            if self.layers is None or view.settled():
                return await loop.run_in_executor(executor, step)
            machine = Restartable(step, rounds_max=self.limits.read_load_rounds_max)
            token = LOAD_KIND.set(kind)
            try:
                stats = await drive(machine, self.layers, executor=executor)
            finally:
                LOAD_KIND.reset(token)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        self.load_rounds[kind] += stats.tickets
        return cast("_T", machine.result)

    def read_stats(self) -> dict[str, object]:
        """``/status`` "reads": tickets parked by reads that loaded (by request kind) and
        the time to the first pack byte of the latest fetches."""
        times = sorted(self.first_pack_byte_s)
        return {
            "tickets_parked": dict(self.load_rounds),
            "first_pack_byte_s": {
                "count": len(times),
                "p50": times[len(times) // 2] if times else None,
                "max": times[-1] if times else None,
                "loaded_bytes": self.first_pack_byte_loaded_bytes,
            },
        }

    def ingest_snapshot(self, view: View) -> SnapshotObjects:
        """What a push is ingested against: ``view`` itself when its layers are all here,
        else a :class:`LoadingSnapshot` that loads each body ingest reads (thin-pack bases,
        the trees the segment diff reads) and keeps it pinned until ingest ends."""
        if self.layers is None or view.settled():
            return view
        return LoadingSnapshot(view, self.layers, asyncio.get_running_loop(), self.limits)

    async def ref_snapshot_loaded(self, snap: Snapshot | None) -> RefSnapshot:
        """:meth:`ref_snapshot` with the tags it peels loaded first (its layers pinned:
        an eviction meanwhile does not close them under it)."""
        if snap is None or not snap.state.live:
            return RefSnapshot((), None)
        with self.pin_reads(snap):
            return await self.run_read(snap.view, partial(self.ref_snapshot, snap), kind="refs")

    async def read(self, name: str, *, use: bool = True) -> Snapshot:
        """A snapshot after a read barrier (DESIGN "Read path").

        A view evicted while the read waited is opened again (its new subscription
        starts with the current state): a read never answers from a view that stopped
        following. ``use``: as for :meth:`open`.
        """
        for attempt in range(READ_REOPENS_MAX + 1):
            try:
                return await self._read_once(name, use)
            except _Evicted:
                if attempt == READ_REOPENS_MAX:
                    raise
        raise AssertionError("unreachable")

    async def _read_once(self, name: str, use: bool) -> Snapshot:
        repo = await self.open(name, use=use)
        point = await self.ledger.barrier(name)
        if point.deleted:
            self.drop(name)
            raise NotFound(f"repository {name} not found", name=name)
        if repo.evicted:
            raise _Evicted(f"view of {name} was evicted", name=name)
        if point.incarnation != repo.state.incarnation:
            self.drop(name)
            repo = await self.open(name, use=use)
        await self._wait_version(repo, point.version)
        return repo.snapshot()

    def peek(self, name: str) -> Snapshot | None:
        """The snapshot as the view stands, with no barrier; None when the repository is
        not hosted here (yet) or not live.

        DESIGN "Read path": only the ref reads of a fetch need the barrier; objects the
        view already holds may be served from it as it is. A caller that finds what it
        needs missing (a want the view lacks) reads with :meth:`read` instead.
        """
        repo = self._repos.get(name)
        if repo is None or repo.dead or not repo.state.live:
            return None
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

    async def store_layer(
        self,
        name: str,
        snap: Snapshot,
        result: IngestResult,
        layer_file: ScratchFile | None = None,
    ) -> NewLayer | None:
        """The new layer of a push or API commit: inline when small, else published.

        DESIGN "Repository state": a stored layer is named with the state's
        ``upload_gen`` so the ledger accepts it only inside the upload window.
        ``layer_file`` holds the layer when ingest wrote it to a scratch file
        (pushes): an inline layer is read back from it, a stored one is
        published from it and moved into place, never held in memory.
        """
        sealed = result.sealed
        if sealed is None:
            return None
        assert result.data is not None or layer_file is not None
        if sealed.file_size <= self.inline_max_bytes or self.layers is None:
            data = result.data
            if data is None:
                assert layer_file is not None
                data = await asyncio.to_thread(layer_file.read_all)
            repo = self._repos.get(name)
            if repo is not None:
                repo.inline[sealed.root] = data
            return result.new_layer(inline=True, data=data)
        gen = snap.state.upload_gen
        key = layer_key(name, layer_key_name(gen, sealed.root))
        if result.data is not None:
            await self.layers.publish(storage_segment(name), key, result.data)
        else:
            assert layer_file is not None
            # publish moves the file into place; the caller's close removes what is left
            await self.layers.publish(storage_segment(name), key, layer_file.path)
        return result.new_layer(inline=False, upload_gen=gen)

    # -- local copies of layers that left the manifest ------------------------------------

    def _retire(self, name: str, old: RepoState, new: RepoState) -> None:
        """Note the stored layers of ``old`` that ``new`` no longer names (a merge swapped
        them out, a new incarnation or a deletion replaced the view): their local copies
        go once no read pins them and the retention has passed."""
        if not old.live:
            return
        keep = {e.root for e in new.manifest} if new.live else set()
        now = self.clock.now_us()
        segment = storage_segment(name)
        for e in old.manifest:
            if e.kind is LayerKind.STORED and e.key is not None and e.root not in keep:
                self._retired.setdefault((segment, layer_key(name, e.key)), now)

    @contextlib.contextmanager
    def pin_reads(self, snap: Snapshot) -> Iterator[None]:
        """Keep the local copies of ``snap``'s stored layers while a read uses its view."""
        keys = _stored_keys(snap.name, snap.state)
        self._read_pins.update(keys)
        self._in_use[snap.name] += 1  # and the view is not evicted meanwhile
        try:
            yield
        finally:
            self._in_use[snap.name] -= 1
            if self._in_use[snap.name] <= 0:
                del self._in_use[snap.name]
            self._read_pins.subtract(keys)
            unpinned = [k for k in set(keys) if self._read_pins[k] <= 0]
            for k in unpinned:  # a manifest may name one file twice (identical pushes)
                del self._read_pins[k]
            closing = [k for k in unpinned if k in self._closing]
            if closing:  # their views were evicted while this read used them
                self._close_layers(snap.name, closing)

    @property
    def retired_copies(self) -> int:
        return len(self._retired)

    async def reclaim_local_copies(self, now_us: int, retention_us: int) -> tuple[int, int]:
        """Delete the local copies (files and catalog records) of retired layers that no
        manifest hosted here names, no read pins, and that retired ``retention_us`` ago
        (seed 004, "Files and tiers": a copy is derivable, so a later open refetches).
        Answers (copies deleted, bytes)."""
        if self.layers is None:
            self._retired.clear()
            return 0, 0
        named: set[tuple[str, str]] = set()
        for repo in self._repos.values():
            named.update(_stored_keys(repo.name, repo.state))
        files = size = 0
        for item, retired_us in sorted(self._retired.items()):
            if item in named:
                del self._retired[item]  # named again (not expected; kept)
                continue
            if self._read_pins.get(item, 0) > 0 or now_us - retired_us < retention_us:
                continue
            freed = await self.layers.remove_copy(*item)
            if freed is None:
                continue  # being opened right now: try again on the next pass
            del self._retired[item]
            files += 1
            size += freed
        for repo in list(self._repos.values()):
            # Copies a previous run left (it stopped before it could delete them).
            if repo.dead or not repo.state.live or repo.name in self._swept_leftovers:
                continue
            self._swept_leftovers.add(repo.name)
            segment = storage_segment(repo.name)
            keep = [k for s, k in _stored_keys(repo.name, repo.state)]
            keep += [k for s, k in self._read_pins if s == segment]
            for leftover in self.layers.leftover_copies(segment, keep):
                size += self.layers.remove_leftover(leftover)
                files += 1
        self.local_copies_deleted += files
        self.local_copy_bytes_deleted += size
        return files, size

    # -- refs -----------------------------------------------------------------------------

    def ref_snapshot(self, snap: Snapshot | None) -> RefSnapshot:
        """The refs with their peeled values. Peeling reads each ref's object, so the
        refs of each leaf of the state's :class:`RefMap` are kept with the map (on the
        hosted repository) and a leaf the next state shares is not peeled again: the
        advertisement after a push of one ref peels one leaf, not every ref."""
        if snap is None or not snap.state.live:
            return RefSnapshot((), None)
        refs = RefMap.of(snap.state.refs)
        repo = self._repos.get(snap.name)
        kept = None if repo is None else repo.peeled
        old = {} if kept is None else kept[1]
        parts: dict[int, tuple[Ref, ...]] = {}
        out: list[Ref] = []
        for leaf in refs.leaves():
            # id() names a leaf while ``kept`` holds the map it is in (ids are reused
            # only after an object is gone)
            part = old.get(id(leaf))
            if part is None:
                part = tuple(
                    Ref(name, value.oid, _peel(snap.view, value.oid))
                    for name, value in leaf.items()
                )
                self.refs_peeled += len(part)
            parts[id(leaf)] = part
            out.extend(part)
        if repo is not None:
            repo.peeled = (refs, parts)
        return RefSnapshot(tuple(out), snap.state.head or None)


class LoadingSnapshot:
    """A view as ingest's :class:`SnapshotObjects`, loading the bodies it reads.

    Seed 004, "Machines": ingest loads the bases of the thin pack and every snapshot
    delta base before it reads them. Which ones it needs shows only while the pack
    is indexed and its trees diffed, and ingest is not split into phases at those
    points, so a read that finds its bytes missing (``NotLocal`` naming the entry
    and its whole chain) has them loaded on the event loop and is read again; the
    ingest thread, one per push, waits for that load. The pins stay until
    :meth:`release` (after the ingest), as for every phase that loads and then
    reads ("Disk budget", Pins). ``docs/residency.md`` records this deviation.
    """

    def __init__(
        self, view: View, layers: LayerService, loop: asyncio.AbstractEventLoop, limits: Limits
    ) -> None:
        self._view = view
        self._layers = layers
        self._loop = loop
        self._limits = limits
        self._pins: list[LoadPins] = []
        self._lock = threading.Lock()
        self.rounds = 0

    def contains(self, oid: ObjectId) -> bool:
        return self._view.contains(oid)

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        return self._view.type_of(oid)

    def size_of(self, oid: ObjectId) -> int | None:
        return self._view.size_of(oid)

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        while True:
            try:
                return self._view.read(oid)
            except NotLocal as exc:
                with self._lock:
                    self.rounds += 1
                    check_limit(
                        "read_load_rounds_max", self.rounds, self._limits.read_load_rounds_max
                    )
                ticket = ticket_of(oid, exc)
                pins = asyncio.run_coroutine_threadsafe(self._load(ticket), self._loop).result()
                with self._lock:
                    self._pins.append(pins)

    async def _load(self, ticket: Ticket) -> LoadPins:
        token = LOAD_KIND.set("push")
        try:
            got = await asyncio.gather(
                *(
                    self._layers.load_named(
                        ld.layer, local_indexes=ld.local_indexes, chunks=ld.chunks
                    )
                    for ld in ticket.loads
                ),
                return_exceptions=True,
            )
        finally:
            LOAD_KIND.reset(token)
        pins = [g for g in got if isinstance(g, LoadPins)]
        failed = next((g for g in got if isinstance(g, BaseException)), None)
        if failed is not None:
            for p in pins:
                p.release()
            raise failed
        return LoadPins.join(pins)

    def release(self) -> None:
        with self._lock:
            pins, self._pins = self._pins, []
        for p in pins:
            p.release()


def _stored_keys(name: str, state: RepoState) -> list[tuple[str, str]]:
    if not state.live:
        return []
    segment = storage_segment(name)
    return [
        (segment, layer_key(name, e.key))
        for e in state.manifest
        if e.kind is LayerKind.STORED and e.key is not None
    ]


def _entries(view: View) -> tuple[LayerEntry, ...]:
    """The manifest a view was built for."""
    return tuple(entry for entry, _ in view.layers)


def _abandoned_when(cancelled: threading.Event, step: Callable[[], _T]) -> _T:
    with abandoned_when(cancelled):
        return step()


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
