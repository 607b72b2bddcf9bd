"""The scenario-file runner (enroute_testing.datadriven): parsing, comparing, REWRITE=1."""

from __future__ import annotations

from pathlib import Path

import pytest

from enroute_testing.datadriven import ScenarioError, TestData, parse, run_file

FILE = """# a comment
echo word key=v list=(a, b)
----
stale

echo twice
input line
----
----
one

two
----
----
"""


def handler(d: TestData) -> str:
    args = " ".join(f"{a.key}={','.join(a.values)}" for a in d.args)
    if d.has("word"):
        return f"echo {args}"
    return "one\n\ntwo" if not d.input else f"one\n\ntwo ({d.input})"


def test_parse_reads_directives_arguments_input_and_both_output_forms(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_text(FILE)
    first, second = (c.data for c in parse(path))
    assert (first.pos, first.cmd, first.get("key"), first.values("list")) == (
        "s.txt:2", "echo", "v", ("a", "b"),
    )  # fmt: skip
    assert first.expected == "stale" and first.input == ""
    assert second.input == "input line" and second.expected == "one\n\ntwo"


def test_a_differing_output_fails_naming_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REWRITE", raising=False)
    path = tmp_path / "s.txt"
    path.write_text(FILE)
    with pytest.raises(ScenarioError, match=r"s.txt:2: echo: output differs"):
        run_file(path, handler)


def test_rewrite_writes_the_outputs_and_keeps_comments_and_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.txt"
    path.write_text(FILE)
    monkeypatch.setenv("REWRITE", "1")
    run_file(path, handler)
    text = path.read_text()
    assert "# a comment\necho word key=v list=(a, b)\n----\necho word= key=v list=a,b\n" in text
    assert "echo twice\ninput line\n----\n----\none\n\ntwo (input line)\n----\n----\n" in text
    monkeypatch.delenv("REWRITE")
    run_file(path, handler)  # and the rewritten file passes as it is


def test_a_directive_without_separator_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_text("echo\n\n")
    with pytest.raises(ScenarioError, match="no ----"):
        parse(path)
