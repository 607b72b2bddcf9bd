"""Static rules of docker/Dockerfile (DESIGN "Deployment"), checked without a Docker engine.

Each role's target must: run as a numeric non-root user, have no HEALTHCHECK
(Kubernetes probes /healthz and /readyz), start from a pinned slim Python 3.11,
install from uv.lock with ``--locked`` and without dev dependencies, never run
Python with ``-O`` (asserts guard invariants), and start with an exec-form
ENTRYPOINT ``python -m enroute_<role>``. The checker is run on mutated copies
too, so each rule is shown to catch what it names.
"""

from __future__ import annotations

import importlib.util

import pytest
from dockerrules import DOCKERFILE, ROLES, dockerfile_problems

pytestmark = pytest.mark.deploy


def test_dockerfile_follows_the_rules() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


def test_entrypoint_modules_exist() -> None:
    for role in ROLES:
        assert importlib.util.find_spec(f"enroute_{role}.__main__") is not None, role


def test_dockerignore_keeps_the_lock_and_sources() -> None:
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    for kept in ("!pyproject.toml", "!uv.lock", "!libs/*/src/**", "!services/*/src/**"):
        assert kept in ignore


def _mutated(old: str, new: str) -> str:
    text = DOCKERFILE.read_text()
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("USER 10001:10001", "USER root", "USER is not a numeric non-root uid"),
        ("USER 10001:10001", "USER 0:0", "USER is not a numeric non-root uid"),
        ("USER 10001:10001", "USER enroute", "USER is not a numeric non-root uid"),
        ("WORKDIR /data\n", "WORKDIR /data\nHEALTHCHECK CMD curl -f localhost\n", "HEALTHCHECK"),
        (
            'ENTRYPOINT ["python", "-m", "enroute_ledger"]',
            "ENTRYPOINT python -m enroute_ledger",
            "not in exec form",
        ),
        (
            'ENTRYPOINT ["python", "-m", "enroute_compute"]',
            'ENTRYPOINT ["python", "-O", "-m", "enroute_compute"]',
            "-O",
        ),
        ("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=1 PYTHONOPTIMIZE=1", "PYTHONOPTIMIZE"),
        (
            "FROM python:3.11.14-slim-trixie AS runtime",
            "FROM python:3.11-slim AS runtime",
            "not a pinned",
        ),
        (
            "FROM python:3.11.14-slim-trixie AS builder",
            "FROM python:3.12.8-slim AS builder",
            "not a pinned",
        ),
        ("uv sync --locked --no-dev", "uv sync --no-dev", "without --locked"),
        ("uv sync --locked --no-dev", "uv sync --locked", "without --no-dev"),
        ("COPY pyproject.toml uv.lock ./", "COPY pyproject.toml ./", "uv.lock is not copied"),
        ("FROM runtime AS gitproto", "FROM runtime AS git", "no target gitproto"),
    ],
)
def test_rules_catch_violations(old: str, new: str, expected: str) -> None:
    problems = dockerfile_problems(_mutated(old, new))
    assert any(expected in p for p in problems), problems
