"""Maintenance visits repositories that changed, not every hosted one (issue 19, item 7).

A pass used to visit every repository this compute hosts: a lease renewal, a
read barrier and a merge plan per repository per ``layers.maintenance_interval``,
however idle. Now the host tells the maintainer which views took a new state
(``RepositoryHost.state_listeners``), and a pass visits those and the ones whose
sweep or retry came due. The test counts visits: idle repositories are visited
once (the first pass after they are hosted), and a pass after one push visits
one repository whether 40 or 80 idle ones are hosted.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from enroute_compute.ledger_port import CreateMode
from enroute_compute.maintainer import Maintainer, MaintainerConfig
from enroute_core.storage.objectstore import open_store
from enroute_testing.gitcli import run_git

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from test_maintenance_gaps import _on_loop, _work  # noqa: E402

pytestmark = pytest.mark.interop

IDLE = 40


def _host_idle(compute: Any, tag: str, count: int) -> list[str]:
    names = [f"idle-{tag}-{k:03d}" for k in range(count)]
    for n in names:
        _on_loop(compute, lambda n=n: compute.host.open(n, CreateMode.EXPLICIT))
    return names


def _pass(compute: Any, m: Maintainer) -> int:
    """Run one pass; the repositories it visited."""
    before = m.counters.visits
    _on_loop(compute, m.run_once)
    return m.counters.visits - before


def _settle(compute: Any, m: Maintainer) -> list[int]:
    """Passes until one visits nothing (a merge's own change is visited once more)."""
    visits = [_pass(compute, m)]
    while visits[-1] and len(visits) < 6:
        visits.append(_pass(compute, m))
    assert visits[-1] == 0, visits
    return visits


def _push(work: Path, url: str, name: str, k: int) -> None:
    (work / f"f{k}").write_text(f"{k}\n")
    run_git(["add", "."], cwd=work)
    run_git(["commit", "-q", "-m", f"{k}"], cwd=work)
    run_git(["push", "-q", f"{url}/{name}.git", "main"], cwd=work)


@pytest.mark.parametrize("compute", ["local-ledger"], indirect=True)
def test_a_pass_visits_what_changed_whatever_the_number_of_idle_repositories(
    compute: Any,
    git_bridge: Callable[[str], ThreadingHTTPServer],
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"
    busy = f"busy-{tag}"
    work = _work(url, busy, tmp_path)
    _host_idle(compute, f"{tag}-a", IDLE)
    store = open_store(f"file://{tmp_path / 'store'}")
    config = MaintainerConfig(interval_s=0.0, sweep_interval_us=600 * 1_000_000)
    m = _on_loop(
        compute, lambda: Maintainer(compute.host, store, "compute-a", compute.host.clock, config)
    )
    # the first pass visits every hosted repository once (a previous run may have left
    # work), then nothing changed: nothing is visited
    first = _settle(compute, m)
    assert first[0] == IDLE + 1

    _push(work, url, busy, 1)
    after_push = _settle(compute, m)
    assert after_push[0] == 1

    # twice the idle repositories: each new one is visited once, then a push costs the
    # same visits as before
    _host_idle(compute, f"{tag}-b", IDLE)
    assert _settle(compute, m)[0] == IDLE
    _push(work, url, busy, 2)
    assert _settle(compute, m) == after_push
    assert m.status()["repositories_due"] <= 1  # the pushed one's next sweep
    _on_loop(compute, m.stop)
