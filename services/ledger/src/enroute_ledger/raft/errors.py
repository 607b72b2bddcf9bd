"""Errors of the Raft core.

Public refusals are the project's typed errors: a proposal the core will not
take raises :class:`~enroute_core.base.errors.ProposalDropped` (retryable),
a bound raises :class:`~enroute_core.base.errors.LimitExceeded`, a misuse
raises :class:`~enroute_core.base.errors.InvalidArgument`.

The ``StorageSignal`` family is different: it is the vocabulary of the
:class:`~enroute_ledger.raft.storage.Storage` contract, raised by the caller's
storage and caught by the core (etcd's ``ErrCompacted`` and friends). They
never leave the core on a correct run, so they are not public errors.
"""

from __future__ import annotations

import enum

from enroute_core.base.errors import ProposalDropped


class DropReason(enum.Enum):
    NO_LEADER = "no_leader"
    TRANSFERRING = "leader_transfer_in_progress"
    NOT_A_MEMBER = "not_a_member"
    CONF_CHANGE_PENDING = "conf_change_pending"
    UNCOMMITTED_BYTES = "uncommitted_bytes_max"
    PENDING_READS = "pending_reads_max"
    INVALID_CONF_CHANGE = "invalid_conf_change"


def dropped(reason: DropReason, **details: object) -> ProposalDropped:
    return ProposalDropped(f"proposal dropped: {reason.value}", reason=reason.value, **details)


class StorageSignal(Exception):
    """Raised by a Storage to tell the core why it cannot answer."""


class Compacted(StorageSignal):
    """The index asked for is at or below the last snapshot: the leader must send one."""


class EntriesUnavailable(StorageSignal):
    """The index asked for is past the last stored entry."""


class SnapshotTemporarilyUnavailable(StorageSignal):
    """No snapshot can be produced now; the leader retries later."""


class SnapshotOutOfDate(StorageSignal):
    """A snapshot older than the one held was offered to the storage."""
