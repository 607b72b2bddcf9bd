"""A history holding every harmless fsck problem Enroute detects, through `enroute dev`.

Issue 20, "Acceptance": with default configuration, a generated history containing
every warned id pushes, clones byte-identical (`git fsck` shows only the source's own
messages) and serves blobless, shallow and incremental fetches; docs/security.md,
"Object checks". The objects are what old tools and converters wrote (git's
t1450-fsck builds the same with `hash-object --literally`): zones like `--700`,
zero-padded dates and modes, identities without an email, a NUL in a message, tags
without a tagger. The pusher sees one `remote: warning: <id>: <n> object(s), e.g.
<oid>` line per id, counted as git fsck counts those objects; an API commit on top of
the history lands in git's form; and an error-class object is refused through git and
the REST API alike, the error naming the setting that would lower it.

One repository, one source, every operation batched: a few seconds of CI.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from enroute_testing.gitcli import default_home, git_env

pytestmark = pytest.mark.interop

OK = b"Ok Person <ok@example.com> 1300000000 +0000"
# (author lines, committer line or None, message, the id git fsck reports)
COMMITS: list[tuple[list[bytes], bytes | None, bytes, str]] = [
    ([b"Old Tool <old@example.com> 1300000001 --700"],
     b"Old Tool <old@example.com> 1300000001 --700", b"converted\n", "badTimezone"),
    ([b"A <a@example.com> 1300000002 +051800"], OK, b"zone\n", "badTimezone"),
    ([b"A <a@example.com> 01300000003 +0000"], OK, b"padded date\n", "zeroPaddedDate"),
    ([b"A <a@example.com>1300000004 +0000"], OK, b"no space\n", "missingSpaceBeforeDate"),
    ([b"A Nobody 1300000005 +0000"], OK, b"no email\n", "missingEmail"),
    ([b"A <a<example.com> 1300000006 +0000"], OK, b"bad email\n", "badEmail"),
    ([b"A>B <a@example.com> 1300000007 +0000"], OK, b"bad name\n", "badName"),
    ([b"<a@example.com> 1300000008 +0000"], OK, b"no name\n", "missingNameBeforeEmail"),
    ([b"A<a@example.com> 1300000009 +0000"], OK, b"no space\n", "missingSpaceBeforeEmail"),
    ([b"A <a@example.com> yesterday +0000"], OK, b"bad date\n", "badDate"),
    ([b"A <a@example.com> 99999999999999999999 +0000"], OK, b"overflow\n", "badDateOverflow"),
    ([b"A <a@example.com> 1300000012 +0000", b"B <b@example.com> 1300000012 +0000"], OK,
     b"two authors\n", "multipleAuthors"),
    ([], OK, b"no author\n", "missingAuthor"),
    ([OK], None, b"no committer\n", "missingCommitter"),
    ([OK], OK, b"nul \0 in message\n", "nulInCommit"),
]  # fmt: skip
FIRST_PUSH = 7  # commits in the first push; the rest arrive as an incremental push/fetch
# what Enroute warns about that git fsck (without --strict) reports too, by id
WARNED = {
    *(c[3] for c in COMMITS),
    "zeroPaddedFilemode", "badFilemode", "badTagName", "missingTaggerEntry", "gitmodulesParse",
}  # fmt: skip
WARNING_LINE = re.compile(rb"remote: warning: (\w+): (\d+) object\(s\), e\.g\. ([0-9a-f]{40})")
FSCK_LINE = re.compile(rb"^(?:warning|error) in (?:commit|tree|tag|blob) ([0-9a-f]{40}): (\w+):")


def git(cwd: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """git with the test kit's scrubbed environment; stdout and stderr kept apart."""
    return subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(default_home()), input=data,
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip


def ok(cwd: Path, *args: str, data: bytes | None = None) -> bytes:
    done = git(cwd, *args, data=data)
    assert done.returncode == 0, (args, done.stderr.decode(errors="replace"))
    return done.stdout


def literal(repo: Path, kind: str, body: bytes) -> str:
    """An object written as given: git's own checks would refuse these bodies."""
    return ok(repo, "hash-object", "-t", kind, "--literally", "-w", "--stdin", data=body).decode()[
        :40
    ]


def entry(mode: bytes, name: bytes, oid: str) -> bytes:
    return mode + b" " + name + b"\0" + bytes.fromhex(oid)


def build_source(src: Path) -> tuple[str, str]:
    """The legacy history in ``src``: (the first push's tip, the tip of main)."""
    ok(src, "init", "-q", "--bare", "--initial-branch=main")
    hello = literal(src, "blob", b"hello\n")
    other = literal(src, "blob", b"other\n")
    # a .gitmodules git's config reader stops in (gitmodulesParse): the entry before is fine
    modules = literal(src, "blob", b'[submodule "x"]\n\tpath = x\n\turl = https://e.com/x\n[bad\n')
    sub = literal(src, "tree", entry(b"100644", b"x", hello))
    sub2 = literal(src, "tree", entry(b"100644", b"x", other))

    def root(dir_tree: str) -> str:
        # git's order; 040000 is zeroPaddedFilemode, 100600 badFilemode, 100664 early git's
        return literal(src, "tree", b"".join([
            entry(b"100644", b".gitmodules", modules), entry(b"100644", b"a.txt", hello),
            entry(b"040000", b"dir", dir_tree), entry(b"100600", b"mode600", other),
            entry(b"100664", b"mode664", other), entry(b"040000", b"other", sub),
        ]))  # fmt: skip

    trees = [root(sub), root(sub2)]
    parent = ""
    first = ""
    for i, (authors, committer, message, _) in enumerate(COMMITS):
        body = b"tree %s\n" % trees[i % 2].encode()
        if parent:
            body += b"parent %s\n" % parent.encode()
        body += b"".join(b"author " + a + b"\n" for a in authors)
        if committer is not None:
            body += b"committer " + committer + b"\n"
        parent = literal(src, "commit", body + b"\n" + message)
        if i + 1 == FIRST_PUSH:
            first = parent
    # a tag of early git: no tagger, a name that is no ref name; and one with a bad zone
    old_tag = literal(src, "tag", b"object %s\ntype commit\ntag v 0.1\n\nold\n" % parent.encode())
    zone_tag = literal(src, "tag", b"object %s\ntype commit\ntag v0.2\ntagger T <t@example.com>"
                       b" 1300000100 --700\n\nzone\n" % parent.encode())  # fmt: skip
    ok(src, "update-ref", "refs/heads/main", parent)
    ok(src, "update-ref", "refs/tags/v0.1", old_tag)
    ok(src, "update-ref", "refs/tags/v0.2", zone_tag)
    return first, parent


def fsck_messages(repo: Path) -> list[bytes]:
    """What `git fsck` says, one sorted line per message (its exit status is not asked)."""
    done = git(repo, "fsck", "--no-dangling", "--no-progress")
    return sorted(line for line in (done.stdout + done.stderr).splitlines() if line.strip())


def all_objects(repo: Path) -> bytes:
    return ok(repo, "cat-file", "--batch-all-objects", "--batch")


def refs(repo: Path) -> bytes:
    return ok(repo, "for-each-ref", "--format=%(objectname) %(refname)")


def post(url: str, path: str, body: object) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}/api/v1{path}", data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def api_commit(url: str, name: str, parent: str, path: str, data: bytes) -> tuple[int, Any]:
    change = {"path": path, "content_base64": base64.b64encode(data).decode()}
    body = {"branch": "main", "expected_oid": parent, "message": "api on top\n",
            "author": {"name": "Ann", "email": "ann@example.com"}, "changes": [change]}  # fmt: skip
    return post(url, f"/repos/{name}/-/commits", body)


@pytest.mark.timeout(300)
def test_legacy_history_is_taken_served_and_built_on(enroute_url: str, tmp_path: Path) -> None:
    src = tmp_path / "src.git"
    src.mkdir()
    first, tip = build_source(src)
    source_fsck = fsck_messages(src)
    reported: dict[str, set[str]] = {}  # git fsck's ids of each object
    for line in source_fsck:
        found = FSCK_LINE.match(line)
        if found is not None:
            reported.setdefault(found.group(1).decode(), set()).add(found.group(2).decode())
    git_counts = {i: sum(i in ids for ids in reported.values()) for i in WARNED}
    assert all(git_counts.values()), f"the source lacks some id: {git_counts}"

    name = f"legacy/hist-{time.monotonic_ns()}"
    url = f"{enroute_url}/{name}.git"
    # 1. two pushes with the default configuration: the second one incremental
    pushes = [git(src, "push", url, f"{first}:refs/heads/main")]
    clone = tmp_path / "clone.git"
    ok(tmp_path, "clone", "-q", "--bare", url, str(clone))
    pushes.append(git(src, "push", url, "refs/heads/main", "refs/tags/*"))
    warned: dict[str, int] = {}
    for done in pushes:
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        for raw_id, count, example in WARNING_LINE.findall(done.stderr):
            msg_id = raw_id.decode()
            assert msg_id in reported[example.decode()], (msg_id, example)  # a real example
            assert int(count) <= git_counts.get(msg_id, 1), msg_id  # objects of this push
            warned[msg_id] = warned.get(msg_id, 0) + int(count)
    # every object git fsck reports was warned about (a tree git sends twice, twice)
    assert set(warned) == WARNED
    assert all(warned[i] >= git_counts[i] for i in WARNED), (warned, git_counts)
    # 2. the incremental fetch, then the clone is the source, byte for byte
    ok(clone, "fetch", "-q", url, "+refs/*:refs/*")
    assert refs(clone) == refs(src)
    assert all_objects(clone) == all_objects(src)
    assert fsck_messages(clone) == source_fsck
    # 3. blobless and shallow
    blobless = tmp_path / "blobless.git"
    ok(tmp_path, "clone", "-q", "--bare", "--filter=blob:none", url, str(blobless))
    listed = ok(blobless, "rev-list", "--objects", "--all", "--missing=print").split(b"\n")
    missing = {line[1:41] for line in listed if line.startswith(b"?")}
    present = {line[:40] for line in listed if line and not line.startswith(b"?")}
    kinds = ok(src, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)")
    by_kind = [line.split() for line in kinds.splitlines()]
    assert missing == {oid for oid, kind in by_kind if kind == b"blob"}
    assert present == {oid for oid, kind in by_kind if kind != b"blob"}
    shallow = tmp_path / "shallow.git"
    ok(tmp_path, "clone", "-q", "--bare", "--depth", "1", url, str(shallow))
    assert ok(shallow, "rev-list", "--count", "HEAD").strip() == b"1"
    assert ok(shallow, "ls-tree", "-r", "HEAD") == ok(src, "ls-tree", "-r", tip)
    # 4. an API commit on top: trees it rewrites are in git's form (canon_mode)
    status, built = api_commit(enroute_url, name, tip, "dir/new.txt", b"new\n")
    assert status == 201, built
    ok(clone, "fetch", "-q", url, "+refs/*:refs/*")
    new = ok(clone, "rev-parse", "refs/heads/main").decode().strip()
    assert ok(clone, "rev-parse", f"{new}^").decode().strip() == tip
    listing = ok(clone, "ls-tree", "-r", new).decode()
    assert "dir/new.txt" in listing and "other/x" in listing and "100644 blob" in listing
    assert fsck_messages(clone) == source_fsck  # the API's objects add no message
    # 5. an error-class object is refused, naming the setting that lowers it
    evil_tree = literal(src, "tree", entry(b"100644", b".GIT", literal(src, "blob", b"x\n")))
    evil = literal(src, "commit", b"tree %s\nparent %s\nauthor %s\ncommitter %s\n\nevil\n" % (
        evil_tree.encode(), new.encode(), OK, OK))  # fmt: skip
    ok(src, "fetch", "-q", url, "refs/heads/main")  # the API commit, for the pack's base
    done = git(src, "push", url, f"{evil}:refs/heads/evil")
    assert done.returncode != 0
    expected = b"hasDotgit: contains '.git' (refused; receive.fsck.hasDotgit: warn lowers it)"
    assert b"remote unpack failed: object " + evil_tree.encode() + b": " + expected in done.stderr
    assert b"refs/heads/evil" not in ok(src, "ls-remote", url)
    hostile = b'[submodule "x"]\n\tpath = x\n\turl = -u./payload\n'
    status, error = api_commit(enroute_url, name, new, ".gitmodules", hostile)
    assert status >= 400, error
    assert "gitmodulesUrl" in json.dumps(error), error
    assert "receive.fsck.gitmodulesUrl: warn lowers it" in json.dumps(error), error
    assert ok(src, "ls-remote", url, "refs/heads/main").decode().startswith(new)
