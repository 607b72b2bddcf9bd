"""A change updates the view in place (seed 004, "Effects"): after the snapshot that
opens a repository builds its view, pushes append layers and rebuild nothing."""

from __future__ import annotations

from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from enroute_compute.http import OpsServer
from enroute_testing.gitcli import run_git
from enroute_testing.repogen import RepoSpec, generate_repo, list_refs

pytestmark = pytest.mark.interop

PUSHES = 4


def test_pushes_update_the_view_without_rebuilding(
    compute: object, git_bridge: Callable[[str], ThreadingHTTPServer], tmp_path: Path
) -> None:
    host = compute.host  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{git_bridge(compute.address).server_address[1]}"  # type: ignore[attr-defined]
    source = generate_repo(tmp_path / "source.git", RepoSpec(seed=5, commits=8, files=6))
    run_git(["push", "--mirror", f"{url}/views.git"], cwd=source.path)
    work = tmp_path / "work"
    run_git(["clone", "-q", f"{url}/views.git", str(work)], cwd=tmp_path)
    builds, updates = host.view_builds, host.view_updates
    assert builds >= 1
    for i in range(PUSHES):
        (work / f"f{i}.txt").write_text(f"change {i}\n")
        run_git(["add", "."], cwd=work)
        run_git(["commit", "-q", "-m", f"change {i}"], cwd=work)
        run_git(["push", "-q", "origin", "main"], cwd=work)
    clone = tmp_path / "clone.git"
    run_git(["clone", "-q", "--mirror", f"{url}/views.git", str(clone)], cwd=tmp_path)
    run_git(["fsck", "--strict", "--no-progress"], cwd=clone)
    assert list_refs(clone)[b"refs/heads/main"] == run_git(["rev-parse", "HEAD"], cwd=work).strip()
    assert host.view_builds == builds, "a push rebuilt the view"
    assert host.view_updates >= updates + PUSHES
    view = host._repos["views"].view
    assert len(view.layers) == len(host._repos["views"].state.manifest) >= PUSHES + 1
    ops = OpsServer(host, "c1", lambda: True)
    status = ops.status()
    assert (status["view_builds"], status["view_updates"]) == (builds, host.view_updates)
    text = ops.metrics_text().decode()
    assert f"enroute_compute_view_builds_total {float(builds)}\n" in text
    assert f"enroute_compute_view_updates_total {float(host.view_updates)}\n" in text
    # every pack git sent took the compiled indexer (docs/native.md), none the reference
    assert host.reference_indexes == 0
    assert "enroute_engine_reference_indexes_total 0.0\n" in text
