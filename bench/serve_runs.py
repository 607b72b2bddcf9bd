"""The CPU of ``write_pack`` for a full clone: compiled runs against their reference.

Issue 25, item 2: the per-entry loop of the pack writer's runs is compiled
(``enroute_native.pack_run``, docs/native.md); ``serve._write_run_reference`` is
the Python loop it replaced. This pushes a generated profile as one layer held in
memory, plans a full clone, and writes it through each in interleaved pairs, in
one process (the process's CPU seconds, so a loaded machine inflates both alike).
The packs must be the same bytes. The figures go to docs/serving.md and
docs/native.md by hand; no section of docs/benchmarks.md is written.

Usage: ``python -m bench.serve_runs [--profile NAME] [--pairs N]`` from the checkout
root (``default`` is the benchmark repository; the others are
``enroute_testing.repogen.PROFILES``, generated once under ``.bench-cache/``).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.git import CACHE, SMALL_PROFILES
from enroute_core.base.ids import oid_from_hex
from enroute_core.engine import serve
from enroute_core.engine.serve import plan_fetch, write_pack
from enroute_core.engine.view import View
from enroute_testing.pushed import push_layer
from enroute_testing.repogen import cached_repo, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="default", help="default, or a repogen profile")
    parser.add_argument("--pairs", type=int, default=7, help="interleaved pairs of writes")
    args = parser.parse_args()
    name = args.profile
    spec = SMALL_PROFILES[name] if name in SMALL_PROFILES else profile(name, quirks=True)
    repo, _ = cached_repo(spec, CACHE, label=name)
    tips = [oid_from_hex(v) for v in repo.refs.values()]
    started = time.process_time()
    entry, reader = push_layer(repo.path, [], 0, revs=["--all"], exclude=[], tips=tips)
    print(f"{entry.object_count:,} objects pushed in {time.process_time() - started:.1f} s CPU")
    view = View([(entry, reader)])
    plan = plan_fetch(view, tips)
    writers = {"compiled": serve._write_run, "reference": serve._write_run_reference}
    seconds: dict[str, list[float]] = {side: [] for side in writers}
    packs: dict[str, bytes] = {}
    try:
        for _ in range(args.pairs):
            for side, writer in writers.items():
                serve._write_run = writer
                parts: list[bytes] = []
                started = time.process_time()
                stats = write_pack(view, plan, parts.append)
                seconds[side].append(time.process_time() - started)
                packs[side] = b"".join(parts)
    finally:
        serve._write_run = writers["compiled"]
    assert packs["compiled"] == packs["reference"], "the two writers differ"
    print(f"pack {len(packs['compiled']):,} bytes, {stats}")
    for side, xs in seconds.items():
        print(f"{side}: CPU s min / median / max {min(xs):.3f} / "
              f"{statistics.median(xs):.3f} / {max(xs):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
