"""Serving from S3 under a disk budget far below the data, through real processes.

Seed 004, "Never waiting on the object store" (every read loads first), "Disk
budget" (local copies are loaded only as read, pins keep what a reader loaded)
and "Files and tiers" (a node that lost its disk serves at once). `enroute dev`
runs on a real S3 server (SeaweedFS ``weed mini``) with ``node.disk_cache: 24MiB``
and a generated repository of about 153 MiB of packs (incompressible blobs, so
the pack is as big as its blobs) is pushed. Then three rounds of full, blobless,
depth-1 and incremental (a push, then a fetch) clones and fetches must match the
source (``git fsck``, refs), and local copies stay within the budget plus the
pinned chunks that ``/status`` reports. After the compute's local disk is wiped
and it restarts:

- a blobless clone loads no blob chunk: at most 1.2x the chunk bytes that the
  repository's non-blob kind runs span (loads are whole 1 MiB chunks, so both
  sides are counted in whole chunks);
- a full clone's first pack byte leaves the compute before 10% of the layer
  bytes are local (``/status`` reads: bytes loaded by then).

Randomised content: the seed is printed and ``ENROUTE_SEED=`` repeats it.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.devserver import compute_status, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.s3budget import (
    BUCKET,
    blob_history,
    cold_clones,
    dev_config,
    mirror,
    non_blob_chunk_bytes,
    pack_bytes,
    refs_of,
    stored_layers,
)
from enroute_testing.s3servers import S3Endpoint, seaweedfs_server

MiB = 1024 * 1024
BUDGET_BYTES = 24 * MiB
BLOB_BYTES = MiB
COMMITS = 51
BLOBS_PER_COMMIT = 3  # 153 MiB of blobs
ROUNDS = 3
PREFIX = "budget"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Endpoint]:
    try:
        with seaweedfs_server(buckets=(BUCKET,)) as endpoint:
            yield endpoint
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.mark.interop
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_serves_every_clone_under_a_small_budget_and_cold(s3: S3Endpoint, tmp_path: Path) -> None:
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(2**32)))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    src = blob_history(
        tmp_path, rng, commits=COMMITS, blobs_per_commit=BLOBS_PER_COMMIT, blob_bytes=BLOB_BYTES
    )
    assert pack_bytes(src) >= 150 * MiB
    root = tmp_path / "dev"
    root.mkdir()
    config = dev_config(s3, PREFIX, BUDGET_BYTES)
    with running_dev(root, config) as dev:
        url = f"{dev.url}/budget.git"
        run_git(["push", "-q", url, "main", "v1"], cwd=src, timeout_s=600)
        expect = refs_of(src)
        for r in range(ROUNDS):
            full = mirror(url, tmp_path / "full")
            run_git(["fsck", "--no-progress"], cwd=full, timeout_s=300)
            assert refs_of(full) == expect
            blobless = mirror(url, tmp_path / "blobless", "--filter=blob:none")
            assert refs_of(blobless) == expect
            shallow = tmp_path / "shallow"
            shutil.rmtree(shallow, ignore_errors=True)
            run_git(["clone", "-q", "--depth=1", url, str(shallow)], cwd=tmp_path, timeout_s=300)
            run_git(["fsck", "--no-progress"], cwd=shallow)
            assert (shallow / "blob0.bin").read_bytes() == (src / "blob0.bin").read_bytes()
            # incremental: a push of more commits (thin, against the stored layers), a fetch
            for i in range(3):
                (src / "blob0.bin").write_bytes(rng.randbytes(300_000))
                (src / "text0.txt").write_text(f"more {r} {i}\n")
                run_git(["commit", "-q", "-am", f"more {r} {i}"], cwd=src)
            run_git(["push", "-q", url, "main"], cwd=src, timeout_s=300)
            run_git(["fetch", "-q", "origin"], cwd=full, timeout_s=300)
            run_git(["fsck", "--no-progress"], cwd=full, timeout_s=300)
            expect = refs_of(src)
            assert refs_of(full) == expect
            disk = compute_status(root)["layers"]["disk_budget"]
            print(f"round {r}: {disk}")
            # at rest only metadata is pinned: local copies within the budget plus pins
            assert disk["present_bytes"] <= BUDGET_BYTES + disk["pinned_bytes"], disk
        assert disk["evictions"] > 0, "the budget never evicted: the test proves nothing"
    layers = stored_layers(s3, PREFIX)
    layer_bytes = sum(size for size, _ in layers)
    assert layer_bytes > 4 * BUDGET_BYTES
    non_blob = non_blob_chunk_bytes(layers)

    cold = cold_clones(root, config, "budget.git", tmp_path, expect)
    print(f"cold: {cold}; non-blob chunks {non_blob} bytes; layers {layer_bytes} bytes")
    assert cold.blobless_loaded_bytes <= 1.2 * non_blob, (cold, non_blob)
    assert cold.first_pack_loaded_bytes < 0.1 * layer_bytes, (cold, layer_bytes)
