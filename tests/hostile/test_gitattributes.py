"""A hostile ``.gitattributes`` pushed to a real `enroute dev`, beside C git (issue 20).

git's attribute reader refuses a line of ``ATTR_MAX_LINE_LENGTH`` (2048) bytes
or more and a file over ``ATTR_MAX_FILE_SIZE`` (attr.c, after CVE-2022-23521),
and fsck.c ``fsck_blob`` refuses such blobs wherever a pushed tree names them
``.gitattributes`` (any spelling: ``fsck_tree`` collects ``gitattributes_found``);
``fsck_finish`` refuses a non-blob there. Each case is pushed to Enroute and,
beside it, to C git with ``receive.fsckObjects``: both refuse it with the same
message id (t1450-fsck.sh 'fsck error on gitattributes with excessive line
lengths'), and the refs stay as they were.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from enroute_testing.gitcli import git_env, run_git

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

LONG_LINE = b"*.c diff=cpp\npattern " + b"%02048d" % 1 + b"\n"
"""t1450's 'pattern %02048d': one 2056-byte line, a harmless file under another name."""


def _git(work: Path, *args: str) -> bytes:
    return run_git(list(args), cwd=work, home=work.parent / "home").strip()


def _push(work: Path, url: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "push", "--porcelain", url, "main:refs/heads/main"],
        cwd=work,
        env=git_env(work.parent / "home"),
        capture_output=True,
        timeout=120,
        check=False,
    )


def _head(work: Path, url: str) -> bytes:
    return _git(work, "ls-remote", url, "refs/heads/main").split(b"\t")[0]


def _change(work: Path, case: str) -> None:
    """Commit the hostile change ``case`` on top of the first commit."""
    if case == "renamed":  # the long line arrived first as notes.txt, unchecked by anyone
        _git(work, "mv", "notes.txt", ".gitattributes")
    elif case == "short-name":
        _git(work, "mv", "notes.txt", "GITATT~1")
    elif case == "directory":  # a tree named .gitattributes
        (work / ".gitattributes").mkdir()
        (work / ".gitattributes" / "f").write_bytes(b"f\n")
        _git(work, "add", ".gitattributes")
    _git(work, "commit", "-q", "-m", case)


@pytest.mark.parametrize(
    ("case", "msg_id"),
    [
        ("renamed", b"gitattributesLineLength"),
        ("short-name", b"gitattributesLineLength"),
        ("directory", b"gitattributesBlob"),
    ],
)
def test_hostile_gitattributes_is_refused_as_c_git_refuses_it(
    enroute_url: str, tmp_path: Path, case: str, msg_id: bytes
) -> None:
    work = tmp_path / "work"
    (tmp_path / "home").mkdir()
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "README").write_bytes(b"hello\n")
    (work / "notes.txt").write_bytes(LONG_LINE)
    _git(work, "add", ".")
    _git(work, "commit", "-q", "-m", "base")
    url = f"{enroute_url}/attrs/{case}-{time.monotonic_ns()}.git"
    c_git = tmp_path / "c-git.git"
    run_git(["init", "-q", "--bare", str(c_git)], cwd=tmp_path)
    run_git(["config", "receive.fsckObjects", "true"], cwd=c_git)
    for remote in (url, str(c_git)):  # a harmless file: both accept it
        first = _push(work, remote)
        assert first.returncode == 0, first.stderr
    before = _head(work, url)
    _change(work, case)
    refused = _push(work, url)
    assert refused.returncode != 0, refused.stdout
    assert msg_id in refused.stderr + refused.stdout, refused.stderr
    assert _head(work, url) == before
    by_c_git = _push(work, str(c_git))
    assert by_c_git.returncode != 0 and msg_id in by_c_git.stderr, by_c_git.stderr
