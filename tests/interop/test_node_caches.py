"""The node's object and entry caches in a real `enroute dev`, under small budgets.

Seed 004, "Pages and memory" ("Why a pool": object cache 3/4 of node.cache,
entry cache 1/4, one global limit) and issue 18, item 4: with ``node.cache:
8MiB`` and ``node.page_cache: 8MiB`` pushes and clones (full, blobless,
depth 1, an incremental fetch) work, checked with ``git fsck`` and the source's
refs, and the compute's ``/status`` shows the caches in use, sized from
``node.cache`` and charged to the pool within its budget
(``node.page_cache + node.cache``, docs/buffer-pool.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from enroute_testing.devserver import DevServer, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import RepoSpec, generate_repo

pytestmark = [pytest.mark.interop, pytest.mark.slow]

MiB = 1024 * 1024
CONFIG = {"node": {"cache": "8MiB", "page_cache": "8MiB"}}
# Enough tree and blob bodies (about 10 MiB inflated) that a depth-1 clone fills the caps.
SPEC = RepoSpec(seed=18, commits=80, branches=2, merge_every=6, files=400, file_bytes=24_000)


def _refs(repo: Path) -> str:
    out = run_git(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=repo)
    return "\n".join(sorted(out.decode().splitlines()))


def _clone(dev: DevServer, dest: Path, *args: str) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    run_git(["clone", "-q", "--mirror", *args, f"{dev.url}/caches.git", str(dest)],
            cwd=dest.parent, timeout_s=300)  # fmt: skip
    return dest


def test_clones_and_pushes_under_small_caches(tmp_path: Path) -> None:
    source = generate_repo(tmp_path / "source.git", SPEC).path
    (tmp_path / "dev").mkdir()
    with running_dev(tmp_path / "dev", CONFIG) as dev:
        run_git(["push", "-q", "--mirror", f"{dev.url}/caches.git"], cwd=source, timeout_s=300)
        full = _clone(dev, tmp_path / "full.git")
        run_git(["fsck", "--strict", "--no-progress"], cwd=full, timeout_s=300)
        assert _refs(full) == _refs(source)
        blobless = _clone(dev, tmp_path / "blobless.git", "--filter=blob:none")
        assert _refs(blobless) == _refs(source)
        shallow = _clone(dev, tmp_path / "depth1.git", "--depth", "1")
        run_git(["fsck", "--no-progress"], cwd=shallow, timeout_s=300)
        # An incremental push (a new branch from an older commit) and fetch.
        run_git(["push", "-q", f"{dev.url}/caches.git", "main~3:refs/heads/older"], cwd=source)
        run_git(["fetch", "-q", "origin"], cwd=full, timeout_s=300)
        assert "refs/heads/older" in _refs(full)
        status = dev.compute_status()
    caches, pool = status["caches"], status["pool"]
    objects, entries = caches["objects"], caches["entries"]
    assert objects["cap_bytes"] == 6 * MiB and entries["cap_bytes"] == 2 * MiB
    assert pool["budget_bytes"] == 16 * MiB
    # Used, and charged to the pool: the views' bodies and entries are the node's.
    assert objects["used_bytes"] > 0 and entries["used_bytes"] > 0, caches
    assert objects["used_bytes"] <= objects["cap_bytes"], caches
    assert entries["used_bytes"] <= entries["cap_bytes"], caches
    assert pool["charged_bytes"] == objects["used_bytes"] + entries["used_bytes"], status
    assert pool["used_bytes"] <= pool["budget_bytes"] + pool["pinned_bytes"], pool
