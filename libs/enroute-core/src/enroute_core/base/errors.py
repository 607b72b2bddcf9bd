"""Every public error: a typed exception with a stable code, and the one table.

STYLE rule 4: one table maps each code to its gRPC status, HTTP status, Git
form and whether a caller may retry. Servicers and HTTP handlers translate
only through :data:`ERROR_TABLE`; nothing else invents a status.

The gRPC status is kept as the name of the ``grpc.StatusCode`` member so that
this module imports no gRPC (``enroute_core`` never does).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar


class GitForm(enum.Enum):
    """How an error reaches a Git client.

    FATAL ends the conversation: an ``ERR`` packet before the response starts,
    side-band channel 3 once it has. REF refuses one ref of a push:
    ``ng <ref> <reason>`` in the report, the rest of the push goes on.
    """

    FATAL = "fatal"
    REF = "ref"


@dataclass(frozen=True, slots=True)
class ErrorMapping:
    grpc_status: str
    http_status: int
    git_form: GitForm
    retryable: bool


_F, _R = GitForm.FATAL, GitForm.REF

ERROR_TABLE: Mapping[str, ErrorMapping] = MappingProxyType(
    {
        # bad input from a client
        "invalid_argument": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "invalid_name": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "invalid_path": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "invalid_ref_name": ErrorMapping("INVALID_ARGUMENT", 400, _R, False),
        "invalid_object": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "invalid_pack": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "invalid_delta": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "invalid_pkt_line": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "protocol_error": ErrorMapping("INVALID_ARGUMENT", 400, _F, False),
        "missing_object": ErrorMapping("FAILED_PRECONDITION", 400, _R, False),
        "limit_exceeded": ErrorMapping("RESOURCE_EXHAUSTED", 413, _F, False),
        # state
        "not_found": ErrorMapping("NOT_FOUND", 404, _F, False),
        "already_exists": ErrorMapping("ALREADY_EXISTS", 409, _F, False),
        "stale_ref": ErrorMapping("FAILED_PRECONDITION", 409, _R, False),
        "incarnation_ended": ErrorMapping("NOT_FOUND", 404, _F, False),
        "precondition_failed": ErrorMapping("FAILED_PRECONDITION", 412, _F, True),
        # auth
        "unauthenticated": ErrorMapping("UNAUTHENTICATED", 401, _F, False),
        "permission_denied": ErrorMapping("PERMISSION_DENIED", 403, _F, False),
        # our side
        "corrupt_data": ErrorMapping("DATA_LOSS", 500, _F, True),
        "not_local": ErrorMapping("INTERNAL", 500, _F, True),
        "unavailable": ErrorMapping("UNAVAILABLE", 503, _F, True),
        "timeout": ErrorMapping("DEADLINE_EXCEEDED", 504, _F, True),
        "internal": ErrorMapping("INTERNAL", 500, _F, False),
    }
)


class EnrouteError(Exception):
    """Base of every public error. ``code`` is stable; ``details`` is JSON-safe."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, object] = details

    @property
    def mapping(self) -> ErrorMapping:
        return ERROR_TABLE[self.code]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        assert cls.code in ERROR_TABLE, f"{cls.__name__}.code {cls.code!r} is not in ERROR_TABLE"


class InvalidArgument(EnrouteError):
    code = "invalid_argument"


class InvalidName(EnrouteError):
    code = "invalid_name"


class InvalidPath(EnrouteError):
    code = "invalid_path"


class InvalidRefName(EnrouteError):
    code = "invalid_ref_name"


class InvalidObject(EnrouteError):
    """A Git object whose bytes do not parse as its type says."""

    code = "invalid_object"


class InvalidPack(EnrouteError):
    code = "invalid_pack"


class InvalidDelta(EnrouteError):
    code = "invalid_delta"


class InvalidPktLine(EnrouteError):
    code = "invalid_pkt_line"


class ProtocolError(EnrouteError):
    code = "protocol_error"


class MissingObject(EnrouteError):
    code = "missing_object"


class LimitExceeded(EnrouteError):
    """Over a bound of :class:`~enroute_core.base.limits.Limits` (STYLE rule 5)."""

    code = "limit_exceeded"

    def __init__(self, limit: str, value: int, maximum: int, message: str | None = None) -> None:
        super().__init__(
            message or f"{limit} is {value}, over the limit of {maximum}",
            limit=limit,
            value=value,
            maximum=maximum,
        )
        self.limit = limit


class NotFound(EnrouteError):
    code = "not_found"


class AlreadyExists(EnrouteError):
    code = "already_exists"


class StaleRef(EnrouteError):
    code = "stale_ref"


class IncarnationEnded(EnrouteError):
    code = "incarnation_ended"


class PreconditionFailed(EnrouteError):
    """A conditional write lost (object-store CAS)."""

    code = "precondition_failed"


class Unauthenticated(EnrouteError):
    code = "unauthenticated"


class PermissionDenied(EnrouteError):
    code = "permission_denied"


class CorruptData(EnrouteError):
    """Stored bytes failed a check (hash, crc, structure). ``section`` names where."""

    code = "corrupt_data"

    def __init__(self, message: str, *, section: str, **details: object) -> None:
        super().__init__(message, section=section, **details)
        self.section = section


class NotLocal(EnrouteError):
    """A read of bytes not loaded first (seed 004, "Never waiting on the object store").

    It carries what the read needs, so the one place that drives reads loads it
    and runs the item again ("Machines"): ``loads`` names layer entries by
    (layer file name, local indexes), their whole delta chains included; a
    chunk found missing below that (``file`` and ``chunk`` details) is loaded
    by itself. It never reaches a client: the driver loads and retries.
    """

    code = "not_local"

    def __init__(
        self,
        message: str,
        *,
        loads: tuple[tuple[str, tuple[int, ...]], ...] = (),
        **details: object,
    ) -> None:
        super().__init__(message, **details)
        self.loads = loads


class Unavailable(EnrouteError):
    code = "unavailable"


class ProposalDropped(Unavailable):
    """The Raft core refused a proposal (no leader, transfer under way, a bound).

    Nothing was appended: the caller may retry, here or at the leader.
    ``details["reason"]`` names why.
    """


class Timeout(EnrouteError):
    code = "timeout"


class Internal(EnrouteError):
    code = "internal"


def render_error_table() -> str:
    """The generated ``docs/errors.md``: the table as operators and clients see it."""
    by_code: dict[str, list[str]] = {}
    for cls in _all_error_classes(EnrouteError):
        by_code.setdefault(cls.code, []).append(cls.__name__)
    lines = [
        "<!-- generated from enroute_core.base.errors.ERROR_TABLE; do not edit -->",
        "# Errors",
        "",
        "Every public error has a stable code. This one table gives its gRPC status,",
        "HTTP status, the form a Git client sees (FATAL: an `ERR` packet, or side-band",
        "channel 3 once the response has started; REF: `ng <ref> <reason>` in the push",
        "report) and whether a caller may retry.",
        "",
        "| code | exception | gRPC | HTTP | Git | retry |",
        "|---|---|---|---|---|---|",
    ]
    for code, m in ERROR_TABLE.items():
        names = ", ".join(f"`{n}`" for n in sorted(by_code.get(code, [])))
        retry = "yes" if m.retryable else "no"
        lines.append(
            f"| `{code}` | {names} | {m.grpc_status} | {m.http_status} "
            f"| {m.git_form.name} | {retry} |"
        )
    return "\n".join(lines) + "\n"


def _all_error_classes(root: type[EnrouteError]) -> list[type[EnrouteError]]:
    """The public classes only: a private subclass elsewhere (a module's own marker of
    one case) is no name a caller sees, and whether it was imported must not change
    the document."""
    found = [root] if root.__module__ == __name__ else []
    for sub in root.__subclasses__():
        found.extend(_all_error_classes(sub))
    return found


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_error_table())
