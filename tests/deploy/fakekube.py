"""A Kubernetes API that serves only EndpointSlices, on 127.0.0.1, for a rendered release.

What a cluster would publish for the chart's Services (one slice per pod,
since every local pod shares 127.0.0.1 and differs only by port), behind the
rendered Role: a verb the Role does not grant on ``discovery.k8s.io``
``endpointslices`` is answered 403, as the API server would. Lists answer at
once; a watch stays open, sending nothing, until its ``timeoutSeconds`` or
until the server stops.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from podplan import PodPlan, by_kind

SERVICE_LABEL = "kubernetes.io/service-name"


def endpoint_slices(docs: list[Any], pods: list[PodPlan]) -> dict[str, list[dict[str, Any]]]:
    """Slices by Service name, for the Services selecting the planned pods."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, svc in by_kind(docs, "Service").items():
        selector = svc["spec"].get("selector") or {}
        members = [
            p
            for p in pods
            if selector
            and all(
                (p.workload["spec"]["template"]["metadata"].get("labels") or {}).get(k) == v
                for k, v in selector.items()
            )
        ]
        slices = []
        for pod in members:
            ports = []
            for port in svc["spec"]["ports"]:
                local = pod.port_by_name(port.get("targetPort", port["port"]))
                ports.append({"name": port.get("name", ""), "port": local, "protocol": "TCP"})
            slices.append(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": f"{pod.name}-local",
                        "labels": {SERVICE_LABEL: name},
                        "resourceVersion": "1",
                    },
                    "addressType": "IPv4",
                    "endpoints": [
                        {
                            "addresses": ["127.0.0.1"],
                            "conditions": {"ready": True},
                            "targetRef": {"kind": "Pod", "name": pod.name},
                        }
                    ],
                    "ports": ports,
                }
            )
        out[name] = slices
    return out


def granted_verbs(docs: list[Any]) -> set[str]:
    """Verbs the rendered Roles grant on discovery.k8s.io endpointslices."""
    verbs: set[str] = set()
    for role in by_kind(docs, "Role").values():
        for rule in role.get("rules", []):
            if "discovery.k8s.io" in rule.get("apiGroups", []) and "endpointslices" in rule.get(
                "resources", []
            ):
                verbs |= set(rule.get("verbs", []))
    return verbs


class FakeKube:
    def __init__(self, namespace: str, slices: dict[str, list[dict[str, Any]]], verbs: set[str]):
        self.namespace = namespace
        self.slices = slices
        self.verbs = verbs
        self.requests: list[tuple[str, str]] = []  # (verb, service)
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], bool]:
        prefix = f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        if path != prefix:
            return 404, {"kind": "Status", "code": 404, "message": f"no {path}"}, False
        watch = (query.get("watch") or ["false"])[0].lower() in ("true", "1")
        verb = "watch" if watch else "list"
        selector = (query.get("labelSelector") or [""])[0]
        service = selector.removeprefix(f"{SERVICE_LABEL}=")
        with self.lock:
            self.requests.append((verb, service))
        if verb not in self.verbs:
            return 403, {"kind": "Status", "code": 403, "message": f"{verb} not granted"}, False
        if watch:
            return 200, {}, True
        body = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSliceList",
            "metadata": {"resourceVersion": "1"},
            "items": self.slices.get(service, []),
        }
        return 200, body, False


@contextmanager
def serve(kube: FakeKube) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            code, body, stream = kube.answer(url.path, urllib.parse.parse_qs(url.query))
            if stream:
                timeout = float(
                    (urllib.parse.parse_qs(url.query).get("timeoutSeconds") or ["300"])[0]
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.flush()
                kube.stopping.wait(timeout)
                self.close_connection = True
                return
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        kube.stopping.set()
        server.shutdown()
        server.server_close()
