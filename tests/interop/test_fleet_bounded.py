"""An idle repository costs almost nothing to watch (issue 19, items 2 and 4), on a real
`enroute dev`.

- Bounded observability (docs/observability.md, "Bounded labels and a bounded
  /status"): repositories are created through the API, pushed and cloned with
  git, 20 of them, then 60. Every role's /metrics has the same series count at
  both sizes (no label carries a repository name: the compute used to export
  ``enroute_compute_repository_layers{repo=...}``), and every /status is the
  same size within 2% (the ledger's used to list every group and name).
- Parked subscriptions (docs/raft.md): the compute follows every repository it
  served, yet once idle every group hibernates; a later push wakes its group,
  and a clone sees it.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_compute.maintainer import STATUS_TOP_MAX as LISTED
from enroute_testing.devserver import DevServer, role_http, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.scrape import sample_value as metric
from enroute_testing.scrape import series_count as series

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SMALL, LARGE = 20, 60
STATUS_MARGIN = 0.02
HIBERNATE_AFTER_S = 1.0
WAIT_S = 60.0


def name(k: int) -> str:
    return f"fleet/r{k:04d}"


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=headers or {}), timeout=20
    ) as r:
        body: bytes = r.read()
    return body


def api(dev: DevServer, method: str, target: str, body: object = None) -> int:
    conn = http.client.HTTPConnection(dev.address.split(":")[0], int(dev.address.split(":")[1]))
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, target, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


class Fleet:
    def __init__(self, dev: DevServer, root: Path) -> None:
        self.dev = dev
        self.root = root
        self.count = 0
        self.http = {"gitproto": dev.ops_url, **role_http(root)}
        self.work = root / "work"
        run_git(["init", "-q", "-b", "main", str(self.work)], cwd=root)
        for i in range(3):
            (self.work / f"f{i}.txt").write_text(f"fleet {i}\n" * 20)
            run_git(["add", "."], cwd=self.work)
            run_git(["commit", "-q", "-m", f"c{i}"], cwd=self.work)

    def url(self, k: int) -> str:
        return f"{self.dev.url}/{name(k)}.git"

    def grow_to(self, n: int) -> None:
        """Create, push and clone repositories up to ``n``."""
        for k in range(self.count, n):
            assert api(self.dev, "POST", "/api/v1/repos", {"name": name(k)}) == 201
            run_git(["push", "-q", self.url(k), "main"], cwd=self.work)
            clone = self.root / "clones" / f"{k}"
            run_git(["clone", "-q", "--bare", self.url(k), str(clone)], cwd=self.root)
        self.count = max(self.count, n)

    def observe(self) -> dict[str, tuple[int, int]]:
        """(series on /metrics, bytes of /status) of each role, once maintenance has
        visited what was pushed (its /status lists the top ``LISTED`` repositories)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            m = json.loads(get(f"{self.http['compute']}/status"))["maintenance"]
            want = min(LISTED, self.count)
            if len(m["layers"]) >= want and len(m["lease_holders"]) >= want:
                break
            assert time.monotonic() < deadline, f"maintenance did not settle: {m}"
            time.sleep(0.5)
        for base in self.http.values():  # the first scrape makes the ops series
            get(f"{base}/metrics")
        out = {}
        for role, base in self.http.items():
            out[role] = (series(get(f"{base}/metrics").decode()), len(get(f"{base}/status")))
        return out

    def ledger_metrics(self) -> str:
        return get(f"{self.http['ledger']}/metrics").decode()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    config = {"ledger": {"hibernate_after": f"{HIBERNATE_AFTER_S}s"}}
    with running_dev(root, config) as dev:
        yield Fleet(dev, root)


@pytest.mark.timeout(600)
def test_series_count_and_status_size_do_not_grow_with_repositories(fleet: Fleet) -> None:
    fleet.grow_to(SMALL)
    small = fleet.observe()
    fleet.grow_to(LARGE)
    large = fleet.observe()
    print(f"series and /status bytes at {SMALL}: {small}; at {LARGE}: {large}")
    for role in small:
        assert large[role][0] == small[role][0], f"{role}: series grew with repositories"
        grown = large[role][1] / small[role][1] - 1
        assert grown <= STATUS_MARGIN, f"{role}: /status grew {grown:.1%}"
    # one repository's figures are still there, asked for by name
    admin = fleet.dev.admin_headers  # per-repository detail: docs/security.md
    one = json.loads(get(f"{fleet.http['compute']}/status?repo={name(3)}", admin))
    assert one["hosted"] and one["version"] >= 2
    groups = json.loads(get(f"{fleet.http['ledger']}/status?repo={name(3)}", admin))["raft_groups"]
    assert [g["repo"] for g in groups] == [name(3)]


@pytest.mark.timeout(600)
def test_followed_idle_groups_hibernate_and_a_push_reaches_the_view(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.grow_to(SMALL)
    compute_status = json.loads(get(f"{fleet.http['compute']}/status"))
    assert compute_status["hosted_repositories"] >= SMALL  # followed: subscribed to each
    deadline = time.monotonic() + WAIT_S
    text = fleet.ledger_metrics()
    while metric(text, "enroute_ledger_groups_hibernated") < fleet.count:
        assert time.monotonic() < deadline, "followed idle groups did not hibernate"
        time.sleep(0.5)
        text = fleet.ledger_metrics()
    wakes = metric(text, "enroute_ledger_group_wakes_total")

    (fleet.work / "late.txt").write_text("after hibernation\n")
    run_git(["add", "."], cwd=fleet.work)
    run_git(["commit", "-q", "-m", "late"], cwd=fleet.work)
    head = run_git(["rev-parse", "HEAD"], cwd=fleet.work).decode().strip()
    run_git(["push", "-q", fleet.url(0), "main"], cwd=fleet.work)
    clone = tmp_path / "late"
    run_git(["clone", "-q", fleet.url(0), str(clone)], cwd=tmp_path)
    assert run_git(["rev-parse", "HEAD"], cwd=clone).decode().strip() == head
    assert (clone / "late.txt").read_text() == "after hibernation\n"
    assert metric(fleet.ledger_metrics(), "enroute_ledger_group_wakes_total") > wakes
