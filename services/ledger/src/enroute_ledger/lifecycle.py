"""Repository lifecycle on a ledger node (seed 001, "Lifecycle").

- Creation: a create claims the next incarnation by compare-and-swap on the
  state object (``If-None-Match: *`` for incarnation 1, ``If-Match`` from the
  deleted state for E + 1), then hosts the new group and appends its genesis.
  An explicit create reads the state object even when the node hosts the
  repository, so a replica that missed a deletion cannot answer with it.
- Deletion in two steps: the tombstone through the log, then the trash marker
  ``trash/<repo>/<E>`` and the CAS of the deleted state into the state object.
  A crash between them is finished by the next activation of a node that
  applied the tombstone (``finish_deletion``).
- A node never joins an ended incarnation: it checks the state object first;
  at startup it drops every incarnation the object store says is deleted or
  superseded.
- Listing answers from the in-memory, name-ordered hosted list.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field

from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    IncarnationEnded,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
)
from enroute_core.state import (
    MISSING,
    Activate,
    Commit,
    Delete,
    LayerKind,
    OutcomeCode,
    ReplaceLayers,
    RepoState,
    apply,
    decode_command,
    decode_state,
    encode_command,
    encode_state,
)
from enroute_core.state.names import check_repo_name, state_key, trash_key
from enroute_core.storage.objectstore import ObjectStore

from . import calls
from .group import Group
from .hosting import store_gid
from .machine import Applied, command_entry, genesis_entry, inline_layer_of
from .multiraft import GroupId
from .raft.errors import StorageSignal
from .runtime import Runtime

log = logging.getLogger("enroute.ledger.lifecycle")

LIST_LIMIT_DEFAULT = 100
LIST_LIMIT_MAX = 1000
CLAIM_ATTEMPTS_MAX = 8
ENDED_GROUPS_KEPT_MAX = 4096
"""Incarnations a peer's messages named that the state object says ended, remembered so
that the next message is dropped without reading the object again (oldest forgotten)."""


@dataclass(slots=True)
class _NameLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holders and waiters


@dataclass(frozen=True, slots=True)
class Activated:
    state: RepoState
    created: bool


@dataclass(frozen=True, slots=True)
class SnapshotOut:
    """A Subscribe snapshot: the checkpoint plus (root, file) of each inline layer it names.

    The checkpoint holds only the pins of inline layers (DESIGN, "Repository
    state"); a subscriber starting from it has no change that carried their bytes.
    """

    incarnation: int
    version: int
    checkpoint: bytes
    inline: tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class ChangeOut:
    """One applied change of a subscription: its version and encoded Change."""

    version: int
    change: bytes


@dataclass(frozen=True, slots=True)
class StateObject:
    state: RepoState
    etag: str


class Lifecycle:
    """The Ledger service's semantics; the servicer only converts."""

    def __init__(
        self,
        runtime: Runtime,
        store: ObjectStore,
        *,
        upload_window: int,
        wall_clock_us: Callable[[], int],
        timeout_s: float = 10.0,
    ) -> None:
        self.rt = runtime
        self.store = store
        self.upload_window = upload_window
        self.wall_clock_us = wall_clock_us
        self.timeout_s = timeout_s
        self._names: list[str] = []  # sorted names of known repositories
        self._ended: dict[str, RepoState] = {}  # names known deleted without a hosted log
        self._joining: set[GroupId] = set()
        self._refused: dict[GroupId, None] = {}  # ended: never joined (ENDED_GROUPS_KEPT_MAX)
        self._locks: dict[str, _NameLock] = {}
        runtime.on_unknown_group = self._on_unknown_group

    async def _propose(self, g: Group, entry: bytes, rid: bytes) -> Applied:
        """Through the driver's client API: answered once applied here, or timed out."""
        return await calls.propose(self.rt, g, entry, rid, self.timeout_s)

    # -- the state object -------------------------------------------------------------------

    async def read_object(self, repo: str) -> StateObject | None:
        try:
            data, etag = await self.store.get_with_etag(state_key(repo))
        except NotFound:
            return None
        return StateObject(decode_state(data), etag)

    @contextlib.asynccontextmanager
    async def _lock(self, repo: str) -> AsyncIterator[None]:
        """One claim or delete of ``repo`` at a time on this node; the lock lives while
        someone holds or waits for it (a lock per name ever seen would cost each
        hosted repository some 200 bytes)."""
        entry = self._locks.get(repo)
        if entry is None:
            entry = self._locks[repo] = _NameLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[repo]

    def _remember(self, repo: str) -> None:
        i = bisect.bisect_left(self._names, repo)
        if i == len(self._names) or self._names[i] != repo:
            self._names.insert(i, repo)

    def known_state(self, repo: str) -> RepoState | None:
        """The state a listing shows (a hibernated group is not woken for it: only the
        listed fields are filled in, see ``Group.listing``)."""
        g = self.rt.by_repo.get(repo)
        if g is not None and g.born:
            return g.listing()
        return self._ended.get(repo)

    # -- hosting ----------------------------------------------------------------------------

    async def _host_live(self, repo: str, obj: StateObject) -> Group:
        """Host live incarnation E from the state object: drop older, join E."""
        self._drop_older(repo, obj.state.incarnation)
        g = await self.rt.founder.host(repo, obj.state.incarnation)
        self._remember(repo)
        self._ended.pop(repo, None)
        if not g.born:
            # the claimant appends the genesis; a node that finds no one did restores it
            try:
                if not self.rt.config.peers:
                    raise NotFound("a single voter restores at once")
                await calls.wait_born(self.rt, g, min(2.0, self.timeout_s))
            except EnrouteError:
                rid = self.rt.client.request_id()
                await self._propose(g, genesis_entry(rid, obj.state, None), rid)
                await calls.wait_born(self.rt, g, self.timeout_s)
        return g

    def _drop_older(self, repo: str, incarnation: int) -> None:
        """Seed 001: a node that hosts E drops it when it hosts E + 1."""
        for g in self.rt.groups_of(repo):
            if g.incarnation < incarnation:
                self.rt.drop(g)

    def _on_unknown_group(self, gid: GroupId) -> None:
        if gid in self._joining:
            return
        if gid in self._refused:
            # ended for good (incarnations never come back): a leader that still probes
            # this node (its group cannot quiesce without us) costs no object read each
            self.rt.forget_orphans(gid)
            return
        self._joining.add(gid)
        asyncio.get_running_loop().create_task(self._join(gid))

    async def _join(self, gid: GroupId) -> None:
        """A peer's message names a group this node lacks: join only a live incarnation."""
        joined = False
        try:
            repo = gid.repo.decode()
            check_repo_name(repo)
            obj = await self.read_object(repo)
            if obj is None or obj.state.incarnation != gid.incarnation or obj.state.deleted:
                # never join an ended (or unknown) incarnation
                if obj is not None and RepoState(incarnation=gid.incarnation).is_ended_by(
                    obj.state
                ):
                    if len(self._refused) >= ENDED_GROUPS_KEPT_MAX:
                        del self._refused[next(iter(self._refused))]
                    self._refused[gid] = None
                return
            self._drop_older(repo, obj.state.incarnation)
            await self.rt.founder.host(repo, gid.incarnation)
            joined = True
            self._remember(repo)
            self._ended.pop(repo, None)
        except (EnrouteError, UnicodeDecodeError) as e:
            log.warning("cannot join %r/%s: %s", gid.repo, gid.incarnation, e)
        finally:
            self._joining.discard(gid)
            if not joined:
                self.rt.forget_orphans(gid)

    async def startup(self) -> None:
        """Drop every hosted incarnation the object store says is ended (seed 001)."""
        for g in list(self.rt.groups.values()):
            self._remember(g.repo)
            try:
                obj = await self.read_object(g.repo)
            except EnrouteError as e:
                log.warning("state object of %s unreadable at startup: %s", g.repo, e)
                continue
            if obj is None:
                continue
            # only the incarnation and deletion matter: listing() does not wake the group
            local = g.listing() if g.born else RepoState(incarnation=g.incarnation)
            if local.is_superseded_by(obj.state) or (
                obj.state.incarnation == g.incarnation and obj.state.deleted and not local.deleted
            ):
                self.rt.drop(g)
                if obj.state.deleted and repo_unhosted(self.rt, g.repo):
                    self._ended[g.repo] = obj.state
            elif g.born and g.state.deleted and not obj.state.deleted:
                await self.finish_deletion(g.repo, g.state)

    # -- activate ---------------------------------------------------------------------------

    async def activate(self, repo: str, create: bool, head: bytes | None) -> Activated:
        """``create`` False: host and answer; True: claim the next incarnation when needed.

        ``head`` None with ``create`` is an implicit create (a push: HEAD repaired later).
        """
        check_repo_name(repo)
        g = self.rt.by_repo.get(repo)
        explicit = create and head is not None
        if not explicit and g is not None and g.born and g.state.live:
            return Activated(g.state, False)
        async with self._lock(repo):
            for _ in range(CLAIM_ATTEMPTS_MAX):
                obj = await self.read_object(repo)
                if obj is not None and obj.state.live:
                    g = await self._host_live(repo, obj)
                    await calls.barrier(self.rt, g, self.timeout_s)
                    if g.state.deleted:
                        await self.finish_deletion(repo, g.state)
                        continue
                    return Activated(g.state, False)
                if obj is not None and obj.state.deleted:
                    self._drop_ended(repo, obj.state)
                if not create:
                    raise NotFound("repository does not exist", repo=repo)
                done = await self._claim(repo, obj, head)
                if done is not None:
                    return done
            raise PreconditionFailed("repository claim kept racing", repo=repo)

    def _drop_ended(self, repo: str, obj_state: RepoState) -> None:
        for g in self.rt.groups_of(repo):
            # only the incarnation and deletion matter: listing() does not wake the group
            local = g.listing() if g.born else RepoState(incarnation=g.incarnation)
            if local.is_ended_by(obj_state) and not (local.deleted and g.born):
                self.rt.drop(g)

    async def _claim(
        self, repo: str, obj: StateObject | None, head: bytes | None
    ) -> Activated | None:
        """Seed 001: a create claims E + 1 by compare-and-swap, as for incarnation 1."""
        base = MISSING if obj is None else obj.state
        cmd = Activate(create=True, head=head, upload_window=self.upload_window)
        res = apply(base, cmd, log_index=0)
        if res.outcome.code is not OutcomeCode.OK:
            err = res.outcome.error()
            assert err is not None
            raise err
        claimed = res.state
        try:
            if obj is None:
                await self.store.put(state_key(repo), encode_state(claimed), if_none_match=True)
            else:
                await self.store.put(state_key(repo), encode_state(claimed), if_match=obj.etag)
        except PreconditionFailed:
            return None  # another node claimed first: read again
        self._drop_older(repo, claimed.incarnation)
        g = await self.rt.founder.host(repo, claimed.incarnation, campaign=True)
        self._remember(repo)
        self._ended.pop(repo, None)
        rid = self.rt.client.request_id()
        await self._propose(g, genesis_entry(rid, base, cmd), rid)
        await calls.wait_born(self.rt, g, self.timeout_s)
        return Activated(g.state, True)

    # -- describe / barrier -----------------------------------------------------------------

    async def _hosted_for_read(self, repo: str) -> Group | RepoState:
        check_repo_name(repo)
        g = self.rt.by_repo.get(repo)
        if g is not None:
            if not g.born:
                await calls.wait_born(self.rt, g, self.timeout_s)
            return g
        obj = await self.read_object(repo)
        if obj is None:
            raise NotFound("repository does not exist", repo=repo)
        if obj.state.deleted:
            return obj.state
        async with self._lock(repo):
            return await self._host_live(repo, obj)

    async def describe(self, repo: str) -> RepoState:
        got = await self._hosted_for_read(repo)
        if isinstance(got, RepoState):
            return got
        await calls.barrier(self.rt, got, self.timeout_s)
        return got.state

    async def barrier(self, repo: str) -> RepoState:
        return await self.describe(repo)

    # -- list -------------------------------------------------------------------------------

    def list(self, start_after: str, limit: int) -> tuple[list[RepoState | None], list[str], bool]:
        """One page of hosted names after ``start_after`` (seed 001, "Listing").

        A seek to the token (bisect on the sorted names), then the page: its time does
        not grow with the number of repositories (issue 19; ``more`` looks at the names
        after the page one by one and stops at the first listed, never copying the rest).
        """
        if limit < 0:
            raise InvalidArgument("limit must be >= 0")
        n = LIST_LIMIT_DEFAULT if limit == 0 else min(limit, LIST_LIMIT_MAX)
        i = bisect.bisect_right(self._names, start_after) if start_after else 0
        names: list[str] = []
        states: list[RepoState | None] = []
        while i < len(self._names) and len(names) < n:
            name = self._names[i]
            st = self.known_state(name)
            if st is not None:
                names.append(name)
                states.append(st)
            i += 1
        more = False
        for j in range(i, len(self._names)):  # (islice would step over the first i)
            if self.known_state(self._names[j]) is not None:
                more = True
                break
        return states, names, more

    # -- delete -----------------------------------------------------------------------------

    async def delete(self, repo: str) -> RepoState | None:
        """Seed 001, "Deletion": tombstone through the log, then marker and CAS."""
        check_repo_name(repo)
        async with self._lock(repo):
            obj = await self.read_object(repo)
            if obj is None:
                return None  # never existed
            if obj.state.deleted:
                self._drop_ended(repo, obj.state)
                if repo_unhosted(self.rt, repo):
                    self._ended[repo] = obj.state
                    self._remember(repo)
                return obj.state
            e = obj.state.incarnation
            g = await self._host_live(repo, obj)
            if not g.state.deleted:
                cmd = encode_command(Delete(e))
                rid = self.rt.client.request_id()
                applied = await self._propose(g, command_entry(rid, cmd), rid)
                if applied.outcome.code not in (OutcomeCode.OK, OutcomeCode.ALREADY_DELETED):
                    err = applied.outcome.error()
                    if err is not None:
                        raise err
            await self.finish_deletion(repo, g.state)
            return g.state

    async def finish_deletion(self, repo: str, deleted: RepoState) -> None:
        """Step 2: trash marker, then CAS the deleted state into the state object."""
        assert deleted.deleted
        marker = json.dumps(
            {
                "incarnation": deleted.incarnation,
                "last_upload_gen": deleted.upload_gen,
                "time_us": self.wall_clock_us(),
            },
            sort_keys=True,
        ).encode()
        await self.store.put(trash_key(repo, deleted.incarnation), marker)
        for _ in range(CLAIM_ATTEMPTS_MAX):
            obj = await self.read_object(repo)
            if obj is None or obj.state.incarnation != deleted.incarnation or obj.state.deleted:
                return  # already marked, or a later incarnation: nothing to swap
            try:
                await self.store.put(state_key(repo), encode_state(deleted), if_match=obj.etag)
                return
            except PreconditionFailed:
                continue
        raise PreconditionFailed("state object kept changing", repo=repo)

    # -- propose / subscribe ----------------------------------------------------------------

    async def propose(
        self, repo: str, incarnation: int, command: bytes, request_id: bytes = b""
    ) -> Applied:
        """Refuse a command of an ended incarnation before the log (seed 001).

        ``request_id`` (docs/rpc.md, Propose) is the caller's id of this write,
        kept across its retries: a copy within the window gets the first answer.
        """
        # -- caller request id: validate (begin) --
        if request_id and len(request_id) != 16:  # runtime's id width
            raise InvalidArgument("request_id must be 16 bytes", length=len(request_id))
        # -- caller request id (end) --
        cmd = decode_command(command)
        if not isinstance(cmd, Commit | ReplaceLayers | Delete):
            raise InvalidArgument("activate goes through Activate, not Propose")
        if cmd.incarnation != incarnation:
            raise InvalidArgument(
                "command names another incarnation than the request",
                incarnation=incarnation,
                command_incarnation=cmd.incarnation,
            )
        got = await self._hosted_for_read(repo)
        state = got if isinstance(got, RepoState) else got.state
        ended = _ended_error(state, incarnation)
        if ended is not None:
            raise ended
        assert isinstance(got, Group)
        rid = request_id or self.rt.client.request_id()  # caller request id, else a fresh one
        applied = await self._propose(got, command_entry(rid, command), rid)
        if applied.outcome.code in (OutcomeCode.NOT_FOUND, OutcomeCode.INCARNATION_ENDED):
            err = applied.outcome.error()
            assert err is not None
            raise err
        return applied

    async def subscribe(
        self, repo: str, incarnation: int, after_version: int
    ) -> AsyncGenerator[SnapshotOut | ChangeOut, None]:
        """A snapshot when needed (with its inline layers' bytes), then every change.

        Counted while open (``enroute_ledger_subscriptions_open``): a compute ends the
        stream of a view it evicts (docs/fleet.md), and the count shows it here.
        """
        self.rt.subscriptions += 1
        try:
            async for ev in self._follow(repo, incarnation, after_version):
                yield ev
        finally:
            self.rt.subscriptions_ended += 1

    async def _follow(
        self, repo: str, incarnation: int, after_version: int
    ) -> AsyncIterator[SnapshotOut | ChangeOut]:
        got = await self._hosted_for_read(repo)
        if isinstance(got, RepoState):
            yield SnapshotOut(got.incarnation, got.version, encode_state(got), ())
            return
        g = got
        try:
            incarnation = incarnation or g.incarnation  # 0: the current one
            if incarnation > g.incarnation:
                raise NotFound("no such incarnation here", repo=repo, incarnation=incarnation)
            oldest = g.history[0][0] if g.history else g.state.version + 1
            sent = after_version
            if after_version == 0 or incarnation != g.incarnation or after_version + 1 < oldest:
                snap = await self._snapshot(g, g.state)
                sent = snap.version
                yield snap
                del snap  # parked below: hold no snapshot bytes (docs/raft.md)
                if g.deleted and sent >= g.version:
                    return
            while True:
                if g.dropped:
                    return  # the caller follows again
                ev = g.changed
                for version, change in list(g.history):
                    if version > sent:
                        yield ChangeOut(version, change)
                        sent = version
                change = b""  # parked below: hold no change's bytes (docs/raft.md)
                if g.state.deleted and sent >= g.state.version:
                    return
                if g.history and g.history[0][0] > sent + 1:
                    snap = await self._snapshot(g, g.state)
                    sent = snap.version
                    yield snap
                    del snap
                    continue
                await ev.wait()
        finally:
            # the stream ended (a compute evicted its view, or went away): leave no
            # change event on the group. Parked on, it would stay on the hibernated
            # group until its next change, some 0.8 KiB an idle repository
            # (docs/fleet.md); its other waiters wake, find nothing new and wait on a
            # fresh one
            g.notify()

    async def _snapshot(self, g: Group, st: RepoState) -> SnapshotOut:
        """The checkpoint of ``st`` and the bytes of its inline layers, read at their pins."""
        inline = await inline_layers(self.rt, g, st) if st.live else []
        return SnapshotOut(st.incarnation, st.version, encode_state(st), tuple(inline))


async def inline_layers(rt: Runtime, g: Group, state: RepoState) -> list[tuple[bytes, bytes]]:
    """(root, file) of every inline layer in ``state``'s manifest, from its pinned entry.

    DESIGN, "Repository state": a checkpoint names an inline layer by the log
    index that holds its bytes; a subscriber that starts from a checkpoint
    needs them. Pinned entries stay readable after compaction (duty 7).
    """
    wanted = [e for e in state.manifest if e.kind is LayerKind.INLINE]
    if not wanted:
        return []
    sg = store_gid(g.gid)
    out: list[tuple[bytes, bytes]] = []
    for e in wanted:
        try:
            entry = await asyncio.to_thread(rt.store.entry, sg, e.pin)
        except StorageSignal as err:
            raise CorruptData(
                f"the log entry pinned by inline layer {e.root.hex()[:16]} is gone",
                section="ledger-entry",
                index=int(e.pin),
            ) from err
        out.append((e.root, inline_layer_of(entry.data, e.root, int(e.pin))))
    return out


def repo_unhosted(rt: Runtime, repo: str) -> bool:
    return all(g.dropped for g in rt.groups_of(repo))


def _ended_error(state: RepoState, incarnation: int) -> EnrouteError | None:
    if not state.exists:
        return NotFound("repository does not exist")
    if state.incarnation == incarnation and not state.deleted:
        return None
    if state.incarnation == incarnation:
        reason = "deleted"
    else:
        reason = "superseded" if incarnation < state.incarnation else "not this incarnation"
    return IncarnationEnded(
        f"incarnation {incarnation} has ended ({reason})",
        incarnation=incarnation,
        current_incarnation=state.incarnation,
        reason=reason,
    )
