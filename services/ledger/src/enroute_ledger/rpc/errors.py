"""EnrouteError <-> gRPC status + ``enroute-error-bin`` trailer, only here (docs/rpc.md, Errors)."""

from __future__ import annotations

import json
from typing import NoReturn

import grpc

from enroute_core.base.errors import ERROR_TABLE, EnrouteError
from enroute_proto import error_detail_metadata


def status_of(code: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, ERROR_TABLE[code].grpc_status)  # type: ignore[no-any-return]


async def abort_with(
    context: grpc.aio.ServicerContext[object, object], err: EnrouteError
) -> NoReturn:
    """Set the detail trailer and abort with the table's status."""
    details = json.dumps(err.details, sort_keys=True, default=str)
    context.set_trailing_metadata(error_detail_metadata(err.code, err.message, details))
    await context.abort(status_of(err.code), err.message)
    raise AssertionError("abort returned")  # pragma: no cover
