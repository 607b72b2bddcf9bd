"""`enroute dev` on SeaweedFS under a disk budget: what the S3 budget test and the
cold-compute benchmark share (issue 18, "Acceptance").

- :func:`dev_config`: an `enroute dev` configuration with ``store.url: s3://…`` and
  ``node.disk_cache``;
- :func:`blob_history`: a repository of incompressible blobs and a little text,
  written with ``git fast-import`` (seconds for 150 MiB);
- :func:`stored_layers`, :func:`non_blob_chunk_bytes`: the layer files in the
  bucket, and the bytes of the whole 1 MiB chunks their non-blob kind runs span
  (loads are whole chunks, so that is what a blobless clone may load at most);
- :func:`cold_clones`: wipe the compute's local disk, restart, and measure a
  blobless then a full clone (seed 004, "Files and tiers": "A node that lost its
  disk ... serves right away instead of downloading whole layers first").
"""

from __future__ import annotations

import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enroute_core.base.errors import CorruptData
from enroute_core.git.source import BytesSource
from enroute_core.storage.diskbudget import CHUNK_BYTES
from enroute_core.storage.layer import Kind, LayerReader
from enroute_testing.devserver import compute_status, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.s3servers import S3Endpoint, s3_client

BUCKET = "enroute"


def dev_config(s3: S3Endpoint, prefix: str, budget_bytes: int) -> dict[str, Any]:
    """``store.url: s3://BUCKET/prefix`` on ``s3`` and ``node.disk_cache: budget_bytes``."""
    return {
        "node": {"disk_cache": f"{budget_bytes // 1024}KiB"},
        "store": {
            "url": f"s3://{BUCKET}/{prefix}",
            "options": {
                "endpoint_url": s3.url,
                "access_key_id": s3.access_key_id,
                "secret_access_key": s3.secret_access_key,
                "region": s3.region,
            },
        },
    }


def blob_history(
    work: Path, rng: random.Random, *, commits: int, blobs_per_commit: int, blob_bytes: int
) -> Path:
    """``work/src``: ``commits`` commits on main, each writing ``blobs_per_commit``
    random blobs of ``blob_bytes`` (over 7 paths, so history holds them all) and a
    line in each of 5 text files, then an annotated tag ``v1``.

    Written with ``git fast-import`` (one pack, no work tree to stage), which takes
    seconds where as many ``git add`` of megabytes would take minutes.
    """
    src = work / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    stream = bytearray()
    text = [b"" for _ in range(5)]
    for i in range(commits):
        message = b"c%d" % i
        stream += b"commit refs/heads/main\ncommitter A <a@example.com> %d +0000\n" % (
            1_700_000_000 + i
        )
        stream += b"data %d\n%s\n" % (len(message), message)
        for j in range(blobs_per_commit):
            blob = rng.randbytes(blob_bytes)
            path = b"blob%d.bin" % ((i * blobs_per_commit + j) % 7)
            stream += b"M 100644 inline %s\ndata %d\n" % (path, len(blob)) + blob + b"\n"
        for j in range(5):
            text[j] += b"line %d %d\n" % (i, j)
            stream += b"M 100644 inline text%d.txt\ndata %d\n" % (j, len(text[j])) + text[j]
            stream += b"\n"
    run_git(["fast-import", "--quiet"], cwd=src, input=bytes(stream), timeout_s=600)
    run_git(["reset", "-q", "--hard"], cwd=src)  # the work tree later commits edit
    run_git(["tag", "-a", "v1", "-m", "v1"], cwd=src)
    return src


def pack_bytes(repo: Path) -> int:
    """Bytes of the packs of a non-bare repository."""
    return sum(p.stat().st_size for p in (repo / ".git" / "objects" / "pack").glob("*.pack"))


def stored_layers(s3: S3Endpoint, prefix: str) -> list[tuple[int, LayerReader]]:
    """(file size, reader) of every layer file under ``prefix`` in the bucket."""
    client = s3_client(s3)
    out: list[tuple[int, LayerReader]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", ()):
            data = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
            try:
                out.append((len(data), LayerReader.open(BytesSource(data))))
            except (CorruptData, ValueError):
                continue  # not a layer (ledger checkpoints, sweep records)
    return out


def non_blob_chunk_bytes(layers: list[tuple[int, LayerReader]]) -> int:
    """Bytes of the whole data chunks that the non-blob kind runs of the layers span."""
    total = 0
    for size, reader in layers:
        chunks: set[int] = set()
        for start, stop, kind in reader.kind_runs:
            if kind == Kind.BLOB or start == stop:
                continue
            first = reader.record(start)
            last = reader.record(stop - 1)
            end = last.offset + last.length
            chunks.update(reader.data_chunks_for(first.offset, end - first.offset))
        total += sum(min(CHUNK_BYTES, size - c * CHUNK_BYTES) for c in chunks)
    return total


def refs_of(repo: Path) -> str:
    out = run_git(
        ["for-each-ref", "--format=%(objectname) %(refname)", "refs/heads", "refs/tags"],
        cwd=repo,
    )
    return "\n".join(sorted(out.decode().splitlines()))


def mirror(url: str, dest: Path, *args: str) -> Path:
    """``git clone --mirror`` into ``dest`` (replaced)."""
    shutil.rmtree(dest, ignore_errors=True)
    run_git(["clone", "-q", "--mirror", *args, url, str(dest)], cwd=dest.parent, timeout_s=600)
    return dest


@dataclass(frozen=True, slots=True)
class Cold:
    """What a compute with an empty disk loaded to serve two clones."""

    blobless_loaded_bytes: int
    """Chunk bytes loaded by the blobless clone (``/status`` ``layers.loaded_bytes``)."""
    blobless_s: float
    first_pack_loaded_bytes: int
    """Chunk bytes local when the full clone's first pack byte left the compute."""
    first_pack_s: float
    """Seconds from the compute's pack request to its first pack byte (p50 over the run)."""
    full_s: float


def cold_clones(
    root: Path, config: dict[str, Any], repo: str, work: Path, expect: str | None = None
) -> Cold:
    """Wipe the compute's disk under ``root``, restart `enroute dev`, clone blobless then
    full; both clones must match ``expect`` (refs) when given, the full one ``git fsck``."""
    shutil.rmtree(root / "data" / "compute")  # the compute lost its disk
    (root / "data" / "logs" / "compute.log").unlink()
    with running_dev(root, config) as dev:
        url = f"{dev.url}/{repo}"
        started = time.monotonic()
        blobless = mirror(url, work / "cold-blobless", "--filter=blob:none")
        blobless_s = time.monotonic() - started
        assert expect is None or refs_of(blobless) == expect
        loaded = sum(compute_status(root)["layers"]["loaded_bytes"].values())
        started = time.monotonic()
        full = mirror(url, work / "cold-full")
        full_s = time.monotonic() - started
        run_git(["fsck", "--no-progress"], cwd=full, timeout_s=600)
        assert expect is None or refs_of(full) == expect
        first = compute_status(root)["reads"]["first_pack_byte_s"]
        assert first["count"] >= 2, first
    return Cold(loaded, blobless_s, first["loaded_bytes"], first["max"], full_s)
