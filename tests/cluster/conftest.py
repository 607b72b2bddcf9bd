"""One fault-injecting cluster per test module (starting one costs ~20 s on 2 cores).

Every scenario heals the cluster and restarts whatever is down before and
after it runs (``Cluster.ensure_running``) and uses repositories of its own,
so scenarios do not see each other's data.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.cluster import Cluster, running_cluster

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # cluster_scenario (tests run in importlib mode)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running cluster with proxies on every link and in front of S3."""
    root = tmp_path_factory.mktemp("cluster")
    # small inline bound: pushes with a larger blob publish their layer to S3
    extra = {"compute": {"layers": {"inline_max": "16KiB"}}}
    with running_cluster(root, faults=True, extra_config=extra) as started:
        yield started
