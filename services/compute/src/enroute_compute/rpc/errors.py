"""EnrouteError <-> gRPC status, through ``ERROR_TABLE`` only (docs/rpc.md, "Errors").

The one place of this service where errors cross gRPC: servicers abort with
:func:`abort_args`, the ledger client turns failed calls back into the same
typed errors with :func:`error_from_rpc`.
"""

from __future__ import annotations

import json

import grpc

from enroute_core.base.errors import (
    ERROR_TABLE,
    EnrouteError,
    Internal,
    LimitExceeded,
    Timeout,
    Unavailable,
)
from enroute_proto import error_detail_metadata, find_error_detail

_BARE_STATUS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "limit_exceeded",
}


def status_of(code: str) -> grpc.StatusCode:
    """The gRPC status the table gives an error code."""
    mapping = ERROR_TABLE.get(code, ERROR_TABLE["internal"])
    status: grpc.StatusCode = getattr(grpc.StatusCode, mapping.grpc_status)
    return status


def abort_args(
    exc: EnrouteError,
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes]]]:
    """Status, message and trailing metadata for a servicer's abort."""
    try:
        details = json.dumps(exc.details, default=str, sort_keys=True)
    except (TypeError, ValueError):
        details = "{}"
    return status_of(exc.code), exc.message, error_detail_metadata(exc.code, exc.message, details)


def _classes() -> dict[str, type[EnrouteError]]:
    found: dict[str, type[EnrouteError]] = {}
    stack: list[type[EnrouteError]] = [EnrouteError]
    while stack:
        cls = stack.pop()
        # The first (most general) class of a code wins: subclasses refine, never rename.
        found.setdefault(cls.code, cls)
        stack.extend(cls.__subclasses__())
    return found


def error_from_rpc(exc: grpc.RpcError) -> EnrouteError:
    """The typed error a failed call stands for: its detail, else the bare status."""
    code_fn = getattr(exc, "code", None)
    status = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    trailing_fn = getattr(exc, "trailing_metadata", None)
    trailing = trailing_fn() if callable(trailing_fn) else None
    detail = find_error_detail(trailing)
    details_fn = getattr(exc, "details", None)
    text = str(details_fn() if callable(details_fn) else exc)
    if detail is None or detail.code not in ERROR_TABLE:
        code = _BARE_STATUS.get(status, "internal")
        if code == "unavailable":
            return Unavailable(text or "ledger unavailable")
        if code == "timeout":
            return Timeout(text or "ledger call timed out")
        if code == "limit_exceeded":
            return LimitExceeded("grpc_message", 0, 0, text)
        return Internal(text or f"ledger call failed: {status}")
    try:
        details = json.loads(detail.details_json) if detail.details_json else {}
    except ValueError:
        details = {}
    if not isinstance(details, dict):
        details = {}
    cls = _classes().get(detail.code, Internal)
    if cls is LimitExceeded:
        value, maximum = details.get("value", 0), details.get("maximum", 0)
        return LimitExceeded(
            str(details.get("limit", "")),
            value if isinstance(value, int) else 0,
            maximum if isinstance(maximum, int) else 0,
            detail.message,
        )
    err = EnrouteError.__new__(cls)
    EnrouteError.__init__(err, detail.message, **{str(k): v for k, v in details.items()})
    return err
