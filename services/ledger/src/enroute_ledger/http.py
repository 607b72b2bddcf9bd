"""/status, /metrics, /healthz and /readyz of a ledger node: a tiny ASGI app under uvicorn."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .runtime import Runtime

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

VERSION = "0.1.0"


def status(rt: Runtime) -> dict[str, object]:
    groups = []
    for g in sorted(rt.groups.values(), key=lambda g: (g.repo, g.incarnation)):
        groups.append(
            {
                "repo": g.repo,
                "incarnation": g.incarnation,
                "leader": rt.leader_of(g),
                "applied_index": g.applied,
                "version": g.state.version,
                "deleted": g.state.deleted,
            }
        )
    return {
        "role": "ledger",
        "node_id": int(rt.config.node_id),
        "version": VERSION,
        "voters": sorted(int(n) for n in rt.config.voters),
        "hosted_repositories": sorted({g.repo for g in rt.groups.values()}),
        "raft_groups": groups,
    }


def metrics(rt: Runtime) -> str:
    st = rt.mr.stats
    leading = sum(1 for g in rt.groups.values() if rt.is_leader(g))
    lines = [
        "# TYPE enroute_ledger_groups gauge",
        f"enroute_ledger_groups {len(rt.groups)}",
        "# TYPE enroute_ledger_groups_leading gauge",
        f"enroute_ledger_groups_leading {leading}",
        "# TYPE enroute_ledger_groups_active gauge",
        f"enroute_ledger_groups_active {rt.mr.active_count()}",
        "# TYPE enroute_ledger_applied_entries_total counter",
        f"enroute_ledger_applied_entries_total {rt.applied_entries}",
        "# TYPE enroute_ledger_persist_rounds_total counter",
        f"enroute_ledger_persist_rounds_total {rt.persist_rounds}",
        "# TYPE enroute_ledger_proposals_total counter",
        f"enroute_ledger_proposals_total {rt.proposals_total}",
        "# TYPE enroute_ledger_log_compactions_total counter",
        f"enroute_ledger_log_compactions_total {rt.compactions}",
        "# TYPE enroute_ledger_snapshots_applied_total counter",
        f"enroute_ledger_snapshots_applied_total {rt.snapshots_applied}",
        "# TYPE enroute_ledger_raft_batches_out_total counter",
        f"enroute_ledger_raft_batches_out_total {st.batches_out}",
        "# TYPE enroute_ledger_raft_messages_out_total counter",
        f"enroute_ledger_raft_messages_out_total {st.messages_out}",
        "# TYPE enroute_ledger_raft_messages_dropped_total counter",
        f"enroute_ledger_raft_messages_dropped_total {st.messages_dropped}",
        "# TYPE enroute_ledger_raft_quiesced_total counter",
        f"enroute_ledger_raft_quiesced_total {st.quiesced}",
        "# TYPE enroute_ledger_raft_group_ticks_total counter",
        f"enroute_ledger_raft_group_ticks_total {st.group_ticks}",
        "# TYPE enroute_ledger_raft_heartbeats_out_total counter",
        f"enroute_ledger_raft_heartbeats_out_total {st.heartbeats_out}",
        "# TYPE enroute_ledger_raft_beats_out_total counter",
        f"enroute_ledger_raft_beats_out_total {st.beats_out}",
        "# TYPE enroute_ledger_ready_groups_total counter",
        f"enroute_ledger_ready_groups_total {rt.ready_groups}",
        "# TYPE enroute_ledger_early_applied_total counter",
        f"enroute_ledger_early_applied_total {rt.early_applied}",
        "# TYPE enroute_ledger_ready_seconds_total counter",
        f"enroute_ledger_ready_seconds_total {rt.handle_s:.6f}",
        "# TYPE enroute_ledger_persist_wait_seconds_total counter",
        f"enroute_ledger_persist_wait_seconds_total {rt.persist_wait_s:.6f}",
        "# TYPE enroute_ledger_raft_orphans_replayed_total counter",
        f"enroute_ledger_raft_orphans_replayed_total {rt.orphans_replayed}",
    ]
    return "\n".join(lines) + "\n"


class StatusApp:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.ready = False

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
        if path == "/status":
            body = json.dumps(status(self.rt), sort_keys=True).encode()
            await _reply(send, 200, "application/json", body)
        elif path == "/metrics":
            await _reply(send, 200, "text/plain; version=0.0.4", metrics(self.rt).encode())
        elif path == "/healthz":
            await _reply(send, 200, "text/plain", b"ok\n")
        elif path == "/readyz":
            code = 200 if self.ready else 503
            await _reply(send, code, "text/plain", b"ready\n" if self.ready else b"starting\n")
        else:
            await _reply(send, 404, "text/plain", b"not found\n")


async def _reply(send: Send, code: int, ctype: str, body: bytes) -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
