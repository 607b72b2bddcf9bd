"""Codec benchmarks against C git, written to docs/benchmarks.md (section "codecs").

1. Pack parse-and-hash: our indexer against ``git index-pack --threads=1`` on
   the same pack (target: at least 1/3 of git's objects per second).
2. Delta apply throughput in MB/s of produced bytes.
3. Median point-lookup time in a 1,000,000-object layer with its pages local
   (target: at most 20 us).

Usage: ``python -m bench.codecs [--quick]`` from the checkout root.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import Series, fmt3, repeat, run_command, write_section
from enroute_core.git.delta import apply_delta, create_delta
from enroute_core.git.packindexer import index_pack
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer.reader import LayerReader
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects
from enroute_testing.synthlayer import lookup_latencies, synthetic_layer, synthetic_oids


def bench_pack(work: Path, runs: int, spec: RepoSpec) -> list[str]:
    repo = generate_repo(work / "repo.git", spec)
    pack = pack_objects(repo.path)
    pack_path = work / "bench.pack"
    pack_path.write_bytes(pack)
    count = int.from_bytes(pack[8:12], "big")

    ours = repeat(lambda: index_pack(BytesSource(pack_path.read_bytes())), runs)
    idx = work / "bench.idx"
    git = Series(
        tuple(
            run_command(["git", "index-pack", "--threads=1", "-o", str(idx), str(pack_path)])
            for _ in range(runs)
        )
    )
    ratio = Series(tuple(sorted(g / o for g, o in zip(git.samples, ours.samples, strict=True))))
    return [
        "### Pack parse-and-hash",
        "",
        f"Pack of `RepoSpec(commits={spec.commits}, files={spec.files})`: {count} objects, "
        f"{len(pack) / 1e6:.1f} MB, OFS deltas. {runs} runs each, wall time.",
        "",
        "| what | seconds min / median / max | objects/s (median) |",
        "|---|---|---|",
        f"| enroute `index_pack` | {fmt3(ours)} | {count / ours.median:,.0f} |",
        f"| `git index-pack --threads=1` | {fmt3(git)} | {count / git.median:,.0f} |",
        "",
        f"Ratio of our objects/s to git's (min / median / max): {fmt3(ratio, digits=2)}; "
        "target at least 0.33.",
        "",
    ]


def _edited(base: bytes, rng: random.Random, edits: int) -> bytes:
    out = bytearray(base)
    for _ in range(edits):
        at = rng.randrange(len(out))
        out[at : at + rng.randrange(1, 64)] = rng.randbytes(rng.randrange(1, 64))
    return bytes(out)


def bench_delta(runs: int) -> list[str]:
    rng = random.Random(7)
    words = [rng.randbytes(rng.randrange(2, 9)).hex().encode() for _ in range(4000)]
    rows = []
    cases = [
        ("1 MiB text, 200 edits", 1 << 20, 200, 1),
        ("2 KiB text x 2000, 3 edits", 2048, 3, 2000),
    ]
    for label, size, edits, count in cases:
        pairs = []
        for _ in range(count):
            base = b" ".join(rng.choice(words) for _ in range(size // 6))[:size]
            target = _edited(base, rng, edits)
            delta = create_delta(base, target)
            assert delta is not None
            pairs.append((base, delta, len(target)))
        produced = sum(p[2] for p in pairs)

        def apply_all(pairs: list[tuple[bytes, bytes, int]] = pairs) -> None:
            for base, delta, _ in pairs:
                apply_delta(base, delta)

        s = repeat(apply_all, runs)
        mbs = Series(tuple(sorted(produced / 1e6 / t for t in s.samples)))
        rows.append(f"| {label} | {fmt3(s, 1000)} | {fmt3(mbs, digits=0)} |")
    return [
        "### Delta apply",
        "",
        f"Deltas made by `create_delta` from seeded text; {runs} runs.",
        "",
        "| input | ms min / median / max | MB/s produced (min / median / max) |",
        "|---|---|---|",
        *rows,
        "",
    ]


def bench_layer_lookup(objects: int, lookups: int, runs: int) -> list[str]:
    t0 = time.perf_counter()
    data, sealed, oids = synthetic_layer(objects)
    build_s = time.perf_counter() - t0
    reader = LayerReader.open(BytesSource(data), meta_size=sealed.meta_size)
    step = max(1, objects // lookups)
    present = list(oids[::step][:lookups])
    absent = list(synthetic_oids(lookups, b"absent"))
    rows = []
    for label, probes in (("present oid", present), ("absent oid", absent)):
        medians = Series(
            tuple(
                sorted(
                    statistics.median(lookup_latencies(reader, probes, time.perf_counter))
                    for _ in range(runs)
                )
            )
        )
        rows.append(f"| {label} | {fmt3(medians, 1e6, digits=2)} |")
    return [
        "### Layer point lookup",
        "",
        f"A pushed layer of {objects:,} synthetic objects ({len(data) / 1e6:.0f} MB) written "
        f"by `LayerWriter` in {build_s:.1f} s, opened from memory (pages local); "
        f"{len(present):,} lookups per run, each timed with `perf_counter`, {runs} runs.",
        "",
        "| lookup | per-run median us (min / median / max) |",
        "|---|---|",
        *rows,
        "",
        "Target: median at most 20 us.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small inputs, for a smoke run")
    args = parser.parse_args()
    runs = 3 if args.quick else 5
    spec = RepoSpec(commits=200, files=100) if args.quick else RepoSpec(commits=2000, files=500)
    objects = 100_000 if args.quick else 1_000_000
    with tempfile.TemporaryDirectory(prefix="enroute-bench-") as tmp:
        lines = bench_pack(Path(tmp), runs, spec)
    lines += bench_delta(runs)
    lines += bench_layer_lookup(objects, 20_000, runs)
    write_section("codecs", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
