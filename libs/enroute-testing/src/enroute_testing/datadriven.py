"""Scenario files in the data-driven style of etcd's raft tests (``testdata/*.txt``).

A file is a list of test cases. Each case is a directive line, optional input
lines, a ``----`` separator and the expected output, ended by a blank line::

    # a comment names the seed section the next cases check
    commit inc=1 ref=refs/heads/main old=- new=c1
    ----
    ok
    refs/heads/main c1

A directive is a command word and arguments: ``word``, ``key=value`` or
``key=(a,b,c)``. An expected output that holds blank lines is written between
two double separators (``----`` twice before it, ``----`` twice after it).

:func:`run_file` feeds each case to a handler and compares what it returns
with the expected output. With ``REWRITE=1`` in the environment it writes the
handler's outputs into the file instead (review the diff before committing).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SEPARATOR = "----"
_ARG = re.compile(r"([^\s=()]+)(?:=(\([^)]*\)|[^\s]*))?")


class ScenarioError(AssertionError):
    """A malformed scenario file, or an output that is not the expected one."""


@dataclass(frozen=True)
class Arg:
    key: str
    values: tuple[str, ...] = ()

    @property
    def value(self) -> str:
        if len(self.values) != 1:
            raise ScenarioError(f"argument {self.key} takes one value, has {self.values}")
        return self.values[0]


@dataclass
class TestData:
    """One case: where it is, its command, arguments and input, and what it expects."""

    __test__ = False  # not a pytest class, whatever its name

    pos: str
    cmd: str
    args: list[Arg] = field(default_factory=list)
    input: str = ""
    expected: str = ""

    def has(self, key: str) -> bool:
        return any(a.key == key for a in self.args)

    def get(self, key: str, default: str | None = None) -> str:
        for a in self.args:
            if a.key == key:
                return a.value
        if default is None:
            raise ScenarioError(f"{self.pos}: {self.cmd} needs {key}=")
        return default

    def values(self, key: str) -> tuple[str, ...]:
        for a in self.args:
            if a.key == key:
                return a.values
        return ()

    def fail(self, message: str) -> ScenarioError:
        return ScenarioError(f"{self.pos}: {self.cmd}: {message}")


@dataclass
class _Case:
    data: TestData
    start: int  # first line of the directive
    end: int  # line after the case's expected output


def _parse_args(pos: str, text: str) -> list[Arg]:
    args = []
    for m in _ARG.finditer(text):
        key, raw = m.group(1), m.group(2)
        if raw is None:
            args.append(Arg(key))
        elif raw.startswith("("):
            inner = raw[1:-1].strip()
            args.append(Arg(key, tuple(v.strip() for v in inner.split(",")) if inner else ()))
        else:
            args.append(Arg(key, (raw,)))
    consumed = "".join(m.group(0) for m in _ARG.finditer(text))
    if consumed.replace(" ", "") != text.replace(" ", ""):
        raise ScenarioError(f"{pos}: cannot read the arguments {text!r}")
    return args


def parse(path: Path) -> list[_Case]:
    lines = path.read_text(encoding="utf-8").split("\n")
    cases: list[_Case] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        start = i
        pos = f"{path.name}:{i + 1}"
        word, _, rest = line.partition(" ")
        data = TestData(pos, word, _parse_args(pos, rest.strip()))
        i += 1
        body = []
        while i < len(lines) and lines[i] != SEPARATOR:
            if not lines[i].strip():
                raise ScenarioError(f"{pos}: {word} has no {SEPARATOR} line")
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ScenarioError(f"{pos}: {word} has no {SEPARATOR} line")
        data.input = "\n".join(body)
        i += 1
        out = []
        if i < len(lines) and lines[i] == SEPARATOR:  # the blank-line-tolerant form
            i += 1
            while i + 1 < len(lines) and not (lines[i] == SEPARATOR and lines[i + 1] == SEPARATOR):
                out.append(lines[i])
                i += 1
            if i + 1 >= len(lines):
                raise ScenarioError(f"{pos}: no closing {SEPARATOR} {SEPARATOR}")
            i += 2
        else:
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
        data.expected = "\n".join(out)
        cases.append(_Case(data, start, i))
    return cases


def _expected_block(output: str) -> list[str]:
    if "\n\n" in output or output.startswith("\n") or output.endswith("\n"):
        return [SEPARATOR, SEPARATOR, *output.split("\n"), SEPARATOR, SEPARATOR]
    return [SEPARATOR, *output.split("\n")] if output else [SEPARATOR]


def run_file(path: Path, handler: Callable[[TestData], str]) -> None:
    """Run every case of ``path`` through ``handler`` in order (cases share its state).

    Fails at the first output that differs, naming the file and line. With
    ``REWRITE=1`` every output is written back into the file instead.
    """
    rewrite = os.environ.get("REWRITE") == "1"
    cases = parse(path)
    outputs = []
    for case in cases:
        actual = handler(case.data).strip("\n")
        if not rewrite and actual != case.data.expected:
            raise ScenarioError(
                f"{case.data.pos}: {case.data.cmd}: output differs (REWRITE=1 rewrites the file)\n"
                f"--- expected\n{case.data.expected}\n--- actual\n{actual}"
            )
        outputs.append(actual)
    if rewrite:
        lines = path.read_text(encoding="utf-8").split("\n")
        new: list[str] = []
        at = 0
        for case, actual in zip(cases, outputs, strict=True):
            new.extend(lines[at : case.start])
            directive = lines[case.start : case.start + 1 + len(case.data.input.split("\n"))]
            new.extend(directive if case.data.input else directive[:1])
            new.extend(_expected_block(actual))
            at = case.end
        new.extend(lines[at:])
        path.write_text("\n".join(new), encoding="utf-8")
