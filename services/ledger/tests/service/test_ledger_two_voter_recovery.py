"""Two-voter recovery on real voters (docs/raft.md, "Recovering a two-voter ledger").

Two voters commit to four repositories from two clients. The recovery is refused
while both voters answer with their data, and when asked of a voter that is not
the survivor named. Then voter 2's disk is wiped and it restarts blank: no group
has a quorum. ``replace 2 ADDRESS --recover-from 1`` (the survivor's consent)
takes every group over on voter 1 alone and adds voter 3. Every acknowledged
commit is there afterwards on voters 1 and 3 (each commit compares and swaps the
ref from the previous one, so the final ref names the last acknowledged commit
only if every earlier one applied, once), every group has the members [1, 3]
also after the survivor restarts (the members come from its log, so a force not
written there would show), the two commit again, and voter 2 never starts again
under its retired id.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from enroute_core.base.errors import InvalidArgument
from enroute_ledger.membership import NOT_THE_SURVIVOR
from enroute_ledger.membership_client import LedgerAdmin

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, free_port, start_all, wait_for, write_config  # noqa: E402
from test_ledger_cluster import current_main  # noqa: E402
from test_ledger_membership_change import (  # noqa: E402
    REPOS,
    Client,
    _wait_groups,
    oid,
    start_under_commits,
)

CHANGE_TIMEOUT_S = 180.0


def _report(admin: LedgerAdmin, node: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [m for m in admin.members()["members"] if m["id"] == node]
    return rows[0] if rows else {}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wiped_voter_of_two_is_recovered_from_the_survivor(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    seed = int(os.environ.get("ENROUTE_SEED", "1"))
    print(f"ENROUTE_SEED={seed}")
    store = tmp_path / "store"
    ports = [free_port() for _ in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in ports]

    def config(i: int) -> Path:
        return write_config(
            tmp_path / f"l{i}.yaml",
            node_id=i,
            data=tmp_path / f"d{i}",
            store=store,
            grpc_port=ports[i - 1],
            members=tuple(addrs[:2]),
        )

    nodes = {i: LedgerProc(config(i)) for i in (1, 2)}
    live, clients = start_under_commits(nodes, procs, seed)
    wait_for(lambda: all(n >= 2 for c in clients for n in c.acked.values()), 60)
    survivor = LedgerAdmin(nodes[1].http_addr, None)
    said: list[str] = []

    # refused while voter 2 answers with its data, or when asked of another voter
    wait_for(lambda: _report(survivor, 2).get("healthy"), 30)
    with pytest.raises(InvalidArgument, match="it is not lost"):
        survivor.recover(2, addrs[2], 1, said.append)
    with pytest.raises(InvalidArgument, match=NOT_THE_SURVIVOR):
        LedgerAdmin(nodes[2].http_addr, None).recover(2, addrs[2], 1, said.append)
    with pytest.raises(InvalidArgument, match="two different voters"):
        survivor.recover(1, addrs[2], 1, said.append)
    assert survivor.members()["record"]["target"] is None  # nothing was opened

    # voter 2 loses its disk and comes back blank: no group has a quorum any more
    wiped = nodes[2]
    assert wiped.proc is not None
    wiped.proc.kill()
    wiped.proc.wait(10)
    wiped.kill()
    live.remove(wiped)
    shutil.rmtree(tmp_path / "d2")
    back = LedgerProc(wiped.config).start()
    procs.append(back)
    wait_for(lambda: int(_report(survivor, 2).get("blank") or 0) > 0, 60)
    acked_before = {r: n for c in clients for r, n in c.acked.items()}

    def progress(line: str) -> None:
        said.append(line)
        print(line)
        if line.startswith("voter 3 at "):
            nodes[3] = LedgerProc(config(3))
            start_all([nodes[3]], procs)
            live.append(nodes[3])

    t0 = time.monotonic()
    assert survivor.recover(2, addrs[2], 1, progress, CHANGE_TIMEOUT_S) == 3
    print(f"recovered in {time.monotonic() - t0:.1f} s")
    assert survivor.recover(2, addrs[2], 1, said.append) == 3  # the same command again
    wait_for(lambda: "was retired from the ledger" in "".join(back.stderr), 30)
    back.kill()
    time.sleep(1.0)  # some commits on the new members
    for c in clients:
        c.stop.set()
    for c in clients:
        c.join(30)
        assert not c.errors, c.errors
    acked = {r: n for c in clients for r, n in c.acked.items()}
    assert any(acked[r] > acked_before[r] for r in acked), "no commit after the recovery"

    # nothing acknowledged is lost, on either voter, and the members are [1, 3] for good
    def check(stays: list[int]) -> None:
        deadline = time.monotonic() + CHANGE_TIMEOUT_S
        for i in stays:
            _wait_groups(nodes[i], stays, deadline)
            for r, n in acked.items():
                cur, _ = current_main(nodes[i], REPOS[r])
                assert cur in (oid(r, n), oid(r, n + 1)), (i, REPOS[r], n, cur)

    check([1, 3])
    view = survivor.members()
    assert view["record"]["voters"] == {"1": addrs[0], "3": addrs[2]}
    assert view["record"]["retired"] == [2] and "recovery" not in view["record"]
    # progress was shown (the groups left, or at once "every group changed": four groups
    # are taken over faster than the new voter starts)
    assert any(line.startswith("epoch 2: recover: voter 2 lost") for line in said), said
    nodes[1].stop()
    nodes[1] = LedgerProc(nodes[1].config).start()
    procs.append(nodes[1])
    check([1, 3])
    cur = {r: n if current_main(nodes[1], REPOS[r])[0] == oid(r, n) else n + 1
           for r, n in acked.items()}  # fmt: skip
    after = Client(list(cur), [nodes[1], nodes[3]], seed)
    after.acked.update(cur)
    after.start()
    wait_for(lambda: all(after.acked[r] > n for r, n in cur.items()) or after.errors, 60)
    after.stop.set()
    after.join(30)
    assert not after.errors, after.errors

    # the lost voter never comes back under its id
    again = LedgerProc(wiped.config).spawn()
    procs.append(again)
    assert again.proc is not None
    assert again.proc.wait(60) == 2
    assert "its id is never used again" in "".join(again.stderr)
