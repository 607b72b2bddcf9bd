"""/metrics and /status of every process of a real `enroute dev`, after a push and a clone.

DESIGN.md "Observability": Prometheus text with the `enroute_` prefix, parsed
here with prometheus-client's own parser, carrying the families of
docs/observability.md; /status JSON valid against docs/status.schema.json.
The Grafana dashboard (charts/enroute/dashboards/enroute.json) may name only
families these processes export.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enroute_gitproto.observe import VERSION
from enroute_testing.devserver import role_http, running_dev
from enroute_testing.gitcli import run_git

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "status.schema.json"
DASHBOARD = ROOT / "charts" / "enroute" / "dashboards" / "enroute.json"

# Families each role must export (names as the parser gives them: no _total).
REQUIRED: dict[str, set[str]] = {
    "ledger": {
        "enroute_raft_leader_changes",
        "enroute_ledger_proposals",
        "enroute_raft_apply_lag_entries",
        "enroute_raft_fsync_seconds",
        "enroute_ledger_groups",
        "enroute_ledger_groups_leading",
        "enroute_ledger_groups_hibernated",
    },
    "compute": {
        "enroute_compute_pushes",
        "enroute_compute_fetches",
        "enroute_engine_pack_bytes",
        "enroute_engine_objects",
        "enroute_engine_ingest_seconds",
        "enroute_engine_serve_seconds",
        "enroute_pool_hits",
        "enroute_pool_misses",
        "enroute_pool_evictions",
        "enroute_layer_loads",
        "enroute_layer_loads_in_flight",
        "enroute_layer_hydrations",
        "enroute_layer_links",
        "enroute_disk_budget_bytes",
        "enroute_disk_present_bytes",
        "enroute_disk_evictions",
        "enroute_compute_calls_refused",
        "enroute_compute_maintenance_visits",
        "enroute_compute_maintenance_repositories_due",
    },
    "gitproto": {
        "enroute_gitproto_requests",
        "enroute_gitproto_request_seconds",
        "enroute_gitproto_auth_failures",
        "enroute_http_requests_in_flight",
        "enroute_compute_failovers",
    },
}
EVERY_ROLE = {"enroute_build_info", "process_cpu_seconds", "process_resident_memory_bytes"}
"""Families every role exports beside its own (issue 23, item 7)."""
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
_METRIC = re.compile(r"\benroute_[a-z0-9_]+")


def family_of(sample: str) -> str:
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def dashboard_families() -> set[str]:
    """Every metric family named in an ``expr`` of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    stack: list[object] = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    names |= {family_of(m) for m in _METRIC.findall(value)}
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return names


def test_dashboard_names_only_exported_families() -> None:
    """Static half of the check (fast): the interop test proves REQUIRED is exported."""
    exported = set().union(*REQUIRED.values())
    used = dashboard_families()
    assert used, "the dashboard has no expressions"
    assert used <= exported, f"not exported: {sorted(used - exported)}"


def test_dashboard_checker_catches_a_foreign_name() -> None:
    assert family_of("enroute_pool_hits_total") == "enroute_pool_hits"
    assert _METRIC.findall("rate(enroute_x_bucket[5m]) / node_cpu") == ["enroute_x_bucket"]


_HELP = re.compile(r"^# HELP (\S+) (.*)$")
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")


def lint_metrics(text: str) -> list[str]:
    """What ``promtool check metrics`` finds in ``text``; its rules where it is missing.

    CI installs Debian's ``prometheus`` package for promtool (.ci/run). Without it the
    rules this checks by hand are the ones promtool applies to an exposition (its
    ``promlint``): a HELP text for every family, counters named ``_total``, and no
    family declared twice.
    """
    promtool = shutil.which("promtool")
    if promtool is not None:
        done = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                              capture_output=True, timeout=60, check=False)  # fmt: skip
        out = (done.stdout + done.stderr).decode().strip()
        return [line for line in out.splitlines() if line] if done.returncode else []
    problems = []
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if m := _HELP.match(line):
            helps[m.group(1)] = m.group(2)
        elif m := _TYPE.match(line):
            if m.group(1) in types:
                problems.append(f"{m.group(1)} declared twice")
            types[m.group(1)] = m.group(2)
    for name, kind in types.items():
        if not helps.get(name, "").strip():
            problems.append(f"{name} no help text")
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f"counter {name} should have _total suffix")
    return problems


def test_metrics_lint_finds_what_promtool_finds() -> None:
    bad = "# TYPE enroute_x_total counter\nenroute_x_total 1\n"
    assert lint_metrics(bad) == ["enroute_x_total no help text"]
    good = "# HELP enroute_x_total things\n# TYPE enroute_x_total counter\nenroute_x_total 1\n"
    assert lint_metrics(good) == []


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=20) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running `enroute dev`: the operator base URL of each role (gitproto's listen.ops),
    and its Git base URL as ``git``."""
    root = tmp_path_factory.mktemp("observe-dev")
    with running_dev(root) as server:
        urls = {"gitproto": server.ops_url, **role_http(root)}
        yield {**urls, "git": server.url}


@pytest.mark.interop
@pytest.mark.timeout(240)
def test_metrics_and_status_of_every_process(dev: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    for i in range(3):
        (src / f"f{i}.txt").write_text(f"observability {i}\n" * 50)
        run_git(["add", "."], cwd=src)
        run_git(["commit", "-q", "-m", f"c{i}"], cwd=src)
    url = f"{dev['git']}/observe/metrics.git"
    run_git(["push", "-q", url, "main:refs/heads/main"], cwd=src)
    run_git(["clone", "-q", url, str(tmp_path / "clone")], cwd=tmp_path)
    assert (tmp_path / "clone" / "f2.txt").exists()

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    exported: set[str] = set()
    values: dict[str, dict[str, float]] = {}
    for role, base in dev.items():
        if role == "git":
            continue
        code, body = _get(f"{base}/metrics")
        assert code == 200
        text = body.decode()
        problems = lint_metrics(text)
        assert not problems, f"{role}: {problems}"
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert all(name.startswith(("enroute_", "process_")) for name in families), role
        missing = (REQUIRED[role] | EVERY_ROLE) - set(families)
        assert not missing, f"{role} lacks {sorted(missing)}"
        exported |= set(families)
        values[role] = {
            f"{s.name}{sorted(s.labels.items())}": s.value
            for f in families.values()
            for s in f.samples
        }
        code, body = _get(f"{base}/status")
        assert code == 200
        status = json.loads(body)
        jsonschema.validate(status, schema)
        assert status["role"] == role
        build = values[role][f"enroute_build_info[('role', '{role}'), ('version', '{VERSION}')]"]
        assert build == 1 and values[role]["process_start_time_seconds[]"] > 0

    compute = values["compute"]
    assert compute["enroute_compute_pushes_total[]"] >= 1
    assert compute["enroute_compute_fetches_total[]"] >= 1
    assert compute["enroute_engine_pack_bytes_total[('direction', 'received')]"] > 0
    assert compute["enroute_engine_pack_bytes_total[('direction', 'sent')]"] > 0
    assert compute["enroute_engine_objects_total[('direction', 'received')]"] >= 9
    assert compute["enroute_engine_ingest_seconds_count[]"] >= 1
    calls = "enroute_compute_git_calls_total[('code', 'OK'), ('method', 'ReceivePack')]"
    assert compute[calls] >= 1
    gitproto = values["gitproto"]
    pushed = "enroute_gitproto_requests_total[('service', 'git-receive-pack'), ('status', '200')]"
    assert gitproto[pushed] >= 1
    assert values["ledger"]["enroute_ledger_proposals_total[]"] >= 1
    assert dashboard_families() <= exported


@pytest.mark.interop
@pytest.mark.timeout(120)
def test_gitproto_operator_endpoints_only_on_the_operator_port(dev: dict[str, str]) -> None:
    """Issue 23 item 5: an Ingress routes gitproto's Git port, so /metrics and /status are
    not there (404); the probes stay on both ports, the Git port serves no Git on the
    operator port (docs/security.md, "Operator endpoints")."""
    git, ops = dev["git"], dev["gitproto"]
    assert git != ops
    for path in ("/metrics", "/status"):
        try:
            urllib.request.urlopen(git + path, timeout=20)
            raise AssertionError(f"{path} answered on the Git port")
        except urllib.error.HTTPError as error:
            assert error.code == 404, (path, error.code)
        assert _get(ops + path)[0] == 200
    for path in ("/healthz", "/readyz"):
        assert _get(git + path)[0] == 200 and _get(ops + path)[0] == 200
    try:
        urllib.request.urlopen(f"{ops}/any/repo.git/info/refs?service=git-upload-pack", timeout=20)
        raise AssertionError("Git answered on the operator port")
    except urllib.error.HTTPError as error:
        assert error.code == 404
