"""REST /api/v1 never answers 5xx, whatever the request (DESIGN.md, "External interfaces").

The operations come from the server's own OpenAPI document: for each one,
hypothesis builds path names (arbitrary text with '/', '%2F', '..', unicode,
invalid UTF-8, very long), bodies (arbitrary JSON, schema-shaped values with
wrong-typed fields, non-JSON bytes) and query strings, sends them, and checks
the status is below 500 and that an error has the documented shape.
Randomised: prints its seed; ENROUTE_SEED=N replays one run.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
from typing import Any
from urllib.parse import quote, quote_from_bytes, urlencode, urlsplit

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.interop

EXAMPLES_PER_OPERATION = 60
KNOWN = "fuzz/known"
"""A repository that exists, so sub-resources and commits get past the lookup."""
TIMEOUT_S = 30.0
METHODS = ("get", "put", "post", "delete", "patch")
JSON_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)

# Path names: the interesting pieces, glued in any order, then encoded several ways.
NAME_PIECES = st.sampled_from(
    ["/", "%2F", "%2f", "..", ".", "-", "/-/", "a", "team", "app.git", "%", "%zz", "~", " ", "é",
     "\u2603", "\x00", "?", "#", "refs", "commits"]
)  # fmt: skip
SEGMENT = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)
VALID_NAMES = st.lists(SEGMENT, min_size=1, max_size=4).map("/".join)
RAW_NAMES = st.one_of(
    st.lists(NAME_PIECES | SEGMENT, max_size=8).map("".join),
    st.text(max_size=60),
    st.text(alphabet="ab/.%2F-", min_size=200, max_size=700),
    st.integers(min_value=240, max_value=5000).map(lambda n: "x" * n),
    VALID_NAMES,
)


@st.composite
def path_names(draw: st.DrawFn) -> str:
    """The encoded name as it goes on the request line (always legal HTTP target syntax)."""
    choice = draw(st.integers(0, 5))
    if choice == 4:
        return draw(st.sampled_from([KNOWN, KNOWN.replace("/", "%2F"), KNOWN + ".git"]))
    if choice == 3:
        return quote_from_bytes(draw(st.binary(max_size=40)), safe="/%")
    name = draw(RAW_NAMES)
    safe = draw(st.sampled_from(["/%", "/", "", "%"]))
    return quote(name, safe=safe)


def resolve(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        target: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = target
    return schema


def shaped(schema: dict[str, Any], doc: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that follow ``schema`` at the top, with any field possibly of the wrong type."""
    schema = resolve(schema, doc)
    wrong = JSON_VALUES
    if depth > 4:
        return wrong
    if "oneOf" in schema:
        return st.one_of([shaped(s, doc, depth + 1) for s in schema["oneOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) | wrong
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    options: list[st.SearchStrategy[Any]] = []
    for kind in kinds:
        if kind == "object":
            properties = schema.get("properties", {})
            fields = {key: shaped(sub, doc, depth + 1) for key, sub in properties.items()}
            options.append(
                st.fixed_dictionaries({}, optional=fields) | st.fixed_dictionaries(fields)
            )
        elif kind == "array":
            options.append(st.lists(shaped(schema.get("items", {}), doc, depth + 1), max_size=3))
        elif kind == "string":
            if "pattern" in schema:
                options.append(st.from_regex(schema["pattern"], fullmatch=True))
            options.append(
                st.text(max_size=30) | VALID_NAMES | st.sampled_from(["main", "refs/heads/main"])
            )
        elif kind == "integer":
            options.append(st.integers())
        elif kind == "boolean":
            options.append(st.booleans())
        elif kind == "null":
            options.append(st.none())
    if not options:
        return wrong
    return st.one_of(*options) | wrong


def bodies(schema: dict[str, Any] | None, doc: dict[str, Any]) -> st.SearchStrategy[bytes | None]:
    encoded = st.one_of(JSON_VALUES, shaped(schema or {}, doc)).map(
        lambda v: json.dumps(v).encode()
    )
    garbage = st.binary(max_size=200) | st.just(b"{") | st.just(b"\xff\xfe")
    big_number = st.just(b'{"name": ' + b"9" * 5000 + b"}")
    return st.one_of(encoded, encoded, encoded, garbage, big_number, st.none())


def queries() -> st.SearchStrategy[str]:
    param = st.text(max_size=30) | st.integers().map(str) | st.just("")
    pairs = st.fixed_dictionaries({}, optional={"limit": param, "page_token": param})
    encoded = pairs.map(urlencode)
    raw = st.text(alphabet="limt_pagek=&%0-9+ zZ", max_size=40).map(lambda q: quote(q, safe="=&%+"))
    return st.one_of(encoded, raw, st.just(""))


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for template, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                found.append((template, method.upper(), item[method]))
    return found


def send(url: str, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT_S)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def openapi(enroute_url: str) -> dict[str, Any]:
    status, raw = send(enroute_url, "GET", "/api/v1/openapi.json", None)
    assert status == 200
    created, _ = send(enroute_url, "POST", "/api/v1/repos", json.dumps({"name": KNOWN}).encode())
    assert created in (200, 201)
    doc: dict[str, Any] = json.loads(raw)
    return doc


def test_openapi_lists_every_operation(openapi: dict[str, Any]) -> None:
    listed = {(template, method) for template, method, _ in operations(openapi)}
    assert listed == {
        ("/api/v1/repos", "POST"), ("/api/v1/repos", "GET"),
        ("/api/v1/repos/{name}", "GET"), ("/api/v1/repos/{name}", "DELETE"),
        ("/api/v1/repos/{name}/-/refs", "GET"), ("/api/v1/repos/{name}/-/commits", "POST"),
    }  # fmt: skip


RUN_SEED = int(os.environ.get("ENROUTE_SEED", random.randrange(2**32)))


@pytest.mark.parametrize(
    ("template", "method"),
    [
        ("/api/v1/repos", "POST"), ("/api/v1/repos", "GET"),
        ("/api/v1/repos/{name}", "GET"), ("/api/v1/repos/{name}", "DELETE"),
        ("/api/v1/repos/{name}/-/refs", "GET"), ("/api/v1/repos/{name}/-/commits", "POST"),
    ],
)  # fmt: skip
def test_operation_never_answers_5xx(
    enroute_url: str, openapi: dict[str, Any], template: str, method: str
) -> None:
    print(f"ENROUTE_SEED={RUN_SEED}")
    operation = openapi["paths"][template][method.lower()]
    schema = None
    if "requestBody" in operation:
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
    has_name = "{name}" in template
    body_strategy = (
        bodies(schema, openapi) if schema is not None else st.none() | bodies(None, openapi)
    )
    query_strategy = queries() if method == "GET" and not has_name else st.just("") | queries()

    @seed(RUN_SEED)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(name=path_names(), body=body_strategy, query=query_strategy)
    def check(name: str, body: bytes | None, query: str) -> None:
        path = template.replace("{name}", name) if has_name else template
        target = path + (f"?{query}" if query else "")
        status, raw = send(enroute_url, method, target, body)
        request = f"{method} {target[:300]!r} body={body[:300] if body else body!r}"
        assert status < 500, f"{request}\n-> {status} {raw[:500]!r}"
        if status >= 400:
            error = json.loads(raw)["error"]
            assert isinstance(error["code"], str) and re.fullmatch(r"[a-z_]+", error["code"]), (
                f"{request}\n-> {status} {raw[:500]!r}"
            )

    check()
