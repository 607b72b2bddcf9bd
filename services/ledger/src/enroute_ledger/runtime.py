"""The asyncio driver of the ledger node: one loop over :class:`MultiRaft`.

docs/raft.md, "The caller's contract": the loop ticks every group at a fixed
interval (duty 3), steps peers' batches (duty 4) and works off each
:class:`NodeReady` in order (duty 5): persist every group's snapshot, entries
and hard state in ONE write batch made durable by the store's group commit,
only then send the per-peer batches, then apply committed entries through
``enroute_core.state.apply`` in order, answer ReadIndex reads, and advance.

The replicated part, what a committed entry does (the entry envelope, the
request id window, genesis, apply), is :mod:`enroute_ledger.machine`: pure, so
the seeded simulation (tests/sim/driver_sim.py) runs it with this driver over a
simulated store, network and clock. The driver's I/O goes through three small
interfaces: the store (:class:`LogStore`), the transport (:class:`Transport`)
and the clock (a callable). A Ready round is two synchronous halves
(:meth:`Runtime.begin_ready`, :meth:`Runtime.finish_ready`) with the store's
write between them; the asyncio loop only awaits that write.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from enroute_core.base.errors import CorruptData, EnrouteError, NotFound
from enroute_core.base.ids import Incarnation, LogIndex, NodeId
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_core.state import (
    RepoState,
)

from . import calls
from .client import Client, Ticket
from .group import Group
from .hosting import BLANK_ROW, Founder, Hosted, store_gid
from .machine import Applied, GroupMachine, encode_snapshot
from .multiraft import (
    Batch,
    GroupId,
    GroupMessage,
    GroupReady,
    Heartbeat,
    MultiRaft,
    MultiRaftConfig,
    NodeReady,
)
from .raft.config import RaftConfig, SplitMix64
from .raft.storage import MemoryStorage, Storage
from .raft.types import (
    ConfChange,
    Entry,
    EntryType,
    HardState,
    MessageType,
    Ready,
    Snapshot,
    SnapshotMetadata,
    payload_size_bytes,
)
from .storage import GroupId as StoreGroupId
from .storage import LogStore, WriteBatch
from .tracing import CommitTrace, Phases

log = logging.getLogger("enroute.ledger.runtime")

_SNAPSHOT_ROW = b"snapshot"
_ENTRIES_CHUNK_BYTES = 8 << 20
HIBERNATE_REPLAY_MAX = 64
"""Most entries after the group's snapshot for it to hibernate: a wake applies them
again (a group with more waits until a checkpoint compacts its log)."""
HIBERNATE_REPLAY_BYTES_MAX = 1 << 20
"""Most bytes of those entries: a wake decodes and applies them on the loop, so a few
pushes of 10,000 refs each (some 400 KB apiece) would make every wake cost what the
repository holds; such a group waits for a checkpoint too."""
ORPHAN_GROUPS_MAX = 4096
"""Groups not hosted yet whose peers' messages are kept until the node joins them."""
ORPHAN_BATCHES_MAX = 8
_EARLY_TYPES = frozenset({MessageType.APP, MessageType.HEARTBEAT})
"""What a leader may send before its own fsync (Runtime._send_early)."""


class Transport(Protocol):
    def send(self, batch: Batch) -> None:
        """Queue a batch for its peer; never blocks (Raft tolerates a dropped batch)."""
        ...


def _log_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("ledger store write failed: %r", fut.exception())


def _log_store_failure(fut: concurrent.futures.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("ledger store write failed: %r", fut.exception())


@dataclass(slots=True)
class ReadyRound:
    """One Ready between its two halves: taken and written, not yet durable."""

    nr: NodeReady
    live: list[tuple[GroupReady, Group | None]]
    batch: WriteBatch
    """What the store makes durable before :meth:`Runtime.finish_ready`."""
    batches: tuple[Batch, ...]
    """What is left to send once it is durable."""
    before: list[int]
    """Each group's applied index when the Ready was taken."""
    traced: list[Phases] | None = None


def hibernate_ticks(config: RuntimeConfig) -> int:
    """``hibernate_after_s`` in ticks (0: never)."""
    if config.hibernate_after_s <= 0:
        return 0
    return max(1, math.ceil(config.hibernate_after_s / config.tick_interval_s))


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    node_id: NodeId
    peers: tuple[NodeId, ...]
    tick_interval_s: float = 0.1
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    propose_timeout_s: float = 10.0
    propose_retry_s: float = 0.5
    """No apply within this (doubling up to PROPOSE_RETRY_MAX_S): propose the entry again."""
    dedup_window_entries: int = DEFAULT_LIMITS.ledger_dedup_window_entries
    """Log indexes an applied request id is remembered for; equal on every voter."""
    hibernate_after_s: float = 3.0
    """A group quiet this long gives up its Raft objects and applied state until it is
    needed again (docs/raft.md, "Hibernation"); 0: never."""

    @property
    def voters(self) -> frozenset[NodeId]:
        return frozenset((self.node_id, *self.peers))


class Runtime:
    """Owns the MultiRaft, the LogStore and every hosted group's applied state.

    The counters below are class-level zeros that an instance overrides as it counts;
    ``http.RUNTIME_COUNTERS`` names the ones exported as metrics.
    """

    orphans_stashed = 0
    orphans_replayed = 0
    ready_groups = 0
    early_applied = 0
    handle_s = 0.0
    persist_wait_s = 0.0
    ready_take_s = 0.0
    """Time in MultiRaft.ready() (collecting every dirty group's Ready)."""
    apply_s = 0.0
    """Time applying committed entries and answering proposers."""
    tick_s = 0.0
    step_s = 0.0
    """Time stepping peers' batches into the groups."""
    early_sent = 0
    """Leader messages sent before the leader's own fsync (docs/raft.md)."""
    store_commit_s = 0.0
    """Seconds the store spent in COMMIT (the WAL write and its fsync)."""
    store_queue_s = 0.0
    """Seconds batches waited in the store's queue before their round began."""
    send_queue_s = 0.0
    """Seconds peer batches waited in the transport's queue."""
    send_write_s = 0.0
    """Seconds spent writing peer batches to their streams."""
    applied_entries = 0
    persist_rounds = 0
    compactions = 0
    snapshots_applied = 0
    duplicates_skipped = 0
    """Applied entries whose request id the window already held: not applied twice."""
    leader_changes = 0
    """Times a hosted group learned a leader here (after an election or a restart)."""
    snapshots_received = 0
    """Snapshots received in chunks from a leader and stepped."""
    blank_joined = 0
    """Groups this node joined blank (or recovered still blank)."""
    blank_readmitted = 0
    """READMITs naming this node applied: groups where it counts again."""
    hibernations = 0
    """Groups hibernated here (docs/raft.md, "Hibernation")."""
    wakes = 0
    """Hibernated groups rebuilt from the log because something needed them."""
    subscriptions = 0
    """Subscribe streams opened here (docs/raft.md, "Parked subscriptions")."""
    subscriptions_ended = 0
    """Subscribe streams ended: by the subscriber (a compute evicting a view), or here."""
    follow_streams = 0
    """Follow calls opened here, one per compute (docs/rpc.md, Follow); each follow on
    one counts in ``subscriptions`` and ``subscriptions_ended`` as a Subscribe call does."""
    follow_streams_ended = 0
    """Follow calls ended: by the compute, a broken connection, or here."""
    propose_streams = 0
    """ProposeStream calls opened here (docs/rpc.md, ProposeStream)."""
    propose_streams_ended = 0
    """ProposeStream calls ended: by the compute, a broken connection, or here."""
    streamed_outcomes = 0
    """Outcomes of streamed proposals answered, applied or failed."""
    streamed_outcome_messages = 0
    """Messages those outcomes left in: outcomes per message shows the batching."""

    def __init__(
        self,
        config: RuntimeConfig,
        store: LogStore,
        *,
        clock: Callable[[], float],
        nonce: bytes,
        seed: int,
        blank_id: int = 0,
        blank_repos: Iterable[str] = (),
    ) -> None:
        """``blank_id`` non-zero: this node's disk was wiped (docs/raft.md, "A voter that
        lost its disk"); every group of a repository in ``blank_repos`` (those that
        existed when it came back) is joined blank under that id.

        ``store``, the transport (set later) and ``clock`` are the driver's only I/O:
        the seeded simulation gives it simulated ones (tests/sim/driver_sim.py)."""
        self.config = config
        self.blank_id = blank_id
        self.blank_repos = frozenset(blank_repos) if blank_id else frozenset()
        self.store = store
        self.clock = clock
        self.transport: Transport | None = None
        self.machine = GroupMachine(config.dedup_window_entries)
        self._pending_storage: dict[GroupId, Storage] = {}
        self.mr = self._multiraft(config, seed)
        self.trace = CommitTrace()
        """Where a commit's time goes (docs/raft.md, "Commit latency and throughput")."""
        self.client = Client(
            self.mr,
            self.machine,
            self.trace,
            node_id=int(config.node_id),
            nonce=nonce,
            retry_s=max(config.propose_retry_s, config.tick_interval_s),
        )
        """The client API's pure half; the coroutines are :mod:`enroute_ledger.calls`."""
        self._waker = self._wake_of  # one bound method shared by every Group
        self.hosted = Hosted()
        """Which groups this node hosts (:mod:`enroute_ledger.hosting`)."""
        self.groups = self.hosted.groups
        self.by_repo = self.hosted.by_repo
        self.founder = Founder(self, config.voters)
        self._drops: list[Group] = []
        self._compactions: list[tuple[Group, RepoState, int]] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self.on_unknown_group: Callable[[GroupId], None] | None = None
        self.on_applied: Callable[[Group, Applied | None], None] | None = None
        self.on_group_changed: Callable[[Group], None] | None = None
        """Called after a Ready applied to a group, made it leader here, or when it is dropped."""
        self.may_sleep: Callable[[Group], bool] | None = None
        """Asked before a quiet group hibernates; False keeps it awake a while longer
        (the checkpointer settles its state object first: checkpoints.py, "Quiet groups")."""
        self._orphans: dict[GroupId, list[Batch]] = {}
        self._unsynced: asyncio.Future[None] | None = None
        self._hs_later: dict[StoreGroupId, HardState] = {}
        self._hs_later_seen = False
        self._blank_groups: set[GroupId] = set()

    def _multiraft(self, config: RuntimeConfig, seed: int) -> MultiRaft:
        raft_cfg = RaftConfig(
            id=config.node_id,
            election_ticks=config.election_ticks,
            heartbeat_ticks=config.heartbeat_ticks,
        )
        mr = MultiRaft(
            config.node_id,
            config.peers,
            self._storage_for,
            # a node-level beat every third of an election timeout: enough to keep a
            # peer's liveness (timeout: election_ticks) and a third of the idle traffic
            MultiRaftConfig(
                raft=raft_cfg,
                liveness_interval_ticks=max(1, config.election_ticks // 3),
                hibernate_after_ticks=hibernate_ticks(config),
            ),
            rand=SplitMix64(seed),
        )
        mr.on_hibernate = self._hibernate_group
        mr.on_wake = self._wake_group
        return mr

    # -- groups ------------------------------------------------------------------------------

    def set_founding_voters(self, voters: frozenset[NodeId]) -> None:
        self.founder.set_founding_voters(voters)

    @property
    def founding(self) -> int:
        return self.founder.founding

    def _storage_for(self, gid: GroupId, voters: frozenset[NodeId]) -> Storage:
        return self._pending_storage.pop(gid)

    def install(
        self, gid: GroupId, mem: MemoryStorage, applied: int, blank: int = 0, repo: str = ""
    ) -> Group:
        """Make ``gid`` a hosted group over ``mem`` (founded, or recovered from the store);
        ``repo``, when given, is its name as the caller holds it (``Hosted.add``)."""
        self._pending_storage[gid] = mem
        self.mr.create_group(gid, self.founder.voters, applied=LogIndex(applied), blank=blank)
        if blank:
            self._blank_groups.add(gid)
            self.blank_joined += 1
        g = Group(gid, mem, applied=applied, waker=self._waker)
        self.hosted.add(g, repo or g.repo)
        stashed = self._orphans.pop(gid, None)
        if stashed:
            for b in stashed:
                self.orphans_replayed += len(b.messages) + len(b.heartbeats)
                self.mr.step(b)
        return g

    def groups_of(self, repo: str) -> list[Group]:
        return self.hosted.groups_of(repo)

    def forget_orphans(self, gid: GroupId) -> None:
        """The node will not host ``gid``: drop what its peers sent for it meanwhile."""
        self._orphans.pop(gid, None)

    def _load_log(self, sg: StoreGroupId) -> tuple[MemoryStorage, bytes]:
        """The group's durable log as the core reads it, and its snapshot payload."""
        meta = self.store.snapshot_meta(sg)
        data = self.store.state_get(sg, _SNAPSHOT_ROW) or b""
        mem = MemoryStorage()
        if meta.index > 0:
            mem.apply_snapshot(Snapshot(meta, data))
        first, last = self.store.first_index(sg), self.store.last_index(sg)
        lo = first
        while lo <= last:
            ents = self.store.entries(sg, lo, LogIndex(last + 1), _ENTRIES_CHUNK_BYTES)
            mem.append(ents)
            lo = LogIndex(ents[-1].index + 1)
        mem.set_hard_state(self.store.hard_state(sg))
        return mem, data

    def recover(self) -> list[Group]:
        """Rebuild every stored group (duty 8): log from disk, applied = the snapshot's index."""
        out: list[Group] = []
        for sg in sorted(self.store.groups()):
            gid = GroupId(sg.repo, Incarnation(sg.incarnation))
            mem, data = self._load_log(sg)
            row = self.store.state_get(sg, BLANK_ROW)
            blank = int.from_bytes(row, "big") if row else 0
            g = self.install(gid, mem, int(mem.snapshot().index), blank)
            self.machine.load_snapshot(g, data)
            out.append(g)
        return out

    # -- hibernation (docs/raft.md, "Hibernation") -----------------------------------------

    def _hibernate_group(self, gid: GroupId) -> bool:
        """The multi-Raft layer frees ``gid``'s Raft objects: free the applied state too.

        Refused while anything here still needs the group in memory: a proposal, read
        or waiter, a compaction queued, a blank mark, or an entry committed but not
        applied. A parked subscriber does not keep it awake (docs/raft.md, "Parked
        subscriptions"): it waits on the change event, which lives on the ``Group``
        and not in the freed part, with its own last sent version as its cursor; the
        next write wakes the group, and the apply sets the event.
        """
        g = self.groups.get(gid)
        if g is None or g.dropped or g.hibernated or gid in self._blank_groups:
            return False
        live = g._held()
        if live is None or live.proposals or live.reads or live.waiters:
            return False
        if g.applied != self.mr.commit_of(gid):
            return False
        if any(c[0] is g for c in self._compactions):
            return False
        if self.may_sleep is not None and not self.may_sleep(g):
            return False
        first, end = live.mem.snapshot().index + 1, g.applied + 1
        if end - first > HIBERNATE_REPLAY_MAX:
            return False  # a wake would apply too much again: wait for a checkpoint
        replay = live.mem.entries(LogIndex(first), LogIndex(end), 1 << 62)
        if payload_size_bytes(replay) > HIBERNATE_REPLAY_BYTES_MAX:
            return False  # the same, by bytes
        g._sleep()
        self.hibernations += 1
        return True

    def _wake_of(self, g: Group) -> None:
        """A hibernated group's state is needed: rebuild it with its Raft objects."""
        if g.dropped:
            raise NotFound("incarnation no longer hosted", repo=g.repo, incarnation=g.incarnation)
        self.mr.wake(g.gid)

    def _wake_group(self, gid: GroupId) -> Storage:
        """Rebuild a hibernated group's log view and applied state from the store.

        The state is the snapshot payload's, then every entry after it up to the
        applied index is applied again, without answering anyone (nobody waits on a
        hibernated group) and without conf changes (the Raft record keeps the
        members). Raises CorruptData when the log no longer reaches that index.
        """
        g = self.groups[gid]
        target = g.applied
        mem, data = self._load_log(store_gid(gid))
        g._awake(mem)
        g.born = False
        self.machine.load_snapshot(g, data)
        g.applied = int(mem.snapshot().index)
        if target > g.applied:
            if target > mem.last_index():
                raise CorruptData(
                    "the stored log ends before the applied index of a hibernated group",
                    section="ledger-entry",
                    index=target,
                )
            for e in mem.entries(LogIndex(g.applied + 1), LogIndex(target + 1), 1 << 62):
                self._apply_entry(g, e, replay=True)
        g.applied = max(g.applied, target)
        self.wakes += 1
        return mem

    # -- dropping a group ------------------------------------------------------------------

    def drop(self, g: Group) -> None:
        """Stop hosting ``g`` (superseded or ended); done by the loop between Readies."""
        if g.dropped:
            return
        g.dropped = True
        self.hosted.remove(g)
        self._blank_groups.discard(g.gid)
        err = NotFound("incarnation no longer hosted", repo=g.repo, incarnation=g.incarnation)
        # a hibernated group is not woken only to be dropped: nobody waits on it
        live = g._held()
        if live is not None:
            tickets: list[Ticket[Applied] | Ticket[int] | Ticket[None]] = [
                *live.proposals.values(),
                *live.reads.values(),
                *(t for _, t in live.waiters),
            ]
            for t in tickets:
                t.fail(err)
        g.notify()
        self._drops.append(g)
        if self.on_group_changed is not None:
            self.on_group_changed(g)
        self.wake()

    # -- inputs ------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def step(self, batch: Batch) -> None:
        groups = self.groups
        unknown = {gm.group for gm in batch.messages if gm.group not in groups}
        unknown |= {hb.group for hb in batch.heartbeats if hb.group not in groups}
        if unknown:
            batch = self._stash_orphans(batch, unknown)
            if self.on_unknown_group is not None:
                for gid in unknown:
                    self.on_unknown_group(gid)
        t = self.clock()
        trace = self.trace
        for gm in batch.messages:
            if gm.message.entries:
                trace.arrived(gm.group, t)
        self.mr.step(batch)
        self.step_s += self.clock() - t
        self.wake()

    def _stash_orphans(self, batch: Batch, unknown: set[GroupId]) -> Batch:
        """Keep what peers sent for groups not hosted yet, to step once they are.

        The first message of a new group (a vote request, the genesis append)
        arrives before this node has joined it; dropped, it would cost the
        group an election timeout. Bounded per group and in groups; a group
        that is never joined is forgotten (``forget_orphans``) or pushed out.
        """
        for gid in unknown:
            stash = self._orphans.get(gid)
            if stash is None:
                if len(self._orphans) >= ORPHAN_GROUPS_MAX:
                    del self._orphans[next(iter(self._orphans))]
                stash = self._orphans[gid] = []
            if len(stash) >= ORPHAN_BATCHES_MAX:
                del stash[0]
            stash.append(
                Batch(
                    batch.from_node,
                    batch.to_node,
                    tuple(gm for gm in batch.messages if gm.group == gid),
                    tuple(hb for hb in batch.heartbeats if hb.group == gid),
                )
            )
            self.orphans_stashed += 1
        return Batch(
            batch.from_node,
            batch.to_node,
            tuple(gm for gm in batch.messages if gm.group not in unknown),
            tuple(hb for hb in batch.heartbeats if hb.group not in unknown),
            tuple(hb for hb in batch.heartbeat_responses if hb.group not in unknown),
        )

    # -- the client API: enroute_ledger.client (pure), enroute_ledger.calls (coroutines) -----

    async def wait_applied(self, g: Group, index: int, timeout_s: float) -> None:
        """Wait until ``g`` applied ``index`` here (:func:`calls.wait_applied`)."""
        await calls.wait_applied(self, g, index, timeout_s)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        interval = self.config.tick_interval_s
        next_tick = self.clock() + interval
        while not self._stopping:
            await self._drain()
            now = self.clock()
            if now >= next_tick:
                self.tick()
                self.tick_s += self.clock() - now
                # A loop that ran late (CPU starvation, a GC pause, a long Ready round)
                # ticks once for the time it did not run and then waits a whole interval,
                # in which the transport steps what arrived meanwhile: time this process
                # did not run says nothing about a leader (docs/raft.md, "Elections
                # under CPU starvation"). It used to tick twice back to back.
                late = now >= next_tick + interval
                next_tick = now + interval if late else next_tick + interval
                continue
            self._wake.clear()
            # asyncio.timeout, not wait_for: no task per tick (an idle ledger waits here
            # ten times a second; docs/services.md, "The fixed cost of a request")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(next_tick - now):
                    await self._wake.wait()

    def tick(self) -> None:
        """One tick of every group; held commit indexes that no batch carried for a whole
        tick are written alone (one that just came would only delay the next entries)."""
        if self._hs_later and self._hs_later_seen:
            batch = WriteBatch()
            self._write_later(batch)
            self.store.submit(batch).add_done_callback(_log_store_failure)
        self._hs_later_seen = bool(self._hs_later)
        self.mr.tick()

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    async def _drain(self) -> None:
        while True:
            if self._drops:
                await self._do_drops()
            if self._compactions:
                await self._do_compactions()
            if not self.mr.has_ready():
                return
            t = self.clock()
            nr = self.mr.ready()
            self.trace.ready_t = t2 = self.clock()
            self.ready_take_s += t2 - t
            self.ready_groups += len(nr.groups)
            await self._handle(nr)
            self.handle_s += self.clock() - t

    async def _do_drops(self) -> None:
        batch = self.drop_batch()
        if batch is not None:
            await asyncio.wrap_future(self.store.submit(batch))

    def drop_batch(self) -> WriteBatch | None:
        """The groups :meth:`drop` queued, out of the Raft maps now, and the write that
        takes them off the disk (None: none queued). Done between Readies."""
        if not self._drops:
            return None
        drops, self._drops = self._drops, []
        batch = WriteBatch()
        for g in drops:
            self._hs_later.pop(store_gid(g.gid), None)
            with contextlib.suppress(NotFound):
                self.mr.drop_group(g.gid)
            batch.drop_group(store_gid(g.gid))
        return batch

    def compact(self, g: Group, state: RepoState, index: int) -> None:
        """Truncate the log up to ``index``, where ``state`` was applied and checkpointed.

        DESIGN, "Freezing the ledger": entries that inline layers pin stay readable.
        Done by the loop between Readies, as a snapshot at an applied index (duty 7).
        """
        self._compactions.append((g, state, index))
        self.wake()

    async def _do_compactions(self) -> None:
        batch, done = self.compaction_batch()
        if done:
            await asyncio.wrap_future(self.store.submit(batch))
            self.compacted(done)

    def compaction_batch(self) -> tuple[WriteBatch, list[tuple[Group, SnapshotMetadata, bytes]]]:
        """The queued compactions as one write (see :meth:`compact`), and what each is."""
        work, self._compactions = self._compactions, []
        batch = WriteBatch()
        done: list[tuple[Group, SnapshotMetadata, bytes]] = []
        upto: dict[Group, int] = {}  # compacted to in this batch: the log's snapshot lags
        for g, st, idx in work:
            if g.dropped:
                continue  # (a dropped group is never woken to read its log)
            snap = g.mem.snapshot().metadata
            if idx <= max(snap.index, upto.get(g, 0)) or idx > min(g.applied, g.mem.last_index()):
                continue
            upto[g] = idx
            cs = snap.conf_state  # the members at idx: the conf changes up to it applied
            for e in g.mem.entries(LogIndex(snap.index + 1), LogIndex(idx + 1), 1 << 62):
                if e.type is EntryType.CONF_CHANGE:
                    cs = ConfChange.decode(e.data).applied_to(cs)
            meta = SnapshotMetadata(LogIndex(idx), g.mem.term(LogIndex(idx)), cs)
            data = encode_snapshot(st, self.machine.window_at(g, idx))
            sg = store_gid(g.gid)
            batch.set_snapshot(sg, meta)
            batch.put_state(sg, _SNAPSHOT_ROW, data)
            batch.compact(sg, LogIndex(idx), keep=[p for p in st.pins() if p <= idx])
            done.append((g, meta, data))
        if done:
            self._write_later(batch)  # the durable commit index never falls below a snapshot
        return batch, done

    def compacted(self, done: list[tuple[Group, SnapshotMetadata, bytes]]) -> None:
        """The compaction batch is durable: compact the in-memory logs too."""
        for g, meta, data in done:
            if g.dropped:
                continue
            g.mem.create_snapshot(meta.index, meta.conf_state, data)
            g.mem.compact(meta.index)
        self.compactions += len(done)

    async def _handle(self, nr: NodeReady) -> None:
        """One Ready round: the synchronous halves with the store's write between them."""
        rnd = self.begin_ready(nr)
        if rnd.batch.ops:
            await self._persist(rnd.batch, sync=nr.must_sync)
        self.finish_ready(rnd)

    def begin_ready(self, nr: NodeReady) -> ReadyRound:
        """Step 1 of a Ready (duty 5): the write batch of every group, in one round.

        Also sends what a leader may send before its own fsync (:meth:`_send_early`)
        and applies what was durable before this round (:meth:`_apply_durable`), when
        the batch must sync. The caller makes ``batch`` durable (``store.submit``),
        then calls :meth:`finish_ready`.
        """
        live = [(gr, self.groups.get(gr.group)) for gr in nr.groups]
        batch = self._ready_batch(nr, live)
        rnd = ReadyRound(
            nr, live, batch, nr.batches, [0 if g is None else g.applied for _, g in live]
        )
        if self.trace.tracing:
            rnd.traced = self.trace.appended(e for gr, _ in live for e in gr.ready.entries)
        if batch.ops and nr.must_sync:
            if self.transport is not None:
                rnd.batches = self._send_early(live, rnd.batches)
            self._apply_durable(live)
        return rnd

    def _ready_batch(
        self, nr: NodeReady, live: list[tuple[GroupReady, Group | None]]
    ) -> WriteBatch:
        """Every group's snapshot, entries and hard state in one batch (group commit); a
        hard state that moves only the commit index waits for the next batch
        (:meth:`_write_later`)."""
        batch = WriteBatch()
        later = self._hs_later
        for gr, g in live:
            if g is None:
                continue
            rd, sg = gr.ready, store_gid(gr.group)
            if rd.snapshot is not None:
                later.pop(sg, None)
                batch.install_snapshot(sg, rd.snapshot.metadata)
                batch.clear_state(sg)
                batch.put_state(sg, _SNAPSHOT_ROW, rd.snapshot.data)
                blank = self.blank_of(g)
                if blank:  # still blank: the mark survives the snapshot
                    batch.put_state(sg, BLANK_ROW, blank.to_bytes(8, "big"))
            if rd.entries:
                batch.append(sg, rd.entries)
            if rd.hard_state is not None:
                if nr.must_sync:
                    later.pop(sg, None)
                    batch.set_hard_state(sg, rd.hard_state)
                else:
                    later[sg] = rd.hard_state
        if nr.must_sync and later:
            self._write_later(batch)
        return batch

    def finish_ready(self, rnd: ReadyRound) -> None:
        """Steps 2 to 5 of a Ready, once its batch is durable: send, apply, serve reads,
        advance."""
        live = rnd.live
        self.trace.persisted(
            rnd.traced, (gr.group for gr, _ in live if gr.ready.entries), self.clock()
        )
        for gr, g in live:
            if g is None:
                continue
            rd = gr.ready
            if rd.snapshot is not None:
                g.mem.apply_snapshot(rd.snapshot)
            g.mem.append(rd.entries)
            if rd.hard_state is not None:
                g.mem.set_hard_state(rd.hard_state)
        # 2. send, only now that it is durable
        if self.transport is not None:
            for b in rnd.batches:
                self.transport.send(b)
        # 3. apply, 4. serve reads
        t_apply = self.clock()
        for (gr, g), applied_before in zip(live, rnd.before, strict=True):
            if g is not None and not g.dropped:
                self._apply_ready(g, gr.ready, applied_before)
        self.apply_s += self.clock() - t_apply
        # 5. advance
        self.mr.advance(rnd.nr)

    def _apply_ready(self, g: Group, rd: Ready, applied_before: int) -> None:
        """Apply one group's snapshot and committed entries, answer its reads."""
        if rd.snapshot is not None and rd.snapshot.metadata.index > g.applied:
            self._apply_snapshot(g, rd.snapshot)
        for e in rd.committed_entries:
            if e.index <= g.applied:
                continue
            self._apply_entry(g, e)
        for rs in rd.read_states:
            read = g.reads.pop(rs.context, None)
            if read is not None:
                read.set(int(rs.index))
        if g.waiters:
            self._release_waiters(g)
        led = rd.soft_state is not None and rd.soft_state.lead == self.config.node_id
        changed = self.on_group_changed
        if changed is not None and (g.applied != applied_before or led):
            changed(g)
        if rd.soft_state is not None and rd.soft_state.lead is not None:
            self.leader_changes += 1
            g.notify()  # proposals waiting for a leader try again now

    def _write_later(self, batch: WriteBatch) -> None:
        """Add the commit-index-only hard states held back to ``batch``.

        Contract 5 lets a crash lose a commit index (it is learned again), so a Ready
        that only moves commit indexes writes nothing: its hard states ride with the
        next batch (the next Ready that must sync, a compaction), or at the next tick
        when nothing else was written, instead of costing a write round of their own.
        A compaction always carries them, so the durable commit index is never below
        the snapshot's index at a restart.
        """
        later, self._hs_later = self._hs_later, {}
        for sg, hs in later.items():
            batch.set_hard_state(sg, hs)

    def _send_early(
        self, live: list[tuple[GroupReady, Group | None]], batches: tuple[Batch, ...]
    ) -> tuple[Batch, ...]:
        """Send a leader's appends and heartbeats now, in parallel with its own fsync.

        The exception to "persist, then send" that etcd allows a leader (docs/raft.md,
        "The ledger runtime's loop"): an APP or HEARTBEAT of a term that is already
        durable here promises nothing about this node's unsynced writes. Followers may
        acknowledge the entries before the leader's copy is durable, so the commit index
        may count a copy that is not, but nothing reveals it before it is: entries are
        applied, and a commit index sent, only by a later Ready, and the next Ready is
        taken only after this one is durable. Votes, acknowledgements and anything of a
        term or vote not yet durable still wait. Returns what is left to send after the
        fsync.
        """
        transport = self.transport
        assert transport is not None
        durable: dict[GroupId, int] = {}
        for gr, g in live:
            if g is not None and gr.ready.snapshot is None:
                durable[gr.group] = int(g.mem.hard_state.term)
        if not durable:
            return batches
        late: list[Batch] = []
        for b in batches:
            now_m: list[GroupMessage] = []
            rest_m: list[GroupMessage] = []
            for gm in b.messages:
                m = gm.message
                early = m.type in _EARLY_TYPES and not m.blank
                if early and durable.get(gm.group, -1) == m.term:
                    now_m.append(gm)
                else:
                    rest_m.append(gm)
            now_h: list[Heartbeat] = []
            rest_h: list[Heartbeat] = []
            for hb in b.heartbeats:
                (now_h if durable.get(hb.group, -1) == hb.term else rest_h).append(hb)
            if not now_m and not now_h:
                late.append(b)
                continue
            transport.send(Batch(b.from_node, b.to_node, tuple(now_m), tuple(now_h)))
            self.early_sent += len(now_m) + len(now_h)
            if rest_m or rest_h or b.heartbeat_responses:
                late.append(
                    Batch(b.from_node, b.to_node, tuple(rest_m), tuple(rest_h),
                          b.heartbeat_responses)
                )  # fmt: skip
        return tuple(late)

    def _apply_durable(self, live: list[tuple[GroupReady, Group | None]]) -> None:
        """Apply what is committed and already durable here before this Ready's fsync.

        An entry the log holds on disk from an earlier round and that this Ready
        does not rewrite is durable here and on a quorum, so its answer needs no
        wait for the writes of other groups in this round (docs/raft.md, duty 5:
        the order persist, send, apply binds what the Ready itself brings). A
        single voter commits entries in the Ready that first persists them: those
        wait for the fsync as before.
        """
        for gr, g in live:
            if g is None or g.dropped:
                continue
            rd = gr.ready
            if rd.snapshot is not None or not rd.committed_entries:
                continue
            durable = int(g.mem.last_index())
            if rd.entries:
                durable = min(durable, int(rd.entries[0].index) - 1)
            for e in rd.committed_entries:
                if e.index > durable:
                    break
                if e.index > g.applied:
                    self._apply_entry(g, e)
                    self.early_applied += 1

    async def _persist(self, batch: WriteBatch, *, sync: bool) -> None:
        """Step 1 of a Ready: durable before anything is sent or applied when ``sync``.

        A Ready that must not sync (docs/raft.md duty 5) changes only commit
        indexes, which a crash may lose (they are learned again): its batch is
        queued behind the earlier ones and this Ready goes on at once, so the
        fsync of a commit index is off the path of the answer. At most two such
        batches are in flight; a failure is sticky in the store, so the next
        Ready that must sync fails too.
        """
        self.persist_rounds += 1
        t = self.clock()
        prev, self._unsynced = self._unsynced, None
        # submitted at once, so the store may take both into one round (one fsync);
        # it makes them durable in submission order
        fut = asyncio.wrap_future(self.store.submit(batch))
        if sync:
            await fut
        else:
            fut.add_done_callback(_log_failure)
            self._unsynced = fut
            if prev is not None and not prev.done():
                await prev
        self.persist_wait_s += self.clock() - t
        store, transport = self.store, self.transport
        self.store_commit_s = float(getattr(store, "commit_seconds", 0.0))
        self.store_queue_s = float(getattr(store, "queue_seconds", 0.0))
        self.send_queue_s = float(getattr(transport, "queue_seconds", 0.0))
        self.send_write_s = float(getattr(transport, "write_seconds", 0.0))

    def _release_waiters(self, g: Group) -> None:
        keep: list[tuple[int, Ticket[None]]] = []
        for index, t in g.waiters:
            if t.done:
                continue
            if g.applied >= index:
                t.set(None)
            else:
                keep.append((index, t))
        g.waiters = keep

    def _apply_snapshot(self, g: Group, snap: Snapshot) -> None:
        self.machine.load_snapshot(g, snap.data)
        g.applied = int(snap.metadata.index)
        g.history.clear()
        self._answer_from_window(g)
        self.snapshots_applied += 1
        g.notify()

    def _apply_entry(self, g: Group, e: Entry, *, replay: bool = False) -> None:
        """Apply one committed entry; ``replay``: again, on a group woken from hibernation
        (no counters, no callbacks, no conf change: the Raft record kept the members)."""
        g.applied = int(e.index)
        if e.type is EntryType.CONF_CHANGE:
            if not replay:
                self.applied_entries += 1
                self._apply_conf_change(g, ConfChange.decode(e.data))
            return
        if not replay:
            self.applied_entries += 1
        if not e.data:
            return
        snap_index = int(g.mem.snapshot().metadata.index)
        res = self.machine.apply(g, e.data, int(e.index), snap_index)
        if res.duplicate:
            self.duplicates_skipped += not replay
        else:
            g.notify()
        p = g.proposals.pop(res.rid, None)
        if p is not None and not p.done:
            if not res.duplicate:
                self.trace.applied(res.rid, self.clock())
            p.set(res.applied)
        if self.on_applied is not None and not replay and not res.duplicate:
            self.on_applied(g, res.applied)

    def _apply_conf_change(self, g: Group, cc: ConfChange) -> None:
        """A committed membership change, or a READMIT naming a blank voter."""
        self.mr.apply_conf_change(g.gid, cc)
        if g.gid in self._blank_groups and not self.blank_of(g):
            self._readmitted(g)

    # -- blank groups (docs/raft.md, "A voter that lost its disk") -------------------------

    def blank_of(self, g: Group) -> int:
        """The blank id this node still has in ``g`` (0: it votes and counts)."""
        if g.gid not in self._blank_groups:
            return 0
        try:
            return int(self.mr.raw_node(g.gid).raft.blank)
        except NotFound:
            return 0

    @property
    def blank_groups(self) -> int:
        """Hosted groups where this node is still blank."""
        return len(self._blank_groups)

    def _readmitted(self, g: Group) -> None:
        """A READMIT naming this node applied: drop the mark (written after the entry
        committed, so a crash before it lands only makes the node blank once more)."""
        self._blank_groups.discard(g.gid)
        self.blank_readmitted += 1
        log.warning(
            "readmitted to %s/%s: node %s votes and counts there again (%d groups still blank)",
            g.repo,
            g.incarnation,
            self.config.node_id,
            len(self._blank_groups),
        )
        batch = WriteBatch()
        batch.delete_state(store_gid(g.gid), BLANK_ROW)
        self.store.submit(batch).add_done_callback(_log_store_failure)

    # -- the request id window (docs/raft.md, "Applying each id once") -------------------

    def _answer_from_window(self, g: Group) -> None:
        """After a snapshot: answer the waiters whose entry it already holds."""
        machine = self.machine
        for rid in [r for r in g.proposals if machine.duplicate(g, r, g.applied + 1)]:
            first = machine.duplicate(g, rid, g.applied + 1)
            p = g.proposals.pop(rid)
            if first is not None:
                p.set(machine.answer(g, first))

    # -- views for status ------------------------------------------------------------------

    @property
    def snapshots_sent(self) -> int:
        """Snapshots the transport delivered to peers in chunks (SendSnapshot)."""
        return int(getattr(self.transport, "snapshots_sent", 0))

    @property
    def snapshots_send_failed(self) -> int:
        """Snapshot transfers that failed (the leader retries them later)."""
        return int(getattr(self.transport, "snapshots_failed", 0))

    @property
    def store_round_s(self) -> float:
        """Seconds the store spent in write rounds (each ends in one fsync); 0 if untimed."""
        return float(getattr(self.store, "round_seconds", 0.0))

    def apply_lag_entries(self) -> int:
        """The most committed-but-unapplied entries of any hosted group (O(groups))."""
        lag = 0
        for g in self.groups.values():
            lag = max(lag, self.mr.commit_of(g.gid) - g.applied)
        return lag

    def leader_of(self, g: Group) -> int | None:
        """The leader known here (a hibernated group is not woken)."""
        lead = self.mr.lead_of(g.gid)
        return None if lead is None else int(lead)

    def is_leader(self, g: Group) -> bool:
        return self.mr.is_leader(g.gid)

    def campaign_all(self, groups: Iterable[Group]) -> None:
        for g in groups:
            with contextlib.suppress(EnrouteError):
                self.mr.campaign(g.gid)
        self.wake()
