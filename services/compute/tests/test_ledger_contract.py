"""The LedgerPort contract, run against the in-process test seam and the real ledger.

The gRPC variant starts ``python -m enroute_ledger --config FILE`` on 127.0.0.1
and talks to it through :class:`GrpcLedger`; it is skipped only while the
ledger service has no ``__main__`` yet.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import blake3
import pytest
import pytest_asyncio

from enroute_compute.ledger_client import GrpcLedger
from enroute_compute.ledger_port import ChangeEvent, CreateMode, LedgerPort, SnapshotEvent
from enroute_core.base.errors import IncarnationEnded, NotFound
from enroute_core.base.ids import ObjectId
from enroute_core.state import Commit, LayerKind, NewLayer, RefStatus, RefUpdate
from enroute_testing.local_ledger import LocalLedger

OID_A = ObjectId(bytes(range(1, 21)))
OID_B = ObjectId(bytes(range(2, 22)))


@pytest_asyncio.fixture(params=["local", "grpc"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[LedgerPort]:
    port: LedgerPort
    if request.param == "local":
        port = LocalLedger()
    else:
        port = GrpcLedger((request.getfixturevalue("ledger_process"),))
    yield port
    await port.close()


async def _listed_deleted(ledger: LedgerPort, name: str) -> bool:
    """Whether the listing shows ``name`` deleted, paging from the start: the ledger process
    is shared with other tests, whose repositories may fill the first pages."""
    after = ""
    for _ in range(100):  # bounded: 100 pages of 100
        repos = [s for p in await ledger.list(after, 100) for s in p.repos]
        if any(s.name == name and s.deleted for s in repos):
            return True
        if not repos:
            return False
        after = max(s.name for s in repos)
    return False


async def _next(events: AsyncIterator[object]) -> object:
    return await asyncio.wait_for(events.__anext__(), 5)


@pytest.mark.asyncio
async def test_activate_propose_subscribe_barrier_delete(ledger: LedgerPort) -> None:
    name = f"contract/r{os.getpid()}"
    with pytest.raises(NotFound):
        await ledger.activate(name, CreateMode.NONE, b"")
    made = await ledger.activate(name, CreateMode.IMPLICIT, b"refs/heads/main")
    assert made.created and made.state.incarnation >= 1 and not made.state.head_kept
    again = await ledger.activate(name, CreateMode.EXPLICIT, b"refs/heads/other")
    assert not again.created and again.state.head == made.state.head
    inc = made.state.incarnation
    first = Commit(inc, (RefUpdate(b"refs/heads/main", None, OID_A),), None, 10, True)
    done = await ledger.propose(name, inc, first)
    assert done.change.outcome.ok and done.change.refs[0].status is RefStatus.OK
    stale = Commit(inc, (RefUpdate(b"refs/heads/main", OID_B, OID_A),), None, 11, True)
    refused = await ledger.propose(name, inc, stale)
    assert refused.change.refs[0].status is RefStatus.STALE
    point = await ledger.barrier(name)
    assert point.version >= refused.version and point.incarnation == inc
    events = ledger.subscribe(name, inc, 0).__aiter__()
    seen = await _next(events)
    assert isinstance(seen, SnapshotEvent | ChangeEvent)
    described = await ledger.describe(name)
    assert described.last_push_us == 10
    deleted = await ledger.delete(name)
    assert deleted is not None and deleted.deleted
    with pytest.raises(IncarnationEnded):
        await ledger.propose(name, inc, first)
    with pytest.raises(NotFound):
        await ledger.activate(name, CreateMode.NONE, b"")
    assert await _listed_deleted(ledger, name)
    recreated = await ledger.activate(name, CreateMode.EXPLICIT, b"refs/heads/trunk")
    assert recreated.created and recreated.state.incarnation == inc + 1
    assert recreated.state.head_kept and recreated.state.last_push_us is None


@pytest.mark.asyncio
async def test_snapshot_carries_inline_layer_bytes(ledger: LedgerPort) -> None:
    name = f"contract/inline{os.getpid()}"
    made = await ledger.activate(name, CreateMode.IMPLICIT, b"refs/heads/main")
    inc = made.state.incarnation
    data = bytes(range(256)) * 3
    root = blake3.blake3(data).digest()  # the ledger checks it (rule inline.root)
    layer = NewLayer(LayerKind.INLINE, 2, len(data), 10, root, data=data)
    commit = Commit(inc, (RefUpdate(b"refs/heads/main", None, OID_A),), layer, 10, True)
    done = await ledger.propose(name, inc, commit)
    assert done.change.outcome.ok
    events = ledger.subscribe(name, inc, 0).__aiter__()
    seen = await _next(events)
    assert isinstance(seen, SnapshotEvent)
    assert [e.kind for e in seen.state.manifest] == [LayerKind.INLINE]
    assert dict(seen.inline) == {layer.root: data}
    await ledger.delete(name)
