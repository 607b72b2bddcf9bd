"""/status, /metrics, /healthz, /readyz and POST /transfer-leadership of a ledger node.

``/status`` stays under a fixed size whatever the number of repositories (counts, a
histogram, the most active groups); ``/status?repo=<name>`` lists one repository's
groups and ``/status?after=<name>`` pages through all of them. No metric carries a
repository name (docs/observability.md, "Bounded labels").

A tiny ASGI app under uvicorn. Metrics (DESIGN "Observability", docs/observability.md)
come from a prometheus-client registry of this node alone, read from the
:class:`Runtime` at scrape time: the named families below, and the Runtime's
counters listed in ``RUNTIME_COUNTERS`` (``trace.*`` on its commit trace, ``client.*``
on its client API), each under the name written there. The list is explicit, not
read off the Runtime's attributes: renaming an attribute must not rename a metric,
nor a setting (``blank_id``) become one.
``test_http_metrics`` fails when a public number on the Runtime is in neither
``RUNTIME_COUNTERS`` nor ``NOT_COUNTERS``.

``POST /transfer-leadership`` is the preStop hook of a rolling upgrade: every
group this node leads is handed to another live voter (Raft §3.10, leadership
transfer), the node waits a bounded time for the moves, and answers counts.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import operator
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, Info, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.metrics_core import Metric

from enroute_core.base.errors import EnrouteError
from enroute_core.base.ids import NodeId
from enroute_proto.peer_token import admin_authorized

from .group import Group
from .membership import MembershipDriver, admin, members_view
from .runtime import Runtime

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

VERSION = "0.1.0"
TRANSFER_TIMEOUT_S = 10.0
TRANSFER_TIMEOUT_S_MAX = 120.0
TRANSFER_POLL_S = 0.02

# Runtime attribute -> exported name (``_total`` is added): the counters /metrics
# exports, every name as it has been exported (issue 21: never by reflection).
RUNTIME_COUNTERS: tuple[tuple[str, str], ...] = (
    ("applied_entries", "enroute_ledger_applied_entries"),
    ("apply_s", "enroute_ledger_apply_seconds"),
    ("blank_joined", "enroute_ledger_blank_joined"),
    ("blank_readmitted", "enroute_ledger_blank_readmitted"),
    ("trace.commits_traced", "enroute_ledger_commits_traced"),
    ("compactions", "enroute_ledger_log_compactions"),
    ("duplicates_skipped", "enroute_ledger_duplicates_skipped"),
    ("early_applied", "enroute_ledger_early_applied"),
    ("early_sent", "enroute_ledger_early_sent"),
    ("trace.follower_appends", "enroute_ledger_follower_appends"),
    ("trace.follower_persist_s", "enroute_ledger_follower_persist_seconds"),
    ("trace.follower_queue_s", "enroute_ledger_follower_queue_seconds"),
    ("handle_s", "enroute_ledger_ready_seconds"),
    ("hibernations", "enroute_ledger_hibernations"),
    ("leader_changes", "enroute_raft_leader_changes"),
    ("orphans_replayed", "enroute_ledger_raft_orphans_replayed"),
    ("orphans_stashed", "enroute_ledger_orphans_stashed"),
    ("persist_rounds", "enroute_ledger_persist_rounds"),
    ("persist_wait_s", "enroute_ledger_persist_wait_seconds"),
    ("trace.phase_answer_s", "enroute_ledger_phase_answer_seconds"),
    ("trace.phase_apply_s", "enroute_ledger_phase_apply_seconds"),
    ("trace.phase_persist_s", "enroute_ledger_phase_persist_seconds"),
    ("trace.phase_queue_s", "enroute_ledger_phase_queue_seconds"),
    ("trace.phase_replicate_s", "enroute_ledger_phase_replicate_seconds"),
    ("client.proposals_total", "enroute_ledger_proposals"),
    ("follow_streams", "enroute_ledger_follow_streams"),
    ("follow_streams_ended", "enroute_ledger_follow_streams_ended"),
    ("propose_streams", "enroute_ledger_propose_streams"),
    ("propose_streams_ended", "enroute_ledger_propose_streams_ended"),
    ("ready_groups", "enroute_ledger_ready_groups"),
    ("ready_take_s", "enroute_ledger_ready_take_seconds"),
    ("client.reproposals", "enroute_ledger_reproposals"),
    ("send_queue_s", "enroute_ledger_send_queue_seconds"),
    ("send_write_s", "enroute_ledger_send_write_seconds"),
    ("snapshots_applied", "enroute_ledger_snapshots_applied"),
    ("snapshots_received", "enroute_ledger_snapshots_received"),
    ("snapshots_sent", "enroute_ledger_snapshots_sent"),
    ("snapshots_send_failed", "enroute_ledger_snapshots_send_failed"),
    ("step_s", "enroute_ledger_step_seconds"),
    ("store_commit_s", "enroute_ledger_store_commit_seconds"),
    ("store_queue_s", "enroute_ledger_store_queue_seconds"),
    ("streamed_outcome_messages", "enroute_ledger_streamed_outcome_messages"),
    ("streamed_outcomes", "enroute_ledger_streamed_outcomes"),
    ("subscriptions", "enroute_ledger_subscriptions"),
    ("subscriptions_ended", "enroute_ledger_subscriptions_ended"),
    ("tick_s", "enroute_ledger_tick_seconds"),
    ("wakes", "enroute_ledger_group_wakes"),
)
NOT_COUNTERS = frozenset({"blank_id", "founding", "trace.ready_t", "blank_groups", "store_round_s"})
"""Public numbers on the Runtime that are not counters: a setting or an identity
(``blank_id``, ``founding``) or a clock reading, never exported; or a number exported in
another form (``blank_groups`` a gauge, ``store_round_s`` the fsync summary's sum)."""


STATUS_GROUPS_MAX = 16
"""Groups ``/status`` lists without a query: the most active (highest applied index)."""
STATUS_PAGE_GROUPS_MAX = 1000
"""Groups one ``/status?after=`` page lists, in name order."""


def _group_row(rt: Runtime, g: Group) -> dict[str, object]:
    return {
        "repo": g.repo,
        "incarnation": g.incarnation,
        "leader": rt.leader_of(g),
        "applied_index": g.applied,
        "version": g.version,  # these views never wake a hibernated group
        "deleted": g.deleted,
        "voters": sorted(int(n) for n in rt.mr.voters_of(g.gid)),  # as applied here
    }


def _log2_histogram(values: Iterable[int]) -> dict[str, int]:
    """Counts by power of two (key ``k``: values in [2^(k-1), 2^k), ``0``: zero)."""
    out: dict[int, int] = {}
    for v in values:
        k = max(int(v), 0).bit_length()
        out[k] = out.get(k, 0) + 1
    return {str(k): out[k] for k in sorted(out)}


def status(
    rt: Runtime,
    ready: bool = True,
    *,
    repo: str | None = None,
    after: str | None = None,
) -> dict[str, object]:
    """The node's /status, under a fixed size whatever the number of groups (issue 19).

    Counts, a histogram of applied indexes and the ``STATUS_GROUPS_MAX`` most active
    groups; ``repo``: every hosted incarnation of that repository instead;
    ``after``: the next ``STATUS_PAGE_GROUPS_MAX`` repositories' groups in name order
    (``raft_groups_next`` names the page after, "" at the end).
    """
    groups = rt.groups.values()
    out: dict[str, object] = {
        "role": "ledger",
        "node_id": int(rt.config.node_id),
        "version": VERSION,
        "ready": ready,
        "voters": sorted(int(n) for n in rt.founder.voters),  # the membership view
        "hosted_repositories": len(rt.by_repo),
        "groups": len(rt.groups),
        "groups_hibernated": rt.mr.hibernated_count(),
        "subscriptions_open": rt.subscriptions - rt.subscriptions_ended,
        "groups_deleted": sum(1 for g in groups if g.deleted),
        "groups_leading": sum(1 for g in groups if rt.is_leader(g)),
        "apply_lag_entries": _apply_lag(rt),
        "applied_index_log2": _log2_histogram(g.applied for g in groups),
    }
    chosen: list[Group]
    if repo is not None:
        chosen = rt.groups_of(repo)
    elif after is not None:
        names = sorted(n for n in rt.by_repo if n > after)
        page = names[:STATUS_PAGE_GROUPS_MAX]
        chosen = [g for n in page for g in rt.groups_of(n)]
        out["raft_groups_next"] = page[-1] if len(names) > len(page) else ""
    else:
        chosen = heapq.nlargest(STATUS_GROUPS_MAX, groups, key=lambda g: g.applied)
        chosen.sort(key=lambda g: (g.repo, g.incarnation))
    out["raft_groups"] = [_group_row(rt, g) for g in chosen]
    return out


def _apply_lag(rt: Runtime) -> int:
    fn = getattr(rt, "apply_lag_entries", None)
    return int(fn()) if callable(fn) else 0


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc)
    c.add_metric([], value)
    return c


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


class LedgerCollector:
    """Reads the Runtime at each scrape (one event loop: no lock needed)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def collect(self) -> Iterator[Metric]:
        rt = self.rt
        leading = sum(1 for g in rt.groups.values() if rt.is_leader(g))
        yield _gauge("enroute_ledger_groups", "Raft groups hosted here", len(rt.groups))
        yield _gauge("enroute_ledger_groups_leading", "groups this node leads", leading)
        yield _gauge("enroute_ledger_groups_active", "groups not quiesced", rt.mr.active_count())
        yield _gauge(
            "enroute_ledger_groups_hibernated",
            "idle groups kept as a compact record, rebuilt from the log store on use",
            rt.mr.hibernated_count(),
        )
        yield _gauge(
            "enroute_ledger_groups_blank",
            "hosted groups where this node is still blank (joined without the group's state)",
            rt.blank_groups,
        )
        yield _gauge(
            "enroute_ledger_subscriptions_open",
            "Subscribe streams open here (a compute's followed views)",
            rt.subscriptions - rt.subscriptions_ended,
        )
        yield _gauge(
            "enroute_raft_apply_lag_entries",
            "most committed but not yet applied entries of any group",
            _apply_lag(rt),
        )
        rounds = getattr(rt.store, "rounds", rt.persist_rounds)
        fsync = SummaryMetricFamily(
            "enroute_raft_fsync_seconds", "log store write rounds, each ending in one fsync"
        )
        fsync.add_metric([], count_value=int(rounds), sum_value=float(rt.store_round_s))
        yield fsync
        for attribute, name in RUNTIME_COUNTERS:
            yield _counter(name, f"Runtime.{attribute}", float(operator.attrgetter(attribute)(rt)))
        stats = rt.mr.stats
        for field in type(stats).__dataclass_fields__:
            value = getattr(stats, field)
            if isinstance(value, int) and not isinstance(value, bool):
                yield _counter(f"enroute_ledger_raft_{field}", f"MultiRaftStats.{field}", value)


def metrics(rt: Runtime) -> bytes:
    """The Prometheus text of ``rt`` (a registry per call: tests and callers without an app)."""
    registry = CollectorRegistry()
    registry.register(LedgerCollector(rt))
    return generate_latest(registry)


# -- rolling upgrades ------------------------------------------------------------------------


def transfer_target(rt: Runtime, g: Group) -> NodeId | None:
    """The live voter (not this node) whose log matches the most of ours, or None."""
    try:
        raft = rt.mr.raw_node(g.gid).raft
    except EnrouteError:
        return None
    best: tuple[int, int] | None = None
    for voter in raft.tracker.voters:
        if voter == rt.mr.id or not rt.mr.is_alive(voter):
            continue
        progress = raft.tracker.progress.get(voter)
        if progress is None or getattr(progress, "blank", False):
            continue
        key = (int(progress.match), -int(voter))
        if best is None or key > best:
            best = key
    return None if best is None else NodeId(-best[1])


async def transfer_leadership(rt: Runtime, timeout_s: float) -> dict[str, int]:
    """Hand every awake group led here to another voter; wait up to ``timeout_s`` for the moves.

    A hibernated group is left asleep (docs/raft.md, "A leader down or stopped"): a
    transfer would wake it here and on the target, thousands at fleet scale on every
    restart, and it has nothing waiting; the work that next wakes it elects a leader.
    Answers ``led`` (awake groups led at the start), ``asleep`` (hibernated groups led
    here, left in place), ``asked`` (transfers started), ``moved`` (no longer led here
    at the end), ``still_leading`` and ``no_target`` (no live voter to take it).
    """
    led: list[Group] = []
    asleep = 0
    for g in rt.groups.values():
        if rt.is_leader(g):
            if rt.mr.is_hibernated(g.gid):
                asleep += 1
            else:
                led.append(g)
    asked: list[Group] = []
    no_target = 0
    for g in led:
        target = transfer_target(rt, g)
        if target is None:
            no_target += 1
            continue
        try:
            rt.mr.transfer_leader(g.gid, target)
        except EnrouteError:
            continue
        asked.append(g)
    rt.wake()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while any(rt.is_leader(g) for g in asked) and loop.time() < deadline:
        await asyncio.sleep(TRANSFER_POLL_S)
    still = sum(1 for g in led if rt.is_leader(g))
    return {
        "led": len(led),
        "asleep": asleep,
        "asked": len(asked),
        "moved": len(led) - still,
        "still_leading": still,
        "no_target": no_target,
    }


class StatusApp:
    def __init__(self, rt: Runtime, membership: MembershipDriver | None = None) -> None:
        self.rt = rt
        self.membership = membership
        """/status carries a change's progress; /membership serves ``enroute ledger``."""
        self.ready = False
        self.registry = CollectorRegistry()
        self.registry.register(LedgerCollector(rt))
        ProcessCollector(registry=self.registry)  # process_*: CPU, memory, open files, start
        Info("enroute_build", "version of this process", registry=self.registry).info(
            {"version": VERSION, "role": "ledger"}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        method = scope.get("method", "GET")
        if path == "/transfer-leadership":
            if method != "POST":
                await _reply(send, 405, "text/plain", b"use POST\n")
                return
            if not admin_authorized(_header(scope, b"authorization")):  # docs/security.md
                await _reply(send, 401, "text/plain", ADMIN_REFUSED)
                return
            answer = await transfer_leadership(self.rt, _timeout(scope))
            await _reply(send, 200, "application/json", json.dumps(answer).encode())
        elif path == "/status":
            raw = bytes(scope.get("query_string", b"")).decode("latin-1")
            query = parse_qs(raw, keep_blank_values=True)  # after= is the first page
            repo = query["repo"][0] if "repo" in query else None
            after = query["after"][0] if "after" in query else None
            if repo is not None and not admin_authorized(_header(scope, b"authorization")):
                await _reply(send, 401, "text/plain", ADMIN_REFUSED)
                return
            doc = status(self.rt, self.ready, repo=repo, after=after)
            if self.membership is not None:
                doc["membership"] = self.membership.status()
            body = json.dumps(doc, sort_keys=True).encode()
            await _reply(send, 200, "application/json", body)
        elif path == "/membership" and self.membership is not None:
            await serve_membership(self.membership, scope, receive, send)
        elif path == "/metrics":
            text = generate_latest(self.registry)
            await _reply(send, 200, "text/plain; version=0.0.4; charset=utf-8", text)
        elif path == "/healthz":
            await _reply(send, 200, "text/plain", b"ok\n")
        elif path == "/readyz":
            code = 200 if self.ready else 503
            await _reply(send, code, "text/plain", b"ready\n" if self.ready else b"starting\n")
        else:
            await _reply(send, 404, "text/plain", b"not found\n")


async def serve_membership(
    driver: MembershipDriver, scope: Scope, receive: Receive, send: Send
) -> None:
    """``GET /membership`` (every voter, health, lag, the open change) and ``POST``
    (a step of a change: docs/raft.md, "Membership changes"); both need the token."""
    if not admin_authorized(_header(scope, b"authorization")):  # docs/security.md
        await _reply(send, 401, "text/plain", ADMIN_REFUSED)
        return
    try:
        if scope.get("method", "GET") == "POST":
            raw = b""
            while True:
                msg = await receive()
                raw += msg.get("body", b"")
                if not msg.get("more_body") or len(raw) > 65536:
                    break
            try:
                request = json.loads(raw or b"{}")
            except ValueError:
                request = None
            if not isinstance(request, dict):
                await _reply(send, 400, "text/plain", b"a JSON object, please\n")
                return
            answer = await admin(driver.store, request, driver)
        else:
            answer = await members_view(driver.store, driver.wall_clock_us())
    except EnrouteError as e:
        doc = {"code": e.code, "message": e.message, "details": e.details}
        await _reply(send, 409, "application/json", json.dumps(doc, default=str).encode())
        return
    await _reply(send, 200, "application/json", json.dumps(answer, sort_keys=True).encode())


ADMIN_REFUSED = b"this needs the internal token as a bearer token (docs/security.md)\n"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _timeout(scope: Scope) -> float:
    query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
    try:
        value = float((query.get("timeout") or [str(TRANSFER_TIMEOUT_S)])[0])
    except ValueError:
        value = TRANSFER_TIMEOUT_S
    return min(max(value, 0.0), TRANSFER_TIMEOUT_S_MAX)


async def _reply(send: Send, code: int, ctype: str, body: bytes) -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
