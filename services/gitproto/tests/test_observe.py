"""gitproto's request metrics: every request counted by Git service and answered status."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from enroute_gitproto.observe import Metrics, RequestMetrics, service_of
from enroute_gitproto.responses import Message, Receive, Scope, Send


def _scope(path: str, query: bytes = b"") -> Scope:
    return {"type": "http", "path": path, "query_string": query, "method": "GET"}


@pytest.mark.parametrize(
    ("path", "query", "service"),
    [
        ("/team/repo.git/info/refs", b"service=git-upload-pack", "git-upload-pack"),
        ("/team/repo.git/info/refs", b"service=git-receive-pack", "git-receive-pack"),
        ("/team/repo.git/info/refs", b"", "git-upload-pack"),
        ("/team/repo.git/git-upload-pack", b"", "git-upload-pack"),
        ("/team/repo.git/git-receive-pack", b"", "git-receive-pack"),
        ("/api/v1/repos", b"", "api"),
        ("/api/v1", b"", "api"),
        ("/metrics", b"", "ops"),
        ("/favicon.ico", b"", "other"),
    ],
)
def test_service_of(path: str, query: bytes, service: str) -> None:
    assert service_of(_scope(path, query)) == service


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_requests_are_counted_by_service_and_status() -> None:
    metrics = Metrics()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"].endswith("boom"):
            raise RuntimeError("handler failed before answering")
        status = 401 if scope["path"].endswith("git-receive-pack") else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    wrapped = RequestMetrics(app, metrics)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def run() -> None:
        await wrapped(_scope("/r.git/git-receive-pack"), receive, send)
        await wrapped(_scope("/r.git/git-upload-pack"), receive, send)
        await wrapped(_scope("/r.git/git-upload-pack"), receive, send)
        with pytest.raises(RuntimeError):
            await wrapped(_scope("/boom"), receive, send)

    asyncio.run(run())
    got = _samples(metrics)
    req = "enroute_gitproto_requests_total"
    assert got[(req, (("service", "git-receive-pack"), ("status", "401")))] == 1
    assert got[(req, (("service", "git-upload-pack"), ("status", "200")))] == 2
    assert got[(req, (("service", "other"), ("status", "aborted")))] == 1
    assert got[("enroute_gitproto_request_seconds_count", (("service", "git-upload-pack"),))] == 2
    assert len(sent) == 6  # the wrapper forwards every message unchanged
    metrics.auth_failures.labels("bad_token").inc()
    assert _samples(metrics)[("enroute_gitproto_auth_failures_total", (("reason", "bad_token"),))]
