"""Which groups this ledger node hosts, and founding new ones (docs/raft.md, duty 2).

:class:`Hosted` is the registry: every hosted group by id, and by repository
name the newest incarnation (older ones beside it, rare). :class:`Founder`
makes a group hosted from nothing: the rows a founder writes before it hosts a
group (the boot snapshot with the founding members, the boot hard state, a
blank mark), then the group handed to the driver once they are durable. The
coroutine :meth:`Founder.host` does both around the store's write; the seeded
simulation calls the two halves itself. Neither moves a Ready: that is the
driver's (:mod:`enroute_ledger.runtime`).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from enroute_core.base.ids import LogIndex, NodeId, Term

from .group import Group
from .multiraft import GroupId
from .raft.storage import MemoryStorage
from .raft.types import ConfState, HardState, Snapshot, SnapshotMetadata
from .storage import GroupId as StoreGroupId
from .storage import WriteBatch

if TYPE_CHECKING:
    from .runtime import Runtime

BLANK_ROW = b"blank"
"""Present while the group was joined blank and no READMIT naming this node applied."""
BOOT_HARD_STATE = HardState(Term(1), None, LogIndex(1))
"""Every founder's boot hard state, one value for all groups (the store and the
in-memory log keep it per group)."""


class _HostedGroupId(GroupId, StoreGroupId):  # type: ignore[misc]  # equal tuples of both
    __slots__ = ()


def hosted_gid(repo: bytes, incarnation: int) -> GroupId:
    """The id of a group this voter hosts, for the Raft maps and the store's alike.

    Both layers key a group by an equal ``(repo, incarnation)`` tuple; made once
    when the group is hosted, one object is the key in every map of both (the
    first key a dict is given stays its key), where two cost each idle repository
    64 bytes more on every voter (issue 19). Checked as the store checks.
    """
    return cast(GroupId, StoreGroupId.__new__(_HostedGroupId, repo, incarnation))


def store_gid(gid: GroupId) -> StoreGroupId:
    if isinstance(gid, StoreGroupId):
        return gid
    return StoreGroupId(gid.repo, int(gid.incarnation))


@dataclass(slots=True)
class Boot:
    """A group being founded here: the rows to make durable before it is hosted."""

    gid: GroupId
    repo: str
    campaign: bool
    snapshot: Snapshot
    batch: WriteBatch
    blank: int = 0


class Hosted:
    """The hosted groups, by id and by repository name."""

    __slots__ = ("_older", "by_repo", "groups")

    def __init__(self) -> None:
        self.groups: dict[GroupId, Group] = {}
        self.by_repo: dict[str, Group] = {}
        """The newest hosted incarnation of each repository."""
        self._older: dict[str, list[Group]] = {}
        """Hosted incarnations of a repository other than the newest; rare."""

    def add(self, g: Group, repo: str) -> None:
        """Host ``g``; ``repo`` is its name as the caller holds it: the key of ``by_repo``,
        so that the one string is also the name the Lifecycle lists (one copy per
        repository, not two: issue 19)."""
        self.groups[g.gid] = g
        cur = self.by_repo.get(repo)
        if cur is None:
            self.by_repo[repo] = g
        elif cur.incarnation < g.incarnation:
            self.by_repo[repo] = g
            self._older.setdefault(repo, []).append(cur)
        else:
            self._older.setdefault(repo, []).append(g)

    def remove(self, g: Group) -> None:
        """Stop listing ``g``; the next newest incarnation, if any, takes its name."""
        self.groups.pop(g.gid, None)
        repo = g.repo
        older = self._older.get(repo)
        if self.by_repo.get(repo) is g:
            del self.by_repo[repo]
            if older:
                newest = max(older, key=lambda o: o.incarnation)
                older.remove(newest)
                self.by_repo[repo] = newest
        elif older and g in older:
            older.remove(g)
        if older is not None and not older:
            del self._older[repo]

    def groups_of(self, repo: str) -> list[Group]:
        """Every hosted incarnation of ``repo``, without a scan of all groups."""
        newest = self.by_repo.get(repo)
        older = self._older.get(repo, ())
        return [*older, newest] if newest is not None else list(older)


class Founder:
    """Founds groups on one node with the members set by :meth:`set_founding_voters`."""

    def __init__(self, rt: Runtime, voters: frozenset[NodeId]) -> None:
        self.rt = rt
        self._hosting: dict[GroupId, asyncio.Future[Group]] = {}
        """Groups whose boot rows :meth:`host` is writing, by the task writing them."""
        self.set_founding_voters(voters)

    def set_founding_voters(self, voters: frozenset[NodeId]) -> None:
        """The members a group founded from now on boots with (docs/raft.md, "Membership
        changes"): the ledger's committed membership, or the one a change moves to."""
        self.voters = voters
        meta = SnapshotMetadata(LogIndex(1), Term(1), ConfState(voters=voters))
        self._boot_snapshot = Snapshot(meta)

    @property
    def founding(self) -> int:
        """Groups whose boot rows are being written (they boot with the members of before)."""
        return len(self._hosting)

    async def host(self, repo: str, incarnation: int, *, campaign: bool = False) -> Group:
        """Host the group of ``repo`` at ``incarnation`` as a founder (duty 2).

        One task writes a group's boot rows: the store refuses the boot snapshot a
        second time (no newer than the one it holds), so callers that arrive
        meanwhile (a Propose here and a peer's message, say) wait for that task and
        take its group. The task runs to its end even if its callers give up, so a
        write the store may still apply is never followed by a second one.
        """
        gid = hosted_gid(repo.encode(), incarnation)
        g = self.rt.groups.get(gid)
        if g is not None:
            return g
        founding = self._hosting.get(gid)
        if founding is None:
            founding = asyncio.ensure_future(self._found(gid, repo, campaign))
            self._hosting[gid] = founding
            founding.add_done_callback(functools.partial(self._founded, gid))
        return await asyncio.shield(founding)

    def _founded(self, gid: GroupId, task: asyncio.Future[Group]) -> None:
        del self._hosting[gid]
        if not task.cancelled():
            task.exception()  # retrieved: the callers that still wait raise it

    async def _found(self, gid: GroupId, repo: str, campaign: bool) -> Group:
        """Write ``gid``'s boot rows, then install it (see :meth:`host`)."""
        boot = self.boot_rows(gid, repo, campaign)
        await asyncio.wrap_future(self.rt.store.submit(boot.batch))
        return self.booted(boot)

    def boot_rows(self, gid: GroupId, repo: str, campaign: bool) -> Boot:
        """The rows a founder writes before it hosts ``gid`` (duty 2)."""
        # taken now: a membership change may replace the boot snapshot meanwhile
        boot = Boot(gid, repo, campaign, self._boot_snapshot, WriteBatch())
        # a group of a repository that existed when this node came back with a wiped
        # disk may remember it as a voter: join it blank (docs/raft.md)
        rt = self.rt
        boot.blank = rt.blank_id if not campaign and repo in rt.blank_repos else 0
        sg = store_gid(gid)
        boot.batch.install_snapshot(sg, boot.snapshot.metadata)
        boot.batch.set_hard_state(sg, BOOT_HARD_STATE)
        if boot.blank:
            boot.batch.put_state(sg, BLANK_ROW, boot.blank.to_bytes(8, "big"))
        return boot

    def booted(self, boot: Boot) -> Group:
        """Host a group whose boot rows are durable."""
        mem = MemoryStorage()
        mem.apply_snapshot(boot.snapshot)
        mem.set_hard_state(BOOT_HARD_STATE)
        rt = self.rt
        g = rt.install(boot.gid, mem, 1, boot.blank, boot.repo)
        if boot.campaign or not rt.config.peers:
            rt.mr.campaign(boot.gid)
        rt.wake()
        return g
