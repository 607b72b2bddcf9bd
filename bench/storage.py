"""Storage benchmarks, written to docs/benchmarks.md (section "storage").

Seed 004, "Never waiting on the object store", "Disk budget", "Pages and memory".

1. Remote cold open to first lookup: a node with no local copy opens a layer
   (one ranged read of the metadata) and looks one oid up; from a file://
   store on another filesystem (no links) and from moto S3.
2. Random point lookups with entry reads under a disk budget of 1/10 of the
   data: lookup, load (pinned), point read, release; latency p50 / p99 and the
   share of reads whose chunks were already local (hit ratio).
3. Full read through the buffer pool: the data region of a ~200 MB local
   layer file read in 1 MiB windows by ``BufferPool.read_through`` (as a full
   clone reads it), as a ratio to ``cat file > /dev/null`` on the same (warm)
   file. Target: at least 0.5.

Usage: ``python -m bench.storage [--quick]`` from the checkout root.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.report import Series, fmt3, run_command, write_section
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import MiB
from enroute_core.git.pack import encode_entry_header
from enroute_core.storage.layer import Kind, LayerWriter
from enroute_core.storage.layer.reader import LayerReader
from enroute_core.storage.layers import LayerService
from enroute_core.storage.localfile import LocalFile, pread_full
from enroute_core.storage.objectstore import StoreOptions
from enroute_core.storage.objectstore.base import ObjectStore
from enroute_core.storage.objectstore.file import FileStore
from enroute_core.storage.objectstore.s3 import S3Store
from enroute_core.storage.pool import BufferPool, Intent, PageClass, Region
from enroute_testing.s3servers import create_bucket, moto_server
from enroute_testing.synthlayer import synthetic_layer

KEY = "repos/bench/layers/1"
BUCKET = "enroute-bench"


def blob_layer(path: Path, blobs: int, blob_bytes: int, seed: int) -> tuple[int, int, list[bytes]]:
    """A layer of random blob entries streamed to ``path``: (file size, meta size, oids)."""
    rng = random.Random(seed)
    oids: list[bytes] = []
    with open(path, "wb") as f:
        w = LayerWriter(f.write)
        for _ in range(blobs):
            oid = ObjectId(rng.randbytes(20))
            w.append(
                oid,
                Kind.BLOB,
                encode_entry_header(3, blob_bytes) + rng.randbytes(blob_bytes),
                blob_bytes,
            )
            oids.append(oid)
        sealed = w.finish()
    return sealed.file_size, sealed.meta_size, oids


# -- 1. cold open ---------------------------------------------------------------------------------


async def _cold_open(store: ObjectStore, node: Path, size: int, meta: int, oid: bytes) -> float:
    svc = LayerService(store, node, disk_budget_bytes=64 * MiB)
    start = time.perf_counter()
    layer = await svc.open_layer("bench", KEY, size, meta)
    found = layer.reader.lookup(oid)
    elapsed = time.perf_counter() - start
    assert found is not None and not layer.linked
    await svc.close()
    return elapsed


async def bench_cold_open(work: Path, objects: int, runs: int) -> list[str]:
    data, sealed, oids = synthetic_layer(objects)
    oid = oids[len(oids) // 2]
    rows = []
    shm = Path("/dev/shm") / f"enroute-bench-{uuid.uuid4().hex}"
    try:
        file_store = FileStore(str(shm), StoreOptions(fsync=False))
        await file_store.put(KEY, data)
        with moto_server() as endpoint:
            create_bucket(endpoint, BUCKET)
            s3 = S3Store(
                BUCKET,
                "bench",
                StoreOptions(
                    endpoint_url=endpoint.url,
                    region=endpoint.region,
                    access_key_id=endpoint.access_key_id,
                    secret_access_key=endpoint.secret_access_key,
                ),
                rng=random.Random(0),
            )
            await s3.put(KEY, data)
            stores: list[tuple[str, ObjectStore]] = [
                ("file:// (no links)", file_store),
                ("moto S3", s3),
            ]
            for label, store in stores:
                times = []
                for r in range(runs):
                    node = work / f"cold-{label[:4]}-{r}"
                    times.append(
                        await _cold_open(store, node, sealed.file_size, sealed.meta_size, oid)
                    )
                    shutil.rmtree(node)
                rows.append(f"| {label} | {fmt3(Series(tuple(times)), 1e3, digits=1)} |")
            await s3.close()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return [
        "### Remote cold open to first lookup",
        "",
        f"A synthetic layer of {objects:,} objects ({sealed.file_size / 1e6:.1f} MB, metadata "
        f"{sealed.meta_size / 1e6:.1f} MB), no local copy: open (one ranged GET of the "
        f"metadata, checks) and one lookup. {runs} runs, fresh node each.",
        "",
        "| store | ms min / median / max |",
        "|---|---|",
        *rows,
        "",
    ]


# -- 2. point reads under a budget --------------------------------------------------------------


async def bench_point_reads(work: Path, blobs: int, blob_bytes: int, reads: int) -> list[str]:
    path = work / "points.layer"
    size, meta, oids = blob_layer(path, blobs, blob_bytes, seed=3)
    shm = Path("/dev/shm") / f"enroute-bench-{uuid.uuid4().hex}"
    try:
        store = FileStore(str(shm), StoreOptions(fsync=False))
        await store.put_file(KEY, str(path))
        data_bytes = size - meta
        budget = data_bytes // 10
        svc = LayerService(store, work / "points-node", disk_budget_bytes=budget)
        layer = await svc.open_layer("bench", KEY, size, meta)
        rng = random.Random(5)
        hot = oids[: len(oids) // 20]  # a working set of 5% of the objects
        lat: list[float] = []
        hits = 0
        for _ in range(reads):
            oid = rng.choice(hot) if rng.random() < 0.8 else rng.choice(oids)
            start = time.perf_counter()
            i = layer.reader.lookup(oid)
            assert i is not None
            rec = layer.reader.record(i)
            local = not layer.chunks_needed(rec.offset, rec.length)
            with await svc.load(layer, local_indexes=[i]):
                entry = layer.entry_bytes(i, Intent.POINT)
            lat.append(time.perf_counter() - start)
            hits += local
            assert len(entry) == rec.length
        stats = svc.stats()
        disk = stats.disk_budget
        assert disk is not None
        await svc.close()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    lat.sort()
    p50 = statistics.median(lat) * 1e3
    p99 = lat[int(len(lat) * 0.99) - 1] * 1e3
    return [
        "### Point lookups and entry reads under a disk budget",
        "",
        f"A layer of {blobs:,} random blobs of {blob_bytes // 1000} KB "
        f"({data_bytes / 1e6:.0f} MB of data) in a file:// store on another filesystem; "
        f"disk budget {budget / 1e6:.1f} MB (1/10 of the data). {reads:,} reads: 80% from a "
        "5% working set, 20% uniform; each is lookup, load (pinned), point read, release.",
        "",
        "| p50 ms | p99 ms | hit ratio | GETs | evictions | present MB at end |",
        "|---|---|---|---|---|---|",
        f"| {p50:.2f} | {p99:.2f} | {hits / reads:.2f} | {stats.gets} | {disk.evictions} "
        f"| {disk.present_bytes / 1e6:.1f} |",
        "",
    ]


# -- 3. full read through the pool --------------------------------------------------------------

SCAN_WINDOW_BYTES = 1 * MiB  # what serving reads of the data region at a time


def bench_scan(work: Path, total_bytes: int, runs: int) -> list[str]:
    path = work / "scan.layer"
    blob_bytes = 1_000_000
    size, meta, _ = blob_layer(path, total_bytes // blob_bytes, blob_bytes, seed=9)
    reader_src = LocalFile.open_read(str(path))
    reader = LayerReader.open(reader_src, meta_size=meta)
    data_end = reader.data_end
    cat_s = [run_command(["sh", "-c", f"cat {path} > /dev/null"]) for _ in range(runs + 1)][1:]

    def scan() -> float:
        pool = BufferPool()
        fd = reader_src.fd

        def load(offset: int, length: int, intent: Intent) -> bytes:
            return pread_full(fd, offset, length)

        pf = pool.open_file("scan", size, load, [Region(0, data_end, PageClass.DATA)])
        start = time.perf_counter()
        read = 0
        for offset in range(0, data_end, SCAN_WINDOW_BYTES):
            read += len(pool.read_through(pf, offset, min(SCAN_WINDOW_BYTES, data_end - offset)))
        elapsed = time.perf_counter() - start
        assert read == data_end and pool.stats().page_bytes == 0
        pool.close_file(pf)
        return elapsed

    ours = [scan() for _ in range(runs)]
    reader_src.close()
    ratio = Series(tuple(sorted(c / o for c, o in zip(cat_s, ours, strict=True))))
    mbps = Series(tuple(sorted(data_end / o / 1e6 for o in ours)))
    os.unlink(path)
    return [
        "### Full read through the buffer pool",
        "",
        f"The data region of a {size / 1e6:.0f} MB local layer file read in "
        f"{SCAN_WINDOW_BYTES // MiB} MiB windows by `BufferPool.read_through` (one `pread` "
        f"per window, no page kept; default 256 MiB pool), against `cat file > /dev/null` "
        f"on the same warm file. {runs} runs each.",
        "",
        "| MB/s (min / median / max) | speed vs cat (min / median / max) |",
        "|---|---|",
        f"| {fmt3(mbps, digits=0)} | {fmt3(ratio, digits=2)} |",
        "",
        "Target: at least 0.5 of cat.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small inputs, for a smoke run")
    parser.add_argument(
        "--scan-only", action="store_true", help="only the read-through; prints, writes nothing"
    )
    args = parser.parse_args()
    runs = 3 if args.quick else 5
    if args.scan_only:
        with tempfile.TemporaryDirectory(prefix="enroute-bench-") as tmp:
            print("\n".join(bench_scan(Path(tmp), (40 if args.quick else 200) * 1_000_000, runs)))
        return
    with tempfile.TemporaryDirectory(prefix="enroute-bench-") as tmp:
        work = Path(tmp)
        lines = asyncio.run(bench_cold_open(work, 20_000 if args.quick else 200_000, runs))
        lines += asyncio.run(
            bench_point_reads(
                work, 400 if args.quick else 2_000, 50_000, 500 if args.quick else 3_000
            )
        )
        lines += bench_scan(work, (40 if args.quick else 200) * 1_000_000, runs)
    write_section("storage", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
