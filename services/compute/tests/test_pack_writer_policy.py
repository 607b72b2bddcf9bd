"""Pack writers run under ``SCHED_BATCH`` (``fetch.bulk_thread``): bulk work that gives
up wakeup preemption and keeps its priority (docs/serving.md, "Pack writers")."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import cast

import pytest

from enroute_compute.fetch import Fetcher
from enroute_compute.host import RepositoryHost

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's"
)


@dataclass
class _Host:
    unhost_listeners: list[object] = field(default_factory=list)


def _policy_and_nice() -> tuple[int, int]:
    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)


def test_pack_writers_run_batch_and_keep_their_priority_the_loop_does_not() -> None:
    before = _policy_and_nice()
    fetcher = Fetcher(cast(RepositoryHost, _Host()), pack_writers=2)
    try:
        policy, nice = fetcher._writers.submit(_policy_and_nice).result(10)
    finally:
        fetcher.close()
    assert policy == os.SCHED_BATCH
    assert nice == before[1]  # its share of the CPU is the process's
    assert _policy_and_nice() == before  # the calling thread is left as it was
    assert before[0] != os.SCHED_BATCH
