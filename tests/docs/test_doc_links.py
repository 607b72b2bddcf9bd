"""The documentation stays navigable and its code references stay true.

Issue 22, "Reference docs": README links every page; a page nothing links to, a
relative link that does not resolve, or a `path:function` reference whose file or
function is gone fails here. The reference format is defined at the top of
docs/flows.md: a backticked repository-relative path, a colon, and a dotted name
(`services/compute/src/enroute_compute/push.py:Pusher.receive_pack`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# [text](target) with the target up to a space or ')'; images too (the '!' is outside).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# `path/file.ext:Name` or `path/file.ext:Class.method`
CODE_REF = re.compile(
    r"`([A-Za-z0-9_./-]+\.(?:py|pyi|c|h)):([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)`"
)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _text(path: Path) -> str:
    """The page without its fenced code blocks (shell examples are not links)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def relative_links(path: Path) -> list[tuple[str, Path]]:
    """Each relative link of ``path`` with the file it names (anchors and queries cut)."""
    found = []
    for target in LINK.findall(_text(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, https:, mailto: and in-page anchors
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        found.append((target, (path.parent / file_part).resolve()))
    return found


def defines(path: Path, dotted: str) -> bool:
    """Whether ``path`` defines ``dotted``: a Python module-level name (function, class,
    assignment) or a class's member, or a C function, macro or type."""
    source = path.read_text(encoding="utf-8")
    if path.suffix in (".py", ".pyi"):
        body: list[ast.stmt] = ast.parse(source).body
        for part in dotted.split("."):
            match = [node for node in body if part in _names(node)]
            if not match:
                return False
            node = match[0]
            body = node.body if isinstance(node, ast.ClassDef) else []
        return True
    name = re.escape(dotted)
    return bool(
        re.search(rf"^(?:[A-Za-z_][^;\n(]*[\s*])?{name}\s*\([^;{{]*\)\s*\{{", source, re.M)
        or re.search(rf"^#\s*define\s+{name}\b", source, re.M)
        or re.search(rf"\b(?:struct|typedef)\b[^;]*\b{name}\b", source)
    )


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def code_refs(path: Path) -> list[tuple[str, str]]:
    return CODE_REF.findall(path.read_text(encoding="utf-8"))


def test_readme_links_every_docs_page() -> None:
    linked = {target for _, target in relative_links(README)}
    missing = [str(p.relative_to(ROOT)) for p in _pages() if p.resolve() not in linked]
    assert not missing, f"README.md's Documentation table must link these pages: {missing}"


def test_relative_links_resolve() -> None:
    broken = [
        f"{source.relative_to(ROOT)}: ({target})"
        for source in [README, *_pages()]
        for target, resolved in relative_links(source)
        if not resolved.exists()
    ]
    assert not broken, f"relative links that name no file: {broken}"


def test_code_references_name_existing_functions() -> None:
    refs = [(page, f, name) for page in [README, *_pages()] for f, name in code_refs(page)]
    assert any(page.name == "flows.md" for page, _, _ in refs), (
        "docs/flows.md has no path:function reference"
    )
    stale = []
    for page, file, name in refs:
        target = ROOT / file
        if not target.is_file():
            stale.append(f"{page.relative_to(ROOT)}: `{file}:{name}` (no such file)")
        elif not defines(target, name):
            stale.append(f"{page.relative_to(ROOT)}: `{file}:{name}` (not defined there)")
    assert not stale, f"stale path:function references: {stale}"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The helpers find a broken link and a missing function (so the tests above can fail)."""
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](nothere.md#x) [web](https://example.com) [in](#top)\n")
    assert [t for t, r in relative_links(page) if not r.exists()] == ["nothere.md#x"]
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def f(self):\n        pass\n\ndef g():\n    pass\n")
    assert defines(module, "A.f") and defines(module, "g")
    assert not defines(module, "A.h") and not defines(module, "f")
    c = tmp_path / "m.c"
    c.write_text("static int\nusual(const unsigned char *p, size_t n)\n{\n    return 0;\n}\n")
    assert defines(c, "usual") and not defines(c, "unusual")
