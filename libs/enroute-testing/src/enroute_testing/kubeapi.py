"""A Kubernetes API server for EndpointSlices on 127.0.0.1: list and watch, as the API does.

``GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices`` answers as the
API server does (https://kubernetes.io/docs/reference/using-api/api-concepts/,
"Efficient detection of changes"): a list with ``metadata.resourceVersion``;
with ``watch=true`` a stream of JSON lines of the events newer than
``resourceVersion``, ended after ``timeoutSeconds``; an ``ERROR`` event with a
410 Status when that version was compacted away. ``labelSelector`` of the
form ``key=value`` is honoured. Tests of ``enroute_core.discovery`` and of the
processes that use it talk to this server through the real ``kubernetes``
client. :class:`ThreadedKubeApi` runs it in a thread of its own for tests of
real processes.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

NS = "enroute"
SERVICE = "enroute-ledger"
T = TypeVar("T")


def endpoint_slice(
    name: str, ips: dict[str, bool | None], *, port: int = 7000, service: str = SERVICE
) -> dict[str, Any]:
    endpoints = []
    for ip, ready in ips.items():
        conditions = {} if ready is None else {"ready": ready}
        endpoints.append({"addresses": [ip], "conditions": conditions})
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 9100, "protocol": "TCP"},
                  {"name": "grpc", "port": port, "protocol": "TCP"}],
    }  # fmt: skip


class FakeApiServer:
    """EndpointSlices of one namespace, their event history, and a compaction point."""

    def __init__(self) -> None:
        self.version = 100
        self.slices: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.compacted = 0
        self.changed = asyncio.Event()
        self.lists = 0
        self.watches: list[str] = []
        self.fail_next_lists = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    def put(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.version)
        kind = "MODIFIED" if obj["metadata"]["name"] in self.slices else "ADDED"
        self.slices[obj["metadata"]["name"]] = obj
        self.history.append((self.version, kind, obj))
        self._wake()

    def delete(self, name: str) -> None:
        self.version += 1
        obj = self.slices.pop(name)
        obj = dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(self.version)))
        self.history.append((self.version, "DELETED", obj))
        self._wake()

    def compact(self) -> None:
        """Forget the history: a watch from an older version now gets 410 Gone."""
        self.compacted = self.version
        self.history.clear()
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _selected(self, request: web.Request, obj: dict[str, Any]) -> bool:
        selector = request.query.get("labelSelector", "")
        if not selector:
            return True
        key, _, value = selector.partition("=")
        return bool(obj["metadata"].get("labels", {}).get(key) == value)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert request.match_info["ns"] == NS
        if request.query.get("watch") in ("true", "True", "1"):
            return await self._watch(request)
        self.lists += 1
        if self.fail_next_lists:
            self.fail_next_lists -= 1
            return web.json_response({"kind": "Status", "code": 500}, status=500)
        items = [s for s in self.slices.values() if self._selected(request, s)]
        return web.json_response(
            {
                "kind": "EndpointSliceList",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        )

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or 0)
        self.watches.append(str(since))
        timeout_s = float(request.query.get("timeoutSeconds") or 30)
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        if since < self.compacted:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                      "reason": "Expired", "message": f"too old version: {since}"}  # fmt: skip
            await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            for version, kind, obj in self.history:
                if version > since and self._selected(request, obj):
                    await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                    since = version
            if since < self.compacted:
                return resp  # compacted under a live watch: end it, the client re-watches
            remaining = deadline - loop.time()
            if remaining <= 0:
                return resp
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self.handle)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


class ThreadedKubeApi:
    """A :class:`FakeApiServer` on its own event loop thread, driven from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server: FakeApiServer | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, fn: Callable[[FakeApiServer], T]) -> T:
        """Run ``fn(server)`` on the server's loop (puts and deletes wake its watches)."""

        async def run() -> T:
            assert self.server is not None
            return fn(self.server)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def __enter__(self) -> ThreadedKubeApi:
        self._thread.start()

        async def start() -> FakeApiServer:
            server = FakeApiServer()
            await server.start()
            return server

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
