"""A thin driver for the real git CLI with a scrubbed, reproducible environment.

Interop tests and benchmarks compare Enroute against git itself, so git must
behave the same on every machine: no system or user configuration, no
inherited ``GIT_DIR``/``GIT_INDEX_FILE``/``GIT_OBJECT_DIRECTORY`` from an outer
repository, the C locale (messages are parsed), and fixed identities and
dates so that commits made through git hash to the same object ids
everywhere.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "FIXED_DATE",
    "FIXED_EMAIL",
    "FIXED_NAME",
    "GitFailed",
    "GitTimeout",
    "default_home",
    "git_env",
    "run_git",
]

FIXED_NAME = "Enroute Test"
FIXED_EMAIL = "test@enroute.invalid"
# git's raw date format: seconds since the epoch and a UTC offset.
FIXED_DATE = "1700000000 +0000"

# Variables copied from the caller: only what is needed to find and run git.
_PASS_THROUGH = ("PATH", "SYSTEMROOT", "TMPDIR")

_STDERR_KEEP_BYTES = 64 * 1024


class GitFailed(Exception):
    """git exited non-zero; carries what a test needs to explain the failure."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: bytes) -> None:
        self.argv: tuple[str, ...] = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        tail = stderr[-2000:].decode("utf-8", "replace").strip()
        super().__init__(f"{' '.join(self.argv)} exited {returncode}: {tail}")


class GitTimeout(GitFailed):
    """git ran longer than allowed and was killed (returncode is -1)."""


def git_env(home: Path) -> dict[str, str]:
    """Return a fresh environment for git: nothing from the caller leaks in.

    ``GIT_CONFIG_GLOBAL=/dev/null`` and ``GIT_CONFIG_NOSYSTEM=1`` keep git from
    reading any configuration but the repository's own; ``HOME`` points at a
    directory the caller owns so no tool writes into the real home.
    """
    env = {name: os.environ[name] for name in _PASS_THROUGH if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(
        {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": FIXED_NAME,
            "GIT_AUTHOR_EMAIL": FIXED_EMAIL,
            "GIT_AUTHOR_DATE": FIXED_DATE,
            "GIT_COMMITTER_NAME": FIXED_NAME,
            "GIT_COMMITTER_EMAIL": FIXED_EMAIL,
            "GIT_COMMITTER_DATE": FIXED_DATE,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ATTR_NOSYSTEM": "1",
            "LC_ALL": "C",
            "LANG": "C",
            "TZ": "UTC",
        }
    )
    return env


_default_home: Path | None = None


def default_home() -> Path:
    """An empty per-process home directory, removed at exit."""
    global _default_home
    if _default_home is None:
        made = Path(tempfile.mkdtemp(prefix="enroute-git-home-"))
        atexit.register(shutil.rmtree, made, True)
        _default_home = made
    return _default_home


def run_git(
    args: Sequence[str],
    *,
    cwd: Path,
    home: Path | None = None,
    input: bytes | None = None,
    timeout_s: float = 120,
    check: bool = True,
) -> bytes:
    """Run ``git <args>`` in ``cwd`` and return its stdout.

    With ``check`` (the default) a non-zero exit raises :class:`GitFailed`
    carrying argv, exit status and stderr; a run over ``timeout_s`` raises
    :class:`GitTimeout` either way, so a wedged git never hangs a test.
    """
    argv = ["git", *args]
    env = git_env(home if home is not None else default_home())
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            input=input if input is not None else b"",
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr if isinstance(exc.stderr, bytes) else b""
        raise GitTimeout(argv, -1, stderr[-_STDERR_KEEP_BYTES:] + b"\n(timed out)") from None
    if check and done.returncode != 0:
        raise GitFailed(argv, done.returncode, done.stderr[-_STDERR_KEEP_BYTES:])
    return done.stdout


_BRANCH_SCRIPT = r"""
while IFS= read -r -d '' name; do
  git check-ref-format --branch "$name" >/dev/null 2>&1
  printf '%s\n' "$?"
done
"""


def git_branch_verdicts(names: Sequence[bytes], home: Path) -> list[bool]:
    """Whether ``git check-ref-format --branch`` takes each name (one bash loop, one git per
    name), run outside any repository so git expands no ``@{-N}``."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**git_env(home), "GIT_CEILING_DIRECTORIES": str(home.parent)}
    done = subprocess.run(
        ["bash", "-c", _BRANCH_SCRIPT],
        input=b"".join(n + b"\0" for n in names),
        cwd=home,
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    )
    rows = done.stdout.decode().split()
    assert len(rows) == len(names), done.stderr
    return [row == "0" for row in rows]
