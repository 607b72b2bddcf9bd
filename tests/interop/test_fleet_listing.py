"""Listing at scale (issue 19, item 6), through the REST API of a real `enroute dev`.

``GET /api/v1/repos?limit=&page_token=`` goes through gitproto to a compute's
ListRepositories and the ledger's List, which seeks to the page token (a
bisect on its sorted names) and reads one page: a page's cost must not grow
with its position in the listing. Repositories are created through the API
(concurrently); the listing is paged at 100 a page. The first and the last
pages are then fetched again, and the CPU the chain spends on them (ledger,
compute and gitproto, from their ``process_cpu_seconds_total``, and this
client) must match within noise: CPU, because the wall time of a page on a
loaded machine is mostly the wait for a core (the 5,000-repository benchmark
saw pages of 141 to 785 ms at a load of 20 to 38 while these pages' work was
flat, see docs/fleet.md). The whole listing at 1,000-repository pages, scaled
to 100,000 repositories, must cost at most 10 s of that CPU (on an idle
machine the chain runs one page at a time, so that is its wall time); the
wall times are printed beside.

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

from enroute_testing.devserver import DevServer, gitproto_ops, running_dev

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
REPEATS = 3
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


def page(dev: DevServer, limit: int, token: str) -> dict[str, object]:
    query = f"limit={limit}" + (f"&page_token={token}" if token else "")
    with urllib.request.urlopen(f"{dev.url}/api/v1/repos?{query}", timeout=60) as r:
        answer: dict[str, object] = json.loads(r.read())
    return answer


def pages(dev: DevServer, limit: int) -> tuple[list[str], list[float], list[str]]:
    """Every name, the wall time of each page, and the token each page was asked with."""
    token, names, times, tokens = "", [], [], []
    while True:
        tokens.append(token)
        t = time.perf_counter()
        got = page(dev, limit, token)
        times.append(time.perf_counter() - t)
        repos = got["repos"]
        assert isinstance(repos, list)
        names += [r["name"] for r in repos]
        token = str(got.get("next_page_token") or "")
        if not token:
            return names, times, tokens


def chain_cpu_s(root: Path) -> float:
    """CPU seconds the ledger, the compute and gitproto have used, and this process."""
    total = time.process_time()
    for base in (*role_http(root).values(), gitproto_ops(root)):
        for line in get(f"{base}/metrics").decode().splitlines():
            if line.startswith("process_cpu_seconds_total "):
                total += float(line.split()[1])
    return total


def cpu_of(root: Path, dev: DevServer, limit: int, tokens: list[str]) -> float:
    """CPU seconds per page of fetching the pages at ``tokens`` again (``REPEATS`` times)."""
    t = chain_cpu_s(root)
    for _ in range(REPEATS):
        for token in tokens:
            page(dev, limit, token)
    return (chain_cpu_s(root) - t) / (REPEATS * len(tokens))


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

        names, small, tokens = pages(dev, SMALL_PAGE)
        assert names == expected
        first_cpu = cpu_of(tmp_path, dev, SMALL_PAGE, tokens[:EDGE_PAGES])
        last_cpu = cpu_of(tmp_path, dev, SMALL_PAGE, tokens[-EDGE_PAGES - 1 : -1])  # full pages
        t = chain_cpu_s(tmp_path)
        names, big, _ = pages(dev, BIG_PAGE)
        big_cpu = chain_cpu_s(tmp_path) - t
        assert names == expected
    first = statistics.median(small[:EDGE_PAGES])
    last = statistics.median(small[-EDGE_PAGES - 1 : -1])
    print(
        f"{count:,} repositories created in {made_s:.0f} s; pages of {SMALL_PAGE}: CPU of the "
        f"first {first_cpu * 1e3:.1f} ms, of the last {last_cpu * 1e3:.1f} ms; wall (median "
        f"of {EDGE_PAGES}) first {first * 1e3:.1f} ms, last {last * 1e3:.1f} ms; pages of "
        f"{BIG_PAGE}: CPU {big_cpu:.2f} s, wall {sum(big):.2f} s in all, "
        f"{big_cpu / count * FULL_COUNT:.1f} s of CPU and {sum(big) / count * FULL_COUNT:.1f} s "
        f"of wall at {FULL_COUNT:,}"
    )
    print("pages of 100, wall (ms):", " ".join(f"{x * 1e3:.0f}" for x in small))
    print(f"pages of {BIG_PAGE}, wall (ms):", " ".join(f"{x * 1e3:.0f}" for x in big))
    assert last_cpu <= 1.5 * first_cpu + NOISE_S, "a page got costlier as the listing went on"
    assert big_cpu / count * FULL_COUNT <= FULL_BUDGET_S
