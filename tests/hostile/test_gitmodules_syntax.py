"""Hostile ``.gitmodules`` in config forms git reads, pushed to a real `enroute dev` (issue 20).

A bare key once made the whole file fail to parse, and a parse failure
(``gitmodulesParse``, INFO in git) switched every check off: such a file went
in through the git client and the REST API alike. git's ``config.c`` reads
bare keys, continued lines, CR LF, ``[submodule.<name>]`` and comments, and
fsck.c ``fsck_blob`` checks the variables read before a syntax error; so
does Enroute (``enroute_core.git.gitconfig``). Each file is pushed to
Enroute and, beside it, to C git with ``receive.fsckObjects``: both refuse it
with the same message id, and nothing changes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_object_holes import _api, _api_commit, _c_git_remote, _content, _git, _push, _remote_refs

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

CASES = {
    # name: (the .gitmodules text, the message id git and Enroute refuse it with)
    "bare-key": (b'[submodule "x"]\n\tactive\n\turl = -u./payload\n\tupdate = !cmd',
                 "gitmodulesUrl"),
    "continued-line": (b'[submodule "x"]\n\tpath = x\n\turl = \\\n--upload-pack=touch x\n',
                       "gitmodulesUrl"),
    "crlf-and-comments": (b'[submodule "x"]\r\n\tpath = x ; c\r\n\tupdate = "!sh" # c\r\n',
                          "gitmodulesUpdate"),
    "dotted-section": (b"[submodule.x]\n\tpath = -x\n", "gitmodulesPath"),
    "before-a-syntax-error": (b'[submodule "x"]\n\turl = --upload-pack=x\n[broken',
                              "gitmodulesUrl"),
    "climbing-relative-url": (b'[submodule "x"]\n\tpath = x\n\turl = ../../:localhost\n',
                              "gitmodulesUrl"),
}  # fmt: skip


def _work(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    (tmp_path / "home").mkdir(exist_ok=True)
    work.mkdir()
    _git(work, "init", "-q", "-b", "main")
    (work / "README").write_bytes(b"hello\n")
    _git(work, "add", ".")
    _git(work, "commit", "-q", "-m", "base")
    return work


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_gitmodules_is_refused_as_c_git_refuses_it(
    enroute_url: str, tmp_path: Path, case: str
) -> None:
    text, msg_id = CASES[case]
    work = _work(tmp_path, case)
    url = f"{enroute_url}/gitmodules/{case}-{time.monotonic_ns()}.git"
    c_git = _c_git_remote(tmp_path, case)
    for remote in (url, c_git):
        first = _push(work, remote, "main:refs/heads/main")
        assert first.returncode == 0, first.stderr
    before = _remote_refs(work, url)
    (work / ".gitmodules").write_bytes(text)
    _git(work, "add", ".gitmodules")
    _git(work, "commit", "-q", "-m", "submodule")
    refused = _push(work, url, "main:refs/heads/main")
    assert refused.returncode != 0, refused.stdout
    assert msg_id.encode() in refused.stderr + refused.stdout, refused.stderr
    assert _remote_refs(work, url) == before
    by_c_git = _push(work, c_git, "main:refs/heads/main")
    assert by_c_git.returncode != 0 and msg_id.encode() in by_c_git.stderr, by_c_git.stderr


def test_hostile_gitmodules_through_the_api_is_refused(enroute_url: str) -> None:
    repo = f"gitmodules/api-{time.monotonic_ns()}"
    assert _api(enroute_url, "POST", "/repos", {"name": repo})[0] == 201
    status, made = _api_commit(enroute_url, repo, None, [_content("README", b"hello\n")])
    assert status == 201, made
    head = made["oid"] if "oid" in made else made["commit"]["oid"]
    for case, (text, msg_id) in sorted(CASES.items()):
        status, body = _api_commit(enroute_url, repo, head, [_content(".gitmodules", text)])
        assert status == 400, (case, body)
        assert body["error"]["code"] == "invalid_object", body
        assert msg_id in body["error"]["message"], (case, body)
    refs = _api(enroute_url, "GET", f"/repos/{repo}/-/refs")[1]["refs"]
    assert [(r["name"], r["oid"]) for r in refs] == [("refs/heads/main", head)]
