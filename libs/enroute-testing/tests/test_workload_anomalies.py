"""Which failed reads the checker counts as a bad pack (``Workload._pack_anomaly``)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

from enroute_testing.history import Record
from enroute_testing.workload import Workload, WorkloadConfig, _Client

# what git 2.39 printed for a clone whose compute was killed mid-pack (cluster scenario
# clonekill, seed 3), and for a pack that does not resolve
CUT = (
    "error: RPC failed; curl 18 transfer closed with outstanding read data remaining\n"
    "fatal: early EOF\nfatal: fetch-pack: invalid index-pack output\n"
)
BAD = "fatal: pack has 3 unresolved deltas\nfatal: fetch-pack: invalid index-pack output\n"


def _record() -> Record:
    return Record(op_id=1, client=0, kind="clone", repo="r", input=(), call=0, call_s=0.0)


def test_a_cut_response_is_a_failed_read_and_a_bad_pack_an_anomaly(tmp_path: Path) -> None:
    w = Workload("http://127.0.0.1:1", tmp_path, WorkloadConfig(seed=1, repos=("r",)))
    w._pack_anomaly(_record(), CUT)
    assert w.history.anomalies == []
    w._pack_anomaly(_record(), BAD)
    assert len(w.history.anomalies) == 1 and "unresolved deltas" in w.history.anomalies[0]


# what git 2.39 printed for a fetch that gitproto answered with a compute's gRPC error
# during a restart (cluster scenario restartall, seed 2), and for a repository not there
UNAVAILABLE = (
    "fatal: remote error: failed to connect to all addresses; last error: UNAVAILABLE: "
    "ipv4:127.0.0.1:40431: Socket closed\n"
)
MISSING = (
    "remote: repository does not exist\n"
    "fatal: repository 'http://127.0.0.1:20863/r.git/' not found\n"
)


def test_a_failed_read_is_not_a_missing_repository_whatever_its_port(tmp_path: Path) -> None:
    """A port with "404" in it once made a failed fetch a read of an empty repository."""
    w = Workload("http://127.0.0.1:1", tmp_path, WorkloadConfig(seed=1, repos=("r",)))
    client = _Client(0, random.Random(1), tmp_path, tmp_path)
    for stderr, how, output in ((UNAVAILABLE, "fail", None), (MISSING, "ok", ())):
        rec = w.history.invoke(0, "fetch", "r", ())
        done = subprocess.CompletedProcess(["git"], 128, b"", stderr.encode())
        w._finish_read(client, rec, done, dict)
        assert (rec.how, rec.output) == (how, output), stderr
