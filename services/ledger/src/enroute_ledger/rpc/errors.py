"""EnrouteError <-> gRPC status + ``enroute-error-bin`` trailer, only here (docs/rpc.md, Errors)."""

from __future__ import annotations

import json
from typing import NoReturn

import grpc

from enroute_core.base.errors import ERROR_TABLE, EnrouteError
from enroute_proto import ErrorDetail, error_detail_metadata
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2


def status_of(code: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, ERROR_TABLE[code].grpc_status)  # type: ignore[no-any-return]


def _details_json(err: EnrouteError) -> str:
    return json.dumps(err.details, sort_keys=True, default=str)


async def abort_with(
    context: grpc.aio.ServicerContext[object, object], err: EnrouteError
) -> NoReturn:
    """Set the detail trailer and abort with the table's status."""
    context.set_trailing_metadata(error_detail_metadata(err.code, err.message, _details_json(err)))
    await context.abort(status_of(err.code), err.message)
    raise AssertionError("abort returned")  # pragma: no cover


def status_and_detail(err: EnrouteError) -> tuple[int, ErrorDetail]:
    """The status number and detail ``abort_with`` would set, for a message to carry."""
    detail = ErrorDetail(code=err.code, message=err.message, details_json=_details_json(err))
    return status_of(err.code).value[0], detail


def proposal_error(err: EnrouteError) -> ledger_pb2.ProposalError:
    """The status and detail ``abort_with`` would set, as one streamed proposal's outcome."""
    status, detail = status_and_detail(err)
    return ledger_pb2.ProposalError(status=status, detail=detail)


def follow_ended(err: EnrouteError | None) -> ledger_pb2.FollowEnded:
    """A follow's end: OK, or the status and detail a Subscribe call would end with."""
    if err is None:
        return ledger_pb2.FollowEnded()
    status, detail = status_and_detail(err)
    return ledger_pb2.FollowEnded(status=status, detail=detail)
