"""DESIGN, "Freezing the ledger": the leader checkpoints into the state object; a node
with no log restores from it."""

from __future__ import annotations

import shutil
import sys
import urllib.request
from pathlib import Path

from enroute_core.state import OutcomeCode, decode_change, decode_state
from enroute_core.state.names import state_key
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2
from enroute_testing.waiting import WaitTimeout, wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, write_config  # noqa: E402
from test_ledger_service import MAIN, T, commit, create, oid, propose, read_object  # noqa: E402


def test_leader_checkpoints_every_n_entries_and_a_node_without_log_restores(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    store = tmp_path / "store"
    data = tmp_path / "data"
    cfg = write_config(tmp_path / "l.yaml", node_id=1, data=data, store=store, checkpoint_entries=3)
    p = LedgerProc(cfg).start()
    procs.append(p)
    assert create(p, "r").state.version == 1
    have = None
    last = None
    for n in range(1, 8):
        last = propose(p, "r", 1, commit(1, MAIN, have, oid(n)))
        assert decode_change(last.effects).outcome.code is OutcomeCode.OK
        have = oid(n)
    assert last is not None

    # the object follows the log by CAS at the checkpointed version
    at = last.version
    wait_until(
        lambda: decode_state(read_object(store, state_key("r"))).version >= at - 2,
        10,
        "the state object within two entries of the log",
    )
    obj = decode_state(read_object(store, state_key("r")))
    assert last.version - 2 <= obj.version <= last.version
    assert obj.refs[MAIN].oid in {oid(n) for n in range(1, 8)}
    # the interval rule (default 300 s) does not fire here: within 3 more entries one
    # checkpoint lands exactly at the last acknowledged version
    for i in range(8, 8 + 4):
        last = propose(p, "r", 1, commit(1, MAIN, have, oid(i)))
        have = oid(i)

        def at_last(version: int = last.version) -> bool:
            return decode_state(read_object(store, state_key("r"))).version == version

        try:
            wait_until(at_last, 1.5, "a checkpoint at the last version", poll_s=0.05)
        except WaitTimeout:
            continue  # none yet: commit one more
        break
    else:
        raise AssertionError("no checkpoint at the last version within checkpoint_entries commits")
    obj = decode_state(read_object(store, state_key("r")))
    assert obj.refs[MAIN].oid == have and obj.version == last.version

    # the log was truncated up to the checkpoint; a clean restart rebuilds from the
    # stored snapshot plus the rest of the log
    with urllib.request.urlopen(f"http://{p.http_addr}/metrics", timeout=5) as r:
        compactions = [
            ln for ln in r.read().decode().splitlines() if ln.startswith("enroute_ledger_log_comp")
        ]
    assert compactions and float(compactions[0].split()[1]) >= 2
    assert p.stop() == 0
    p = LedgerProc(cfg).start()
    procs.append(p)
    d = p.ledger.Describe(ledger_pb2.DescribeRequest(repo="r"), timeout=T)
    assert (d.state.incarnation, d.state.version) == (1, obj.version)
    call = p.ledger.Subscribe(ledger_pb2.SubscribeRequest(repo="r"), timeout=T)
    assert decode_state(next(call).snapshot.data).refs[MAIN].oid == have
    call.cancel()

    # lose the disk: the node restores the repository from the state object
    p.kill()
    shutil.rmtree(data)
    p2 = LedgerProc(cfg).start()
    procs.append(p2)
    d = p2.ledger.Describe(ledger_pb2.DescribeRequest(repo="r"), timeout=T)
    assert (d.state.incarnation, d.state.version) == (1, obj.version)
    nxt = propose(p2, "r", 1, commit(1, MAIN, have, oid(99)))
    assert decode_change(nxt.effects).outcome.code is OutcomeCode.OK
    assert nxt.version == obj.version + 1
    assert p2.stop() == 0
