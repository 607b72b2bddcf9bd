"""Client channels between Enroute processes, with a bounded reconnect backoff.

gRPC's default reconnect backoff starts at 1 s and grows by 1.6x up to two
minutes; while a channel waits out its backoff, every call on it fails at
once with UNAVAILABLE. After a peer restarts (a compute rolled, every process
restarted at once) a long-lived channel could then refuse calls for tens of
seconds although the peer is back. Our peers are a handful of processes on a
local network, so reconnect attempts are cheap: the backoff here starts at
:data:`RECONNECT_MIN_MS` and never exceeds :data:`RECONNECT_MAX_MS`
(docs/rpc.md, "Channels").

Both ends of every channel also bound one message by the same number, the
``rpc_message_bytes_max`` resource limit: gRPC's default receive bound (4 MiB)
refused legal requests, such as a log command, a Raft batch or an API
commit over 4 MiB (docs/rpc.md, "Message size").
"""

from __future__ import annotations

import grpc

from enroute_proto.peer_token import client_interceptors

__all__ = [
    "RECONNECT_MAX_MS",
    "RECONNECT_MIN_MS",
    "channel_options",
    "open_channel",
    "server_options",
]

RECONNECT_MIN_MS = 100
"""First reconnect delay after a connection fails."""

RECONNECT_MAX_MS = 1000
"""Longest delay between reconnect attempts: a restarted peer is reached within it."""


def server_options(message_bytes_max: int) -> list[tuple[str, int]]:
    """Options of a gRPC server: messages up to ``message_bytes_max`` each way."""
    return [
        ("grpc.max_receive_message_length", message_bytes_max),
        ("grpc.max_send_message_length", message_bytes_max),
    ]


def channel_options(message_bytes_max: int) -> list[tuple[str, int]]:
    return [
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_MIN_MS),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_MIN_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
        *server_options(message_bytes_max),
    ]


def open_channel(address: str, *, message_bytes_max: int) -> grpc.aio.Channel:
    """An asyncio channel to another Enroute process (plaintext inside the cluster; every
    call carries the internal token when the process has one, peer_token.py)."""
    return grpc.aio.insecure_channel(
        address,
        options=channel_options(message_bytes_max),
        interceptors=client_interceptors(),  # the internal token (peer_token.py)
    )
