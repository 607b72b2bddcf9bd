"""Fetch (upload-pack) for the hosted repositories: advertisement, negotiation, the pack.

A read barrier (DESIGN "Read path"), the refs, then the v2 or v0 conversation
(``enroute_core.protocol.fetch``); the pack is planned with ``plan_fetch`` and
written with ``write_pack`` in side-band-64k with progress, from a worker thread
so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Generic, TypeVar

from enroute_compute.host import REQUEST_ID, RepositoryHost, Snapshot
from enroute_compute.push import KEEPALIVE_S
from enroute_compute.work import Abandoned, check
from enroute_core.base.clock import Clock
from enroute_core.base.errors import EnrouteError, MissingObject, ProtocolError
from enroute_core.base.ids import ObjectId
from enroute_core.engine import serve
from enroute_core.engine.view import View
from enroute_core.git.pktline import FLUSH_PKT, NEED_DATA
from enroute_core.git.sideband import (
    BAND_PACK,
    SIDEBAND_64K_DATA_BYTES_MAX,
    sideband_parts,
    sideband_pkt,
)
from enroute_core.protocol import fetch as pfetch
from enroute_core.protocol._common import RefSnapshot
from enroute_core.protocol.advertise import Service, encode_v0_advertisement, encode_v2_capabilities
from enroute_core.protocol.errors import fatal_error_bytes
from enroute_core.protocol.lsrefs import encode_ls_refs_response
from enroute_core.protocol.progress import ProgressMeter
from enroute_core.state import RepoState
from enroute_core.state.names import check_repo_name
from enroute_core.storage.layers import LOAD_KIND, LayerService
from enroute_core.storage.machines import drive

log = logging.getLogger(__name__)

REF_SNAPSHOTS_KEPT = 1024
"""Repositories whose last ref snapshot is kept (all are dropped when it is reached)."""
PLANS_KEPT = 256
"""Repositories whose last pack plan is kept (all are dropped when it is reached)."""
QUEUE_PIECES = 16
"""Pieces of the pack (256 to 512 KiB each, ``serve._FLUSH_BYTES``) written ahead of the
client: the writer thread stops there until the answer takes one."""
UPLOAD_KEEPALIVE = sideband_pkt(BAND_PACK, b"")
"""upload-pack's keepalive, ``0005\\x01``: an empty pack packet (upload-pack.c
``create_pack_file``, sent after ``uploadpack.keepAlive`` seconds without output)."""

_T = TypeVar("_T")


class _Waiting(Generic[_T]):
    """An awaitable run as a task, and the keepalives due while it runs: a plan that
    takes long must not leave the answer silent past a proxy's read timeout."""

    def __init__(self, work: Awaitable[_T]) -> None:
        self.task: asyncio.Future[_T] = asyncio.ensure_future(work)

    async def silences(self, every_s: float = KEEPALIVE_S) -> AsyncIterator[None]:
        """One item per ``every_s`` the work is still running."""
        while not (await asyncio.wait({self.task}, timeout=every_s))[0]:
            yield

    def result(self) -> _T:
        return self.task.result()

    def cancel(self) -> None:
        self.task.cancel()


def bulk_thread() -> None:
    """Run the calling thread under ``SCHED_BATCH`` (Linux; elsewhere nothing changes).

    A pack writer is bulk work: it streams hundreds of MiB of stored bytes as fast as
    the client takes them, and it wakes each time the answer drains. Woken under the
    default policy it preempts whatever runs on its core: the event loop's small
    requests, and on a machine it shares with its clients, a git client's
    one-threaded receiving phase. ``SCHED_BATCH`` keeps its priority (its nice value
    and its share of the CPU) and only gives up that wakeup preemption
    (docs/serving.md, "Pack writers": what it did to a large clone's wall)."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError as exc:  # a sandbox may refuse it: the thread runs as before
        log.debug("pack writer stays under the default scheduling policy: %s", exc)


class Fetcher:
    """The read side of the Git protocol over a :class:`RepositoryHost`."""

    def __init__(self, host: RepositoryHost, *, pack_writers: int = 64) -> None:
        self.host = host
        # pack writers wait on their clients: on asyncio's default pool (a few threads)
        # slow clients would starve planning, layer loads and object-store calls
        self._writers = ThreadPoolExecutor(
            pack_writers, thread_name_prefix="pack-writer", initializer=bulk_thread
        )
        self._refs: dict[str, tuple[RepoState, RefSnapshot]] = {}
        self._plans: dict[str, tuple[RepoState, tuple[object, ...], serve.PackPlan]] = {}
        """The last plan per repository, by the state its view was set with (one view
        per state): clones of an unchanged repository ask the same and get the same."""
        host.unhost_listeners.append(self._forget)

    def _forget(self, name: str) -> None:
        """The view of ``name`` went: the ref snapshot and plan kept for it name a state
        no view will have again (a re-opened view starts from a new snapshot)."""
        self._refs.pop(name, None)
        self._plans.pop(name, None)

    def close(self) -> None:
        """Let the pack writers end with their streams; no new ones start."""
        self._writers.shutdown(wait=False, cancel_futures=True)

    async def _ref_snapshot(self, snap: Snapshot) -> RefSnapshot:
        """The refs with their peeled values, made once per state of a repository (every
        ls-refs and advertisement of an unchanged repository answers the same); the
        tags it peels are loaded first."""
        found = self._refs.get(snap.name)
        if found is not None and found[0] is snap.state:  # a view is set with its state
            return found[1]
        refs = await self.host.ref_snapshot_loaded(snap)
        if len(self._refs) >= REF_SNAPSHOTS_KEPT:
            self._refs.clear()
        self._refs[snap.name] = (snap.state, refs)
        return refs

    # -- advertisement --------------------------------------------------------------------

    async def info_refs(self, name: str, service: Service, git_protocol: str) -> bytes:
        check_repo_name(name)
        version = protocol_version(git_protocol)
        if service == "git-upload-pack":
            if version == 2:
                await self.host.open(name)  # a missing repository is not found
                return encode_v2_capabilities()
            snap = await self.host.read(name)
            refs = await self._ref_snapshot(snap)
            return encode_v0_advertisement(refs, service, version1=version == 1)
        # receive-pack: a missing repository advertises nothing; the push creates it.
        maybe = await self.host.read_or_empty(name)
        return encode_v0_advertisement(
            await self.host.ref_snapshot_loaded(maybe), service, version1=version == 1
        )

    # -- fetch ----------------------------------------------------------------------------

    async def upload_pack(self, name: str, git_protocol: str, body: bytes) -> AsyncIterator[bytes]:
        check_repo_name(name)
        self.host.fetches += 1
        started = False
        # Every snapshot read below pins its layers' local copies until the answer ends.
        with contextlib.ExitStack() as pins:
            conversation = (
                self._upload_pack_v2(name, body, pins)
                if protocol_version(git_protocol) == 2
                else self._upload_pack_v0(name, body, pins)
            )
            try:
                async for chunk in conversation:
                    started = True
                    yield chunk
            except EnrouteError as exc:
                if started:
                    raise  # the conversation broke midway: the response is cut
                # A refusal before the first byte (a filter or a want count refused by
                # the parser, a repository gone): one ERR packet in a 200 answer, which
                # git shows as "fatal: remote error: <reason>" (fetch-pack reads with
                # PACKET_READ_DIE_ON_ERR_PACKET); an HTTP error body it never shows.
                yield _failed(name, exc, response_started=False, sideband=False)

    async def _upload_pack_v2(
        self, name: str, body: bytes, pins: contextlib.ExitStack
    ) -> AsyncIterator[bytes]:
        conv = pfetch.UploadPackV2(limits=self.host.limits, wants_max=await self._wants_max(name))
        conv.feed(body)
        conv.feed_eof()
        while True:
            event = conv.next_event()
            if event is NEED_DATA or isinstance(event, pfetch.SessionEnd):
                return
            if isinstance(event, pfetch.LsRefsCommand):
                snap = await self.host.read(name)  # a ref read: behind a barrier
            else:
                snap = self._without_barrier(name, event.request) or await self.host.read(name)
            pins.enter_context(self.host.pin_reads(snap))
            refs = await self._ref_snapshot(snap)
            if isinstance(event, pfetch.LsRefsCommand):
                yield encode_ls_refs_response(event.request, refs)
                continue
            request = event.request
            try:
                wants, wanted_refs = _v2_wants(snap, refs, request)
            except EnrouteError as exc:
                # Nothing of this response is sent yet: one ERR packet ends it
                # (gitprotocol-v2, "Packet-Line Framing": an error packet at any point).
                yield _failed(name, exc, response_started=False, sideband=False)
                return
            common = tuple(h for h in request.haves if snap.view.contains(h))
            ready = not request.haves or (
                not request.done and bool(common) and await self._ready(snap, wants, common)
            )
            plan: serve.PackPlan | None = None
            reply = pfetch.FetchReply(common, ready, wanted_refs=tuple(wanted_refs))
            head_sent = False
            if pfetch.sends_pack(request, reply):
                # A plan that takes longer than KEEPALIVE_S: the head goes out (unless
                # its shallow-info needs the plan) and keepalives follow until the plan
                # is made, as upload-pack sends them while pack-objects counts.
                planning = _Waiting(self._planned(snap, refs, request, wants, common))
                try:
                    async for _ in planning.silences():
                        if not head_sent:
                            if request.deepen.deepening or request.deepen.shallows:
                                continue
                            yield pfetch.encode_fetch_head(request, reply)
                            head_sent = True
                        yield UPLOAD_KEEPALIVE
                    plan = planning.result()
                except EnrouteError as exc:
                    yield _failed(name, exc, response_started=head_sent, sideband=head_sent)
                    return
                finally:
                    planning.cancel()
                reply = pfetch.FetchReply(
                    common,
                    ready,
                    shallow=plan.shallow,
                    unshallow=plan.unshallow,
                    wanted_refs=tuple(wanted_refs),
                )
            if not head_sent:
                yield pfetch.encode_fetch_head(request, reply)
            if plan is None:
                continue
            try:
                async for chunk in self._pack(snap, plan, progress=not request.no_progress):
                    yield chunk
            except EnrouteError as exc:
                yield _failed(name, exc, response_started=True, sideband=True)
                return
            yield FLUSH_PKT

    async def _wants_max(self, name: str) -> int:
        """The wants one request may carry here (``pfetch.wants_max``): a clone sends one
        per ref, so the bound follows the repository's ref count. The view as it stands
        counts; a repository not hosted here yet is read first (its error, if any, comes
        where it came before, so the configured bound stands in)."""
        snap = self.host.peek(name)
        if snap is None:
            with contextlib.suppress(EnrouteError):
                snap = await self.host.read(name)
        return pfetch.wants_max(self.host.limits, 0 if snap is None else len(snap.state.refs))

    def _without_barrier(
        self, name: str, request: pfetch.FetchRequest | pfetch.UploadRequestV0
    ) -> Snapshot | None:
        """The view as it stands when it can answer ``request`` without a barrier.

        DESIGN "Read path": the ref reads of a fetch (ls-refs, the v0 advertisement) go
        behind a barrier; the objects of a pack may come from the view as it is. A
        request that names refs (``want-ref``, ``deepen-not``) or wants an object the
        view lacks (it may lag the refs the client saw) still reads behind one.
        """
        if request.deepen.not_refs or (
            isinstance(request, pfetch.FetchRequest) and request.want_refs
        ):
            return None
        snap = self.host.peek(name)
        if snap is None or not all(snap.view.contains(w) for w in request.wants):
            return None
        return snap

    async def _planned(
        self,
        snap: Snapshot,
        refs: RefSnapshot,
        request: pfetch.FetchRequest | pfetch.UploadRequestV0,
        wants: Iterable[ObjectId],
        haves: Iterable[ObjectId],
    ) -> serve.PackPlan:
        """:meth:`_plan` with what it reads loaded first: tree walks level by level,
        tags peeled (seed 004, "Machines"; ``RepositoryHost.run_read``)."""
        wants, haves = list(wants), list(haves)
        return await self.host.run_read(
            snap.view, partial(self._plan, snap, refs, request, wants, haves), kind="plan"
        )

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
        wants, haves = list(wants), list(haves)
        filter_ = _engine_filter(request.filter)
        relative = _deepen_relative(request)
        deepen_not = _deepen_not_oids(refs, deepen.not_refs)
        key = (tuple(wants), tuple(haves), filter_, thin, ofs, tuple(tags), deepen.depth,
               relative, deepen.since, tuple(deepen_not), tuple(deepen.shallows))  # fmt: skip
        found = self._plans.get(snap.name)
        if found is not None and found[0] is snap.state and found[1] == key:
            return found[2]  # the same request of the same view: the same plan
        plan = serve.plan_fetch(
            snap.view,
            wants,
            haves,
            filter=filter_,
            thin=thin,
            ofs_delta=ofs,
            include_tag=tags,
            deepen=deepen.depth,
            deepen_relative=relative,
            deepen_since=deepen.since,
            deepen_not=deepen_not,
            client_shallow=deepen.shallows,
        )
        if len(self._plans) >= PLANS_KEPT:
            self._plans.clear()
        self._plans[snap.name] = (snap.state, key, plan)
        return plan

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

    async def _ready(
        self, snap: Snapshot, wants: Sequence[ObjectId], common: Sequence[ObjectId]
    ) -> bool:
        """``serve.ready_to_pack`` off the event loop: a walk of the wants' history."""
        return await self.host.run_read(
            snap.view, partial(serve.ready_to_pack, snap.view, wants, common), kind="plan"
        )

    async def _pack(
        self,
        snap: Snapshot,
        plan: serve.PackPlan,
        *,
        progress: bool,
        sideband_max: int | None = SIDEBAND_64K_DATA_BYTES_MAX,
    ) -> AsyncIterator[bytes]:
        """The pack in side-band (or raw when ``sideband_max`` is None), streamed from a
        pack-writer thread (:class:`_PackStream`), or driven as a load-ahead machine when
        the view's layers are not all here."""
        stream = _PackStream(plan, self.host.clock, progress=progress, sideband_max=sideband_max)
        layers = self.host.layers
        machine: serve.PackMachine | None = None
        if layers is not None and not snap.view.settled():
            # Seed 004, "Machines": the pack writer as a load-ahead machine; batch k+1
            # loads while batch k is written, and the writer never reads what was not
            # loaded. A view whose layers are all here writes at once (the fast path).
            machine = serve.PackMachine(
                snap.view, plan, stream.sink, progress=stream.on_progress, limits=self.host.limits
            )
        loop = stream.loop
        started = loop.time()
        loaded_before = 0 if layers is None else sum(layers.loaded_bytes.values())
        if machine is None:
            worker = loop.run_in_executor(self._writers, stream.write, snap.view)
        else:
            assert layers is not None
            worker = asyncio.ensure_future(self._drive(stream, machine, layers))
        first = True
        try:
            async with contextlib.aclosing(stream.pieces(worker, machine is not None)) as pieces:
                async for piece in pieces:
                    if first:
                        first = False
                        self.host.first_pack_byte_s.append(loop.time() - started)
                        if layers is not None:
                            loaded = sum(layers.loaded_bytes.values()) - loaded_before
                            self.host.first_pack_byte_loaded_bytes = loaded
                    yield piece
        finally:
            self.host.release_after_fetch(plan.object_count)

    async def _drive(
        self, stream: _PackStream, machine: serve.PackMachine, layers: LayerService
    ) -> None:
        """The load-ahead machine's run: loads on the event loop, writes on a pack writer."""
        token = LOAD_KIND.set("fetch")
        try:
            stats = await drive(machine, layers, executor=self._writers)
            self.host.load_rounds["fetch"] += stats.tickets
            stream.totals(machine.stats)
            stream.end()
        except Abandoned:
            pass  # nobody reads the rest
        except Exception as exc:
            if not stream.gone.is_set():
                stream.hand(exc)
        finally:
            LOAD_KIND.reset(token)
            machine.release()

    async def _upload_pack_v0(
        self, name: str, body: bytes, pins: contextlib.ExitStack
    ) -> AsyncIterator[bytes]:
        conv = pfetch.UploadPackV0(limits=self.host.limits, wants_max=await self._wants_max(name))
        conv.feed(body)
        conv.feed_eof()
        request: pfetch.UploadRequestV0 | None = None
        haves: list[ObjectId] = []
        snap: Snapshot | None = None
        refs = RefSnapshot((), None)
        while True:
            event = conv.next_event()
            if event is NEED_DATA or isinstance(event, pfetch.RequestEnd):
                return
            if isinstance(event, pfetch.WantList):
                request = event.request
                if not request.wants:
                    return
                try:
                    snap, refs = await self._v0_snapshot(name, request)
                    pins.enter_context(self.host.pin_reads(snap))
                    _deepen_not_oids(refs, request.deepen.not_refs)
                except EnrouteError as exc:
                    # Before any shallow line, ACK or NAK: git shows the ERR packet.
                    yield _failed(name, exc, response_started=False, sideband=False)
                    return
                if request.deepen.deepening:
                    # Right after the wants, before any acks (gitprotocol-pack, "Shallow
                    # update"); a stateless client's first request stops here.
                    try:
                        bound = await self.host.run_read(
                            snap.view, partial(self._shallow, snap, refs, request), kind="plan"
                        )
                    except EnrouteError as exc:
                        yield _failed(name, exc, response_started=False, sideband=False)
                        return
                    yield pfetch.encode_shallow_update(bound.shallow, bound.unshallow)
                continue
            assert request is not None and snap is not None
            common = [h for h in event.haves if snap.view.contains(h)]
            haves.extend(common)
            ready = event.done or (bool(haves) and await self._ready(snap, request.wants, haves))
            acks = pfetch.encode_v0_acks(request, event, frozenset(haves), ready=ready)
            yield acks.data
            if not acks.send_pack:
                continue
            async for chunk in self._v0_pack(name, snap, refs, request, haves):
                yield chunk
            return

    async def _v0_snapshot(
        self, name: str, request: pfetch.UploadRequestV0
    ) -> tuple[Snapshot, RefSnapshot]:
        """The view a v0 request is answered from, its wants checked: the view as it
        stands when it holds the wants and they pass (the advertisement the client saw
        was read behind a barrier); else read behind one and check again."""
        snap = self._without_barrier(name, request)
        if snap is not None:
            refs = await self._ref_snapshot(snap)
            if await self.host.run_read(
                snap.view, partial(_wants_ok, snap, refs, request.wants), kind="plan"
            ):
                return snap, refs
        snap = await self.host.read(name)
        refs = await self._ref_snapshot(snap)
        await self.host.run_read(
            snap.view, partial(_check_v0_wants, snap, refs, request.wants), kind="plan"
        )
        return snap, refs

    async def _v0_pack(
        self,
        name: str,
        snap: Snapshot,
        refs: RefSnapshot,
        request: pfetch.UploadRequestV0,
        haves: list[ObjectId],
    ) -> AsyncIterator[bytes]:
        """After the ACK or NAK: keepalives while the plan is made, then the pack."""
        sideband = request.sideband_max
        planning = _Waiting(self._planned(snap, refs, request, request.wants, haves))
        try:
            async for _ in planning.silences():
                if sideband is not None:  # after NAK or ACK the answer is side-band
                    yield UPLOAD_KEEPALIVE
            plan = planning.result()
        finally:
            planning.cancel()
        progress = sideband is not None and not request.has(b"no-progress")
        try:
            async for chunk in self._pack(snap, plan, progress=progress, sideband_max=sideband):
                yield chunk
        except EnrouteError as exc:
            yield _failed(name, exc, response_started=True, sideband=sideband is not None)
            return
        if sideband is not None:
            yield FLUSH_PKT


class _PackStream:
    """One pack on its way to the answer: pieces handed from the writer to the event loop.

    The writer hands each piece over without waiting for the event loop (a deque and
    one wake-up of the loop per piece), at most :data:`QUEUE_PIECES` ahead of the
    answer; a piece's progress lines and side-band frames are joined in one copy.
    """

    def __init__(
        self, plan: serve.PackPlan, clock: Clock, *, progress: bool, sideband_max: int | None
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.plan = plan
        self.clock = clock  # paces the progress lines
        self.sideband_max = sideband_max
        self.ready: deque[bytes | BaseException | None] = deque()
        self.arrived = asyncio.Event()
        self.slots = threading.Semaphore(QUEUE_PIECES)  # taken per piece, given back when sent
        self.gone = threading.Event()  # set when the answer is dropped: the writer stops
        self.pending: list[bytes] = []  # progress packets: they go out with the next piece
        # git-upload-pack's phases (pack-objects' progress): the plan enumerated and
        # counted the objects; writing shows its percentage; a total line ends it
        self.meter = meter = ProgressMeter(shown=progress and sideband_max is not None)
        count = plan.object_count
        self.pending.extend(
            p
            for p in (
                meter.finish("Enumerating objects", count),
                meter.finish("Counting objects", count, count),
            )
            if p
        )

    def hand(self, item: bytes | BaseException | None) -> None:
        """On the loop: ``item`` is next (the end, an error)."""
        self.ready.append(item)
        self.arrived.set()

    def end(self) -> None:
        """On the loop: the progress left, then the end."""
        if self.pending:
            self.hand(b"".join(self.pending))
        self.hand(None)

    def put(self, item: bytes | BaseException | None) -> None:
        """From the writer thread: wait for a slot, then hand ``item`` over."""
        self.slots.acquire()
        check(self.gone)  # the answer was dropped while this waited (its slots were freed)
        self.ready.append(item)
        self.loop.call_soon_threadsafe(self.arrived.set)

    def sink(self, data: bytes) -> None:
        """write_pack hands over pieces of 256-512 KiB, which it does not touch again:
        each becomes one message, with the progress since the last one before it."""
        pending = self.pending
        if self.sideband_max is not None:
            frames = sideband_parts(BAND_PACK, data, max_payload=self.sideband_max)
            data = b"".join([*pending, *frames])  # the piece's one copy here
            pending.clear()
        elif pending:
            data = b"".join([*pending, data])
            pending.clear()
        self.put(data if type(data) is bytes else bytes(data))

    def on_progress(self, event: serve.ProgressEvent) -> None:
        meter = self.meter
        if event.done >= event.total:
            drawn = meter.finish(event.stage, event.done, event.total)
        else:
            now_ns = self.clock.monotonic_ns()
            drawn = meter.update(event.stage, event.done, event.total, now_ns)
        if drawn:
            self.pending.append(drawn)

    def totals(self, stats: serve.WriteStats | None) -> None:
        if stats is not None and self.meter.shown:
            reused = stats.copied + stats.ofs_rewritten + stats.thin_kept
            self.pending.append(self.meter.line(
                f"Total {stats.object_count}, reused {reused}, resolved {stats.resolved}"
            ))  # fmt: skip

    def write(self, view: View) -> None:
        """On a pack-writer thread: the whole pack, then the end (or the error)."""
        try:
            stats = serve.write_pack(view, self.plan, self.sink, progress=self.on_progress)
            self.totals(stats)
            if self.pending:
                self.put(b"".join(self.pending))
            self.put(None)
        except Abandoned:
            pass  # nobody reads the rest
        except BaseException as exc:
            with contextlib.suppress(Abandoned):
                self.put(exc)

    async def pieces(
        self, worker: asyncio.Future[None], cancel: bool
    ) -> AsyncGenerator[bytes, None]:
        """The pieces as they come; when the answer stops early the writer is stopped
        (``cancel``: a machine's loads too) and waited for."""
        ready, arrived = self.ready, self.arrived
        try:
            while True:
                while not ready:
                    arrived.clear()
                    if not ready:
                        await arrived.wait()
                item = ready.popleft()
                self.slots.release()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.gone.set()  # a no-op once the pack is all out
            for _ in range(QUEUE_PIECES):
                self.slots.release()  # a writer waiting for a slot wakes and stops (Abandoned)
            if cancel and not worker.done():
                worker.cancel()  # its loads stop; the writer thread stops at its next piece
            while not worker.done():
                await asyncio.sleep(0)
            if not worker.cancelled():
                await worker  # done: its own outcome (the writer's were queued above)


def _failed(name: str, exc: EnrouteError, *, response_started: bool, sideband: bool) -> bytes:
    """The ``ERR`` (or side-band 3) answer to a fetch that failed. A failure of this
    server (5xx in the error table, e.g. corrupt data) is logged once here; a
    client's own error (a want we lack) is only answered."""
    if exc.mapping.http_status >= 500:
        log.error(
            "request %s failed: %s: %s (upload-pack of %s, answered with ERR)",
            REQUEST_ID.get().hex(),
            exc.code,
            exc.message,
            name,
        )
    return fatal_error_bytes(exc, response_started=response_started, sideband=sideband)


def _check_v0_wants(snap: Snapshot, refs: RefSnapshot, wants: Iterable[ObjectId]) -> None:
    """git's stateless ``check_non_tip``: every want a tip or reachable from one."""
    tips = [r.oid for r in refs.refs] + [r.peeled for r in refs.refs if r.peeled]
    serve.check_wants(snap.view, wants, tips=tips)


def _wants_ok(snap: Snapshot, refs: RefSnapshot, wants: Iterable[ObjectId]) -> bool:
    try:
        _check_v0_wants(snap, refs, wants)
    except MissingObject:
        return False
    return True


def _v2_wants(
    snap: Snapshot, refs: RefSnapshot, request: pfetch.FetchRequest
) -> tuple[list[ObjectId], list[tuple[ObjectId, bytes]]]:
    """The wants of a v2 fetch with its ``want-ref`` names resolved, all checked
    against the repository before the response starts (gitprotocol-v2, "fetch")."""
    wants = list(request.wants)
    wanted_refs: list[tuple[ObjectId, bytes]] = []
    by_name = {r.name: r.oid for r in refs.refs}
    for ref_name in request.want_refs:
        oid = by_name.get(ref_name)
        if oid is None:
            text = ref_name.decode(errors="replace")
            raise ProtocolError(f"upload-pack: unknown ref {text}", field="want-ref")
        wanted_refs.append((oid, ref_name))
        wants.append(oid)
    serve.check_wants(snap.view, wants)
    _deepen_not_oids(refs, request.deepen.not_refs)
    return wants, wanted_refs


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
