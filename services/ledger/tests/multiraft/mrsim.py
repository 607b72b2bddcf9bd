"""A deterministic in-process cluster of ``MultiRaft`` nodes for tests.

Each round every node ticks, the batches of the previous round are delivered
(in a seeded shuffled order; batches from or to a cut node are dropped), and
every node works off its Ready: persist to MemoryStorage, queue batches,
apply, advance. Safety checks run on every Ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
from collections import Counter

from enroute_core.base.errors import ProposalDropped
from enroute_core.base.ids import Incarnation, NodeId, Term
from enroute_ledger.multiraft import (
    Batch,
    GroupId,
    GroupMessage,
    MultiRaft,
    MultiRaftConfig,
    decode_message,
    encode_message,
)
from enroute_ledger.raft import ConfState, MemoryStorage, MessageType, RaftConfig, Role


def group_ids(n: int) -> list[GroupId]:
    return [GroupId(b"repo-%d" % i, Incarnation(1)) for i in range(n)]


class Cluster:
    def __init__(
        self,
        n_nodes: int,
        n_groups: int,
        seed: int,
        *,
        election: int = 10,
        heartbeat: int = 2,
        slack: int = 1,
        use_codec: bool = False,
        hibernate_after: int = 0,
        quiet_commit: bool = True,
        campaigns_per_tick: int | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.ids = [NodeId(i) for i in range(1, n_nodes + 1)]
        self.groups = group_ids(n_groups)
        self.use_codec = use_codec
        self.nodes: dict[NodeId, MultiRaft] = {}
        self.storages: dict[tuple[NodeId, GroupId], MemoryStorage] = {}
        voters = frozenset(self.ids)
        for nid in self.ids:
            cfg = MultiRaftConfig(
                RaftConfig(nid, election_ticks=election, heartbeat_ticks=heartbeat),
                leader_slack=slack,
                hibernate_after_ticks=hibernate_after,
                quiet_commit=quiet_commit,
            )
            if campaigns_per_tick is not None:
                cfg = dataclasses.replace(cfg, campaigns_per_tick_max=campaigns_per_tick)

            def factory(g: GroupId, vs: frozenset[NodeId], nid: NodeId = nid) -> MemoryStorage:
                st = MemoryStorage(conf_state=ConfState(vs))
                self.storages[(nid, g)] = st
                return st

            mr = MultiRaft(nid, self.ids, factory, cfg)
            # the storages stand for the durable log: a woken group reads it back
            mr.on_hibernate = lambda g: True
            mr.on_wake = lambda g, nid=nid: self.storages[(nid, g)]
            for g in self.groups:
                mr.create_group(g, voters)
            self.nodes[nid] = mr
        self.queue: list[Batch] = []
        self.cut: set[NodeId] = set()
        self.applied: dict[tuple[NodeId, GroupId], list[bytes]] = {}
        self.leader_of_term: dict[tuple[GroupId, Term], NodeId] = {}
        self.round_pairs: Counter[tuple[NodeId, NodeId]] = Counter()
        self.rounds = 0
        self.heartbeats_in_batch_max = 0
        self.uncoalesced_heartbeats = 0

    # -- driving ---------------------------------------------------------------

    def run_round(self, *, tick: bool = True) -> None:
        """``tick=False``: a round shorter than a tick (Ready rounds outpace the clock)."""
        self.rounds += 1
        for mr in self.nodes.values():
            if tick:
                mr.tick()
        deliver, self.queue = self.queue, []
        self.rng.shuffle(deliver)
        for b in deliver:
            if b.from_node in self.cut or b.to_node in self.cut:
                continue
            self.nodes[b.to_node].step(self._wire(b))
        self.round_pairs = Counter()
        for nid, mr in self.nodes.items():
            if mr.has_ready():
                self._work(nid, mr)

    def _wire(self, b: Batch) -> Batch:
        if not self.use_codec:
            return b
        msgs = tuple(
            GroupMessage(gm.group, decode_message(encode_message(gm.message))) for gm in b.messages
        )
        return Batch(b.from_node, b.to_node, msgs, b.heartbeats, b.heartbeat_responses)

    def _work(self, nid: NodeId, mr: MultiRaft) -> None:
        nr = mr.ready()
        for gr in nr.groups:  # persist every group, then one (imaginary) sync
            st = self.storages[(nid, gr.group)]
            rd = gr.ready
            if rd.snapshot is not None:
                st.apply_snapshot(rd.snapshot)
            if rd.entries:
                st.append(rd.entries)
            if rd.hard_state is not None:
                st.set_hard_state(rd.hard_state)
        for b in nr.batches:
            assert b.from_node == nid
            self.round_pairs[(b.from_node, b.to_node)] += 1
            self.heartbeats_in_batch_max = max(
                self.heartbeats_in_batch_max, len(b.heartbeats) + len(b.heartbeat_responses)
            )
            self.uncoalesced_heartbeats += sum(
                gm.message.type in (MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESP)
                for gm in b.messages
            )
            self.queue.append(b)
        for gr in nr.groups:
            log = self.applied.setdefault((nid, gr.group), [])
            log.extend(e.data for e in gr.ready.committed_entries if e.data)
            if gr.ready.soft_state is not None:
                r = mr.raw_node(gr.group).raft
                if r.role is Role.LEADER:
                    key = (gr.group, r.term)
                    other = self.leader_of_term.setdefault(key, nid)
                    assert other == nid, f"two leaders in term {r.term} of {gr.group}"
        mr.advance(nr)

    def run_until(self, cond: object, rounds_max: int) -> int:
        assert callable(cond)
        for i in range(rounds_max):
            if cond():
                return i
            self.run_round()
        raise AssertionError(f"condition not met in {rounds_max} rounds")

    # -- views -------------------------------------------------------------------

    def leader(self, g: GroupId, via: NodeId) -> NodeId | None:
        return self.nodes[via].lead_of(g)  # never wakes a hibernated group

    def live(self) -> list[NodeId]:
        return [n for n in self.ids if n not in self.cut]

    def all_led(self) -> bool:
        """Every group has one leader that every live node agrees on, and it is live."""
        live = self.live()
        for g in self.groups:
            leads = {self.leader(g, n) for n in live}
            if len(leads) != 1:
                return False
            (lead,) = leads
            if lead not in live:
                return False
            if not self.nodes[lead].is_leader(g):
                return False
        return True

    def propose(self, g: GroupId, data: bytes) -> bool:
        lead = self.leader(g, self.live()[0])
        if lead is None or lead in self.cut:
            return False
        with contextlib.suppress(ProposalDropped):
            self.nodes[lead].propose(g, data)
            return True
        return False

    def holds(self, g: GroupId, data: bytes, nodes: list[NodeId]) -> bool:
        return all(data in self.applied.get((n, g), ()) for n in nodes)

    def all_quiet(self) -> bool:
        return all(self.nodes[n].active_count() == 0 for n in self.live())

    def check_applied_prefixes(self) -> None:
        """State Machine Safety: each node applied a prefix of the same sequence."""
        for g in self.groups:
            logs = sorted((self.applied.get((n, g), []) for n in self.ids), key=len)
            for shorter, longer in itertools.pairwise(logs):
                assert longer[: len(shorter)] == shorter, g

    def commit_all(self, groups: list[GroupId], tag: bytes, rounds_max: int) -> int:
        """Propose ``tag + repo`` to each group, retrying dropped ones, until all live apply it."""
        waiting = {g: tag + g.repo for g in groups}
        proposed_at: dict[GroupId, int] = {}
        for i in range(rounds_max):
            live = self.live()
            for g, data in list(waiting.items()):
                if self.holds(g, data, live):
                    del waiting[g]
                elif self.rounds - proposed_at.get(g, -100) > 20 and self.propose(g, data):
                    proposed_at[g] = self.rounds
            if not waiting:
                return i
            self.run_round()
        raise AssertionError(f"{len(waiting)} proposals not applied in {rounds_max} rounds")
