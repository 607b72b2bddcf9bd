"""Where the members of a role are: a static list, or the EndpointSlices of a Service.

DESIGN.md "Deployment": in a cluster, computes and gitproto find ledger voters
(and gitproto finds computes) through the Kubernetes API, from the
EndpointSlices of the role's Service; elsewhere from ``ledger.members`` /
``compute.members``. A :class:`MemberSource` yields the whole member set each
time it changes, so a consumer swaps its set instead of patching it.

The Kubernetes source follows the API's list-then-watch contract
(https://kubernetes.io/docs/reference/using-api/api-concepts/, "Efficient
detection of changes"): list to get the state and its ``resourceVersion``,
watch from that version, watch again from the last version seen when a watch
times out, list again when the server answers 410 Gone (the version was
compacted away), and back off, doubling up to a bound, on any other failure.

Like :mod:`enroute_core.config` this module sits above the layers of
``enroute_core`` and may do I/O; no layer imports it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from enroute_core.config import DiscoveryConfig

log = logging.getLogger("enroute.discovery")

SERVICE_LABEL = "kubernetes.io/service-name"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
BACKOFF_S_MIN = 0.5
BACKOFF_S_MAX = 30.0
HTTP_GONE = 410


class MemberSource(Protocol):
    """Yields the full member set (``HOST:PORT`` strings), first the current one, then changes."""

    def updates(self) -> AsyncIterator[frozenset[str]]: ...


@dataclass(frozen=True, slots=True)
class StaticMembers:
    """The members named in the configuration file: one set, never changing."""

    members: tuple[str, ...]

    async def updates(self) -> AsyncIterator[frozenset[str]]:
        yield frozenset(self.members)


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def slice_members(endpoint_slice: Mapping[str, Any], port_name: str) -> set[str]:
    """``HOST:PORT`` of the ready endpoints of one EndpointSlice (discovery.k8s.io/v1).

    An endpoint counts unless ``conditions.ready`` is false: the API says an
    unknown readiness (the field absent) is to be read as ready. A slice
    without the named port contributes nothing; an empty ``port_name`` takes
    the slice's first port.
    """
    port: int | None = None
    for p in endpoint_slice.get("ports") or ():
        named = not port_name or (p.get("name") or "") == port_name
        if named and isinstance(p.get("port"), int):
            port = p["port"]
            break
    if port is None:
        return set()
    out: set[str] = set()
    for endpoint in endpoint_slice.get("endpoints") or ():
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False:
            continue
        for ip in endpoint.get("addresses") or ():
            if isinstance(ip, str) and ip:
                out.add(_address(ip, port))
    return out


def members_of(slices: Iterable[Mapping[str, Any]], port_name: str) -> frozenset[str]:
    """The union of :func:`slice_members` over every slice of the Service."""
    out: set[str] = set()
    for s in slices:
        out |= slice_members(s, port_name)
    return frozenset(out)


@dataclass(slots=True)
class DiscoveryStats:
    """Counters for /metrics; never read by the logic."""

    lists: int = 0
    watches: int = 0
    events: int = 0
    gone: int = 0
    errors: int = 0
    updates: int = 0


class _ApiGone(Exception):
    """The watch's resourceVersion is no longer kept: list again."""


@dataclass
class EndpointSliceSource:
    """Members from the EndpointSlices of ``service`` in ``namespace`` (list, then watch).

    ``api_url`` empty means the in-cluster service account configuration;
    a URL (``http://127.0.0.1:8001``, e.g. ``kubectl proxy``) talks to that
    server without credentials.
    """

    service: str
    namespace: str
    port_name: str = "grpc"
    api_url: str = ""
    watch_timeout_s: int = 300
    backoff_s_min: float = BACKOFF_S_MIN
    backoff_s_max: float = BACKOFF_S_MAX
    sleep: Callable[[float], Any] = asyncio.sleep
    stats: DiscoveryStats = field(default_factory=DiscoveryStats)

    def _api_client(self) -> Any:
        # imported here: the client takes seconds to import, a static deployment never needs it
        from kubernetes.aio import client, config  # noqa: PLC0415

        if self.api_url:
            configuration = client.Configuration(host=self.api_url)
        else:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)

    async def updates(self) -> AsyncIterator[frozenset[str]]:
        from kubernetes.aio import client, watch  # noqa: PLC0415

        api_client = self._api_client()
        api = client.DiscoveryV1Api(api_client)
        selector = f"{SERVICE_LABEL}={self.service}"
        last: frozenset[str] | None = None
        backoff = self.backoff_s_min
        try:
            while True:
                try:
                    slices, version = await self._list(api, selector)
                    current = members_of(slices.values(), self.port_name)
                    if current != last:
                        last = current
                        self.stats.updates += 1
                        yield current
                    while True:  # each watch ends after watch_timeout_s: renew it from version
                        async for seen in self._watch_once(api, watch, selector, slices, version):
                            version = seen
                            current = members_of(slices.values(), self.port_name)
                            if current != last:
                                last = current
                                self.stats.updates += 1
                                yield current
                        backoff = self.backoff_s_min  # a watch ran to its end: healthy again
                except _ApiGone:
                    self.stats.gone += 1
                    log.info("endpointslices of %s: resourceVersion gone, listing again",
                             self.service)  # fmt: skip
                except (asyncio.CancelledError, GeneratorExit):
                    raise
                except Exception as exc:  # any API or transport failure: back off, list again
                    self.stats.errors += 1
                    log.warning("endpointslices of %s: %s; retrying in %.1f s",
                                self.service, exc, backoff)  # fmt: skip
                    await self.sleep(backoff)
                    backoff = min(backoff * 2, self.backoff_s_max)
        finally:
            await api_client.close()

    async def _list(self, api: Any, selector: str) -> tuple[dict[str, Mapping[str, Any]], str]:
        self.stats.lists += 1
        resp = await api.list_namespaced_endpoint_slice_without_preload_content(
            self.namespace, label_selector=selector
        )
        try:
            if resp.status == HTTP_GONE:
                raise _ApiGone()
            if resp.status != 200:
                raise RuntimeError(f"list endpointslices: HTTP {resp.status}")
            body = json.loads(await resp.read())
        finally:
            resp.release()
        items = body.get("items") or []
        slices = {s["metadata"]["name"]: s for s in items}
        return slices, str(body.get("metadata", {}).get("resourceVersion", ""))

    async def _watch_once(
        self,
        api: Any,
        watch: Any,
        selector: str,
        slices: dict[str, Mapping[str, Any]],
        version: str,
    ) -> AsyncIterator[str]:
        """One watch request until the server ends it: applies each event to ``slices``,
        then yields the resourceVersion to watch from next."""
        from kubernetes.aio.client.exceptions import ApiException  # noqa: PLC0415

        self.stats.watches += 1
        w = watch.Watch()
        try:
            stream = w.stream(
                api.list_namespaced_endpoint_slice,
                self.namespace,
                label_selector=selector,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_s,
            )
            async for event in stream:
                if not isinstance(event, dict):
                    continue
                self.stats.events += 1
                obj = event.get("raw_object") or {}
                meta = obj.get("metadata") or {}
                kind = event.get("type")
                if kind in ("ADDED", "MODIFIED"):
                    slices[meta["name"]] = obj
                elif kind == "DELETED":
                    slices.pop(meta.get("name", ""), None)
                version = str(meta.get("resourceVersion") or version)
                yield version
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                raise _ApiGone() from None
            raise
        finally:
            await w.close()


def own_namespace(default: str = "default") -> str:
    """The pod's namespace from its service account mount; ``default`` outside a pod."""
    try:
        return NAMESPACE_FILE.read_text().strip() or default
    except OSError:
        return default


async def first_members(updates: AsyncIterator[frozenset[str]]) -> tuple[str, ...]:
    """The first non-empty member set of ``updates``, sorted (waits for one)."""
    async for members in updates:
        if members:
            return tuple(sorted(members))
        log.warning("discovery found no ready members yet; waiting")
    raise RuntimeError("member discovery ended before it found a member")


async def follow(
    updates: AsyncIterator[frozenset[str]], apply: Callable[[tuple[str, ...]], object]
) -> None:
    """Call ``apply`` with every non-empty member set of ``updates`` (a source's), sorted.

    An empty set is skipped: when every endpoint is briefly not ready (a
    rolling restart), the last known addresses are more useful than none.
    """
    async for members in updates:
        if not members:
            log.warning("discovery found no ready members; keeping the last known ones")
            continue
        result = apply(tuple(sorted(members)))
        if asyncio.iscoroutine(result):
            await result


def member_source(static: tuple[str, ...], discovery: DiscoveryConfig | None) -> MemberSource:
    """The source a role's config names: ``*.discovery`` when set, else the static list."""
    if discovery is None:
        return StaticMembers(static)
    return EndpointSliceSource(
        discovery.service,
        discovery.namespace or own_namespace(),
        discovery.port_name,
        api_url=discovery.api_url,
        watch_timeout_s=max(1, int(discovery.watch_timeout)),
    )
