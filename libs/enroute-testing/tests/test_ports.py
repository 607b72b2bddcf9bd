"""free_port never names one port twice while its holder lives: in one process or across two."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from enroute_testing import ports


def _sequence(monkeypatch: pytest.MonkeyPatch, values: list[int]) -> None:
    it: Iterator[int] = iter(values)
    monkeypatch.setattr(ports._rng, "randrange", lambda low, high: next(it))


def _near(port: int) -> list[int]:
    """Other candidates, so a neighbour some other test holds does not decide the outcome."""
    return [p for p in range(port - 20, port + 20) if p != port and p >= ports._LOW]


def test_one_process_is_not_given_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ports.free_port()
    _sequence(monkeypatch, [first, first, *_near(first)])
    assert ports.free_port() != first


def test_a_port_another_live_process_took_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from enroute_testing import ports; "
         "print(ports.free_port(), flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        held = int(holder.stdout.readline())
        _sequence(monkeypatch, [held, *_near(held)])
        assert ports.free_port() != held
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    _sequence(monkeypatch, [held])  # the holder's exit released its claim
    assert ports.free_port() == held
