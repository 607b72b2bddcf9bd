"""Fail when the committed stubs in src/enroute_proto/gen differ from a fresh generation.

Regenerates into a temporary directory with ``generate.py`` and compares the
two trees byte for byte (``__pycache__`` aside). Any difference is printed as
a unified diff (or named, for missing and extra files) and the exit status
is 1. STYLE rule 10.

Usage: ``python libs/enroute-proto/scripts/check.py``
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

_SCRIPTS = Path(__file__).resolve().parent


def _load_generate() -> ModuleType:
    path = _SCRIPTS / "generate.py"
    spec = importlib.util.spec_from_file_location("enroute_proto_generate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generate()


def _files(tree: Path) -> dict[str, bytes]:
    return {
        p.relative_to(tree).as_posix(): p.read_bytes()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and "__pycache__" not in p.relative_to(tree).parts
    }


def differences(gen_dir: Path | None = None, proto_dir: Path | None = None) -> list[str]:
    """Human-readable differences between the committed and a fresh tree; empty when current."""
    committed_dir = gen_dir if gen_dir is not None else generate.GEN_DIR
    sources = proto_dir if proto_dir is not None else generate.PROTO_DIR
    with tempfile.TemporaryDirectory(prefix="enroute-proto-check-") as staging:
        fresh_dir = Path(staging)
        generate.build_tree(fresh_dir, sources)
        fresh = _files(fresh_dir)
    committed = _files(committed_dir) if committed_dir.is_dir() else {}
    found: list[str] = []
    for name in sorted(fresh.keys() - committed.keys()):
        found.append(f"missing from the committed stubs: {name}\n")
    for name in sorted(committed.keys() - fresh.keys()):
        found.append(f"not produced by generation (stale or hand-made): {name}\n")
    for name in sorted(fresh.keys() & committed.keys()):
        old, new = committed[name], fresh[name]
        if old == new:
            continue
        diff = difflib.unified_diff(
            old.decode("utf-8", "replace").splitlines(keepends=True),
            new.decode("utf-8", "replace").splitlines(keepends=True),
            fromfile=f"committed/{name}",
            tofile=f"generated/{name}",
        )
        text = "".join(diff)
        found.append(text if text else f"{name}: bytes differ (line endings or encoding)\n")
    return found


def main() -> int:
    try:
        found = differences()
    except generate.GenerationError as exc:
        sys.stderr.write(f"proto-check: {exc}\n")
        return 1
    if found:
        sys.stdout.write("".join(found))
        versions = ", ".join(f"{k} {v}" for k, v in generate.tool_versions().items())
        sys.stdout.write(
            f"proto-check: the committed stubs are stale ({len(found)} files differ; "
            f"generators here: {versions}).\n"
            "Run: python libs/enroute-proto/scripts/generate.py\n"
        )
        return 1
    sys.stdout.write("proto-check: the committed stubs are current\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
