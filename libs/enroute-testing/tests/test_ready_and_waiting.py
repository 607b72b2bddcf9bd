"""The test kit's ready-line reader and bounded wait (DESIGN.md "Processes": a role's first
stdout line is ``enroute <role> ready: key=value ...``)."""

from __future__ import annotations

import asyncio
import io
import os
import time

import pytest

from enroute_testing.ready import latest_ready, parse_ready, read_ready, ready_in_log
from enroute_testing.waiting import WaitTimeout, until, wait_for_value, wait_until


def test_a_ready_line_gives_its_fields() -> None:
    line = "enroute compute ready: grpc=127.0.0.1:7100 http=127.0.0.1:9101\n"
    assert parse_ready(line, "compute") == {"grpc": "127.0.0.1:7100", "http": "127.0.0.1:9101"}


@pytest.mark.parametrize(
    "line",
    [
        "enroute ledger ready: grpc=a http=b",  # another role's
        "enroute ready: http://127.0.0.1:1",  # enroute dev's own
        "Traceback (most recent call last):",
        "",
    ],
)
def test_anything_else_is_refused_with_the_line(line: str) -> None:
    with pytest.raises(AssertionError, match="not a ready line of compute"):
        parse_ready(line, "compute")


def test_a_log_gives_every_start_of_the_role_in_order() -> None:
    log = (
        "enroute gitproto ready: http=h:1 ops=o:1\n"
        '{"msg": "enroute gitproto ready: http=x ops=y"}\n'  # not at a line start: not one
        "enroute compute ready: grpc=g http=c\n"
        "enroute gitproto ready: http=h:2 ops=o:2\n"
    )
    assert [r["ops"] for r in ready_in_log(log, "gitproto")] == ["o:1", "o:2"]
    assert latest_ready(log, "gitproto")["http"] == "h:2"
    with pytest.raises(AssertionError, match="no ready line of ledger"):
        latest_ready(log, "ledger")


def test_read_ready_reads_the_first_line_and_names_the_log_when_it_is_not_one() -> None:
    ok = io.StringIO("enroute ledger ready: grpc=g:1 http=h:1\nlater\n")
    assert read_ready(ok, "ledger", 5.0) == {"grpc": "g:1", "http": "h:1"}
    with pytest.raises(AssertionError, match="ledger did not start: 'boom\\\\n'\nthe tail"):
        read_ready(io.StringIO("boom\n"), "ledger", 5.0, lambda: "the tail")


def test_read_ready_is_bounded_when_the_process_prints_nothing() -> None:
    r, w = os.pipe()
    try:
        with os.fdopen(r) as silent:
            started = time.monotonic()
            with pytest.raises(AssertionError, match=r"nothing within 0\.2 s"):
                read_ready(silent, "compute", 0.2)
            assert time.monotonic() - started < 5.0
            os.write(w, b"\n")  # lets the daemon reader end
    finally:
        os.close(w)


def test_wait_until_returns_once_the_condition_holds() -> None:
    calls = iter([False, False, True])
    wait_until(lambda: next(calls), 5.0, "the third look")


def test_wait_until_fails_at_its_bound_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"not within 0\.1 s: the moon\nits log"):
        wait_until(lambda: False, 0.1, "the moon", explain=lambda: "its log")
    assert time.monotonic() - started < 5.0


def test_wait_for_value_gives_the_first_answer_that_is_not_none() -> None:
    answers = iter([None, None, 0, 7])
    assert wait_for_value(lambda: next(answers), 5.0, "an answer") == 0  # 0 is an answer
    with pytest.raises(WaitTimeout, match=r"not within 0\.1 s: no leader"):
        wait_for_value(lambda: None, 0.05, "no leader")


def test_until_lets_other_tasks_run_and_is_bounded() -> None:
    async def go() -> None:
        done: list[int] = []

        async def later() -> None:
            await asyncio.sleep(0.05)
            done.append(1)

        task = asyncio.create_task(later())
        await until(lambda: done, 5.0, "the other task")
        await task
        with pytest.raises(WaitTimeout, match="never"):
            await until(lambda: False, 0.05, "never")

    asyncio.run(go())
