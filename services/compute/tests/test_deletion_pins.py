"""Seed 001, "Deletion": "the state machine drops the refs and the manifest, and with them
the pins of inline layers so the log is not held back". Checked through the public
calls: a push stores an inline layer (its pin is in the state every subscriber gets from
the ledger), DeleteRepository over Compute gRPC, then the deleted state that the ledger
swapped into the state object holds no manifest and so no pin. That the ledger then
truncates its log past the released pin is not observable through any API (docs/
lifecycle.md says where it is tested)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from enroute_core.state import LayerKind, decode_state
from enroute_core.state.names import state_key
from enroute_core.storage.objectstore import open_store
from enroute_proto.gen.enroute.compute.v1 import compute_pb2, compute_pb2_grpc
from enroute_testing.gitcli import run_git

pytestmark = pytest.mark.interop


def _ledger_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    found = sorted({p.resolve() for p in tmp_path_factory.getbasetemp().glob("ledger*/store")})
    if len(found) != 1:
        pytest.skip(f"the ledger process's store is not where its fixture puts it: {found}")
    return found[0]


@pytest.mark.parametrize("compute", ["grpc-ledger"], indirect=True)
def test_deletion_drops_the_pins_of_inline_layers(
    compute: Any,
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    name = f"pins-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    work = tmp_path / "work"
    run_git(["init", "-q", "-b", "main", str(work)], cwd=tmp_path)
    for i in range(2):
        (work / f"f{i}").write_text(f"{i}\n")
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"{i}"], cwd=work)
        run_git(["push", "-q", f"{url}/{name}.git", "main"], cwd=work)
    live = compute.call(compute.host.read(name)).state  # as Subscribe delivered it
    assert [e.kind for e in live.manifest] == [LayerKind.INLINE, LayerKind.INLINE]
    assert len(live.pins()) == 2

    stub = compute_pb2_grpc.ComputeStub(grpc.insecure_channel(compute.address))
    stub.DeleteRepository(compute_pb2.DeleteRepositoryRequest(repo=name), timeout=30)

    async def read() -> bytes:
        store = open_store(f"file://{_ledger_store(tmp_path_factory)}")
        return await store.get(state_key(name))

    deleted = decode_state(asyncio.run(read()))
    assert deleted.deleted and deleted.incarnation == live.incarnation
    assert deleted.manifest == () and deleted.pins() == ()
    assert deleted.refs == {}
