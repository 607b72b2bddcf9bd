"""The log line formats and the request context carried in gRPC metadata (enroute_proto.logs).

The end-to-end check, three real processes and the git CLI, is
tests/interop/test_logging.py; these pin the line shapes it relies on.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from enroute_proto.logs import (
    USER_KEY,
    audit,
    bind_metadata,
    call_metadata,
    configure_logging,
    current_request_id,
    log_context,
    note,
)
from enroute_proto.request_id import REQUEST_ID_KEY, new_request_id


@pytest.fixture(autouse=True)
def _root_logger() -> Iterator[None]:
    """configure_logging replaces the root handlers (pytest's among them): put them back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[str]:
    return [x for x in stream.getvalue().splitlines() if "enroute." in x]


def _capture(fmt: str) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(fmt, "debug", role="compute", node="c-1", stream=stream)  # type: ignore[arg-type]
    return stream


def test_json_lines_carry_context_extras_and_a_traceback_field() -> None:
    stream = _capture("json")

    async def request() -> None:
        log_context(request_id="ab" * 16)
        note(user="ci-bot", repo="team/app")
        logging.getLogger("enroute.test").info("hello %s", "world", extra={"status": 200})
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("enroute.test").exception("failed")

    asyncio.run(request())
    logging.getLogger("enroute.test").warning("outside")  # no request: no context fields
    lines = _lines(stream)
    first, second, third = (json.loads(x) for x in lines)
    assert first["msg"] == "hello world" and first["level"] == "info"
    assert (first["role"], first["node"], first["logger"]) == ("compute", "c-1", "enroute.test")
    assert (first["request_id"], first["user"], first["repo"]) == ("ab" * 16, "ci-bot", "team/app")
    assert first["status"] == 200 and first["ts"].endswith("Z")
    assert "ValueError: boom" in second["exc"] and "boom" in lines[1]
    assert "request_id" not in third


def test_text_lines_are_one_line_with_key_values_and_audit_lines_say_their_fields() -> None:
    stream = _capture("text")

    async def request() -> None:
        log_context(request_id="cd" * 16, user="ci-bot")
        logging.getLogger("enroute.test").info("moved", extra={"ref": "refs/heads/main"})
        audit("ref.update", repo="r", ref="refs/heads/main", old="0" * 40, new="1" * 40)

    asyncio.run(request())
    moved, audited = _lines(stream)
    assert moved.endswith(f" INFO enroute.test moved request_id={'cd' * 16} user=ci-bot "
                          "ref=refs/heads/main")  # fmt: skip
    assert "enroute.audit ref.update repo=r ref=refs/heads/main old=" in audited
    assert audited.count("ref=") == 1  # the fields are in the message, not repeated


def test_metadata_round_trip_keeps_the_id_and_makes_the_user_printable() -> None:
    async def gitproto_side() -> tuple[tuple[str, str], ...]:
        rid = new_request_id()
        log_context(request_id=rid.hex())
        note(user="bot\u00e9\n")
        assert current_request_id() == rid
        return call_metadata()

    metadata = asyncio.run(gitproto_side())
    assert dict(metadata)[USER_KEY] == "bot??"

    async def compute_side() -> tuple[bytes, tuple[tuple[str, str], ...]]:
        bind_metadata(metadata)
        return current_request_id(), call_metadata()

    rid, forwarded = asyncio.run(compute_side())
    assert rid.hex() == dict(metadata)[REQUEST_ID_KEY] and forwarded == metadata
    # outside any request: a fresh id each time (a background call names no request)
    assert current_request_id() != current_request_id()
