"""How a Raft node is tuned, and where its randomness comes from.

Time inside the core is abstract ticks (etcd's model): the caller decides how
long a tick is. The only randomness is the election timeout (§5.2), drawn from
a ``RandomSource`` the caller passes in, so that a seed replays a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, NodeId
from enroute_core.base.limits import MiB

_MASK64 = (1 << 64) - 1
ZERO_INDEX = LogIndex(0)


class RandomSource(Protocol):
    def randrange(self, n: int, /) -> int:
        """A number in ``[0, n)``."""
        ...


class SplitMix64:
    """A small deterministic PRNG (Steele, Lea and Flood's SplitMix64), so no ``random`` import."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK64

    def next_u64(self) -> int:
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK64
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def randrange(self, n: int, /) -> int:
        assert 0 < n < 1 << 32, n
        return self.next_u64() % n


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Per-node settings; names put units last (STYLE rule 5), etcd's name in the comment."""

    id: NodeId
    election_ticks: int = 10  # ElectionTick
    heartbeat_ticks: int = 1  # HeartbeatTick
    applied: LogIndex = ZERO_INDEX  # Applied: where the state machine stands at restart
    msg_bytes_max: int = 1 * MiB  # MaxSizePerMsg: entries per AppendEntries
    inflight_msgs_max: int = 256  # MaxInflightMsgs
    inflight_bytes_max: int = 32 * MiB  # MaxInflightBytes
    uncommitted_bytes_max: int = 64 * MiB  # MaxUncommittedEntriesSize (leader)
    applying_bytes_max: int = 64 * MiB  # MaxCommittedSizePerReady
    pending_reads_max: int = 4096  # bound on ReadIndex requests awaiting a quorum
    check_quorum: bool = True  # CheckQuorum, with the leader lease on votes
    pre_vote: bool = True  # PreVote (thesis §9.6)
    blank: int = 0  # non-zero: joined with no memory of an earlier life (docs/raft.md)
    quiet_commit: bool = False
    """A commit that moves only the index is not sent as empty appends, and a beat skips
    a follower sent an append since the previous beat (without pending reads). Only for
    a caller that quiesces an idle leader at once, whose quiesce heartbeat carries the
    commit (the multi-Raft layer): otherwise followers learn it one beat later. Halves
    a commit's messages (docs/raft.md, "Quiet commits")."""

    def __post_init__(self) -> None:
        if self.id <= 0:
            raise InvalidArgument("node id must be positive", id=self.id)
        if self.heartbeat_ticks <= 0:
            raise InvalidArgument("heartbeat_ticks must be positive")
        if self.election_ticks <= self.heartbeat_ticks:
            raise InvalidArgument("election_ticks must exceed heartbeat_ticks")
        for name in (
            "msg_bytes_max",
            "inflight_msgs_max",
            "inflight_bytes_max",
            "uncommitted_bytes_max",
            "applying_bytes_max",
            "pending_reads_max",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive")
        if not 0 <= self.blank < 1 << 64:
            raise InvalidArgument("blank id must be a u64")
