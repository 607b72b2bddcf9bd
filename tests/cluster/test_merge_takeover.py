"""A compaction on one compute is taken over by another, which serves the next fetches
without loading the merged layer whole (issue 18, "Acceptance"; seed 004, "Files and
tiers": a node "that was just handed a compacted layer, serves right away instead of
downloading whole layers first"; "Metadata is always local": opening is one ranged read).

The local cluster on SeaweedFS (three ledger voters, two computes, gitproto), both
computes under a 4 MiB disk budget, every layer stored (``layers.inline_max: 0``).
Only compute-1 maintains layers; gitproto is pointed at one compute at a time. A
push of a 6 MiB blob and a clone through compute-2 make compute-2 host the
repository; a second push (a 2 MiB blob) through compute-1 has compute-1 compact
the two layers into one. compute-2 follows the change, then an incremental fetch
and a blobless clone through it succeed while the bytes it fetched from the store
stay below the merged layer's size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from enroute_testing.cluster import GITPROTO, Cluster, get_json, running_cluster
from enroute_testing.gitcli import run_git
from enroute_testing.s3budget import refs_of, stored_layers
from enroute_testing.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MiB = 1024 * 1024
REPO = "takeover"
WAIT_S = 90.0
COMPUTE = {
    "node": {"disk_cache": "4MiB"},
    "layers": {"inline_max": 0, "maintenance_interval": "300ms", "compaction_factor": 2},
}


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(f"http://{cluster.members[name].http}/status")
    return status


def _rewrite(cluster: Cluster, name: str, config: dict[str, Any]) -> None:
    cluster.members[name].config_path.write_text(yaml.safe_dump(config, sort_keys=True))
    cluster.restart(name)


def _route(cluster: Cluster, compute: str) -> None:
    """Point gitproto at ``compute`` alone (a restart of gitproto)."""
    config = cluster.config_of(GITPROTO)
    config["compute"]["members"] = [cluster.members[compute].grpc]
    _rewrite(cluster, GITPROTO, config)


def _commit_blob(src: Path, name: str, size: int) -> None:
    (src / name).write_bytes(os.urandom(size))
    run_git(["add", "."], cwd=src)
    run_git(["commit", "-q", "-m", name], cwd=src)


def _fetched(status: dict[str, Any]) -> int:
    return int(status["layers"]["bytes_fetched"])


@pytest.mark.timeout(600)
def test_a_compaction_is_taken_over_without_loading_the_merged_layer(tmp_path: Path) -> None:
    with running_cluster(
        tmp_path / "cluster", faults=False, extra_config={"compute": COMPUTE}
    ) as cluster:
        quiet = cluster.config_of("compute-2")
        quiet["layers"]["maintenance_interval"] = 0  # only compute-1 merges
        _rewrite(cluster, "compute-2", quiet)
        url = cluster.git_url(REPO)
        src = tmp_path / "src"
        src.mkdir()
        run_git(["init", "-q", "-b", "main"], cwd=src)
        _commit_blob(src, "a.bin", 6 * MiB)

        _route(cluster, "compute-1")
        run_git(["push", "-q", url, "main"], cwd=src, timeout_s=120)
        _route(cluster, "compute-2")
        clone = tmp_path / "clone"
        run_git(["clone", "-q", "--mirror", url, str(clone)], cwd=tmp_path, timeout_s=120)
        updates = _status(cluster, "compute-2")["view_updates"]

        _route(cluster, "compute-1")
        _commit_blob(src, "b.bin", 2 * MiB)
        run_git(["push", "-q", url, "main"], cwd=src, timeout_s=120)
        wait_until(
            lambda: _status(cluster, "compute-1")["maintenance"]["compactions"] >= 1,
            WAIT_S,
            "a compaction on compute-1",
            poll_s=0.2,
        )
        # compute-2 follows: the push, then the compaction, each a view update
        wait_until(
            lambda: _status(cluster, "compute-2")["view_updates"] >= updates + 2,
            WAIT_S,
            "two view updates on compute-2",
            poll_s=0.2,
        )
        assert cluster.s3 is not None
        layers = stored_layers(cluster.s3.endpoint, f"cluster/repos/{REPO}/")
        merged = max(size for size, _ in layers)
        assert merged > 7 * MiB, [size for size, _ in layers]  # both blobs in one layer

        _route(cluster, "compute-2")
        before = _fetched(_status(cluster, "compute-2"))
        run_git(["fetch", "-q", "origin"], cwd=clone, timeout_s=120)
        run_git(["fsck", "--no-progress"], cwd=clone)
        assert refs_of(clone) == refs_of(src)
        blobless = tmp_path / "blobless"
        run_git(["clone", "-q", "--mirror", "--filter=blob:none", url, str(blobless)],
                cwd=tmp_path, timeout_s=120)  # fmt: skip
        assert refs_of(blobless) == refs_of(src)
        status = _status(cluster, "compute-2")
        fetched = _fetched(status) - before
        print(f"compute-2 fetched {fetched} bytes for a merged layer of {merged} bytes")
        assert fetched < merged, (fetched, merged)
        assert status["maintenance"] is None or status["maintenance"]["compactions"] == 0
