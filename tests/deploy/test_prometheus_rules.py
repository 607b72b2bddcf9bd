"""The chart's PrometheusRule (issue 23, item 7): valid PromQL, and each alert fires on
the series it is about and stays quiet on a healthy release.

``promtool check rules`` parses the rendered rules; ``promtool test rules``
(Prometheus' own rule evaluator, docs: "Unit testing for rules") replays
synthetic series through them. promtool comes from Debian's ``prometheus``
package, which .ci/run installs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import chartcheck
import pytest
import yaml

NS = chartcheck.NAMESPACE


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool missing: apt-get install prometheus (.ci/run does)")
    return found


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    helm = chartcheck.find_helm()
    if helm is None:
        pytest.skip("helm not fetched: run `make helm` (`make test` fetches it)")
    docs = chartcheck.render(helm, ["-f", str(chartcheck.CHART / "ci" / "ingress-tls.yaml")])
    _, custom = chartcheck.split_builtin(docs)
    found = [d for d in custom if d["kind"] == "PrometheusRule"]
    assert len(found) == 1 and chartcheck.custom_problems(found) == []
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump(found[0]["spec"]))
    return path


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in {"namespace": NS, **labels}.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _fired(promtool: str, rules: Path, series: list[dict[str, str]], alert: str) -> bool:
    """Whether ``alert`` fires at 30 min over ``series``: the test expects silence, so
    promtool fails exactly when it fires, and then lists it among what it got."""
    case = {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [{"eval_time": "30m", "alertname": alert, "exp_alerts": []}],
    }
    spec = rules.with_name(f"{alert}.yaml")
    spec.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m",
                                    "tests": [case]}))  # fmt: skip
    done = subprocess.run([promtool, "test", "rules", str(spec)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    out = done.stdout + done.stderr
    if done.returncode == 0:
        return False
    assert f'alertname="{alert}"' in out, out  # failed for another reason: say so
    return True


def _voters(up: int) -> list[dict[str, str]]:
    return [_series("enroute_build_info", {"role": "ledger", "pod": f"l{i}"}, "1x40")
            for i in range(up)]  # fmt: skip


def _groups(leading: list[int]) -> list[dict[str, str]]:
    out = []
    for i, lead in enumerate(leading):
        pod = {"pod": f"l{i}"}
        out += [_series("enroute_ledger_groups", pod, "10x40"),
                _series("enroute_ledger_groups_hibernated", pod, "4x40"),
                _series("enroute_ledger_groups_leading", pod, f"{lead}x40")]  # fmt: skip
    return out


def _disk(present: int) -> list[dict[str, str]]:
    pod = {"pod": "c0"}
    return [_series("enroute_disk_present_bytes", pod, f"{present}x40"),
            _series("enroute_disk_budget_bytes", pod, "1000x40")]  # fmt: skip


def _pushes(failed_per_min: int) -> list[dict[str, str]]:
    svc = {"service": "git-receive-pack"}
    return [_series("enroute_gitproto_requests_total", {**svc, "status": "200"}, "0+100x40"),
            _series("enroute_gitproto_requests_total", {**svc, "status": "503"},
                    f"0+{failed_per_min}x40")]  # fmt: skip


def _fetches(slow: bool) -> list[dict[str, str]]:
    # cumulative buckets: every call under 1 s, or between 1 s and 600 s (the p99 near
    # 600 s, over the 300 s ci/ingress-tls.yaml sets)
    fast = "0+0x40" if slow else "0+10x40"
    return [_series("enroute_engine_serve_seconds_bucket", {"le": "1"}, fast),
            _series("enroute_engine_serve_seconds_bucket", {"le": "600"}, "0+10x40"),
            _series("enroute_engine_serve_seconds_bucket", {"le": "+Inf"}, "0+10x40")]  # fmt: skip


def test_rules_parse_and_each_alert_fires_only_on_its_condition(promtool: str, rules: Path) -> None:
    checked = subprocess.run([promtool, "check", "rules", str(rules)],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "5 rules found" in checked.stdout
    cases = [
        (_voters(2), "EnrouteLedgerVoterDown", True),
        (_voters(3), "EnrouteLedgerVoterDown", False),
        (_groups([3, 2, 0]), "EnrouteGroupWithoutLeader", True),
        (_groups([3, 3, 0]), "EnrouteGroupWithoutLeader", False),
        (_disk(990), "EnrouteDiskBudgetPressure", True),
        (_disk(500), "EnrouteDiskBudgetPressure", False),
        (_pushes(10), "EnroutePushFailures", True),
        (_pushes(1), "EnroutePushFailures", False),
        (_fetches(True), "EnrouteSlowFetches", True),
        (_fetches(False), "EnrouteSlowFetches", False),
    ]
    got = [(alert, _fired(promtool, rules, series, alert)) for series, alert, _ in cases]
    assert got == [(alert, fires) for _, alert, fires in cases]
