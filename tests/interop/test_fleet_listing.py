"""Listing at scale (issue 19, item 6), through the REST API of a real `enroute dev`.

``GET /api/v1/repos?limit=&page_token=`` goes through gitproto to a compute's
ListRepositories and the ledger's List, which seeks to the page token (a
bisect on its sorted names) and reads one page: a page's time must not grow
with the number of repositories. Repositories are created through the API
(concurrently); the listing is paged at 100 a page, and the median time of the
last pages must stay within noise of the first ones. The whole listing, scaled
to 100,000 repositories at the measured rate of 1,000-repository pages, must
take at most 10 s.

``ENROUTE_LIST_REPOS`` sets the count (CI: 2,000; ``nightly``: 100,000, where a
scan of every name per page would show).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from enroute_testing.devserver import DevServer, running_dev

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from test_fleet_bounded import get, role_http  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.slow]

REPOS = int(os.environ.get("ENROUTE_LIST_REPOS", "2000"))
NIGHTLY_REPOS = 100_000
SMALL_PAGE = 100
BIG_PAGE = 1000
EDGE_PAGES = 5
NOISE_S = 0.02
FULL_COUNT = 100_000
FULL_BUDGET_S = 10.0
IDLE_WAIT_S = 120.0


def create(dev: DevServer, name: str) -> None:
    req = urllib.request.Request(
        f"{dev.url}/api/v1/repos",
        data=json.dumps({"name": name}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 201


def pages(dev: DevServer, limit: int) -> tuple[list[str], list[float]]:
    token, names, times = "", [], []
    while True:
        query = f"limit={limit}" + (f"&page_token={token}" if token else "")
        t = time.perf_counter()
        with urllib.request.urlopen(f"{dev.url}/api/v1/repos?{query}", timeout=60) as r:
            page = json.loads(r.read())
        times.append(time.perf_counter() - t)
        names += [r["name"] for r in page["repos"]]
        token = page.get("next_page_token") or ""
        if not token:
            return names, times


@pytest.mark.timeout(3600)
def test_a_page_costs_the_same_at_the_start_and_the_end_of_a_long_listing(
    tmp_path: Path,
) -> None:
    listed(tmp_path, REPOS)


@pytest.mark.nightly
@pytest.mark.timeout(4 * 3600)
def test_a_hundred_thousand_repositories_list_within_ten_seconds(tmp_path: Path) -> None:
    listed(tmp_path, NIGHTLY_REPOS)


def listed(tmp_path: Path, count: int) -> None:
    expected = [f"list/r{k:06d}" for k in range(count)]
    with running_dev(tmp_path) as dev:
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda n: create(dev, n), expected))
        made_s = time.perf_counter() - t
        # let the new groups go idle first: a page is timed, not the hibernation of
        # thousands of groups the ledger does meanwhile
        ledger = role_http(tmp_path)["ledger"]
        deadline = time.monotonic() + IDLE_WAIT_S
        while json.loads(get(f"{ledger}/status"))["groups_hibernated"] < count:
            assert time.monotonic() < deadline, "the new groups did not go idle"
            time.sleep(0.5)

        names, small = pages(dev, SMALL_PAGE)
        assert names == expected
        first = statistics.median(small[:EDGE_PAGES])
        last = statistics.median(small[-EDGE_PAGES - 1 : -1])  # the last page may be short
        names, big = pages(dev, BIG_PAGE)
        assert names == expected
    per_repo_s = sum(big) / count
    print(
        f"{count:,} repositories created in {made_s:.0f} s; pages of {SMALL_PAGE}: first "
        f"{first * 1e3:.1f} ms, last {last * 1e3:.1f} ms (median of {EDGE_PAGES}); pages of "
        f"{BIG_PAGE}: {sum(big):.2f} s in all, {per_repo_s * FULL_COUNT:.1f} s at "
        f"{FULL_COUNT:,}"
    )
    print("pages of 100 (ms):", " ".join(f"{x * 1e3:.0f}" for x in small))
    assert last <= 2 * first + NOISE_S, "a page got slower as the listing went on"
    assert per_repo_s * FULL_COUNT <= FULL_BUDGET_S
