"""A real `enroute dev` per test module, and a raw smart-HTTP client for hostile requests.

Started as an operator starts it (DESIGN.md "Processes"): `enroute dev --listen
127.0.0.1:0 --data DIR`, ready on `enroute ready: URL`, stopped with SIGTERM.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.devserver import running_dev


@pytest.fixture(scope="module")
def enroute_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (`http://HOST:PORT`) of a running `enroute dev`, one per module."""
    with running_dev(tmp_path_factory.mktemp("enroute-hostile")) as dev:
        yield dev.url


# hostile_wire.py sits beside this file; the tests import it by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))
