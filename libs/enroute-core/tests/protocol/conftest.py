"""Shared fixture: drive a conversation over bytes in chunks, collect its events (h11 ``tr``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from enroute_core.git.pktline import NEED_DATA
from enroute_core.protocol.fetch import RequestEnd, SessionEnd
from enroute_core.protocol.receive import PackChunk, PushEnd

_TERMINAL = (SessionEnd, RequestEnd, PushEnd)


def _drive(conversation: Any, data: bytes, chunk: int | None = None) -> list[Any]:
    """Feed ``data`` (whole or ``chunk`` bytes at a time), then EOF; events until terminal."""
    events: list[Any] = []
    pieces = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    for piece in pieces:
        conversation.feed(piece)
        while True:
            event = conversation.next_event()
            if event is NEED_DATA:
                break
            events.append(event)
            if isinstance(event, _TERMINAL):
                return _merge(events)
    conversation.feed_eof()
    for _ in range(1_000_000):
        event = conversation.next_event()
        assert event is not NEED_DATA, "waiting after EOF"
        events.append(event)
        if isinstance(event, _TERMINAL):
            return _merge(events)
    raise AssertionError("no terminal event")


def _merge(events: list[Any]) -> list[Any]:
    """Pack chunks depend on how bytes were fed; join them so runs compare equal."""
    out: list[Any] = []
    for event in events:
        if isinstance(event, PackChunk) and out and isinstance(out[-1], PackChunk):
            out[-1] = PackChunk(out[-1].data + event.data)
        else:
            out.append(event)
    return out


@pytest.fixture
def drive() -> Callable[..., list[Any]]:
    return _drive
