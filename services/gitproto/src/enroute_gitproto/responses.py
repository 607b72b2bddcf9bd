"""Plain ASGI responses shared by the Git handler and the REST API.

Every error goes through :data:`ERROR_TABLE` for its HTTP status (STYLE rule 4).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from enroute_core.base.errors import ERROR_TABLE, EnrouteError
from enroute_gitproto.auth import REALM

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

NO_CACHE = (
    (b"cache-control", b"no-cache, max-age=0, must-revalidate"),
    (b"pragma", b"no-cache"),
    (b"expires", b"Fri, 01 Jan 1980 00:00:00 GMT"),
)


def http_status(error: EnrouteError) -> int:
    return ERROR_TABLE[error.code].http_status


def error_headers(error: EnrouteError) -> list[tuple[bytes, bytes]]:
    """``WWW-Authenticate`` on 401 (Git then asks for credentials); ``Retry-After`` when the
    error names a wait (requests refused for concurrency, docs/access-control.md)."""
    if error.code == "unauthenticated":
        return [(b"www-authenticate", REALM.encode())]
    retry_after = error.details.get("retry_after_s")
    if isinstance(retry_after, (int, float)) and not isinstance(retry_after, bool):
        return [(b"retry-after", str(max(1, round(retry_after))).encode())]
    return []


def error_json(error: EnrouteError) -> dict[str, Any]:
    return {"error": {"code": error.code, "message": error.message, "details": error.details}}


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    all_headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(
    send: Send, status: int, value: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = b"" if status == 204 else json.dumps(value).encode()
    await send_bytes(send, status, body, "application/json", headers)


async def send_json_error(send: Send, error: EnrouteError) -> None:
    await send_json(send, http_status(error), error_json(error), error_headers(error))


async def send_text_error(send: Send, error: EnrouteError) -> None:
    """A Git client shows the body of a failed smart-HTTP request as the reason."""
    body = f"{error.message}\n".encode()
    headers = [*NO_CACHE, *error_headers(error)]
    await send_bytes(send, http_status(error), body, "text/plain; charset=utf-8", headers)


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None
