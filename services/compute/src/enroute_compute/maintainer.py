"""The compute's background layer maintenance: flush, compaction, the sweep, trash.

Issue "Layer maintenance"; docs/maintenance.md, "What the compute's background
loop must do"; seed 004, "Stable object numbering" and "Effects"; seed 001,
"Reclaiming layer files". Every ``layers.maintenance_interval`` a pass visits
the repositories that need it, at most ``layers.merge_concurrency`` at a time:
those whose view took a new state since their last visit (the host tells, see
``Maintainer.changed``), and those whose sweep, merge back-off or lease retry
came due (a timer heap). An idle repository is visited once after it goes idle
and then not again, so a pass costs nothing per idle repository (issue 19).
Its reads are not a use of the view (``RepositoryHost.read(use=False)``): a visit
does not keep an idle view from being evicted (docs/fleet.md), and a repository
whose view went is not visited (it is looked at again when it changes).
Per repository, under its maintenance lease (``RepoMaintainer``):

1. Merges: plan on the state of a read snapshot; load the stretch's stored
   layers (pinned while the merge reads them); merge on a worker thread into a
   scratch file while the event loop keeps renewing the lease; publish the
   file as ``layer_key_name(upload_gen, root)``; propose ``replace_layers``.
   A ``stale_run`` or upload-window refusal drops the file (the sweep reclaims
   it) and plans again on a new snapshot; so does a lease lost meanwhile.
   Objects keep their ids and the old layers stay named by older snapshots'
   views, so readers in flight are not disturbed.
2. Every ``layers.sweep_interval``: the layer sweep and trash reclamation; for
   names without a live view here (deleted repositories) trash only, taken
   from ``names_with_trash``.
3. Every pass: the local copies of layers that left a manifest here (merged
   away, deleted, superseded) are deleted with their catalog records once no
   read pins them and ``layers.sweep_retention`` has passed
   (``RepositoryHost.reclaim_local_copies``).

A merge that fails (an error, not a refusal that asks to plan again) is not
tried again on every pass: the repository's merges wait ``interval * 2**k``
(k failures in a row, at most ``MERGE_BACKOFF_MAX_US``); its sweep goes on.

The clock is passed in (``now_us`` for leases and sweep times); only the pause
between passes is real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from enroute_compute.host import RepositoryHost, Snapshot
from enroute_core.base.clock import Clock
from enroute_core.base.errors import EnrouteError, IncarnationEnded, InvalidArgument, NotFound
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.engine.compaction import CompactionPolicy, Stretch
from enroute_core.engine.maintenance import (
    MaintenanceSettings,
    RepoMaintainer,
    merge_stretch,
    names_with_trash,
)
from enroute_core.engine.merge import MergedLayer, check_replacement
from enroute_core.state import LayerEntry, LayerKind, OutcomeCode
from enroute_core.state.names import layer_key, storage_segment
from enroute_core.storage.budgeted import LoadPins
from enroute_core.storage.layer.format import layer_key_name
from enroute_core.storage.layers import LayerService
from enroute_core.storage.objectstore.base import ObjectStore

log = logging.getLogger(__name__)

_US = 1_000_000
MERGES_PER_VISIT_MAX = 16
"""Merges one visit of a repository may commit (one busy repository must not starve the rest)."""
_RETRY_CODES = frozenset({OutcomeCode.STALE_RUN, OutcomeCode.UPLOAD_WINDOW})
MERGE_BACKOFF_MAX_US = 3600 * _US
"""The longest wait of a repository whose merges keep failing."""
STATUS_TOP_MAX = 16
"""Repositories ``/status`` names per list (most layers, leases held): it stays bounded."""


@dataclass(slots=True)
class MergeBackoff:
    """Failed merge attempts of one repository in a row, and when to try again."""

    failures: int
    retry_at_us: int


@dataclass(frozen=True, slots=True)
class MaintainerConfig:
    """``layers.*`` as the loop uses them (seconds turned into microseconds)."""

    interval_s: float = 5.0
    sweep_interval_us: int = 600 * _US
    merge_concurrency: int = 1
    settings: MaintenanceSettings = field(default_factory=MaintenanceSettings)

    def __post_init__(self) -> None:
        if self.interval_s < 0 or self.sweep_interval_us < 0 or self.merge_concurrency < 1:
            raise InvalidArgument("maintenance intervals and concurrency are out of range")

    @classmethod
    def from_layers(cls, layers: Any) -> MaintainerConfig:
        """From :class:`enroute_core.config.LayersConfig` (validated there)."""
        return cls(
            interval_s=float(layers.maintenance_interval),
            sweep_interval_us=int(layers.sweep_interval * _US),
            merge_concurrency=int(layers.merge_concurrency),
            settings=MaintenanceSettings(
                lease_duration_us=int(layers.lease_duration * _US),
                lease_margin_us=int(layers.lease_margin * _US),
                sweep_retention_us=int(layers.sweep_retention * _US),
                policy=CompactionPolicy(
                    factor=int(layers.compaction_factor),
                    flush_layers_min=int(layers.flush_layers_min),
                    merge_objects_max=int(layers.merge_objects_max),
                ),
            ),
        )


@dataclass(slots=True)
class MaintenanceCounters:
    """Totals since start, for /status and /metrics (issue item 6)."""

    passes: int = 0
    flushes: int = 0
    compactions: int = 0
    flush_seconds: float = 0.0
    compaction_seconds: float = 0.0
    merged_objects: int = 0
    dropped_duplicates: int = 0
    merges_refused: int = 0
    merges_abandoned: int = 0
    errors: int = 0
    sweeps: int = 0
    trash_runs: int = 0
    files_deleted: int = 0
    sweep_bytes_reclaimed: int = 0
    trash_bytes_reclaimed: int = 0
    merge_failures: int = 0
    merges_deferred: int = 0
    local_copies_deleted: int = 0
    local_copy_bytes_deleted: int = 0
    visits: int = 0

    @property
    def merges(self) -> int:
        return self.flushes + self.compactions

    @property
    def bytes_reclaimed(self) -> int:
        return self.sweep_bytes_reclaimed + self.trash_bytes_reclaimed


class Maintainer:
    """Layer maintenance of every repository one compute hosts."""

    def __init__(
        self,
        host: RepositoryHost,
        store: ObjectStore,
        node_id: str,
        clock: Clock,
        config: MaintainerConfig = MaintainerConfig(),
        *,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        if not node_id:
            raise InvalidArgument("layer maintenance needs a node id (node.id)")
        self.host = host
        self.store = store
        self.node_id = node_id
        self.clock = clock
        self.config = config
        self.limits = limits
        self.counters = MaintenanceCounters()
        self.layer_counts: dict[str, int] = {}
        """The ``STATUS_TOP_MAX`` repositories with the most layers, as of their visits."""
        # visited lately, oldest visit first: pruned once their lease lapsed
        self._repos: dict[str, RepoMaintainer] = {}
        # swept within the sweep interval, oldest first: pruned once older
        self._last_sweep: dict[str, int] = {}
        self.backoff: dict[str, MergeBackoff] = {}
        # repositories whose view took a new state since their last visit; every hosted
        # one at the start (a previous run may have left work)
        self._dirty: dict[str, None] = dict.fromkeys(host.hosted)
        self._timers: list[tuple[int, str]] = []  # (due us, name): sweeps, retries
        self._timed: dict[str, int] = {}  # name -> its earliest due on the heap
        host.state_listeners.append(self.changed)
        self._last_trash_scan: int | None = None
        self._slots = asyncio.Semaphore(config.merge_concurrency)
        self._task: asyncio.Task[None] | None = None

    # -- running ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None and self.config.interval_s > 0 and self.host.layers is not None:
            self._task = asyncio.create_task(self._run())

    def changed(self, name: str) -> None:
        """The host's view of ``name`` took a new state: visit it on the next pass."""
        self._dirty[name] = None

    def _schedule(self, name: str, due_us: int) -> None:
        """Visit ``name`` again once ``due_us`` has come (the earliest of its dues)."""
        timed = self._timed.get(name)
        if timed is not None and timed <= due_us:
            return
        self._timed[name] = due_us
        heapq.heappush(self._timers, (due_us, name))

    def _take_due(self, now_us: int) -> list[str]:
        """The repositories to visit now: changed ones, then those whose timer came."""
        due = self._dirty
        self._dirty = {}
        while self._timers and self._timers[0][0] <= now_us:
            at, name = heapq.heappop(self._timers)
            if self._timed.get(name) == at:
                del self._timed[name]
                due[name] = None
        return list(due)

    def _prune(self, now_us: int) -> None:
        """Forget what only recent visits need: maintainers whose lease lapsed (the
        lease is not renewed for an idle repository) and sweep times past the interval."""
        while self._repos:
            name, m = next(iter(self._repos.items()))
            if m.held is not None and m.holds(now_us):
                break
            del self._repos[name]
        interval = self.config.sweep_interval_us
        while self._last_sweep:
            name, at = next(iter(self._last_sweep.items()))
            if now_us - at < interval:
                break
            del self._last_sweep[name]

    def _note_layers(self, name: str, count: int) -> None:
        """Keep the repositories with the most layers, at most ``STATUS_TOP_MAX``."""
        self.layer_counts[name] = count
        if len(self.layer_counts) > STATUS_TOP_MAX:
            del self.layer_counts[min(self.layer_counts, key=self.layer_counts.__getitem__)]

    async def _forget(self, name: str) -> None:
        """No live view here any more (deleted, or dropped): let its lease go at once."""
        self.layer_counts.pop(name, None)
        self._last_sweep.pop(name, None)
        self.backoff.pop(name, None)
        m = self._repos.pop(name, None)
        if m is not None:
            with contextlib.suppress(EnrouteError):
                await m.release(self.clock.now_us())

    async def stop(self) -> None:
        """Cancel the loop and let go of every lease, so another compute need not wait."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        now = self.clock.now_us()
        for m in list(self._repos.values()):
            with contextlib.suppress(EnrouteError, OSError):
                await m.release(now)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one failure
                self.counters.errors += 1
                log.exception("layer maintenance pass failed")

    async def run_once(self) -> None:
        """One pass: the repositories that changed or came due, then the names that have
        only trash (every ``layers.sweep_interval``)."""
        self.counters.passes += 1
        now = self.clock.now_us()
        due = self._take_due(now)
        self._prune(now)
        await asyncio.gather(*(self._visit(name) for name in due))
        now = self.clock.now_us()
        last = self._last_trash_scan
        if last is None or now - last >= self.config.sweep_interval_us:
            self._last_trash_scan = now
            names = await names_with_trash(self.store)
            await asyncio.gather(*(self._trash_only(n) for n in names if self.host.peek(n) is None))
        if due or self.host.retired_copies:
            files, size = await self.host.reclaim_local_copies(
                self.clock.now_us(), self.config.settings.sweep_retention_us
            )
            self.counters.local_copies_deleted += files
            self.counters.local_copy_bytes_deleted += size

    # -- one repository -----------------------------------------------------------------------

    def _maintainer(self, name: str) -> RepoMaintainer:
        m = self._repos.pop(name, None)
        if m is None:
            m = RepoMaintainer(
                self.store, name, self.node_id, self.config.settings, limits=self.limits
            )
        self._repos[name] = m  # the most recent visit last
        return m

    async def _lease(self, m: RepoMaintainer) -> bool:
        """Hold the lease, renewing once half of what is usable of it has passed."""
        now = self.clock.now_us()
        held = m.held
        s = self.config.settings
        if held is not None and m.holds(now):
            usable = held.lease.expires_us - s.lease_margin_us - now
            if usable > (s.lease_duration_us - s.lease_margin_us) // 2:
                return True
        return await m.acquire(now)

    async def _visit(self, name: str) -> None:
        async with self._slots:
            if self.host.peek(name) is None:  # not hosted here any more, or not live
                await self._forget(name)
                return
            self.counters.visits += 1
            m = self._maintainer(name)
            retry_us = self.clock.now_us() + int(self.config.interval_s * _US)
            try:
                if not await self._lease(m):
                    # another compute maintains it; look again once its lease may have
                    # lapsed (a change here brings the visit forward)
                    lease_us = self.config.settings.lease_duration_us
                    self._schedule(name, self.clock.now_us() + lease_us)
                    return
                snap = await self.host.read(name, use=False)
                snap = await self._merges_backing_off(m, snap)
                self._note_layers(name, len(snap.state.manifest))
                await self._sweep(m, snap)
            except (NotFound, IncarnationEnded):  # deleted meanwhile: trash is for later
                await self._forget(name)
            except EnrouteError as exc:
                self.counters.errors += 1
                self._schedule(name, retry_us)
                log.warning("maintenance of %s: %s", name, exc)
            except (OSError, AssertionError):  # one repository must not stop the pass
                self.counters.errors += 1
                self._schedule(name, retry_us)
                log.exception("maintenance of %s failed", name)

    async def _merges_backing_off(self, m: RepoMaintainer, snap: Snapshot) -> Snapshot:
        """The merges of one visit, unless failures put them off; a failure is counted,
        logged and backs the repository off, and the visit goes on to the sweep."""
        name = snap.name
        now = self.clock.now_us()
        waiting = self.backoff.get(name)
        if waiting is not None and now < waiting.retry_at_us:
            self.counters.merges_deferred += 1
            self._schedule(name, waiting.retry_at_us)
            return snap
        try:
            snap = await self._merges(m, snap)
        except (NotFound, IncarnationEnded):
            raise
        except (EnrouteError, OSError, AssertionError) as exc:
            failures = 1 if waiting is None else waiting.failures + 1
            wait = min(int(self.config.interval_s * _US) << min(failures, 40), MERGE_BACKOFF_MAX_US)
            self.backoff[name] = MergeBackoff(failures, self.clock.now_us() + wait)
            self._schedule(name, self.clock.now_us() + wait)
            self.counters.merge_failures += 1
            self.counters.errors += 1
            log.warning(
                "merge of %s failed (%d in a row; next try in %.1f s): %s",
                name,
                failures,
                wait / _US,
                exc,
            )
            return await self.host.read(name, use=False)
        self.backoff.pop(name, None)
        return snap

    async def _merges(self, m: RepoMaintainer, snap: Snapshot) -> Snapshot:
        for _ in range(MERGES_PER_VISIT_MAX):
            stretch = m.next_merge(snap.state)
            if stretch is None or not m.holds(self.clock.now_us()):
                return snap
            version = await self._merge(m, snap, stretch)
            if version is not None:
                await self.host.wait_applied(snap.name, version)
            snap = await self.host.read(snap.name, use=False)
        return snap

    async def _sweep(self, m: RepoMaintainer, snap: Snapshot) -> None:
        """Sweep after a change, at most every ``sweep_interval``; again an interval
        later while files wait out their retention or trash waits for its state object."""
        now = self.clock.now_us()
        interval = self.config.sweep_interval_us
        last = self._last_sweep.get(snap.name)
        if last is not None and now - last < interval:
            self._schedule(snap.name, last + interval)
            return
        if not await self._lease(m):
            self._schedule(snap.name, now + interval)
            return
        self._last_sweep.pop(snap.name, None)
        self._last_sweep[snap.name] = now  # the latest sweep last
        swept = await m.sweep(snap.state, now)
        self.counters.sweeps += 1
        self.counters.files_deleted += len(swept.deleted)
        self.counters.sweep_bytes_reclaimed += swept.deleted_bytes
        trash_left = await self._reclaim(m, now)
        if swept.recorded or trash_left:
            self._schedule(snap.name, now + interval)

    async def _reclaim(self, m: RepoMaintainer, now: int) -> int:
        """Trash reclamation of one repository; answers the markers left."""
        trash = await m.reclaim_trash(now)
        self.counters.trash_runs += 1
        self.counters.files_deleted += len(trash.deleted)
        self.counters.trash_bytes_reclaimed += trash.deleted_bytes
        return trash.markers - len(trash.markers_removed)

    async def _trash_only(self, name: str) -> None:
        """A deleted repository has no view: reclaim its trash under its lease, then let go."""
        async with self._slots:
            m = RepoMaintainer(
                self.store, name, self.node_id, self.config.settings, limits=self.limits
            )
            try:
                if not await m.acquire(self.clock.now_us()):
                    return
                await self._reclaim(m, self.clock.now_us())
                await m.release(self.clock.now_us())
            except EnrouteError as exc:
                self.counters.errors += 1
                log.warning("trash of %s: %s", name, exc)

    # -- one merge ----------------------------------------------------------------------------

    async def _merge(self, m: RepoMaintainer, snap: Snapshot, stretch: Stretch) -> int | None:
        """Merge, publish and propose one stretch; the applied version, or None when the
        output was dropped (refused, lease lost) and the caller plans again."""
        entries = stretch.of(snap.state.manifest)
        if tuple(e for e, _ in snap.view.layers[stretch.start : stretch.stop]) != entries:
            return None  # a view behind its state: plan again on the next snapshot
        flush = all(e.kind is LayerKind.INLINE for e in entries)
        with self.host.pin_reads(snap):  # the merge reads the snapshot's view
            return await self._merge_pinned(m, snap, stretch, entries, flush)

    async def _merge_pinned(
        self,
        m: RepoMaintainer,
        snap: Snapshot,
        stretch: Stretch,
        entries: tuple[LayerEntry, ...],
        flush: bool,
    ) -> int | None:
        layers = self.host.layers
        assert layers is not None
        state, view = snap.state, snap.view
        pins = await self._load(layers, snap.name, entries)
        scratch = layers.scratch_file("merge")
        try:
            try:
                started = self.clock.monotonic_ns()
                merging = asyncio.ensure_future(
                    asyncio.to_thread(
                        merge_stretch, view, stretch, scratch.append, limits=self.limits
                    )
                )
                merged = await self._renewing(m, merging)
                seconds = (self.clock.monotonic_ns() - started) / 1e9
            finally:
                for p in pins:
                    p.release()
            if merged is None or not m.holds(self.clock.now_us()):
                self.counters.merges_abandoned += 1
                return None
            command = merged.replace_command(state.incarnation, state.upload_gen)
            check_replacement(entries, command, dropped=merged.dropped)  # before any upload
            if merged.object_count:
                key = layer_key(snap.name, layer_key_name(state.upload_gen, merged.sealed.root))
                await layers.publish(storage_segment(snap.name), key, scratch.path)
            proposed = await self.host.ledger.propose(snap.name, state.incarnation, command)
        finally:
            scratch.close()
        outcome = proposed.change.outcome
        if outcome.code in _RETRY_CODES:
            self.counters.merges_refused += 1
            log.info("merge of %s refused (%s); planning again", snap.name, outcome.code.value)
            return None
        refused = outcome.error()
        if refused is not None:
            raise refused
        self._count(merged, flush, seconds)
        return proposed.version

    async def _load(
        self, layers: LayerService, name: str, entries: Sequence[Any]
    ) -> list[LoadPins]:
        """Seed 004, "Machines": merges load their inputs; pinned until the merge is done."""
        pins: list[LoadPins] = []
        try:
            for e in entries:
                if e.kind is not LayerKind.STORED or e.key is None:
                    continue
                opened = await layers.open_layer(
                    storage_segment(name), layer_key(name, e.key), e.file_size, e.meta_size
                )
                data_end = e.file_size - e.meta_size
                pins.append(await layers.load(opened, ranges=[(0, data_end)] if data_end else []))
        except BaseException:
            for p in pins:
                p.release()
            raise
        return pins

    async def _renewing(
        self, m: RepoMaintainer, merging: asyncio.Future[MergedLayer]
    ) -> MergedLayer | None:
        """Await the merge, renewing the lease meanwhile; None when the lease was lost."""
        s = self.config.settings
        every_s = max((s.lease_duration_us - s.lease_margin_us) / 2 / _US, 0.001)
        lost = False
        while not merging.done():
            try:
                await asyncio.wait({merging}, timeout=every_s)
            except asyncio.CancelledError:
                # The thread runs on; its outcome (an error on the closed scratch) is dropped.
                merging.add_done_callback(lambda f: f.cancelled() or f.exception())
                raise
            if not merging.done() and not lost:
                try:
                    lost = not await m.acquire(self.clock.now_us())
                except EnrouteError:
                    lost = not m.holds(self.clock.now_us())
        merged = merging.result()
        return None if lost else merged

    def _count(self, merged: MergedLayer, flush: bool, seconds: float) -> None:
        c = self.counters
        if flush:
            c.flushes += 1
            c.flush_seconds += seconds
        else:
            c.compactions += 1
            c.compaction_seconds += seconds
        c.merged_objects += merged.object_count
        c.dropped_duplicates += merged.dropped

    # -- status -------------------------------------------------------------------------------

    def lease_holders(self, limit: int | None = None) -> dict[str, str]:
        """Repositories whose lease this compute holds now, with the term (the first
        ``limit`` by name). Only repositories visited lately hold one: an idle
        repository's lease is not renewed."""
        now = self.clock.now_us()
        held = sorted(
            (name, f"{m.holder}@{m.held.lease.term}")
            for name, m in self._repos.items()
            if m.held is not None and m.holds(now)
        )
        return dict(held[:limit])

    def due_count(self) -> int:
        """Repositories waiting for a visit: changed, or with a timer set."""
        return len(self._dirty) + len(self._timed)

    def status(self) -> dict[str, Any]:
        c = self.counters
        return {
            "running": self._task is not None,
            "passes": c.passes,
            "merges": c.merges,
            "flushes": c.flushes,
            "compactions": c.compactions,
            "flush_seconds": round(c.flush_seconds, 6),
            "compaction_seconds": round(c.compaction_seconds, 6),
            "merged_objects": c.merged_objects,
            "dropped_duplicates": c.dropped_duplicates,
            "merges_refused": c.merges_refused,
            "merges_abandoned": c.merges_abandoned,
            "sweeps": c.sweeps,
            "trash_runs": c.trash_runs,
            "files_deleted": c.files_deleted,
            "bytes_reclaimed": c.bytes_reclaimed,
            "errors": c.errors,
            "merge_failures": c.merge_failures,
            "merges_deferred": c.merges_deferred,
            "repositories_backing_off": len(self.backoff),
            "local_copies_deleted": c.local_copies_deleted,
            "local_copy_bytes_deleted": c.local_copy_bytes_deleted,
            "visits": c.visits,
            "repositories_due": self.due_count(),
            "leases_held": len(self.lease_holders()),
            "lease_holders": self.lease_holders(STATUS_TOP_MAX),
            "layers": dict(sorted(self.layer_counts.items())),
        }

    def metrics_lines(self) -> list[str]:
        c = self.counters
        p = "enroute_compute_maintenance"
        lines = [
            f"# HELP {p}_merges_total merged layers committed (flushes and compactions)",
            f"# TYPE {p}_merges_total counter",
            f'{p}_merges_total{{kind="flush"}} {c.flushes}',
            f'{p}_merges_total{{kind="compaction"}} {c.compactions}',
            f"# HELP {p}_merge_seconds_total seconds spent merging layers, by kind",
            f"# TYPE {p}_merge_seconds_total counter",
            f'{p}_merge_seconds_total{{kind="flush"}} {c.flush_seconds:.6f}',
            f'{p}_merge_seconds_total{{kind="compaction"}} {c.compaction_seconds:.6f}',
            f"# HELP {p}_merges_refused_total merges the ledger refused; planned again",
            f"# TYPE {p}_merges_refused_total counter",
            f"{p}_merges_refused_total {c.merges_refused}",
            f"# HELP {p}_sweeps_total sweeps of unreferenced layer files run",
            f"# TYPE {p}_sweeps_total counter",
            f"{p}_sweeps_total {c.sweeps}",
            f"# HELP {p}_reclaimed_bytes_total layer file bytes deleted by sweeps and trash",
            f"# TYPE {p}_reclaimed_bytes_total counter",
            f'{p}_reclaimed_bytes_total{{source="sweep"}} {c.sweep_bytes_reclaimed}',
            f'{p}_reclaimed_bytes_total{{source="trash"}} {c.trash_bytes_reclaimed}',
            f"# HELP {p}_errors_total maintenance passes that failed with an error",
            f"# TYPE {p}_errors_total counter",
            f"{p}_errors_total {c.errors}",
            f"# HELP {p}_merge_failures_total merges that failed (each backs its repository off)",
            f"# TYPE {p}_merge_failures_total counter",
            f"{p}_merge_failures_total {c.merge_failures}",
            f"# HELP {p}_local_copies_deleted_total local copies of retired layers deleted",
            f"# TYPE {p}_local_copies_deleted_total counter",
            f"{p}_local_copies_deleted_total {c.local_copies_deleted}",
            f"# HELP {p}_local_copy_bytes_deleted_total bytes of retired local copies deleted",
            f"# TYPE {p}_local_copy_bytes_deleted_total counter",
            f"{p}_local_copy_bytes_deleted_total {c.local_copy_bytes_deleted}",
            f"# HELP {p}_leases_held repositories whose maintenance lease this compute holds",
            f"# TYPE {p}_leases_held gauge",
            f"{p}_leases_held {len(self.lease_holders())}",
            f"# HELP {p}_visits_total repositories visited (changed, or a sweep or retry due)",
            f"# TYPE {p}_visits_total counter",
            f"{p}_visits_total {c.visits}",
            f"# HELP {p}_repositories_due repositories waiting for a visit",
            f"# TYPE {p}_repositories_due gauge",
            f"{p}_repositories_due {self.due_count()}",
            "# HELP enroute_compute_repository_layers_max most layers in a manifest visited "
            "lately (per repository: /status?repo=<name>)",
            "# TYPE enroute_compute_repository_layers_max gauge",
            f"enroute_compute_repository_layers_max {max(self.layer_counts.values(), default=0)}",
        ]
        return lines
