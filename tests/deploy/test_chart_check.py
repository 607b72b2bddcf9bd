"""The checks of ``make chart-check`` can fail, and the chart agrees with the config model.

The chart-check itself runs in ``make test`` (before pytest); here each of its
checkers is shown to catch what it names: a WARN from kubernetes-validate (an
unknown kind) fails like an ERROR, the policy rules flag a port without
``protocol: TCP`` or a writable root filesystem, and the values schema refuses
bad values. helm is the one ``make chart-check`` fetched (.tools/helm/helm).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import chartcheck
import pytest
import yaml

from enroute_core.config import DiscoveryConfig, LayersConfig, parse_seconds

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def helm() -> Path:
    found = chartcheck.find_helm()
    if found is None:
        pytest.skip("helm not fetched: run `make helm` (`make test` fetches it)")
    return found


@pytest.fixture(scope="module")
def rendered(helm: Path) -> list[Any]:
    return chartcheck.render(helm, ["-f", str(chartcheck.CHART / "ci" / "external-s3.yaml")])


def _config(docs: list[Any], key: str) -> str:
    found = [d["data"][key] for d in docs if d["kind"] == "ConfigMap" and key in d["data"]]
    assert len(found) == 1, key
    return str(found[0])


def test_schema_layers_keys_are_config_keys() -> None:
    schema = json.loads((chartcheck.CHART / "values.schema.json").read_text())
    keys = set(schema["properties"]["layers"]["properties"])
    assert keys <= set(LayersConfig.model_fields), keys - set(LayersConfig.model_fields)


def test_rendered_discovery_keys_are_config_keys(rendered: list[Any]) -> None:
    compute = yaml.safe_load(_config(rendered, "compute.yaml"))
    gitproto = yaml.safe_load(_config(rendered, "gitproto.yaml"))
    for section in (compute["ledger"]["discovery"], gitproto["compute"]["discovery"]):
        assert set(section) <= set(DiscoveryConfig.model_fields)
        assert section["port_name"] == "grpc"


def test_policy_accepts_the_chart_and_catches_violations(rendered: list[Any]) -> None:
    assert chartcheck.policy_problems(rendered) == []
    docs = copy.deepcopy(rendered)
    service = next(d for d in docs if d["kind"] == "Service")
    del service["spec"]["ports"][0]["protocol"]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFilesystem"] = False
    container["readinessProbe"]["httpGet"]["path"] = "/status"
    del sts["metadata"]["labels"]["app.kubernetes.io/component"]
    problems = "\n".join(chartcheck.policy_problems(docs))
    for expected in ("lacks protocol: TCP", "root filesystem not read-only", "GET /readyz"):
        assert expected in problems
    assert "app.kubernetes.io/component missing" in problems


def test_kubernetes_validate_fails_on_warnings_and_errors(rendered: list[Any]) -> None:
    config = next(d for d in rendered if d["kind"] == "ConfigMap")
    unknown_kind = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    bad_field = copy.deepcopy(config)
    bad_field["spec"] = {"replicas": 1}
    problems = chartcheck.kubernetes_validate([config, unknown_kind, bad_field])
    assert any(p.startswith("WARN") and "Widget" in p for p in problems), problems
    assert any(p.startswith("ERROR") and "spec" in p for p in problems), problems
    assert chartcheck.kubernetes_validate([config]) == []


def test_servicemonitor_schema_catches_typos(helm: Path) -> None:
    docs = chartcheck.render(helm, ["--set", "serviceMonitor.enabled=true"])
    _, custom = chartcheck.split_builtin(docs)
    assert [d["kind"] for d in custom] == ["ServiceMonitor"]
    assert chartcheck.custom_problems(custom) == []
    custom[0]["spec"]["endpoints"][0]["intervall"] = "30s"
    assert any("intervall" in p for p in chartcheck.custom_problems(custom))


def test_bad_values_are_refused(helm: Path) -> None:
    assert chartcheck.negative_failures(helm) == []


@pytest.mark.parametrize("values", chartcheck.values_files(), ids=lambda p: p.stem)
def test_stop_hooks_fit_the_grace_periods(helm: Path, values: Path) -> None:
    docs = chartcheck.render(helm, ["-f", str(values)])
    workloads = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if "template" in d.get("spec", {})
    }
    compute = yaml.safe_load(_config(docs, "compute.yaml"))
    drain = parse_seconds(compute["compute"]["drain_grace"])
    assert isinstance(drain, float)
    assert drain + 5 <= workloads["enroute-compute"]["terminationGracePeriodSeconds"]
    ledger = workloads["enroute-ledger"]
    hook = ledger["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "python" and "/transfer-leadership?timeout=" in hook[3]
    assert float(hook[4]) + 5 <= ledger["terminationGracePeriodSeconds"]
