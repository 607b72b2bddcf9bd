"""The ledger's membership: the cluster-wide record, and the driver that moves every group.

docs/raft.md, "Membership changes"; the record's bytes: docs/formats/ledger-membership.md.
The voters of the ledger are one record in the object store, ``ledger/membership``
(JSON, written with compare-and-swap)::

    {"format": 1, "epoch": 3, "voters": {"1": "ADDR", ...}, "target": null,
     "next_id": 5, "founders": 3, "retired": [4]}

* ``voters``: the committed membership, by Raft id. Every group has these voters
  once no change is open; a group founded now boots with them.
* ``target``: a change being applied, one voter added or one removed (so any
  majority of ``voters`` meets any majority of ``target``). Groups founded while
  it is open boot with ``target``.
* ``next_id`` only grows and ``retired`` lists every removed id: an id is never
  given twice, so a replaced machine never speaks under its predecessor's name.
* ``founders``: the ids 1..n of the first member list; their addresses come from
  ``ledger.members`` by position (as before membership changes existed), the
  addresses of voters added later from the record.

Every voter reads the record every ``POLL_S``; with a change open, each one
proposes the single-server change to every group whose applied members here
differ from ``target`` (a follower's proposal is forwarded to the group's
leader), a bounded number per round. The operator's ``enroute ledger`` command
opens the change, waits until every voter of ``target`` has taken it and reports
no group off target, then closes it: ``voters`` becomes ``target``. Any step may
be repeated after a crash; each is idempotent.

A two-voter ledger that lost a voter cannot take a single-server change (each
needs both voters), so ``enroute ledger replace OLD ADDRESS --recover-from S``
opens a *recovery* instead (``"recovery": {"survivor": S, "lost": OLD, "new": N}``
in the record, OLD retired at once, ``target`` = S and the new voter N): voter S,
which holds every committed entry, leads each group alone in a new term and
appends REMOVE(OLD) (``Raft.force_remove``), then adds N as usual (docs/raft.md,
"Recovering a two-voter ledger").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
)
from enroute_core.base.ids import NodeId
from enroute_core.storage.objectstore import ObjectStore

from .multiraft import GroupId
from .raft import ConfChange, ConfChangeType, Role
from .runtime import Runtime

log = logging.getLogger("enroute.ledger.membership")

MEMBERSHIP_KEY = "ledger/membership"
POLL_S = 1.0
"""How often a voter reads the record (one GET per voter per second)."""
PROPOSALS_PER_ROUND = 256
"""Conf changes one voter proposes per round: the bounded batch a change advances by."""
PROGRESS_EVERY_S = 5.0
"""A voter rewrites its unchanged progress this often: a report older than
HEALTHY_S says the voter is down (or cut off from the store)."""
HEALTHY_S = 15.0
PROGRESS_PREFIX = "ledger/membership-progress/"
ADDED_AHEAD_MAX = 2
"""Members ``ledger.members`` may list beyond the ledger's voters: the ones an operator is
adding (a chart grows by two to stay odd); each is refused until ``enroute ledger add``."""
_CAS_ATTEMPTS = 20


def progress_key(node: int) -> str:
    return f"{PROGRESS_PREFIX}{node}"


@dataclass(frozen=True)
class Recovery:
    """An open two-voter recovery: ``survivor`` carries every group alone, ``lost`` is
    retired, ``new`` joins (docs/raft.md, "Recovering a two-voter ledger")."""

    survivor: int
    lost: int
    new: int

    def as_json(self) -> dict[str, int]:
        return {"lost": self.lost, "new": self.new, "survivor": self.survivor}


@dataclass(frozen=True)
class Record:
    """``ledger/membership`` (module docstring)."""

    epoch: int
    voters: dict[int, str]
    next_id: int
    founders: int
    target: dict[int, str] | None = None
    retired: tuple[int, ...] = field(default=())
    recovery: Recovery | None = None
    """Set while a two-voter recovery is open (the key is absent otherwise)."""

    @property
    def view(self) -> dict[int, str]:
        """The members a group founded now boots with, and the voters this node talks to."""
        return self.target if self.target is not None else self.voters

    def encode(self) -> bytes:
        doc = {
            "format": 1,
            "epoch": self.epoch,
            "voters": {str(k): v for k, v in sorted(self.voters.items())},
            "target": None
            if self.target is None
            else {str(k): v for k, v in sorted(self.target.items())},
            "next_id": self.next_id,
            "founders": self.founders,
            "retired": sorted(self.retired),
        }
        if self.recovery is not None:
            doc["recovery"] = self.recovery.as_json()
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes) -> Record:
        try:
            doc = json.loads(data)
            if doc["format"] != 1:
                raise ValueError(f"format {doc['format']}")
            target = doc["target"]
            rv = doc.get("recovery")
            recovery = (
                None
                if rv is None
                else Recovery(int(rv["survivor"]), int(rv["lost"]), int(rv["new"]))
            )
            rec = Record(
                epoch=int(doc["epoch"]),
                voters={int(k): str(v) for k, v in doc["voters"].items()},
                next_id=int(doc["next_id"]),
                founders=int(doc["founders"]),
                target=None if target is None else {int(k): str(v) for k, v in target.items()},
                retired=tuple(int(i) for i in doc["retired"]),
                recovery=recovery,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptData(f"{MEMBERSHIP_KEY}: {e}", section="ledger-membership") from None
        if not rec.voters or any(i >= rec.next_id for i in rec.view):
            raise CorruptData(f"{MEMBERSHIP_KEY}: bad ids", section="ledger-membership")
        rv = rec.recovery
        if rv is not None and (
            rec.target is None
            or set(rec.voters) != {rv.survivor, rv.lost}
            or set(rec.target) != {rv.survivor, rv.new}
            or rv.lost not in rec.retired
        ):
            raise CorruptData(f"{MEMBERSHIP_KEY}: bad recovery", section="ledger-membership")
        return rec

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.encode())
        return doc

    def change_text(self) -> str:
        """The open change in words ("" when none)."""
        if self.target is None:
            return ""
        rv = self.recovery
        if rv is not None:
            return (
                f"recover: voter {rv.lost} lost, voter {rv.survivor} alone, "
                f"then add {rv.new} ({self.target[rv.new]})"
            )
        added = sorted(set(self.target) - set(self.voters))
        removed = sorted(set(self.voters) - set(self.target))
        if added:
            return f"add {added[0]} ({self.target[added[0]]})"
        return f"remove {removed[0]}" if removed else "no-op"


def founding_record(members: list[str]) -> Record:
    """The first record: ``ledger.members`` position i is id i + 1 (as before changes)."""
    voters = {i + 1: a for i, a in enumerate(members)} or {1: ""}
    return Record(epoch=1, voters=voters, next_id=len(voters) + 1, founders=len(voters))


async def read_record(store: ObjectStore) -> tuple[Record, str] | None:
    try:
        data, etag = await store.get_with_etag(MEMBERSHIP_KEY)
    except NotFound:
        return None
    return Record.decode(data), etag


async def load_or_found(store: ObjectStore, members: list[str]) -> Record:
    """The record; written from ``members`` if there is none yet (the first start)."""
    for _ in range(_CAS_ATTEMPTS):
        got = await read_record(store)
        if got is not None:
            return got[0]
        rec = founding_record(members)
        try:
            await store.put(MEMBERSHIP_KEY, rec.encode(), if_none_match=True)
        except PreconditionFailed:
            continue  # another founder wrote it first: read that one
        log.info("ledger membership recorded: voters %s", sorted(rec.voters))
        return rec
    raise PreconditionFailed("membership record keeps changing", key=MEMBERSHIP_KEY)


async def update(store: ObjectStore, change: Callable[[Record], Record]) -> Record:
    """Apply ``change`` to the record with compare-and-swap, retried while others write."""
    for _ in range(_CAS_ATTEMPTS):
        got = await read_record(store)
        if got is None:
            raise NotFound("no ledger membership record yet", key=MEMBERSHIP_KEY)
        rec, etag = got
        new = change(rec)
        if new == rec:
            return rec
        try:
            await store.put(MEMBERSHIP_KEY, new.encode(), if_match=etag)
        except PreconditionFailed:
            continue
        return new
    raise PreconditionFailed("membership record keeps changing", key=MEMBERSHIP_KEY)


# -- the steps of a change (pure: Record -> Record; idempotent) -------------------------------


def _busy(rec: Record) -> InvalidArgument:
    return InvalidArgument(
        f"a membership change is open ({rec.change_text()}): finish it first by running "
        "the same `enroute ledger` command again",
        epoch=rec.epoch,
    )


def begin_add(rec: Record, address: str) -> Record:
    """Open "add a voter at ``address``" under a new id; a no-op if it is open or done."""
    if not address or ":" not in address:
        raise InvalidArgument("not HOST:PORT", address=address)
    if address in rec.view.values():
        return rec
    if rec.target is not None:
        raise _busy(rec)
    nid = rec.next_id
    return replace(
        rec,
        epoch=rec.epoch + 1,
        next_id=nid + 1,
        target={**rec.voters, nid: address},
    )


def begin_remove(rec: Record, node: int) -> Record:
    """Open "remove voter ``node``"; a no-op if it is open or done."""
    if rec.target is not None and node not in rec.target and node in rec.voters:
        return rec
    if node in rec.retired and rec.target is None:
        return rec
    if node not in rec.view:
        raise InvalidArgument("no such voter", id=node, voters=sorted(rec.view))
    if rec.target is not None:
        raise _busy(rec)
    if len(rec.voters) <= 1:
        raise InvalidArgument("the last voter cannot be removed", id=node)
    target = {i: a for i, a in rec.voters.items() if i != node}
    return replace(rec, epoch=rec.epoch + 1, target=target)


def finish(rec: Record) -> Record:
    """Close the open change: the target is the committed membership."""
    if rec.target is None:
        return rec
    removed = set(rec.voters) - set(rec.target)
    return replace(
        rec,
        epoch=rec.epoch + 1,
        voters=rec.target,
        target=None,
        retired=tuple(sorted({*rec.retired, *removed})),
        recovery=None,
    )


def begin_recover(rec: Record, lost: int, address: str, survivor: int) -> Record:
    """Open "voter ``lost`` of two is gone: ``survivor`` alone, then ``address`` added";
    a no-op if it is open or done. ``lost`` retires now: the machine that held it never
    votes under it again, whatever it still holds (docs/raft.md, "Recovering a two-voter
    ledger")."""
    if not address or ":" not in address:
        raise InvalidArgument("not HOST:PORT", address=address)
    rv = rec.recovery
    target = rec.target or {}
    if rv is not None and (rv.survivor, rv.lost, target.get(rv.new)) == (survivor, lost, address):
        return rec
    if rec.target is None and lost in rec.retired and address in rec.voters.values():
        return rec  # done already
    if rec.target is not None:
        raise _busy(rec)
    if len(rec.voters) != 2:
        raise InvalidArgument(
            f"the ledger has {len(rec.voters)} voters ({_listed(rec.voters)}): a recovery "
            "from one survivor is for two voters only. With three or more, a voter that "
            "lost its disk is readmitted by the others when it restarts, and a machine is "
            "replaced with `enroute ledger replace OLD-ID ADDRESS` (no --recover-from)",
            voters=sorted(rec.voters),
        )
    if lost not in rec.voters or survivor not in rec.voters or lost == survivor:
        raise InvalidArgument(
            f"--recover-from names the surviving voter and OLD-ID the lost one: two "
            f"different voters of {_listed(rec.voters)}",
            lost=lost,
            survivor=survivor,
        )
    if address in rec.voters.values():
        raise InvalidArgument("that address is a voter's already: the new machine needs its own",
                              address=address)  # fmt: skip
    nid = rec.next_id
    return replace(
        rec,
        epoch=rec.epoch + 1,
        next_id=nid + 1,
        target={survivor: rec.voters[survivor], nid: address},
        retired=tuple(sorted({*rec.retired, lost})),
        recovery=Recovery(survivor, lost, nid),
    )


def recovery_refusal(
    rec: Record, me: int, blank_here: int, lost_report: dict[str, Any] | None, now_us: int
) -> str:
    """Why voter ``me`` (the survivor named) must not consent ("" when it may).

    It consents only if it holds every group's data itself (blank nowhere: a voter
    that lost its own disk lacks committed entries) and the lost voter is not seen
    holding its data: a report of it newer than HEALTHY_S that is blank in no group
    means it runs with its disk, and two voters that both answer change the normal way.
    """
    rv = rec.recovery
    assert rv is not None
    if me != rv.survivor:
        return f"{NOT_THE_SURVIVOR}: this is voter {me}; ask voter {rv.survivor}"
    if blank_here:
        return (
            f"voter {me} lost its own disk too: it is blank in {blank_here} groups, so it "
            "does not hold every committed entry and nothing can be recovered from it "
            "without losing acknowledged writes"
        )
    if lost_report is not None:
        age_s = (now_us - int(lost_report.get("at_us", 0))) / 1e6
        blank = int(lost_report.get("blank") or 0)
        if age_s < HEALTHY_S and not blank:
            return (
                f"voter {rv.lost} answered {age_s:.0f} s ago holding the data of every group "
                "(blank in none): it is not lost. With both voters up, replace it the normal "
                f"way: `enroute ledger replace {rv.lost} ADDRESS` without --recover-from"
            )
    return ""


NOT_THE_SURVIVOR = "not the surviving voter"
"""Marks the refusal of a voter asked to consent for another (the command asks the next)."""


# -- a voter's start -----------------------------------------------------------------------------


def resolve(
    rec: Record, members: list[str], node_id: str, address: str, stored: NodeId | None
) -> tuple[NodeId, dict[NodeId, str]]:
    """This node's id and its peers' addresses; refuses a member list the record denies.

    ``address``: where the other voters reach this one (``ledger.advertise``, else
    ``listen.grpc``). The id is the one the data directory holds (``stored``). A blank
    directory takes the id the record gives ``address`` among the voters added after
    the founders (the new voter of an open change, or an added voter that lost its
    disk); a founder's id is ``node.id`` (digits), else the position of ``address`` in
    ``ledger.members``. A blank directory whose address the record does not know, and
    that is no founder, is refused, naming ``enroute ledger add`` with its address.
    """
    if stored is not None:
        me = int(stored)
    else:
        me = _blank_id(rec, members, node_id, address)
    if me in rec.retired:
        raise InvalidArgument(
            f"node {me} was removed from the ledger and its id is never used again: wipe "
            "its data directory and join it as a new voter with `enroute ledger add "
            f"{address or 'ADDRESS'}` (it takes the id that change gives its address)",
            id=me,
        )
    view = rec.view
    configured = max(1, len(members))
    if configured < min(len(view), len(rec.voters)):
        raise InvalidArgument(
            f"ledger.members lists {configured} voters but the ledger has {len(rec.voters)} "
            f"({_listed(rec.voters)}): remove voters online with `enroute ledger remove ID` "
            "before shortening the list (docs/raft.md, 'Membership changes')",
            configured=configured,
            voters=len(rec.voters),
        )
    if configured > len(view) + ADDED_AHEAD_MAX:
        raise InvalidArgument(
            f"ledger.members lists {configured} voters but the ledger has {len(view)} "
            f"({_listed(view)}): add voters online with `enroute ledger add ADDRESS`, "
            "one at a time (docs/raft.md, 'Membership changes')",
            configured=configured,
            voters=len(view),
        )
    if me not in view:
        raise InvalidArgument(
            f"node {me} is not a voter of the ledger ({_listed(view)}): join this machine "
            f"with `enroute ledger add {address or 'ADDRESS'}` and a blank data directory (it "
            "takes the id that change gives its address)",
            id=me,
        )
    peers: dict[NodeId, str] = {}
    for i, addr in view.items():
        if i == me:
            continue
        # the configured route to a founder (a proxy, say) wins over the recorded address
        peers[NodeId(i)] = members[i - 1] if i <= min(rec.founders, len(members)) else addr
    return NodeId(me), peers


def _blank_id(rec: Record, members: list[str], node_id: str, address: str) -> int:
    """The id of a voter with a blank data directory (``resolve``): the record's by
    address for a voter added later, the configured one for a founder. An ordinal
    (node.id of a chart's pod) names only a founder: a later pod takes the id that
    ``enroute ledger add`` gave its address, never a retired one."""
    added = {a: i for i, a in rec.view.items() if i > rec.founders}
    if address and address in added:
        return added[address]
    if node_id.isdigit() and 1 <= int(node_id) <= rec.founders and int(node_id) not in rec.retired:
        return int(node_id)
    if not node_id.isdigit() and address in members[: rec.founders]:
        return members.index(address) + 1
    if len(members) <= 1 and not node_id.isdigit():
        return 1  # a single voter
    gone = ""
    if node_id.isdigit() and int(node_id) in rec.retired:
        gone = f" (node.id {node_id} was removed and its id is never used again)"
    raise InvalidArgument(
        f"this node ({address or 'no address'}) is not a voter of the ledger "
        f"({_listed(rec.view)}) and no open change adds it{gone}: run `enroute ledger add "
        f"{address or 'ADDRESS'}`, then start it again with a blank data directory; it takes "
        "the id that change gives its address (docs/raft.md, 'Membership changes')",
        address=address,
        node_id=node_id,
    )


def _listed(voters: dict[int, str]) -> str:
    return ", ".join(f"{i}={a}" for i, a in sorted(voters.items()))


# -- the driver in each voter ----------------------------------------------------------------


class MembershipDriver:
    """Follows the record and moves this node's groups toward the open change's target."""

    def __init__(
        self,
        rt: Runtime,
        store: ObjectStore,
        record: Record,
        *,
        set_peers: Callable[[dict[NodeId, str]], None],
        addresses: dict[NodeId, str],
        clock: Callable[[], float],
        wall_clock_us: Callable[[], int],
        poll_s: float = POLL_S,
        proposals_per_round: int = PROPOSALS_PER_ROUND,
    ) -> None:
        self.rt = rt
        self.clock = clock
        self.wall_clock_us = wall_clock_us
        self.store = store
        self.record = record
        self._set_peers = set_peers
        self._addresses = dict(addresses)  # the configured routes to founders win
        self.poll_s = poll_s
        self.proposals_per_round = proposals_per_round
        self.off_target = 0
        """Hosted groups whose applied members differ from the open change's target."""
        self.proposed = 0
        """Conf changes proposed here (a follower's are forwarded to the leader)."""
        self.not_proposed = 0
        self.last_refusal = ""
        """Why the last step of a group was not proposed (in /status)."""
        self.rounds = 0
        self.forced = 0
        """Groups this voter took over alone in a two-voter recovery (force_remove)."""
        self.unrecoverable = 0
        """Groups of an open recovery this survivor cannot take over (blank here)."""
        self.retired = False
        """This voter's id was retired: it takes no part any more (it should be stopped)."""
        self._cursor = 0
        self._published: tuple[int, ...] = ()
        self._published_at = -PROGRESS_EVERY_S
        self._stop = asyncio.Event()
        self._apply_view()

    @property
    def me(self) -> NodeId:
        return self.rt.config.node_id

    def _apply_view(self) -> None:
        view = self.record.view
        self.rt.set_founding_voters(frozenset(NodeId(i) for i in view))
        peers = {
            NodeId(i): self._addresses.get(NodeId(i), a) for i, a in view.items() if i != self.me
        }
        self.rt.mr.set_peers(peers)
        self._set_peers(peers)

    def status(self) -> dict[str, Any]:
        """This voter's part of ``/status`` and of ``enroute ledger members``."""
        rec = self.record
        return {
            "epoch": rec.epoch,
            "voters": {str(k): v for k, v in sorted(rec.voters.items())},
            "target": None
            if rec.target is None
            else {str(k): v for k, v in sorted(rec.target.items())},
            "change": rec.change_text(),
            "groups": len(self.rt.groups),
            "off_target": self.off_target,
            "founding": self.rt.founding,
            "proposed": self.proposed,
            "not_proposed": self.not_proposed,
            "last_refusal": self.last_refusal,
            "rounds": self.rounds,
            "recovery": None if rec.recovery is None else rec.recovery.as_json(),
            "forced": self.forced,
            "unrecoverable": self.unrecoverable,
            "blank": self.rt.blank_groups,
            "retired": self.retired,
        }

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.poll()
            except EnrouteError as e:
                log.warning("membership round failed: %s", e)
            except Exception:  # a bug here must not end the rounds for good
                log.exception("membership round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.poll_s)

    async def poll(self) -> None:
        got = await read_record(self.store)
        if got is not None and int(self.me) in got[0].retired:
            if not self.retired:
                log.error(
                    "this voter's id %s was retired from the ledger (epoch %d): it takes no "
                    "part any more; stop it, and bring a machine back only with `enroute "
                    "ledger add ADDRESS` and a wiped data directory",
                    self.me,
                    got[0].epoch,
                )
            self.retired = True
            return
        if got is not None and got[0].epoch != self.record.epoch:
            old, self.record = self.record, got[0]
            log.warning(
                "ledger membership epoch %d -> %d: voters %s, target %s",
                old.epoch,
                self.record.epoch,
                sorted(self.record.voters),
                None if self.record.target is None else sorted(self.record.target),
            )
            self._apply_view()
        self.reconcile()
        await self._publish()

    async def _publish(self) -> None:
        """Write this voter's progress where every voter (and the change's end) reads it:
        when it changed, and every PROGRESS_EVERY_S as a sign of life."""
        now = self.clock()
        mine = (
            self.record.epoch,
            self.off_target,
            len(self.rt.groups),
            self.rt.founding,
            self.rt.blank_groups,
        )
        if mine == self._published and now - self._published_at < PROGRESS_EVERY_S:
            return
        body = {
            "id": int(self.me),
            "epoch": mine[0],
            "off_target": mine[1],
            "groups": mine[2],
            "founding": mine[3],
            "blank": mine[4],
            "forced": self.forced,
            "unrecoverable": self.unrecoverable,
            "leading": sum(1 for g in self.rt.groups.values() if self.rt.is_leader(g)),
            "apply_lag_entries": self.rt.apply_lag_entries(),
            "at_us": self.wall_clock_us(),
        }
        await self.store.put(progress_key(int(self.me)), json.dumps(body).encode())
        self._published, self._published_at = mine, now

    def reconcile(self) -> None:
        """One bounded round: count off-target groups, propose the next step for some."""
        self.rounds += 1
        target = self.record.target
        want = frozenset(NodeId(i) for i in (target if target is not None else self.record.voters))
        gids = list(self.rt.groups)
        off = 0
        unrecoverable = 0
        budget = self.proposals_per_round
        n = len(gids)
        start = self._cursor % n if n else 0
        for k in range(n):
            gid = gids[(start + k) % n]
            try:
                have = self.rt.mr.voters_of(gid)
            except NotFound:
                continue
            if have == want or self.me not in have:
                continue
            off += 1
            if target is None or budget == 0:
                continue
            rv = self.record.recovery
            if rv is not None and rv.survivor == self.me and NodeId(rv.lost) in have:
                taken = self._force(gid, have, NodeId(rv.lost))
                unrecoverable += taken is None
            else:
                taken = self._step(gid, have, want)
            if taken:
                budget -= 1
                self._cursor = start + k + 1
        self.off_target = off
        self.unrecoverable = unrecoverable

    def _force(self, gid: GroupId, have: frozenset[NodeId], lost: NodeId) -> bool | None:
        """Two-voter recovery: lead ``gid`` alone without ``lost`` (the REMOVE is appended
        with it); True if done, False to try again later, None if it cannot be done here."""
        name = gid.repo.decode(errors="replace")
        if have != frozenset((self.me, lost)):
            self.last_refusal = f"{name}: members {sorted(have)}, not this voter and {lost}"
            return None
        try:
            forced = self.rt.mr.force_remove(gid, lost)  # wakes a hibernated group
        except EnrouteError as e:  # the group went away meanwhile
            self.last_refusal = f"{name}: {e}"
            return False
        if forced:
            self.forced += 1
            self.rt.wake()
            return True
        node = self.rt.mr.raw_node(gid)
        if node.raft.blank:
            self.last_refusal = f"{name}: blank here (lost its entries too): not recoverable"
            return None
        self.last_refusal = f"{name}: a snapshot or a committed change still to apply first"
        return False

    def _step(self, gid: GroupId, have: frozenset[NodeId], want: frozenset[NodeId]) -> bool:
        """Propose the next single-server change of ``gid`` (wakes it); True if proposed."""
        mr = self.rt.mr
        try:
            node = mr.raw_node(gid)  # wakes a hibernated group: bounded by the budget
            r = node.raft
            added = sorted(want - have)
            removed = sorted(have - want)
            if r.role is Role.LEADER and removed and removed[0] == self.me and not added:
                # the leader leaves last: it hands the group to a voter that stays first
                last = r.log.last_index()
                for p in sorted(want):
                    pr = r.tracker.progress.get(p)
                    if pr is not None and pr.match == last and r.lead_transferee is None:
                        mr.transfer_leader(gid, p)
                        return True
                return False
            if r.role is not Role.LEADER and r.lead is None:
                self.last_refusal = f"{gid.repo.decode(errors='replace')}: no leader known"
                return False
            if r.role is Role.LEADER and (
                r.pending_conf_index > r.log.applied
                or r.log.term_or_zero(r.log.committed) != r.term
            ):
                self.last_refusal = (
                    f"{gid.repo.decode(errors='replace')}: a change pending at "
                    f"{r.pending_conf_index} (applied {r.log.applied}), or nothing of term "
                    f"{r.term} committed yet"
                )
                return False
            if added:
                cc = ConfChange(ConfChangeType.ADD_NODE, added[0])
            else:
                cc = ConfChange(ConfChangeType.REMOVE_NODE, removed[0])
            mr.propose_conf_change(gid, cc)
        except EnrouteError as e:  # dropped (pending, no leader), or the group went away
            self.not_proposed += 1
            self.last_refusal = f"{gid.repo.decode(errors='replace')}: {e}"
            return False
        self.proposed += 1
        self.rt.wake()
        return True


# -- the operator's view and commands (``/membership`` of every voter) -------------------------


async def read_progress(store: ObjectStore, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Each voter's last progress report (a voter that never wrote one is missing)."""
    out: dict[int, dict[str, Any]] = {}
    for i in ids:
        try:
            data = await store.get(progress_key(i))
        except NotFound:
            continue
        with contextlib.suppress(ValueError, TypeError):
            doc = json.loads(data)
            if isinstance(doc, dict):
                out[i] = doc
    return out


def change_done(rec: Record, progress: dict[int, dict[str, Any]]) -> list[str]:
    """Why the open change cannot be closed yet ([] when it can): every voter of the
    target has taken this epoch, founds no group with the members of before, and
    hosts no group whose members differ from the target."""
    assert rec.target is not None
    waiting: list[str] = []
    for i in sorted(rec.target):
        p = progress.get(i)
        if p is None or p.get("epoch") != rec.epoch:
            waiting.append(f"voter {i} has not taken epoch {rec.epoch}")
        elif p.get("unrecoverable"):
            waiting.append(
                f"voter {i}: {p.get('unrecoverable')} groups cannot be recovered here (it "
                "lost their entries too: blank)"
            )
        elif p.get("off_target") or p.get("founding"):
            waiting.append(f"voter {i}: {p.get('off_target')} groups still to change")
    return waiting


async def members_view(store: ObjectStore, now_us: int) -> dict[str, Any]:
    """The record, and each voter's address, health, groups and lag (``enroute ledger members``)."""
    got = await read_record(store)
    if got is None:
        raise NotFound("no ledger membership record yet", key=MEMBERSHIP_KEY)
    rec = got[0]
    ids = sorted(set(rec.voters) | set(rec.target or {}))
    progress = await read_progress(store, ids)
    rows = []
    for i in ids:
        p = progress.get(i, {})
        age_s = (now_us - int(p.get("at_us", 0))) / 1e6 if p else None
        rows.append(
            {
                "id": i,
                "address": rec.view.get(i) or rec.voters.get(i, ""),
                "voter": i in rec.voters,
                "joining": rec.target is not None and i in rec.target and i not in rec.voters,
                "leaving": rec.target is not None and i not in rec.target,
                "healthy": age_s is not None and age_s < HEALTHY_S,
                "report_age_s": None if age_s is None else round(age_s, 1),
                "groups": p.get("groups"),
                "leading": p.get("leading"),
                "off_target": p.get("off_target"),
                "apply_lag_entries": p.get("apply_lag_entries"),
                "epoch": p.get("epoch"),
                "blank": p.get("blank"),
            }
        )
    out: dict[str, Any] = {"record": rec.as_json(), "members": rows, "change": rec.change_text()}
    if rec.target is not None:
        out["waiting"] = change_done(rec, progress)
        out["off_target"] = sum(int(progress.get(i, {}).get("off_target") or 0) for i in rec.target)
    return out


async def admin(
    store: ObjectStore, request: dict[str, Any], local: MembershipDriver | None = None
) -> dict[str, Any]:
    """``POST /membership``: ``{"op": "add", "address"}``, ``{"op": "remove", "id"}``,
    ``{"op": "recover", "lost", "address", "survivor"}`` (only the survivor, ``local``,
    consents) or ``{"op": "finish", "epoch"}``; answers the record after the step."""
    op = request.get("op")
    if op == "recover":
        return await _recover(store, request, local)
    if op == "add":
        address = str(request.get("address", ""))
        rec = await update(store, lambda r: begin_add(r, address))
        nid = next((i for i, a in rec.view.items() if a == address), None)
        log.warning("membership change: add %s as voter %s (epoch %d)", address, nid, rec.epoch)
        return {"record": rec.as_json(), "id": nid}
    if op == "remove":
        node = int(request.get("id", 0))
        rec = await update(store, lambda r: begin_remove(r, node))
        log.warning("membership change: remove voter %s (epoch %d)", node, rec.epoch)
        return {"record": rec.as_json(), "id": node}
    if op == "finish":
        epoch = int(request.get("epoch", 0))
        got = await read_record(store)
        target = None if got is None else got[0].target
        if got is None or target is None:
            return {"record": None if got is None else got[0].as_json(), "finished": False}
        rec = got[0]
        if rec.epoch != epoch:
            raise InvalidArgument("the open change is not the one checked", epoch=rec.epoch)
        waiting = change_done(rec, await read_progress(store, sorted(target)))
        if waiting:
            raise InvalidArgument("the change has not reached every group: " + "; ".join(waiting))
        rec = await update(store, lambda r: finish(r) if r.epoch == epoch else r)
        log.warning("membership change done: voters %s (epoch %d)", sorted(rec.voters), rec.epoch)
        return {"record": rec.as_json(), "finished": True}
    raise InvalidArgument("op is add, remove or finish", op=op)


async def _recover(
    store: ObjectStore, request: dict[str, Any], local: MembershipDriver | None
) -> dict[str, Any]:
    """Open a two-voter recovery with the survivor's consent: the survivor is the voter
    asked (``local``) and finds itself able (``recovery_refusal``) before the record is
    written; once open, the same request answers the same id."""
    try:
        lost = int(request["lost"])
        survivor = int(request["survivor"])
        address = str(request["address"])
    except (KeyError, TypeError, ValueError):
        raise InvalidArgument("recover needs lost, survivor and address") from None
    if local is None:
        raise InvalidArgument(f"{NOT_THE_SURVIVOR}: this endpoint cannot consent")
    got = await read_record(store)
    if got is None:
        raise NotFound("no ledger membership record yet", key=MEMBERSHIP_KEY)
    opened = begin_recover(got[0], lost, address, survivor)  # refuses what is never safe
    if opened is not got[0]:  # not open yet: the survivor's consent first
        reports = await read_progress(store, [lost])
        refusal = recovery_refusal(
            opened,
            int(local.me),
            local.rt.blank_groups,
            reports.get(lost),
            local.wall_clock_us(),
        )
        if refusal:
            log.warning("two-voter recovery refused: %s", refusal)
            raise InvalidArgument(refusal, lost=lost, survivor=survivor)
    rec = await update(store, lambda r: begin_recover(r, lost, address, survivor))
    nid = next((i for i, a in rec.view.items() if a == address), None)
    log.warning(
        "two-voter recovery with the consent of voter %d: voter %d retired as lost, voter %d "
        "leads every group alone, then voter %s at %s joins (epoch %d)",
        survivor,
        lost,
        survivor,
        nid,
        address,
        rec.epoch,
    )
    return {"record": rec.as_json(), "id": nid}
