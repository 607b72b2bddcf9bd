"""Differential: Enroute's ``.gitattributes`` check against ``git fsck`` (issue 20).

git 2.39.5's fsck.c ``fsck_blob`` reads a blob a tree names ``.gitattributes``
as a C string and refuses a line of ``ATTR_MAX_LINE_LENGTH`` (2048) bytes or
more (``gitattributesLineLength``); t1450-fsck.sh checks it with
``pattern %02048d``. Blobs at and around the bound, with CR LF, a NUL before
a long line, a long last line without a newline, are written under one tree
each, and ``git fsck`` judges them beside ``check_special_blob``: Enroute
refuses exactly the blobs git reports an error for.
"""

from __future__ import annotations

import re
import subprocess
from functools import partial
from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidObject
from enroute_core.base.ids import oid_from_hex
from enroute_core.git.fsck import SpecialBlob, check_special_blob
from enroute_testing.gitcli import git_env, run_git

pytestmark = [pytest.mark.interop]

BODIES = [
    b"",
    b"*.c diff=cpp\n",
    b"x" * 2047,
    b"x" * 2048,
    b"x" * 2047 + b"\n",
    b"x" * 2048 + b"\n",
    b"*.c diff\n" + b"x" * 2049,
    b"a\r\n" + b"x" * 2046 + b"\r\n",
    b"a\r\n" + b"x" * 2047 + b"\r\n",
    b"a\0" + b"x" * 4096,
    b"x" * 4096 + b"\0",
    b"\n" * 3000,
    b"pattern " + b"%02048d" % 1,
]


def test_gitattributes_line_length_matches_git_fsck(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "repo.git"
    run_git(["init", "-q", "--bare", str(repo)], cwd=tmp_path, home=home)
    blobs = []
    for body in BODIES:
        blob = run_git(["hash-object", "-w", "--stdin"], cwd=repo, home=home, input=body).strip()
        entry = b"100644 blob %s\t.gitattributes\n" % blob
        run_git(["mktree"], cwd=repo, home=home, input=entry)
        blobs.append(blob)
    fsck = subprocess.run(
        ["git", "fsck", "--no-dangling"],
        cwd=repo,
        env=git_env(home),
        capture_output=True,
        timeout=120,
        check=False,
    )
    report = fsck.stdout + fsck.stderr
    by_git = set(re.findall(rb"error in blob ([0-9a-f]{40}): gitattributesLineLength", report))
    by_enroute = set()
    for blob, body in zip(blobs, BODIES, strict=True):
        try:
            check_special_blob(
                SpecialBlob.GITATTRIBUTES, oid_from_hex(blob), 3, partial(bytes, body), len(body)
            )
        except InvalidObject as exc:
            assert "gitattributesLineLength" in str(exc)
            by_enroute.add(blob)
    assert by_git, report  # some cross the bound: the comparison means something
    assert by_enroute == by_git, report
