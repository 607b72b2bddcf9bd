"""Which compute serves a repository: rendezvous hashing with failover.

DESIGN.md, "Processes": gitproto routes a repository to a compute by
rendezvous (highest random weight) hashing of its name, so each view is warm
on one node, and fails over to the next when that node is UNAVAILABLE. Adding
or removing a member moves only the names it wins or held.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import grpc

from enroute_core.base.errors import Unavailable
from enroute_core.base.limits import DEFAULT_LIMITS
from enroute_proto.channels import open_channel
from enroute_proto.gen.enroute.compute.v1.compute_pb2_grpc import ComputeStub

if TYPE_CHECKING:
    from enroute_proto.gen.enroute.compute.v1.compute_pb2_grpc import ComputeAsyncStub

T = TypeVar("T")
LIST_KEY = ""
"""Routing key of calls that name no repository (ListRepositories)."""


def rendezvous_weight(member: str, key: str) -> int:
    digest = hashlib.blake2b(member.encode() + b"\x00" + key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, members: Sequence[str]) -> list[str]:
    """Members by decreasing weight for ``key``: the first serves it, the rest are failovers."""
    return sorted(members, key=lambda member: (-rendezvous_weight(member, key), member))


FAILOVER_WAIT_S = 3.0
"""Default of ``compute.failover_wait``: see :meth:`ComputePool.call`."""


class ComputePool:
    """One gRPC channel per compute member, created lazily inside the serving event loop."""

    def __init__(
        self,
        members: Sequence[str],
        retire_grace_s: float = 60.0,
        ready_wait_s: float = FAILOVER_WAIT_S,
        *,
        message_bytes_max: int = DEFAULT_LIMITS.rpc_message_bytes_max,
    ) -> None:
        self.members: tuple[str, ...] = tuple(dict.fromkeys(members))
        self.message_bytes_max = message_bytes_max
        self.retire_grace_s = retire_grace_s
        self.ready_wait_s = ready_wait_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, ComputeAsyncStub] = {}
        self._retiring: dict[asyncio.Task[None], grpc.aio.Channel] = {}
        self.failovers_total = 0

    def set_members(self, members: Sequence[str]) -> None:
        """Route to ``members`` from now on; channels to departed ones close after a grace.

        Calls already streaming through a departed member (a clone in progress)
        keep their channel for ``retire_grace_s`` before it is cancelled, so a
        scale-down does not cut transfers that were nearly done.
        """
        self.members = tuple(dict.fromkeys(members))
        for gone in set(self._channels) - set(self.members):
            channel = self._channels.pop(gone)
            self._stubs.pop(gone, None)
            task = asyncio.get_running_loop().create_task(channel.close(self.retire_grace_s))
            self._retiring[task] = channel
            task.add_done_callback(lambda done: self._retiring.pop(done, None))

    def order(self, key: str) -> list[str]:
        return rendezvous_order(key, self.members)

    def _channel(self, member: str) -> grpc.aio.Channel:
        channel = self._channels.get(member)
        if channel is None:
            channel = self._channels[member] = open_channel(
                member, message_bytes_max=self.message_bytes_max
            )
        return channel

    def stub(self, member: str) -> ComputeAsyncStub:
        stub = self._stubs.get(member)
        if stub is None:
            stub = self._stubs[member] = ComputeStub(self._channel(member))
        return stub

    async def close(self) -> None:
        for channel in list(self._retiring.values()):
            await channel.close()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    async def call(self, key: str, attempt: Callable[[ComputeAsyncStub], Awaitable[T]]) -> T:
        """Run ``attempt`` on the member that owns ``key``, then on the next while UNAVAILABLE.

        ``attempt`` must have sent nothing to the client when it raises: only
        then is trying another member safe. When every member refused, the
        call waits (at most ``ready_wait_s``) for a member's channel to connect
        and tries them all once more: right after computes restart, their
        channels are still between reconnect attempts and would refuse at once
        a call that a moment later succeeds.
        """
        order = self.order(key)
        if not order:
            raise Unavailable("no compute members are configured (compute.members)")
        last: grpc.aio.AioRpcError | None = None
        for final in (False, True):
            for member in order:
                if last is not None:
                    self.failovers_total += 1
                try:
                    return await attempt(self.stub(member))
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    last = error
            if final or not await self._any_ready(order):
                break
        assert last is not None
        raise last

    async def _any_ready(self, members: Sequence[str]) -> bool:
        """Whether a channel to one of ``members`` connects within ``ready_wait_s``."""
        waits = [asyncio.ensure_future(self._channel(m).channel_ready()) for m in members]
        try:
            done, _ = await asyncio.wait(
                waits, timeout=self.ready_wait_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
        return bool(done)
