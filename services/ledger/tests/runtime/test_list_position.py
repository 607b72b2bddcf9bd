"""A List page costs the same wherever it starts (seed 001, "Listing"; issue 19, item 6).

The node answers from its in-memory, name-ordered list: a seek to the page token (a
bisect), then the page. A step over the names before the token (an islice once did
it, for the look past the page) makes the last page of 100,000 names cost three
times the first even in C, a scan in Python fifty; the REST test
(tests/interop/test_fleet_listing.py) would see it only at its nightly size.
Here 100,000 names a node knows deleted (they need no hosted group) are paged at
the start and at the end, with the real runtime and lifecycle; the fastest of a
few calls is compared, which a loaded machine leaves alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from enroute_core.base.ids import NodeId
from enroute_core.state import RepoState
from enroute_core.storage.objectstore.file import FileStore
from enroute_ledger.lifecycle import Lifecycle
from enroute_ledger.logstore import open_log_store
from enroute_ledger.runtime import Runtime, RuntimeConfig

NAMES = 100_000
PAGE = 1000
REPEATS = 20


def test_the_last_page_of_a_long_listing_costs_what_the_first_does(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        store = open_log_store(tmp_path / "log")
        rt = Runtime(
            RuntimeConfig(node_id=NodeId(1), peers=()),
            store,
            clock=loop.time,
            nonce=os.urandom(8),
            seed=1,
        )
        lc = Lifecycle(rt, FileStore(tmp_path / "objects"), upload_window=64,
                       wall_clock_us=lambda: 0)  # fmt: skip
        try:
            names = [f"list/r{k:06d}" for k in range(NAMES)]
            gone = RepoState(incarnation=1, deleted=True, version=2)
            lc._ended = dict.fromkeys(names, gone)
            lc._names = names  # in order already (_remember inserts one at a time)

            def timed(start_after: str) -> tuple[float, list[str], bool]:
                """The fastest of ``REPEATS`` calls: what the page costs, less the load."""
                best = float("inf")
                for _ in range(REPEATS):
                    t = time.perf_counter()
                    _, got, more = lc.list(start_after, PAGE)
                    best = min(best, time.perf_counter() - t)
                return best, got, more

            first_s, first, more = timed("")
            assert first == names[:PAGE] and more
            last_s, last, more = timed(names[-PAGE - 1])
            assert last == names[-PAGE:] and not more
            print(f"page of {PAGE} of {NAMES:,}: first {first_s * 1e3:.2f} ms, "
                  f"last {last_s * 1e3:.2f} ms")  # fmt: skip
            assert last_s <= 1.5 * first_s + 0.0001
        finally:
            store.close()

    asyncio.run(main())
