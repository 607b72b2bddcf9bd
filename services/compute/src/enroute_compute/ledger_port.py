"""What a compute needs from the ledger (docs/rpc.md, "Ledger"), as a Protocol.

The host depends on this port only, so that the same push and fetch code runs
against the ledger over gRPC (:mod:`enroute_compute.ledger_client`) and against
an in-process state machine in tests (:mod:`enroute_testing.local_ledger`).
Commands, changes and checkpoints are the typed values of ``enroute_core.state``;
the gRPC client does the encoding.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from enroute_core.state import Change, Command, RepoState


class CreateMode(enum.Enum):
    """Activate's create option (seed 001, "Creation")."""

    NONE = 0
    EXPLICIT = 1
    IMPLICIT = 2


@dataclass(frozen=True, slots=True)
class RepoSummary:
    """What activate, describe and list answer (``RepositoryState`` on the wire)."""

    name: str
    incarnation: int
    version: int
    deleted: bool
    head: bytes
    head_kept: bool
    last_push_us: int | None


@dataclass(frozen=True, slots=True)
class Activated:
    state: RepoSummary
    created: bool


@dataclass(frozen=True, slots=True)
class ListPage:
    repos: tuple[RepoSummary, ...]
    more: bool


@dataclass(frozen=True, slots=True)
class Proposed:
    """The answer to a proposal: the version after its entry and the applied Change."""

    version: int
    change: Change


@dataclass(frozen=True, slots=True)
class BarrierPoint:
    """ReadIndex (DESIGN "Read path"): the version a reader must have applied."""

    incarnation: int
    version: int
    deleted: bool


def _no_layers() -> Mapping[bytes, bytes]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SnapshotEvent:
    """A state replacing the follower's view (a checkpoint).

    ``inline`` maps the root of every inline layer the manifest names to its
    file: the checkpoint holds only their pins (DESIGN, "Repository state").
    """

    state: RepoState
    inline: Mapping[bytes, bytes] = field(default_factory=_no_layers)


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One applied entry: the follower applies ``change.effects`` at ``version``."""

    version: int
    change: Change


FollowEvent = SnapshotEvent | ChangeEvent


class LedgerPort(Protocol):
    async def activate(self, name: str, create: CreateMode, head: bytes) -> Activated:
        """Host ``name``; claim the next incarnation when missing or deleted and asked to."""
        ...

    async def describe(self, name: str) -> RepoSummary:
        """The state after a read barrier; ``deleted`` set for a deleted repository."""
        ...

    async def list(self, start_after: str, limit: int) -> list[ListPage]:
        """One page per live ledger member (the caller merges, seed 001 "Listing")."""
        ...

    async def delete(self, name: str) -> RepoSummary | None:
        """Delete the live incarnation; None when the name never existed."""
        ...

    async def propose(
        self, name: str, incarnation: int, command: Command, request_id: bytes = b""
    ) -> Proposed:
        """Append one command; answered after it applied on the member.

        ``request_id`` (16 bytes) names the logical write across every retry and
        replay: a copy of an applied id is answered with the first apply's
        version and outcome (a Change without per-ref results when the ledger
        no longer holds it). Empty: the port picks one for this call.
        """
        ...

    def subscribe(
        self, name: str, incarnation: int, after_version: int
    ) -> AsyncIterator[FollowEvent]:
        """A snapshot when needed, then every change in version order.

        Leaving the iteration (closing it, or cancelling the task that reads it, as
        eviction does) ends the subscription; over gRPC that is an Unfollow on the
        compute's one Follow call to the member, not a call of its own
        (docs/rpc.md, Follow). A subscription that ends without the repository's
        deletion is followed again from the last version applied.
        """
        ...

    async def barrier(self, name: str) -> BarrierPoint:
        """Raft ReadIndex for ``name``."""
        ...

    async def close(self) -> None: ...
