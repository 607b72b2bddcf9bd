"""STYLE rule 1: the pure layers import no I/O and never call ``open()``.

import-linter (``make imports``) keeps layers pointing down; this AST scan
covers what it cannot: standard-library modules and builtins.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE_PACKAGES = [
    ROOT / "libs/enroute-core/src/enroute_core/git",
    ROOT / "libs/enroute-core/src/enroute_core/base",
    ROOT / "libs/enroute-core/src/enroute_core/state",
    ROOT / "libs/enroute-core/src/enroute_core/protocol",
    ROOT / "services/ledger/src/enroute_ledger/raft",
    ROOT / "services/ledger/src/enroute_ledger/multiraft",
]
FORBIDDEN_MODULES = {
    "asyncio", "socket", "os", "io", "pathlib", "mmap", "threading", "time", "random",
    "grpc", "subprocess", "shutil", "tempfile", "select", "selectors",
}  # fmt: skip
FORBIDDEN_CALLS = {"open", "input", "print"}


def _pure_files() -> list[Path]:
    return sorted(p for pkg in PURE_PACKAGES if pkg.exists() for p in pkg.rglob("*.py"))


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{path.name}:{node.lineno} imports {name}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    return found


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_does_no_io(path: Path) -> None:
    assert _violations(path) == []


def test_scan_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom time import monotonic\nopen('x')\n")
    assert len(_violations(bad)) == 3
