"""Keepalive drill through the local cluster (issue 23, acceptance; docs/protocol.md "Progress").

"A push with a keepalive gap measured at most 5 s on a pack of at least
200 MB", through the production path: gitproto relays the body to a compute,
the compute ingests it, stores its layer in S3 and commits through the
three-voter ledger, with the internal token on every call. The answer is
timed packet by packet on the wire after the body's end
(``enroute_testing.keepalive``); no silence in it may exceed 5 s, git's
``receive.keepAlive`` default. Nightly: building and pushing the pack takes
minutes on two cores. ``tests/interop/test_progress.py`` runs the same drill
against ``enroute dev``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from enroute_testing.cluster import running_cluster
from enroute_testing.gitcli import run_git
from enroute_testing.keepalive import drill_body, gaps_after_body, timed_push

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

KEEPALIVE_GAP_S_MAX = 5.0
PUSH_TIMEOUT_S = 900.0


@pytest.mark.nightly
@pytest.mark.timeout(1800)
def test_a_pack_of_at_least_200_mb_through_the_cluster(tmp_path: Path) -> None:
    seed = int(os.environ.get("ENROUTE_SEED", "23"))
    print(f"ENROUTE_SEED={seed}")
    home = tmp_path / "home"
    home.mkdir()
    src = tmp_path / "src"
    body = drill_body(src, home, seed)
    with running_cluster(tmp_path / "cluster", faults=False) as cluster:
        timed = timed_push(cluster.git_url("keepalive/drill"), body, timeout_s=PUSH_TIMEOUT_S)
        report = b"".join(p[5:] for _, p in timed if p[4:5] == b"\x01")
        tip = run_git(["rev-parse", "main"], cwd=src, home=home).decode().strip()
        served = run_git(["ls-remote", cluster.git_url("keepalive/drill"), "refs/heads/main"],
                         cwd=tmp_path, home=home).decode().split()  # fmt: skip
    gaps = gaps_after_body(timed)
    largest = max(range(len(gaps)), key=gaps.__getitem__)
    print(f"pack {len(body)} bytes; answer {timed[-1][0]:.1f} s after the body, "
          f"{len(timed)} packets, largest gap {gaps[largest]:.2f} s "
          f"(ending at {timed[largest][0]:.1f} s)")  # fmt: skip
    assert b"unpack ok" in report and b"ok refs/heads/main" in report, report[-500:]
    assert served[:1] == [tip], served
    assert max(gaps) <= KEEPALIVE_GAP_S_MAX, gaps
