"""The fuzz targets (issue 8): one module per target, all marked ``fuzz``.

``fuzzkit`` (beside this file) holds the profiles, the seed and the mutators;
it is put on ``sys.path`` here so the target modules import it by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fuzzkit  # noqa: E402


@pytest.fixture(autouse=True)
def _print_seed() -> None:
    """Every target prints how to replay it (shown by pytest when it fails)."""
    print(fuzzkit.banner())
