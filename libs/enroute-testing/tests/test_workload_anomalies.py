"""Which failed reads the checker counts as a bad pack (``Workload._pack_anomaly``)."""

from __future__ import annotations

from pathlib import Path

from enroute_testing.history import Record
from enroute_testing.workload import Workload, WorkloadConfig

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
