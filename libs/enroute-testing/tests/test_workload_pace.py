"""The workload's pacing (``WorkloadConfig.pace_s``): a rate bound that holds however fast
the server answers, so a budget sized by ``ops_for(duration_s)`` lasts the duration.

Driven with the real git CLI against a port nothing listens on: every operation fails at
once, the fastest a server could ever answer.
"""

from __future__ import annotations

import time
from pathlib import Path

from enroute_testing.ports import free_port
from enroute_testing.workload import Workload, WorkloadConfig

DURATION_S = 1.5
PACE_S = 0.25


def test_paced_clients_cannot_spend_their_budget_before_the_duration(tmp_path: Path) -> None:
    config = WorkloadConfig(seed=1, repos=("paced",), clients=2, duration_s=DURATION_S,
                            mix=(("ls_refs", 1),), pace_s=PACE_S)  # fmt: skip
    budget = config.ops_for(DURATION_S)
    assert budget == 2 * (6 + 1)
    w = Workload(f"http://127.0.0.1:{free_port()}", tmp_path, config)
    started = time.monotonic()
    w.run()
    took = time.monotonic() - started
    assert not w.errors, w.errors
    starts = [r.call_s for r in w.history.records]
    assert len(starts) <= config.ops_for(took), (len(starts), took)
    # the default budget (200) bounded nothing: the clients ran until the duration
    assert len(starts) < config.ops_max
    assert took >= DURATION_S
