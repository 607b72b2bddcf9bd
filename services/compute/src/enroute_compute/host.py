"""Repositories hosted by this compute: views kept current from the ledger, pushes, fetches.

DESIGN "Processes" and docs/rpc.md, "Compute". Per repository the host keeps
the :class:`RepoState` and a :class:`View` over its layers (inline layers from
the bytes the changes carry, stored layers through the :class:`LayerService`),
fed by a Subscribe to the ledger. Seed 001, "Compute nodes": a change marking
the repository deleted drops the view; a state of another incarnation
replaces it.

Push (services.md, "Compute semantics"): parse the receive-pack request
(``enroute_core.protocol.receive``), spool the pack, ingest it against the
view, make the layer inline (small) or stored (published with the state's
``upload_gen``), propose a ``Commit`` with compare-and-swap ref updates
(atomic when the client asked), and turn the applied Change into
report-status. A push to a missing repository activates it implicitly.

Fetch: a read barrier (DESIGN "Read path"), the refs, then the v2 or v0
conversation; the pack is planned with ``plan_fetch`` and written with
``write_pack`` in side-band-64k with progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from enroute_compute.commits import BuiltCommit, CommitRequest, build_commit
from enroute_compute.ledger_port import (
    Activated,
    ChangeEvent,
    CreateMode,
    LedgerPort,
    SnapshotEvent,
)
from enroute_core.base.clock import Clock
from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    GitForm,
    IncarnationEnded,
    NotFound,
    ProtocolError,
    StaleRef,
    Unavailable,
)
from enroute_core.base.ids import ZERO_OID, ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, KiB, Limits, check_limit
from enroute_core.engine import serve
from enroute_core.engine.ingest import IngestResult, ingest_pack
from enroute_core.engine.view import View
from enroute_core.git.object_type import ObjectType
from enroute_core.git.pktline import FLUSH_PKT, NEED_DATA
from enroute_core.git.sideband import SIDEBAND_64K_DATA_BYTES_MAX
from enroute_core.git.source import BytesSource
from enroute_core.git.tag import Tag
from enroute_core.protocol import fetch as pfetch
from enroute_core.protocol._common import Ref, RefSnapshot
from enroute_core.protocol.advertise import Service, encode_v0_advertisement, encode_v2_capabilities
from enroute_core.protocol.errors import fatal_error_bytes, git_message
from enroute_core.protocol.lsrefs import encode_ls_refs_response
from enroute_core.protocol.receive import (
    PackChunk,
    PushEnd,
    PushReport,
    PushRequest,
    ReceivePack,
    encode_report,
)
from enroute_core.protocol.receive import RefStatus as ReportStatus
from enroute_core.state import (
    MISSING,
    Change,
    Commit,
    Deleted,
    LayerEntry,
    LayerKind,
    LayersChanged,
    NewLayer,
    RefStatus,
    RefUpdate,
    RepoState,
    apply_change,
)
from enroute_core.state.head import branch_ref
from enroute_core.state.names import check_repo_name, layer_key, storage_segment
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.layer.format import layer_key_name
from enroute_core.storage.layers import LayerService

log = logging.getLogger(__name__)

INLINE_LAYER_BYTES_MAX = 256 * KiB
"""Pushed layers up to this size travel inline in the log entry."""
PACK_BUFFER_BYTES = 256 * KiB
DEFAULT_HEAD = b"refs/heads/main"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent read of a repository: its state and the view of that state."""

    name: str
    state: RepoState
    view: View


class _Repo:
    """One hosted repository: state, view and the follower that keeps them current."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state: RepoState = MISSING
        self.view = View(())
        self.readers: dict[bytes, LayerReader] = {}
        self.inline: dict[bytes, bytes] = {}
        self.changed = asyncio.Condition()
        self.dead = False
        self.error: EnrouteError | None = None
        self.task: asyncio.Task[None] | None = None

    def snapshot(self) -> Snapshot:
        return Snapshot(self.name, self.state, self.view)


class RepositoryHost:
    """Every repository this compute serves, by name."""

    def __init__(
        self,
        ledger: LedgerPort,
        layers: LayerService | None,
        clock: Clock,
        *,
        limits: Limits = DEFAULT_LIMITS,
        inline_max_bytes: int = INLINE_LAYER_BYTES_MAX,
        wait_s: float = 30.0,
    ) -> None:
        self.ledger = ledger
        self.layers = layers
        self.clock = clock
        self.limits = limits
        self.inline_max_bytes = inline_max_bytes
        self.wait_s = wait_s
        self._repos: dict[str, _Repo] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self.pushes = 0
        self.fetches = 0

    # -- hosting --------------------------------------------------------------------------

    @property
    def hosted(self) -> tuple[str, ...]:
        return tuple(sorted(self._repos))

    async def open(self, name: str, create: CreateMode = CreateMode.NONE) -> _Repo:
        """The hosted repository, activating and following it first when needed."""
        check_repo_name(name)
        repo = self._repos.get(name)
        if repo is not None and not repo.dead:
            return repo
        lock = self._opening.setdefault(name, asyncio.Lock())
        async with lock:
            repo = self._repos.get(name)
            if repo is not None and not repo.dead:
                return repo
            activated = await self.ledger.activate(name, create, DEFAULT_HEAD)
            return await self._follow(name, activated)

    async def _follow(self, name: str, activated: Activated) -> _Repo:
        if activated.state.deleted:
            raise NotFound(f"repository {name} not found", name=name)
        repo = _Repo(name)
        self._repos[name] = repo
        repo.task = asyncio.create_task(self._run_follower(repo, activated.state.incarnation))
        await self._wait_version(repo, activated.state.version)
        return repo

    def drop(self, name: str) -> None:
        """Forget a repository at once (deleted, or superseded by a new incarnation)."""
        repo = self._repos.pop(name, None)
        if repo is not None:
            repo.dead = True
            if repo.task is not None:
                repo.task.cancel()

    async def close(self) -> None:
        for name in list(self._repos):
            self.drop(name)

    async def _wait_version(self, repo: _Repo, version: int) -> None:
        async def reached() -> None:
            async with repo.changed:
                await repo.changed.wait_for(lambda: repo.dead or repo.state.version >= version)

        try:
            await asyncio.wait_for(reached(), self.wait_s)
        except TimeoutError:
            raise Unavailable(
                f"view of {repo.name} did not reach version {version}", name=repo.name
            ) from None
        if repo.dead:
            raise repo.error or NotFound(f"repository {repo.name} not found", name=repo.name)

    async def _run_follower(self, repo: _Repo, incarnation: int) -> None:
        after = 0
        try:
            while not repo.dead:
                async for event in self.ledger.subscribe(repo.name, incarnation, after):
                    if isinstance(event, SnapshotEvent):
                        repo.inline.update(event.inline)
                        await self._set_state(repo, event.state, rebuild=True)
                    elif isinstance(event, ChangeEvent):
                        await self._apply(repo, event)
                    after = repo.state.version
                    if repo.state.deleted:
                        self._end(repo, NotFound(f"repository {repo.name} was deleted"))
                        return
                await asyncio.sleep(0.05)  # the stream ended: follow again from here
        except asyncio.CancelledError:
            raise
        except EnrouteError as exc:
            self._end(repo, exc)
        except Exception as exc:  # a follower must never die silently
            log.exception("follower of %s failed", repo.name)
            self._end(repo, CorruptData(f"following {repo.name} failed: {exc}", section="view"))

    def _end(self, repo: _Repo, error: EnrouteError) -> None:
        repo.dead = True
        repo.error = error
        if self._repos.get(repo.name) is repo:
            del self._repos[repo.name]
        asyncio.get_running_loop().create_task(self._notify(repo))

    @staticmethod
    async def _notify(repo: _Repo) -> None:
        async with repo.changed:
            repo.changed.notify_all()

    async def _apply(self, repo: _Repo, event: ChangeEvent) -> None:
        rebuild = False
        for effect in event.change.effects:
            if isinstance(effect, LayersChanged):
                rebuild = True
                for entry, data in zip(effect.added, effect.added_data, strict=True):
                    if entry.kind is LayerKind.INLINE:
                        repo.inline[entry.root] = data
            if isinstance(effect, Deleted):
                rebuild = False
        state = apply_change(repo.state, event.change.effects, version=event.version)
        await self._set_state(repo, state, rebuild=rebuild)

    async def _set_state(self, repo: _Repo, state: RepoState, *, rebuild: bool) -> None:
        if rebuild and state.live:
            pairs = [(e, await self._reader(repo, e)) for e in state.manifest]
            view = await asyncio.to_thread(View, pairs, limits=self.limits)
            keep = {e.root for e in state.manifest}
            repo.readers = {k: v for k, v in repo.readers.items() if k in keep}
            repo.inline = {k: v for k, v in repo.inline.items() if k in keep}
            repo.view = view
        elif not state.live:
            repo.view = View(())
        repo.state = state
        async with repo.changed:
            repo.changed.notify_all()

    async def _reader(self, repo: _Repo, entry: LayerEntry) -> LayerReader:
        reader = repo.readers.get(entry.root)
        if reader is not None:
            return reader
        if entry.kind is LayerKind.INLINE:
            data = repo.inline.get(entry.root)
            if data is None:
                raise CorruptData(
                    f"bytes of inline layer {entry.root.hex()[:16]} are not known here",
                    section="view",
                )
            reader = LayerReader.open(
                BytesSource(data), meta_size=entry.meta_size, limits=self.limits
            )
        else:
            if self.layers is None or entry.key is None:
                raise Unavailable("no layer storage configured for stored layers")
            key = layer_key(repo.name, entry.key)
            opened = await self.layers.open_layer(
                storage_segment(repo.name), key, entry.file_size, entry.meta_size
            )
            data_end = entry.file_size - entry.meta_size
            pins = await self.layers.load(opened, ranges=[(0, data_end)] if data_end else [])
            pins.release()
            reader = opened.reader
        repo.readers[entry.root] = reader
        return reader

    async def read(self, name: str) -> Snapshot:
        """A snapshot after a read barrier (DESIGN "Read path")."""
        repo = await self.open(name)
        point = await self.ledger.barrier(name)
        if point.deleted:
            self.drop(name)
            raise NotFound(f"repository {name} not found", name=name)
        if point.incarnation != repo.state.incarnation:
            self.drop(name)
            repo = await self.open(name)
        await self._wait_version(repo, point.version)
        return repo.snapshot()

    async def read_or_empty(self, name: str) -> Snapshot | None:
        try:
            return await self.read(name)
        except NotFound:
            return None

    async def wait_applied(self, name: str, version: int) -> None:
        repo = self._repos.get(name)
        if repo is not None:
            with contextlib.suppress(EnrouteError):
                await self._wait_version(repo, version)

    # -- refs -----------------------------------------------------------------------------

    def ref_snapshot(self, snap: Snapshot | None) -> RefSnapshot:
        if snap is None or not snap.state.live:
            return RefSnapshot((), None)
        refs = tuple(
            Ref(name, value.oid, _peel(snap.view, value.oid))
            for name, value in sorted(snap.state.refs.items())
        )
        return RefSnapshot(refs, snap.state.head or None)

    # -- advertisement --------------------------------------------------------------------

    async def info_refs(self, name: str, service: Service, git_protocol: str) -> bytes:
        check_repo_name(name)
        version = protocol_version(git_protocol)
        if service == "git-upload-pack":
            if version == 2:
                await self.open(name)  # a missing repository is not found
                return encode_v2_capabilities()
            snap = await self.read(name)
            return encode_v0_advertisement(self.ref_snapshot(snap), service, version1=version == 1)
        # receive-pack: a missing repository advertises nothing; the push creates it.
        maybe = await self.read_or_empty(name)
        return encode_v0_advertisement(self.ref_snapshot(maybe), service, version1=version == 1)

    # -- fetch ----------------------------------------------------------------------------

    async def upload_pack(self, name: str, git_protocol: str, body: bytes) -> AsyncIterator[bytes]:
        check_repo_name(name)
        self.fetches += 1
        if protocol_version(git_protocol) == 2:
            async for chunk in self._upload_pack_v2(name, body):
                yield chunk
        else:
            async for chunk in self._upload_pack_v0(name, body):
                yield chunk

    async def _upload_pack_v2(self, name: str, body: bytes) -> AsyncIterator[bytes]:
        conv = pfetch.UploadPackV2(limits=self.limits)
        conv.feed(body)
        conv.feed_eof()
        while True:
            event = conv.next_event()
            if event is NEED_DATA or isinstance(event, pfetch.SessionEnd):
                return
            snap = await self.read(name)
            refs = self.ref_snapshot(snap)
            if isinstance(event, pfetch.LsRefsCommand):
                yield encode_ls_refs_response(event.request, refs)
                continue
            request = event.request
            wants = list(request.wants)
            wanted_refs: list[tuple[ObjectId, bytes]] = []
            by_name = {r.name: r.oid for r in refs.refs}
            for ref_name in request.want_refs:
                oid = by_name.get(ref_name)
                if oid is None:
                    raise ProtocolError(f"unknown ref {ref_name!r}", field="want-ref")
                wanted_refs.append((oid, ref_name))
                wants.append(oid)
            common = tuple(h for h in request.haves if snap.view.contains(h))
            ready = bool(common) or not request.haves
            plan: serve.PackPlan | None = None
            reply = pfetch.FetchReply(common, ready, wanted_refs=tuple(wanted_refs))
            if pfetch.sends_pack(request, reply):
                plan = await asyncio.to_thread(self._plan, snap, refs, request, wants, common)
                reply = pfetch.FetchReply(
                    common,
                    ready,
                    shallow=plan.shallow,
                    unshallow=plan.unshallow,
                    wanted_refs=tuple(wanted_refs),
                )
            yield pfetch.encode_fetch_head(request, reply)
            if plan is None:
                continue
            try:
                async for chunk in self._pack(snap, plan, progress=not request.no_progress):
                    yield chunk
            except EnrouteError as exc:
                yield fatal_error_bytes(exc, response_started=True, sideband=True)
                return
            yield FLUSH_PKT

    def _plan(
        self,
        snap: Snapshot,
        refs: RefSnapshot,
        request: pfetch.FetchRequest | pfetch.UploadRequestV0,
        wants: Iterable[ObjectId],
        haves: Iterable[ObjectId],
    ) -> serve.PackPlan:
        if isinstance(request, pfetch.FetchRequest):
            thin, ofs, include = request.thin_pack, request.ofs_delta, request.include_tag
        else:
            thin = request.has(b"thin-pack")
            ofs = request.has(b"ofs-delta")
            include = request.has(b"include-tag")
        tags = [r.oid for r in refs.refs if r.peeled is not None] if include else []
        deepen = request.deepen
        return serve.plan_fetch(
            snap.view,
            list(wants),
            list(haves),
            filter=_engine_filter(request.filter),
            thin=thin,
            ofs_delta=ofs,
            include_tag=tags,
            deepen=deepen.depth,
            deepen_relative=_deepen_relative(request),
            deepen_since=deepen.since,
            deepen_not=_deepen_not_oids(refs, deepen.not_refs),
            client_shallow=deepen.shallows,
        )

    def _shallow(
        self, snap: Snapshot, refs: RefSnapshot, request: pfetch.UploadRequestV0
    ) -> serve.Shallow:
        deepen = request.deepen
        return serve.plan_shallow(
            snap.view,
            request.wants,
            client_shallow=deepen.shallows,
            deepen=deepen.depth,
            deepen_relative=_deepen_relative(request),
            deepen_since=deepen.since,
            deepen_not=_deepen_not_oids(refs, deepen.not_refs),
        )

    async def _pack(
        self,
        snap: Snapshot,
        plan: serve.PackPlan,
        *,
        progress: bool,
        sideband_max: int | None = SIDEBAND_64K_DATA_BYTES_MAX,
    ) -> AsyncIterator[bytes]:
        """The pack in side-band (or raw when ``sideband_max`` is None), streamed from a thread."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=64)
        buffer = bytearray()

        def put(item: bytes | BaseException | None) -> None:
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()

        def frame(data: bytes) -> bytes:
            if sideband_max is None:
                return data
            return pfetch.encode_pack_data(data, sideband_max=sideband_max)

        def sink(data: bytes) -> None:
            buffer.extend(data)
            if len(buffer) >= PACK_BUFFER_BYTES:
                put(frame(bytes(buffer)))
                buffer.clear()

        def on_progress(event: serve.ProgressEvent) -> None:
            if progress and sideband_max is not None:
                text = f"{event.stage}: {event.done}/{event.total}\r"
                if event.done == event.total:
                    text = f"{event.stage}: {event.done}/{event.total}, done.\n"
                put(pfetch.encode_progress(text.encode()))

        def run() -> None:
            try:
                serve.write_pack(snap.view, plan, sink, progress=on_progress)
                if buffer:
                    put(frame(bytes(buffer)))
                put(None)
            except BaseException as exc:
                put(exc)

        worker = loop.run_in_executor(None, run)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            while not worker.done():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                await asyncio.sleep(0)
            await worker

    async def _upload_pack_v0(self, name: str, body: bytes) -> AsyncIterator[bytes]:
        conv = pfetch.UploadPackV0(limits=self.limits)
        conv.feed(body)
        conv.feed_eof()
        request: pfetch.UploadRequestV0 | None = None
        haves: list[ObjectId] = []
        snap = await self.read(name)
        refs = self.ref_snapshot(snap)
        while True:
            event = conv.next_event()
            if event is NEED_DATA or isinstance(event, pfetch.RequestEnd):
                return
            if isinstance(event, pfetch.WantList):
                request = event.request
                if not request.wants:
                    return
                if request.deepen.deepening:
                    # Right after the wants, before any acks (gitprotocol-pack, "Shallow
                    # update"); a stateless client's first request stops here.
                    bound = await asyncio.to_thread(self._shallow, snap, refs, request)
                    yield pfetch.encode_shallow_update(bound.shallow, bound.unshallow)
                continue
            assert request is not None
            common = [h for h in event.haves if snap.view.contains(h)]
            haves.extend(common)
            acks = pfetch.encode_v0_acks(
                request, event, frozenset(haves), ready=bool(haves) or event.done
            )
            yield acks.data
            if not acks.send_pack:
                continue
            plan = await asyncio.to_thread(self._plan, snap, refs, request, request.wants, haves)
            sideband = request.sideband_max
            progress = sideband is not None and not request.has(b"no-progress")
            try:
                async for chunk in self._pack(snap, plan, progress=progress, sideband_max=sideband):
                    yield chunk
            except EnrouteError as exc:
                yield fatal_error_bytes(exc, response_started=True, sideband=sideband is not None)
                return
            if sideband is not None:
                yield FLUSH_PKT
            return

    # -- push -----------------------------------------------------------------------------

    async def receive_pack(self, name: str, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        check_repo_name(name)
        conv = ReceivePack(limits=self.limits)
        request: PushRequest | None = None
        pack = bytearray()

        def drain() -> bool:
            nonlocal request
            while True:
                event = conv.next_event()
                if event is NEED_DATA:
                    return False
                if isinstance(event, PushRequest):
                    request = event
                elif isinstance(event, PackChunk):
                    pack.extend(event.data)
                    check_limit(
                        "ingest_pack_bytes_max", len(pack), self.limits.ingest_pack_bytes_max
                    )
                elif isinstance(event, PushEnd):
                    return True

        async for chunk in body:
            conv.feed(chunk)
            drain()
        conv.feed_eof()
        drain()
        if request is None or not request.commands:
            return
        self.pushes += 1
        report = await self._push(name, request, bytes(pack))
        yield report

    async def _push(self, name: str, request: PushRequest, pack: bytes) -> bytes:
        commands = request.commands
        repo = await self.open(name, CreateMode.IMPLICIT)
        snap = repo.snapshot()
        tips = [c.new for c in commands if not c.is_delete]
        result: IngestResult | None = None

        def refuse_all(reason: bytes, unpack: bytes | None = None) -> bytes:
            statuses = tuple(ReportStatus(c.ref, reason) for c in commands)
            return encode_report_bytes(PushReport(unpack, statuses), request)

        if pack and tips:
            try:
                result = await asyncio.to_thread(
                    ingest_pack, BytesSource(pack), tips, snap.view, limits=self.limits
                )
            except EnrouteError as exc:
                if exc.mapping.git_form is GitForm.REF:
                    return refuse_all(git_message(exc))
                return refuse_all(b"unpacker error", git_message(exc))
        new_layer = None
        if result is not None and result.sealed is not None:
            sealed = result.sealed
            assert result.data is not None
            if sealed.file_size <= self.inline_max_bytes or self.layers is None:
                new_layer = result.new_layer(inline=True)
                repo.inline[sealed.root] = result.data
            else:
                gen = snap.state.upload_gen
                key = layer_key(name, layer_key_name(gen, sealed.root))
                await self.layers.publish(storage_segment(name), key, result.data)
                new_layer = result.new_layer(inline=False, upload_gen=gen)
        command = Commit(
            incarnation=snap.state.incarnation,
            ref_updates=tuple(
                RefUpdate(
                    c.ref,
                    None if c.old == ZERO_OID else c.old,
                    None if c.new == ZERO_OID else c.new,
                )
                for c in commands
            ),
            new_layer=new_layer,
            stamp_us=self.clock.now_us(),
            is_push=True,
            atomic=request.has(b"atomic"),
        )
        try:
            proposed = await self.ledger.propose(name, snap.state.incarnation, command)
        except IncarnationEnded as exc:
            self.drop(name)
            return refuse_all(git_message(exc))
        except EnrouteError as exc:
            return refuse_all(git_message(exc))
        await self.wait_applied(name, proposed.version)
        return encode_report_bytes(_report(proposed.change, request), request)

    # -- API commits ----------------------------------------------------------------------

    async def create_commit(self, request: CommitRequest) -> BuiltCommit:
        """DESIGN "API commits": build on the expected parent, ingest, move the branch by CAS.

        The repository must exist (API commits never create one). A stale
        ``expected_oid`` raises :class:`StaleRef` with ``current_oid`` (None when
        unborn), before anything is built and again from the ledger's CAS. The
        entry is not a push, so it leaves the last push time (seed 001, "Last push").
        """
        name = request.repo
        check_repo_name(name)
        ref = branch_ref(request.branch)
        snap = await self.read(name)
        current = snap.state.refs.get(ref)
        if (None if current is None else current.oid) != request.expected_oid:
            raise _stale(ref, None if current is None else current.oid)
        now_us = self.clock.now_us()
        built = await asyncio.to_thread(
            build_commit, snap.view.read, request, now_us, limits=self.limits
        )
        result = await asyncio.to_thread(
            ingest_pack, BytesSource(built.pack()), [built.oid], snap.view, limits=self.limits
        )
        command = Commit(
            incarnation=snap.state.incarnation,
            ref_updates=(RefUpdate(ref, request.expected_oid, built.oid),),
            new_layer=await self._api_layer(name, snap, result),
            stamp_us=now_us,
            is_push=False,
            atomic=True,
        )
        try:
            proposed = await self.ledger.propose(name, snap.state.incarnation, command)
        except IncarnationEnded:
            self.drop(name)
            raise NotFound(f"repository {name} not found", name=name) from None
        refused = proposed.change.outcome.error()
        if refused is not None:
            raise refused
        await self.wait_applied(name, proposed.version)
        return built

    async def _api_layer(self, name: str, snap: Snapshot, result: IngestResult) -> NewLayer | None:
        """The layer of an API commit: inline when small, else stored, as for a push."""
        sealed = result.sealed
        if sealed is None:
            return None
        assert result.data is not None
        if sealed.file_size <= self.inline_max_bytes or self.layers is None:
            repo = self._repos.get(name)
            if repo is not None:
                repo.inline[sealed.root] = result.data
            return result.new_layer(inline=True)
        gen = snap.state.upload_gen
        key = layer_key(name, layer_key_name(gen, sealed.root))
        await self.layers.publish(storage_segment(name), key, result.data)
        return result.new_layer(inline=False, upload_gen=gen)


def _stale(ref: bytes, current: ObjectId | None) -> StaleRef:
    shown = ref.decode("utf-8", "replace")
    current_hex = None if current is None else current.hex()
    return StaleRef(
        f"{shown} is at {current_hex or 'nothing (unborn)'}, not the expected value",
        ref=shown,
        current_oid=current_hex,
    )


def encode_report_bytes(report: PushReport, request: PushRequest) -> bytes:
    return encode_report(report, request)


def _report(change: Change, request: PushRequest) -> PushReport:
    results = {r.name: r for r in change.refs}
    fallback = change.outcome.message.encode() or b"refused"
    statuses: list[ReportStatus] = []
    for c in request.commands:
        r = results.get(c.ref)
        if r is not None and r.status is RefStatus.OK:
            statuses.append(ReportStatus(c.ref))
        elif r is not None:
            statuses.append(ReportStatus(c.ref, (r.reason or fallback.decode()).encode()))
        elif change.outcome.ok:
            statuses.append(ReportStatus(c.ref))
        else:
            statuses.append(ReportStatus(c.ref, fallback))
    return PushReport(None, tuple(statuses))


def _peel(view: View, oid: ObjectId) -> ObjectId | None:
    """What an annotated tag finally names (None for anything else)."""
    found = view.read(oid)
    if found is None or found[0] is not ObjectType.TAG:
        return None
    target = oid
    for _ in range(64):
        found = view.read(target)
        if found is None or found[0] is not ObjectType.TAG:
            return target
        target = Tag.parse(found[1]).object
    return target


def _deepen_relative(request: pfetch.FetchRequest | pfetch.UploadRequestV0) -> bool:
    """v2 sends a ``deepen-relative`` line; v0/v1 name it among the capabilities."""
    if isinstance(request, pfetch.UploadRequestV0):
        return request.deepen.relative or request.has(b"deepen-relative")
    return request.deepen.relative


def _deepen_not_oids(refs: RefSnapshot, names: Iterable[bytes]) -> list[ObjectId]:
    """Each ``deepen-not`` name resolved as git's upload-pack does (the ref DWIM rules
    of gitrevisions, "<refname>"); a name matching no ref, or several, is refused."""
    by_name = {r.name: r.oid for r in refs.refs}
    out: list[ObjectId] = []
    for name in names:
        rules = (b"%s", b"refs/%s", b"refs/tags/%s", b"refs/heads/%s", b"refs/remotes/%s")
        found = [by_name[r % name] for r in rules if r % name in by_name]
        head = b"refs/remotes/%s/HEAD" % name
        if head in by_name:
            found.append(by_name[head])
        if len(found) != 1:
            what = "ambiguous" if found else "unknown"
            raise ProtocolError(f"{what} deepen-not: {name.decode(errors='replace')}")
        out.append(found[0])
    return out


def _engine_filter(spec: pfetch.Filter | None) -> serve.FetchFilter | None:
    if spec is None:
        return None
    if isinstance(spec, pfetch.BlobNone):
        return serve.BlobNone()
    if isinstance(spec, pfetch.BlobLimit):
        return serve.BlobLimit(spec.bytes_max)
    return serve.TreeDepth(spec.depth)


def protocol_version(git_protocol: str) -> int:
    """The version a ``Git-Protocol`` header asks for (gitprotocol-http: ``version=2``)."""
    version = 0
    for item in git_protocol.split(":"):
        key, _, value = item.partition("=")
        if key.strip() == "version" and value.strip() in ("1", "2"):
            version = max(version, int(value.strip()))
    return version
