"""Large log entries over real gRPC between three ledger processes (docs/rpc.md, "Message size").

gRPC bounds a received message at 4 MiB unless told otherwise. One Ready's batch to a
peer holds every group's appends, so many concurrent commits with inline layers made
writes over that bound; the peer refused each one, and those groups stopped committing
(46 of 60 proposals of 1 MB timed out). A single command over 4 MiB, within the
ledger's own ``state_command_bytes_max``, was refused as RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3

from enroute_core.base.limits import MiB
from enroute_core.state import (
    Commit,
    LayerKind,
    NewLayer,
    OutcomeCode,
    RefUpdate,
    decode_change,
    encode_command,
)
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.ledgers import start_three
from enroute_testing.waiting import wait_for_value, wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc  # noqa: E402
from test_ledger_cluster import MAIN, leader_of, oid, subscribed  # noqa: E402

GROUPS = 48
ENTRY_BYTES = 1_000_000
BIG_BYTES = 5 * MiB
CALL_TIMEOUT_S = 30.0


def commit_with_layer(incarnation: int, old: int | None, new: int, size: int) -> bytes:
    """A commit entry carrying an inline layer of ``size`` random bytes."""
    data = os.urandom(size)
    root = blake3.blake3(data).digest()  # the ledger checks it (rule inline.root)
    layer = NewLayer(LayerKind.INLINE, 1, len(data), 100, root, 0, data)
    before = None if old is None else oid(old)
    return encode_command(
        Commit(incarnation, (RefUpdate(MAIN, before, oid(new)),), layer, new, True)
    )


def test_concurrent_large_entries_commit_on_three_voters(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    nodes = start_three(tmp_path, procs)
    repos = [f"m/{i:02d}" for i in range(GROUPS)]
    for i, repo in enumerate(repos):
        req = ledger_pb2.ActivateRequest(
            repo=repo, create=ledger_pb2.CREATE_MODE_EXPLICIT, head=MAIN
        )
        assert nodes[i % 3].ledger.Activate(req, timeout=20).state.incarnation == 1
    leaders: dict[str, int] = {}

    def every_leader_known() -> bool:
        for repo in repos:
            if lead := leader_of(nodes[0], repo):
                leaders[repo] = lead
        return len(leaders) == GROUPS

    wait_until(every_leader_known, 20, "a leader of every group", explain=lambda: leaders)

    def propose(n: int) -> OutcomeCode:
        repo = repos[n]
        cmd = commit_with_layer(1, None, n + 1, ENTRY_BYTES)
        resp = nodes[leaders[repo] - 1].ledger.Propose(
            ledger_pb2.ProposeRequest(repo=repo, incarnation=1, command=cmd),
            timeout=CALL_TIMEOUT_S,
        )
        return decode_change(resp.effects).outcome.code

    with ThreadPoolExecutor(GROUPS) as pool:
        codes = list(pool.map(propose, range(GROUPS)))
    assert codes == [OutcomeCode.OK] * GROUPS

    # one command over gRPC's default bound, within state_command_bytes_max
    repo = repos[0]
    cmd = commit_with_layer(1, 1, 1000, BIG_BYTES)
    resp = nodes[leaders[repo] - 1].ledger.Propose(
        ledger_pb2.ProposeRequest(repo=repo, incarnation=1, command=cmd), timeout=CALL_TIMEOUT_S
    )
    assert decode_change(resp.effects).outcome.code is OutcomeCode.OK
    # every voter applies it, and a subscriber receives its layer in one message
    for node in nodes:

        def applied(node: LedgerProc = node) -> int | None:
            """The inline bytes a subscriber got with the state, once it holds the commit."""
            state, inline = subscribed(node, repo, 10.0)
            main = state.refs.get(MAIN)
            return inline if main is not None and main.oid == oid(1000) else None

        inline = wait_for_value(applied, 20, f"{node.http_addr} applies it", poll_s=0.1)
        assert inline == ENTRY_BYTES + BIG_BYTES
