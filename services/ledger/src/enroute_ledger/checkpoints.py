"""Freezing the ledger: the leader checkpoints each group into its state object.

DESIGN, "Freezing the ledger": every ``ledger.checkpoint_entries`` applied
entries or ``ledger.checkpoint_interval``, whichever comes first, the leader
of a group writes the repository state into ``repos/<repo>/state`` by
compare-and-swap over the object it read, and only when that object is older
(same incarnation, lower version, live). A deleted state is finished as the
delete does (seed 001: "Every checkpoint of a deleted state does the same"):
trash marker, then the swap. A state object that names a later incarnation
ends the group here (seed 001: drop a superseded incarnation).

Restoring a node with no log is in ``Lifecycle._host_live``: a hosted group
that nobody starts gets a genesis entry carrying the state object's checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from enroute_core.base.errors import EnrouteError, PreconditionFailed
from enroute_core.state import encode_state
from enroute_core.state.names import state_key

from .lifecycle import Lifecycle
from .runtime import Group

log = logging.getLogger("enroute.ledger.checkpoints")


@dataclass(slots=True)
class _Mark:
    version: int = 0
    at: float = 0.0


class Checkpointer:
    def __init__(
        self,
        lifecycle: Lifecycle,
        *,
        every_entries: int,
        interval_s: float,
        clock: Callable[[], float],
        poll_s: float = 0.2,
    ) -> None:
        self.lc = lifecycle
        self.rt = lifecycle.rt
        self.every_entries = every_entries
        self.interval_s = interval_s
        self.clock = clock
        self.poll_s = min(poll_s, interval_s) if interval_s > 0 else poll_s
        self._marks: dict[Group, _Mark] = {}
        self.written = 0
        self._stopping = False

    def due(self, g: Group, now: float) -> bool:
        if not g.born or g.dropped or not self.rt.is_leader(g):
            return False
        mark = self._marks.setdefault(g, _Mark(at=now))
        if g.state.version <= mark.version:
            return False
        # versions count applied entries (rule version.every_entry), so they measure entries
        # since the last checkpoint without a counter that a concurrent apply could skew
        return (
            g.state.version - mark.version >= self.every_entries or now - mark.at >= self.interval_s
        )

    async def checkpoint(self, g: Group) -> bool:
        """One CAS attempt at the group's applied state; True when the object now has it."""
        st, index = g.state, g.applied  # consistent: both change only in one apply step
        mark = self._marks.setdefault(g, _Mark())
        obj = await self.lc.read_object(g.repo)
        if obj is not None and obj.state.incarnation > g.incarnation:
            self.rt.drop(g)
            return False
        if (
            obj is not None
            and obj.state.incarnation == g.incarnation
            and (obj.state.deleted or obj.state.version >= st.version)
        ):
            mark.version, mark.at = max(obj.state.version, mark.version), self.clock()
            return obj.state.version >= st.version
        if obj is None:
            return False  # the claim writes the object first; never create it here
        if st.deleted:
            await self.lc.finish_deletion(g.repo, st)
        else:
            try:
                await self.lc.store.put(state_key(g.repo), encode_state(st), if_match=obj.etag)
            except PreconditionFailed:
                return False  # changed meanwhile: try again next round
        mark.version, mark.at = st.version, self.clock()
        self.rt.compact(g, st, index)
        self.written += 1
        return True

    async def run(self) -> None:
        while not self._stopping:
            now = self.clock()
            for g in list(self.rt.groups.values()):
                if self.due(g, now):
                    try:
                        await self.checkpoint(g)
                    except EnrouteError as e:
                        log.warning("checkpoint of %s/%s failed: %s", g.repo, g.incarnation, e)
            for g in [g for g in self._marks if g.dropped]:
                del self._marks[g]
            with contextlib.suppress(TimeoutError):
                await asyncio.sleep(self.poll_s)

    def stop(self) -> None:
        self._stopping = True
