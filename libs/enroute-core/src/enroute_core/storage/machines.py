"""Resumable machines and their driver (seed 004, "Never waiting on the object store", Machines).

A machine is code whose reads depend on what it has read (tree walks, tag
peeling, segment diffs, the pack writer). Its contract with the driver:

1. :meth:`Machine.run` does all the work it can with local bytes and returns
   a :class:`Progress`: the items it parked, each under a :class:`Ticket`, and
   whether it is done. It never reads bytes it did not load (a read of bytes
   that are not local raises ``NotLocal``: "There is no fallback").
2. A ticket names everything its item needs: the layer entries of an object
   and its whole delta chain (:func:`entry_ticket`, computed from the table
   records, which are always local, so "a chain costs one round trip, not
   one per step"), and any awaitable event (a replay group finishing, budget
   being freed).
3. The driver (:func:`drive`) spawns each wait of each ticket as its own
   task, so loads progress while the machine computes; waiters for the same
   chunks share one fetch (the loader keeps one future per chunk).
4. A ticket is resumed as soon as all of its waits are done, without waiting
   for the others, and exactly once: the machine gets it back in
   :attr:`MachineContext.resumed` with the pins of its loads. Nothing is
   restarted or redone.
5. The machine runs on the blocking pool (an executor thread), never on the
   event loop, and never touches the object store: only the loader does.
6. "Disk budget", "Pins": the driver hands the pins to the machine, which
   releases them once it has read the bytes. If the drive fails, the driver
   releases every pin it still holds or handed over in the failing round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

from enroute_core.base.errors import MissingObject, NotLocal
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.storage.budgeted import LoadPins
from enroute_core.storage.layer.format import REF_EXTERNAL, REF_NONE
from enroute_core.storage.layer.reader import LayerReader
from enroute_core.storage.layers import LayerService

TICKETS_IN_FLIGHT_MAX = 65_536
RUNS_MAX = 1_000_000

Lookup = Callable[[ObjectId], tuple[LayerReader, int] | None]
"""Where an object of another layer is stored (a layer list lookup; metadata only)."""


@dataclass(frozen=True, slots=True)
class EntryLoad:
    """What a ticket needs local of one layer, named by its file name
    (:attr:`LayerReader.name`): entries by local index, and chunks a read found missing."""

    layer: str
    local_indexes: tuple[int, ...] = ()
    chunks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class Ticket:
    """A parked item and everything it waits for.

    ``events`` are awaitables of the driver's event loop (coroutines, or
    futures made with ``loop.create_future()`` there).
    """

    item: object
    loads: tuple[EntryLoad, ...] = ()
    events: tuple[Awaitable[object], ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class Resumed:
    """A ticket whose waits are all done; the machine releases ``pins`` after reading."""

    ticket: Ticket
    pins: LoadPins


@dataclass(frozen=True, slots=True)
class MachineContext:
    """What one run gets: the tickets resumed since the last run (each exactly once)."""

    resumed: tuple[Resumed, ...]
    run: int


@dataclass(frozen=True, slots=True)
class Progress:
    """The result of one run: newly parked tickets, and whether the machine is finished."""

    done: bool
    tickets: tuple[Ticket, ...] = ()


class Machine(Protocol):
    def run(self, ctx: MachineContext) -> Progress:
        """Work with local bytes only; park what needs other bytes (see the module docstring)."""
        ...


@dataclass(slots=True)
class DriveStats:
    runs: int = 0
    tickets: int = 0
    resumed: int = 0
    loads: int = 0
    peak_pending: int = 0
    resume_order: list[int] = field(default_factory=list)  # ticket numbers as resumed


def chain_of(
    reader: LayerReader, local_index: int, lookup: Lookup, *, limits: Limits = DEFAULT_LIMITS
) -> list[tuple[LayerReader, int]]:
    """An entry and its whole delta chain, from the table records (always local).

    The one home of the chain rule ("A chain costs one round trip, not one per
    step"): a base in this layer is a local index; a base in another layer is
    named by oid (external oid table) and found with ``lookup``. The view's
    body reads follow the same refs. Raises ``MissingObject`` for a base no
    layer holds, ``LimitExceeded`` past ``delta_chain_depth_max``.
    """
    out = [(reader, local_index)]
    cur, i = reader, local_index
    while True:
        ref = cur.entry_row(i)[2]
        if ref == REF_NONE:
            return out
        check_limit("delta_chain_depth_max", len(out), limits.delta_chain_depth_max)
        if ref & REF_EXTERNAL:
            oid = cur.ref_oid(ref)
            found = lookup(oid)
            if found is None:
                raise MissingObject(f"delta base {oid_to_hex(oid)} is in no layer", oid=oid.hex())
            cur, i = found
        else:
            i = ref
        out.append((cur, i))


def entry_loads(
    entries: Iterable[tuple[LayerReader, int]],
    lookup: Lookup,
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[EntryLoad, ...]:
    """``entries`` and all of their delta chains, grouped by layer; layers whose bytes
    are all here (inline, linked, complete without a budget) need nothing."""
    by_layer: dict[str, set[int]] = {}
    for reader, i in entries:
        for r, j in chain_of(reader, i, lookup, limits=limits):
            name = r.name
            if name is not None and not r.settled():
                by_layer.setdefault(name, set()).add(j)
    return tuple(EntryLoad(name, tuple(sorted(ix))) for name, ix in by_layer.items())


def entry_ticket(
    item: object,
    entries: Iterable[tuple[LayerReader, int]],
    lookup: Lookup,
    *,
    events: Sequence[Awaitable[object]] = (),
    limits: Limits = DEFAULT_LIMITS,
) -> Ticket:
    """A ticket for ``entries`` and all of their delta chains, grouped by layer."""
    return Ticket(item, entry_loads(entries, lookup, limits=limits), tuple(events))


def ticket_of(item: object, exc: NotLocal) -> Ticket:
    """A ticket for what a failed read names (:class:`NotLocal`): its entries with their
    chains, or the one chunk a read found missing (evicted between a load and the read,
    which pins rule out; loaded again all the same). A read that names nothing it needs
    cannot be resumed: it is a bug, and fails."""
    loads = tuple(EntryLoad(name, tuple(ix)) for name, ix in exc.loads)
    if not loads:
        name, chunk = exc.details.get("file"), exc.details.get("chunk")
        if not isinstance(name, str) or not isinstance(chunk, int):
            raise exc
        loads = (EntryLoad(name, (), (chunk,)),)
    return Ticket(item, loads)


class Restartable:
    """A step that loads first, for reads known only as it runs (seed 004, "Machines").

    ``step`` is pure over the view (planning a fetch, peeling tags, reading an API
    commit's trees): a run calls it; a read of bytes that are not local raises
    :class:`NotLocal` naming everything its level needs (a tree walk asks for a whole
    level at once), which is parked as one ticket; the next run calls ``step`` again
    with those bytes pinned. What was read before stays in the view's body cache, so
    a run re-reads nothing and one load round trip is taken per level. Pins are held
    until the step is done ("Phases that load first and read later hold their pins
    until done"), then released; at most ``rounds_max`` rounds.
    """

    def __init__(self, step: Callable[[], object], *, rounds_max: int) -> None:
        self._step = step
        self._rounds_max = rounds_max
        self._pins: list[LoadPins] = []
        self.rounds = 0
        self.result: object = None

    def run(self, ctx: MachineContext) -> Progress:
        self._pins.extend(r.pins for r in ctx.resumed)
        try:
            self.result = self._step()
        except NotLocal as exc:
            self.rounds += 1
            try:
                check_limit("read_load_rounds_max", self.rounds, self._rounds_max)
                return Progress(False, (ticket_of(self.rounds, exc),))
            except BaseException:
                self.release()
                raise
        except BaseException:
            self.release()
            raise
        self.release()
        return Progress(True)

    def release(self) -> None:
        pins, self._pins = self._pins, []
        for p in pins:
            p.release()


async def _wait(service: LayerService, ticket: Ticket, number: int) -> tuple[int, Resumed]:
    """Every wait of one ticket as its own task; all pins or none."""
    loads = [
        asyncio.create_task(
            service.load_named(ld.layer, local_indexes=ld.local_indexes, chunks=ld.chunks)
        )
        for ld in ticket.loads
    ]
    events = [asyncio.ensure_future(e) for e in ticket.events]
    results = await asyncio.gather(*loads, *events, return_exceptions=True)
    pins = [r for r in results[: len(loads)] if isinstance(r, LoadPins)]
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        for p in pins:
            p.release()
        raise failed
    return number, Resumed(ticket, LoadPins.join(pins))


async def drive(
    machine: Machine,
    service: LayerService,
    *,
    executor: Executor | None = None,
    tickets_in_flight_max: int = TICKETS_IN_FLIGHT_MAX,
    runs_max: int = RUNS_MAX,
) -> DriveStats:
    """Run ``machine`` to completion (numbered contract in the module docstring)."""
    loop = asyncio.get_running_loop()
    stats = DriveStats()
    pending: set[asyncio.Task[tuple[int, Resumed]]] = set()
    ready: list[Resumed] = []
    try:
        while True:
            check_limit("machine_runs_max", stats.runs + 1, runs_max)
            ctx = MachineContext(tuple(ready), stats.runs)
            progress = await loop.run_in_executor(executor, machine.run, ctx)
            ready = []
            stats.runs += 1
            for t in progress.tickets:
                in_flight = len(pending) + 1
                check_limit("machine_tickets_in_flight_max", in_flight, tickets_in_flight_max)
                pending.add(asyncio.create_task(_wait(service, t, stats.tickets)))
                stats.tickets += 1
                stats.loads += len(t.loads)
            stats.peak_pending = max(stats.peak_pending, len(pending))
            if progress.done:
                assert not pending, "a machine reported done with tickets parked"
                return stats
            assert pending, "a machine that is not done parked nothing: it can never resume"
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed: BaseException | None = None
            for task in done:
                exc = task.exception()
                if exc is not None:
                    failed = failed or exc
                    continue
                number, resumed = task.result()
                ready.append(resumed)
                stats.resume_order.append(number)
                stats.resumed += 1
            if failed is not None:
                raise failed  # a failed wait fails the drive; the except releases ``ready``
    except BaseException:
        for r in ready:
            r.pins.release()
        for task in pending:
            task.cancel()
        for res in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(res, tuple):
                res[1].pins.release()
        raise


__all__ = [
    "DriveStats",
    "EntryLoad",
    "Lookup",
    "Machine",
    "MachineContext",
    "Progress",
    "Restartable",
    "Resumed",
    "Ticket",
    "chain_of",
    "drive",
    "entry_loads",
    "entry_ticket",
    "ticket_of",
]
