"""What applying one command answers and changes: outcome, per-ref results, effects.

STYLE rule 8: the state machine has one entry point and explicit outputs. The
outcome answers the proposer; per-ref results give a push its ``ok``/``ng``
lines; effects say what changed, so the ledger knows which log pins to take
and release and subscribers know what moved.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    IncarnationEnded,
    InvalidArgument,
    InvalidRefName,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    StaleRef,
)
from enroute_core.base.ids import LogIndex
from enroute_core.state.model import LayerEntry, RefValue, RepoState


class OutcomeCode(enum.Enum):
    """How a command ended. The first three are successes."""

    OK = "ok"
    EXISTS = "exists"  # activate(create) of a live repository: nothing changed
    ALREADY_DELETED = "already_deleted"  # delete of a deleted, missing or older incarnation
    NOT_FOUND = "not_found"  # no live incarnation and no create
    INCARNATION_ENDED = "incarnation_ended"  # the command names a deleted or other incarnation
    STALE_REF = "stale_ref"
    INVALID_REF_NAME = "invalid_ref_name"
    INVALID_ARGUMENT = "invalid_argument"
    LIMIT_EXCEEDED = "limit_exceeded"  # the 32-bit id space
    UPLOAD_WINDOW = "upload_window"  # a stored layer's generation is out of the window
    STALE_RUN = "stale_run"  # replace_layers names layers the manifest no longer has
    CORRUPT_DATA = "corrupt_data"  # an inline layer's bytes do not hash to its root

    @property
    def ok(self) -> bool:
        return self in _SUCCESS

    @property
    def error_code(self) -> str | None:
        """The ``ERROR_TABLE`` code a caller reports, None for a success."""
        return _ERROR_CODES.get(self)


_SUCCESS = frozenset({OutcomeCode.OK, OutcomeCode.EXISTS, OutcomeCode.ALREADY_DELETED})
_ERROR_CODES = {
    OutcomeCode.NOT_FOUND: "not_found",
    OutcomeCode.INCARNATION_ENDED: "incarnation_ended",
    OutcomeCode.STALE_REF: "stale_ref",
    OutcomeCode.INVALID_REF_NAME: "invalid_ref_name",
    OutcomeCode.INVALID_ARGUMENT: "invalid_argument",
    OutcomeCode.LIMIT_EXCEEDED: "limit_exceeded",
    OutcomeCode.UPLOAD_WINDOW: "precondition_failed",
    OutcomeCode.STALE_RUN: "precondition_failed",
    OutcomeCode.CORRUPT_DATA: "corrupt_data",
}


def _no_details() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Outcome:
    code: OutcomeCode
    message: str = ""
    details: Mapping[str, object] = field(default_factory=_no_details)

    @property
    def ok(self) -> bool:
        return self.code.ok

    def error(self) -> EnrouteError | None:
        """The typed error a servicer raises for a refusal (translated via ERROR_TABLE)."""
        details = dict(self.details)
        match self.code:
            case OutcomeCode.NOT_FOUND:
                return NotFound(self.message, **details)
            case OutcomeCode.INCARNATION_ENDED:
                return IncarnationEnded(self.message, **details)
            case OutcomeCode.STALE_REF:
                return StaleRef(self.message, **details)
            case OutcomeCode.INVALID_REF_NAME:
                return InvalidRefName(self.message, **details)
            case OutcomeCode.INVALID_ARGUMENT:
                return InvalidArgument(self.message, **details)
            case OutcomeCode.LIMIT_EXCEEDED:
                limit = details.get("limit", "")
                value, maximum = details.get("value", 0), details.get("maximum", 0)
                assert isinstance(limit, str)
                assert isinstance(value, int) and isinstance(maximum, int)
                return LimitExceeded(limit, value, maximum, self.message)
            case OutcomeCode.UPLOAD_WINDOW | OutcomeCode.STALE_RUN:
                return PreconditionFailed(self.message, reason=self.code.value, **details)
            case OutcomeCode.CORRUPT_DATA:
                section = details.pop("section", "inline")
                assert isinstance(section, str)
                return CorruptData(self.message, section=section, **details)
        return None


class RefStatus(enum.Enum):
    OK = "ok"
    STALE = "stale"  # the expected old value is not the current one
    INVALID_NAME = "invalid_name"
    ABORTED = "aborted"  # not applied because the commit as a whole was refused


@dataclass(frozen=True, slots=True)
class RefResult:
    """One ref's answer; ``reason`` is the text of git's ``ng <ref> <reason>``.

    ``current`` is the ref's value when the command was applied (reported with a
    stale refusal, DESIGN "API commits": "reports the stale value").
    """

    name: bytes
    status: RefStatus
    current: RefValue | None
    reason: str = ""


# -- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefChanged:
    """A ref set or deleted; ``new`` carries the set time (None: deleted, time dropped)."""

    name: bytes
    old: RefValue | None
    new: RefValue | None


@dataclass(frozen=True, slots=True)
class HeadChanged:
    old: bytes
    new: bytes


@dataclass(frozen=True, slots=True)
class LayersChanged:
    """``removed`` is a consecutive run (empty for a pushed layer); ``added`` takes its place.

    ``added_data`` holds, for each added layer, the file of an inline one (empty for a
    stored one): a compute following the changes reads inline layers from these bytes.
    """

    removed: tuple[LayerEntry, ...]
    added: tuple[LayerEntry, ...]
    added_data: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class PinsChanged:
    """Log indexes that inline layers now hold back from truncation, and ones they let go."""

    added: tuple[LogIndex, ...]
    released: tuple[LogIndex, ...]


@dataclass(frozen=True, slots=True)
class LastPushChanged:
    old_us: int | None
    new_us: int


@dataclass(frozen=True, slots=True)
class UploadGenAdvanced:
    upload_gen: int


@dataclass(frozen=True, slots=True)
class Created:
    """A new incarnation was claimed (seed 001, "Creation")."""

    incarnation: int
    version: int
    upload_gen: int
    upload_window: int
    head: bytes
    head_kept: bool


@dataclass(frozen=True, slots=True)
class Deleted:
    """The tombstone applied; ``last_upload_gen`` goes into the trash marker (seed 001)."""

    incarnation: int
    last_upload_gen: int


Effect = (
    RefChanged
    | HeadChanged
    | LayersChanged
    | PinsChanged
    | LastPushChanged
    | UploadGenAdvanced
    | Created
    | Deleted
)


@dataclass(frozen=True, slots=True)
class Change:
    """What one applied entry answers and changes, without the state: the proposer's answer
    and a subscriber's change (``encode_change``); ``apply_change`` follows it."""

    outcome: Outcome
    refs: tuple[RefResult, ...] = ()
    effects: tuple[Effect, ...] = ()


@dataclass(frozen=True, slots=True)
class ApplyResult:
    state: RepoState
    outcome: Outcome
    refs: tuple[RefResult, ...] = ()
    effects: tuple[Effect, ...] = ()

    @property
    def change(self) -> Change:
        return Change(self.outcome, self.refs, self.effects)

    @property
    def pins_added(self) -> tuple[LogIndex, ...]:
        return tuple(i for e in self.effects if isinstance(e, PinsChanged) for i in e.added)

    @property
    def pins_released(self) -> tuple[LogIndex, ...]:
        return tuple(i for e in self.effects if isinstance(e, PinsChanged) for i in e.released)
