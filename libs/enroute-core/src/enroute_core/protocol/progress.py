"""Progress lines on side-band channel 2, updated as git's ``progress.c`` updates them.

git redraws a progress line when its percentage changes or once a second (its
``progress_update`` timer), and always ends it with ``, done.``; a client that
said ``quiet`` (receive-pack) or ``no-progress`` (upload-pack), or asked for no
side-band, gets none (gitprotocol-capabilities, "quiet", "no-progress"). The
text is :func:`~enroute_core.git.sideband.progress_text`. Sans-IO: the caller
passes a monotonic reading in, and sends the bytes it gets back.
"""

from __future__ import annotations

from typing import Final

from enroute_core.git.sideband import BAND_PROGRESS, progress_text, sideband_pkt

__all__ = ["ProgressMeter", "humanise_bytes"]

REDRAW_NS: Final = 1_000_000_000
"""A line whose percentage stands still is redrawn at most this often (git: 1 s)."""


class ProgressMeter:
    """Band-2 packets for ``(stage, done, total)`` updates; ``b""`` when none is due."""

    __slots__ = ("_drawn_ns", "_percent", "_stage", "shown")

    def __init__(self, *, shown: bool) -> None:
        self.shown = shown
        self._stage = ""
        self._percent = -1
        self._drawn_ns = 0

    def update(self, stage: str, done: int, total: int | None, now_ns: int) -> bytes:
        """An update of ``stage``; drawn when it is new, its percentage moved, or a second
        passed since the last drawing."""
        if not self.shown:
            return b""
        percent = done * 100 // total if total else -1
        if (
            stage == self._stage
            and (percent == self._percent or total is None)
            and now_ns - self._drawn_ns < REDRAW_NS
        ):
            return b""
        self._stage, self._percent, self._drawn_ns = stage, percent, now_ns
        return sideband_pkt(BAND_PROGRESS, progress_text(stage, done, total))

    def finish(self, stage: str, done: int, total: int | None = None) -> bytes:
        """The last drawing of ``stage``: ``, done.`` and a new line."""
        if not self.shown:
            return b""
        self._stage, self._percent = "", -1
        return sideband_pkt(BAND_PROGRESS, progress_text(stage, done, total, final=True))

    def line(self, text: str) -> bytes:
        """A line of its own (``Receiving pack: 82.31 MiB, done.``)."""
        if not self.shown:
            return b""
        return sideband_pkt(BAND_PROGRESS, text.encode() + b"\n")


def humanise_bytes(count: int) -> str:
    """A byte count as git's ``strbuf_humanise_bytes`` writes it (``82.31 MiB``)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            whole = count >> shift
            hundredths = (count & ((1 << shift) - 1)) * 100 >> shift
            return f"{whole}.{hundredths:02d} {unit}"
    return f"{count} bytes" if count != 1 else "1 byte"
