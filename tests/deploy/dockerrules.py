"""Parsing docker/Dockerfile and the rules each role's image target must follow.

DESIGN "Deployment": non-root (numeric uid), slim, built from the lock file.
Shared by test_dockerfiles.py (the rules) and test_chart_runs.py (what a
container's ENTRYPOINT runs).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
ROLES = ("ledger", "compute", "gitproto")
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction]


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and directives dropped."""
    out: list[Instruction] = []
    pending = ""
    start = 0
    escaped = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        escaped = line.endswith("\\")
        pending += (line[:-1] if escaped else line) + " "
        if not escaped:
            keyword, _, args = pending.strip().partition(" ")
            out.append(Instruction(keyword.upper(), args.strip(), start))
            pending = ""
    if pending:
        raise ValueError("Dockerfile ends inside a continued line")
    return out


def stages(instructions: list[Instruction]) -> list[Stage]:
    result: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else ""
            result.append(Stage(name, words[0], []))
        elif not result:
            if ins.keyword != "ARG":
                raise ValueError(f"line {ins.line}: {ins.keyword} before FROM")
        else:
            result[-1].instructions.append(ins)
    return result


def chain(all_stages: list[Stage], stage: Stage) -> list[Stage]:
    """The stage and the stages it is built FROM, outermost base first."""
    by_name = {s.name: s for s in all_stages if s.name}
    out = [stage]
    while out[0].base in by_name:
        out.insert(0, by_name[out[0].base])
    return out


def effective(all_stages: list[Stage], stage: Stage, keyword: str) -> Instruction | None:
    found = None
    for s in chain(all_stages, stage):
        for ins in s.instructions:
            if ins.keyword == keyword:
                found = ins
    return found


def exec_form(ins: Instruction) -> list[str] | None:
    try:
        value = json.loads(ins.args)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def _numeric_non_root(user: str) -> bool:
    uid, _, gid = user.partition(":")
    return uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))


def dockerfile_problems(text: str) -> list[str]:
    problems: list[str] = []
    instructions = parse(text)
    all_stages = stages(instructions)
    names = {s.name for s in all_stages}
    for ins in instructions:
        if ins.keyword == "HEALTHCHECK":
            problems.append(f"line {ins.line}: HEALTHCHECK (Kubernetes probes do this)")
        if ins.keyword == "ENV" and "PYTHONOPTIMIZE" in ins.args:
            problems.append(f"line {ins.line}: PYTHONOPTIMIZE set")
        if ins.keyword in ("RUN", "CMD", "ENTRYPOINT"):
            words = exec_form(ins) or shlex.split(ins.args)
            optimize = [w for w in words if re.fullmatch(r"-[a-zA-Z]*O[a-zA-Z]*", w)]
            if optimize and "python" in ins.args:
                problems.append(f"line {ins.line}: python run with -O")
    for s in all_stages:
        if s.base not in names and not PINNED_BASE.match(s.base):
            problems.append(f"stage {s.name}: base {s.base} is not a pinned python:3.11.N-slim")
    syncs = [
        i for s in all_stages for i in s.instructions if i.keyword == "RUN" and "uv sync" in i.args
    ]
    if not syncs:
        problems.append("no `uv sync` installs the dependencies")
    for ins in syncs:
        for flag in ("--locked", "--no-dev"):
            if not re.search(rf"uv sync[^&;|]*\s{flag}(\s|$)", ins.args):
                problems.append(f"line {ins.line}: uv sync without {flag}")
    copies = [i.args.split() for s in all_stages for i in s.instructions if i.keyword == "COPY"]
    copies_lock = any("uv.lock" in words for words in copies)
    if not copies_lock:
        problems.append("uv.lock is not copied into the build")
    for role in ROLES:
        target = next((s for s in all_stages if s.name == role), None)
        if target is None:
            problems.append(f"no target {role}")
            continue
        user = effective(all_stages, target, "USER")
        if user is None or not _numeric_non_root(user.args):
            problems.append(f"target {role}: USER is not a numeric non-root uid")
        entry = effective(all_stages, target, "ENTRYPOINT")
        argv = exec_form(entry) if entry else None
        if argv is None:
            problems.append(f"target {role}: ENTRYPOINT is not in exec form")
        elif argv != ["python", "-m", f"enroute_{role}"]:
            problems.append(f"target {role}: ENTRYPOINT {argv} is not python -m enroute_{role}")
        venv = any(
            i.keyword == "COPY" and i.args.startswith("--from=")
            for s in chain(all_stages, target)
            for i in s.instructions
        )
        if not venv:
            problems.append(f"target {role}: nothing copied from a builder stage")
    return problems
