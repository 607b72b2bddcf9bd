"""The gRPC :class:`~enroute_compute.ledger_port.LedgerPort` against ``enroute.ledger.v1.Ledger``.

docs/rpc.md, "Ledger": any member answers any call, so calls go to one member
and move to the next when it is unavailable; List asks every member and the
caller merges. Commands, changes and checkpoints are encoded with
``enroute_core.state``'s codec; failures come back as the typed errors of the
table (:mod:`enroute_compute.rpc.errors`). Every call has a deadline.

Propose carries one request id per logical write, the same on every retry, so
the ledger applies it once whichever member took which copy (docs/rpc.md,
Propose). That makes Propose, like Barrier, safe to send to the next member
when one does not answer: after UNAVAILABLE, DEADLINE_EXCEEDED, or no answer
within the attempt deadline (the earlier copy stays open: a slow member may
still answer first), so a hung member (accepting connections, answering
nothing) costs one attempt deadline, not the call's.

Proposals travel on one ``ProposeStream`` call per member (docs/rpc.md,
ProposeStream), many per message, with the same attempts, deadlines and
errors as the unary Propose; a member that does not know the call gets the
unary one.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from types import MappingProxyType
from typing import Any

import grpc

from enroute_compute.audit import audit_activated, audit_change, audit_deleted
from enroute_compute.ledger_port import (
    Activated,
    BarrierPoint,
    ChangeEvent,
    CreateMode,
    FollowEvent,
    ListPage,
    Proposed,
    RepoSummary,
    SnapshotEvent,
)
from enroute_compute.rpc.convert import CREATE_MODES, summary_from_pb
from enroute_compute.rpc.errors import error_from_rpc
from enroute_core.base.errors import EnrouteError, Timeout, Unavailable
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_core.state import Command, decode_change, decode_state, encode_command
from enroute_proto import ERROR_DETAIL_KEY, ErrorDetail
from enroute_proto.channels import open_channel
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from enroute_proto.logs import call_metadata
from enroute_proto.request_id import REQUEST_ID_BYTES, new_request_id

CALL_TIMEOUT_S = 10.0
ATTEMPT_TIMEOUT_S = 2.0
"""How long a Propose or Barrier waits on one member before it also asks the next one."""
ATTEMPTS_PER_MEMBER_MAX = 3
"""Bound on a retried call's attempts: this many rounds over the members."""


_STATUS_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}

log = logging.getLogger("enroute.compute.ledger")


def start_call_tasks(tasks: set[asyncio.Task[None]], *works: Coroutine[Any, Any, None]) -> None:
    """Run a stream call's tasks (its writer and reader, its close), each in a fresh
    context: the call is shared by every request, so no request's id may reach its
    metadata or its tasks' log lines. ``tasks`` holds them until they end."""
    for work in works:
        task = asyncio.get_running_loop().create_task(work, context=contextvars.Context())
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def write_queued(
    call: Any,
    current: Callable[[], bool],
    wake: asyncio.Event,
    take: Callable[[], list[Any]],
    broken: Callable[[Any, grpc.RpcError | None], None],
) -> None:
    """The writer of one long-lived stream call (``ProposalStream``, ``FollowMux``):
    sends what ``take`` hands it while the call is ``current``, sleeps on ``wake``
    when nothing is queued (whoever queues sets it), and hands a failed write to
    ``broken``, which fails the call's open work over to the next member."""
    try:
        while current():
            batch = take()
            if not batch:
                wake.clear()  # (anything queued after this sets it again)
                await wake.wait()
                continue
            for msg in batch:
                await call.write(msg)
    except grpc.RpcError as exc:
        broken(call, exc)
    except Exception:  # the call ended under the write (InvalidStateError, UsageError)
        broken(call, None)


class StreamedProposalError(grpc.RpcError):
    """A streamed proposal's failure in the shape of a failed call, so that
    ``error_from_rpc`` maps it through the one table, as a unary Propose's."""

    def __init__(self, status: grpc.StatusCode, message: str, detail: ErrorDetail | None) -> None:
        super().__init__(message)
        self._status = status
        self._message = message
        self._detail = detail

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> Any:  # the metadata pairs error_from_rpc reads
        if self._detail is None:
            return ()
        return ((ERROR_DETAIL_KEY, self._detail.SerializeToString()),)


class ProposalStream:
    """Proposals to one member on one ``ProposeStream`` call, batched.

    The first proposal goes at once; those made while a message is being written
    leave together in the next, and the member answers those applied together in
    one message: many repositories' commits cost one message each way instead of a
    call each. Each proposal keeps its own deadline (sent along, and kept here) and
    its own outcome. When the stream breaks, every proposal still waiting fails
    UNAVAILABLE, as a unary call on a broken connection does: outcome unknown,
    retried under its request id. The next proposal opens a new stream.
    """

    def __init__(self, stub: ledger_pb2_grpc.LedgerStub, address: str) -> None:
        self._stub: Any = stub  # aio stub: the generated annotations describe the blocking one
        self._address = address
        self._call: Any = None
        self._pending: dict[int, asyncio.Future[ledger_pb2.ProposeResponse]] = {}
        self._queue: list[ledger_pb2.StreamedProposal] = []
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._seq = 0
        self.unimplemented = False
        """The member answered UNIMPLEMENTED (an older ledger): use the unary call."""

    async def propose(
        self, request: ledger_pb2.ProposeRequest, timeout_s: float
    ) -> ledger_pb2.ProposeResponse:
        """The member's answer to ``request``; a failure raises ``grpc.RpcError``."""
        if self._call is None:
            self._open()
        self._seq += 1
        seq = self._seq
        fut: asyncio.Future[ledger_pb2.ProposeResponse] = asyncio.get_running_loop().create_future()
        self._pending[seq] = fut
        timeout_ms = max(1, int(timeout_s * 1000))
        self._queue.append(
            ledger_pb2.StreamedProposal(seq=seq, request=request, timeout_ms=timeout_ms)
        )
        self._wake.set()
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise StreamedProposalError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "proposal deadline exceeded", None
            ) from None
        finally:
            self._pending.pop(seq, None)

    def _open(self) -> None:
        # shared by every request: no request's id in its metadata or its tasks' log lines;
        # each proposal is named by its own request_id (``proposal_id`` in log lines)
        call = self._stub.ProposeStream()
        self._call = call
        start_call_tasks(self._tasks, self._write(call), self._read(call))

    async def _write(self, call: Any) -> None:
        """Send what is queued, all of it in one message, while ``call`` is current."""

        def take() -> list[Any]:
            batch, self._queue = self._queue, []
            return [ledger_pb2.ProposeStreamRequest(proposals=batch)] if batch else []

        await write_queued(call, lambda: self._call is call, self._wake, take, self._broken)

    async def _read(self, call: Any) -> None:
        try:
            async for msg in call:
                for out in msg.outcomes:
                    fut = self._pending.get(out.seq)
                    if fut is None or fut.done():
                        continue  # given up on here (deadline, or answered by another member)
                    if out.HasField("applied"):
                        fut.set_result(out.applied)
                        continue
                    err = out.error
                    status = _STATUS_BY_NUMBER.get(err.status, grpc.StatusCode.UNKNOWN)
                    detail = err.detail if err.HasField("detail") else None
                    text = detail.message if detail is not None else status.name.lower()
                    fut.set_exception(StreamedProposalError(status, text, detail))
        except grpc.RpcError as exc:
            self._broken(call, exc)
            return
        self._broken(call, None)

    def _broken(self, call: Any, exc: grpc.RpcError | None) -> None:
        """Fail what waits on ``call``; the next proposal opens a new stream."""
        if self._call is not call:
            return
        self._call = None
        call.cancel()
        code = getattr(exc, "code", lambda: None)() if exc is not None else None
        if code is grpc.StatusCode.UNIMPLEMENTED:
            self.unimplemented = True
            failure: grpc.RpcError = StreamedProposalError(
                code, "the member has no ProposeStream", None
            )
        else:
            why = "ended" if exc is None else f"broke ({code}: {exc.details()})"
            failure = StreamedProposalError(
                grpc.StatusCode.UNAVAILABLE,
                f"proposal stream to ledger member {self._address} {why}",
                None,
            )
        self._queue = []
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(failure)
        self._wake.set()  # the writer of ``call`` sees it is no longer current and ends

    def close(self) -> None:
        """Send no more; the member answers what it took, then the stream ends."""
        call, self._call = self._call, None
        if call is not None:
            start_call_tasks(self._tasks, call.done_writing())
        self._wake.set()


class FollowUnimplemented(Exception):
    """The member has no Follow (an older ledger): subscribe with a Subscribe call."""


class _Assembly:
    """A subscription's events from its messages: inline layers and snapshot parts are
    gathered until the snapshot's last part. ``SubscribeResponse`` and ``FollowEvent``
    name their events alike, so both calls read through this."""

    __slots__ = ("inline", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.inline: dict[bytes, bytes] = {}

    def events(self, msg: Any) -> list[FollowEvent]:
        if msg.HasField("inline_layer"):
            self.inline[msg.inline_layer.root] = msg.inline_layer.data
            return []
        if msg.HasField("snapshot"):
            self.parts.append(msg.snapshot.data)
            if not msg.snapshot.last:
                return []
            state = decode_state(b"".join(self.parts))
            event = SnapshotEvent(state, MappingProxyType(self.inline))
            self.parts, self.inline = [], {}
            return [event]
        return [ChangeEvent(c.version, decode_change(c.effects)) for c in msg.changes.changes]


class FollowMux:
    """A compute's subscriptions to one member on one ``Follow`` call (docs/rpc.md, Follow).

    Each :meth:`follow` sends a Follow under a fresh number and reads that number's
    events from the call; leaving it (a view evicted: its follower task cancelled, or
    ended) sends Unfollow. No gRPC call is cancelled per view, so none leaks
    (``grpc.aio`` leaks a cancelled call's batch, grpc/grpc#43360), and the member
    keeps a cursor per follow instead of a call and a task. When the call breaks (the
    member killed, a connection cut, the member gone silent) every follow on it fails
    ``unavailable`` at once and its follower follows again from its own version; the
    next follow opens a new call.
    """

    def __init__(self, stub: ledger_pb2_grpc.LedgerStub, address: str) -> None:
        self._stub: Any = stub  # aio stub: the generated annotations describe the blocking one
        self.address = address
        self._call: Any = None
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._out: list[ledger_pb2.FollowRequest] = []
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._id = 0
        self.unimplemented = False
        """The member answered UNIMPLEMENTED (an older ledger): use Subscribe."""
        self.on_broken: Callable[[FollowMux], None] | None = None

    async def follow(
        self, name: str, incarnation: int, after_version: int
    ) -> AsyncIterator[FollowEvent]:
        """``name``'s events as Subscribe gives them; raises FollowUnimplemented first
        when the member has no Follow."""
        if self.unimplemented:
            raise FollowUnimplemented
        if self._call is None:
            self._open()
        call = self._call
        self._id += 1
        id_ = self._id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[id_] = queue
        self._send(
            ledger_pb2.FollowRequest(
                follow=ledger_pb2.Follow(
                    id=id_, repo=name, incarnation=incarnation, after_version=after_version
                )
            )
        )
        assembly = _Assembly()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.HasField("ended"):
                    ended = item.ended
                    if ended.status == 0:
                        return  # followed again by the caller from its version
                    status = _STATUS_BY_NUMBER.get(ended.status, grpc.StatusCode.UNKNOWN)
                    if status is grpc.StatusCode.UNAVAILABLE and self.on_broken is not None:
                        self.on_broken(self)  # a stopping member: follow again on another
                    detail = ended.detail if ended.HasField("detail") else None
                    text = detail.message if detail is not None else status.name.lower()
                    raise error_from_rpc(StreamedProposalError(status, text, detail))
                for event in assembly.events(item):
                    yield event
        finally:
            # still followed on a live call: the member stops at once (not a cancelled call)
            if self._queues.pop(id_, None) is not None and self._call is call:
                self._send(ledger_pb2.FollowRequest(unfollow=ledger_pb2.Unfollow(id=id_)))

    def _send(self, req: ledger_pb2.FollowRequest) -> None:
        self._out.append(req)
        self._wake.set()

    def _open(self) -> None:
        # shared by every view: no request's id in its metadata or its tasks' log lines
        call = self._stub.Follow()
        self._call = call
        self._out = []
        start_call_tasks(self._tasks, self._write(call), self._read(call))

    async def _write(self, call: Any) -> None:
        """Send the queued follows and unfollows, in order, while ``call`` is current."""

        def take() -> list[Any]:
            batch, self._out = self._out, []
            return batch

        await write_queued(call, lambda: self._call is call, self._wake, take, self.broken)

    async def _read(self, call: Any) -> None:
        try:
            async for msg in call:
                for ev in msg.events:
                    queue = self._queues.get(ev.id)
                    if queue is None:
                        continue  # unfollowed here: what was already on the way
                    if ev.HasField("ended"):
                        del self._queues[ev.id]  # over on the member: no Unfollow
                    queue.put_nowait(ev)
        except grpc.RpcError as exc:
            self.broken(call, exc)
            return
        self.broken(call, None)

    def broken(self, call: Any, exc: grpc.RpcError | None, why: str = "") -> None:
        """Fail every follow on ``call`` at once; the next follow opens a new call."""
        if call is None or self._call is not call:
            return
        self._call = None
        call.cancel()
        code = getattr(exc, "code", lambda: None)() if exc is not None else None
        failure: BaseException
        if code is grpc.StatusCode.UNIMPLEMENTED:
            self.unimplemented = True
            failure = FollowUnimplemented()
        else:
            why = why or ("ended" if exc is None else f"broke ({code}: {exc.details()})")
            failure = Unavailable(f"follow stream to ledger member {self.address} {why}")
            if self.on_broken is not None:
                self.on_broken(self)
        queues, self._queues = self._queues, {}
        if queues and not isinstance(failure, FollowUnimplemented):
            log.warning("%s: %d follows fail over to another member", failure, len(queues))
        elif isinstance(failure, FollowUnimplemented):
            log.info("ledger member %s has no Follow: views follow there with Subscribe calls",
                     self.address)  # fmt: skip
        for queue in queues.values():
            queue.put_nowait(failure)
        self._wake.set()  # the writer of ``call`` sees it is no longer current and ends

    def leave(self, why: str) -> None:
        """The member went silent: fail its follows over to another member."""
        self.broken(self._call, None, why)

    def close(self) -> None:
        """Send no more: the member ends the call and its follows."""
        call, self._call = self._call, None
        if call is not None:
            start_call_tasks(self._tasks, call.done_writing())
        self._wake.set()


class GrpcLedger:
    """A LedgerPort over gRPC to the members at ``addresses`` (``HOST:PORT``)."""

    def __init__(
        self,
        addresses: tuple[str, ...],
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        attempt_timeout_s: float = ATTEMPT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        message_bytes_max: int = DEFAULT_LIMITS.rpc_message_bytes_max,
        stream_proposals: bool = True,
        follow_streams: bool = True,
    ) -> None:
        if not addresses:
            raise Unavailable("no ledger members configured (ledger.members)")
        self._addresses = tuple(addresses)
        self._message_bytes_max = message_bytes_max
        self._channels = [self._open(a) for a in addresses]
        self._retiring: dict[asyncio.Task[None], grpc.aio.Channel] = {}
        self._stubs = [ledger_pb2_grpc.LedgerStub(c) for c in self._channels]
        self._next = 0
        self._timeout = timeout_s
        self._attempt_timeout = min(attempt_timeout_s, timeout_s)
        self._clock = clock
        # open Subscribe calls by member address; those given up on a silent member
        self._subs: dict[str, set[Any]] = {}
        self._abandoned: set[Any] = set()
        # one ProposeStream per member address, opened on its first proposal
        self._stream_proposals = stream_proposals
        self._streams: dict[str, ProposalStream] = {}
        # one Follow call per member address, carrying every view's subscription there
        self._follow_streams = follow_streams
        self._muxes: dict[str, FollowMux] = {}

    def _open(self, address: str) -> grpc.aio.Channel:
        return open_channel(address, message_bytes_max=self._message_bytes_max)

    def set_members(self, addresses: tuple[str, ...]) -> None:
        """Swap the member set (discovery); channels of members that stay are kept.

        A removed member's channel is closed after a grace, so a call or a
        Subscribe in flight on it ends on its own or fails over.
        """
        if not addresses:
            return
        old = dict(zip(self._addresses, self._channels, strict=True))
        current = self._addresses[self._next] if self._addresses else None
        self._addresses = tuple(addresses)
        self._channels = [old.pop(a) if a in old else self._open(a) for a in addresses]
        self._stubs = [ledger_pb2_grpc.LedgerStub(c) for c in self._channels]
        # keep talking to the member that answered last, when it stays
        self._next = self._addresses.index(current) if current in self._addresses else 0
        for address in [a for a in self._streams if a in old]:
            self._streams.pop(address).close()
        for address in [a for a in self._muxes if a in old]:
            self._muxes.pop(address).close()
        for channel in old.values():
            task = asyncio.get_running_loop().create_task(channel.close(grace=self._timeout))
            self._retiring[task] = channel
            task.add_done_callback(lambda t: self._retiring.pop(t, None))

    @property
    def members(self) -> tuple[str, ...]:
        return self._addresses

    async def _call(self, fn: Callable[[ledger_pb2_grpc.LedgerStub], Any]) -> Any:
        last: EnrouteError | None = None
        for attempt in range(len(self._stubs)):
            index = (self._next + attempt) % len(self._stubs)
            try:
                result = await fn(self._stubs[index])
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                if not isinstance(err, Unavailable):
                    raise err from None
                last = err
                continue
            self._next = index
            return result
        assert last is not None
        raise last

    async def _retried(self, fn: Callable[[ledger_pb2_grpc.LedgerStub, float], Any]) -> Any:
        """``fn(stub, timeout)`` on member after member until one answers or time is up.

        Only for calls that are safe to repeat on another member: Barrier (a read)
        and Propose under one request id. A member that failed with UNAVAILABLE or
        DEADLINE_EXCEEDED, or has not answered within the attempt deadline, gets a
        copy sent to the next member; the earlier attempts stay open until the
        call's deadline, so a slow member (not a hung one) still answers. The
        first answer wins; any failure other than those two is the answer.
        """
        deadline = self._clock() + self._timeout
        last: EnrouteError | None = None
        running: dict[asyncio.Future[Any], int] = {}
        silent: set[str] = set()  # members that failed or did not answer in time
        attempts = 0
        try:
            while True:
                left = deadline - self._clock()
                if left <= 0:
                    break
                if attempts < len(self._stubs) * ATTEMPTS_PER_MEMBER_MAX:
                    index = (self._next + attempts) % len(self._stubs)
                    attempts += 1
                    running[asyncio.ensure_future(fn(self._stubs[index], left))] = index
                if not running:
                    break
                done, _ = await asyncio.wait(
                    running,
                    timeout=min(self._attempt_timeout, left),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    silent.update(self._addresses[i] for i in running.values())
                for task in done:
                    index = running.pop(task)
                    exc = task.exception()
                    if exc is None:
                        self._next = index
                        self._leave(silent - {self._addresses[index]})
                        return task.result()
                    silent.add(self._addresses[index])
                    if not isinstance(exc, grpc.RpcError):
                        raise exc
                    err = error_from_rpc(exc)
                    if not isinstance(err, Unavailable | Timeout):  # Timeout: DEADLINE_EXCEEDED
                        raise err from None
                    last = err
        finally:
            for task in running:
                task.cancel()
        if last is None:
            raise Timeout("no ledger member answered in time")
        raise last

    def _leave(self, addresses: set[str]) -> None:
        """End the subscriptions on members that went silent while another answered.

        A paused member keeps its connections and sends nothing, so a view fed from
        it would wait for changes forever; its follower hears Unavailable and
        subscribes again, to the member that answered.
        """
        for address in addresses:
            for call in self._subs.get(address, ()):
                self._abandoned.add(call)
                call.cancel()
            mux = self._muxes.get(address)
            if mux is not None:
                mux.leave("went silent")

    async def activate(self, name: str, create: CreateMode, head: bytes) -> Activated:
        req = ledger_pb2.ActivateRequest(repo=name, create=CREATE_MODES[create], head=head)
        resp: ledger_pb2.ActivateResponse = await self._call(
            lambda s: s.Activate(req, timeout=self._timeout, metadata=call_metadata())
        )
        activated = Activated(summary_from_pb(resp.state), resp.created)
        audit_activated(name, activated)
        return activated

    async def describe(self, name: str) -> RepoSummary:
        req = ledger_pb2.DescribeRequest(repo=name)
        resp: ledger_pb2.DescribeResponse = await self._call(
            lambda s: s.Describe(req, timeout=self._timeout)
        )
        return summary_from_pb(resp.state)

    async def list(self, start_after: str, limit: int) -> list[ListPage]:
        req = ledger_pb2.ListRequest(start_after=start_after, limit=limit)
        pages: list[ListPage] = []
        failure: EnrouteError | None = None
        # every member at once: a page costs one round trip, not one per member
        answers = await asyncio.gather(
            *(stub.List(req, timeout=self._timeout) for stub in self._stubs),
            return_exceptions=True,
        )
        for resp in answers:
            if isinstance(resp, grpc.RpcError):
                failure = error_from_rpc(resp)
                continue
            if isinstance(resp, BaseException):
                raise resp
            pages.append(ListPage(tuple(summary_from_pb(r) for r in resp.repositories), resp.more))
        if not pages and failure is not None:
            raise failure
        return pages

    async def delete(self, name: str) -> RepoSummary | None:
        req = ledger_pb2.DeleteRequest(repo=name)
        resp: ledger_pb2.DeleteResponse = await self._call(
            lambda s: s.Delete(req, timeout=self._timeout, metadata=call_metadata())
        )
        summary = summary_from_pb(resp.state) if resp.HasField("state") else None
        audit_deleted(name, summary)
        return summary

    async def propose(
        self, name: str, incarnation: int, command: Command, request_id: bytes = b""
    ) -> Proposed:
        if request_id and len(request_id) != REQUEST_ID_BYTES:
            raise ValueError(f"a request id is {REQUEST_ID_BYTES} bytes")
        # one id for every attempt: whichever member applied a copy, the rest are no-ops
        req = ledger_pb2.ProposeRequest(
            repo=name,
            incarnation=incarnation,
            command=encode_command(command),
            request_id=request_id or new_request_id(),
        )
        resp: ledger_pb2.ProposeResponse = await self._retried(
            lambda s, t: self._propose_on(s, req, t)
        )
        proposed = Proposed(resp.version, decode_change(resp.effects))
        audit_change(name, command, proposed.change, req.request_id)
        return proposed

    async def _propose_on(
        self, stub: ledger_pb2_grpc.LedgerStub, req: ledger_pb2.ProposeRequest, timeout_s: float
    ) -> ledger_pb2.ProposeResponse:
        """One attempt on one member: on its proposal stream, else the unary call."""
        stream = None
        if self._stream_proposals and stub in self._stubs:
            address = self._addresses[self._stubs.index(stub)]
            stream = self._streams.get(address)
            if stream is None:
                stream = self._streams[address] = ProposalStream(stub, address)
        if stream is not None and not stream.unimplemented:
            try:
                return await stream.propose(req, timeout_s)
            except grpc.RpcError:
                if not stream.unimplemented:
                    raise
        aio: Any = stub  # aio stub: the generated annotations describe the blocking one
        resp: ledger_pb2.ProposeResponse = await aio.Propose(
            req, timeout=timeout_s, metadata=call_metadata()
        )
        return resp

    async def subscribe(
        self, name: str, incarnation: int, after_version: int
    ) -> AsyncIterator[FollowEvent]:
        """On the member's Follow call (docs/rpc.md, Follow); a member without it (an
        older ledger, a rolling upgrade) gets a Subscribe call of its own."""
        index = self._next
        address = self._addresses[index]
        if self._follow_streams:
            mux = self._muxes.get(address)
            if mux is None:
                mux = self._muxes[address] = FollowMux(self._stubs[index], address)
                mux.on_broken = self._mux_broken
            if not mux.unimplemented:
                try:
                    async for event in mux.follow(name, incarnation, after_version):
                        yield event
                    return
                except FollowUnimplemented:
                    pass  # nothing of it was yielded: the member answers before any event
        async for event in self._subscribe_call(index, name, incarnation, after_version):
            yield event

    def _mux_broken(self, mux: FollowMux) -> None:
        """Follow again on the next member: the broken one is likely gone (killed, cut)."""
        if self._addresses[self._next] == mux.address and len(self._addresses) > 1:
            self._next = (self._next + 1) % len(self._addresses)

    async def _subscribe_call(
        self, index: int, name: str, incarnation: int, after_version: int
    ) -> AsyncIterator[FollowEvent]:
        req = ledger_pb2.SubscribeRequest(
            repo=name, incarnation=incarnation, after_version=after_version
        )
        address = self._addresses[index]
        call = self._stubs[index].Subscribe(req)
        subs = self._subs.setdefault(address, set())
        subs.add(call)
        assembly = _Assembly()
        try:
            async for msg in call:
                for event in assembly.events(msg):
                    yield event
        except grpc.RpcError as exc:
            if call in self._abandoned:
                raise Unavailable(f"ledger member {address} went silent") from None
            raise error_from_rpc(exc) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if call in self._abandoned and (task is None or not task.cancelling()):
                raise Unavailable(f"ledger member {address} went silent") from None
            raise
        finally:
            call.cancel()
            subs.discard(call)
            self._abandoned.discard(call)

    async def barrier(self, name: str) -> BarrierPoint:
        req = ledger_pb2.BarrierRequest(repo=name)
        resp: ledger_pb2.BarrierResponse = await self._retried(
            lambda s, t: s.Barrier(req, timeout=t)
        )
        return BarrierPoint(resp.incarnation, resp.version, resp.deleted)

    async def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        for mux in self._muxes.values():
            mux.close()
        self._muxes.clear()
        for channel in self._channels:
            await channel.close()
        for channel in list(self._retiring.values()):
            await channel.close()
