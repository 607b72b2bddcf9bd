"""The asyncio driver of the ledger node: one loop over :class:`MultiRaft`.

docs/raft.md, "The caller's contract": the loop ticks every group at a fixed
interval (duty 3), steps peers' batches (duty 4) and works off each
:class:`NodeReady` in order (duty 5): persist every group's snapshot, entries
and hard state in ONE write batch made durable by the store's group commit,
only then send the per-peer batches, then apply committed entries through
``enroute_core.state.apply`` in order, answer ReadIndex reads, and advance.

Log entries carry an envelope of this runtime's own:

- empty: the no-op a new leader appends; applies nothing;
- ``G`` + request id (16) + u32 length + checkpoint + optional activate
  command: the genesis of an incarnation. The group's Raft bootstrap snapshot
  is empty for every founder (duty 2), so the state an incarnation starts from
  (the deleted state of E - 1, MISSING, or a checkpoint being restored)
  travels in its first entry. A genesis applies once; later ones are no-ops;
- ``C`` + request id (16) + encoded command. Ids make a duplicated forward
  apply once (duty 9).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    NotFound,
    ProposalDropped,
    Timeout,
    Unavailable,
)
from enroute_core.base.ids import Incarnation, LogIndex, NodeId, Term
from enroute_core.state import (
    MISSING,
    Activate,
    Change,
    Commit,
    LayerKind,
    NewLayer,
    Outcome,
    OutcomeCode,
    ReplaceLayers,
    RepoState,
    apply,
    decode_command,
    decode_state,
    encode_change,
    encode_command,
    encode_state,
)

from .multiraft import Batch, GroupId, MultiRaft, MultiRaftConfig, NodeReady
from .raft.config import RaftConfig, SplitMix64
from .raft.errors import StorageSignal
from .raft.storage import MemoryStorage, Storage
from .raft.types import (
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Role,
    Snapshot,
    SnapshotMetadata,
)
from .storage import GroupId as StoreGroupId
from .storage import LogStore, WriteBatch

log = logging.getLogger("enroute.ledger.runtime")

_GENESIS = b"G"
_COMMAND = b"C"
_ID_BYTES = 16
_SNAPSHOT_ROW = b"snapshot"
HISTORY_MAX = 4096
"""Applied changes kept per group for subscribers; older followers get a snapshot."""
_ENTRIES_CHUNK_BYTES = 8 << 20


class Transport(Protocol):
    def send(self, batch: Batch) -> None:
        """Queue a batch for its peer; never blocks (Raft tolerates a dropped batch)."""
        ...


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one proposal gave on this node: the proposer's answer."""

    version: int
    change: bytes
    outcome: Outcome
    state: RepoState


@dataclass(eq=False)
class Group:
    """One hosted incarnation: its Raft view, applied state and waiters."""

    gid: GroupId
    mem: MemoryStorage
    state: RepoState = MISSING
    born: bool = False
    applied: int = 1
    history: deque[tuple[int, bytes]] = field(default_factory=lambda: deque(maxlen=HISTORY_MAX))
    seen: set[bytes] = field(default_factory=set)
    proposals: dict[bytes, asyncio.Future[Applied]] = field(default_factory=dict)
    reads: dict[bytes, asyncio.Future[int]] = field(default_factory=dict)
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: bool = False

    @property
    def repo(self) -> str:
        return self.gid.repo.decode()

    @property
    def incarnation(self) -> int:
        return int(self.gid.incarnation)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


def store_gid(gid: GroupId) -> StoreGroupId:
    return StoreGroupId(gid.repo, int(gid.incarnation))


def genesis_entry(rid: bytes, base: RepoState, activate: Activate | None) -> bytes:
    cp = encode_state(base)
    cmd = b"" if activate is None else encode_command(activate)
    return _GENESIS + rid + struct.pack(">I", len(cp)) + cp + cmd


def command_entry(rid: bytes, command: bytes) -> bytes:
    return _COMMAND + rid + command


def inline_layer_of(entry: bytes, root: bytes, index: int) -> bytes:
    """The file of the inline layer ``root`` that the command entry ``entry`` added.

    Raises CorruptData(section="ledger-entry") when the entry adds no such layer.
    """
    if entry[:1] == _COMMAND:
        cmd = decode_command(entry[1 + _ID_BYTES :])
        added: tuple[NewLayer, ...] = ()
        if isinstance(cmd, Commit) and cmd.new_layer is not None:
            added = (cmd.new_layer,)
        elif isinstance(cmd, ReplaceLayers):
            added = tuple(out.layer for out in cmd.outputs)
        for layer in added:
            if layer.kind is LayerKind.INLINE and layer.root == root:
                return layer.data
    raise CorruptData(
        f"log entry {index} holds no inline layer {root.hex()[:16]}",
        section="ledger-entry",
        index=index,
    )


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    node_id: NodeId
    peers: tuple[NodeId, ...]
    tick_interval_s: float = 0.1
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    propose_timeout_s: float = 10.0

    @property
    def voters(self) -> frozenset[NodeId]:
        return frozenset((self.node_id, *self.peers))


class Runtime:
    """Owns the MultiRaft, the LogStore and every hosted group's applied state."""

    def __init__(
        self,
        config: RuntimeConfig,
        store: LogStore,
        *,
        clock: Callable[[], float],
        nonce: bytes,
        seed: int,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.transport: Transport | None = None
        self._nonce = nonce[:8].ljust(8, b"\0")
        self._ids = itertools.count(1)
        raft_cfg = RaftConfig(
            id=config.node_id,
            election_ticks=config.election_ticks,
            heartbeat_ticks=config.heartbeat_ticks,
        )
        self._pending_storage: dict[GroupId, Storage] = {}
        self.mr = MultiRaft(
            config.node_id,
            config.peers,
            self._storage_for,
            MultiRaftConfig(raft=raft_cfg),
            rand=SplitMix64(seed),
        )
        self.groups: dict[GroupId, Group] = {}
        self.by_repo: dict[str, Group] = {}
        self._drops: list[Group] = []
        self._compactions: list[tuple[Group, RepoState, int]] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self.on_unknown_group: Callable[[GroupId], None] | None = None
        self.on_applied: Callable[[Group, Applied | None], None] | None = None
        self.applied_entries = 0
        self.persist_rounds = 0
        self.proposals_total = 0
        self.compactions = 0
        self.snapshots_applied = 0

    # -- ids ---------------------------------------------------------------------------------

    def request_id(self) -> bytes:
        return self._nonce + next(self._ids).to_bytes(8, "big")

    # -- groups ------------------------------------------------------------------------------

    def _storage_for(self, gid: GroupId, voters: frozenset[NodeId]) -> Storage:
        return self._pending_storage.pop(gid)

    def _install(self, gid: GroupId, mem: MemoryStorage, applied: int) -> Group:
        self._pending_storage[gid] = mem
        self.mr.create_group(gid, self.config.voters, applied=LogIndex(applied))
        g = Group(gid, mem, applied=applied)
        self.groups[gid] = g
        cur = self.by_repo.get(g.repo)
        if cur is None or cur.incarnation < g.incarnation:
            self.by_repo[g.repo] = g
        return g

    def recover(self) -> list[Group]:
        """Rebuild every stored group (duty 8): log from disk, applied = the snapshot's index."""
        out: list[Group] = []
        for sg in sorted(self.store.groups()):
            gid = GroupId(sg.repo, Incarnation(sg.incarnation))
            meta = self.store.snapshot_meta(sg)
            data = self.store.state_get(sg, _SNAPSHOT_ROW)
            mem = MemoryStorage()
            if meta.index > 0:
                mem.apply_snapshot(Snapshot(meta, data or b""))
            first, last = self.store.first_index(sg), self.store.last_index(sg)
            lo = first
            while lo <= last:
                ents = self.store.entries(sg, lo, LogIndex(last + 1), _ENTRIES_CHUNK_BYTES)
                mem.append(ents)
                lo = LogIndex(ents[-1].index + 1)
            mem.set_hard_state(self.store.hard_state(sg))
            g = self._install(gid, mem, int(meta.index))
            if data:
                g.state = decode_state(data)
                g.born = True
            out.append(g)
        return out

    async def host(self, repo: str, incarnation: int, *, campaign: bool = False) -> Group:
        """Host the group of ``repo`` at ``incarnation`` as a founder (duty 2)."""
        gid = GroupId(repo.encode(), Incarnation(incarnation))
        g = self.groups.get(gid)
        if g is not None:
            return g
        meta = SnapshotMetadata(LogIndex(1), Term(1), ConfState(voters=self.config.voters))
        hs = HardState(Term(1), None, LogIndex(1))
        batch = WriteBatch()
        batch.install_snapshot(store_gid(gid), meta)
        batch.set_hard_state(store_gid(gid), hs)
        await asyncio.wrap_future(self.store.submit(batch))
        g = self.groups.get(gid)  # another caller may have won meanwhile
        if g is not None:
            return g
        mem = MemoryStorage()
        mem.apply_snapshot(Snapshot(meta))
        mem.set_hard_state(hs)
        g = self._install(gid, mem, 1)
        if campaign or not self.config.peers:
            self.mr.campaign(gid)
        self.wake()
        return g

    def drop(self, g: Group) -> None:
        """Stop hosting ``g`` (superseded or ended); done by the loop between Readies."""
        if g.dropped:
            return
        g.dropped = True
        self.groups.pop(g.gid, None)
        if self.by_repo.get(g.repo) is g:
            del self.by_repo[g.repo]
            rest = [o for o in self.groups.values() if o.repo == g.repo]
            if rest:
                self.by_repo[g.repo] = max(rest, key=lambda o: o.incarnation)
        err = NotFound("incarnation no longer hosted", repo=g.repo, incarnation=g.incarnation)
        futs: list[asyncio.Future[Applied] | asyncio.Future[int]] = [*g.proposals.values()]
        futs += g.reads.values()
        for fut in futs:
            if not fut.done():
                fut.set_exception(err)
        for _, w in g.waiters:
            if not w.done():
                w.set_exception(err)
        g.notify()
        self._drops.append(g)
        self.wake()

    # -- inputs ------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def step(self, batch: Batch) -> None:
        unknown = {gm.group for gm in batch.messages if gm.group not in self.groups}
        unknown |= {hb.group for hb in batch.heartbeats if hb.group not in self.groups}
        if unknown and self.on_unknown_group is not None:
            for gid in unknown:
                self.on_unknown_group(gid)
        self.mr.step(batch)
        self.wake()

    async def propose(self, g: Group, entry: bytes, rid: bytes, timeout_s: float) -> Applied:
        """Append ``entry`` and wait until it applied here (docs/rpc.md, Propose)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Applied] = loop.create_future()
        g.proposals[rid] = fut
        deadline = self.clock() + timeout_s
        self.proposals_total += 1
        try:
            await self._retry_dropped(lambda: self.mr.propose(g.gid, entry), g, deadline)
            self.wake()
            remaining = max(0.0, deadline - self.clock())
            try:
                return await asyncio.wait_for(asyncio.shield(fut), remaining)
            except TimeoutError:
                raise Timeout("proposal not applied in time; outcome unknown") from None
        finally:
            g.proposals.pop(rid, None)

    async def barrier(self, g: Group, timeout_s: float) -> None:
        """ReadIndex (DESIGN, "Read path"): learn the leader's commit index, wait to apply it."""
        loop = asyncio.get_running_loop()
        deadline = self.clock() + timeout_s
        while True:
            ctx = self.request_id()
            fut: asyncio.Future[int] = loop.create_future()
            g.reads[ctx] = fut
            try:
                await self._retry_dropped(
                    functools.partial(self.mr.read_index, g.gid, ctx), g, deadline
                )
                self.wake()
                remaining = deadline - self.clock()
                try:
                    index = await asyncio.wait_for(asyncio.shield(fut), min(1.0, remaining))
                except TimeoutError:
                    if self.clock() >= deadline:
                        raise Timeout("read barrier timed out") from None
                    continue  # a read may be dropped without an answer (duty 11)
            finally:
                g.reads.pop(ctx, None)
            await self.wait_applied(g, index, max(0.0, deadline - self.clock()))
            return

    async def wait_applied(self, g: Group, index: int, timeout_s: float) -> None:
        if g.applied >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.waiters.append((index, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise Timeout("not applied in time", index=index) from None

    async def wait_born(self, g: Group, timeout_s: float) -> None:
        deadline = self.clock() + timeout_s
        while not g.born:
            if g.dropped:
                raise NotFound("incarnation no longer hosted", repo=g.repo)
            ev = g.changed
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise Timeout("incarnation not started in time", repo=g.repo)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), remaining)

    async def _retry_dropped(self, op: Callable[[], None], g: Group, deadline: float) -> None:
        delay = 0.01
        while True:
            if g.dropped:
                raise NotFound("incarnation no longer hosted", repo=g.repo)
            try:
                op()
                return
            except ProposalDropped as e:
                if self.clock() + delay >= deadline:
                    raise Unavailable(f"no leader for {g.repo}: {e.message}", **e.details) from e
                self.wake()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.2)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        interval = self.config.tick_interval_s
        next_tick = self.clock() + interval
        while not self._stopping:
            await self._drain()
            now = self.clock()
            if now >= next_tick:
                self.mr.tick()
                next_tick = max(next_tick + interval, now)
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), next_tick - now)

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
            await self._handle(self.mr.ready())

    async def _do_drops(self) -> None:
        drops, self._drops = self._drops, []
        batch = WriteBatch()
        for g in drops:
            with contextlib.suppress(NotFound):
                self.mr.drop_group(g.gid)
            batch.drop_group(store_gid(g.gid))
        await asyncio.wrap_future(self.store.submit(batch))

    def compact(self, g: Group, state: RepoState, index: int) -> None:
        """Truncate the log up to ``index``, where ``state`` was applied and checkpointed.

        DESIGN, "Freezing the ledger": entries that inline layers pin stay readable.
        Done by the loop between Readies, as a snapshot at an applied index (duty 7).
        """
        self._compactions.append((g, state, index))
        self.wake()

    async def _do_compactions(self) -> None:
        work, self._compactions = self._compactions, []
        batch = WriteBatch()
        done: list[tuple[Group, SnapshotMetadata, bytes]] = []
        for g, st, idx in work:
            snap = g.mem.snapshot().metadata
            if g.dropped or idx <= snap.index or idx > g.applied or idx > g.mem.last_index():
                continue
            meta = SnapshotMetadata(LogIndex(idx), g.mem.term(LogIndex(idx)), snap.conf_state)
            data = encode_state(st)
            sg = store_gid(g.gid)
            batch.set_snapshot(sg, meta)
            batch.put_state(sg, _SNAPSHOT_ROW, data)
            batch.compact(sg, LogIndex(idx), keep=[p for p in st.pins() if p <= idx])
            done.append((g, meta, data))
        if not done:
            return
        await asyncio.wrap_future(self.store.submit(batch))
        for g, meta, data in done:
            if g.dropped:
                continue
            g.mem.create_snapshot(meta.index, meta.conf_state, data)
            g.mem.compact(meta.index)
        self.compactions += len(done)

    async def _handle(self, nr: NodeReady) -> None:
        live = [(gr, self.groups.get(gr.group)) for gr in nr.groups]
        # 1. persist every group in one durable batch (group commit)
        batch = WriteBatch()
        for gr, g in live:
            if g is None:
                continue
            rd, sg = gr.ready, store_gid(gr.group)
            if rd.snapshot is not None:
                batch.install_snapshot(sg, rd.snapshot.metadata)
                batch.clear_state(sg)
                batch.put_state(sg, _SNAPSHOT_ROW, rd.snapshot.data)
            if rd.entries:
                batch.append(sg, rd.entries)
            if rd.hard_state is not None:
                batch.set_hard_state(sg, rd.hard_state)
        if batch.ops:
            await asyncio.wrap_future(self.store.submit(batch))
            self.persist_rounds += 1
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
            for b in nr.batches:
                self.transport.send(b)
        # 3. apply, 4. serve reads
        for gr, g in live:
            if g is None or g.dropped:
                continue
            rd = gr.ready
            if rd.snapshot is not None and rd.snapshot.metadata.index > g.applied:
                self._apply_snapshot(g, rd.snapshot)
            for e in rd.committed_entries:
                if e.index <= g.applied:
                    continue
                self._apply_entry(g, e)
            for rs in rd.read_states:
                fut = g.reads.pop(rs.context, None)
                if fut is not None and not fut.done():
                    fut.set_result(int(rs.index))
            self._release_waiters(g)
        # 5. advance
        self.mr.advance(nr)

    def _release_waiters(self, g: Group) -> None:
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for index, fut in g.waiters:
            if fut.done():
                continue
            if g.applied >= index:
                fut.set_result(None)
            else:
                keep.append((index, fut))
        g.waiters = keep

    def _apply_snapshot(self, g: Group, snap: Snapshot) -> None:
        if snap.data:
            g.state = decode_state(snap.data)
            g.born = True
        g.applied = int(snap.metadata.index)
        g.history.clear()
        self.snapshots_applied += 1
        g.notify()

    def _apply_entry(self, g: Group, e: Entry) -> None:
        g.applied = int(e.index)
        self.applied_entries += 1
        if e.type is EntryType.CONF_CHANGE:
            self.mr.apply_conf_change(g.gid, ConfChange.decode(e.data))
            return
        data = e.data
        if not data:
            return
        kind, rid = data[:1], data[1 : 1 + _ID_BYTES]
        if rid in g.seen:
            return  # a duplicated forward: applied once (duty 9)
        g.seen.add(rid)
        body = data[1 + _ID_BYTES :]
        result: Applied | None
        try:
            if kind == _GENESIS:
                result = self._apply_genesis(g, body, int(e.index))
            elif kind == _COMMAND:
                result = self._apply_command(g, body, int(e.index))
            else:
                raise CorruptData("unknown log entry kind", section="ledger-entry")
        except EnrouteError as err:
            log.error("entry %s of %s/%s not applied: %s", e.index, g.repo, g.incarnation, err)
            outcome = Outcome(OutcomeCode.INVALID_ARGUMENT, str(err))
            result = Applied(g.state.version, b"", outcome, g.state)
        fut = g.proposals.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(result)
        if self.on_applied is not None:
            self.on_applied(g, result)

    def _apply_genesis(self, g: Group, body: bytes, index: int) -> Applied:
        if g.born:
            return Applied(g.state.version, b"", Outcome(OutcomeCode.EXISTS), g.state)
        if len(body) < 4:
            raise CorruptData("short genesis entry", section="ledger-entry")
        (n,) = struct.unpack(">I", body[:4])
        base = decode_state(body[4 : 4 + n])
        rest = body[4 + n :]
        g.born = True
        if not rest:
            g.state = base
            g.notify()
            return Applied(base.version, b"", Outcome(OutcomeCode.OK), base)
        cmd = decode_command(rest)
        if not isinstance(cmd, Activate):
            raise CorruptData("genesis carries no activate", section="ledger-entry")
        res = apply(base, cmd, log_index=index)
        return self._publish(g, res.change, prev=base, new=res.state)

    def _apply_command(self, g: Group, body: bytes, index: int) -> Applied:
        cmd = decode_command(body)
        res = apply(g.state, cmd, log_index=index)
        return self._publish(g, res.change, prev=g.state, new=res.state)

    def _publish(self, g: Group, change: Change, *, prev: RepoState, new: RepoState) -> Applied:
        encoded = encode_change(change)
        g.state = new
        if new.version != prev.version or new.incarnation != prev.incarnation:
            g.history.append((new.version, encoded))
        g.notify()
        return Applied(new.version, encoded, change.outcome, new)

    # -- inline layer bytes ---------------------------------------------------------------

    async def inline_layers(self, g: Group, state: RepoState) -> list[tuple[bytes, bytes]]:
        """(root, file) of every inline layer in ``state``'s manifest, from its pinned entry.

        DESIGN, "Repository state": a checkpoint names an inline layer by the log
        index that holds its bytes; a subscriber that starts from a checkpoint
        needs them. Pinned entries stay readable after compaction (duty 7).
        """
        wanted = [e for e in state.manifest if e.kind is LayerKind.INLINE]
        if not wanted:
            return []
        sg = store_gid(g.gid)
        out: list[tuple[bytes, bytes]] = []
        for e in wanted:
            try:
                entry = await asyncio.to_thread(self.store.entry, sg, e.pin)
            except StorageSignal as err:
                raise CorruptData(
                    f"the log entry pinned by inline layer {e.root.hex()[:16]} is gone",
                    section="ledger-entry",
                    index=int(e.pin),
                ) from err
            out.append((e.root, inline_layer_of(entry.data, e.root, int(e.pin))))
        return out

    # -- views for status ------------------------------------------------------------------

    def leader_of(self, g: Group) -> int | None:
        try:
            lead = self.mr.raw_node(g.gid).raft.lead
        except NotFound:
            return None
        return None if lead is None else int(lead)

    def is_leader(self, g: Group) -> bool:
        try:
            return self.mr.raw_node(g.gid).raft.role is Role.LEADER
        except NotFound:
            return False

    def campaign_all(self, groups: Iterable[Group]) -> None:
        for g in groups:
            with contextlib.suppress(EnrouteError):
                self.mr.campaign(g.gid)
        self.wake()
