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
    assert [d["kind"] for d in custom] == ["ServiceMonitor", "ServiceMonitor"]
    assert chartcheck.custom_problems(custom) == []
    # gitproto is scraped on its `ops` port (listen.ops): its `http` port answers 404 there
    scraped = {
        tuple(m["values"]): d["spec"]["endpoints"][0]["port"]
        for d in custom
        for m in d["spec"]["selector"]["matchExpressions"]
        if m["key"] == "app.kubernetes.io/component"
    }
    assert scraped == {("ledger", "compute"): "http", ("gitproto",): "ops"}
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
    # the kubelet counts the grace from the hook's start: hook, drain, 5 s to exit
    voter = yaml.safe_load(_config(docs, "enroute-ledger-0.yaml"))
    ledger_drain = parse_seconds(voter["ledger"]["drain_grace"])
    assert isinstance(ledger_drain, float)
    assert float(hook[4]) + ledger_drain + 5 <= ledger["terminationGracePeriodSeconds"]
    gitproto = workloads["enroute-gitproto"]
    sleep = gitproto["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    shutdown = parse_seconds(
        yaml.safe_load(_config(docs, "gitproto.yaml"))["transport"]["shutdown_grace"]
    )
    assert isinstance(shutdown, float)
    assert sleep + shutdown + 5 <= gitproto["terminationGracePeriodSeconds"]


ALL_KEYS = chartcheck.CHART / "ci" / "all-keys-values.yaml"
ROLES = ("ledger", "compute", "gitproto")


@pytest.fixture(scope="module")
def all_keys(helm: Path) -> list[Any]:
    return chartcheck.render(helm, ["-f", str(ALL_KEYS)])


def _named(docs: list[Any], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def test_every_extension_key_reaches_its_role(all_keys: list[Any]) -> None:
    """Each per-role key of ci/all-keys-values.yaml lands on that role's objects."""
    values = yaml.safe_load(ALL_KEYS.read_text())
    for role in ROLES:
        want = values[role]
        kind = "Deployment" if role == "gitproto" else "StatefulSet"
        workload = _named(all_keys, kind, f"enroute-{role}")
        service = _named(all_keys, "Service", f"enroute-{role}")
        meta, pod = workload["metadata"], workload["spec"]["template"]
        assert want["labels"].items() <= meta["labels"].items(), role
        assert meta["labels"]["team"] == "git-platform"  # commonLabels
        assert meta["annotations"] == want["annotations"], role
        assert want["podLabels"].items() <= pod["metadata"]["labels"].items(), role
        assert want["podAnnotations"].items() <= pod["metadata"]["annotations"].items(), role
        assert "checksum/config" in pod["metadata"]["annotations"]
        assert want["service"]["labels"].items() <= service["metadata"]["labels"].items()
        assert service["metadata"]["annotations"] == want["service"]["annotations"], role
        spec = pod["spec"]
        assert spec["priorityClassName"] == want["priorityClassName"]
        assert spec["nodeSelector"] == want["nodeSelector"]
        assert spec["tolerations"] == want["tolerations"]
        constraints = zip(
            want["topologySpreadConstraints"], spec["topologySpreadConstraints"], strict=True
        )
        for given, got in constraints:
            assert given.items() <= got.items()
            # a constraint without a selector counts this role's pods only
            assert got["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == role
        affinity = spec["affinity"]
        for key, value in want["affinity"].items():
            assert affinity[key] == value, (role, key)
        # the chart's anti-affinity stays unless the values give their own
        assert "podAntiAffinity" in affinity
        container = spec["containers"][0]
        env = [e["name"] for e in container["env"]]
        assert env[-len(want["extraEnv"]) :] == [e["name"] for e in want["extraEnv"]]
        assert want["extraVolumes"][0] in spec["volumes"]
        assert want["extraVolumeMounts"][0] in container["volumeMounts"]
        digest = values["image"]["digests"][role]
        assert container["image"] == f"registry.example.com/enroute-{role}:0.1.0@{digest}"
    for role in ("compute", "gitproto"):
        hpa = _named(all_keys, "HorizontalPodAutoscaler", f"enroute-{role}")
        scaling = values[role]["autoscaling"]
        assert hpa["spec"]["minReplicas"] == scaling["minReplicas"]
        assert hpa["spec"]["scaleTargetRef"]["name"] == f"enroute-{role}"
        kind = "Deployment" if role == "gitproto" else "StatefulSet"
        assert "replicas" not in _named(all_keys, kind, f"enroute-{role}")["spec"]
    assert "replicas" in _named(all_keys, "StatefulSet", "enroute-ledger")["spec"]


def test_image_digest_is_optional(rendered: list[Any]) -> None:
    images = [c["image"] for _, pod in chartcheck._pod_specs(rendered) for c in pod["containers"]]
    assert "enroute-ledger:0.1.0" in {i.rsplit("/", 1)[-1] for i in images}
    assert not any("@" in i for i in images if "enroute-" in i)


def test_ingress_hosts_paths_and_tls_lists(all_keys: list[Any]) -> None:
    ingress = _named(all_keys, "Ingress", "enroute-gitproto")
    rules = {
        r["host"]: [(p["path"], p["pathType"]) for p in r["http"]["paths"]]
        for r in ingress["spec"]["rules"]
    }
    assert rules == {
        "git.example.com": [("/", "Prefix")],
        "git.example.org": [("/mirror", "Prefix"), ("/team/app.git", "Exact")],
    }
    assert [t["secretName"] for t in ingress["spec"]["tls"]] == [
        "git-example-com-tls",
        "git-example-org-tls",
    ]


def test_earlier_ingress_values_render_the_same_ingress(helm: Path) -> None:
    """Values written for one `host` and the `tls: {enabled, secretName}` object still work."""
    docs = chartcheck.render(
        helm,
        [
            "--set",
            "gitproto.ingress.enabled=true,gitproto.ingress.host=git.corp.example,gitproto.ingress.tls.enabled=true",
        ],
    )
    spec = _named(docs, "Ingress", "enroute-gitproto")["spec"]
    assert spec["rules"] == [
        {
            "host": "git.corp.example",
            "http": {
                "paths": [
                    {
                        "path": "/",
                        "pathType": "Prefix",
                        "backend": {
                            "service": {"name": "enroute-gitproto", "port": {"name": "http"}}
                        },
                    }
                ]
            },
        }
    ]
    assert spec["tls"] == [{"secretName": "enroute-tls", "hosts": ["git.corp.example"]}]
    notes = chartcheck.notes_text(
        helm, ["--set", "gitproto.ingress.enabled=true,gitproto.ingress.tls.enabled=true"]
    )
    assert "https://git.example.com/<repo>.git" in notes


# NetworkPolicy semantics (kubernetes.io/docs/concepts/services-networking/network-policies):
# a pod no policy selects admits everything; a selected pod admits a connection when some
# rule's ports match (none listed: all) and some peer matches (no `from`: every source).
# A peer with only podSelector means pods of the policy's namespace; with only
# namespaceSelector, every pod of the matching namespaces; with both, both must match.


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the chart uses matchLabels only
    return selector.get("matchLabels", {}).items() <= labels.items()


def _admits(
    policies: list[Any],
    dst: dict[str, str],
    port: str,
    *,
    src: dict[str, str],
    src_ns: dict[str, str],
    same_ns: bool,
) -> bool:
    selecting = [p for p in policies if _matches(p["spec"]["podSelector"], dst)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                pod_ok = "podSelector" not in peer or _matches(peer["podSelector"], src)
                ns_ok = (
                    _matches(peer["namespaceSelector"], src_ns)
                    if "namespaceSelector" in peer
                    else same_ns
                )
                if pod_ok and ns_ok:
                    return True
    return False


def test_network_policy_admits_only_the_callers_of_each_port(all_keys: list[Any]) -> None:
    policies = [d for d in all_keys if d["kind"] == "NetworkPolicy"]
    assert len(policies) == 3
    pods = {
        name: workload["spec"]["template"]
        for name, workload in (
            (d["metadata"]["labels"]["app.kubernetes.io/component"], d)
            for d in all_keys
            if d["kind"] in ("StatefulSet", "Deployment")
        )
    }
    labels = {role: pods[role]["metadata"]["labels"] for role in ROLES}
    labels["test"] = next(d for d in all_keys if d["kind"] == "Pod")["metadata"]["labels"]
    labels["other"] = {"app": "something-else"}
    own_ns = {"kubernetes.io/metadata.name": "enroute"}
    ingress_ns = {"kubernetes.io/metadata.name": "ingress-nginx"}
    monitoring_ns = {"kubernetes.io/metadata.name": "monitoring"}
    # every port a policy names is a container port of the pods it selects
    for policy in policies:
        role = policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        names = {p["name"] for p in pods[role]["spec"]["containers"][0]["ports"]}
        for rule in policy["spec"]["ingress"]:
            assert {p["port"] for p in rule["ports"]} <= names, (role, rule)

    def admits(dst: str, port: str, src: str, ns: dict[str, str] = own_ns) -> bool:
        return _admits(
            policies, labels[dst], port, src=labels[src], src_ns=ns, same_ns=ns is own_ns
        )

    assert admits("compute", "grpc", "gitproto")
    for src in ("ledger", "compute", "test", "other"):
        assert not admits("compute", "grpc", src), src
    assert admits("ledger", "grpc", "compute")
    assert admits("ledger", "grpc", "ledger")
    for src in ("gitproto", "test", "other"):
        assert not admits("ledger", "grpc", src), src
    assert not admits("ledger", "grpc", "compute", ingress_ns)  # another release's computes
    assert admits("gitproto", "http", "other", ingress_ns)
    assert admits("gitproto", "http", "test")
    assert not admits("gitproto", "http", "other")
    for role in ("ledger", "compute"):
        assert admits(role, "http", "other", monitoring_ns), role
    assert not admits("ledger", "http", "gitproto")
    # gitproto's /metrics and /status (ops port): scrapers only, never git clients
    assert admits("gitproto", "ops", "other", monitoring_ns)
    assert not admits("gitproto", "ops", "other", ingress_ns)
    assert not admits("gitproto", "http", "other", monitoring_ns)


def test_network_policy_without_sources_admits_any_on_http(helm: Path) -> None:
    docs = chartcheck.render(helm, ["--set", "networkPolicy.enabled=true"])
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    anyone = {"app": "x"}
    release = {"app.kubernetes.io/name": "enroute", "app.kubernetes.io/instance": "enroute"}
    compute = {**release, "app.kubernetes.io/component": "compute"}
    assert _admits(policies, compute, "http", src=anyone, src_ns={}, same_ns=False)
    assert not _admits(policies, compute, "grpc", src=anyone, src_ns={}, same_ns=True)
    assert not [d for d in chartcheck.render(helm) if d["kind"] == "NetworkPolicy"]


def test_gitproto_operator_port_is_served_and_never_routed(all_keys: list[Any]) -> None:
    """Issue 23 item 5: /metrics and /status on gitproto's `ops` port (listen.ops) only; the
    Service names it, the config binds it, and no Ingress path leads to it."""
    service = next(
        d for d in all_keys if d["kind"] == "Service" and d["metadata"]["name"].endswith("gitproto")
    )
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http",
        "ops": "ops",
    }
    deployment = next(
        d
        for d in all_keys
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("gitproto")
    )
    ports = {p["name"]: p["containerPort"] for p in
             deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}  # fmt: skip
    config = next(
        d for d in all_keys if d["kind"] == "ConfigMap" and "gitproto.yaml" in d.get("data", {})
    )
    listen = yaml.safe_load(config["data"]["gitproto.yaml"])["listen"]
    assert listen == {"http": f"0.0.0.0:{ports['http']}", "ops": f"0.0.0.0:{ports['ops']}"}
    routed = {
        path["backend"]["service"]["port"]["name"]
        for d in all_keys
        if d["kind"] == "Ingress"
        for rule in d["spec"]["rules"]
        for path in rule["http"]["paths"]
    }
    assert routed == {"http"}


@pytest.mark.parametrize("existing", ["", "corp-internal"])
def test_every_role_reads_the_internal_token(helm: Path, existing: str) -> None:
    """Issue 23 item 5: every role's config names the internal token file, and it is
    mounted from the chart's Secret (made once, kept by `lookup` on upgrades) or from
    auth.internalToken.existingSecret, which the chart then does not create."""
    docs = chartcheck.render(
        helm, ["--set", f"auth.internalToken.existingSecret={existing}"] if existing else []
    )
    secret = existing or "enroute-internal-token"
    made = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == secret]
    if existing:
        assert made == []
    else:
        assert len(made) == 1 and len(made[0]["stringData"]["token"]) >= 16
    configs = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")
    ]
    files = [yaml.safe_load(text) for d in configs for text in d["data"].values()]
    assert len(files) >= 3
    assert all(f["auth"]["internal_token_file"] == "/etc/enroute-internal/token" for f in files)
    workloads = [
        d
        for d in docs
        if d["kind"] in ("StatefulSet", "Deployment") and "minio" not in d["metadata"]["name"]
    ]
    assert len(workloads) == 3
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["internal-token"] == "/etc/enroute-internal"
        volume = next(v for v in pod["volumes"] if v["name"] == "internal-token")
        assert volume["secret"]["secretName"] == secret
        assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
