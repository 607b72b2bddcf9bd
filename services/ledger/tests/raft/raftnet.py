"""A synchronous network of ``Raft`` state machines for unit tests (etcd's ``network``).

Messages are delivered breadth-first until none are left. Entries stay in the
unstable log (nothing is persisted), which is all the protocol logic needs;
tests of the Ready contract drive ``RawNode`` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from enroute_core.base.errors import ProposalDropped
from enroute_core.base.ids import LogIndex, NodeId, Term
from enroute_ledger.raft import (
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    Raft,
    RaftConfig,
    SplitMix64,
)

MT = MessageType


def ids(*ns: int) -> frozenset[NodeId]:
    return frozenset(NodeId(n) for n in ns)


def new_raft(
    node: int,
    peers: Iterable[int],
    *,
    election: int = 10,
    heartbeat: int = 1,
    storage: MemoryStorage | None = None,
    learners: Iterable[int] = (),
    pre_vote: bool = False,
    check_quorum: bool = False,
    seed: int = 0,
    **kw: int,
) -> Raft:
    if storage is None:
        storage = MemoryStorage(conf_state=ConfState(ids(*peers), ids(*learners)))
    cfg = RaftConfig(
        NodeId(node),
        election_ticks=election,
        heartbeat_ticks=heartbeat,
        pre_vote=pre_vote,
        check_quorum=check_quorum,
        **kw,  # type: ignore[arg-type]
    )
    return Raft(cfg, storage, SplitMix64(seed * 1000 + node))


def storage_with(entries: Iterable[tuple[int, int]], peers: Iterable[int]) -> MemoryStorage:
    """A storage holding entries given as (index, term), starting at index 1."""
    st = MemoryStorage(conf_state=ConfState(ids(*peers)))
    st.append([Entry(Term(t), LogIndex(i)) for i, t in entries])
    return st


def read(r: Raft) -> list[Message]:
    msgs, r.msgs = r.msgs, []
    return msgs


def hup(node: int) -> Message:
    return Message(MT.HUP, NodeId(node), NodeId(node))


def prop(node: int, *datas: bytes) -> Message:
    ents = tuple(Entry(Term(0), LogIndex(0), EntryType.NORMAL, d) for d in (datas or (b"x",)))
    return Message(MT.PROP, NodeId(node), NodeId(node), entries=ents)


def msg(t: MessageType, frm: int, to: int, **kw: object) -> Message:
    return Message(t, NodeId(to), NodeId(frm), **kw)  # type: ignore[arg-type]


def persist(r: Raft) -> None:
    """Move the unstable tail to storage, as a driver does after a Ready."""
    st = r.log.storage
    assert isinstance(st, MemoryStorage)
    if r.log.unstable.snapshot is not None:
        st.apply_snapshot(r.log.unstable.snapshot)
        r.log.stable_snap_to(r.log.unstable.snapshot.index)
    ents = r.log.unstable_entries()
    if ents:
        st.append(ents)
        r.log.stable_to(ents[-1].index, ents[-1].term)


class Network:
    def __init__(self, *peers: Raft | None, **kw: object) -> None:
        n = len(peers)
        self.peers: dict[NodeId, Raft] = {}
        for i, p in enumerate(peers, start=1):
            self.peers[NodeId(i)] = p if p is not None else new_raft(i, range(1, n + 1), **kw)  # type: ignore[arg-type]
        self.cut_links: set[tuple[NodeId, NodeId]] = set()
        self.ignored: set[MessageType] = set()
        self.delivered: list[Message] = []

    def __getitem__(self, node: int) -> Raft:
        return self.peers[NodeId(node)]

    def send(self, *msgs: Message) -> None:
        queue = list(msgs)
        steps = 0
        while queue:
            steps += 1
            assert steps < 100_000, "message storm"
            m = queue.pop(0)
            if m.type in self.ignored or (m.from_, m.to) in self.cut_links:
                continue
            p = self.peers.get(m.to)
            if p is None:
                continue
            self.delivered.append(m)
            with contextlib.suppress(ProposalDropped):
                p.step(m)
            queue.extend(read(p))

    def cut(self, a: int, b: int) -> None:
        self.cut_links |= {(NodeId(a), NodeId(b)), (NodeId(b), NodeId(a))}

    def isolate(self, a: int) -> None:
        for b in self.peers:
            if b != a:
                self.cut(a, b)

    def recover(self) -> None:
        self.cut_links.clear()
        self.ignored.clear()

    def ignore(self, t: MessageType) -> None:
        self.ignored.add(t)

    def tick(self, node: int, n: int = 1) -> None:
        """Tick one node ``n`` times, delivering what it sends."""
        r = self[node]
        for _ in range(n):
            r.tick()
            self.send(*read(r))
