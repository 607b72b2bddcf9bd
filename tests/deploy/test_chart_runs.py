"""What the chart renders is what runs: the three roles started from a rendered release.

``helm template`` with charts/enroute/ci/external-s3.yaml; each pod's
ConfigMap files, Secrets and env are handed to ``python -m enroute_<role>`` (the
image's ENTRYPOINT) exactly as rendered, with only addresses mapped to
loopback, volumes to temporary directories and the S3 endpoint to a local moto
server (tests/deploy/podplan.py). Then the real git CLI pushes through the
rendered token and clones back. Every rendered config file of every ci values
file must also load with ``enroute_core.config.load_config``: a key the loader
rejects fails here, not in a cluster.

helm is the binary ``make chart-check`` fetched into .tools/helm/helm (or
``$ENROUTE_HELM``); ``make test`` fetches it before running the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chartcheck
import fakekube
import podplan
import pytest
import yaml

from enroute_core.base.errors import InvalidArgument
from enroute_core.config import load_config
from enroute_testing.gitcli import GitFailed, run_git
from enroute_testing.s3servers import S3Endpoint, moto_server, s3_client

pytestmark = pytest.mark.deploy

CI_VALUES = chartcheck.CHART / "ci" / "external-s3.yaml"
TOKEN = "enroute-ci-token"  # its sha256 is in ci/external-s3.yaml
READY_TIMEOUT_S = 150.0
STOP_TIMEOUT_S = 15.0
# The interpreter the roles run with: this venv, or e.g. a venv built like the image's
# (`uv sync --locked --no-dev --no-editable --package enroute-gitproto`).
PYTHON = os.environ.get("ENROUTE_DEPLOY_PYTHON", sys.executable)


@pytest.fixture(scope="module")
def helm() -> Path:
    found = chartcheck.find_helm()
    if found is None:
        pytest.skip("helm not fetched: run `make helm` (`make test` fetches it)")
    return found


def _validate(text: str, env: dict[str, str]) -> None:
    load_config(text, env)


# The Secrets ci/no-minio.yaml names (existingSecret) as a user would create them.
USER_SECRETS = {
    "enroute-s3": {"AWS_ACCESS_KEY_ID": "user-key", "AWS_SECRET_ACCESS_KEY": "user-secret"},
    "enroute-tokens": {"tokens.yaml": "tokens: []\n"},
}


def _plans(helm: Path, values: list[str], root: Path) -> list[podplan.PodPlan]:
    docs = chartcheck.render(helm, values)
    return podplan.plan(docs, chartcheck.NAMESPACE, "cluster.local", root, USER_SECRETS)


def _prepare_all(pods: list[podplan.PodPlan], s3_url: str, api_url: str) -> None:
    by_dns = {p.dns: p for p in pods if p.dns}
    for pod in pods:
        podplan.prepare(
            pod,
            by_dns,
            s3_endpoint=s3_url,
            api_url=api_url,
            python=PYTHON,
            validate=_validate,
        )


@pytest.mark.parametrize(
    "values",
    [[], *[["-f", str(f)] for f in chartcheck.values_files()]],
    ids=["default", *[f.stem for f in chartcheck.values_files()]],
)
def test_every_rendered_config_loads(helm: Path, values: list[str], tmp_path: Path) -> None:
    pods = _plans(helm, values, tmp_path)
    assert {p.role for p in pods} == {"ledger", "compute", "gitproto"}
    _prepare_all(pods, "http://127.0.0.1:9", "http://127.0.0.1:9")
    for pod in pods:
        local = Path(pod.argv[pod.argv.index("--config") + 1])
        load_config(local.read_text(), pod.env)


def test_a_key_the_loader_rejects_fails_the_check(helm: Path, tmp_path: Path) -> None:
    pods = _plans(helm, ["-f", str(CI_VALUES)], tmp_path)
    compute = next(p for p in pods if p.role == "compute")
    path = next(k for k in compute.files if k.endswith("compute.yaml"))
    data = yaml.safe_load(compute.files[path])
    data["node"]["disk_cache_size"] = "1GiB"
    compute.files[path] = yaml.safe_dump(data)
    with pytest.raises(InvalidArgument, match="disk_cache_size"):
        _prepare_all([compute], "http://127.0.0.1:9", "http://127.0.0.1:9")


def test_paths_outside_volumes_are_refused(helm: Path, tmp_path: Path) -> None:
    pods = _plans(helm, ["-f", str(CI_VALUES)], tmp_path)
    ledger = next(p for p in pods if p.role == "ledger")
    with pytest.raises(podplan.PlanError, match="read-only root"):
        ledger.local_path("/var/lib/enroute")
    assert ledger.local_path("/data/log") == ledger.mounts["/data"] / "log"


class Process:
    def __init__(self, pod: podplan.PodPlan) -> None:
        self.pod = pod
        self.log = pod.root / "stderr.log"
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", **pod.env}
        cwd = pod.mounts.get("/data", pod.root)
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                pod.argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err
            )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))

    def wait_ready(self, deadline: float) -> str:
        prefix = f"enroute {self.pod.role} ready:"
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                pytest.fail(f"{self.pod.name} not ready (exit {self.proc.poll()}):\n{tail}")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line.startswith(prefix):
                return line

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def s3() -> Iterator[S3Endpoint]:
    with moto_server() as endpoint:
        yield endpoint


def _make_repo(work: Path) -> str:
    run_git(["init", "-q", "-b", "main", str(work)], cwd=work.parent)
    (work / "README").write_text("deployed from the chart\n")
    # incompressible, larger than ci's layers.inline_max: the layer goes to the store
    (work / "blob.bin").write_bytes(hashlib.shake_256(b"enroute-chart").digest(400 * 1024))
    run_git(["add", "README", "blob.bin"], cwd=work)
    run_git(["commit", "-q", "-m", "first"], cwd=work)
    return run_git(["rev-parse", "HEAD"], cwd=work).decode().strip()


def _json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


def _start_all(pods: list[podplan.PodPlan], started: float, timings: list[str]) -> list[Process]:
    running: list[Process] = []
    try:
        for role in ("ledger", "compute", "gitproto"):
            group = [Process(p) for p in pods if p.role == role]
            running += group
            deadline = time.monotonic() + READY_TIMEOUT_S
            for proc in group:
                line = proc.wait_ready(deadline)
                timings.append(f"{proc.pod.name} {time.monotonic() - started:.1f} s")
                for port in proc.pod.ports.values():
                    assert f"127.0.0.1:{port}" in line, (line, proc.pod.ports)
    except BaseException:
        for proc in reversed(running):
            proc.stop()
        raise
    return running


def _git_round_trip(port: int, work: Path) -> None:
    work.mkdir()
    head = _make_repo(work / "app")
    anonymous = f"http://127.0.0.1:{port}/team/app.git"
    with pytest.raises(GitFailed):  # the chart renders auth.anonymous: none
        run_git(["push", anonymous, "main"], cwd=work / "app", timeout_s=60)
    url = f"http://ci:{TOKEN}@127.0.0.1:{port}/team/app.git"
    run_git(["push", "-q", url, "main"], cwd=work / "app", timeout_s=120)
    run_git(["clone", "-q", url, str(work / "clone")], cwd=work, timeout_s=120)
    assert run_git(["rev-parse", "HEAD"], cwd=work / "clone").decode().strip() == head
    blob = (work / "clone" / "blob.bin").read_bytes()
    assert blob == (work / "app" / "blob.bin").read_bytes()


def _helm_test(
    docs: list[Any], url: str, secrets: dict[str, dict[str, str]], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """The `helm test` pod's script, run here as the kubelet would run its container.

    Its env comes from the rendered Pod (values, and Secrets from ``secrets``), except
    ENROUTE_URL, which points at the local gitproto; TMPDIR keeps its files under ``tmp``.
    """
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert [p["metadata"]["annotations"]["helm.sh/hook"] for p in pods] == ["test"]
    container = pods[0]["spec"]["containers"][0]
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "TMPDIR": str(tmp)}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
    assert env["ENROUTE_URL"] == "http://enroute-gitproto.enroute.svc.cluster.local:80"
    env["ENROUTE_URL"] = url
    tmp.mkdir(parents=True, exist_ok=True)
    argv = [*container["command"], *container["args"]]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_helm_test_says_what_it_needs_to_push(helm: Path, tmp_path: Path) -> None:
    """Without a token and with anonymous pushes off, the test pod fails with a reason."""
    docs = chartcheck.render(helm)
    done = _helm_test(docs, "http://127.0.0.1:9", {}, tmp_path)
    assert done.returncode == 2, done
    assert "set test.existingSecret" in done.stderr
    assert "auth.anonymous is none" in done.stderr


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(900)
def test_rendered_release_serves_push_and_clone(helm: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    started = time.monotonic()
    docs = chartcheck.render(helm, ["-f", str(CI_VALUES)])
    config = podplan.by_kind(docs, "ConfigMap")["enroute-compute-config"]["data"]
    store = yaml.safe_load(config["compute.yaml"])["store"]
    bucket, _, prefix = store["url"].removeprefix("s3://").partition("/")
    region = store["options"]["region"]
    client = s3_client(S3Endpoint("moto", s3.host, s3.port, region=region))
    client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    tokens = podplan.secret_data(podplan.by_kind(docs, "Secret")["enroute-tokens"])
    assert hashlib.sha256(TOKEN.encode()).hexdigest() in tokens["tokens.yaml"]

    pods = podplan.plan(docs, chartcheck.NAMESPACE, "cluster.local", tmp_path / "pods")
    kube = fakekube.FakeKube(
        chartcheck.NAMESPACE, fakekube.endpoint_slices(docs, pods), fakekube.granted_verbs(docs)
    )
    timings: list[str] = []
    codes: dict[str, int | None] = {}
    with fakekube.serve(kube) as api_url:
        _prepare_all(pods, s3.url, api_url)
        running = _start_all(pods, started, timings)
        try:
            for proc in running:
                for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                    get = proc.pod.container[probe]["httpGet"]
                    assert get["path"] == path
                    assert _get(proc.pod.port_by_name(get["port"]), path) == 200, proc.pod.name
            ready_s = time.monotonic() - started
            # computes found the voters, and gitproto the computes, through EndpointSlices
            ledgers = sorted(
                f"127.0.0.1:{p.port_by_name('grpc')}" for p in pods if p.role == "ledger"
            )
            for proc in running:
                if proc.pod.role == "compute":
                    status = _json(proc.pod.port_by_name("http"), "/status")
                    assert sorted(status["ledger_members"]) == ledgers
            assert {("list", "enroute-ledger"), ("list", "enroute-compute")} <= set(kube.requests)

            gitproto = next(p for p in running if p.pod.role == "gitproto")
            port = gitproto.pod.port_by_name("http")
            _git_round_trip(port, tmp_path / "work")
            # `helm test`: push and clone with the token of the Secret test.existingSecret names
            secrets = {"enroute-helm-test": {"token": TOKEN}}
            url = f"http://127.0.0.1:{port}"
            for run in ("first", "again"):  # the second run force-pushes over the first
                done = _helm_test(docs, url, secrets, tmp_path / f"helm-test-{run}")
                assert done.returncode == 0, done.stdout + done.stderr
                assert "helm test: pushed and cloned" in done.stdout
            wrong = _helm_test(docs, url, {"enroute-helm-test": {"token": "no"}}, tmp_path / "bad")
            assert wrong.returncode != 0
            assert "helm test: pushed and cloned" not in wrong.stdout
            listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
            assert listed.get("KeyCount", 0) > 0, "nothing written under the rendered store prefix"

            # the ledger preStop hook, as the kubelet would run it
            for proc in running:
                if proc.pod.role == "ledger":
                    argv = podplan.hook_argv(proc.pod, "preStop", PYTHON)
                    done = subprocess.run(
                        argv, capture_output=True, text=True, timeout=60, check=False
                    )
                    assert done.returncode == 0, done.stderr
                    answer = json.loads(done.stdout)
                    assert answer["still_leading"] == 0, answer
        finally:
            codes = {p.pod.name: p.stop() for p in reversed(running)}
            client.close()
    assert all(code == 0 for code in codes.values()), codes
    print(f"ready: {', '.join(timings)}; probes answered at {ready_s:.1f} s")
    print(f"push, clone, preStop hooks and stop done at {time.monotonic() - started:.1f} s")
