"""Views are a cache (issue 19, item 1; docs/fleet.md), on a real `enroute dev`.

With ``limits.view_idle_ms_max`` short, repositories pushed and cloned with git go idle;
the compute evicts every view and ends its subscription (the ledger's open Subscribe
streams drop to 0 and its groups hibernate) and closes the view's stored layers (every
push here makes one: ``layers.inline_max`` 0). A clone of an evicted repository then
re-opens the view and gets exactly what it got before, and a push to a re-opened, then
evicted again, repository is what the next clone sees: a re-opened view is current.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.devserver import DevServer, role_http, running_dev
from enroute_testing.fleet import clone_contents
from enroute_testing.gitcli import run_git
from enroute_testing.scrape import sample_value

pytestmark = [pytest.mark.interop, pytest.mark.slow]

REPOS = 4
IDLE_MS = 1500
WAIT_S = 60.0


def scrape(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=20) as r:
        text: str = r.read().decode()
    return text


class Dev:
    def __init__(self, dev: DevServer, root: Path) -> None:
        self.dev = dev
        self.root = root
        self.http = role_http(root)
        self.work = root / "work"
        run_git(["init", "-q", "-b", "main", str(self.work)], cwd=root)
        self.commit("a")
        self.clones = 0

    def commit(self, text: str) -> str:
        (self.work / "f.txt").write_text(text * 50)
        run_git(["add", "."], cwd=self.work)
        run_git(["commit", "-q", "-m", text], cwd=self.work)
        return run_git(["rev-parse", "HEAD"], cwd=self.work).decode().strip()

    def url(self, k: int) -> str:
        return f"{self.dev.url}/evict/r{k}.git"

    def clone(self, k: int) -> Path:
        self.clones += 1
        dest = self.root / "clones" / f"{k}-{self.clones}"
        run_git(["clone", "-q", "--bare", self.url(k), str(dest)], cwd=self.root)
        return dest

    def metric(self, role: str, family: str) -> float:
        return sample_value(scrape(self.http[role]), family)

    def wait_evicted(self) -> None:
        """Until the compute holds no view and the ledger no Subscribe stream."""
        deadline = time.monotonic() + WAIT_S
        while (
            self.metric("compute", "enroute_compute_hosted_repositories") > 0
            or self.metric("ledger", "enroute_ledger_subscriptions_open") > 0
        ):
            assert time.monotonic() < deadline, "idle views were not evicted"
            time.sleep(0.25)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    root = tmp_path_factory.mktemp("evict")
    config = {
        "ledger": {"hibernate_after": "1s"},
        "limits": {"view_idle_ms_max": IDLE_MS},
        "layers": {"inline_max": 0},  # every push a stored layer: eviction closes them
    }
    with running_dev(root, config) as server:
        yield Dev(server, root)


@pytest.mark.timeout(300)
def test_idle_views_are_evicted_and_a_later_clone_and_push_see_the_latest(
    dev: Dev, tmp_path: Path
) -> None:
    for k in range(REPOS):
        run_git(["push", "-q", dev.url(k), "main"], cwd=dev.work)
    before = {k: clone_contents(dev.clone(k)) for k in range(REPOS)}
    assert dev.metric("compute", "enroute_compute_hosted_repositories") == REPOS
    assert dev.metric("ledger", "enroute_ledger_subscriptions_open") == REPOS
    assert dev.metric("compute", "enroute_layer_open") == REPOS

    dev.wait_evicted()
    assert dev.metric("compute", "enroute_compute_view_evictions_total") >= REPOS
    # the evicted views' stored layers are closed: no metadata left open for them
    assert dev.metric("compute", "enroute_layer_open") == 0
    assert dev.metric("compute", "enroute_layer_closes_total") >= REPOS
    deadline = time.monotonic() + WAIT_S  # nobody parked on them: the groups sleep
    while dev.metric("ledger", "enroute_ledger_groups_hibernated") < REPOS:
        assert time.monotonic() < deadline, "groups of evicted views did not hibernate"
        time.sleep(0.25)

    # a clone re-opens the view and gets exactly what it got before
    reopens = dev.metric("compute", "enroute_compute_view_reopens_total")
    assert clone_contents(dev.clone(0)) == before[0]
    assert dev.metric("compute", "enroute_compute_view_reopens_total") == reopens + 1
    assert dev.metric("compute", "enroute_layer_open") == 1  # opened again from its copy

    # a push to an evicted repository, evicted again, then cloned: the latest state
    head = dev.commit("b")
    run_git(["push", "-q", dev.url(1), "main"], cwd=dev.work)
    dev.wait_evicted()
    got = dev.clone(1)
    assert run_git(["rev-parse", "refs/heads/main"], cwd=got).decode().strip() == head
    run_git(["fsck", "--strict"], cwd=got)
    # and the others are what they were
    for k in (2, 3):
        assert clone_contents(dev.clone(k)) == before[k]
