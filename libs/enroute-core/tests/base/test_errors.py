"""STYLE rule 4: one table, every code mapped, and the generated doc is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from enroute_core.base import errors
from enroute_core.base.errors import (
    ERROR_TABLE,
    CorruptData,
    EnrouteError,
    GitForm,
    LimitExceeded,
    render_error_table,
)

DOC = Path(__file__).resolve().parents[4] / "docs" / "errors.md"
GRPC_CODES = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
}  # fmt: skip


def test_every_code_has_a_class_and_a_valid_mapping() -> None:
    classes = {c.code for c in errors._all_error_classes(EnrouteError)}
    assert classes == set(ERROR_TABLE)
    for code, m in ERROR_TABLE.items():
        assert m.grpc_status in GRPC_CODES, code
        assert 400 <= m.http_status < 600, code
        assert isinstance(m.git_form, GitForm)


def test_a_class_with_an_unknown_code_is_refused() -> None:
    with pytest.raises(AssertionError):

        class Bogus(EnrouteError):
            code = "no_such_code"


def test_details_travel_with_the_error() -> None:
    e = CorruptData("bad chunk", section="data region", chunk=3)
    assert e.details == {"section": "data region", "chunk": 3}
    assert e.mapping.http_status == 500
    lim = LimitExceeded("pkt_line_bytes_max", 70000, 65520)
    assert lim.details["maximum"] == 65520 and "70000" in str(lim)


def test_generated_error_doc_is_current() -> None:
    assert DOC.read_text() == render_error_table(), (
        "docs/errors.md is stale: python -m enroute_core.base.errors > docs/errors.md"
    )


def test_a_private_subclass_elsewhere_leaves_the_doc_as_it_is() -> None:
    """A module's own marker of one case (the compute's evicted view) is no public name:
    which test process imported it must not decide what the document says."""
    before = render_error_table()

    class _Marker(errors.Unavailable):
        pass

    assert render_error_table() == before
