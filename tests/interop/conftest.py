"""A real `enroute dev` for end-to-end client tests, one per test session.

Started as an operator starts it (`enroute_testing.devserver`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from enroute_testing.devserver import DevServer, running_dev


@pytest.fixture(scope="session")
def enroute_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """The session's running `enroute dev`; its data lies beside its log (``ROOT/data``)."""
    with running_dev(tmp_path_factory.mktemp("enroute-dev")) as dev:
        yield dev


@pytest.fixture(scope="session")
def enroute_url(enroute_dev: DevServer) -> str:
    """Base URL (`http://HOST:PORT`, no trailing slash) of a running `enroute dev`."""
    return enroute_dev.url
