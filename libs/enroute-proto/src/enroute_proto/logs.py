"""Log lines of every role: JSON or text, with the request they serve (docs/operations.md).

One request crosses three processes: gitproto answers the HTTP request, a
compute does the Git work, a ledger commits. Each line a process logs while
serving it carries the same ``request_id`` (and ``repo`` and ``user`` where
known), so an operator follows one push with one filter across every role.
The context travels in gRPC invocation metadata: gitproto sends
:func:`call_metadata` on its calls to a compute, the compute's interceptor
binds it (:func:`bind_metadata`) and sends it on to the ledger.

``log.format: json`` (the default, for containers and log collectors) writes
one JSON object per line with ``ts``, ``level``, ``logger``, ``msg``, the
context fields and every ``extra=`` field of the call; ``text`` (``enroute
dev``) writes the same as ``TIME LEVEL LOGGER MSG key=value ...``.

Audit lines (:func:`audit`) go to the logger ``enroute.audit`` at INFO with
an ``action`` field: what changed, by whom, from which value to which.
This module lives beside the request id it carries and imports nothing of
``enroute_core``, as the rest of this package.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, TextIO

import grpc

from enroute_proto.request_id import (
    REQUEST_ID_BYTES,
    find_request_id,
    new_request_id,
    request_id_metadata,
)

__all__ = [
    "ACCESS_LOGGER",
    "ANONYMOUS_USER",
    "AUDIT_LOGGER",
    "USER_KEY",
    "ContextInterceptor",
    "JsonFormatter",
    "TextFormatter",
    "audit",
    "bind_metadata",
    "call_metadata",
    "configure_logging",
    "current_request_id",
    "log_context",
    "note",
]

USER_KEY = "enroute-user"
"""Invocation metadata key of the caller's name (a token's name or ``anonymous``)."""

ANONYMOUS_USER = "(anonymous)"
"""The ``user`` of a request without credentials (parentheses: no token name is read so)."""
AUDIT_LOGGER = "enroute.audit"
ACCESS_LOGGER = "enroute.access"
SUMMARISED_LOGGERS = frozenset({AUDIT_LOGGER, ACCESS_LOGGER})
"""Loggers whose message already says what their fields do: text lines leave the fields out."""
CONTEXT_FIELDS = ("request_id", "repo", "user")
"""The context fields every line logged while serving a request carries, in this order."""
USER_CHARS_MAX = 200

_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "enroute_log_context", default=None
)
# What every LogRecord has; the rest of a record's attributes came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}

LogFormat = Literal["json", "text"]


def log_context(**fields: str) -> dict[str, str]:
    """Start the context of a new request in this task (and the tasks it starts).

    Returns the mapping so the caller can read what :func:`note` added. A task
    serving one request per lifetime (an ASGI request, a gRPC call) needs no reset.
    """
    context = {key: value for key, value in fields.items() if value}
    _CONTEXT.set(context)
    return context


def note(**fields: str) -> None:
    """Add fields to the current request's context (e.g. ``user`` once authorized)."""
    context = _CONTEXT.get()
    if context is not None:
        context.update({key: value for key, value in fields.items() if value})


def context_field(name: str) -> str:
    """A field of the current request's context, or ``""``."""
    context = _CONTEXT.get()
    return context.get(name, "") if context is not None else ""


def current_request_id() -> bytes:
    """The id of the request being served, or a fresh one outside any request."""
    text = context_field("request_id")
    if len(text) == 2 * REQUEST_ID_BYTES:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    return new_request_id()


def call_metadata() -> tuple[tuple[str, str], ...]:
    """Invocation metadata that carries the current request to the next role.

    The request id is also the ledger's deduplication key of a write
    (request_id.py); the user is only for log lines.
    """
    metadata: list[tuple[str, str]] = [*request_id_metadata(current_request_id())]
    user = context_field("user")
    if user:
        metadata.append((USER_KEY, _printable(user)))
    return tuple(metadata)


def bind_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> None:
    """Start this call's log context from the metadata of the role that called."""
    pairs = tuple(metadata or ())
    request_id = find_request_id(pairs)
    user = next((v for k, v in pairs if k == USER_KEY and isinstance(v, str)), "")
    log_context(
        request_id=request_id.hex() if request_id is not None else "",
        user=_printable(user),
    )


class ContextInterceptor(grpc.aio.ServerInterceptor):
    """Binds each unary call's metadata to its log lines (the ledger's Activate, Delete,
    Propose). Streams pass untouched: a subscription serves no one request."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        behavior = handler.unary_unary

        async def bound(request: Any, context: Any) -> Any:
            bind_metadata(context.invocation_metadata())
            return await behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            bound,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def audit(action: str, **fields: object) -> None:
    """One audit line: ``action`` (``ref.update``, ``repo.create``, ...) and what it changed.

    The current context supplies ``request_id`` and ``user`` (who asked);
    ``fields`` name the repository and the values before and after.
    """
    logging.getLogger(AUDIT_LOGGER).info(
        "%s %s", action, " ".join(f"{k}={v}" for k, v in fields.items()),
        extra={"action": action, **fields},
    )  # fmt: skip


def _printable(text: str) -> str:
    """A metadata value: printable ASCII (gRPC refuses the rest), bounded."""
    return "".join(c if " " <= c <= "~" else "?" for c in text[:USER_CHARS_MAX])


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The context of the request the line was logged for, then the call's extras."""
    out: dict[str, Any] = {}
    context = _CONTEXT.get()
    if context:
        for name in CONTEXT_FIELDS:
            if name in context:
                out[name] = context[name]
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = value
    return out


def _timestamp(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a traceback (bugs only) is the ``exc`` field."""

    def __init__(self, role: str = "", node: str = "") -> None:
        super().__init__()
        self.process_fields = {k: v for k, v in (("role", role), ("node", node)) if v}

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self.process_fields,
            **_fields(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER MSG`` and the context as ``key=value`` (for a terminal)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = _CONTEXT.get() or {}
        tail = [f"{name}={context[name]}" for name in CONTEXT_FIELDS if name in context]
        if record.name not in SUMMARISED_LOGGERS:
            extras = vars(record).items()
            tail.extend(
                f"{k}={v}"
                for k, v in extras
                if k not in _STANDARD and k not in context and not k.startswith("_")
            )
        if not tail:
            return text
        head, newline, trace = text.partition("\n")
        return " ".join([head, *tail]) + newline + trace


def configure_logging(
    log_format: LogFormat,
    level: str,
    *,
    role: str = "",
    node: str = "",
    stream: TextIO | None = None,
    quiet: Mapping[str, str] | None = None,
) -> None:
    """Route every logger of this process to ``stream`` (stderr) in ``log_format``.

    ``quiet`` raises the level of chatty third-party loggers (name -> level).
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter: logging.Formatter = (
        JsonFormatter(role, node) if log_format == "json" else TextFormatter()
    )
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name, quiet_level in (quiet or {}).items():
        logging.getLogger(name).setLevel(quiet_level.upper())
