"""Writes to the hosted repositories: Git pushes (receive-pack) and API commits.

Push (services.md, "Compute semantics"): parse the receive-pack request
(``enroute_core.protocol.receive``), spool the pack, ingest it against the
view, make the layer inline (small) or stored (published with the state's
``upload_gen``), propose a ``Commit`` with compare-and-swap ref updates
(atomic when the client asked), and turn the applied Change into
report-status. A push to a missing repository activates it implicitly.

Memory (seed 004, "Storage service" and "Pages and memory"; docs/ingest.md):
the pack is spooled to a scratch file as it arrives and ingested from there,
and the layer is built in a second scratch file that publishing moves into
place; only an inline layer (at most ``layers.inline_max``) is read back into
memory. What a push holds is then ingest's bounded cache and its per-object
words, whatever the size of the pack.

Streaming (docs/ingest.md, "Speed"): the ingest starts at the pack's first chunk and
reads the spool while it is written (``storage.growing``), as ``git index-pack --stdin``
indexes while ``pack-objects`` sends, when one of ``limits.ingest_streams_max`` slots
is free; otherwise, or once a streamed ingest is cut off by its receive deadline
(``limits.ingest_stream_receive_ms_max``), the push ingests after its body is in. The
body's faults stay the receive loop's: a streamed ingest whose body went (or went
over the bound) is stopped, and the push fails or is refused as it would unstreamed.

Progress and keepalive (docs/protocol.md, "Push progress"): once the client's
pack is all in, the push runs as a task while this generator relays what it
says on side-band channel 2 (``Receiving pack``, ``Indexing objects``,
``Checking connectivity``, ``Writing layer``, ``Storing layer``, ``Committing
ref updates``; not under ``quiet``), and sends receive-pack's keepalive
(``0005\\x01``) after :data:`KEEPALIVE_S` without output, through the commit's
wait included, so that no proxy between client and server times the push out.

Refusals are answered in the report, as git's receive-pack answers them
(``unpack <reason>`` and ``ng <ref> <reason>``): a pack over
``ingest_pack_bytes_max`` is read to its end and refused there, since a client
still sending takes no answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from enroute_compute.commits import BuiltCommit, CommitRequest, build_commit
from enroute_compute.host import LoadingSnapshot, RepositoryHost, Snapshot
from enroute_compute.ledger_port import CreateMode
from enroute_compute.work import CancellableSource, cancellable_sink, to_thread_to_end
from enroute_core.base.clock import Clock
from enroute_core.base.errors import (
    EnrouteError,
    GitForm,
    IncarnationEnded,
    LimitExceeded,
    NotFound,
    StaleRef,
)
from enroute_core.base.ids import ZERO_OID, ObjectId
from enroute_core.engine.ingest import IngestResult, ingest_pack
from enroute_core.engine.snapshot import EMPTY_SNAPSHOT, SnapshotObjects
from enroute_core.git.pktline import NEED_DATA
from enroute_core.git.sideband import RECEIVE_KEEPALIVE
from enroute_core.git.source import ByteSource, BytesSource
from enroute_core.protocol.errors import git_message
from enroute_core.protocol.progress import ProgressMeter, humanise_bytes
from enroute_core.protocol.receive import (
    PackChunk,
    PushCommand,
    PushEnd,
    PushReport,
    PushRequest,
    ReceivePack,
    encode_report,
)
from enroute_core.protocol.receive import RefStatus as ReportStatus
from enroute_core.state import Change, Commit, NewLayer, RefStatus, RefUpdate
from enroute_core.state.head import branch_ref
from enroute_core.state.names import check_repo_name
from enroute_core.storage.growing import GrowingSpool
from enroute_core.storage.localfile import ScratchFile
from enroute_proto.request_id import derive_request_id, new_request_id

T = TypeVar("T")

log = logging.getLogger(__name__)

INGEST_THREADS = 16
"""Ingests (pushes and API commits) running at once; more wait for a thread, their
keepalives going on meanwhile."""
STREAMS_MAX = INGEST_THREADS // 2
"""Streamed ingests at most, whatever ``limits.ingest_streams_max`` says: each holds an
ingest thread while its client sends, so half the threads stay for pushes whose body is in."""
_INGESTS = ThreadPoolExecutor(INGEST_THREADS, thread_name_prefix="ingest")
"""Where ingests run: never asyncio's default pool. An ingest against a view whose
bytes are not all local waits for its loads (``host.LoadingSnapshot``), and loads
write their chunks (and a ``file://`` store reads) on the default pool: ingests
there could hold every thread their own loads need, and the node would stop
(docs/residency.md, "Deviations")."""

KEEPALIVE_S = 2.0
"""Silence after which a push with side-band sends a keepalive. git's receive-pack sends
one after ``receive.keepAlive`` (5 s) without output; sending after 2 s keeps every gap
on the wire under 5 s on a busy node too."""


class PushOutput:
    """What a push says before its report: progress lines (band 2) and keepalives.

    :meth:`progress` may be called from the ingest's thread; packets reach the
    generator through the event loop. Keepalives need side-band (git sends
    them only then: ``copy_to_sideband``), progress also needs no ``quiet``.
    """

    def __init__(self, request: PushRequest, clock: Clock, *, receiving: bool = False) -> None:
        self._clock = clock
        self.sideband = request.has(b"side-band-64k")
        self.meter = ProgressMeter(shown=self.sideband and not request.has(b"quiet"))
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._lock = threading.Lock()
        self._held: list[tuple[str, int, int | None]] | None = [] if receiving else None
        """While a streamed push's body arrives: the steps its ingest ended meanwhile, said
        after ``Receiving pack`` (:meth:`received`), so the lines come as unstreamed."""

    def _put(self, data: bytes) -> None:
        if data:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, data)

    def progress(self, stage: str, done: int, total: int | None, final: bool = False) -> None:
        """An ingest step's progress (``ingest.ProgressFn``), or the end of a step."""
        with self._lock:
            if self._held is not None:  # the body is arriving: no line yet
                if final:
                    self._held.append((stage, done, total))
            elif final:
                self._put(self.meter.finish(stage, done, total))
            else:
                self._put(self.meter.update(stage, done, total, self._clock.monotonic_ns()))

    def received(self, text: str) -> None:
        """A streamed push's body is in: ``text`` (``Receiving pack``), then the ends of the
        steps its ingest finished meanwhile; the progress from now on is shown."""
        with self._lock:
            self._put(self.meter.line(text))
            for stage, done, total in self._held or ():
                self._put(self.meter.finish(stage, done, total))
            self._held = None

    def line(self, text: str) -> None:
        self._put(self.meter.line(text))

    async def relay(self, work: asyncio.Future[bytes]) -> AsyncIterator[bytes]:
        """Progress packets as they come, a keepalive after each KEEPALIVE_S of silence,
        until ``work`` ends (its report is the caller's to send)."""
        work.add_done_callback(lambda _: self._queue.put_nowait(None))
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), KEEPALIVE_S)
            except TimeoutError:
                if self.sideband:
                    yield RECEIVE_KEEPALIVE
                continue
            if item is None:
                return
            yield item


@dataclasses.dataclass(eq=False)
class _Streamed:
    """A push whose ingest started at its pack's first chunk (module docstring)."""

    source: GrowingSpool
    output: PushOutput
    work: asyncio.Future[bytes]
    deadline: asyncio.TimerHandle | None = None
    cut_off: bool = False
    """Its receive deadline passed first: the push ingests once its body is in."""


class Pusher:
    """The write side over a :class:`RepositoryHost`: pushes and API commits."""

    def __init__(self, host: RepositoryHost) -> None:
        self.host = host
        self.streams = 0
        """Streamed ingests running: each holds an ingest thread (``limits.ingest_streams_max``)."""
        self._acknowledged: dict[str, tuple[int, int]] = {}
        """Per repository, (incarnation, ledger version) of the latest push this compute
        acknowledged whose state its view may not hold yet (read-your-writes, below)."""
        host.state_listeners.append(self._view_moved)
        host.unhost_listeners.append(self._view_gone)

    # -- read-your-writes -----------------------------------------------------------------

    async def _snapshot_after_own_pushes(self, name: str) -> Snapshot:
        """The view a push ingests against, holding every push this compute acknowledged.

        A push answers once its commit is durable, before this compute's view applies it
        (the view follows the ledger on its own). A client that pushes again without
        asking for the advertisement (which is read behind a barrier) sends a thin pack
        against the commit it just pushed; ingested against a view without it, its
        bases are "neither in the pack nor in the repository". So a push first waits
        for the view to reach the version the previous push here was acknowledged at
        (bounded by ``wait_s``, as every view wait; a view dropped meanwhile is opened
        again at the ledger's current state, which holds it).
        """
        repo = await self.host.open(name, CreateMode.IMPLICIT)
        acked = self._acknowledged.get(name)
        state = repo.state
        if acked is not None and acked[0] == state.incarnation and state.version < acked[1]:
            await self.host.wait_applied(name, acked[1])
            repo = await self.host.open(name, CreateMode.IMPLICIT)
        return repo.snapshot()

    def _acknowledge(self, name: str, incarnation: int, version: int) -> None:
        held = self._acknowledged.get(name)
        if held is None or held[0] != incarnation or held[1] < version:
            self._acknowledged[name] = (incarnation, version)
        self._view_moved(name)

    def _view_gone(self, name: str) -> None:
        """The view went (evicted, deleted): a re-opened one starts from the ledger's
        current state, which holds every acknowledged push; nothing to wait for."""
        self._acknowledged.pop(name, None)

    def _view_moved(self, name: str) -> None:
        """Forget an acknowledged version once the view holds it (the map keeps only
        the pushes whose state is on its way, so it stays as small as that)."""
        acked = self._acknowledged.get(name)
        if acked is None:
            return
        snap = self.host.peek(name)
        if snap is None or snap.state.incarnation != acked[0] or snap.state.version >= acked[1]:
            del self._acknowledged[name]

    # -- push -----------------------------------------------------------------------------

    def _scratch(self, prefix: str) -> ScratchFile:
        """A scratch file under the node's layer directory (a temporary one without storage)."""
        layers = self.host.layers
        if layers is not None:
            return layers.scratch_file(prefix)
        return ScratchFile(tempfile.gettempdir(), f"enroute-{prefix}")

    async def receive_pack(
        self, name: str, body: AsyncIterator[bytes], request_id: bytes = b""
    ) -> AsyncIterator[bytes]:
        """``request_id``: the caller's id of this push (docs/rpc.md, "Request ids")."""
        check_repo_name(name)
        conv = ReceivePack(limits=self.host.limits)
        request: PushRequest | None = None
        pack_max = self.host.limits.ingest_pack_bytes_max
        spool = self._scratch("push")
        over: LimitExceeded | None = None
        received = 0
        stream: _Streamed | None = None

        def drain() -> bool:
            nonlocal request, over, received, stream
            while True:
                event = conv.next_event()
                if event is NEED_DATA:
                    return False
                if isinstance(event, PushRequest):
                    request = event
                elif isinstance(event, PackChunk):
                    received += len(event.data)
                    if over is not None:
                        continue  # read to the end, unkept: the report refuses it
                    if received > pack_max:
                        over = LimitExceeded(
                            "ingest_pack_bytes_max",
                            received,
                            pack_max,
                            f"the pack is over the limit of {pack_max} bytes "
                            "(limits.ingest_pack_bytes_max)",
                        )
                        if stream is not None:
                            stream.source.cut("the pack went over ingest_pack_bytes_max")
                        continue
                    spool.append(event.data)
                    if stream is not None:
                        stream.source.grew(received)
                    elif request is not None and received == len(event.data):
                        stream = self._stream(name, request, spool, request_id)
                elif isinstance(event, PushEnd):
                    if stream is not None:
                        stream.source.end()
                    return True

        try:
            async for chunk in body:
                conv.feed(chunk)
                drain()
            conv.feed_eof()
            drain()
            if request is None or not request.commands:
                return
            self.host.pushes += 1
            if over is not None:
                log.info("push to %s refused: %s", name, over.message)
                report = _refused_report(request, over)
            else:
                output, work = await self._body_in(name, request, spool, request_id, stream)
                try:
                    async for data in output.relay(work):
                        yield data
                    report = work.result()
                finally:
                    if not work.done():
                        if stream is not None:
                            stream.source.cut("the push was cancelled")
                        work.cancel()
                        await asyncio.wait([work])
        finally:
            if stream is not None:
                await _end_stream(stream)
            spool.close()
        yield report

    async def _body_in(
        self,
        name: str,
        request: PushRequest,
        spool: ScratchFile,
        request_id: bytes,
        stream: _Streamed | None,
    ) -> tuple[PushOutput, asyncio.Future[bytes]]:
        """The push's body is all in: its work and what it says, the streamed ingest's
        (which goes on) or, unstreamed or cut off, one started now."""
        line = f"Receiving pack: {humanise_bytes(spool.size)}, done."
        if stream is not None and not stream.cut_off:
            _stop_deadline(stream)
            stream.output.received(line)
            log.info(
                "push to %s: streamed ingest had read %d of the pack's %d bytes "
                "when its last byte arrived", name, stream.source.consumed, spool.size,
            )  # fmt: skip
            return stream.output, stream.work
        if stream is not None:  # cut off: the push starts over once its work ended
            await _end_stream(stream)
        output = PushOutput(request, self.host.clock)
        if spool.size:
            output.line(line)
        return output, asyncio.ensure_future(self._push(name, request, spool, request_id, output))

    def _stream(
        self, name: str, request: PushRequest, spool: ScratchFile, request_id: bytes
    ) -> _Streamed | None:
        """Start the push's ingest at its pack's first chunk, when a slot is free (None
        otherwise: it ingests once its body is in). The slot is held until the push's work
        ends; a deadline cuts the ingest off if the body is not in by then."""
        limits = self.host.limits
        if not request.commands or self.streams >= min(limits.ingest_streams_max, STREAMS_MAX):
            return None
        source = GrowingSpool(spool)
        source.grew(spool.size)
        output = PushOutput(request, self.host.clock, receiving=True)
        work = asyncio.ensure_future(self._push(name, request, source, request_id, output))
        self.streams += 1
        work.add_done_callback(self._stream_ended)
        stream = _Streamed(source, output, work)
        seconds = limits.ingest_stream_receive_ms_max / 1000
        stream.deadline = asyncio.get_running_loop().call_later(
            seconds, self._cut_off, stream, name, seconds
        )
        return stream

    def _stream_ended(self, _: object) -> None:
        self.streams -= 1

    def _cut_off(self, stream: _Streamed, name: str, seconds: float) -> None:
        """A streamed ingest's receive deadline passed with its body still arriving: its
        thread stops and its slot is free; the push ingests once its body is in."""
        if stream.work.done() or stream.source.ended:
            return
        stream.cut_off = True
        stream.source.cut("the receive deadline passed")
        log.warning(
            "push to %s: streamed ingest cut off after %.0f s with %s of the pack in "
            "(limits.ingest_stream_receive_ms_max); it ingests once the pack is all in",
            name, seconds, humanise_bytes(stream.source.arrived),
        )  # fmt: skip

    async def _push(
        self,
        name: str,
        request: PushRequest,
        pack: ScratchFile | GrowingSpool,
        request_id: bytes,
        output: PushOutput,
    ) -> bytes:
        """:meth:`_ingest_and_commit`; a refusal it raises is answered in the report
        (every ref ``ng`` with its reason), a failure of this server logged once."""
        try:
            return await self._ingest_and_commit(name, request, pack, request_id, output)
        except EnrouteError as exc:
            if exc.mapping.http_status >= 500:
                log.error(
                    "request %s failed: %s: %s (push to %s, answered in its report)",
                    request_id.hex(), exc.code, exc.message, name,
                )  # fmt: skip
            return _refused_report(request, exc)

    async def _ingest_and_commit(
        self,
        name: str,
        request: PushRequest,
        pack: ScratchFile | GrowingSpool,
        request_id: bytes,
        output: PushOutput,
    ) -> bytes:
        """Ingest, commit, report. A command with a ``refusal`` (``funny refname``) is
        reported ``ng`` and left out; the others go on, or with ``atomic`` all fail
        (receive-pack.c, ``execute_commands_atomic``: ``atomic push failure``)."""
        commands = [c for c in request.commands if c.refusal is None]
        atomic = request.has(b"atomic")
        if not commands or (atomic and len(commands) < len(request.commands)):
            # nothing left to do, or an atomic push that cannot land whole: the pack unread
            reason = b"atomic push failure"
            return encode_report(
                PushReport(
                    None, tuple(ReportStatus(c.ref, c.refusal or reason) for c in request.commands)
                ),
                request,
            )
        snap = await self._snapshot_after_own_pushes(name)
        stored = await self._ingest_and_store(name, request, commands, pack, snap, output=output)
        if isinstance(stored, bytes):
            return stored  # the ingest refused the pack
        new_layer, warned = stored
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
            stamp_us=self.host.clock.now_us(),
            is_push=True,
            atomic=atomic,
        )
        try:
            # -- request id (begin): a replay of this push proposes under the same id
            # and hears the first apply's outcome; the replayed layer has the same
            # content-addressed key, so storing it again changed nothing
            proposed = await self.host.ledger.propose(
                name, snap.state.incarnation, command, _ledger_id(request_id, b"push")
            )
            # -- request id (end)
        except IncarnationEnded as exc:
            self.host.drop(name)
            return _refuse_all(request, git_message(exc), warned)
        except EnrouteError as exc:
            return _refuse_all(request, git_message(exc), warned)
        output.progress("Committing ref updates", len(commands), None, True)
        # The commit is durable and its outcome known: report now, as receive-pack does
        # once its refs are written. This view catches up on its own; every ref read
        # (and the next push's advertisement) waits for it behind a barrier (DESIGN
        # "Read path"), and the next push here waits for it too, advertisement or not
        # (_snapshot_after_own_pushes), so the pusher's next fetch or push sees its push.
        self._acknowledge(name, snap.state.incarnation, proposed.version)
        report = dataclasses.replace(_report(proposed.change, request), warnings=warned)
        return encode_report(report, request)

    async def _ingest_and_store(
        self,
        name: str,
        request: PushRequest,
        commands: list[PushCommand],
        pack: ScratchFile | GrowingSpool,
        snap: Snapshot,
        *,
        output: PushOutput,
    ) -> tuple[NewLayer | None, tuple[bytes, ...]] | bytes:
        """The pushed pack ingested against ``snap`` and its layer stored: the new layer
        (None when nothing was sent: deletes, or tips the repository holds) and the fsck
        warnings to show; or, when the ingest refuses the pack, the push's report."""
        tips = [c.new for c in commands if not c.is_delete]
        branch_targets = [(c.ref, c.new) for c in commands if not c.is_delete]
        layer_file = self._scratch("layer")
        try:
            with self._ingest_objects(snap) as objects:
                result: IngestResult | None = None
                # a streamed pack started with its first chunk (its size waits for the end)
                if tips and (isinstance(pack, GrowingSpool) or pack.size):
                    try:
                        result = await self._ingest_pack(
                            pack,
                            tips,
                            branch_targets,
                            objects,
                            layer_file=layer_file,
                            output=output,
                        )
                    except EnrouteError as exc:
                        if exc.mapping.git_form is GitForm.REF:
                            return _refuse_all(request, git_message(exc), ())
                        return _refuse_all(request, b"unpacker error", (), git_message(exc))
                if result is None:
                    return None, ()
                warned = self._ingested(name, result)
                new_layer = await self.host.store_layer(name, snap, result, layer_file)
                self.host.release_after_ingest(result.object_count)  # once result is gone
                if new_layer is not None:
                    output.line(f"Storing layer: {humanise_bytes(new_layer.file_size)}, done.")
                return new_layer, warned
        finally:
            layer_file.close()

    @contextlib.contextmanager
    def _ingest_objects(self, snap: Snapshot) -> Iterator[SnapshotObjects]:
        """What a push ingests against, with ``snap``'s reads pinned meanwhile (thin-pack
        bases come from the view)."""
        with self.host.pin_reads(snap):
            # an empty view answers as EMPTY_SNAPSHOT does, each question a call less (a
            # first push asks per object); bodies ingest reads are loaded first (host)
            objects = self.host.ingest_snapshot(snap.view) if snap.view.end_id else EMPTY_SNAPSHOT
            try:
                yield objects
            finally:
                if isinstance(objects, LoadingSnapshot):
                    objects.release()

    async def _ingest_pack(
        self,
        pack: ScratchFile | GrowingSpool,
        tips: list[ObjectId],
        branch_targets: list[tuple[bytes, ObjectId]],
        objects: SnapshotObjects,
        *,
        layer_file: ScratchFile,
        output: PushOutput,
    ) -> IngestResult:
        """:func:`ingest_pack` on an ingest thread, writing the layer to ``layer_file``; it
        stops when this push's request goes (work.py; a streamed pack's reads are stopped
        by the receive loop, which cuts it)."""
        gone = threading.Event()
        source: ByteSource = (
            pack if isinstance(pack, GrowingSpool) else CancellableSource(pack, gone)
        )
        return await to_thread_to_end(
            lambda: _without_cycle_collection(
                lambda: ingest_pack(
                    source,
                    tips,
                    objects,
                    limits=self.host.limits,
                    sink=cancellable_sink(layer_file.append, gone),
                    refs=branch_targets,
                    fsck=self.host.fsck,
                    progress=output.progress,
                    spill=partial(self._scratch, "trees"),
                )
            ),
            gone,
            _INGESTS,
        )

    def _ingested(self, name: str, result: IngestResult) -> tuple[bytes, ...]:
        """Count and log what an ingest reports; the warnings the pusher is shown."""
        if not result.compiled_index:
            self.host.reference_indexes += 1
        if result.spilled_bytes:
            log.info(
                "push to %s: ingest spilled %s of trees to scratch (%d objects)",
                name, humanise_bytes(result.spilled_bytes), result.object_count,
            )  # fmt: skip
        return self._warned(name, result) if result.warnings else ()

    def _warned(self, name: str, result: IngestResult, what: str = "push") -> tuple[bytes, ...]:
        """The fsck warnings of a push or an API commit: counted for /metrics, logged once,
        and the lines a pusher sees (``remote: warning: <id>: <count> object(s), e.g.
        <oid>``; an API commit answers them in its response)."""
        for w in result.warnings:
            self.host.fsck_warnings[w.msg_id] += w.count
        shown = [w.describe() for w in result.warnings]
        log.warning(
            "%s to %s: accepted objects with harmless fsck problems: %s",
            what,
            name,
            "; ".join(shown),
        )
        return tuple(f"warning: {line}".encode() for line in shown)

    # -- API commits ----------------------------------------------------------------------

    async def create_commit(self, request: CommitRequest, request_id: bytes = b"") -> BuiltCommit:
        """DESIGN "API commits": build on the expected parent, ingest, move the branch by CAS.

        The repository must exist (API commits never create one). A stale
        ``expected_oid`` raises :class:`StaleRef` with ``current_oid`` (None when
        unborn), before anything is built and again from the ledger's CAS. The
        entry is not a push, so it leaves the last push time (seed 001, "Last push").
        """
        name = request.repo
        check_repo_name(name)
        ref = branch_ref(request.branch)
        snap = await self.host.read(name)
        current = snap.state.refs.get(ref)
        current_oid = None if current is None else current.oid
        stale = current_oid != request.expected_oid
        if stale and (not request_id or current_oid is None):
            raise _stale(ref, current_oid)
        now_us = self.host.clock.now_us()
        with self.host.pin_reads(snap):
            # -- request id (begin): the replay of a commit the first compute applied.
            # The caller fixed the request's times, so it builds the very commit the
            # branch holds now: answer it; anything else is stale, as without an id.
            build = partial(build_commit, snap.view.read, request, now_us, limits=self.host.limits)
            if stale:
                try:
                    again = await self.host.run_read(snap.view, build, kind="api")
                except EnrouteError:
                    raise _stale(ref, current_oid) from None
                if again.oid != current_oid:
                    raise _stale(ref, current_oid)
                return again
            # -- request id (end)
            built = await self.host.run_read(snap.view, build, kind="api")
            objects = self.host.ingest_snapshot(snap.view)
            try:
                # a cancelled caller waits for the thread: it reads the pinned bytes
                result = await to_thread_to_end(
                    partial(
                        ingest_pack,
                        BytesSource(built.pack()),
                        [built.oid],
                        objects,
                        limits=self.host.limits,
                        fsck=self.host.fsck,
                    ),
                    threading.Event(),
                    _INGESTS,
                )
            finally:
                if isinstance(objects, LoadingSnapshot):
                    objects.release()
        command = Commit(
            incarnation=snap.state.incarnation,
            ref_updates=(RefUpdate(ref, request.expected_oid, built.oid),),
            new_layer=await self.host.store_layer(name, snap, result),
            stamp_us=now_us,
            is_push=False,
            atomic=True,
        )
        try:
            proposed = await self.host.ledger.propose(  # request id: one per API commit
                name, snap.state.incarnation, command, _ledger_id(request_id, b"commit")
            )
        except IncarnationEnded:
            self.host.drop(name)
            raise NotFound(f"repository {name} not found", name=name) from None
        refused = proposed.change.outcome.error()
        if refused is not None:
            raise refused
        await self.host.wait_applied(name, proposed.version)
        if result.warnings:
            self._warned(name, result, "API commit")
            built = dataclasses.replace(built, warnings=result.warnings)
        return built


def _stop_deadline(stream: _Streamed) -> None:
    if stream.deadline is not None:
        stream.deadline.cancel()


async def _end_stream(stream: _Streamed) -> None:
    """A streamed push leaves nothing running: a body that did not complete cuts its
    ingest, whose thread the push waits for (it reads the spool the caller closes next)
    and whose outcome (:class:`~enroute_core.git.growing.BodyCut` most likely) is taken."""
    _stop_deadline(stream)
    if not stream.work.done():
        stream.source.cut("the push's body did not complete")
        stream.work.cancel()
        await asyncio.wait([stream.work])
    if not stream.work.cancelled():
        stream.work.exception()


# -- request id (begin) --
def _ledger_id(request_id: bytes, purpose: bytes) -> bytes:
    """The ledger id of this write: derived from the caller's, else fresh (docs/rpc.md)."""
    return derive_request_id(request_id, purpose) if request_id else new_request_id()


# -- request id (end) --


_gc_lock = threading.Lock()
_gc_paused_by = 0


def _without_cycle_collection(fn: Callable[[], T]) -> T:
    """``fn`` with Python's cyclic garbage collector paused (docs/ingest.md, "Speed").

    Ingest makes hundreds of thousands of small tuples, dicts and lists that
    live until it ends; each full collection walks all of them, which cost
    10-20% of an ingest. Reference counting still frees everything at once.
    Concurrent ingests share the pause: the last one to end turns it back on.
    """
    global _gc_paused_by
    with _gc_lock:
        ours = _gc_paused_by > 0 or gc.isenabled()  # else paused by someone else: theirs
        if ours:
            _gc_paused_by += 1
            gc.disable()
    if not ours:
        return fn()
    try:
        return fn()
    finally:
        with _gc_lock:
            _gc_paused_by -= 1
            if _gc_paused_by == 0:
                gc.enable()


def _stale(ref: bytes, current: ObjectId | None) -> StaleRef:
    shown = ref.decode("utf-8", "replace")
    current_hex = None if current is None else current.hex()
    return StaleRef(
        f"{shown} is at {current_hex or 'nothing (unborn)'}, not the expected value",
        ref=shown,
        current_oid=current_hex,
    )


def _refuse_all(
    request: PushRequest, reason: bytes, warned: tuple[bytes, ...], unpack: bytes | None = None
) -> bytes:
    """Every command refused with ``reason`` (or its own refusal), the ingest's warnings
    shown; an unpack failure reports it for every command (receive-pack.c
    ``execute_commands``)."""
    statuses = tuple(
        ReportStatus(c.ref, reason if unpack is not None else c.refusal or reason)
        for c in request.commands
    )
    return encode_report(PushReport(unpack, statuses, warned), request)


def _refused_report(request: PushRequest, exc: EnrouteError) -> bytes:
    """The report of a push refused whole: a pack that is no good fails ``unpack`` and
    every ref ``unpacker error`` (receive-pack.c ``execute_commands``); anything else
    leaves ``unpack ok`` and refuses every ref with the reason. git shows
    ``error: remote unpack failed: <reason>`` and `` ! [remote rejected] <ref> (<reason>)``.
    """
    reason = git_message(exc)
    pack_failed = isinstance(exc, LimitExceeded) or exc.code.startswith("invalid_")
    statuses = tuple(
        ReportStatus(c.ref, c.refusal or (b"unpacker error" if pack_failed else reason))
        for c in request.commands
    )
    return encode_report(PushReport(reason if pack_failed else None, statuses), request)


def _report(change: Change, request: PushRequest) -> PushReport:
    results = {r.name: r for r in change.refs}
    fallback = change.outcome.message.encode() or b"refused"
    statuses: list[ReportStatus] = []
    for c in request.commands:
        r = results.get(c.ref)
        if c.refusal is not None:
            statuses.append(ReportStatus(c.ref, c.refusal))
        elif r is not None and r.status is RefStatus.OK:
            statuses.append(ReportStatus(c.ref))
        elif r is not None:
            statuses.append(ReportStatus(c.ref, (r.reason or fallback.decode()).encode()))
        elif change.outcome.ok:
            statuses.append(ReportStatus(c.ref))
        else:
            statuses.append(ReportStatus(c.ref, fallback))
    return PushReport(None, tuple(statuses))
