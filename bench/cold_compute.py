"""A compute that lost its local disk, on S3 under a disk budget: what it loads to serve
a blobless clone, and how much is local when a full clone's first pack byte leaves it.
Written to docs/benchmarks.md (section "Cold compute on S3"; issue 18, "Acceptance").

`enroute dev` runs on SeaweedFS (``weed mini``) with ``node.disk_cache`` (24 MiB by
default); a generated repository of incompressible blobs (153 MiB of packs by
default) is pushed. Then the compute's data directory is removed and it restarts
(seed 004, "Files and tiers": a node that lost its disk serves at once), and:

1. a blobless clone: the chunk bytes it loaded (``/status`` ``layers.loaded_bytes``)
   against the bytes of the whole 1 MiB chunks that the non-blob kind runs of the
   stored layers span. Loads are whole chunks, so both sides count whole chunks;
   the bound is 1.2x;
2. a full clone: the chunk bytes loaded when its first pack byte left the compute
   (``/status`` ``reads.first_pack_byte_s.loaded_bytes``) against all layer
   bytes; the bound is 10%.

Usage: ``python -m bench.cold_compute [--commits 51] [--blobs-per-commit 3]
[--budget-mib 24]``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from bench.report import write_section
from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.s3budget import (
    BUCKET,
    blob_history,
    cold_clones,
    dev_config,
    non_blob_chunk_bytes,
    pack_bytes,
    refs_of,
    stored_layers,
)
from enroute_testing.s3servers import seaweedfs_server

MiB = 1024 * 1024
PREFIX = "cold"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=51)
    parser.add_argument("--blobs-per-commit", type=int, default=3, help="1 MiB blobs each")
    parser.add_argument("--budget-mib", type=int, default=24, help="node.disk_cache")
    parser.add_argument("--seed", type=int, default=18)
    args = parser.parse_args()
    budget = args.budget_mib * MiB
    with (
        tempfile.TemporaryDirectory(prefix="cold-") as tmp,
        seaweedfs_server(buckets=(BUCKET,)) as s3,
    ):
        work = Path(tmp)
        src = blob_history(
            work,
            random.Random(args.seed),
            commits=args.commits,
            blobs_per_commit=args.blobs_per_commit,
            blob_bytes=MiB,
        )
        packs = pack_bytes(src)
        root = work / "dev"
        root.mkdir()
        config = dev_config(s3, PREFIX, budget)
        with running_dev(root, config) as dev:
            started = time.monotonic()
            run_git(["push", "-q", f"{dev.url}/cold.git", "main", "v1"], cwd=src, timeout_s=1800)
            push_s = time.monotonic() - started
        layers = stored_layers(s3, PREFIX)
        layer_bytes = sum(size for size, _ in layers)
        non_blob = non_blob_chunk_bytes(layers)
        cold = cold_clones(root, config, "cold.git", work, refs_of(src))
    ratio = cold.blobless_loaded_bytes / non_blob
    share = cold.first_pack_loaded_bytes / layer_bytes
    lines = [
        f"`enroute dev` on SeaweedFS (`weed mini`), `node.disk_cache: {args.budget_mib}MiB`; "
        f"a generated repository of {args.commits} commits, each writing "
        f"{args.blobs_per_commit} random 1 MiB blobs and 5 text files: "
        f"{packs / MiB:.1f} MiB of packs, pushed in {push_s:.1f} s, stored as "
        f"{len(layers)} layer(s) of {layer_bytes / MiB:.1f} MiB. Then the compute's data "
        "directory is removed and it restarts; a blobless clone, then a full clone.",
        "",
        "| measure | value | bound |",
        "|---|---:|---:|",
        f"| chunk bytes the non-blob kind runs span (whole 1 MiB chunks) | "
        f"{non_blob / MiB:.1f} MiB | |",
        f"| blobless clone: chunk bytes loaded | {cold.blobless_loaded_bytes / MiB:.1f} MiB "
        f"({ratio:.2f}x) | 1.2x |",
        f"| blobless clone: wall time | {cold.blobless_s:.1f} s | |",
        f"| full clone: chunk bytes local at its first pack byte | "
        f"{cold.first_pack_loaded_bytes / MiB:.1f} MiB ({share:.1%} of the layers) | 10% |",
        f"| first pack byte after the pack request (slowest of the two clones) | "
        f"{cold.first_pack_s * 1000:.0f} ms | |",
        f"| full clone: wall time (loads every chunk from S3) | {cold.full_s:.1f} s | |",
        "",
        'Loads are whole 1 MiB chunks (seed 004, "Disk budget"), so the blobless figure '
        "is compared with whole chunks too: a chunk shared by the end of the commit or "
        "tree run and the first blobs counts once on each side.",
    ]
    write_section("Cold compute on S3", lines)


if __name__ == "__main__":
    main()
