"""gRPC failures of a compute back into typed errors (docs/rpc.md, "Errors").

The one place gitproto reads a status: the ``enroute-error-bin`` detail names
the code, :data:`ERROR_TABLE` gives the rest. Without a detail the bare status
decides, as the contract says.
"""

from __future__ import annotations

import json

import grpc

from enroute_core.base.errors import ERROR_TABLE, EnrouteError
from enroute_proto import find_error_detail

_BARE_STATUS = {
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "limit_exceeded",
}


def _classes(root: type[EnrouteError]) -> list[type[EnrouteError]]:
    found = [root]
    for sub in root.__subclasses__():
        found.extend(_classes(sub))
    return found


def error_class(code: str) -> type[EnrouteError]:
    """The most general exception class of ``code`` (``Unavailable`` rather than its subclasses)."""
    for cls in _classes(EnrouteError):
        if cls.code == code:
            return cls
    return EnrouteError


def make_error(code: str, message: str, details: dict[str, object]) -> EnrouteError:
    """An instance of the typed error of ``code``, whatever its constructor takes."""
    cls = error_class(code)
    error = cls.__new__(cls)
    EnrouteError.__init__(error, message, **details)
    return error


def from_rpc_error(error: grpc.aio.AioRpcError) -> EnrouteError:
    """The typed error a failed compute call stands for."""
    detail = find_error_detail(error.trailing_metadata())
    if detail is not None and detail.code in ERROR_TABLE:
        details: dict[str, object] = {}
        if detail.details_json:
            try:
                decoded = json.loads(detail.details_json)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict):
                details = {str(k): v for k, v in decoded.items()}
        return make_error(detail.code, detail.message or (error.details() or ""), details)
    code = _BARE_STATUS.get(error.code(), "internal")
    return make_error(code, f"compute: {error.code().name}: {error.details() or ''}", {})
