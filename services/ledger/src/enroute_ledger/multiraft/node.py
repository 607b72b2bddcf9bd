"""One ledger node hosting the Raft group of every repository incarnation.

DESIGN.md, Processes (multi-Raft, as TiKV and CockroachDB do it): every
member hosts every group, traffic between two nodes travels as one batch per
Ready, heartbeats are coalesced into it, and idle groups go quiet. Pure like
the core: the driver owns the clock, the disk and the network.

Scenarios the code keeps (docs/raft.md, duty 12):

1. An idle leader group (everyone holds and acknowledged the log, nothing
   pending) is quiesced on a tick: one heartbeat marked ``quiesce`` goes to
   each follower, which stops ticking. Quiet groups are out of the active
   set, so a tick costs O(active groups + peers).
2. Any proposal, read, transfer or waking message puts a group back in the
   active set.
3. Node liveness replaces per-group heartbeats of quiet groups: every batch,
   even an empty beat sent every ``liveness_interval_ticks``, proves its
   sender alive. A peer not heard from for ``liveness_timeout_ticks`` (or
   reported by the driver) is down: every quiet awake group it leads is woken
   here so its followers can elect. A hibernated one is not: it has no work
   waiting, and the work that wakes it (a proposal, a read, a peer's vote
   request) also makes it keep time, so it elects then (docs/raft.md,
   "A leader down or stopped").
4. A node leading more than ``ceil(groups / live nodes) + slack`` groups
   hands some to the least-loaded live peer that holds the whole log,
   at most ``transfers_per_tick_max`` per tick.
5. A peer heard from again after it was down may have lost its disk: every
   quiet group led here wakes and heartbeats it (one pass per recovery).
6. Hibernation (docs/raft.md, "Hibernation"): a group quiet for
   ``hibernate_after_ticks`` whose every write is durable and applied gives up
   its Raft objects and keeps a :class:`Hibernation` record; the driver frees
   its own state too (``on_hibernate``). Anything that needs the group (a
   message, a proposal, a read, a transfer, a liveness event, ``raw_node``)
   rebuilds it first from the durable log the driver hands back (``on_wake``).
7. At most ``campaigns_per_tick_max`` groups time out and campaign per tick
   (docs/raft.md, "Elections under CPU starvation"): a leader that stalls
   for an election timeout (a starved process, a GC pause, a long Ready
   round) times out every awake group it leads at once, and thousands of
   elections in one round make the next round late too. A group over the
   budget keeps its clock at the edge of its timeout and campaigns on a
   later tick, unless its leader's heartbeat resets it meanwhile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from enroute_core.base.errors import AlreadyExists, InvalidArgument, LimitExceeded, NotFound
from enroute_core.base.ids import LogIndex, NodeId

from ..raft.config import RaftConfig, RandomSource, SplitMix64
from ..raft.rawnode import RawNode
from ..raft.storage import Storage
from ..raft.types import ConfChange, ConfState, Hibernation, Message, MessageType, Role
from .types import Batch, GroupId, GroupMessage, GroupReady, Heartbeat, NodeReady

StorageFactory = Callable[[GroupId, frozenset[NodeId]], Storage]
HibernateHook = Callable[[GroupId], bool]
"""The driver agrees to free ``group`` (True) after releasing its own state of it."""
WakeHook = Callable[[GroupId], Storage]
"""The driver rebuilds its state of ``group`` and returns the group's durable log."""
_ZERO_INDEX = LogIndex(0)


@dataclass(frozen=True, slots=True)
class MultiRaftConfig:
    """Node-level settings; ``raft`` is every group's core config (its id is this node)."""

    raft: RaftConfig
    liveness_interval_ticks: int = 1
    liveness_timeout_ticks: int = 0  # 0: the core's election_ticks
    leader_slack: int = 1
    transfers_per_tick_max: int = 8
    transfer_candidates_per_tick_max: int = 64
    groups_max: int = 1 << 20
    hibernate_after_ticks: int = 0
    """Quiet this many ticks: free the group's Raft objects (0: never)."""
    hibernations_per_tick_max: int = 1024
    campaigns_per_tick_max: int = 64
    """Elections this node starts in one tick (scenario 7); a group past its timeout
    beyond it waits at the edge of its timeout for a later tick."""
    quiet_commit: bool = True
    """Run every group's core with ``RaftConfig.quiet_commit``: sound here since an idle
    leader quiesces at its next Ready and the quiesce heartbeat carries the commit."""

    def __post_init__(self) -> None:
        for name in (
            "liveness_interval_ticks",
            "transfers_per_tick_max",
            "transfer_candidates_per_tick_max",
            "groups_max",
            "hibernations_per_tick_max",
            "campaigns_per_tick_max",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive")
        if self.liveness_timeout_ticks < 0 or self.leader_slack < 0:
            raise InvalidArgument("liveness_timeout_ticks and leader_slack must be >= 0")
        if self.hibernate_after_ticks < 0:
            raise InvalidArgument("hibernate_after_ticks must be >= 0")

    @property
    def liveness_timeout(self) -> int:
        return self.liveness_timeout_ticks or self.raft.election_ticks


@dataclass(slots=True)
class MultiRaftStats:
    """Counters for tests and /metrics; never read by the logic."""

    group_ticks: int = 0
    quiesced: int = 0
    batches_out: int = 0
    beats_out: int = 0
    heartbeats_out: int = 0
    messages_out: int = 0
    batches_dropped: int = 0
    messages_dropped: int = 0
    nodes_down: int = 0
    nodes_up: int = 0
    transfers: int = 0
    campaigns: int = 0
    campaigns_deferred: int = 0
    hibernated: int = 0
    woken: int = 0


class MultiRaft:
    def __init__(
        self,
        node_id: NodeId,
        peers: Iterable[NodeId],
        storage_factory: StorageFactory,
        config: MultiRaftConfig,
        rand: RandomSource | None = None,
    ) -> None:
        if config.raft.id != node_id:
            raise InvalidArgument("config id is not the node id", id=config.raft.id)
        self.id = node_id
        self.peers: tuple[NodeId, ...] = tuple(sorted(set(peers) - {node_id}))
        if config.quiet_commit != config.raft.quiet_commit:
            raft = dataclasses.replace(config.raft, quiet_commit=config.quiet_commit)
            config = dataclasses.replace(config, raft=raft)
        self.config = config
        self.stats = MultiRaftStats()
        self._factory = storage_factory
        self._rand = rand if rand is not None else SplitMix64(node_id)
        self._nodes: dict[GroupId, RawNode] = {}
        self._storages: dict[GroupId, Storage] = {}
        self._sleeping: dict[GroupId, Hibernation] = {}
        self._quiet: dict[GroupId, int] = {}  # quiet since tick: hibernation candidates
        self._freed = 0  # hibernations since the maps of awake groups were last rebuilt
        # hibernated groups a liveness event wakes, a bounded number per tick: each wake
        # reads the store, and a peer down may have led a third of all groups
        self._to_wake: dict[GroupId, None] = {}
        self.on_hibernate: HibernateHook | None = None
        self.on_wake: WakeHook | None = None
        # dicts as ordered sets: iteration order must not depend on hash seeds
        self._active: dict[GroupId, None] = {}
        self._dirty: dict[GroupId, None] = {}
        self._lead: dict[GroupId, NodeId] = {}  # awake groups; a sleeping one's is its record's
        # the groups led here, for what concerns peers (spreading, a peer down or back):
        # a voter without peers keeps none (issue 19: one entry per idle repository)
        self._led: dict[GroupId, None] = {}
        self._lead_counts: dict[NodeId, int] = {n: 0 for n in (node_id, *self.peers)}
        self._transfers: dict[GroupId, tuple[NodeId, int]] = {}
        self._ticks = 0
        self._last_heard = dict.fromkeys(self.peers, 0)
        self._last_sent = dict.fromkeys(self.peers, 0)
        self._alive = dict.fromkeys(self.peers, True)
        self._outstanding = False

    # -- groups ----------------------------------------------------------------------------

    def create_group(
        self,
        group: GroupId,
        voters: Iterable[NodeId],
        *,
        applied: LogIndex = _ZERO_INDEX,
        blank: int = 0,
    ) -> None:
        """Host ``group``; its storage comes from the factory (bootstrap: docs/raft.md duty 2).

        ``blank`` non-zero: this node may have been a voter of the group before it lost
        its disk; it neither votes nor counts until a READMIT naming ``blank`` applies.
        """
        if group in self._nodes or group in self._sleeping:
            raise AlreadyExists("group exists", repo=group.repo, incarnation=group.incarnation)
        hosted = len(self._nodes) + len(self._sleeping)
        if hosted >= self.config.groups_max:
            raise LimitExceeded("groups_max", hosted + 1, self.config.groups_max)
        members = frozenset(voters)
        storage = self._factory(group, members)
        base = self.config.raft
        cfg = base if applied == base.applied and blank == base.blank else None
        if cfg is None:
            cfg = dataclasses.replace(base, applied=applied, blank=blank)
        node = RawNode(cfg, storage, self._rand)
        # applied and blank are read at construction only: keep the one shared config
        node.raft.config = base
        self._nodes[group] = node
        self._storages[group] = storage
        self._active[group] = None
        self._dirty[group] = None

    def drop_group(self, group: GroupId) -> None:
        h = self._sleeping.pop(group, None)
        if h is None:
            self._get(group)
            del self._nodes[group], self._storages[group]
        else:
            self._lead_counts[h.lead] -= 1  # counted by its record (_hibernate_quiet)
        self._set_lead(group, None)
        self._active.pop(group, None)
        self._dirty.pop(group, None)
        self._transfers.pop(group, None)
        self._quiet.pop(group, None)
        self._to_wake.pop(group, None)

    def groups(self) -> Iterable[GroupId]:
        """Every hosted group, hibernated ones included."""
        return [*self._nodes, *self._sleeping]

    def group_count(self) -> int:
        return len(self._nodes) + len(self._sleeping)

    def hibernated_count(self) -> int:
        return len(self._sleeping)

    def is_hibernated(self, group: GroupId) -> bool:
        return group in self._sleeping

    # -- views that never wake a group -------------------------------------------------------

    def lead_of(self, group: GroupId) -> NodeId | None:
        """The leader this node knows for ``group`` (None: none, or not hosted)."""
        h = self._sleeping.get(group)
        if h is not None:
            return h.lead
        node = self._nodes.get(group)
        return None if node is None else node.raft.lead

    def is_leader(self, group: GroupId) -> bool:
        h = self._sleeping.get(group)
        if h is not None:
            return h.lead == self.id
        node = self._nodes.get(group)
        return node is not None and node.raft.role is Role.LEADER

    def term_of(self, group: GroupId) -> int:
        """The group's current term here; -1 when not hosted."""
        h = self._sleeping.get(group)
        if h is not None:
            return int(h.term)
        node = self._nodes.get(group)
        return -1 if node is None else int(node.raft.term)

    def commit_of(self, group: GroupId) -> int:
        """The group's commit index here; -1 when not hosted."""
        h = self._sleeping.get(group)
        if h is not None:
            return int(h.commit)
        node = self._nodes.get(group)
        return -1 if node is None else int(node.raft.log.committed)

    def raw_node(self, group: GroupId) -> RawNode:
        """The group's core, for status and tests (wakes it); drive it only through this class."""
        return self._get(group)

    def storage(self, group: GroupId) -> Storage:
        self._get(group)
        return self._storages[group]

    def leader_counts(self) -> dict[NodeId, int]:
        """Groups led by each node, as this node sees them."""
        return dict(self._lead_counts)

    def active_count(self) -> int:
        return len(self._active)

    def voters_of(self, group: GroupId) -> frozenset[NodeId]:
        """The members ``group`` has applied here, without waking a hibernated group."""
        h = self._sleeping.get(group)
        if h is not None:
            return h.voters
        return self._get(group).raft.tracker.voters

    def set_peers(self, peers: Iterable[NodeId]) -> None:
        """The other voters of the ledger after a membership change (docs/raft.md,
        "Membership changes"): batches go to and are taken from these nodes only. A new
        peer counts as alive until its liveness timeout says otherwise."""
        new = tuple(sorted(set(peers) - {self.id}))
        for p in new:
            if p not in self._alive:
                self._last_heard[p] = self._ticks
                self._last_sent[p] = 0
                self._alive[p] = True
                self._lead_counts.setdefault(p, 0)
        for p in self.peers:
            if p not in new:
                del self._last_heard[p], self._last_sent[p], self._alive[p]
        if new and not self.peers:  # the first peer: the groups led here count again
            led = [g for g, lead in self._lead.items() if lead == self.id]
            led += [g for g, h in self._sleeping.items() if h.lead == self.id]
            self._led = dict.fromkeys(led)
        elif not new:
            self._led = {}
        self.peers = new

    def is_alive(self, node: NodeId) -> bool:
        return node == self.id or self._alive.get(node, False)

    # -- inputs ----------------------------------------------------------------------------

    def tick(self) -> None:
        """One node tick: liveness, then every awake group, then leader spreading."""
        self._ticks += 1
        self._check_liveness()
        if self._to_wake:
            self._wake_queued()
        stats = self.stats
        quiet = self._quiet
        campaigns = self.config.campaigns_per_tick_max
        for g in list(self._active):
            node = self._nodes[g]
            if node.quiesced:
                del self._active[g]
                quiet[g] = self._ticks
                continue
            if node.raft.times_out_next_tick():
                # this tick times the group out (it campaigns, or pokes as a blank voter)
                if campaigns == 0:
                    stats.campaigns_deferred += 1
                    continue  # its clock holds at the edge: it campaigns on a later tick
                campaigns -= 1
                stats.campaigns += 1
            # Idleness is judged before the tick: a tick that is due a heartbeat queues
            # one, and a leader with a message waiting is never idle (with
            # heartbeat_ticks=1 every tick is due one, so a check after it never holds).
            if node.raft.role is Role.LEADER and node.is_idle() and node.quiesce():
                stats.quiesced += 1
                del self._active[g]
                self._dirty[g] = None
                quiet[g] = self._ticks
                continue
            node.tick()
            stats.group_ticks += 1
            self._dirty[g] = None
        self._expire_transfers()
        self._rebalance()
        self._hibernate_quiet()

    def step(self, batch: Batch) -> None:
        """Take one batch from a peer; heartbeats are expanded into per-group messages."""
        src = batch.from_node
        if batch.to_node != self.id or src not in self._alive:
            self.stats.batches_dropped += 1
            return
        self._last_heard[src] = self._ticks
        if not self._alive[src]:
            self._node_up(src)
        for gm in batch.messages:
            m = gm.message
            if m.to != self.id or m.from_ != src:
                self.stats.messages_dropped += 1
                continue
            self._step_group(gm.group, m)
        for hb in batch.heartbeats:
            m = Message(
                MessageType.HEARTBEAT,
                self.id,
                src,
                hb.term,
                commit=hb.commit,
                context=hb.context,
                quiesce=hb.quiesce,
            )
            self._step_group(hb.group, m)
        for hb in batch.heartbeat_responses:
            m = Message(MessageType.HEARTBEAT_RESP, self.id, src, hb.term, context=hb.context)
            self._step_group(hb.group, m)

    def propose(self, group: GroupId, data: bytes) -> None:
        """May raise ProposalDropped (retryable): docs/raft.md duty 9."""
        self._get(group).propose(data)
        self._touch(group)

    def propose_conf_change(self, group: GroupId, cc: ConfChange) -> None:
        self._get(group).propose_conf_change(cc)
        self._touch(group)

    def apply_conf_change(self, group: GroupId, cc: ConfChange) -> ConfState:
        cs = self._get(group).apply_conf_change(cc)
        self._touch(group)
        return cs

    def force_remove(self, group: GroupId, node: NodeId) -> bool:
        """Two-voter recovery (docs/raft.md): ``RawNode.force_remove``; wakes the group."""
        done = self._get(group).force_remove(node)
        self._touch(group)
        return done

    def read_index(self, group: GroupId, context: bytes) -> None:
        self._get(group).read_index(context)
        self._touch(group)

    def transfer_leader(self, group: GroupId, to: NodeId) -> None:
        self._get(group).transfer_leader(to)
        self._touch(group)

    def campaign(self, group: GroupId) -> None:
        self._get(group).campaign()
        self._touch(group)

    def report_snapshot(self, group: GroupId, to: NodeId, *, ok: bool) -> None:
        self._get(group).report_snapshot(to, ok=ok)
        self._touch(group)

    def report_node_unreachable(self, node: NodeId) -> None:
        """The transport lost ``node``: wake what it leads, and probe it from what we lead."""
        if node not in self._alive:
            raise InvalidArgument("not a peer", node=node)
        for g in self._led:
            got = self._nodes.get(g)
            if got is None:
                continue  # hibernated: it wakes probing every follower anyway
            got.report_unreachable(node)
            self._dirty[g] = None
        if self._alive[node]:
            self._node_down(node)

    # -- output ----------------------------------------------------------------------------

    def has_ready(self) -> bool:
        if self._outstanding:
            return False
        if self._dirty:
            return True
        due = self._ticks - self.config.liveness_interval_ticks
        return any(sent <= due for sent in self._last_sent.values())

    def ready(self) -> NodeReady:
        assert not self._outstanding, "ready() again before advance()"
        groups: list[GroupReady] = []
        must_sync = False
        out: dict[NodeId, _Outbox] = {}
        stats = self.stats
        quiet = self._quiet
        for g in list(self._dirty):
            node = self._nodes[g]
            # an awake leader that just became idle (its last follower acknowledged) goes
            # quiet now, not at the next tick: until then each tick beats every follower
            # and they answer, a commit's largest share of its messages under load
            if (
                g in self._active
                and node.raft.role is Role.LEADER
                and not node.quiesced
                and node.quiesce()
            ):
                stats.quiesced += 1
                del self._active[g]
                quiet[g] = self._ticks
            if not node.has_ready():
                del self._dirty[g]
                continue
            rd = node.ready()
            groups.append(GroupReady(g, rd))
            must_sync = must_sync or rd.must_sync
            if rd.soft_state is not None:
                self._set_lead(g, rd.soft_state.lead)
            for m in rd.messages:
                if m.to not in self._alive:
                    self.stats.messages_dropped += 1
                    continue
                box = out.get(m.to)
                if box is None:
                    box = out[m.to] = _Outbox()
                box.add(g, m)
        batches: list[Batch] = []
        due = self._ticks - self.config.liveness_interval_ticks
        for peer in self.peers:
            box = out.get(peer)
            if box is None and self._last_sent[peer] > due:
                continue
            b = box.batch(self.id, peer) if box is not None else Batch(self.id, peer)
            batches.append(b)
            self._last_sent[peer] = self._ticks
            self.stats.batches_out += 1
            self.stats.beats_out += b.is_empty
            self.stats.heartbeats_out += len(b.heartbeats) + len(b.heartbeat_responses)
            self.stats.messages_out += len(b.messages)
        self._outstanding = True
        return NodeReady(tuple(groups), tuple(batches), must_sync)

    def advance(self, node_ready: NodeReady) -> None:
        """The driver persisted, sent and applied ``node_ready``."""
        assert self._outstanding, "advance() without ready()"
        for gr in node_ready.groups:
            node = self._nodes.get(gr.group)
            if node is not None:  # dropped meanwhile
                node.advance(gr.ready)
                self._dirty[gr.group] = None
        self._outstanding = False

    # -- internals ---------------------------------------------------------------------------

    def _get(self, group: GroupId) -> RawNode:
        node = self._nodes.get(group)
        if node is None:
            if group in self._sleeping:
                return self._wake(group)
            raise NotFound("no such group", repo=group.repo, incarnation=group.incarnation)
        return node

    def wake(self, group: GroupId) -> None:
        """Rebuild a hibernated group now (a no-op for an awake one); NotFound if not hosted."""
        self._get(group)

    def _wake(self, group: GroupId) -> RawNode:
        """Rebuild a hibernated group from the driver's durable log and its record.

        Built as at a restart (the durable hard state, the stored log), then given back
        the quiet role the record holds when the disk agrees (``RawNode.wake_from``);
        otherwise it keeps time from now on, as a restarted node does.
        """
        assert self.on_wake is not None, "a hibernated group without a wake hook"
        h = self._sleeping.pop(group)
        try:
            storage = self.on_wake(group)
        except BaseException:
            self._sleeping[group] = h
            raise
        node = RawNode(self.config.raft, storage, self._rand)
        quiet = node.wake_from(h)
        self._lead[group] = h.lead  # counted all along; its Readies report a change only
        self._nodes[group] = node
        self._storages[group] = storage
        self.stats.woken += 1
        if quiet:
            if self.config.hibernate_after_ticks:
                self._quiet[group] = self._ticks
        else:
            self._active[group] = None
            self._dirty[group] = None
        return node

    def _wake_queued(self) -> None:
        """Scenarios 3 and 5 for hibernated groups: wake, unquiesce, and keep time."""
        budget = self.config.hibernations_per_tick_max
        for g in list(self._to_wake):
            if budget == 0:
                return
            del self._to_wake[g]
            if g in self._sleeping:
                budget -= 1
                node = self._wake(g)
            else:
                got = self._nodes.get(g)
                if got is None:
                    continue  # dropped meanwhile
                node = got
            node.unquiesce()
            self._quiet.pop(g, None)
            self._active[g] = None
            self._dirty[g] = None

    def _hibernate_quiet(self) -> None:
        """Scenario 6: free groups quiet for long enough, a bounded number per tick."""
        after = self.config.hibernate_after_ticks
        if not after or not self._quiet or self._outstanding or self.on_hibernate is None:
            return
        horizon = self._ticks - after
        budget = self.config.hibernations_per_tick_max
        retry: list[GroupId] = []
        for g, since in list(self._quiet.items()):
            if since > horizon or budget == 0:
                break
            del self._quiet[g]
            budget -= 1
            node = self._nodes.get(g)
            if node is None or not node.quiesced:
                continue  # dropped, or awake again (it is queued anew when quiet)
            if g in self._dirty and node.has_ready():
                retry.append(g)
                continue
            h = node.hibernation()
            if (
                h is None
                or g in self._transfers
                or h.lead not in self._lead_counts
                or not self.on_hibernate(g)
            ):
                retry.append(g)
                continue
            # a sleeping group's leader is its record's: counted in _lead_counts as
            # before, without an entry in _lead (one per idle group, issue 19)
            self._set_lead(g, h.lead)
            del self._lead[g]
            del self._nodes[g], self._storages[g]
            self._dirty.pop(g, None)
            self._active.pop(g, None)
            self._sleeping[g] = h
            self.stats.hibernated += 1
            self._freed += 1
        for g in retry:
            self._quiet[g] = self._ticks
        if self._freed > max(1024, 2 * len(self._nodes)):
            # a dict keeps its largest table: after a start (every group awake) or a
            # wake storm, the maps of awake groups would cost ~40 bytes a hosted group each
            self._freed = 0
            self._nodes = dict(self._nodes)
            self._storages = dict(self._storages)
            self._active = dict(self._active)
            self._dirty = dict(self._dirty)
            self._quiet = dict(self._quiet)
            self._lead = dict(self._lead)

    def _touch(self, group: GroupId) -> None:
        self._dirty[group] = None
        if not self._nodes[group].quiesced:
            self._active[group] = None
        elif self.config.hibernate_after_ticks:
            self._quiet[group] = self._ticks

    def _step_group(self, group: GroupId, m: Message) -> None:
        node = self._nodes.get(group)
        if node is None:
            if group not in self._sleeping:
                self.stats.messages_dropped += 1
                return
            node = self._wake(group)  # a message for a hibernated group: wake it first
        try:
            node.step(m)
        except InvalidArgument:
            self.stats.messages_dropped += 1  # a local type from the network
            return
        self._touch(group)

    def _set_lead(self, group: GroupId, lead: NodeId | None) -> None:
        old = self._lead.pop(group, None)
        if old is not None:
            self._lead_counts[old] -= 1
        if lead is not None and lead in self._lead_counts:
            self._lead[group] = lead
            self._lead_counts[lead] += 1
        if lead == self.id and self.peers:
            self._led[group] = None
        else:
            self._led.pop(group, None)
        if lead != old:
            self._transfers.pop(group, None)

    def _check_liveness(self) -> None:
        deadline = self._ticks - self.config.liveness_timeout
        for peer in self.peers:
            if self._alive[peer] and self._last_heard[peer] <= deadline:
                self._node_down(peer)

    def _node_down(self, peer: NodeId) -> None:
        """Scenario 3: one pass over the groups per failure, not per tick."""
        self._alive[peer] = False
        self.stats.nodes_down += 1
        # hibernated groups it led stay asleep: the work that next wakes one also makes
        # it keep time, so it elects then; a stopped voter may have led thousands here
        for g, node in self._nodes.items():
            if node.quiesced and node.raft.lead == peer:
                node.unquiesce()
                self._active[g] = None

    def _node_up(self, peer: NodeId) -> None:
        """Scenario 5: a peer back from down may have lost its disk, and a quiet group
        sends it nothing: wake the quiet groups led here so they heartbeat it once (a
        blank peer answers blank and is caught up; the others let the group quiesce)."""
        self._alive[peer] = True
        self.stats.nodes_up += 1
        for g in self._led:
            if g in self._sleeping:
                self._to_wake[g] = None
                continue
            node = self._nodes[g]
            if node.quiesced:
                node.unquiesce()
                self._active[g] = None
                self._dirty[g] = None

    def _expire_transfers(self) -> None:
        if not self._transfers:
            return
        horizon = self._ticks - 2 * self.config.raft.election_ticks
        for g, (_, started) in list(self._transfers.items()):
            if started <= horizon:
                del self._transfers[g]

    def _rebalance(self) -> None:
        """Scenario 4: bounded per tick; transfers in flight count as already moved."""
        live = [p for p in self.peers if self._alive[p]]
        if not live or not self._led:
            return
        # over every hosted group: hibernated ones are led (and moved) like awake ones
        fair = -(-self.group_count() // (len(live) + 1))
        pending: dict[NodeId, int] = {}
        for target, _ in self._transfers.values():
            pending[target] = pending.get(target, 0) + 1
        mine = self._lead_counts[self.id] - len(self._transfers)
        budget = self.config.transfers_per_tick_max
        for _ in range(min(len(self._led), self.config.transfer_candidates_per_tick_max)):
            if mine <= fair + self.config.leader_slack or budget == 0:
                return
            g = next(iter(self._led))
            del self._led[g]
            self._led[g] = None  # rotate, so a group that cannot move does not block others
            if g in self._transfers:
                continue
            to = self._transfer_target(g, live, pending, fair)
            if to is None:
                continue
            self._get(g).transfer_leader(to)
            self._touch(g)
            self._transfers[g] = (to, self._ticks)
            pending[to] = pending.get(to, 0) + 1
            self.stats.transfers += 1
            mine -= 1
            budget -= 1

    def _transfer_target(
        self, group: GroupId, live: list[NodeId], pending: dict[NodeId, int], fair: int
    ) -> NodeId | None:
        best_h: tuple[int, NodeId] | None = None
        h = self._sleeping.get(group)
        if h is not None:
            # an idle leader: every member holds the whole log; waking is left to the move
            for p in live:
                if p in h.voters:
                    load = self._lead_counts[p] + pending.get(p, 0)
                    if load < fair and (best_h is None or (load, p) < best_h):
                        best_h = (load, p)
            return None if best_h is None else best_h[1]
        r = self._nodes[group].raft
        if r.role is not Role.LEADER or r.lead_transferee is not None:
            return None
        last = r.log.last_index()
        best: tuple[int, NodeId] | None = None
        for p in live:
            pr = r.tracker.progress.get(p)
            if pr is None or pr.is_learner or pr.blank or pr.match != last:
                continue
            load = self._lead_counts[p] + pending.get(p, 0)
            if load < fair and (best is None or (load, p) < best):
                best = (load, p)
        return None if best is None else best[1]


class _Outbox:
    """One destination's share of a Ready: heartbeats coalesced, the rest in order."""

    __slots__ = ("heartbeats", "messages", "responses")

    def __init__(self) -> None:
        self.messages: list[GroupMessage] = []
        self.heartbeats: list[Heartbeat] = []
        self.responses: list[Heartbeat] = []

    def add(self, group: GroupId, m: Message) -> None:
        plain = (
            not m.blank
            and not m.entries
            and m.snapshot is None
            and not m.reject
            and m.log_term == 0
            and m.index == 0
            and m.reject_hint == 0
        )
        if plain and m.type is MessageType.HEARTBEAT:
            self.heartbeats.append(Heartbeat(group, m.term, m.commit, m.context, m.quiesce))
        elif plain and m.type is MessageType.HEARTBEAT_RESP and m.commit == 0 and not m.quiesce:
            self.responses.append(Heartbeat(group, m.term, context=m.context))
        else:
            self.messages.append(GroupMessage(group, m))

    def batch(self, src: NodeId, dst: NodeId) -> Batch:
        return Batch(src, dst, tuple(self.messages), tuple(self.heartbeats), tuple(self.responses))
