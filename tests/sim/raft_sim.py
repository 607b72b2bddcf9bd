"""Deterministic simulation of a Raft cluster driven through ``RawNode``.

One seed fixes everything: the schedule of message deliveries, ticks, client
operations and faults, and every node's election-timeout randomness. A run is
a fault phase (loss, duplication, reordering, partitions, crashes with and
without losing unsynced writes, restarts, leadership transfers, compaction,
membership changes, quiescence, and in every third schedule restarts with a wiped
disk that come back blank) followed by a calm phase in which the
network heals and every member restarts; the calm phase must elect a leader
and commit a fresh proposal within a bounded number of steps.

The driver keeps the Ready contract of docs/raft.md literally, in two halves
that the schedule may separate: *write* (entries, hard state, snapshot go to
the node's disk, not yet synced) and *complete* (sync, then send, apply,
advance). A crash between them may lose the unsynced writes, so any safety
argument that leans on persisting before sending is exercised.

Invariants are checked after every step (see ``Checker``); at the end the
client history of CAS operations must be linearizable. The replicated
application is the repository state machine itself (``RefMachine``).
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from enroute_core.base.errors import ProposalDropped
from enroute_core.base.ids import LogIndex, NodeId, ObjectId, Term
from enroute_core.state import (
    MISSING,
    Activate,
    Commit,
    RefStatus,
    RefUpdate,
    RepoState,
    apply,
    decode_state,
    encode_state,
)
from enroute_ledger.raft import (
    EMPTY_HARD_STATE,
    EMPTY_SNAPSHOT,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    RaftConfig,
    RawNode,
    Ready,
    Role,
    Snapshot,
    SnapshotMetadata,
    SplitMix64,
)
from enroute_testing.linearizability import CheckResult, History, check_history

KEYS = ("a", "b", "c")
VALUES = 4
_OP = struct.Struct(">2sQ")


class SimFailure(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class SimParams:
    nodes: int = 3
    fault_steps: int = 300
    calm_steps_max: int = 400
    election_ticks: int = 8
    heartbeat_ticks: int = 2
    loss: float = 0.05
    duplicate: float = 0.03
    client_timeout_steps: int = 120
    membership_changes: bool = True
    check_quorum: bool = True
    pre_vote: bool = True
    wipes: bool = False
    """Some restarts come back with a wiped disk (blank, docs/raft.md)."""
    wipe_chance: float = 0.3


@dataclass(slots=True)
class ClientOp:
    op_id: int
    key: str
    input: tuple[object, ...]
    node: NodeId
    incarnation: int
    started: int
    read_index: int | None = None


# -- the application: the repository state machine, deduplicated by operation id ---------------


def _oid(value: int) -> ObjectId:
    return ObjectId(bytes([value + 1]) * 20)


def _ref(key: str) -> bytes:
    return b"refs/heads/" + key.encode()


class RefMachine:
    """Keys are refs of one repository and values commit ids, applied by
    ``enroute_core.state.apply``: every CAS the simulation checks for
    linearizability is a ``Commit`` of the real state machine, and every
    snapshot carries its real checkpoint encoding (``encode_state``).

    ``results`` mirrors the ledger runtime's request-id dedup: a forwarded
    proposal duplicated by the network becomes two log entries, applied once.
    """

    def __init__(
        self, state: RepoState | None = None, results: dict[int, object] | None = None
    ) -> None:
        if state is None:
            created = apply(MISSING, Activate(create=True, head=_ref("a")), log_index=0)
            state = created.state
        self.state = state
        self.results: dict[int, object] = results or {}

    @property
    def data(self) -> dict[str, int]:
        prefix = len(b"refs/heads/")
        return {name[prefix:].decode(): value.oid[0] - 1 for name, value in self.state.refs.items()}

    def apply(self, op: ClientOp, index: int) -> object:
        if op.op_id in self.results:
            return self.results[op.op_id]  # a duplicate of a proposal already applied
        kind = op.input[0]
        ref = _ref(op.key)
        current = self.state.refs.get(ref)
        if kind == "write":  # unconditional: CAS against what the machine holds now
            _, value = op.input
            expected = None if current is None else current.oid
        else:
            _, old, value = op.input
            assert old is None or isinstance(old, int)
            expected = None if old is None else _oid(old)
        assert isinstance(value, int)
        commit = Commit(
            incarnation=self.state.incarnation,
            ref_updates=(RefUpdate(ref, expected, _oid(value)),),
            new_layer=None,
            stamp_us=op.op_id,
            is_push=True,
        )
        res = apply(self.state, commit, log_index=index)
        self.state = res.state
        ok = res.change.refs[0].status is RefStatus.OK
        result: object = None if kind == "write" else ok
        if kind == "write" and not ok:
            raise AssertionError(f"unconditional write refused: {res.change.outcome}")
        self.results[op.op_id] = result
        return result

    def encode(self) -> bytes:
        state = encode_state(self.state)
        results = json.dumps(self.results, sort_keys=True).encode()
        return struct.pack(">I", len(state)) + state + results

    @classmethod
    def decode(cls, raw: bytes) -> RefMachine:
        if not raw:
            return cls()
        (n,) = struct.unpack(">I", raw[:4])
        results = json.loads(raw[4 + n :])
        return cls(decode_state(raw[4 : 4 + n]), {int(k): v for k, v in results.items()})


# -- durable storage with an explicit sync -------------------------------------------------------


class Disk:
    """What survives a crash: only synced writes survive a power loss."""

    def __init__(self) -> None:
        self.hs: HardState = EMPTY_HARD_STATE
        self.snap: Snapshot = EMPTY_SNAPSHOT
        self.entries: list[Entry] = []  # entries[i].index == snap.index + 1 + i
        self.pending: list[tuple[str, object]] = []
        self.blank = 0  # the blank id this disk was started with after a wipe; 0 once readmitted

    def write(self, kind: str, value: object) -> None:
        self.pending.append((kind, value))

    def sync(self) -> None:
        for kind, value in self.pending:
            self.apply_now(kind, value)
        self.pending.clear()

    def crash(self, *, lose_unsynced: bool) -> None:
        if lose_unsynced:
            self.pending.clear()
        else:
            self.sync()  # the process died; the kernel still wrote its page cache

    def apply_now(self, kind: str, value: object) -> None:
        if kind == "hs":
            assert isinstance(value, HardState)
            self.hs = value
        elif kind == "ents":
            assert isinstance(value, tuple)
            ents: tuple[Entry, ...] = value
            at = ents[0].index - (self.snap.index + 1)
            if at < 0:
                ents = ents[-at:]
                at = 0
            assert at <= len(self.entries), "gap in the durable log"
            del self.entries[at:]
            self.entries.extend(ents)
        elif kind == "install":  # a snapshot from the leader replaces the log
            assert isinstance(value, Snapshot)
            self.snap = value
            self.entries = []
        elif kind == "compact":  # our own snapshot: keep the entries after it
            assert isinstance(value, Snapshot)
            drop = value.index - self.snap.index
            self.entries = self.entries[drop:]
            self.snap = value
        else:
            raise AssertionError(kind)

    def load(self) -> MemoryStorage:
        st = MemoryStorage()
        if not self.snap.is_empty:
            st.apply_snapshot(self.snap)
        st.set_hard_state(self.hs)
        st.append(self.entries)
        return st


@dataclass(slots=True)
class SimNode:
    id: NodeId
    disk: Disk
    raw: RawNode | None = None
    storage: MemoryStorage | None = None
    kv: RefMachine = field(default_factory=RefMachine)
    applied: int = 0
    conf: ConfState = field(default_factory=ConfState)
    incarnation: int = 0
    inflight: Ready | None = None
    removed: bool = False
    wakes: int = 0

    @property
    def up(self) -> bool:
        return self.raw is not None


# -- invariants ----------------------------------------------------------------------------------


class Checker:
    """Safety properties of Raft (Figure 3 of the paper), checked as the run goes."""

    def __init__(self) -> None:
        self.leaders: dict[int, NodeId] = {}
        self.committed: dict[int, tuple[int, bytes]] = {}  # index -> (term, data)
        # index -> a term by which it was committed: the least term of a node seen holding
        # it committed (a node learns commit only from a leader of its term or earlier).
        self.commit_term: dict[int, int] = {}
        self.applied: dict[int, tuple[int, bytes]] = {}
        self.by_index_term: dict[tuple[int, int], tuple[EntryType, bytes]] = {}
        self.commit_seen: dict[NodeId, int] = {}
        self.leader_checked: set[tuple[NodeId, int]] = set()

    def entries_written(self, node: SimNode, ents: tuple[Entry, ...]) -> None:
        """Log Matching, first half: one (index, term) names one entry everywhere (§5.3)."""
        for e in ents:
            key = (e.index, e.term)
            seen = self.by_index_term.setdefault(key, (e.type, e.data))
            if seen != (e.type, e.data):
                raise SimFailure(f"log matching: two entries at {key}: {seen} vs {e} (n{node.id})")

    def applied_entry(self, node: SimNode, e: Entry) -> None:
        """State Machine Safety: no two nodes apply different entries at one index (§5.4.3)."""
        seen = self.applied.setdefault(e.index, (e.term, e.data))
        if seen != (e.term, e.data):
            raise SimFailure(f"state machine safety at {e.index}: {seen} vs {e} (n{node.id})")

    def restarted(self, node: SimNode) -> None:
        self.commit_seen[node.id] = 0

    def step(self, nodes: list[SimNode]) -> None:
        for n in nodes:
            if n.raw is None:
                continue
            r = n.raw.raft
            if r.role is Role.LEADER:
                # Election Safety: at most one leader per term (§5.2).
                other = self.leaders.setdefault(r.term, n.id)
                if other != n.id:
                    raise SimFailure(f"election safety: n{other} and n{n.id} lead term {r.term}")
                if (n.id, r.term) not in self.leader_checked:
                    self.leader_checked.add((n.id, r.term))
                    self._leader_complete(n)
            self._committed_prefix(n)

    def _leader_complete(self, n: SimNode) -> None:
        """Leader Completeness: an entry committed in a term holds in the logs of the leaders
        of all later terms (§5.4). A leader of an older term may still win late (its vote
        answers were delayed); it is not bound by what later terms committed."""
        assert n.raw is not None
        log = n.raw.raft.log
        term_now = n.raw.raft.term
        first, last = log.first_index(), log.last_index()
        for index, (term, _) in self.committed.items():
            if self.commit_term[index] >= term_now or index < first:
                continue
            if index > last or log.term(LogIndex(index)) != term:
                raise SimFailure(
                    f"leader completeness: n{n.id} leads term {term_now} but lacks entry "
                    f"{index} (term {term}) committed by term {self.commit_term[index]}"
                )

    def _committed_prefix(self, n: SimNode) -> None:
        """Log Matching on committed prefixes; and nothing committed is ever lost."""
        assert n.raw is not None
        log = n.raw.raft.log
        hi = log.committed
        seen = self.commit_seen.get(n.id, 0)
        if hi <= seen:
            return
        lo = max(seen, log.first_index() - 1)
        term_now = n.raw.raft.term
        for e in log.slice(LogIndex(lo + 1), LogIndex(hi + 1), 1 << 62):
            known = self.committed.setdefault(e.index, (e.term, e.data))
            if known != (e.term, e.data):
                raise SimFailure(
                    f"committed entry {e.index} differs: {known} vs ({e.term}, {e.data!r}) "
                    f"on n{n.id}"
                )
            self.commit_term[e.index] = min(self.commit_term.get(e.index, term_now), term_now)
        self.commit_seen[n.id] = hi

    def logs_match(self, nodes: list[SimNode]) -> None:
        """Log Matching, second half: logs that agree at an index agree on all before it."""
        logs = []
        for n in nodes:
            if n.raw is not None:
                log = n.raw.raft.log
                logs.append((n.id, log.first_index(), log.all_entries()))
        for i, (a, fa, ea) in enumerate(logs):
            for b, fb, eb in logs[i + 1 :]:
                lo = max(fa, fb)
                hi = min(fa + len(ea), fb + len(eb)) - 1
                agree = 0
                for idx in range(hi, lo - 1, -1):
                    if ea[idx - fa].term == eb[idx - fb].term:
                        agree = idx
                        break
                for idx in range(lo, agree + 1):
                    if ea[idx - fa] != eb[idx - fb]:
                        raise SimFailure(f"log matching: n{a} and n{b} differ at {idx} < {agree}")


# -- the world -------------------------------------------------------------------------------------


class Sim:
    def __init__(self, seed: int, params: SimParams | None = None) -> None:
        self.seed = seed
        self.p = params or SimParams()
        self.rng = random.Random(seed)
        self.step_no = 0
        self.trace: list[str] = []
        self.checker = Checker()
        self.history = History()
        self.ops: dict[int, ClientOp] = {}
        self.open_ops: dict[int, ClientOp] = {}
        self.next_op = 1
        self.network: list[Message] = []
        self.partition: frozenset[NodeId] | None = None
        self.loss = self.p.loss
        self.duplicate = self.p.duplicate
        self.members: set[NodeId] = set()
        self.conf_in_flight = False
        self.conf_changes = 0
        self.conf_proposed_at = 0
        self.conf_seen: set[int] = set()
        self.acked: set[int] = set()
        self.nodes: dict[NodeId, SimNode] = {}
        self.stats: dict[str, int] = {}
        # wipes draw from their own stream: the other faults of a seed stay as they were
        self.wipe_rng = random.Random(seed ^ 0x5EED_0F_D15C)
        # hibernations too (docs/raft.md, "Hibernation")
        self.hib_rng = random.Random(seed ^ 0x41B3_27A7E)
        self.next_blank = 1
        voters = frozenset(NodeId(i) for i in range(1, self.p.nodes + 1))
        for nid in sorted(voters):
            self.nodes[nid] = SimNode(nid, self._founder_disk())
            self._start(self.nodes[nid])
        self.members = set(voters)
        self.next_node = self.p.nodes + 1

    # -- bookkeeping ---------------------------------------------------------------------------

    def _log(self, what: str) -> None:
        self.trace.append(f"{self.step_no}: {what}")

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _up(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.raw is not None]

    def leader(self) -> SimNode | None:
        """The leader of the highest term among live nodes, if any."""
        best: SimNode | None = None
        best_term = -1
        for n in self._up():
            assert n.raw is not None
            r = n.raw.raft
            if r.role is Role.LEADER and r.term > best_term:
                best, best_term = n, r.term
        return best

    # -- node lifecycle --------------------------------------------------------------------------

    def _founder_disk(self) -> Disk:
        """Duty 2: every founder starts from the same snapshot at index 1."""
        voters = frozenset(NodeId(i) for i in range(1, self.p.nodes + 1))
        disk = Disk()
        disk.snap = Snapshot(SnapshotMetadata(LogIndex(1), Term(1), ConfState(voters)), b"")
        disk.hs = HardState(Term(1), None, LogIndex(1))
        return disk

    def _may_wipe(self, node: SimNode) -> bool:
        """One lost disk at a time: another one before the first is readmitted loses
        entries only the two of them held, which no Raft survives. And only with three
        members or more: two cannot readmit one (the READMIT needs a quorum without it)."""
        return (
            self.p.wipes
            and self.wipe_rng.random() < self.p.wipe_chance
            and len(self.members) >= 3
            and not self.conf_in_flight
            and all(not n.disk.blank for n in self.nodes.values())
        )

    def _wipe(self, node: SimNode) -> None:
        """The disk is gone: the node comes back as its bootstrap, blank under a new id."""
        founder = node.id <= self.p.nodes
        node.disk = self._founder_disk() if founder else Disk()
        node.disk.blank = self.next_blank
        self.next_blank += 1
        node.applied = 0
        self._log(f"wipe n{node.id} (blank {node.disk.blank})")
        self._count("wipe")

    def _start(self, node: SimNode) -> None:
        st = node.disk.load()
        node.storage = st
        node.kv = RefMachine.decode(node.disk.snap.data)
        node.applied = node.disk.snap.index
        node.conf = node.disk.snap.metadata.conf_state
        node.incarnation += 1
        node.inflight = None
        cfg = RaftConfig(
            NodeId(node.id),
            election_ticks=self.p.election_ticks,
            heartbeat_ticks=self.p.heartbeat_ticks,
            applied=LogIndex(node.applied),
            msg_bytes_max=160,
            inflight_msgs_max=4,
            inflight_bytes_max=1024,
            check_quorum=self.p.check_quorum,
            pre_vote=self.p.pre_vote,
            blank=node.disk.blank,
        )
        rand = SplitMix64(self.seed * 1_000_003 + node.id * 7919 + node.incarnation)
        node.raw = RawNode(cfg, st, rand)
        self.checker.restarted(node)

    def _crash(self, node: SimNode, *, lose_unsynced: bool) -> None:
        self._log(f"crash n{node.id} lose_unsynced={lose_unsynced}")
        self._count("crash_lossy" if lose_unsynced else "crash")
        node.disk.crash(lose_unsynced=lose_unsynced)
        node.raw = None
        node.storage = None
        node.inflight = None
        for op in list(self.open_ops.values()):
            if op.node == node.id:
                self._finish(op, "info")
        # A failure detector notices: wake any quiet group so it can elect.
        for n in self._up():
            assert n.raw is not None
            n.raw.unquiesce()

    # -- the Ready contract ------------------------------------------------------------------------

    def _take_ready(self, node: SimNode) -> None:
        raw, st = node.raw, node.storage
        assert raw is not None and st is not None
        rd = raw.ready()
        # Duty 1: persist snapshot, entries and hard state (written, not yet synced).
        if rd.snapshot is not None:
            st.apply_snapshot(rd.snapshot)
            node.disk.write("install", rd.snapshot)
        if rd.entries:
            self.checker.entries_written(node, rd.entries)
            st.append(rd.entries)
            node.disk.write("ents", rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
            node.disk.write("hs", rd.hard_state)
        node.inflight = rd
        if self.rng.random() < 0.75:
            self._complete_ready(node)

    def _complete_ready(self, node: SimNode) -> None:
        rd, raw = node.inflight, node.raw
        assert rd is not None and raw is not None
        if rd.must_sync:
            node.disk.sync()  # otherwise the writes ride along with a later sync
        # Duty 2: only now may messages leave.
        for m in rd.messages:
            self._send(m)
        # Duty 3: apply the snapshot and committed entries.
        if rd.snapshot is not None:
            node.kv = RefMachine.decode(rd.snapshot.data)
            node.applied = rd.snapshot.index
            node.conf = rd.snapshot.metadata.conf_state
        for e in rd.committed_entries:
            self._apply(node, e)
        if rd.read_states:
            self._count("read_states")
        for rs in rd.read_states:
            op = self.open_ops.get(int.from_bytes(rs.context, "big"))
            if op is not None and op.node == node.id and op.incarnation == node.incarnation:
                op.read_index = rs.index
        node.inflight = None
        raw.advance(rd)
        self._serve_reads(node)

    def _apply(self, node: SimNode, e: Entry) -> None:
        assert node.raw is not None
        self.checker.applied_entry(node, e)
        node.applied = e.index
        if e.type is EntryType.CONF_CHANGE:
            cc = ConfChange.decode(e.data)
            node.conf = node.raw.apply_conf_change(cc)
            if node.disk.blank and not node.raw.raft.blank:
                node.disk.blank = 0  # written once the READMIT naming it applied
                self._log(f"n{node.id} readmitted at {e.index}")
                self._count("readmit")
            if cc.type is not ConfChangeType.READMIT:
                self._conf_applied(e.index, cc)
            return
        if not e.data:
            return
        _, op_id = _OP.unpack(e.data)
        op = self.ops[op_id]
        result = node.kv.apply(op, int(e.index))
        if op_id in self.open_ops and op.node == node.id and op.incarnation == node.incarnation:
            self._finish(op, "ok", result)

    def _serve_reads(self, node: SimNode) -> None:
        for op in list(self.open_ops.values()):
            if (
                op.input[0] == "read"
                and op.node == node.id
                and op.incarnation == node.incarnation
                and op.read_index is not None
                and op.read_index <= node.applied
            ):
                self._finish(op, "ok", node.kv.data.get(op.key))

    def _conf_applied(self, index: int, cc: ConfChange) -> None:
        if index in self.conf_seen:
            return
        self.conf_seen.add(index)
        self._count("conf_applied")
        self.conf_in_flight = False
        self._log(f"conf change applied at {index}: {cc.type.name} n{cc.node_id}")
        if cc.type is ConfChangeType.REMOVE_NODE:
            if cc.node_id in self.members:
                self.members.discard(cc.node_id)
                gone = self.nodes[cc.node_id]
                gone.removed = True
        elif cc.type is ConfChangeType.ADD_NODE:
            self.members.add(cc.node_id)

    # -- network -----------------------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        if self.rng.random() < self.loss:
            self._count("lost")
            self._snap_failed(m)
            return
        self.network.append(m)
        if self.rng.random() < self.duplicate:
            self._count("duplicated")
            self.network.append(m)

    def _snap_failed(self, m: Message) -> None:
        if m.type is MessageType.SNAP:
            sender = self.nodes[m.from_]
            if sender.raw is not None:
                sender.raw.report_snapshot(m.to, ok=False)

    def _blocked(self, a: NodeId, b: NodeId) -> bool:
        p = self.partition
        return p is not None and ((a in p) != (b in p))

    def _deliver(self, i: int) -> None:
        net = self.network
        net[i], net[-1] = net[-1], net[i]
        m = net.pop()
        to = self.nodes.get(m.to)
        if to is None or to.raw is None or to.removed or self._blocked(m.from_, m.to):
            self._snap_failed(m)
            return
        to.raw.step(m)
        self._process_ready(to)
        if m.type is MessageType.SNAP:
            self._count("snapshot_delivered")
            sender = self.nodes[m.from_]
            if sender.raw is not None:
                sender.raw.report_snapshot(m.to, ok=True)
                self._process_ready(sender)

    # -- clients -----------------------------------------------------------------------------------

    def _finish(self, op: ClientOp, how: str, output: object = None) -> None:
        del self.open_ops[op.op_id]
        if how == "ok":
            self.history.ok(op.op_id, output)
            self.acked.add(op.op_id)
        elif how == "fail":
            self.history.fail(op.op_id)
        else:
            self.history.info(op.op_id)
        self._count(f"op_{how}")

    def _client(self, *, node: SimNode | None = None, kind: str | None = None) -> ClientOp | None:
        if node is None:
            # Clients find the leader with stale information: any node that believes it
            # leads is as likely a target as the newest leader.
            up = [n for n in self._up() if not n.removed]
            if not up:
                return None
            leaders = [n for n in up if n.raw is not None and n.raw.raft.role is Role.LEADER]
            node = self.rng.choice(leaders if leaders and self.rng.random() < 0.7 else up)
        assert node.raw is not None
        key = self.rng.choice(KEYS)
        kind = kind or self.rng.choice(("read", "write", "cas", "cas"))
        op_input: tuple[object, ...]
        if kind == "read":
            op_input = ("read",)
        elif kind == "write":
            op_input = ("write", self.rng.randrange(VALUES))
        else:
            old = self.rng.choice((None, *range(VALUES)))
            op_input = ("cas", old, self.rng.randrange(VALUES))
        op = ClientOp(self.next_op, key, op_input, node.id, node.incarnation, self.step_no)
        self.next_op += 1
        self.ops[op.op_id] = op
        self.open_ops[op.op_id] = op
        self.history.invoke(op.op_id, key, *op_input)
        try:
            if kind == "read":
                node.raw.read_index(op.op_id.to_bytes(8, "big"))
            else:
                node.raw.propose(_OP.pack(b"op", op.op_id))
        except ProposalDropped:
            self._finish(op, "fail")
        return op

    def _expire_ops(self) -> None:
        limit = self.step_no - self.p.client_timeout_steps
        for op in list(self.open_ops.values()):
            if op.started < limit:
                self._finish(op, "info")

    # -- faults ------------------------------------------------------------------------------------

    def _fault(self) -> None:
        r = self.rng.random()
        up = [n for n in self._up() if not n.removed]
        down = [n for n in self.nodes.values() if n.raw is None and not n.removed]
        f = (len(self.members) - 1) // 2
        if r < 0.22:
            if up and len(down) < max(f, 1):
                self._crash(self.rng.choice(up), lose_unsynced=self.rng.random() < 0.5)
        elif r < 0.44:
            if down:
                n = self.rng.choice(down)
                if self._may_wipe(n):
                    self._wipe(n)
                self._log(f"restart n{n.id}")
                self._start(n)
                if n.disk.blank:
                    self._wake_all()  # the runtime wakes quiet groups for a peer back up
        elif r < 0.56:
            ids = sorted(self.members)
            side = frozenset(i for i in ids if self.rng.random() < 0.5)
            self.partition = side
            self._log(f"partition {sorted(side)}")
            self._count("partition")
            self._wake_all()
        elif r < 0.68:
            self.partition = None
            self._log("heal")
            self._wake_all()
        elif r < 0.76:
            lead = self.leader()
            if lead is not None and lead.raw is not None:
                others = sorted(self.members - {lead.id})
                if others:
                    to = self.rng.choice(others)
                    self._log(f"transfer n{lead.id} -> n{to}")
                    self._count("transfer")
                    lead.raw.transfer_leader(NodeId(to))
        elif r < 0.88:
            if up:
                self._compact(self.rng.choice(up))
        elif self.p.membership_changes:
            self._membership()

    def _wake_all(self) -> None:
        for n in self._up():
            assert n.raw is not None
            n.raw.unquiesce()

    def _compact(self, node: SimNode) -> None:
        st = node.storage
        assert st is not None
        if node.applied <= node.disk.snap.index + 2 or node.applied <= st.snapshot().index:
            return
        if node.applied > st.last_index():
            return
        snap = st.create_snapshot(LogIndex(node.applied), node.conf, node.kv.encode())
        st.compact(LogIndex(node.applied))
        node.disk.sync()  # what was applied was synced; write the snapshot durably
        node.disk.apply_now("compact", snap)
        self._log(f"compact n{node.id} at {node.applied}")
        self._count("compact")

    def _membership(self) -> None:
        if self.conf_changes >= 4:
            return
        if any(n.disk.blank for n in self.nodes.values()):
            return  # a removal could leave too few counting voters to readmit it
        if self.conf_in_flight and self.step_no - self.conf_proposed_at < 100:
            return  # wait for it to apply, or give it up as lost with its leader
        lead = self.leader()
        if lead is None or lead.raw is None:
            return
        if len(self.members) >= self.p.nodes:
            victims = sorted(self.members - {lead.id})
            if not victims:
                return
            victim = NodeId(self.rng.choice(victims))
            cc = ConfChange(ConfChangeType.REMOVE_NODE, victim)
        else:
            new = NodeId(self.next_node)
            self.next_node += 1
            self.nodes[new] = SimNode(new, Disk())
            self._start(self.nodes[new])
            cc = ConfChange(ConfChangeType.ADD_NODE, new)
        try:
            lead.raw.propose_conf_change(cc)
        except ProposalDropped:
            return
        self.conf_in_flight = True
        self.conf_proposed_at = self.step_no
        self.conf_changes += 1
        self._log(f"propose {cc.type.name} n{cc.node_id} at n{lead.id}")
        self._count("conf_change")

    # -- one step ----------------------------------------------------------------------------------

    def _process_readies(self) -> None:
        for n in list(self.nodes.values()):
            self._process_ready(n)

    def _process_ready(self, n: SimNode) -> None:
        raw = n.raw
        if raw is None:
            return
        if n.removed:
            # The operator shuts a removed node down once its removal applied anywhere.
            self._crash(n, lose_unsynced=False)
            return
        if n.inflight is None and raw.has_ready():
            self._take_ready(n)

    def _tick_all(self, drift: float = 0.0) -> None:
        for n in self._up():
            assert n.raw is not None
            if drift and self.rng.random() < drift:
                continue  # clocks drift: this node's tick comes late
            if not n.raw.quiesced:  # a driver may skip quiet groups entirely
                n.raw.tick()
                if n.raw.is_idle() and self.rng.random() < 0.5 and n.raw.quiesce():
                    self._count("quiesce")
            elif self.hib_rng.random() < 0.3:
                self._hibernate(n)

    def _hibernate(self, node: SimNode) -> None:
        """A quiet node gives up its Raft objects and is rebuilt at once from its durable
        (synced) log and its hibernation record, as the ledger does on the next message
        (docs/raft.md, "Hibernation"). The state machine stays: the runtime rebuilds it
        from the same log, which this does not model."""
        raw = node.raw
        assert raw is not None
        if node.inflight is not None:
            return
        h = raw.hibernation()
        if h is None:
            return
        st = node.disk.load()
        node.storage = st
        node.wakes += 1
        cfg = RaftConfig(
            NodeId(node.id),
            election_ticks=self.p.election_ticks,
            heartbeat_ticks=self.p.heartbeat_ticks,
            msg_bytes_max=160,
            inflight_msgs_max=4,
            inflight_bytes_max=1024,
            check_quorum=self.p.check_quorum,
            pre_vote=self.p.pre_vote,
            blank=node.disk.blank,
        )
        seed = self.seed * 1_000_003 + node.id * 7919 + node.incarnation + 104_729 * node.wakes
        node.raw = RawNode(cfg, st, SplitMix64(seed))
        quiet = node.raw.wake_from(h)
        # the synced log holds every entry and the term and vote (those Readies sync)
        if not quiet:
            raise SimFailure(f"n{node.id} did not wake in its quiet role from {h}")
        r = node.raw.raft
        if (r.term, r.lead, int(r.log.applied)) != (h.term, h.lead, node.applied):
            raise SimFailure(f"n{node.id} woke as {r.term}/{r.lead}/{r.log.applied}, not {h}")
        self._log(f"hibernate n{node.id} (term {h.term}, lead n{h.lead}, at {h.commit})")
        self._count("hibernate")

    def step(self, *, faults: bool) -> None:
        self.step_no += 1
        rng = self.rng
        r = rng.random()
        if r < 0.12:
            self._tick_all(drift=0.25)
        elif r < 0.24:
            self._client()
        elif r < 0.32:
            pending = [n for n in self._up() if n.inflight is not None]
            if pending:
                self._complete_ready(rng.choice(pending))
        elif faults and r < 0.36:
            self._fault()
        # Messages travel much faster than election timeouts, in any order.
        for _ in range(rng.randrange(4)):
            if not self.network:
                break
            self._deliver(rng.randrange(len(self.network)))
        self._process_readies()
        self._expire_ops()
        self.checker.step(list(self.nodes.values()))
        if self.step_no % 25 == 0:
            self.checker.logs_match(list(self.nodes.values()))

    # -- a whole run -------------------------------------------------------------------------------

    def calm(self) -> int:
        """Heal everything, then demand a leader and a fresh commit within a bound."""
        self.partition = None
        self.loss = 0.0
        self.duplicate = 0.0
        for n in self.nodes.values():
            if n.raw is None and n.id in self.members and not n.removed:
                self._start(n)
        self._wake_all()
        start = self.step_no
        probe: ClientOp | None = None
        while self.step_no - start < self.p.calm_steps_max:
            self._calm_step()
            lead = self.leader()
            if lead is None or lead.raw is None:
                continue
            if probe is None:
                if self._stable_leader(lead):
                    probe = self._client(node=lead, kind="write")
                continue
            if probe.op_id in self.open_ops:
                continue
            if probe.op_id not in self.acked:
                probe = None  # dropped or timed out: leadership moved, try again
                continue
            if self._converged(lead):
                return self.step_no - start
        lead = self.leader()
        raise SimFailure(
            f"no progress within {self.p.calm_steps_max} calm steps: "
            f"leader={lead.id if lead else None}, probe={probe}"
        )

    def quiet(self) -> None:
        """An idle group goes quiet, keeps its leader while nobody ticks, and wakes on work."""
        lead = self.leader()
        assert lead is not None and lead.raw is not None
        for _ in range(self.p.election_ticks * 3 * 4):
            if not lead.raw.quiesced and lead.raw.quiesce():
                self._log(f"quiesce n{lead.id} (quiet phase)")
            self._calm_step()
            if not self.network and all(
                n.raw is not None and n.raw.quiesced
                for n in self.nodes.values()
                if n.id in self.members
            ):
                break
        else:
            raise SimFailure(f"the group of n{lead.id} never went quiet")
        lead = self.leader()  # leadership may have moved while it settled
        assert lead is not None and lead.raw is not None
        term = lead.raw.raft.term
        for _ in range(self.p.election_ticks * 3 * 4):
            self._calm_step()
        for n in self.nodes.values():
            if n.id not in self.members:
                continue
            assert n.raw is not None
            r = n.raw.raft
            if not n.raw.quiesced or r.term != term or r.lead != lead.id:
                raise SimFailure(
                    f"quiet group moved: n{n.id} quiesced={n.raw.quiesced} term={r.term}"
                    f" lead={r.lead} (leader n{lead.id} term {term})"
                )
        probe = self._client(node=lead, kind="write")
        assert probe is not None
        for _ in range(self.p.election_ticks * 3 * 2):
            self._calm_step()
            if probe.op_id in self.acked and self._converged(lead):
                return
        raise SimFailure(f"a proposal to the quiet leader n{lead.id} did not commit everywhere")

    def _stable_leader(self, lead: SimNode) -> bool:
        assert lead.raw is not None
        r = lead.raw.raft
        return r.lead_transferee is None and all(
            n.raw is not None and n.raw.raft.lead == lead.id and n.raw.raft.term == r.term
            for n in self.nodes.values()
            if n.id in self.members
        )

    def _converged(self, lead: SimNode) -> bool:
        assert lead.raw is not None
        c = lead.raw.raft.log.committed
        return all(
            n.raw is not None and n.applied == c and n.inflight is None
            for n in self.nodes.values()
            if n.id in self.members
        )

    def _calm_step(self) -> None:
        self.step_no += 1
        for n in self.nodes.values():
            if n.raw is None and n.id in self.members and not n.removed:
                self._start(n)  # a member may have joined since the calm began
        # A calm network is a set of FIFO links, as streams over TCP are.
        batch, self.network = self.network, []
        for m in batch:
            self.network.append(m)
            self._deliver(len(self.network) - 1)
        if self.step_no % 3 == 0:
            self._tick_all()
        for n in self._up():
            if n.inflight is not None:
                self._complete_ready(n)
        self._process_readies()
        self._expire_ops()
        self.checker.step(list(self.nodes.values()))

    def run(self) -> SimReport:
        try:
            for _ in range(self.p.fault_steps):
                self.step(faults=True)
            calm_steps = self.calm()
            self.quiet()
            self.checker.logs_match(list(self.nodes.values()))
            self._final_checks()
            lin = check_history(self.history, steps_max=2_000_000)
        except SimFailure as e:
            raise SimFailure(self._explain(str(e))) from None
        except Exception as e:
            raise SimFailure(self._explain(f"{type(e).__name__}: {e}")) from e
        if not lin.ok:
            raise SimFailure(self._explain(f"history not linearizable: {_describe(lin)}"))
        return SimReport(self.seed, self.step_no, calm_steps, dict(self.stats))

    def _final_checks(self) -> None:
        """Every acknowledged write is in every member's state machine."""
        states = {n.id: n.kv.data for n in self.nodes.values() if n.id in self.members and n.raw}
        first = next(iter(states.values()))
        for nid, data in states.items():
            if data != first:
                raise SimFailure(f"members disagree at the end: n{nid} {data} vs {first}")
        lead = self.leader()
        assert lead is not None
        for op_id in lead.kv.results:
            assert op_id in self.ops
        for op in self.ops.values():
            acked_write = op.input[0] != "read" and op.op_id in self.acked
            if acked_write and op.op_id not in lead.kv.results:
                raise SimFailure(f"acknowledged op {op.op_id} lost")

    def _explain(self, what: str) -> str:
        tail = "\n".join(self.trace[-40:])
        return (
            f"seed {self.seed} failed at step {self.step_no}: {what}\n"
            f"replay: ENROUTE_SEED={self.seed} pytest tests/sim/test_raft_sim.py -k replay\n"
            f"last events:\n{tail}"
        )


@dataclass(frozen=True, slots=True)
class SimReport:
    seed: int
    steps: int
    calm_steps: int
    stats: dict[str, int]


def _describe(result: CheckResult) -> str:
    ops = "\n".join(
        f"  {o.op_id}: {o.input} -> {o.output} [{o.call}, {o.ret}]"
        for o in sorted(result.operations, key=lambda o: o.call)
    )
    return f"{result.verdict.value} on key {result.key!r}:\n{ops}"


def params_for(seed: int) -> SimParams:
    """Every fourth schedule runs five nodes; some run without CheckQuorum or PreVote; every
    third wipes disks."""
    return SimParams(
        nodes=5 if seed % 4 == 3 else 3,
        check_quorum=seed % 7 != 5,
        pre_vote=seed % 5 != 4,
        wipes=seed % 3 == 1,
    )


def run_seed(seed: int, make: Callable[[int], SimParams] = params_for) -> SimReport:
    return Sim(seed, make(seed)).run()
