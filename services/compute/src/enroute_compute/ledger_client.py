"""The gRPC :class:`~enroute_compute.ledger_port.LedgerPort` against ``enroute.ledger.v1.Ledger``.

docs/rpc.md, "Ledger": any member answers any call, so calls go to one member
and move to the next when it is unavailable; List asks every member and the
caller merges. Commands, changes and checkpoints are encoded with
``enroute_core.state``'s codec; failures come back as the typed errors of the
table (:mod:`enroute_compute.rpc.errors`). Every call has a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import MappingProxyType
from typing import Any

import grpc

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
from enroute_core.base.errors import EnrouteError, Unavailable
from enroute_core.state import Command, decode_change, decode_state, encode_command
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc

CALL_TIMEOUT_S = 10.0


class GrpcLedger:
    """A LedgerPort over gRPC to the members at ``addresses`` (``HOST:PORT``)."""

    def __init__(self, addresses: tuple[str, ...], *, timeout_s: float = CALL_TIMEOUT_S) -> None:
        if not addresses:
            raise Unavailable("no ledger members configured (ledger.members)")
        self._addresses = tuple(addresses)
        self._channels = [grpc.aio.insecure_channel(a) for a in addresses]
        self._retiring: dict[asyncio.Task[None], grpc.aio.Channel] = {}
        self._stubs = [ledger_pb2_grpc.LedgerStub(c) for c in self._channels]
        self._next = 0
        self._timeout = timeout_s

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
        self._channels = [
            old.pop(a) if a in old else grpc.aio.insecure_channel(a) for a in addresses
        ]
        self._stubs = [ledger_pb2_grpc.LedgerStub(c) for c in self._channels]
        # keep talking to the member that answered last, when it stays
        self._next = self._addresses.index(current) if current in self._addresses else 0
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

    async def activate(self, name: str, create: CreateMode, head: bytes) -> Activated:
        req = ledger_pb2.ActivateRequest(repo=name, create=CREATE_MODES[create], head=head)
        resp: ledger_pb2.ActivateResponse = await self._call(
            lambda s: s.Activate(req, timeout=self._timeout)
        )
        return Activated(summary_from_pb(resp.state), resp.created)

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
        for stub in self._stubs:
            try:
                resp = await stub.List(req, timeout=self._timeout)
            except grpc.RpcError as exc:
                failure = error_from_rpc(exc)
                continue
            pages.append(ListPage(tuple(summary_from_pb(r) for r in resp.repositories), resp.more))
        if not pages and failure is not None:
            raise failure
        return pages

    async def delete(self, name: str) -> RepoSummary | None:
        req = ledger_pb2.DeleteRequest(repo=name)
        resp: ledger_pb2.DeleteResponse = await self._call(
            lambda s: s.Delete(req, timeout=self._timeout)
        )
        return summary_from_pb(resp.state) if resp.HasField("state") else None

    async def propose(self, name: str, incarnation: int, command: Command) -> Proposed:
        req = ledger_pb2.ProposeRequest(
            repo=name, incarnation=incarnation, command=encode_command(command)
        )
        resp: ledger_pb2.ProposeResponse = await self._call(
            lambda s: s.Propose(req, timeout=self._timeout)
        )
        return Proposed(resp.version, decode_change(resp.effects))

    async def subscribe(
        self, name: str, incarnation: int, after_version: int
    ) -> AsyncIterator[FollowEvent]:
        req = ledger_pb2.SubscribeRequest(
            repo=name, incarnation=incarnation, after_version=after_version
        )
        stub = self._stubs[self._next]
        call = stub.Subscribe(req)
        parts: list[bytes] = []
        inline: dict[bytes, bytes] = {}
        try:
            async for msg in call:
                if msg.HasField("inline_layer"):
                    inline[msg.inline_layer.root] = msg.inline_layer.data
                    continue
                if msg.HasField("snapshot"):
                    parts.append(msg.snapshot.data)
                    if msg.snapshot.last:
                        state = decode_state(b"".join(parts))
                        yield SnapshotEvent(state, MappingProxyType(inline))
                        parts, inline = [], {}
                    continue
                for change in msg.changes.changes:
                    yield ChangeEvent(change.version, decode_change(change.effects))
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()

    async def barrier(self, name: str) -> BarrierPoint:
        req = ledger_pb2.BarrierRequest(repo=name)
        resp: ledger_pb2.BarrierResponse = await self._call(
            lambda s: s.Barrier(req, timeout=self._timeout)
        )
        return BarrierPoint(resp.incarnation, resp.version, resp.deleted)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        for channel in list(self._retiring.values()):
            await channel.close()
