"""Turn rendered chart manifests into local processes: what each pod would run, on loopback.

A pod's container is resolved the way the kubelet would: the image's
ENTRYPOINT (from docker/Dockerfile, by role) with the container's args, ``$(VAR)``
expansion, env from values, Secrets, ConfigMaps and the downward API, and files
from ConfigMap/Secret volumes. The only changes are the ones a laptop needs:
every container path is under a mounted volume and lands in a temporary
directory (a path outside every mount would be a write to the read-only root
filesystem and fails here), listen and member addresses become 127.0.0.1 with
free ports, and the S3 endpoint becomes a local one.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from dockerrules import DOCKERFILE, effective, exec_form, parse, stages

from enroute_testing.ports import free_port

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_LISTEN = re.compile(r"^(0\.0\.0\.0|\[::\]|)?:(\d+)$")
_LOOPBACK = re.compile(r"127\.0\.0\.1:(\d+)")
_HOSTPORT = re.compile(r"^([a-z0-9][a-z0-9.-]*):(\d+)$")


class PlanError(Exception):
    pass


@dataclass
class PodPlan:
    name: str
    role: str
    workload: dict[str, Any]
    container: dict[str, Any]
    root: Path
    dns: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)  # containerPort -> local port
    argv: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # container path -> text

    def local_path(self, path: str) -> Path:
        """Where a container path lives on this machine (the deepest mount holding it)."""
        p = PurePosixPath(path)
        for mount in sorted(self.mounts, key=len, reverse=True):
            if p == PurePosixPath(mount) or PurePosixPath(mount) in p.parents:
                return self.mounts[mount] / p.relative_to(mount)
        raise PlanError(f"{self.name}: {path} is on the read-only root filesystem")

    def port_by_name(self, name: int | str) -> int:
        if isinstance(name, int):
            return self.ports[name]
        for port in self.container.get("ports", []):
            if port["name"] == name:
                return self.ports[port["containerPort"]]
        raise PlanError(f"{self.name}: no port named {name}")


def by_kind(docs: list[Any], kind: str) -> dict[str, Any]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    out = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    out.update(secret.get("stringData") or {})
    return out


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion; an unknown name stays as written."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def image_entrypoint(role: str) -> tuple[list[str], dict[str, str]]:
    """ENTRYPOINT and ENV of the role's target in docker/Dockerfile."""
    all_stages = stages(parse(DOCKERFILE.read_text()))
    target = next(s for s in all_stages if s.name == role)
    entry = effective(all_stages, target, "ENTRYPOINT")
    argv = exec_form(entry) if entry else None
    if not argv:
        raise PlanError(f"target {role} has no exec-form ENTRYPOINT")
    env: dict[str, str] = {}
    by_name = {s.name: s for s in all_stages if s.name}
    chain = [target]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    for stage in chain:
        for ins in stage.instructions:
            if ins.keyword == "ENV":
                for pair in ins.args.split():
                    key, _, value = pair.partition("=")
                    env[key] = value
    return argv, env


def plan(
    docs: list[Any],
    namespace: str,
    cluster_domain: str,
    root: Path,
    existing_secrets: dict[str, dict[str, str]] | None = None,
) -> list[PodPlan]:
    """One plan per pod of each StatefulSet, one per Deployment (its replicas are alike).

    ``existing_secrets`` stand for Secrets a user created before installing.
    """
    secrets = dict(existing_secrets or {})
    secrets.update({n: secret_data(s) for n, s in by_kind(docs, "Secret").items()})
    configmaps = {n: c.get("data") or {} for n, c in by_kind(docs, "ConfigMap").items()}
    pods: list[PodPlan] = []
    for doc in docs:
        if doc["kind"] not in ("StatefulSet", "Deployment"):
            continue
        spec = doc["spec"]
        template = spec["template"]["spec"]
        containers = template["containers"]
        if len(containers) != 1 or "enroute-" not in containers[0]["image"]:
            continue
        container = containers[0]
        role = container["image"].rsplit("/", 1)[-1].split(":")[0].removeprefix("enroute-")
        if doc["kind"] == "StatefulSet":
            count = _replicas(docs, doc)
            names = [f"{doc['metadata']['name']}-{i}" for i in range(count)]
        else:
            names = [f"{doc['metadata']['name']}-7d9c5b4f6-abcde"]
        claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
        for name in names:
            pod = PodPlan(name, role, doc, container, root / name)
            if doc["kind"] == "StatefulSet":
                pod.dns = f"{name}.{spec['serviceName']}.{namespace}.svc.{cluster_domain}"
            _resolve_env(pod, namespace, secrets, configmaps)
            _mount_volumes(pod, template.get("volumes", []), claims, secrets, configmaps)
            for port in container.get("ports", []):
                if port.get("protocol") != "TCP":
                    raise PlanError(f"{name}: port {port.get('name')} without protocol TCP")
                pod.ports[port["containerPort"]] = free_port()
            pods.append(pod)
    return pods


def _replicas(docs: list[Any], workload: dict[str, Any]) -> int:
    """spec.replicas, or under a HorizontalPodAutoscaler its minReplicas (the chart then
    renders no replicas, and Kubernetes starts the default 1 that the HPA raises)."""
    if "replicas" in workload["spec"]:
        return int(workload["spec"]["replicas"])
    for hpa in docs:
        target = (
            hpa.get("spec", {}).get("scaleTargetRef", {})
            if hpa["kind"] == "HorizontalPodAutoscaler"
            else {}
        )
        if (target.get("kind"), target.get("name")) == (
            workload["kind"],
            workload["metadata"]["name"],
        ):
            return int(hpa["spec"].get("minReplicas", 1))
    return 1


def _resolve_env(
    pod: PodPlan,
    namespace: str,
    secrets: dict[str, dict[str, str]],
    configmaps: dict[str, dict[str, str]],
) -> None:
    c = pod.container
    for source in c.get("envFrom", []):
        if "secretRef" in source:
            pod.env.update(secrets[source["secretRef"]["name"]])
        elif "configMapRef" in source:
            pod.env.update(configmaps[source["configMapRef"]["name"]])
    fields = {"metadata.name": pod.name, "metadata.namespace": namespace}
    fields["status.podIP"] = "127.0.0.1"
    for item in c.get("env", []):
        if "value" in item:
            pod.env[item["name"]] = expand(str(item["value"]), pod.env)
            continue
        ref = item["valueFrom"]
        if "fieldRef" in ref:
            pod.env[item["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in ref:
            key = ref["secretKeyRef"]
            if key["name"] not in secrets:
                raise PlanError(f"{pod.name}: Secret {key['name']} is not rendered by the chart")
            pod.env[item["name"]] = secrets[key["name"]][key["key"]]
        elif "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            pod.env[item["name"]] = configmaps[key["name"]][key["key"]]
        else:
            raise PlanError(f"{pod.name}: env {item['name']}: unsupported source {ref}")


def _mount_volumes(
    pod: PodPlan,
    volumes: list[dict[str, Any]],
    claims: list[str],
    secrets: dict[str, dict[str, str]],
    configmaps: dict[str, dict[str, str]],
) -> None:
    by_name = {v["name"]: v for v in volumes}
    mounts = pod.container.get("volumeMounts", [])
    read_only = {
        m["mountPath"] for m in mounts if {"configMap", "secret"} & set(by_name.get(m["name"], {}))
    }
    for m in mounts:
        inside = [r for r in read_only if PurePosixPath(r) in PurePosixPath(m["mountPath"]).parents]
        if inside:
            raise PlanError(f"{pod.name}: {m['mountPath']} is mounted inside {inside[0]}")
    for mount in mounts:
        local = pod.root / "volumes" / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        pod.mounts[mount["mountPath"]] = local
        volume = by_name.get(mount["name"])
        files: dict[str, str] = {}
        if volume is None:
            if mount["name"] not in claims:
                raise PlanError(f"{pod.name}: volume {mount['name']} is not defined")
        elif "configMap" in volume:
            files = configmaps[volume["configMap"]["name"]]
        elif "secret" in volume:
            name = volume["secret"]["secretName"]
            if name not in secrets:
                raise PlanError(f"{pod.name}: Secret {name} is not rendered by the chart")
            files = secrets[name]
            if "items" in volume["secret"]:  # only the listed keys, at their paths
                files = {i["path"]: files[i["key"]] for i in volume["secret"]["items"]}
        elif not ({"emptyDir", "persistentVolumeClaim"} & set(volume)):
            raise PlanError(f"{pod.name}: volume {mount['name']}: unsupported kind")
        for key, text in files.items():
            (local / key).write_text(text)
            pod.files[f"{mount['mountPath'].rstrip('/')}/{key}"] = text


def map_string(pod: PodPlan, pods_by_dns: dict[str, PodPlan], value: str) -> str:
    """The one rewrite of a config string a local run needs (see the module docstring)."""
    m = _LISTEN.match(value)
    if m:
        port = int(m.group(2))
        if port not in pod.ports:
            raise PlanError(f"{pod.name}: listens on {value}, not a declared containerPort")
        return f"127.0.0.1:{pod.ports[port]}"
    m = _HOSTPORT.match(value)
    if m and m.group(1) in pods_by_dns:
        peer = pods_by_dns[m.group(1)]
        port = int(m.group(2))
        if port not in peer.ports:
            raise PlanError(f"{value}: port {port} is not a containerPort of {peer.name}")
        return f"127.0.0.1:{peer.ports[port]}"
    if m and ".svc." in m.group(1):
        raise PlanError(f"{pod.name}: {value} names no pod of the release")
    if value.startswith("/"):
        return str(pod.local_path(value))
    return value


def map_config(
    pod: PodPlan, pods_by_dns: dict[str, PodPlan], data: Any, *, s3_endpoint: str, api_url: str
) -> Any:
    """The rendered config with addresses, paths, the S3 endpoint and the API made local.

    ``*.discovery`` sections get ``api_url``: in a cluster the in-cluster service
    account finds the API server; here it is a local one.
    """

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, (*path, str(k))) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, path) for v in node]
        if path == ("store", "options", "endpoint_url"):
            return s3_endpoint
        if isinstance(node, str):
            return map_string(pod, pods_by_dns, node)
        return node

    mapped = walk(data, ())
    for section in ("ledger", "compute"):
        discovery = (mapped.get(section) or {}).get("discovery")
        if discovery is not None:
            if discovery.get("api_url"):
                raise PlanError(f"{pod.name}: {section}.discovery.api_url set in a cluster")
            discovery["api_url"] = api_url
    if "store" in mapped and str(mapped["store"].get("url", "")).startswith("s3://"):
        mapped["store"].setdefault("options", {})["endpoint_url"] = s3_endpoint
    return mapped


def prepare(
    pod: PodPlan,
    pods_by_dns: dict[str, PodPlan],
    *,
    s3_endpoint: str,
    api_url: str,
    python: str,
    validate: Callable[[str, dict[str, str]], None],
) -> None:
    """Fill ``pod.argv`` and rewrite its config files; ``validate`` sees each as rendered."""
    entry, image_env = image_entrypoint(pod.role)
    command = pod.container.get("command") or entry
    args = [expand(a, pod.env) for a in pod.container.get("args", [])]
    for key, value in image_env.items():
        if key != "PATH" and key not in pod.env:
            pod.env[key] = str(pod.local_path(value)) if value.startswith("/") else value
    argv = [python if w == "python" else w for w in command]
    for i, arg in enumerate(args):
        if arg.startswith("/"):
            container_path = arg
            text = pod.files.get(container_path)
            if text is None:
                raise PlanError(f"{pod.name}: {container_path} is no file of a mounted volume")
            if i > 0 and args[i - 1] == "--config":
                validate(text, pod.env)
                data = yaml.safe_load(text)
                mapped = map_config(
                    pod, pods_by_dns, data, s3_endpoint=s3_endpoint, api_url=api_url
                )
                local = pod.root / "local-config.yaml"
                local.write_text(yaml.safe_dump(mapped, sort_keys=False))
                argv.append(str(local))
                continue
            argv.append(str(pod.local_path(arg)))
        else:
            argv.append(arg)
    pod.argv = argv


def hook_argv(pod: PodPlan, hook: str, python: str) -> list[str]:
    """The exec command of a lifecycle hook, with loopback ports mapped like the config and
    arguments that are paths of a mounted volume mapped to where it lives here."""
    command = pod.container["lifecycle"][hook]["exec"]["command"]

    def local(m: re.Match[str]) -> str:
        port = int(m.group(1))
        if port not in pod.ports:
            raise PlanError(f"{pod.name}: {hook} hook calls port {port}, not a containerPort")
        return f"127.0.0.1:{pod.ports[port]}"

    def mapped(word: str) -> str:
        if word == "python":
            return python
        if word.startswith("/") and any(word.startswith(m.rstrip("/") + "/") for m in pod.mounts):
            return str(pod.local_path(word))
        return _LOOPBACK.sub(local, word)

    return [mapped(w) for w in command]
