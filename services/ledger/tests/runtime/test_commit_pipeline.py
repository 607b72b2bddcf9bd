"""The commit pipeline of the runtime: what may go out before an fsync, and what may not.

docs/raft.md, "The ledger runtime's loop": a leader sends its appends and
heartbeats in parallel with its own fsync (etcd's allowance), but nothing that
counts its unsynced copy is revealed before that fsync: no answer, no apply, no
commit index on the wire. A follower acknowledges only what it made durable. A
leader does not re-propose its own entry on a timer while its view holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import random
from pathlib import Path
from typing import Any

from memnet import MAIN, WAIT_S, MemNet, genesis, until

from enroute_core.base.ids import Incarnation, LogIndex, NodeId, ObjectId, Term
from enroute_core.state import Commit, OutcomeCode, RefUpdate, encode_command
from enroute_ledger import calls
from enroute_ledger.logstore import open_log_store
from enroute_ledger.machine import command_entry
from enroute_ledger.multiraft import Batch, GroupId, GroupMessage, Heartbeat
from enroute_ledger.raft.types import Entry, EntryType, Message, MessageType
from enroute_ledger.runtime import Group, Runtime, RuntimeConfig
from enroute_ledger.storage import LogStore, WriteBatch
from enroute_ledger.transport import (
    MERGE_BYTES_MAX,
    MERGE_MESSAGES_MAX,
    merge_queued,
    split_batch,
)

Future = concurrent.futures.Future


def commit(n: int, have: int | None) -> bytes:
    old = None if have is None else ObjectId(have.to_bytes(20, "big"))
    new = ObjectId(n.to_bytes(20, "big"))
    return encode_command(Commit(1, (RefUpdate(MAIN, old, new),), None, n, False))


class GatedStore:
    """A log store whose write rounds are reported durable only once the gate opens."""

    def __init__(self, inner: LogStore) -> None:
        self.inner = inner
        self.hold = False
        self.held: list[tuple[Future[None], Future[None]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def submit(self, batch: WriteBatch) -> Future[None]:
        inner = self.inner.submit(batch)
        if not self.hold:
            return inner
        out: Future[None] = Future()
        self.held.append((inner, out))
        return out

    def release(self) -> None:
        self.hold = False
        held, self.held = self.held, []
        for inner, out in held:
            inner.result(WAIT_S)
            out.set_result(None)


async def three(tmp_path: Path, net: MemNet, *, retry_s: float = 0.5) -> list[tuple[Runtime, Any]]:
    loop = asyncio.get_running_loop()
    out = []
    for i in (1, 2, 3):
        store = GatedStore(open_log_store(tmp_path / f"log{i}"))
        cfg = RuntimeConfig(
            node_id=NodeId(i),
            peers=tuple(NodeId(p) for p in (1, 2, 3) if p != i),
            tick_interval_s=0.01,
            # a leader whose write round is held sends no heartbeat meanwhile: no
            # election may interfere (the others would commit the entry, rightly)
            election_ticks=500,
            propose_retry_s=retry_s,
        )
        rt = Runtime(cfg, store, clock=loop.time, nonce=i.to_bytes(8, "big"), seed=i)
        rt.transport = net.link()
        net.nodes[i] = rt
        out.append((rt, loop.create_task(rt.run())))
    return out


async def stop(nodes: list[tuple[Runtime, Any]]) -> None:
    for rt, task in nodes:
        rt.store.release()  # type: ignore[attr-defined]
        rt.stop()
        await asyncio.wait_for(task, WAIT_S)
        rt.store.close()


async def started_group(nodes: list[tuple[Runtime, Any]]) -> tuple[int, dict[int, Group]]:
    """Host "r" on all three, elect node 1, apply the genesis; (leader id, groups)."""
    await genesis([rt for rt, _ in nodes])
    groups = {i + 1: rt.by_repo["r"] for i, (rt, _) in enumerate(nodes)}
    await until(lambda: all(g.born for g in groups.values()))
    return 1, groups


def _committed(rt: Runtime, g: Group) -> int:
    return int(rt.mr.raw_node(g.gid).raft.log.committed)


def test_the_leader_replicates_during_its_fsync_and_reveals_nothing_before_it(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        net = MemNet(record=True)
        nodes = await three(tmp_path, net)
        try:
            _, groups = await started_group(nodes)
            lead, g = nodes[0][0], groups[1]
            index = g.applied + 1
            lead.store.hold = True  # type: ignore[attr-defined]
            rid = lead.client.request_id()
            seen = len(net.seen)
            call = asyncio.ensure_future(
                calls.propose(lead, g, command_entry(rid, commit(1, None)), rid, WAIT_S)
            )
            # both followers got the entry and made it durable while the leader's own
            # write is still not: the leader counts them and itself
            await until(lambda: all(groups[i].mem.last_index() >= index for i in (2, 3)))
            await until(lambda: _committed(lead, g) >= index)
            assert lead.early_sent > 0
            await asyncio.sleep(0.2)  # the point: time for a wrong answer or commit to show
            # nothing counts the unsynced copy yet: not answered, not applied anywhere,
            # and no commit index covering it went out
            assert not call.done()
            assert all(groups[i].applied < index for i in (1, 2, 3))
            for b in net.seen[seen:]:
                if b.from_node != 1:
                    continue
                assert all(gm.message.commit < index for gm in b.messages)
                assert all(hb.commit < index for hb in b.heartbeats)
            lead.store.release()  # type: ignore[attr-defined]
            got = await asyncio.wait_for(call, WAIT_S)
            assert got.outcome.code is OutcomeCode.OK
            await until(lambda: all(groups[i].applied >= index for i in (1, 2, 3)))
            # the phase counters saw it: on the proposer and on each follower
            assert lead.trace.commits_traced >= 1 and lead.trace.phase_persist_s >= 0.2
            assert all(nodes[i][0].trace.follower_appends >= 1 for i in (1, 2))
        finally:
            await stop(nodes)

    asyncio.run(main())


def test_a_follower_acknowledges_only_what_it_made_durable(tmp_path: Path) -> None:
    async def main() -> None:
        net = MemNet(record=True)
        nodes = await three(tmp_path, net)
        try:
            _, groups = await started_group(nodes)
            lead, g = nodes[0][0], groups[1]
            index = g.applied + 1
            follower = nodes[1][0]
            follower.store.hold = True  # type: ignore[attr-defined]
            seen = len(net.seen)
            rid = lead.client.request_id()
            # the leader and node 3 are a quorum: the commit goes on without node 2
            got = await calls.propose(lead, g, command_entry(rid, commit(1, None)), rid, WAIT_S)
            assert got.outcome.code is OutcomeCode.OK
            await until(lambda: groups[2].mem.last_index() < index and bool(follower.store.held))  # type: ignore[attr-defined]
            await asyncio.sleep(0.2)  # the point: time for a wrong ack to go out

            def acks(start: int) -> list[int]:
                return [
                    gm.message.index
                    for b in net.seen[start:]
                    if b.from_node == 2
                    for gm in b.messages
                    if gm.message.type is MessageType.APP_RESP and not gm.message.reject
                ]

            assert all(i < index for i in acks(seen)), acks(seen)
            mark = len(net.seen)
            follower.store.release()  # type: ignore[attr-defined]
            await until(lambda: any(i >= index for i in acks(mark)))
        finally:
            await stop(nodes)

    asyncio.run(main())


def test_the_leader_does_not_propose_its_own_entry_again_on_a_timer(tmp_path: Path) -> None:
    async def main() -> None:
        net = MemNet(record=True)
        nodes = await three(tmp_path, net, retry_s=0.02)
        try:
            _, groups = await started_group(nodes)
            lead, g = nodes[0][0], groups[1]
            # the followers' acknowledgements are lost for a while: no commit for many
            # retry intervals, no change of term (heartbeats still pass)
            net.drop = lambda b: (
                None
                if b.from_node != 1
                and any(gm.message.type is MessageType.APP_RESP for gm in b.messages)
                else b
            )
            rid = lead.client.request_id()
            call = asyncio.ensure_future(
                calls.propose(lead, g, command_entry(rid, commit(1, None)), rid, WAIT_S)
            )
            await asyncio.sleep(0.5)  # the point: it must not be answered meanwhile
            assert not call.done()
            net.drop = lambda b: b
            got = await asyncio.wait_for(call, WAIT_S)
            assert got.outcome.code is OutcomeCode.OK
            assert lead.client.reproposals == 0
            assert lead.duplicates_skipped == 0
            assert lead.trace.commits_traced >= 1 and lead.trace.phase_replicate_s > 0.3
        finally:
            await stop(nodes)

    asyncio.run(main())


def _step_order(batches: list[Batch]) -> list[object]:
    """What the receiver steps, in order: each batch's messages, heartbeats, responses."""
    out: list[object] = []
    for b in batches:
        out += [*b.messages, *b.heartbeats, *b.heartbeat_responses]
    return out


def _entry_bytes(b: Batch) -> int:
    return sum(len(e.data) for gm in b.messages for e in gm.message.entries)


def test_stream_writes_keep_the_step_order_and_their_bound() -> None:
    """Queued batches merged (``merge_queued``), then each cut into pieces
    (``split_batch``): the receiver steps what it would have stepped from the batches
    as sent, and every piece is within the bound or one message. One Ready's batch had
    no bound: 60 groups appending 1 MB entries made a write over gRPC's 4 MiB, which
    the peer refused again and again (docs/rpc.md, "Message size")."""
    split_max = 120_000  # small, so that the random batches are often cut
    value = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={value}")
    rng = random.Random(value)
    gid = GroupId(b"r", Incarnation(1))

    def message(n: int) -> GroupMessage:
        data = b"x" * rng.choice((0, 10, 50_000, 150_000))
        entries = (Entry(Term(1), LogIndex(n), EntryType.NORMAL, data),) if data else ()
        m = Message(MessageType.APP, NodeId(2), NodeId(1), Term(1), index=LogIndex(n))
        return GroupMessage(gid, dataclasses.replace(m, entries=entries))

    async def main() -> None:
        n = 0
        for _ in range(100):
            sent: list[Batch] = []
            for _ in range(rng.randrange(1, 12)):
                msgs = []
                for _ in range(rng.choice((0, 1, 3, 40))):
                    n += 1
                    msgs.append(message(n))
                hbs = tuple(Heartbeat(gid, Term(n)) for _ in range(rng.choice((0, 0, 1))))
                rsp = tuple(Heartbeat(gid, Term(n)) for _ in range(rng.choice((0, 0, 1))))
                sent.append(Batch(NodeId(1), NodeId(2), tuple(msgs), hbs, rsp))
            q: asyncio.Queue[tuple[float, Batch]] = asyncio.Queue()
            for b in sent:
                q.put_nowait((0.0, b))
            written: list[Batch] = []
            carry: tuple[float, Batch] | None = None
            while carry is not None or not q.empty():
                _, b = carry if carry is not None else q.get_nowait()
                b, carry = merge_queued(b, q)
                assert len(b.messages) <= MERGE_MESSAGES_MAX
                assert _entry_bytes(b) <= MERGE_BYTES_MAX + 40 * 150_000  # one batch, whole
                pieces = split_batch(b, split_max)
                assert _step_order(pieces) == _step_order([b])
                for piece in pieces:
                    assert _entry_bytes(piece) <= split_max or len(piece.messages) == 1
                    assert piece.messages or piece is pieces[-1]
                written += pieces
            assert _step_order(written) == _step_order(sent)

    asyncio.run(main())
