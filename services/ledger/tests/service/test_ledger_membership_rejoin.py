"""A removed voter's address comes back under a new id (docs/raft.md, "Membership changes").

What a chart does after shrinking and growing again: the pod of a removed voter
keeps its name, so its address, and its configured ``node.id`` (its ordinal plus
one) is the retired id. Started blank before any change adds its address, it is
refused with the command to run; once ``enroute ledger add ADDRESS`` opened the
change, the same blank start takes the id the record gives that address (a new
one: ids are never given twice), joins every group while clients commit, loses
nothing, and keeps that id on its disk: restarted with the same configuration
(whose ``node.id`` is still the retired one) it is the same voter.

The voter listens on 0.0.0.0 and advertises 127.0.0.1 (``ledger.advertise``), as
a pod listens on every interface and is reached by its DNS name.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidArgument
from enroute_ledger.membership_client import LedgerAdmin

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, free_port, start_all, write_config  # noqa: E402
from test_ledger_cluster import current_main  # noqa: E402
from test_ledger_membership_change import (  # noqa: E402
    REPOS,
    _wait_groups,
    oid,
    start_under_commits,
)

CHANGE_TIMEOUT_S = 120.0


def _refused(node: LedgerProc, procs: list[LedgerProc]) -> str:
    """Start ``node``, which must exit 2 at start; its error output."""
    node.spawn()
    procs.append(node)
    assert node.proc is not None
    assert node.proc.wait(60) == 2, "".join(node.stderr)[-2000:]
    time.sleep(0.2)  # the stderr reader thread drains the pipe
    return "".join(node.stderr)


@pytest.mark.slow
def test_a_removed_voters_address_rejoins_under_a_new_id_and_keeps_it(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    seed = int(os.environ.get("ENROUTE_SEED", "1"))
    print(f"ENROUTE_SEED={seed}")
    store = tmp_path / "store"
    ports = [free_port() for _ in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in ports]

    def config(i: int, data: str) -> Path:
        path = write_config(
            tmp_path / f"l{i}-{data}.yaml",
            node_id=i,
            data=tmp_path / data,
            store=store,
            grpc_port=ports[i - 1],
            members=tuple(addrs),
        )
        if i == 3:  # listens everywhere, reached at the address it advertises
            text = path.read_text().replace('grpc: "127.0.0.1:', 'grpc: "0.0.0.0:')
            path.write_text(text.replace("ledger:\n", f'ledger:\n  advertise: "{addrs[2]}"\n'))
        return path

    nodes = {i: LedgerProc(config(i, f"d{i}")) for i in (1, 2, 3)}
    live, clients = start_under_commits(nodes, procs, seed)
    said: list[str] = []
    admin = LedgerAdmin(nodes[1].http_addr, None)

    # shrink: voter 3 leaves; its id retires
    admin.remove(3, said.append)
    live.remove(nodes[3])
    nodes[3].stop()
    _wait_groups(nodes[1], [1, 2], time.monotonic() + CHANGE_TIMEOUT_S)

    # the same address, a blank disk, node.id still 3: refused until a change adds it
    blank = config(3, "d3-new")
    err = _refused(LedgerProc(blank), procs)
    assert "no open change adds it (node.id 3 was removed" in err, err
    assert f": run `enroute ledger add {addrs[2]}`" in err, err
    # its old disk holds the retired id: refused too
    assert "its id is never used again" in _refused(LedgerProc(nodes[3].config), procs)

    # grow again: the change gives the address a new id, which the blank start takes
    nid = admin.begin_add(addrs[2])
    assert nid == 4  # never 3 again
    back = LedgerProc(blank)
    start_all([back], procs)
    assert back.status()["node_id"] == nid
    live.append(back)
    admin.finish(said.append, timeout_s=CHANGE_TIMEOUT_S)

    # restarted with the same configuration (node.id 3, retired): the id on its disk
    # (the refused starts above stored none, or this one would be refused as retired)
    back.kill()
    live.remove(back)
    again = LedgerProc(blank)
    start_all([again], procs)
    assert again.status()["node_id"] == nid
    live.append(again)
    time.sleep(1.0)  # some commits on the final members

    assert all(c.is_alive() for c in clients), [c.errors for c in clients]
    for c in clients:
        c.stop.set()
    for c in clients:
        c.join(30)
        assert not c.errors, c.errors
    # nothing acknowledged is lost (each commit compares and swaps from the one before)
    acked = {r: n for c in clients for r, n in c.acked.items()}
    assert all(n >= 3 for n in acked.values()), acked
    deadline = time.monotonic() + CHANGE_TIMEOUT_S
    for node in (nodes[1], nodes[2], again):
        _wait_groups(node, [1, 2, nid], deadline)
        for r, n in acked.items():
            cur, _ = current_main(node, REPOS[r])
            assert cur in (oid(r, n), oid(r, n + 1)), (node.grpc_addr, REPOS[r], n, cur)
    record = admin.members()["record"]
    assert record["voters"] == {"1": addrs[0], "2": addrs[1], str(nid): addrs[2]}
    assert record["retired"] == [3] and record["next_id"] == nid + 1

    # a new identity at a voter's own address (a pod) is a remove, then an add: the
    # replace command says so instead of opening anything
    with pytest.raises(InvalidArgument, match=f"`enroute ledger remove {nid}`"):
        admin.replace(nid, addrs[2], said.append)
    assert admin.members()["record"] == record
