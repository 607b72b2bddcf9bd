"""Deterministic simulation of ledger voters: the real driver, multi-Raft node and machine.

``raft_sim`` drives one ``RawNode`` per node; this drives each voter's real
:class:`enroute_ledger.runtime.Runtime` (its Ready rounds, ``begin_ready`` and
``finish_ready``, the hosting, compaction, hibernation and blank-join code), its
:class:`MultiRaft` and the :class:`GroupMachine`, with three simulated pieces of
I/O in place of the real ones: a store (:class:`sim_store.SimStore`: writes are
durable only once synced, a crash may lose what was not), a network (batches lost,
duplicated, reordered, partitioned) and a clock (ticks of the schedule). As
TigerBeetle runs its replica, nothing else is mocked.

The clients call the node's real client API (:mod:`enroute_ledger.client`): each
proposal, genesis and read barrier is a tracker opened at a voter and polled every
step with that voter's clock, as the coroutines of :mod:`enroute_ledger.calls` poll
it; re-proposal, deadlines and answers are the production code's.

One seed fixes everything. A run is a fault phase (crashes that lose unsynced
writes or not, restarts, wiped disks that come back blank, partitions, leadership
transfers, compactions that make lagging voters take snapshots, repositories
deleted and created again, their old incarnations dropped), then a calm phase
(the network heals, every voter restarts; each group must elect a leader, commit a
probe, converge, and readmit every blank voter within a bound), then a quiet phase
(every group hibernates on every voter, then a probe must wake and commit it).
After every step: Election Safety, committed entries never change, Leader
Completeness, and every voter's state after applying index i is the same. At the
end the clients' CAS history on each repository must be linearizable.

The driver under test is a class: :class:`DriverSim` takes a ``Runtime`` subclass, so
a test can plant a driver bug and see the schedules catch it (test_driver_sim.py).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from raft_sim import SimFailure, _describe
from sim_store import SimStore

from enroute_core.base.errors import EnrouteError, ProposalDropped, Unavailable
from enroute_core.base.ids import LogIndex, NodeId, ObjectId
from enroute_core.state import (
    MISSING,
    Activate,
    Commit,
    Delete,
    OutcomeCode,
    RefStatus,
    RefUpdate,
    RepoState,
    apply,
    decode_change,
    encode_command,
)
from enroute_ledger.client import Proposal, ReadBarrier
from enroute_ledger.group import Group
from enroute_ledger.hosting import hosted_gid
from enroute_ledger.machine import Applied, command_entry, genesis_entry
from enroute_ledger.multiraft import Batch, GroupId
from enroute_ledger.raft import ConfChange, ConfChangeType, MessageType, Role
from enroute_ledger.runtime import ReadyRound, Runtime, RuntimeConfig
from enroute_testing.linearizability import History, check_history

REPOS = ("r0", "r1")
VALUES = 4
MAIN = b"refs/heads/main"
TICK_S = 0.1


@dataclass(frozen=True, slots=True)
class DriverParams:
    nodes: int = 3
    fault_steps: int = 150
    calm_steps_max: int = 600
    election_ticks: int = 8
    heartbeat_ticks: int = 2
    loss: float = 0.05
    duplicate: float = 0.03
    client_timeout_s: float = 2.0
    """A client call's deadline on the voter's clock (20 ticks)."""
    recreate_chance: float = 0.06
    """Of a fault: delete a repository and create it again (seed 001, "Lifecycle")."""
    recreates_max: int = 2
    wipes: bool = False
    wipe_chance: float = 0.5
    membership_changes: bool = True
    """One voter added to every group, then one removed (docs/raft.md, "Membership
    changes": one server at a time, group by group)."""
    hibernate_after_ticks: int = 6
    dedup_window: int = 24


def params_for(seed: int) -> DriverParams:
    """Every eighth schedule runs five voters; every third wipes disks; every other one
    changes the membership."""
    return DriverParams(
        nodes=5 if seed % 8 == 7 else 3, wipes=seed % 3 == 1, membership_changes=seed % 2 == 0
    )


@dataclass(slots=True)
class ClientOp:
    """One client call at one voter, through the driver's client API (enroute_ledger.client):
    a proposal or a read barrier, polled each step as the coroutines poll it."""

    op_id: int
    repo: str
    input: tuple[object, ...]
    node: NodeId
    life: int
    g: Group
    call: Proposal | ReadBarrier


@dataclass(slots=True)
class Genesis:
    """A genesis proposal open at a voter (Lifecycle's claim, or a restore)."""

    node: NodeId
    life: int
    g: Group
    call: Proposal


@dataclass(slots=True)
class Voter:
    id: NodeId
    store: SimStore
    rt: Runtime | None = None
    life: int = 0
    inflight: ReadyRound | None = None
    blank: int = 0


class SimLink:
    """The runtime's transport: batches go into the simulated network."""

    def __init__(self, sim: DriverSim, node: NodeId) -> None:
        self.sim, self.node = sim, node

    def send(self, batch: Batch) -> None:
        self.sim.send(batch)


def _oid(value: int) -> ObjectId:
    return ObjectId(bytes([value + 1]) * 20)


def _value(state_refs: object, ref: bytes = MAIN) -> int | None:
    v = state_refs.get(ref)  # type: ignore[attr-defined]
    return None if v is None else v.oid[0] - 1


class DriverSim:
    def __init__(
        self, seed: int, params: DriverParams | None = None, runtime: type[Runtime] = Runtime
    ) -> None:
        self.seed = seed
        self.p = params or DriverParams()
        self.runtime = runtime
        self.rng = random.Random(seed)
        self.wipe_rng = random.Random(seed ^ 0x5EED_0F_D15C)
        self.member_rng = random.Random(seed ^ 0x3E3B_E125)
        self.now = 0.0
        self.step_no = 0
        self.trace: list[str] = []
        self.stats: dict[str, int] = {}
        self.network: list[Batch] = []
        self.partition: frozenset[NodeId] | None = None
        self.loss, self.duplicate = self.p.loss, self.p.duplicate
        self.history = History()
        self.ops: dict[int, ClientOp] = {}
        self.open_ops: dict[int, ClientOp] = {}
        self.next_op = 1
        self.acked: set[int] = set()
        self.next_blank = 1
        self.incarnation = dict.fromkeys(REPOS, 1)
        self.unborn = set(REPOS)
        """Repositories whose current incarnation has no genesis applied at a leader yet."""
        self.genesis_base: dict[str, RepoState] = dict.fromkeys(REPOS, MISSING)
        self.genesis: dict[str, Genesis] = {}
        self.deleting: dict[str, ClientOp] = {}
        self.recreates = 0
        # -- invariants --
        self.leaders: dict[tuple[GroupId, int], NodeId] = {}
        self.committed: dict[tuple[GroupId, int], tuple[int, bytes]] = {}
        self.commit_term: dict[tuple[GroupId, int], int] = {}
        self.commit_seen: dict[tuple[NodeId, int, GroupId], int] = {}
        self.applied_at: dict[tuple[GroupId, int], object] = {}
        self.op_applied_at: dict[tuple[GroupId, int], int] = {}
        self.checked_leaders: set[tuple[NodeId, GroupId, int]] = set()
        self.gids = {repo: hosted_gid(repo.encode(), 1) for repo in REPOS}
        self.voters = {NodeId(i): Voter(NodeId(i), SimStore()) for i in range(1, self.p.nodes + 1)}
        self.members = set(self.voters)
        """The ledger's membership: every group's voters once no change is open."""
        self.change: tuple[ConfChangeType, NodeId] | None = None
        self.changes = 0
        self.retired: set[NodeId] = set()
        for v in self.voters.values():
            self._start(v, found=True)

    # -- bookkeeping -----------------------------------------------------------------------

    def _log(self, what: str) -> None:
        self.trace.append(f"{self.step_no}: {what}")

    def _count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    def _up(self) -> list[Voter]:
        return [v for v in self.voters.values() if v.rt is not None]

    def _live(self) -> list[Voter]:
        """Voters not retired by a membership change, up or down."""
        return [v for v in self.voters.values() if v.id not in self.retired]

    def _peers_of(self, node: NodeId) -> tuple[NodeId, ...]:
        return tuple(n for n in sorted(self.voters) if n != node and n not in self.retired)

    def leader_of(self, repo: str) -> Voter | None:
        """The voter leading ``repo``'s group in the highest term, if any."""
        gid, best, term = self.gids[repo], None, -1
        for v in self._up():
            assert v.rt is not None
            if v.rt.mr.is_leader(gid) and v.rt.mr.term_of(gid) > term:
                best, term = v, v.rt.mr.term_of(gid)
        return best

    # -- voters ----------------------------------------------------------------------------

    def _start(self, v: Voter, *, found: bool = False) -> None:
        v.life += 1
        cfg = RuntimeConfig(
            node_id=v.id,
            peers=self._peers_of(v.id),
            tick_interval_s=TICK_S,
            election_ticks=self.p.election_ticks,
            heartbeat_ticks=self.p.heartbeat_ticks,
            dedup_window_entries=self.p.dedup_window,
            hibernate_after_s=TICK_S * self.p.hibernate_after_ticks,
        )
        rt = self.runtime(
            cfg,
            v.store,  # type: ignore[arg-type]
            clock=lambda: self.now,
            nonce=bytes([v.id, v.life % 256]) * 4,
            seed=self.seed * 1_000_003 + v.id * 7919 + v.life,
            blank_id=v.blank,
            blank_repos=REPOS if v.blank else (),
        )
        rt.set_founding_voters(frozenset(self.members))
        rt.transport = SimLink(self, v.id)
        life = v.life
        rt.on_applied = lambda g, res: self._applied(v, life, g, res)
        rt.on_unknown_group = lambda gid: self._join(v, gid)
        v.rt, v.inflight = rt, None
        if found or (v.blank and not v.store.groups()):
            for gid in self.gids.values():  # founders, or a wiped voter joining blank
                self._join(v, gid)
        else:
            # the stored groups (a blank one keeps its mark); a voter added later hosts
            # a group at its first message; ended incarnations are dropped (startup)
            rt.recover()
            self._drop_ended(v)

    def _join(self, v: Voter, gid: GroupId, *, campaign: bool = False) -> None:
        """Host ``gid`` as the Lifecycle does (its boot rows durable first); never an
        ended incarnation (its peers' messages for it are forgotten)."""
        rt = v.rt
        assert rt is not None
        if gid in rt.groups:
            return
        if gid not in self.gids.values():
            rt.forget_orphans(gid)
            return
        boot = rt.founder.boot_rows(gid, gid.repo.decode(), campaign=campaign)
        v.store.commit(boot.batch)
        rt.founder.booted(boot)

    def _crash(self, v: Voter, *, lose_unsynced: bool) -> None:
        assert v.rt is not None
        self._log(f"crash n{v.id} lose_unsynced={lose_unsynced}")
        self._count("crash_lossy" if lose_unsynced else "crash")
        self._harvest(v.rt)
        v.store.crash(lose_unsynced=lose_unsynced)
        v.rt, v.inflight = None, None
        for op in list(self.open_ops.values()):
            if op.node == v.id:
                self._finish(op, "info")

    def _harvest(self, rt: Runtime) -> None:
        self._count("hibernations", rt.hibernations)
        self._count("wakes", rt.wakes)
        self._count("readmit", rt.blank_readmitted)
        self._count("snapshots_applied", rt.snapshots_applied)
        self._count("duplicates_skipped", rt.duplicates_skipped)
        self._count("early_sent", rt.early_sent)
        self._count("repropose", rt.client.reproposals)

    def _may_wipe(self) -> bool:
        """One lost disk at a time, as in raft_sim (two lost before the first is readmitted
        lose entries only they held, which no Raft survives)."""
        return (
            self.p.wipes
            and self.wipe_rng.random() < self.p.wipe_chance
            and all(not v.blank for v in self.voters.values())
            and self.change is None
        )

    def _restart(self, v: Voter) -> None:
        if self._may_wipe():
            v.store = SimStore()
            v.blank = self.next_blank
            self.next_blank += 1
            self._log(f"wipe n{v.id} (blank {v.blank})")
            self._count("wipe")
        self._log(f"restart n{v.id}")
        self._start(v)

    # -- the driver's rounds ---------------------------------------------------------------

    def _take_ready(self, v: Voter) -> None:
        """The runtime's loop: take a Ready, write it, and finish it once it is durable."""
        for _ in range(3):
            rt = v.rt
            if rt is None or v.inflight is not None:
                return
            drops = rt.drop_batch()  # between Readies, as the loop's _drain
            if drops is not None:
                v.store.commit(drops)
            if not rt.mr.has_ready():
                return
            rnd = rt.begin_ready(rt.mr.ready())
            if rnd.batch.ops:
                v.store.submit(rnd.batch)
                if rnd.nr.must_sync:
                    v.inflight = rnd
                    if self.rng.random() < 0.6:
                        return
                    self._complete(v)
                    continue
            rt.finish_ready(rnd)

    def _complete(self, v: Voter) -> None:
        rnd, rt = v.inflight, v.rt
        assert rnd is not None and rt is not None
        v.store.sync()
        v.inflight = None
        rt.finish_ready(rnd)

    def _applied(self, v: Voter, life: int, g: Group, res: Applied | None) -> None:
        """State Machine Safety: every voter's state after applying index i is the same."""
        if res is None:
            return
        st = res.state
        digest = (st.version, st.deleted, tuple(sorted((k, r.oid) for k, r in st.refs.items())))
        seen = self.applied_at.setdefault((g.gid, g.applied), digest)
        if seen != digest:
            raise SimFailure(
                f"state machine safety: n{v.id} applied {g.repo}@{g.applied} to {digest}, "
                f"another voter to {seen}"
            )
        if not res.change:
            return  # a genesis after the first (EXISTS), or a restore: moves no ref
        change = decode_change(res.change)
        if change.refs and change.refs[0].status is RefStatus.OK:
            # a commit sets the ref's time to its stamp, the client's op id: one op
            # moves the ref at one log index only, however often it was proposed
            op_id = st.refs[MAIN].set_time_us
            first = self.op_applied_at.setdefault((g.gid, op_id), g.applied)
            if first != g.applied:
                raise SimFailure(
                    f"op {op_id} applied twice on n{v.id}: {g.repo}@{first} and @{g.applied}"
                )

    # -- network ---------------------------------------------------------------------------

    def send(self, batch: Batch) -> None:
        if self.rng.random() < self.loss:
            self._count("lost")
            self._snap_report(batch, ok=False)
            return
        self.network.append(batch)
        if self.rng.random() < self.duplicate:
            self._count("duplicated")
            self.network.append(batch)

    def _snap_report(self, batch: Batch, *, ok: bool) -> None:
        """What the transport tells the sender of a snapshot (SendSnapshot's outcome)."""
        sender = self.voters.get(batch.from_node)
        for gm in batch.messages:
            if gm.message.type is MessageType.SNAP and sender is not None and sender.rt:
                self._count("snapshot_sent" if ok else "snapshot_failed")
                with contextlib.suppress(EnrouteError):
                    sender.rt.mr.report_snapshot(gm.group, batch.to_node, ok=ok)

    def _blocked(self, a: NodeId, b: NodeId) -> bool:
        p = self.partition
        return p is not None and ((a in p) != (b in p))

    def _deliver(self, i: int) -> None:
        net = self.network
        net[i], net[-1] = net[-1], net[i]
        b = net.pop()
        to = self.voters.get(b.to_node)
        if to is None or to.rt is None or self._blocked(b.from_node, b.to_node):
            self._snap_report(b, ok=False)
            return
        to.rt.step(b)
        self._snap_report(b, ok=True)
        self._take_ready(to)

    # -- clients ---------------------------------------------------------------------------

    def _finish(self, op: ClientOp, how: str, output: object = None) -> None:
        del self.open_ops[op.op_id]
        self._close(op)
        if how == "ok":
            self.history.ok(op.op_id, output)
            self.acked.add(op.op_id)
        elif how == "fail":
            self.history.fail(op.op_id)
        else:
            self.history.info(op.op_id)
        self._count(f"op_{how}")

    def _close(self, op: ClientOp | Genesis) -> None:
        """What the coroutines' ``finally`` does: the call leaves its group."""
        v = self.voters[op.node]
        if v.rt is None or v.life != op.life:
            return
        if isinstance(op.call, ReadBarrier):
            v.rt.client.close_read(op.call, op.g)
        else:
            v.rt.client.close(op.call, op.g)

    def _pick(self, repo: str) -> Voter | None:
        gid = self.gids[repo]
        up = [v for v in self._up() if v.rt is not None and gid in v.rt.groups]
        if not up:
            return None
        lead = self.leader_of(repo)
        return lead if lead is not None and self.rng.random() < 0.7 else self.rng.choice(up)

    def client(self, *, repo: str | None = None, node: Voter | None = None) -> ClientOp | None:
        repo = repo or self.rng.choice(REPOS)
        node = node or self._pick(repo)
        if node is None:
            return None
        kind = self.rng.choice(("read", "cas", "cas"))
        op_input: tuple[object, ...]
        if kind == "read":
            op_input = ("read",)
        else:
            old = self.rng.choice((None, *range(VALUES)))
            op_input = ("cas", old, self.rng.randrange(VALUES))
        data = b""
        if kind == "cas":
            upd = RefUpdate(MAIN, None if old is None else _oid(old), _oid(int(op_input[2])))  # type: ignore[arg-type]
            cmd = Commit(self.incarnation[repo], (upd,), None, self.next_op, True)
            data = encode_command(cmd)
        return self._call(repo, node, op_input, data)

    def _call(
        self, repo: str, node: Voter, op_input: tuple[object, ...], command: bytes
    ) -> ClientOp:
        """Open a call at ``node`` as Lifecycle.propose / describe does, and poll it once."""
        rt = node.rt
        assert rt is not None
        g = rt.groups[self.gids[repo]]
        op_id = self.next_op
        self.next_op += 1
        self.history.invoke(op_id, repo, *op_input)
        deadline = self.now + self.p.client_timeout_s
        call: Proposal | ReadBarrier
        if op_input[0] == "read":
            call = rt.client.open_read(g, deadline)
        else:
            rid = op_id.to_bytes(16, "big")  # a caller's request id, kept across its retries
            call = rt.client.open(g, command_entry(rid, command), rid, deadline)
        op = ClientOp(op_id, repo, op_input, node.id, node.life, g, call)
        self.ops[op_id] = op
        self.open_ops[op_id] = op
        self._poll(op)
        return op

    def _poll(self, op: ClientOp) -> None:
        v = self.voters[op.node]
        if v.rt is None or v.life != op.life:
            return
        if isinstance(op.call, ReadBarrier):
            v.rt.client.poll_read(op.call, op.g, self.now)
        else:
            v.rt.client.poll(op.call, op.g, self.now)
        if op.call.done:
            self._answer(op)

    def _serve(self) -> None:
        """Poll every open call, as its coroutine does on each change of its group."""
        for op in list(self.open_ops.values()):
            self._poll(op)

    def _answer(self, op: ClientOp) -> None:
        call = op.call
        if isinstance(call, ReadBarrier):
            if call.error is not None:
                self._finish(op, "fail")
            else:  # the barrier passed: read the applied state, as describe does
                self._finish(op, "ok", _value(op.g.state.refs))
            return
        if call.error is not None:
            # Unavailable: nothing was appended; a timeout or a drop: unknown
            self._finish(op, "fail" if isinstance(call.error, Unavailable) else "info")
            return
        res = call.result()
        if op.input[0] == "write":  # a Delete: the register reads None from its apply on
            done = res.outcome.code in (OutcomeCode.OK, OutcomeCode.ALREADY_DELETED)
            self._finish(op, "ok" if done else "info")
            return
        change = decode_change(res.change)
        if not change.refs:  # a copy answered after the details were let go, or ended
            self._finish(op, "info")
            return
        self._finish(op, "ok", change.refs[0].status is RefStatus.OK)

    # -- faults ----------------------------------------------------------------------------

    def _fault(self) -> None:
        r = self.rng.random()
        up = self._up()
        down = [v for v in self._live() if v.rt is None]
        f = (len(self.members) - 1) // 2
        if r < 0.25:
            if up and len(down) < f:
                self._crash(self.rng.choice(up), lose_unsynced=self.rng.random() < 0.5)
        elif r < 0.5:
            if down:
                self._restart(self.rng.choice(down))
        elif r < 0.6:
            side = frozenset(n for n in sorted(self.voters) if self.rng.random() < 0.5)
            self.partition = side
            self._log(f"partition {sorted(side)}")
            self._count("partition")
        elif r < 0.7:
            self.partition = None
            self._log("heal")
        elif r < 0.8:
            self._transfer()
        elif r < 1.0 - self.p.recreate_chance:
            if up:
                self._compact(self.rng.choice(up))
        else:
            self._begin_recreate()

    def _transfer(self) -> None:
        repo = self.rng.choice(REPOS)
        lead = self.leader_of(repo)
        if lead is None or lead.rt is None:
            return
        to = self.rng.choice([n for n in sorted(self.voters) if n != lead.id])
        self._log(f"transfer {repo} n{lead.id} -> n{to}")
        self._count("transfer")
        lead.rt.mr.transfer_leader(self.gids[repo], to)

    def _compact(self, v: Voter) -> None:
        """A checkpoint at the applied index, then the log compacted (the Checkpointer)."""
        rt = v.rt
        assert rt is not None
        if v.inflight is not None:
            return  # the loop compacts between Readies
        g = rt.groups.get(self.gids[self.rng.choice(REPOS)])
        if g is None or g.hibernated or not g.born:
            return
        if g.applied <= int(g.mem.snapshot().metadata.index) + 2:
            return
        rt.compact(g, g.state, g.applied)
        batch, done = rt.compaction_batch()
        if done:
            v.store.commit(batch)
            rt.compacted(done)
            self._log(f"compact n{v.id} {g.repo} at {g.applied}")
            self._count("compact")

    # -- lifecycle (seed 001, "Lifecycle"): genesis, delete, create again ------------------

    def _drive_genesis(self) -> None:
        """Propose each unborn group's genesis at its leader through the client API, as
        Lifecycle's claim (or a node restoring it) does; done once a leader applied it."""
        for repo in sorted(self.unborn):
            lead = self.leader_of(repo)
            open_call = self.genesis.get(repo)
            if open_call is not None:
                v = self.voters[open_call.node]
                if v.rt is not None and v.life == open_call.life and not open_call.call.done:
                    v.rt.client.poll(open_call.call, open_call.g, self.now)
                if open_call.call.done or v.rt is None or v.life != open_call.life:
                    self._close(open_call)
                    del self.genesis[repo]
            if lead is None or lead.rt is None:
                continue
            g = lead.rt.groups[self.gids[repo]]
            if g.born:
                self.unborn.discard(repo)
                if self.genesis.get(repo) is not None:
                    self._close(self.genesis.pop(repo))
                self._log(f"{repo}: incarnation {g.state.incarnation} born")
                continue
            if repo not in self.genesis and self.step_no % 5 == 0:
                act = Activate(create=True, head=MAIN)
                rid = lead.rt.client.request_id()
                entry = genesis_entry(rid, self.genesis_base[repo], act)
                call = lead.rt.client.open(g, entry, rid, self.now + self.p.client_timeout_s)
                self.genesis[repo] = Genesis(lead.id, lead.life, g, call)
                lead.rt.client.poll(call, g, self.now)

    def _begin_recreate(self) -> None:
        """Delete a repository through the log (its register reads None from then on);
        once the tombstone applied, the next incarnation is created and the old group
        dropped on every voter (Lifecycle: claim, ``_drop_older``)."""
        repo = self.rng.choice(REPOS)
        if (
            self.recreates >= self.p.recreates_max
            or repo in self.unborn
            or repo in self.deleting
            or self.change is not None
        ):
            return
        node = self._pick(repo)
        if node is None:
            return
        self.recreates += 1
        self._log(f"delete {repo} (incarnation {self.incarnation[repo]}) at n{node.id}")
        cmd = encode_command(Delete(self.incarnation[repo]))
        self.deleting[repo] = self._call(repo, node, ("write", None), cmd)

    def _drive_recreate(self) -> None:
        for repo, op in list(self.deleting.items()):
            if op.op_id in self.open_ops:
                continue
            tomb = self._tombstone(repo)
            if tomb is None:  # the delete was lost or is not applied yet: delete again
                node = self._pick(repo)
                if node is not None and self.step_no % 5 == 0:
                    cmd = encode_command(Delete(self.incarnation[repo]))
                    self.deleting[repo] = self._call(repo, node, ("write", None), cmd)
                continue
            del self.deleting[repo]
            self._recreate(repo, tomb)

    def _tombstone(self, repo: str) -> RepoState | None:
        """The deleted state of ``repo``'s group, if a voter applied the tombstone."""
        gid = self.gids[repo]
        for v in self._up():
            assert v.rt is not None
            g = v.rt.groups.get(gid)
            if g is not None and g.born and g.deleted:
                return g.state
        return None

    def _recreate(self, repo: str, tomb: RepoState) -> None:
        claimed = apply(tomb, Activate(create=True, head=MAIN), log_index=0).state
        new = hosted_gid(repo.encode(), claimed.incarnation)
        self.gids[repo] = new
        self.incarnation[repo] = claimed.incarnation
        self.genesis_base[repo] = tomb
        self.unborn.add(repo)
        self._log(f"create {repo} incarnation {claimed.incarnation}; drop the old one")
        self._count("recreated")
        claimant = self.rng.choice([v for v in self._up() if v.id in self.members])
        self._join(claimant, new, campaign=True)
        for v in self._up():
            self._drop_ended(v)

    def _drop_ended(self, v: Voter) -> None:
        """Drop every hosted incarnation that is not the current one (Lifecycle's
        ``_drop_older`` and ``startup``)."""
        rt = v.rt
        assert rt is not None
        live = set(self.gids.values())
        for gid, g in list(rt.groups.items()):
            if gid not in live:
                rt.drop(g)
                self._count("dropped")

    # -- membership changes (docs/raft.md, "Membership changes") ----------------------------

    def _begin_change(self) -> None:
        """Grow by one new voter, or (after that) remove one; never with a blank voter."""
        if self.change is not None or self.changes >= 2 or any(v.blank for v in self._live()):
            return
        if len(self.members) == self.p.nodes:
            new = NodeId(max(self.voters) + 1)  # ids are never reused
            self.voters[new] = Voter(new, SimStore())
            for v in self._up():
                assert v.rt is not None
                v.rt.mr.set_peers(self._peers_of(v.id))
            self._start(self.voters[new])
            self.change = (ConfChangeType.ADD_NODE, new)
        else:
            self.change = (ConfChangeType.REMOVE_NODE, self.member_rng.choice(sorted(self.members)))
        self.changes += 1
        self._log(f"membership: {self.change[0].name} n{self.change[1]} in every group")
        self._count("conf_change")

    def _drive_change(self) -> None:
        """Propose the open change at each group's leader until every group applied it."""
        if self.change is None:
            return
        kind, node = self.change
        open_groups = 0
        for repo, gid in self.gids.items():
            lead = self.leader_of(repo)
            if lead is None or lead.rt is None:
                open_groups += 1
                continue
            if not self._settled(lead, gid):
                open_groups += 1
                continue
            if (node in lead.rt.mr.voters_of(gid)) == (kind is ConfChangeType.ADD_NODE):
                continue
            open_groups += 1
            if self.step_no % 7:
                continue
            if kind is ConfChangeType.REMOVE_NODE and lead.id == node:
                to = self.member_rng.choice(sorted(self.members - {node}))
                lead.rt.mr.transfer_leader(gid, to)  # a leader being removed hands over first
                continue
            with contextlib.suppress(ProposalDropped):
                lead.rt.mr.propose_conf_change(gid, ConfChange(kind, node))
        if not open_groups:
            self._change_done(kind, node)

    def _settled(self, lead: Voter, gid: GroupId) -> bool:
        """Whether the leader's applied members are the group's: it committed an entry of
        its term, applied everything committed, and has no change in its log unapplied (a
        leader restarted from an older snapshot applies the changes after it again)."""
        rt = lead.rt
        assert rt is not None
        if rt.mr.is_hibernated(gid):
            return True  # hibernated only once settled
        r = rt.mr.raw_node(gid).raft
        committed = r.log.committed
        return (
            r.log.term(committed) == r.term
            and rt.groups[gid].applied == committed
            and r.pending_conf_index <= committed
        )

    def _change_done(self, kind: ConfChangeType, node: NodeId) -> None:
        self.change = None
        self._log(f"membership: {kind.name} n{node} applied in every group")
        self._count("conf_applied")
        if kind is ConfChangeType.ADD_NODE:
            self.members.add(node)
        else:
            self.members.discard(node)
            gone = self.voters[node]
            if gone.rt is not None:
                self._crash(gone, lose_unsynced=False)  # the operator stops it
            self.retired.add(node)
        for v in self._up():
            assert v.rt is not None
            v.rt.set_founding_voters(frozenset(self.members))
            v.rt.mr.set_peers(self._peers_of(v.id))

    # -- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        for v in self._up():
            rt = v.rt
            assert rt is not None
            if rt.blank_groups == 0 and v.blank:
                v.blank = 0
                self._log(f"n{v.id} readmitted everywhere")
            for gid in list(rt.groups):
                if rt.mr.is_hibernated(gid):
                    continue
                raw = rt.mr.raw_node(gid)
                r = raw.raft
                if r.role is Role.LEADER:
                    # Election Safety: at most one leader per term (§5.2).
                    other = self.leaders.setdefault((gid, int(r.term)), v.id)
                    if other != v.id:
                        raise SimFailure(
                            f"election safety: n{other} and n{v.id} lead {gid!r} term {r.term}"
                        )
                    if (v.id, gid, int(r.term)) not in self.checked_leaders:
                        self.checked_leaders.add((v.id, gid, int(r.term)))
                        self._leader_complete(v, gid, raw)
                self._committed_prefix(v, gid, raw, int(rt.groups[gid].mem.hard_state.commit))

    def _leader_complete(self, v: Voter, gid: GroupId, raw: object) -> None:
        """Leader Completeness (§5.4): a leader of a later term holds every committed entry."""
        log = raw.raft.log  # type: ignore[attr-defined]
        term_now = int(raw.raft.term)  # type: ignore[attr-defined]
        first, last = log.first_index(), log.last_index()
        for (g, index), (term, _) in self.committed.items():
            if g != gid or self.commit_term[(g, index)] >= term_now or index < first:
                continue
            if index > last or log.term(LogIndex(index)) != term:
                raise SimFailure(
                    f"leader completeness: n{v.id} leads {gid!r} term {term_now} without "
                    f"entry {index} (term {term}) committed by term {self.commit_term[(g, index)]}"
                )

    def _committed_prefix(self, v: Voter, gid: GroupId, raw: object, shown: int) -> None:
        """A committed entry never changes, on any voter.

        Committed here means committed as of the last Ready this voter finished
        (``shown``, the commit index of the hard state it handed its log): a leader
        that sent its appends before its own fsync may count its unsynced copy, and
        nothing reveals that commit index before the next Ready, which is taken once
        the copy is durable (Runtime._send_early)."""
        log = raw.raft.log  # type: ignore[attr-defined]
        hi = min(int(log.committed), shown)
        key = (v.id, v.life, gid)
        seen = self.commit_seen.get(key, 0)
        if hi <= seen:
            return
        lo = max(seen, int(log.first_index()) - 1)
        term_now = int(raw.raft.term)  # type: ignore[attr-defined]
        for e in log.slice(LogIndex(lo + 1), LogIndex(hi + 1), 1 << 62):
            known = self.committed.setdefault((gid, int(e.index)), (int(e.term), e.data))
            if known != (int(e.term), e.data):
                raise SimFailure(
                    f"committed entry {gid!r}@{e.index} differs on n{v.id}: "
                    f"{known} vs ({e.term}, {e.data[:24]!r})"
                )
            k = (gid, int(e.index))
            self.commit_term[k] = min(self.commit_term.get(k, term_now), term_now)
        self.commit_seen[key] = hi

    # -- steps -----------------------------------------------------------------------------

    def _tick_all(self, drift: float = 0.0) -> None:
        self.now += TICK_S
        for v in self._up():
            if drift and self.rng.random() < drift:
                continue  # this voter's tick comes late
            assert v.rt is not None
            v.rt.tick()

    def _after(self) -> None:
        self._drive_change()
        self._drive_recreate()
        self._drive_genesis()
        for v in self._up():
            self._take_ready(v)
        self._serve()
        self.check()

    def step(self) -> None:
        self.step_no += 1
        rng = self.rng
        r = rng.random()
        if r < 0.2:
            self._tick_all(drift=0.25)
        elif r < 0.34:
            self.client()
        elif r < 0.46:
            pending = [v for v in self._up() if v.inflight is not None]
            if pending:
                self._complete(rng.choice(pending))
        elif r < 0.58:
            self._fault()
        if self.p.membership_changes and self.member_rng.random() < 0.02:
            self._begin_change()
        for _ in range(rng.randrange(5)):
            if not self.network:
                break
            self._deliver(rng.randrange(len(self.network)))
        self._after()

    def calm_step(self) -> None:
        self.step_no += 1
        for v in self._live():
            if v.rt is None:
                self._start(v)
        batch, self.network = self.network, []  # a calm network: FIFO links
        for b in batch:
            self.network.append(b)
            self._deliver(len(self.network) - 1)
        if self.step_no % 3 == 0:
            self._tick_all()
        for v in self._up():
            if v.inflight is not None:
                self._complete(v)
        self._after()

    # -- phases ----------------------------------------------------------------------------

    def setup(self) -> None:
        """Every group elects a leader and applies its genesis (Lifecycle's create)."""
        for _ in range(self.p.calm_steps_max):
            self.calm_step()
            if not self.unborn:
                return
        raise SimFailure(f"no genesis within {self.p.calm_steps_max} steps")

    def calm(self) -> None:
        """Heal; every group must commit a probe, converge, and readmit blank voters."""
        self.partition = None
        self.loss = self.duplicate = 0.0
        probes: dict[str, ClientOp | None] = dict.fromkeys(REPOS)
        done: set[str] = set()
        for _ in range(self.p.calm_steps_max):
            self.calm_step()
            for repo in REPOS:
                if repo in done:
                    continue
                lead = self.leader_of(repo)
                if lead is None:
                    continue
                probe = probes[repo]
                if probe is None or (
                    probe.op_id not in self.open_ops and probe.op_id not in self.acked
                ):
                    probes[repo] = self.client(repo=repo, node=lead)
                    continue
                if probe.op_id in self.open_ops:
                    continue
                if self._converged(repo, lead):
                    done.add(repo)
            if len(done) == len(REPOS):
                return
        blank = [
            f"n{v.id} {repo}"
            for v in self._up()
            for repo, gid in self.gids.items()
            if v.rt is not None and gid in v.rt.groups and v.rt.blank_of(v.rt.groups[gid])
        ]
        what = f"still blank (never readmitted): {', '.join(blank)}; " if blank else ""
        raise SimFailure(
            f"no progress within {self.p.calm_steps_max} calm steps: {what}{self._why()}"
        )

    def _converged(self, repo: str, lead: Voter) -> bool:
        assert lead.rt is not None
        gid = self.gids[repo]
        commit = lead.rt.mr.commit_of(gid)
        if self.change is not None or repo in self.unborn or repo in self.deleting:
            return False
        for v in self.voters.values():
            if v.id not in self.members:
                continue
            rt = v.rt
            if rt is None or v.inflight is not None or gid not in rt.groups:
                return False
            g = rt.groups[gid]
            if g.applied != commit or rt.blank_of(g):
                return False
        return True

    def _why(self) -> str:
        out = []
        for v in self.voters.values():
            rt = v.rt
            if rt is None:
                continue
            for repo, gid in self.gids.items():
                g = rt.groups.get(gid)
                if g is None:
                    out.append(f"n{v.id} {repo}: not hosted")
                    continue
                out.append(
                    f"n{v.id} {repo}: term {rt.mr.term_of(gid)} lead {rt.mr.lead_of(gid)} "
                    f"applied {g.applied} commit {rt.mr.commit_of(gid)} blank {rt.blank_of(g)}"
                )
        return "; ".join(out)

    def quiet(self) -> None:
        """Every group hibernates on every voter; then a write wakes one and commits."""
        for _ in range(self.p.hibernate_after_ticks * 40):
            self.calm_step()
            if all(
                v.rt is not None and v.rt.mr.is_hibernated(gid)
                for v in self.voters.values()
                if v.id in self.members
                for gid in self.gids.values()
            ):
                break
        else:
            raise SimFailure(f"the groups never hibernated everywhere: {self._why()}")
        self._count("hibernated_all")
        repo = self.rng.choice(REPOS)
        for _ in range(self.p.calm_steps_max):
            lead = self.leader_of(repo)
            if lead is not None:
                break
            self.calm_step()
        else:
            raise SimFailure(f"no leader after hibernation: {self._why()}")
        probe = self.client(repo=repo, node=lead)
        for _ in range(self.p.calm_steps_max):
            self.calm_step()
            answered = probe is not None and probe.op_id not in self.open_ops
            if answered and (self._converged(repo, lead) or self.leader_of(repo) is not lead):
                return
        raise SimFailure(f"a write to hibernated {repo} did not commit: {self._why()}")

    def run(self) -> SimReport:
        try:
            self.setup()
            for _ in range(self.p.fault_steps):
                self.step()
            self.calm()
            self.quiet()
            self._final_checks()
            lin = check_history(self.history, steps_max=2_000_000)
        except SimFailure as e:
            raise SimFailure(self._explain(str(e))) from None
        except Exception as e:
            raise SimFailure(self._explain(f"{type(e).__name__}: {e}")) from e
        if not lin.ok:
            raise SimFailure(self._explain(f"history not linearizable: {_describe(lin)}"))
        for v in self._up():
            assert v.rt is not None
            self._harvest(v.rt)
        return SimReport(self.seed, self.step_no, dict(self.stats))

    def _final_checks(self) -> None:
        """Every voter holds the same state of every repository."""
        for repo, gid in self.gids.items():
            states = {}
            for v in self._up():
                assert v.rt is not None
                if v.id not in self.members:
                    continue
                g = v.rt.groups[gid]
                states[v.id] = (g.applied, g.state.version, _value(g.state.refs))
            if len(set(states.values())) != 1:
                raise SimFailure(f"voters disagree on {repo} at the end: {states}")

    def _explain(self, what: str) -> str:
        tail = "\n".join(self.trace[-30:])
        return (
            f"seed {self.seed} failed at step {self.step_no}: {what}\n"
            f"replay: ENROUTE_SEED={self.seed} pytest tests/sim/test_driver_sim.py -k replay\n"
            f"last events:\n{tail}"
        )


@dataclass(frozen=True, slots=True)
class SimReport:
    seed: int
    steps: int
    stats: dict[str, int] = field(default_factory=dict)


def run_seed(
    seed: int,
    make: Callable[[int], DriverParams] = params_for,
    runtime: type[Runtime] = Runtime,
) -> SimReport:
    return DriverSim(seed, make(seed), runtime).run()
