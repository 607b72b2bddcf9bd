"""Ledger and RaftTransport servicers: thin, every rule lives in lifecycle/runtime."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from enroute_core.base.errors import EnrouteError, Internal, InvalidArgument
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_core.drain import Drain
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc

from ..follow import ChangesOut, FollowStream, InlineOut, PartOut, Piece, snapshot_pieces
from ..lifecycle import ChangeOut, Lifecycle, SnapshotOut
from ..runtime import Runtime
from .convert import SnapshotAssembler, batch_from_proto, state_to_proto
from .errors import abort_with, follow_ended, proposal_error

log = logging.getLogger("enroute.ledger.rpc")
Ctx = Any  # grpc.aio.ServicerContext; the generated stubs type it as a union of both APIs


class LedgerServicer(ledger_pb2_grpc.LedgerServicer):
    def __init__(
        self,
        lifecycle: Lifecycle,
        *,
        stream_proposals_max: int = DEFAULT_LIMITS.ledger_stream_proposals_max,
        drain: Drain | None = None,
    ) -> None:
        self.lc = lifecycle
        self.stream_proposals_max = stream_proposals_max
        # SIGTERM (main.py): calls that write or wait on the log are counted, and refused
        # with UNAVAILABLE once draining, so the compute asks another member
        self.drain = drain or Drain("ledger")

    async def Activate(
        self, request: ledger_pb2.ActivateRequest, context: Ctx
    ) -> ledger_pb2.ActivateResponse:
        try:
            create = request.create != ledger_pb2.CREATE_MODE_UNSPECIFIED
            head: bytes | None = None
            if request.create == ledger_pb2.CREATE_MODE_EXPLICIT:
                head = request.head or b"refs/heads/main"
            with self.drain.call():
                got = await self.lc.activate(request.repo, create, head)
            if got.created:  # the request id of the call that asked is on the line
                log.info("created %s incarnation %d", request.repo, got.state.incarnation,
                         extra={"repo": request.repo})  # fmt: skip
            return ledger_pb2.ActivateResponse(
                state=state_to_proto(request.repo, got.state), created=got.created
            )
        except EnrouteError as e:
            await abort_with(context, e)

    async def Describe(
        self, request: ledger_pb2.DescribeRequest, context: Ctx
    ) -> ledger_pb2.DescribeResponse:
        try:
            st = await self.lc.describe(request.repo)
            return ledger_pb2.DescribeResponse(state=state_to_proto(request.repo, st))
        except EnrouteError as e:
            await abort_with(context, e)

    async def List(self, request: ledger_pb2.ListRequest, context: Ctx) -> ledger_pb2.ListResponse:
        try:
            states, names, more = self.lc.list(request.start_after, request.limit)
            return ledger_pb2.ListResponse(
                repositories=[
                    state_to_proto(n, s) for n, s in zip(names, states, strict=True) if s
                ],
                more=more,
            )
        except EnrouteError as e:
            await abort_with(context, e)

    async def Delete(
        self, request: ledger_pb2.DeleteRequest, context: Ctx
    ) -> ledger_pb2.DeleteResponse:
        try:
            with self.drain.call():
                st = await self.lc.delete(request.repo)
            log.info("deleted %s", request.repo, extra={"repo": request.repo})
            if st is None:
                return ledger_pb2.DeleteResponse()
            return ledger_pb2.DeleteResponse(state=state_to_proto(request.repo, st))
        except EnrouteError as e:
            await abort_with(context, e)

    async def _propose(self, request: ledger_pb2.ProposeRequest) -> ledger_pb2.ProposeResponse:
        # caller's request id (docs/rpc.md, Propose): passed through
        with self.drain.call():
            got = await self.lc.propose(
                request.repo, request.incarnation, request.command, request.request_id
            )
        log.info("proposal to %s applied at version %d", request.repo, got.version,
                 extra={"repo": request.repo,
                        "proposal_id": request.request_id.hex()})  # fmt: skip
        return ledger_pb2.ProposeResponse(version=got.version, effects=got.change)

    async def Propose(
        self, request: ledger_pb2.ProposeRequest, context: Ctx
    ) -> ledger_pb2.ProposeResponse:
        try:
            return await self._propose(request)
        except EnrouteError as e:
            await abort_with(context, e)

    async def ProposeStream(
        self, request_iterator: AsyncIterator[ledger_pb2.ProposeStreamRequest], context: Ctx
    ) -> AsyncIterator[ledger_pb2.ProposeStreamResponse]:
        """Each proposal as one Propose, answered once applied (docs/rpc.md, ProposeStream).

        One call carries a compute's proposals for every repository, so they cost one
        message each way per batch instead of a call each; those that arrive together
        reach the runtime before its next Ready and share its rounds and fsyncs.
        Outcomes ready together leave in one message. At most
        ``stream_proposals_max`` are open at once: past it the stream is not read, and
        gRPC's flow control holds the caller.
        """
        outcomes: asyncio.Queue[ledger_pb2.ProposalOutcome | None] = asyncio.Queue()
        room = asyncio.Semaphore(self.stream_proposals_max)
        tasks: set[asyncio.Task[None]] = set()

        async def one(p: ledger_pb2.StreamedProposal) -> None:
            try:
                async with asyncio.timeout(p.timeout_ms / 1000 if p.timeout_ms else None):
                    out = ledger_pb2.ProposalOutcome(
                        seq=p.seq, applied=await self._propose(p.request)
                    )
            except EnrouteError as e:
                out = ledger_pb2.ProposalOutcome(seq=p.seq, error=proposal_error(e))
            except TimeoutError:  # the proposal's deadline: what the unary call's ends with
                status = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
                out = ledger_pb2.ProposalOutcome(
                    seq=p.seq, error=ledger_pb2.ProposalError(status=status)
                )
            except Exception as e:  # a bug: answered as internal, as an unary call would be
                log.exception("streamed proposal to %s failed", p.request.repo)
                out = ledger_pb2.ProposalOutcome(seq=p.seq, error=proposal_error(Internal(str(e))))
            room.release()
            outcomes.put_nowait(out)

        spawned = 0

        async def read() -> None:
            nonlocal spawned
            try:
                async for msg in request_iterator:
                    for p in msg.proposals:
                        await room.acquire()
                        task = asyncio.create_task(one(p))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        spawned += 1
            finally:
                outcomes.put_nowait(None)  # the caller sent its last proposal

        rt = self.lc.rt
        rt.propose_streams += 1
        reader = asyncio.create_task(read())
        answered = 0
        ended = False
        try:
            # once the reader ended, ``spawned`` is final: answer every proposal it took
            while not ended or answered < spawned:
                batch: list[ledger_pb2.ProposalOutcome] = []
                item = await outcomes.get()
                while True:
                    if item is None:
                        ended = True
                    else:
                        batch.append(item)
                    if outcomes.empty():
                        break
                    item = outcomes.get_nowait()
                if batch:
                    answered += len(batch)
                    rt.streamed_outcomes += len(batch)
                    rt.streamed_outcome_messages += 1
                    yield ledger_pb2.ProposeStreamResponse(outcomes=batch)
        finally:
            rt.propose_streams_ended += 1
            reader.cancel()
            for task in tasks:
                task.cancel()

    async def Subscribe(
        self, request: ledger_pb2.SubscribeRequest, context: Ctx
    ) -> AsyncIterator[ledger_pb2.SubscribeResponse]:
        if self.drain.draining:  # a stopping member: subscribe to another one
            await abort_with(context, self.drain.refusal())
        events = self.lc.subscribe(request.repo, request.incarnation, request.after_version)
        try:
            # closed with the call: a subscriber that goes (a compute evicting its view)
            # ends the stream here at once, not when the generator is collected
            async with contextlib.aclosing(events):
                async for ev in events:
                    out = _responses(ev)
                    del ev
                    for resp in out:
                        yield resp
                    # parked until the next change (docs/raft.md, "Parked subscriptions"):
                    # hold no event, snapshot part or layer bytes while waiting
                    del resp, out
        except EnrouteError as e:
            await abort_with(context, e)

    async def Follow(
        self, request_iterator: AsyncIterator[ledger_pb2.FollowRequest], context: Ctx
    ) -> AsyncIterator[ledger_pb2.FollowResponse]:
        """Many subscriptions on one call (docs/rpc.md, Follow; enroute_ledger.follow).

        The caller's Follow and Unfollow are read as they come; each follow is a cursor
        that its group's changes mark due, and this generator sends what is due. The
        call ends when the caller closes its side or goes away; its follows go with it.
        """
        stream = FollowStream(self.lc)

        async def read() -> None:
            try:
                async for req in request_iterator:
                    op = req.WhichOneof("op")
                    if op == "follow":
                        f = req.follow
                        if self.drain.draining:  # a stopping member: follow on another one
                            stream.refuse(f.id, f.repo, self.drain.refusal())
                        else:
                            stream.follow(f.id, f.repo, f.incarnation, f.after_version)
                    elif op == "unfollow":
                        stream.unfollow(req.unfollow.id)
            finally:
                stream.end()

        rt = self.lc.rt
        rt.follow_streams += 1
        reader = asyncio.create_task(read(), context=contextvars.Context())
        try:
            while batch := await stream.next_batch():
                yield ledger_pb2.FollowResponse(events=[_follow_event(i, p) for i, p in batch])
                del batch  # parked below: hold no change or snapshot bytes
        finally:
            rt.follow_streams_ended += 1
            reader.cancel()
            follows = len(stream.cursors)
            stream.close()
            # a compute's subscriptions end with it: it went away, or is stopping
            log.info("follow stream from %s ended with %d follows", context.peer(), follows)

    async def Barrier(
        self, request: ledger_pb2.BarrierRequest, context: Ctx
    ) -> ledger_pb2.BarrierResponse:
        try:
            with self.drain.call():
                st = await self.lc.barrier(request.repo)
            return ledger_pb2.BarrierResponse(
                incarnation=st.incarnation, version=st.version, deleted=st.deleted
            )
        except EnrouteError as e:
            await abort_with(context, e)


class RaftTransportServicer(ledger_pb2_grpc.RaftTransportServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    async def Send(
        self, request_iterator: AsyncIterator[ledger_pb2.RaftBatch], context: Ctx
    ) -> ledger_pb2.SendResponse:
        try:
            async for req in request_iterator:
                if req.to_node != self.rt.config.node_id:
                    raise InvalidArgument("batch addressed to another node", to_node=req.to_node)
                self.rt.step(batch_from_proto(req))
            return ledger_pb2.SendResponse()
        except EnrouteError as e:
            await abort_with(context, e)
        except grpc.aio.AioRpcError:
            return ledger_pb2.SendResponse()

    async def SendSnapshot(
        self, request_iterator: AsyncIterator[ledger_pb2.SnapshotChunk], context: Ctx
    ) -> ledger_pb2.SendSnapshotResponse:
        """A leader's snapshot in chunks: reassembled, checked, stepped as one SNAP message."""
        try:
            asm = SnapshotAssembler(
                self.rt.config.node_id, DEFAULT_LIMITS.ledger_record_bytes_max - 1024
            )
            async for chunk in request_iterator:
                asm.feed(chunk)
            self.rt.step(asm.finish())
            self.rt.snapshots_received += 1
            return ledger_pb2.SendSnapshotResponse()
        except EnrouteError as e:
            await abort_with(context, e)


def _responses(ev: SnapshotOut | ChangeOut) -> Iterator[ledger_pb2.SubscribeResponse]:
    """The responses of one subscription event: a change, or a snapshot's inline layers
    then its parts (at least one, so a subscriber always sees the snapshot end)."""
    if isinstance(ev, ChangeOut):
        change = ledger_pb2.Change(version=ev.version, effects=ev.change)
        yield ledger_pb2.SubscribeResponse(changes=ledger_pb2.ChangeBatch(changes=[change]))
        return
    for piece in snapshot_pieces(ev):
        if isinstance(piece, InlineOut):
            yield ledger_pb2.SubscribeResponse(inline_layer=_inline(piece))
        else:
            yield ledger_pb2.SubscribeResponse(snapshot=_part(piece))


def _inline(p: InlineOut) -> ledger_pb2.InlineLayer:
    return ledger_pb2.InlineLayer(root=p.root, data=p.data)


def _part(p: PartOut) -> ledger_pb2.SnapshotPart:
    return ledger_pb2.SnapshotPart(
        incarnation=p.incarnation, version=p.version, data=p.data, last=p.last
    )


def _follow_event(id_: int, p: Piece) -> ledger_pb2.FollowEvent:
    if isinstance(p, ChangesOut):
        changes = [ledger_pb2.Change(version=v, effects=c) for v, c in p.changes]
        return ledger_pb2.FollowEvent(id=id_, changes=ledger_pb2.ChangeBatch(changes=changes))
    if isinstance(p, PartOut):
        return ledger_pb2.FollowEvent(id=id_, snapshot=_part(p))
    if isinstance(p, InlineOut):
        return ledger_pb2.FollowEvent(id=id_, inline_layer=_inline(p))
    return ledger_pb2.FollowEvent(id=id_, ended=follow_ended(p.error))
