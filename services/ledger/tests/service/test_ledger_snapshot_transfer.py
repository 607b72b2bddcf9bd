"""A lagging voter catches up from a snapshot larger than one gRPC message (4 MiB).

Three real ledger processes; one is stopped (SIGSTOP) while 100,000 refs are
written and the leader checkpoints and compacts its log past it. Resumed, it can
only catch up from a snapshot, which travels in 1 MiB chunks on SendSnapshot
(docs/raft.md, "Snapshots in chunks").
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import grpc
import pytest

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Commit,
    OutcomeCode,
    RefUpdate,
    RepoState,
    decode_change,
    decode_state,
    encode_command,
)
from enroute_core.state.names import state_key
from enroute_core.storage.objectstore import open_store
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import wait_for_value

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, start_three  # noqa: E402

REPO = "big"
REFS = 100_000
PER_COMMAND = 5_000
GRPC_MESSAGE_BYTES = 4 << 20


def ref(i: int) -> bytes:
    return b"refs/heads/topic/%06d-a-branch-name-long-enough-to-weigh" % i


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def propose(p: LedgerProc, updates: tuple[RefUpdate, ...], stamp: int) -> int:
    cmd = encode_command(Commit(1, updates, None, stamp, False))
    resp = p.ledger.Propose(
        ledger_pb2.ProposeRequest(repo=REPO, incarnation=1, command=cmd), timeout=60
    )
    change = decode_change(resp.effects)
    assert change.outcome.code is OutcomeCode.OK, change.outcome
    return int(resp.version)


def state_on(p: LedgerProc) -> tuple[RepoState, int]:
    """The node's own applied state after a barrier, from every Subscribe snapshot part."""
    p.ledger.Barrier(ledger_pb2.BarrierRequest(repo=REPO), timeout=10)
    call = p.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo=REPO), timeout=30)
    data = bytearray()
    try:
        for resp in call:
            if resp.WhichOneof("event") == "snapshot":
                data += resp.snapshot.data
                if resp.snapshot.last:
                    break
    finally:
        call.cancel()
    return decode_state(bytes(data)), len(data)


def checkpointed(store: Path) -> tuple[int, int]:
    """(version, bytes) of the state object the leader checkpointed (and compacted at)."""

    async def read() -> tuple[int, int]:
        st = open_store(f"file://{store}", None, env={})
        try:
            data = await st.get(state_key(REPO))
            return decode_state(data).version, len(data)
        finally:
            await st.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_lagging_voter_catches_up_from_a_chunked_snapshot_over_4_mib(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    store = tmp_path / "store"
    nodes = start_three(tmp_path, procs, checkpoint_entries=4)
    req = ledger_pb2.ActivateRequest(repo=REPO, create=ledger_pb2.CREATE_MODE_EXPLICIT)
    assert nodes[0].ledger.Activate(req, timeout=20).created
    lagging = nodes[2]
    os.kill(lagging.pid, signal.SIGSTOP)
    try:
        version = 0
        t0 = time.monotonic()
        for lo in range(0, REFS, PER_COMMAND):
            updates = tuple(
                RefUpdate(ref(i), None, oid(i + 1)) for i in range(lo, lo + PER_COMMAND)
            )
            version = propose(nodes[lo // PER_COMMAND % 2], updates, lo + 1)
        print(f"{REFS} refs written in {time.monotonic() - t0:.1f} s")
        # every 4 entries the leader checkpoints and compacts its log there
        cp = wait_for_value(
            lambda: near if (near := checkpointed(store))[0] >= version - 4 else None,
            60,
            f"a checkpoint near {version}",
            poll_s=0.2,
        )
        assert cp[1] > GRPC_MESSAGE_BYTES, cp  # what the snapshot carries at the least
        # one more entry after the compaction point, so the lagging voter needs both
        version = propose(nodes[0], (RefUpdate(ref(0), oid(1), oid(REFS + 1)),), REFS + 1)
    finally:
        os.kill(lagging.pid, signal.SIGCONT)

    t0 = time.monotonic()

    def caught_up() -> tuple[RepoState, int] | None:
        try:
            found = state_on(lagging)
        except grpc.RpcError:
            return None  # still catching up
        return found if found[0].version == version else None

    state, size = wait_for_value(
        caught_up,
        90,
        "the lagging voter catches up",
        poll_s=0.5,
        explain=lambda: "".join(lagging.stderr)[-3000:],
    )
    print(f"caught up {time.monotonic() - t0:.1f} s after SIGCONT; state {size} bytes")
    assert size > GRPC_MESSAGE_BYTES, size
    assert len(state.refs) == REFS
    assert state.refs[ref(0)].oid == oid(REFS + 1)
    assert state.refs[ref(REFS - 1)].oid == oid(REFS)
    leader_state, _ = state_on(nodes[0])
    assert leader_state.refs == state.refs
