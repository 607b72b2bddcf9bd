"""The replicated request-id window: an entry applies once across snapshots and restarts.

docs/raft.md, "Applying each id once": a group remembers the ids applied in the
last ``dedup_window_entries`` log indexes in its snapshot payload, so a copy of
an entry (a duplicated forward, a re-proposal) is skipped and answered with the
first apply's result, also after compaction, a restart or a snapshot install.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from memnet import MAIN, WAIT_S, MemNet, until

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import LogIndex, NodeId, ObjectId, Term
from enroute_core.state import (
    MISSING,
    Activate,
    Commit,
    OutcomeCode,
    RefStatus,
    RefUpdate,
    RepoState,
    apply,
    decode_change,
    encode_command,
    encode_state,
)
from enroute_ledger import calls
from enroute_ledger.logstore import open_log_store
from enroute_ledger.machine import (
    Applied,
    Done,
    command_entry,
    decode_snapshot,
    encode_snapshot,
    genesis_entry,
)
from enroute_ledger.multiraft import Batch
from enroute_ledger.raft.types import ConfState, MessageType, Snapshot, SnapshotMetadata
from enroute_ledger.runtime import Group, Runtime, RuntimeConfig, store_gid
from enroute_ledger.storage import LogStore


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def commit(n: int, have: int | None, ref: bytes = MAIN) -> bytes:
    old = None if have is None else oid(have)
    return encode_command(Commit(1, (RefUpdate(ref, old, oid(n)),), None, n, False))


def seed() -> int:
    value = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={value}")
    return value


# -- the payload codec ----------------------------------------------------------------------


def _live_state() -> RepoState:
    res = apply(MISSING, Activate(create=True, head=MAIN, upload_window=64), log_index=2)
    return res.state


def _records(n: int, start: int = 10) -> list[Done]:
    codes = list(OutcomeCode)
    return [Done(bytes([i]) * 16, start + 3 * i, 2 + i, codes[i % len(codes)]) for i in range(n)]


def test_payload_round_trips_state_and_window() -> None:
    st = _live_state()
    recs = _records(7)
    data = encode_snapshot(st, recs)
    assert data[:4] == b"ENLS"
    got_state, got = decode_snapshot(data)
    assert got_state == st
    assert [(d.rid, d.index, d.version, d.outcome) for d in got] == [
        (d.rid, d.index, d.version, d.outcome) for d in recs
    ]
    assert encode_snapshot(st, got) == data  # one encoding per value
    assert decode_snapshot(encode_snapshot(st, [])) == (st, ())


def test_payload_before_the_window_is_a_bare_checkpoint() -> None:
    st = _live_state()
    assert decode_snapshot(encode_state(st)) == (st, ())
    assert decode_snapshot(b"") == (None, ())


def test_payload_corruption_raises_only_corrupt_data() -> None:
    data = encode_snapshot(_live_state(), _records(3))
    rng = random.Random(seed())
    for cut in range(len(data)):
        with pytest.raises(CorruptData):
            decode_snapshot(data[:cut] or b"E")
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptData):
            decode_snapshot(bytes(bad))
    with pytest.raises(CorruptData):
        decode_snapshot(data + b"\0")


def test_payload_refuses_records_out_of_order_or_repeated() -> None:
    st = _live_state()
    a, b = _records(2)
    for recs in ([b, a], [a, Done(a.rid, b.index, b.version, b.outcome)]):
        with pytest.raises(CorruptData):
            decode_snapshot(encode_snapshot(st, recs))


# -- one voter, in process -------------------------------------------------------------------


@dataclasses.dataclass
class Node:
    rt: Runtime
    store: LogStore
    task: asyncio.Task[None]


async def start_node(
    path: Path,
    *,
    window: int = 1024,
    peers: tuple[int, ...] = (),
    node_id: int = 1,
    retry_s: float = 0.5,
) -> Node:
    store = open_log_store(path)
    cfg = RuntimeConfig(
        node_id=NodeId(node_id),
        peers=tuple(NodeId(p) for p in peers),
        tick_interval_s=0.01,
        election_ticks=10,
        dedup_window_entries=window,
        propose_retry_s=retry_s,
    )
    rt = Runtime(
        cfg,
        store,
        clock=asyncio.get_running_loop().time,
        nonce=node_id.to_bytes(8, "big"),
        seed=node_id,
    )
    groups = rt.recover()
    task = asyncio.get_running_loop().create_task(rt.run())
    if not peers:
        rt.campaign_all(groups)
    return Node(rt, store, task)


async def stop_node(n: Node) -> None:
    n.rt.stop()
    await asyncio.wait_for(n.task, WAIT_S)
    close = getattr(n.store, "close", None)
    if close is not None:
        close()


@asynccontextmanager
async def node(path: Path, *, window: int = 1024) -> AsyncIterator[Node]:
    n = await start_node(path, window=window)
    try:
        yield n
    finally:
        await stop_node(n)


async def create(rt: Runtime) -> Group:
    g = await rt.founder.host("r", 1, campaign=True)
    rid = rt.client.request_id()
    act = Activate(create=True, head=MAIN, upload_window=64)
    await calls.propose(rt, g, genesis_entry(rid, MISSING, act), rid, WAIT_S)
    return g


async def copy_through_log(rt: Runtime, g: Group, entry: bytes) -> None:
    """Append a copy of an applied entry to the log itself (``Runtime.propose`` answers a
    caller's retry of an applied id from the window without the log): applied once."""
    before = rt.duplicates_skipped
    rt.mr.propose(g.gid, entry)
    rt.wake()
    await until(lambda: rt.duplicates_skipped == before + 1)


async def run_commits(rt: Runtime, g: Group, first: int, count: int) -> list[Applied]:
    out = []
    for n in range(first, first + count):
        have = None if n == 1 else n - 1
        rid = rt.client.request_id()
        out.append(await calls.propose(rt, g, command_entry(rid, commit(n, have)), rid, WAIT_S))
    return out


def test_a_copy_of_an_applied_entry_is_skipped_and_answered_with_the_first_result(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with node(tmp_path / "log") as n:
            rt = n.rt
            g = await create(rt)
            rid = rt.client.request_id()
            entry = command_entry(rid, commit(1, None))
            first = await calls.propose(rt, g, entry, rid, WAIT_S)
            assert first.outcome.code is OutcomeCode.OK
            version = g.state.version
            again = await calls.propose(rt, g, entry, rid, WAIT_S)
            await copy_through_log(rt, g, entry)
            assert rt.duplicates_skipped == 1
            assert g.state.version == version  # not applied: no version taken
            assert (again.version, again.change, again.outcome) == (
                first.version,
                first.change,
                first.outcome,
            )

    asyncio.run(main())


def test_the_window_survives_compaction_and_restart(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "log"
        async with node(path) as n:
            rt = n.rt
            g = await create(rt)
            rid = rt.client.request_id()
            entry = command_entry(rid, commit(1, None))
            first = await calls.propose(rt, g, entry, rid, WAIT_S)
            await run_commits(rt, g, 2, 3)
            rt.compact(g, g.state, g.applied)
            await until(lambda: rt.compactions == 1)
            version, refs = g.state.version, g.state.refs
            data = n.store.state_get(store_gid(g.gid), b"snapshot")
            assert data is not None and data[:4] == b"ENLS"
            st, window = decode_snapshot(data)
            assert st == g.state and rid in {d.rid for d in window}
        async with node(path) as n:
            rt = n.rt
            g = rt.by_repo["r"]
            assert g.born and g.state.version == version
            again = await calls.propose(rt, g, entry, rid, WAIT_S)
            await copy_through_log(rt, g, entry)
            assert rt.duplicates_skipped == 1
            assert g.state.version == version and g.state.refs == refs
            assert (again.version, again.outcome.code) == (first.version, OutcomeCode.OK)
            # the Change is gone with the history: the outcome stands, no per-ref results
            change = decode_change(again.change)
            assert change.outcome.code is OutcomeCode.OK and change.refs == ()

    asyncio.run(main())


def test_the_window_survives_a_restart_without_compaction(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "log"
        async with node(path) as n:
            rt = n.rt
            g = await create(rt)
            rid = rt.client.request_id()
            entry = command_entry(rid, commit(1, None))
            first = await calls.propose(rt, g, entry, rid, WAIT_S)
            version = g.state.version
        async with node(path) as n:
            rt = n.rt
            g = rt.by_repo["r"]
            await until(lambda: g.state.version == version)
            again = await calls.propose(rt, g, entry, rid, WAIT_S)
            await copy_through_log(rt, g, entry)
            assert rt.duplicates_skipped == 1 and g.state.version == version
            assert again.version == first.version
            # replayed entries are in the history again: the original bytes answer
            assert again.change == first.change

    asyncio.run(main())


def test_the_window_is_bounded_by_log_indexes(tmp_path: Path) -> None:
    """An id older than the window applies again (here: a refused CAS, one version), and
    the records kept stay within the in-memory log plus one window."""

    async def main() -> None:
        window = 4
        async with node(tmp_path / "log", window=window) as n:
            rt = n.rt
            g = await create(rt)
            rid = rt.client.request_id()
            entry = command_entry(rid, commit(1, None))
            await calls.propose(rt, g, entry, rid, WAIT_S)
            await run_commits(rt, g, 2, window)
            version = g.state.version
            again = await calls.propose(rt, g, entry, rid, WAIT_S)
            assert rt.duplicates_skipped == 0
            assert g.state.version == version + 1  # applied, and refused by the CAS
            change = decode_change(again.change)
            assert [r.status for r in change.refs] == [RefStatus.STALE]
            await run_commits(rt, g, 6, 3 * window)
            rt.compact(g, g.state, g.applied)
            await until(lambda: rt.compactions == 1)
            await run_commits(rt, g, 6 + 3 * window, window + 1)
            assert len(g.done_order) <= 2 * window + 1
            assert all(g.applied - d.index <= 2 * window for d in g.done_order)

    asyncio.run(main())


def test_a_snapshot_that_holds_a_waiting_entry_answers_its_waiter(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path / "log") as n:
            rt = n.rt
            g = await rt.founder.host("s", 1)
            rid = b"\7" * 16
            fut = rt.client.open(g, b"", rid, rt.clock() + WAIT_S)
            st = _live_state()
            payload = encode_snapshot(st, [Done(rid, 40, st.version, OutcomeCode.STALE_REF)])
            meta = SnapshotMetadata(LogIndex(50), Term(2), ConfState(voters=rt.config.voters))
            rt._apply_snapshot(g, Snapshot(meta, payload))
            assert fut.done
            got = fut.result()
            assert (got.version, got.outcome.code) == (st.version, OutcomeCode.STALE_REF)
            assert decode_change(got.change).outcome.code is OutcomeCode.STALE_REF
            assert g.state == st and g.born

    asyncio.run(main())


# -- three voters in process: a lost proposal is proposed again ------------------------------


async def three(tmp_path: Path, net: MemNet, *, retry_s: float) -> list[Node]:
    nodes = []
    for i in (1, 2, 3):
        peers = tuple(p for p in (1, 2, 3) if p != i)
        n = await start_node(tmp_path / f"log{i}", node_id=i, peers=peers, retry_s=retry_s)
        n.rt.transport = net.link()
        net.nodes[i] = n.rt
        nodes.append(n)
    return nodes


async def leader_of(nodes: list[Node], g: dict[int, Group]) -> int:
    lead = 0

    def agreed() -> bool:
        nonlocal lead
        leads = {n.rt.leader_of(g[i + 1]) for i, n in enumerate(nodes)}
        got = leads.pop() if len(leads) == 1 else None
        if got is None:
            return False
        lead = got
        return True

    await until(agreed)
    return lead


def _without_props(batch: Batch) -> Batch | None:
    msgs = tuple(m for m in batch.messages if m.message.type is not MessageType.PROP)
    if len(msgs) == len(batch.messages):
        return batch
    return dataclasses.replace(batch, messages=msgs)


@pytest.mark.parametrize("lost", ["forward", "leader"])
def test_a_lost_proposal_is_proposed_again_and_applied_once(tmp_path: Path, lost: str) -> None:
    """``forward``: the forward to the leader is dropped, no term changes, the retry
    interval re-proposes. ``leader``: the leader is cut off with the entry, the others
    elect a new one, and the proposer re-proposes on the change of term."""

    async def main() -> None:
        net = MemNet()
        nodes = await three(tmp_path, net, retry_s=0.2 if lost == "forward" else 30.0)
        try:
            groups = {i + 1: await n.rt.founder.host("r", 1) for i, n in enumerate(nodes)}
            nodes[0].rt.campaign_all([groups[1]])
            lead = await leader_of(nodes, groups)
            rt_lead, g_lead = nodes[lead - 1].rt, groups[lead]
            rid = rt_lead.client.request_id()
            act = Activate(create=True, head=MAIN, upload_window=64)
            await calls.propose(rt_lead, g_lead, genesis_entry(rid, MISSING, act), rid, WAIT_S)
            prop = next(i for i in (1, 2, 3) if i != lead)
            rt, g = nodes[prop - 1].rt, groups[prop]
            await until(lambda: g.born)
            version = g.state.version

            if lost == "forward":
                drops = [0]

                def drop(b: Batch) -> Batch | None:
                    if drops[0] == 0 and any(
                        m.message.type is MessageType.PROP for m in b.messages
                    ):
                        drops[0] += 1
                        return _without_props(b)
                    return b

                net.drop = drop
            else:
                # the leader takes the entry but can no longer replicate it or lead
                cut = lead
                net.drop = lambda b: None if b.from_node == cut else b
            rid = rt.client.request_id()
            entry = command_entry(rid, commit(1, None))
            start = asyncio.get_running_loop().time()
            got = await calls.propose(rt, g, entry, rid, WAIT_S)
            took = asyncio.get_running_loop().time() - start
            assert got.outcome.code is OutcomeCode.OK
            assert rt.client.reproposals >= 1
            assert took < 5.0, took
            if lost == "leader":
                net.drop = lambda b: b  # the old leader comes back with its stale entry
            survivors = [i for i in (1, 2, 3) if lost == "forward" or i != lead]
            want = version + 1
            await until(lambda: all(groups[i].state.version >= want for i in survivors))
            await asyncio.sleep(0.3)  # let every copy that made it into the log apply
            for i in (1, 2, 3):
                st = groups[i].state
                if i in survivors or st.version > version:
                    assert st.version == version + 1, (i, st.version, version)
                    assert st.refs[MAIN].oid == oid(1)
            if lost == "forward":
                # every voter cuts the same window at the same index: identical payloads
                top = max(groups[i].applied for i in (1, 2, 3))
                await until(lambda: all(groups[i].applied == top for i in (1, 2, 3)))
                for i, n in enumerate(nodes, 1):
                    n.rt.compact(groups[i], groups[i].state, top)
                await until(lambda: all(n.rt.compactions == 1 for n in nodes))
                payloads = {
                    n.store.state_get(store_gid(groups[i].gid), b"snapshot")
                    for i, n in enumerate(nodes, 1)
                }
                assert len(payloads) == 1
                (payload,) = payloads
                assert payload is not None and rid in {d.rid for d in decode_snapshot(payload)[1]}
        finally:
            for n in nodes:
                await stop_node(n)

    asyncio.run(main())


def test_two_compactions_to_one_index_in_one_batch_make_one_snapshot(tmp_path: Path) -> None:
    """The checkpointer may ask twice for the same index before the first lands (a
    quiet group's look and its interval timer): the batch's own earlier compaction
    counts, or the second snapshot is older than the first and the loop stops on
    SnapshotOutOfDate (found by test_parked_memory once quiet groups were settled)."""

    async def main() -> None:
        async with node(tmp_path / "log") as n:
            rt = n.rt
            g = await create(rt)
            await run_commits(rt, g, 1, 3)
            rt.compact(g, g.state, g.applied)
            rt.compact(g, g.state, g.applied)
            await until(lambda: rt.compactions == 1)
            await run_commits(rt, g, 4, 1)  # the loop goes on
            assert rt.compactions == 1

    asyncio.run(main())
