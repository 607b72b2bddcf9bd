"""One repository's maintenance, for the compute's background loop.

Issue "Layer maintenance"; seed 001, "Reclaiming layer files"; seed 004,
"Stable object numbering". This joins what the pieces need from the
repository state (keys, the manifest's file names, the upload window, the
state object) to :mod:`enroute_core.storage.maintenance` (lease, sweep,
trash) and to the merge planner (:mod:`enroute_core.engine.compaction`) and
the merge (:mod:`enroute_core.engine.merge`). The clock is passed in as
``now_us``; nothing here loops or sleeps: ``docs/maintenance.md`` says what the
loop calls and when.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from enroute_core.base.errors import InvalidName, NotFound, PreconditionFailed
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.engine.compaction import DEFAULT_POLICY, CompactionPolicy, Stretch, plan
from enroute_core.engine.merge import MergedLayer, ViewBefore, merge_layers
from enroute_core.engine.view import View
from enroute_core.state.codec import decode_state
from enroute_core.state.model import RepoState
from enroute_core.state.names import (
    layers_prefix,
    maintainer_key,
    repo_name_from_storage,
    state_key,
    sweep_key,
    trash_prefix,
)
from enroute_core.storage.maintenance import (
    HeldLease,
    SweepReport,
    TrashReport,
    acquire_lease,
    reclaim_trash,
    release_lease,
    renew_lease,
    sweep_layers,
)
from enroute_core.storage.objectstore.base import LIST_LIMIT_MAX, ObjectStore

TRASH_ROOT = "trash/"


@dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """``lease_margin_us`` is how long before expiry a holder stops acting (clock skew
    between computes); ``sweep_retention_us`` is ``layers.sweep_retention``."""

    lease_duration_us: int = 60_000_000
    lease_margin_us: int = 10_000_000
    sweep_retention_us: int = 3_600_000_000
    policy: CompactionPolicy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        assert 0 <= self.lease_margin_us < self.lease_duration_us, self
        assert self.sweep_retention_us >= 0, self


class RepoMaintainer:
    """The maintenance of one repository name by one compute (across its incarnations)."""

    def __init__(
        self,
        store: ObjectStore,
        repo: str,
        holder: str,
        settings: MaintenanceSettings = MaintenanceSettings(),
        *,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.store = store
        self.repo = repo
        self.holder = holder
        self.settings = settings
        self.limits = limits
        self._lease_key = maintainer_key(repo)
        self._held: HeldLease | None = None

    # -- the lease ----------------------------------------------------------------------------

    @property
    def held(self) -> HeldLease | None:
        return self._held

    def holds(self, now_us: int) -> bool:
        return self._held is not None and self._held.valid(now_us, self.settings.lease_margin_us)

    async def acquire(self, now_us: int) -> bool:
        """Take or renew the lease; False while another compute holds it."""
        duration = self.settings.lease_duration_us
        if self._held is not None:
            self._held = await renew_lease(
                self.store, self._lease_key, self._held, now_us=now_us, duration_us=duration
            )
            if self._held is not None:
                return True
        self._held = await acquire_lease(
            self.store, self._lease_key, self.holder, now_us=now_us, duration_us=duration
        )
        return self._held is not None

    async def release(self, now_us: int) -> None:
        if self._held is not None:
            await release_lease(self.store, self._lease_key, self._held, now_us=now_us)
            self._held = None

    def _require(self, now_us: int) -> None:
        if not self.holds(now_us):
            raise PreconditionFailed(
                "this compute does not hold the maintenance lease",
                repo=self.repo,
                reason="not_lease_holder",
            )

    # -- sweep and trash ----------------------------------------------------------------------

    async def sweep(self, state: RepoState, now_us: int) -> SweepReport:
        """The layer sweep against ``state`` (any applied state of the repository will do:
        a file out of its window stays out of every later window)."""
        self._require(now_us)
        named = {e.key for e in state.manifest if e.key is not None}
        return await sweep_layers(
            self.store,
            layers_prefix=layers_prefix(self.repo),
            record_key=sweep_key(self.repo),
            named=named,
            sweepable_gen_max=state.sweepable_gen_max,
            now_us=now_us,
            retention_us=self.settings.sweep_retention_us,
            limits=self.limits,
        )

    async def ended(self, incarnation: int) -> bool:
        """Seed 001: the state object shows ``incarnation`` deleted or superseded."""
        try:
            data = await self.store.get(state_key(self.repo))
        except NotFound:
            return False
        current = decode_state(data, limits=self.limits)
        return current.incarnation > incarnation or (
            current.incarnation == incarnation and current.deleted
        )

    async def reclaim_trash(self, now_us: int) -> TrashReport:
        self._require(now_us)
        return await reclaim_trash(
            self.store,
            trash_prefix=trash_prefix(self.repo),
            layers_prefix=layers_prefix(self.repo),
            ended=self.ended,
            now_us=now_us,
            retention_us=self.settings.sweep_retention_us,
            limits=self.limits,
        )

    # -- merges -------------------------------------------------------------------------------

    def next_merge(self, state: RepoState) -> Stretch | None:
        return plan(state.manifest, self.settings.policy)


async def names_with_trash(store: ObjectStore, *, names_max: int = 1_000_000) -> list[str]:
    """Repository names that have trash markers (``trash/<repo>/<E>``), in key order.

    A deleted repository has no subscription, so the loop finds what to reclaim
    here. Keys that are no marker of a valid name are skipped.
    """
    names: list[str] = []
    after: str | None = None
    while True:
        page = await store.list(TRASH_ROOT, start_after=after, limit=LIST_LIMIT_MAX)
        for item in page.items:
            segment, _, rest = item.key[len(TRASH_ROOT) :].partition("/")
            if not rest or "/" in rest:
                continue
            try:
                name = repo_name_from_storage(segment)
            except InvalidName:
                continue
            if not names or names[-1] != name:
                names.append(name)
        check_limit("names_with_trash", len(names), names_max)
        if page.next_start_after is None:
            return names
        after = page.next_start_after


def merge_stretch(
    view: View,
    stretch: Stretch,
    sink: Callable[[bytes], object],
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> MergedLayer:
    """Merge ``stretch`` of the view's layers (the view's layers are its manifest)."""
    layers = view.layers
    return merge_layers(
        layers[stretch.start : stretch.stop],
        sink,
        older=ViewBefore(view, stretch.start),
        limits=limits,
    )
