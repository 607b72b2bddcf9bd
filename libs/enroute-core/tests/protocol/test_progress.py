"""Progress lines as git's progress.c draws them (``display``: ``%3u%% (%u/%u)``, ``\\r``
between redraws, ``, done.\\n`` at the end; a redraw on a new percentage or after 1 s),
and byte counts as ``strbuf_humanise_bytes`` writes them."""

from __future__ import annotations

from enroute_core.git.sideband import RECEIVE_KEEPALIVE, demux_payload, progress_text
from enroute_core.protocol.progress import REDRAW_NS, ProgressMeter, humanise_bytes


def test_progress_text_is_gits() -> None:
    assert progress_text("Resolving deltas", 450, 1000) == b"Resolving deltas:  45% (450/1000)\r"
    assert progress_text("Resolving deltas", 7, 1000) == b"Resolving deltas:   0% (7/1000)\r"
    final = progress_text("Resolving deltas", 1000, 1000, final=True)
    assert final == b"Resolving deltas: 100% (1000/1000), done.\n"
    assert progress_text("Enumerating objects", 9, final=True) == b"Enumerating objects: 9, done.\n"


def test_meter_redraws_on_a_new_percentage_or_after_a_second() -> None:
    meter = ProgressMeter(shown=True)
    first = meter.update("Indexing objects", 10, 1000, 0)
    assert demux_payload(first[4:]).message == b"Indexing objects:   1% (10/1000)\r"  # type: ignore[union-attr]
    assert meter.update("Indexing objects", 11, 1000, 1) == b""  # still 1%
    assert meter.update("Indexing objects", 12, 1000, REDRAW_NS) != b""  # a second later
    assert meter.update("Indexing objects", 20, 1000, REDRAW_NS + 1) != b""  # 2%
    assert meter.update("Checking connectivity", 1, 1000, REDRAW_NS + 2) != b""  # a new line
    assert meter.finish("Checking connectivity", 5, 5).endswith(b", done.\n")


def test_a_quiet_meter_draws_nothing() -> None:
    meter = ProgressMeter(shown=False)
    assert meter.update("x", 1, 2, 0) == meter.finish("x", 2, 2) == meter.line("y") == b""


def test_humanise_bytes() -> None:
    assert humanise_bytes(1) == "1 byte"
    assert humanise_bytes(1023) == "1023 bytes"
    assert humanise_bytes(20_840) == "20.35 KiB"
    assert humanise_bytes(86_307_225) == "82.30 MiB"
    assert humanise_bytes(3 << 30) == "3.00 GiB"


def test_receive_keepalive_is_an_empty_band_1_packet() -> None:
    """receive-pack.c ``copy_to_sideband``: ``static const char buf[] = "0005\\1"``."""
    assert RECEIVE_KEEPALIVE == b"0005\x01"
    assert demux_payload(RECEIVE_KEEPALIVE[4:]).data == b""  # type: ignore[union-attr]
