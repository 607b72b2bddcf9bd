"""Every error-class fsck id, end to end against a real `enroute dev` (issue 20).

Each case is an object git's fsck refuses, spelled as git's own tests spell it
(t1450-fsck.sh: ``.``, ``..``, ``.git`` in case, HFS+ and NTFS spellings and
backslashes, null ids, unsorted and duplicate entries, broken commit and tag
headers; t7415-submodule-names.sh and its successor t7450-bad-git-dotfiles.sh:
``../../modules/evil``, ``.gitmodules`` as a symlink and as a tree in its
NTFS and HFS+ spellings; t7416/t7417: dash urls and paths, newlines in urls).
Every case is tried three ways:

(a) **one push**: the object arrives in the push that names it. The real git
    client pushes it when it can walk it; an object it will not pack (a null
    id, a header it cannot parse) is packed by ``git pack-objects`` from an
    explicit list and sent as a smart-HTTP push.
(b) **held earlier**: what only a name makes hostile (a ``.gitmodules`` or
    ``.gitattributes`` blob, a tree or symlink under that name) is pushed
    first as a harmless ``notes.txt`` (accepted), then named by a second
    push's tree. fsck.c ``fsck_finish`` reads such a blob wherever it is
    stored. Every other id is a property of the object itself, checked in
    whatever push brings it, so (a) covers it.
(c) **the REST API commit path**: every case a change set can express (file
    contents, symlinks, directories, path names). Headers and tree bytes are
    built by Enroute, so a broken commit, tag or tree cannot be asked for; a
    hostile path is refused before any object is built (``invalid_path``).

Every refusal must name the id, and leave the refs as they were. Beside each
push, C git with ``receive.fsckObjects`` (or its ``index-pack --strict``)
refuses the same objects, so every case is hostile by git's own judgement.

One server for the module. CI runs every spelling: the first of each id in
the quick run, the others marked ``slow`` (about 25 s on an idle machine).
Beside the matrix: the bound on the ``.gitmodules`` bytes one push parses
(``ingest_gitmodules_bytes_max``), and an API commit's harmless findings
answered in its response and counted.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hostile_wire import Client, report_lines
from test_object_holes import _api, _api_commit, _git, _object, _pack, _push, _tree

from enroute_core.git.fsck import FSCK_RULES, FsckClass, FsckMsg
from enroute_testing.devserver import role_http, running_dev
from enroute_testing.gitcli import git_env, run_git

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

SMALL_BYTES_MAX = 64 * 1024
"""``gitmodules_bytes_max`` and ``gitattributes_bytes_max`` of this module's server, so
that the Large ids cost a 64 KiB blob, not 100 MiB; C git is given the same bound."""
PUSH_MODULES_BYTES_MAX = 4 * SMALL_BYTES_MAX
"""``ingest_gitmodules_bytes_max`` of this module's server."""
ZERO = "0" * 40
U200C = "\u200c".encode()
EVIL_MODULES = b'[submodule "../../modules/evil"]\n\tpath = thing\n\turl = ./thing\n'


def _gitmodules(key: bytes, value: bytes) -> bytes:
    return b'[submodule "x"]\n\tpath = x\n\turl = ./x\n\t' + key + b" = " + value + b"\n"


BIG_MODULES = EVIL_MODULES.replace(b"evil", b"fine") + b"#" * SMALL_BYTES_MAX + b"\n"
LONG_LINE = b"pattern " + b"0" * 2048 + b"\n"  # t1450: 'pattern %02048d'
BIG_ATTRIBUTES = b"* text\n" * (SMALL_BYTES_MAX // 7 + 1)


@dataclass(frozen=True)
class Case:
    """One hostile object.

    ``kind``: ``tree`` (the commit's root tree is ``entries``: (mode, name,
    target) in the order given; a target is ``blob``, ``tree`` or ``null``),
    ``named`` (a good root tree that names ``content`` as ``name`` with ``mode``:
    a blob, or a tree when ``content`` is None), ``commit`` or ``tag`` (raw
    bodies, ``{tree}``, ``{base}`` filled in).
    """

    msg_id: str
    label: str
    kind: str
    entries: tuple[tuple[bytes, bytes, str], ...] = ()
    name: bytes = b""
    content: bytes | None = b""
    mode: bytes = b"100644"
    body: bytes = b""
    raw: bool = False
    """The git client will not pack it: sent as a smart-HTTP push of ``git pack-objects``."""
    ci: bool = False
    """The spelling the quick run takes; the others are marked slow (CI runs them too)."""
    c_git: bool = True
    """Whether C git refuses it too (largePathname is newer than git 2.39)."""

    @property
    def id(self) -> str:
        return f"{self.msg_id}-{self.label}"


def _dotted(msg: str, names: list[bytes], mode: bytes = b"100644") -> list[Case]:
    """A tree naming a blob (and, first, a tree) by each of ``names`` (t1450's loop)."""
    out = []
    for i, name in enumerate(names):
        for m, target in ((mode, "blob"), (b"40000", "tree")):
            label = f"{name.decode('utf-8', 'replace')}-{target}"
            entries = ((m, name, target),)
            out.append(Case(msg, label, "tree", entries, ci=i == 0 and target == "blob"))
    return out


def _named(
    msg: str, spellings: list[bytes], content: bytes | None, mode: bytes = b"100644"
) -> list[Case]:
    return [
        Case(msg, f"{n.decode('utf-8', 'replace')}", "named", name=n, content=content, mode=mode,
             ci=i == 0)
        for i, n in enumerate(spellings)
    ]  # fmt: skip


GITMODULES = [
    *(b".gitmodules", b".GITMODULES", b".GitModules", b"GITMOD~1", b"gi7eba~9"),
    *(b".gitmodules .", b".gitmodules ...:stream", b".git" + U200C + b"modules"),
]
GITATTRIBUTES = [
    *(b".gitattributes", b".GITATTRIBUTES", b"GITATT~1", b"gi7d29~2"),
    *(b".gitattributes . .", b".git" + U200C + b"attributes"),
]
COMMIT = b"tree {tree}\nparent {base}\nauthor A <a@b.c> 1700000000 +0000\n"
COMMITTER = b"committer A <a@b.c> 1700000000 +0000\n"
TAG = b"object {base}\ntype commit\ntag v1\ntagger A <a@b.c> 1700000000 +0000\n"

CASES: list[Case] = [
    *_dotted("hasDot", [b"."]),
    *_dotted("hasDotdot", [b".."]),
    *_dotted(
        "hasDotgit",
        [
            b".git",
            b".GIT",
            b".Git",
            b".gI" + U200C + b"T",
            b"git~1",
            b"GIT~1",
            b".git.",
            b".git . .",
            b".git::$INDEX_ALLOCATION",
            b".\\.GIT\\foobar",
            b".git\\foobar",
        ],
    ),
    Case("fullPathname", "a/b", "tree", ((b"100644", b"a/b", "blob"),), ci=True),
    Case("badTree", "emptyName", "tree", ((b"100644", b"", "blob"),), raw=True, ci=True),
    Case(
        "largePathname", "4097", "tree", ((b"100644", b"n" * 4097, "blob"),), ci=True, c_git=False
    ),
    Case("nullSha1", "blob", "tree", ((b"100644", b"a", "null"),), raw=True, ci=True),
    Case("nullSha1", "submodule", "tree", ((b"160000", b"sub", "null"),), raw=True),
    Case(
        "duplicateEntries",
        "blobs",
        "tree",
        ((b"100644", b"a", "blob"), (b"100644", b"a", "blob")),
        ci=True,
    ),
    Case(
        "duplicateEntries",
        "blob-and-tree",
        "tree",
        ((b"100644", b"a", "blob"), (b"40000", b"a", "tree")),
    ),
    Case(
        "treeNotSorted",
        "blobs",
        "tree",
        ((b"100644", b"b", "blob"), (b"100644", b"a", "blob")),
        ci=True,
    ),
    Case(
        "treeNotSorted",
        "tree-before-dotted",
        "tree",
        ((b"40000", b"a", "tree"), (b"100644", b"a.c", "blob")),
    ),
    Case("badTree", "no-nul", "tree", (), body=b"100644 a", raw=True, ci=True),
    Case("badTree", "odd-mode", "tree", (), body=b"10064x a\0" + b"\1" * 20, raw=True),
    *_named("gitmodulesSymlink", GITMODULES, b"[foo]bar=true", b"120000"),
    *_named("gitmodulesBlob", GITMODULES[:3], None),
    *_named("gitmodulesName", GITMODULES, EVIL_MODULES),
    *_named("gitmodulesUrl", [b".gitmodules"], _gitmodules(b"url", b"-sub")),
    Case(
        "gitmodulesUrl",
        "upload-pack",
        "named",
        name=b".gitmodules",
        content=_gitmodules(b"url", b"--upload-pack=touch x"),
    ),
    Case(
        "gitmodulesUrl",
        "newline",
        "named",
        name=b".gitmodules",
        content=_gitmodules(b"url", b"http://one.example.com%0ahost=two.example.com/x.git"),
    ),
    Case(
        "gitmodulesUrl",
        "climbing",
        "named",
        name=b".gitmodules",
        content=_gitmodules(b"url", b"../../:localhost"),
    ),
    *_named("gitmodulesPath", [b".gitmodules"], _gitmodules(b"path", b"-sub")),
    *_named(
        "gitmodulesUpdate", [b".gitmodules", b"GITMOD~1"], _gitmodules(b"update", b"!rm -rf ~")
    ),
    *_named("gitmodulesLarge", [b".gitmodules"], BIG_MODULES),
    *_named("gitattributesBlob", GITATTRIBUTES[:3], None),
    *_named("gitattributesLineLength", GITATTRIBUTES, LONG_LINE),
    # git's bound is ATTR_MAX_FILE_SIZE, fixed at 100 MiB: C git is not asked about 64 KiB
    Case(
        "gitattributesLarge",
        ".gitattributes",
        "named",
        name=b".gitattributes",
        content=BIG_ATTRIBUTES,
        ci=True,
        c_git=False,
    ),
    Case(
        "nulInHeader",
        "commit",
        "commit",
        body=COMMIT + b"\0" + COMMITTER + b"\nm\n",
        raw=True,
        ci=True,
    ),
    Case("nulInHeader", "tag", "tag", body=TAG.replace(b"tag v1", b"tag v\0") + b"\nm\n", raw=True),
    Case(
        "unterminatedHeader",
        "commit",
        "commit",
        body=COMMIT + COMMITTER.rstrip(),
        raw=True,
        ci=True,
    ),
    Case(
        "missingTree",
        "commit",
        "commit",
        body=COMMIT.split(b"\n", 1)[1] + COMMITTER + b"\nm\n",
        raw=True,
        ci=True,
    ),
    Case(
        "badTreeSha1",
        "commit",
        "commit",
        body=b"tree zz\n" + COMMITTER + b"\nm\n",
        raw=True,
        ci=True,
    ),
    Case(
        "badParentSha1",
        "commit",
        "commit",
        body=COMMIT.replace(b"parent {base}", b"parent {base}x") + COMMITTER + b"\nm\n",
        raw=True,
        ci=True,
    ),
    Case("missingObject", "tag", "tag", body=TAG.split(b"\n", 1)[1] + b"\nm\n", raw=True, ci=True),
    Case(
        "badObjectSha1",
        "tag",
        "tag",
        body=TAG.replace(b"{base}", b"{base}1") + b"\nm\n",
        raw=True,
        ci=True,
    ),
    Case(
        "missingTypeEntry",
        "tag",
        "tag",
        body=TAG.replace(b"type commit\n", b"") + b"\nm\n",
        raw=True,
        ci=True,
    ),
    Case(
        "badType",
        "tag",
        "tag",
        body=TAG.replace(b"type commit", b"type bogus") + b"\nm\n",
        raw=True,
        ci=True,
    ),
    Case(
        "missingTagEntry",
        "tag",
        "tag",
        body=TAG.replace(b"tag v1\n", b"") + b"\nm\n",
        raw=True,
        ci=True,
    ),
    # missingType and missingTag need a header ending right after "type"/"tag": git's
    # verify_headers finds that first (unterminatedHeader), so does Enroute
    Case(
        "unterminatedHeader",
        "missingType",
        "tag",
        body=TAG.split(b"type")[0] + b"type",
        raw=True,
        ci=True,
    ),
    Case(
        "unterminatedHeader",
        "missingTag",
        "tag",
        body=TAG.split(b"tag v1")[0] + b"tag v1",
        raw=True,
        ci=True,
    ),
]
"""Checked: every checkable error-class id has a case (test_every_error_class_id_has_a_case)."""
SHADOWED = {
    "missingType": "unterminatedHeader",
    "missingTag": "unterminatedHeader",
    "emptyName": "badTree",
}
"""Ids no object can draw: a check git (and Enroute) makes first finds it (verify_headers,
decode_tree_entry)."""


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.id, marks=() if c.ci else (pytest.mark.slow,)) for c in cases]


HELD = [c for c in CASES if c.kind == "named"]


def test_every_error_class_id_has_a_case() -> None:
    """What FsckMsg checks and FSCK_RULES calls an error is in CASES, and run in CI."""
    errors = {m.value for m in FsckMsg if FSCK_RULES[m.value].cls is FsckClass.ERROR}
    errors -= SHADOWED.keys()
    assert errors <= {c.msg_id for c in CASES if c.ci}, errors - {c.msg_id for c in CASES}


# -- fixtures ---------------------------------------------------------------------------------


@dataclass
class Site:
    """The server, a work tree with the base commit, and C git beside them."""

    url: str
    work: Path
    base: str
    objects: dict[str, str]
    tmp: Path

    def bare(self, name: str) -> Path:
        """A C git repository with ``receive.fsckObjects`` and the base pushed."""
        path = self.tmp / f"c-git-{name}.git"
        if not path.exists():
            run_git(["init", "-q", "--bare", str(path)], cwd=self.tmp)
            run_git(["config", "receive.fsckObjects", "true"], cwd=path)
            run_git(["config", "core.bigFileThreshold", str(SMALL_BYTES_MAX)], cwd=path)
            assert _push(self.work, str(path), "main:refs/heads/main").returncode == 0
        return path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    limits = {
        "gitmodules_bytes_max": SMALL_BYTES_MAX,
        "gitattributes_bytes_max": SMALL_BYTES_MAX,
        "ingest_gitmodules_bytes_max": PUSH_MODULES_BYTES_MAX,
    }
    root = tmp_path_factory.mktemp("fsck-matrix")
    (root / "dev").mkdir()
    with running_dev(root / "dev", {"limits": limits}) as dev:
        (root / "home").mkdir()
        work = root / "work"
        work.mkdir()
        _git(work, "init", "-q", "-b", "main")
        (work / "README").write_bytes(b"hello\n")
        (work / "dir").mkdir()
        (work / "dir" / "f").write_bytes(b"f\n")
        _git(work, "add", ".")
        _git(work, "commit", "-q", "-m", "base")
        objects = {
            "blob": _git(work, "rev-parse", "HEAD:README").decode(),
            "tree": _git(work, "rev-parse", "HEAD:dir").decode(),
            "null": ZERO,
        }
        site = Site(dev.url, work, _git(work, "rev-parse", "HEAD").decode(), objects, root)
        for repo in ("one", "held"):
            pushed = _push(work, f"{dev.url}/matrix/{repo}.git", "main:refs/heads/main")
            assert pushed.returncode == 0, pushed.stderr
        yield site


# -- building the objects ----------------------------------------------------------------------


def _commit_on(site: Site, tree: bytes) -> bytes:
    return _git(site.work, "commit-tree", "-p", site.base, "-m", "case", tree.decode())


def _root_naming(site: Site, name: bytes, mode: bytes, target: bytes) -> bytes:
    """The base's root tree with ``name`` added (in git's order, a tree's name sorting with '/')."""
    entries = [
        (b"100644", b"README", site.objects["blob"].encode()),
        (b"40000", b"dir", site.objects["tree"].encode()),
        (mode, name, target),
    ]
    entries.sort(key=lambda e: e[1] + (b"/" if e[0] == b"40000" else b""))
    return _tree(site.work, entries)


def _hostile_object(site: Site, case: Case) -> bytes:
    """What a ``named`` case names: its blob, or a tree holding a file."""
    if case.content is None:
        return _tree(site.work, [(b"100644", b"f", site.objects["blob"].encode())])
    return _object(site.work, "blob", case.content)


@dataclass(frozen=True)
class Push:
    """New objects (in pack order), the tip and the ref it goes to."""

    new: list[bytes]
    tip: bytes
    ref: str


def _new_objects(site: Site, case: Case) -> Push:
    """The case's new objects, tip and ref."""
    fill = {b"{tree}": site.objects["tree"].encode(), b"{base}": site.base.encode()}
    if case.kind in ("commit", "tag"):
        body = case.body
        for key, value in fill.items():
            body = body.replace(key, value)
        tip = _object(site.work, case.kind, body)
        return Push([tip], tip, "refs/heads/main" if case.kind == "commit" else "refs/tags/v1")
    if case.kind == "named":
        target = _hostile_object(site, case)
        mode = b"40000" if case.content is None else case.mode
        tree = _root_naming(site, case.name, mode, target)
        tip = _commit_on(site, tree)
        return Push([target, tree, tip], tip, "refs/heads/main")
    if case.body:
        tree = _object(site.work, "tree", case.body)
    else:
        entries = [(m, n, site.objects[t].encode()) for m, n, t in case.entries]
        tree = _tree(site.work, entries)
    tip = _commit_on(site, tree)
    return Push([tree, tip], tip, "refs/heads/main")


# -- pushing -----------------------------------------------------------------------------------


def _refused_by_enroute(site: Site, repo: str, case: Case, push: Push) -> None:
    new, tip, ref = push.new, push.tip, push.ref
    client = Client(site.url)
    before = client.refs(repo)
    old = before.get(ref.encode(), ZERO.encode())
    if case.raw:
        reply = client.push(repo, [(old, tip, ref.encode())], _pack(site.work, new))
        lines = report_lines(reply)
        assert reply.status == 200, reply
        assert any(
            line.startswith(b"unpack ") and case.msg_id.encode() in line for line in lines
        ), lines
        assert b"ng " + ref.encode() + b" unpacker error" in lines, lines
    else:
        pushed = _push(site.work, f"{site.url}/{repo}.git", f"{tip.decode()}:{ref}")
        out = pushed.stderr + pushed.stdout
        assert pushed.returncode != 0, out
        assert case.msg_id.encode() in out, out
        assert b"[remote rejected]" in out or b"!\t" in pushed.stdout, out
    assert client.refs(repo) == before


def _refused_by_c_git(site: Site, bare: Path, case: Case, push: Push) -> None:
    new, tip, ref = push.new, push.tip, push.ref
    if not case.c_git:
        return
    if case.raw:
        by_c_git = subprocess.run(
            ["git", "index-pack", "--strict", "--stdin"],
            cwd=bare,
            env=git_env(site.tmp / "home"),
            input=_pack(site.work, new),
            capture_output=True,
            timeout=60,
            check=False,
        )
    else:
        by_c_git = _push(site.work, str(bare), f"{tip.decode()}:{ref}")
    assert by_c_git.returncode != 0, by_c_git.stderr


@pytest.mark.parametrize("case", _params(CASES))
def test_refused_in_one_push(site: Site, case: Case) -> None:
    push = _new_objects(site, case)
    _refused_by_enroute(site, "matrix/one", case, push)
    _refused_by_c_git(site, site.bare("one"), case, push)


@pytest.mark.parametrize("case", _params(HELD))
def test_refused_when_an_object_held_under_a_harmless_name_is_named(site: Site, case: Case) -> None:
    """First as notes.txt (or a directory notes, or a symlink notes): accepted. Then named."""
    target = _hostile_object(site, case)
    mode = b"40000" if case.content is None else case.mode
    harmless = _commit_on(site, _root_naming(site, b"notes", mode, target))
    held_ref = f"refs/heads/held-{time.monotonic_ns()}"
    bare = site.bare("held")
    for remote in (f"{site.url}/matrix/held.git", str(bare)):
        first = _push(site.work, remote, f"{harmless.decode()}:{held_ref}")
        assert first.returncode == 0, first.stderr
    tip = _commit_on(site, _root_naming(site, case.name, mode, target))
    push = Push([tip], tip, "refs/heads/main")
    _refused_by_enroute(site, "matrix/held", case, push)
    _refused_by_c_git(site, bare, case, push)


# -- the REST API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api_repo(site: Site) -> tuple[str, str]:
    repo = f"matrix/api-{time.monotonic_ns()}"
    assert _api(site.url, "POST", "/repos", {"name": repo})[0] == 201
    change = {"path": "README", "content_base64": base64.b64encode(b"hello\n").decode()}
    status, made = _api_commit(site.url, repo, None, [change])
    assert status == 201, made
    return repo, made["oid"] if "oid" in made else made["commit"]["oid"]


def _api_changes(case: Case) -> list[dict[str, Any]] | None:
    """The change set asking for the case's object, or None when no change set can."""
    if case.kind == "named":
        name = case.name.decode("utf-8", "surrogateescape")
        if case.content is None:
            return [{"path": f"{name}/f", "content_base64": base64.b64encode(b"f\n").decode()}]
        change = {"path": name, "content_base64": base64.b64encode(case.content).decode()}
        if case.mode != b"100644":
            change["mode"] = case.mode.decode()
        return [change]
    if case.kind == "tree" and case.entries and case.entries[0][2] != "null":
        names = {n for _, n, _ in case.entries}
        one = len(names) == len(case.entries) == 1 and b"/" not in case.entries[0][1]
        if one and case.entries[0][0] in (b"100644", b"40000"):
            name = next(iter(names)).decode("utf-8", "surrogateescape")
            path = name if case.entries[0][0] == b"100644" else f"{name}/f"
            return [{"path": path, "content_base64": base64.b64encode(b"x\n").decode()}]
    return None  # headers, tree bytes and entry order are Enroute's own


@pytest.mark.parametrize("case", _params([c for c in CASES if _api_changes(c) is not None]))
def test_refused_through_the_api(site: Site, api_repo: tuple[str, str], case: Case) -> None:
    repo, _ = api_repo
    refs = _api(site.url, "GET", f"/repos/{repo}/-/refs")[1]["refs"]
    head = refs[0]["oid"]  # the base, unless a case before this one was let in
    changes = _api_changes(case)
    assert changes is not None
    status, body = _api_commit(site.url, repo, head, changes)
    assert status == 400, body
    code, message = body["error"]["code"], body["error"]["message"]
    if code == "invalid_object":
        assert case.msg_id in message, body
    else:
        # refused as a path before any object is built: '.', '..', '.git' in any spelling,
        # '/' inside a name (a path of two names), an empty or over-long name
        assert code in ("invalid_path", "limit_exceeded"), body
        assert case.msg_id in ("hasDot", "hasDotdot", "hasDotgit", "badTree", "largePathname")
    refs = _api(site.url, "GET", f"/repos/{repo}/-/refs")[1]["refs"]
    assert [(r["name"], r["oid"]) for r in refs] == [("refs/heads/main", head)]


# -- what one push may parse -------------------------------------------------------------------


def test_gitmodules_bytes_one_push_parses_are_bounded(site: Site) -> None:
    """``ingest_gitmodules_bytes_max``: five versions of a 60 KiB .gitmodules (300 KiB, over
    this server's 256 KiB) in one push are refused, the limit named in what git prints, and
    nothing changes; the same history in two pushes goes in."""
    url = f"{site.url}/matrix/parts.git"
    assert _push(site.work, url, "main:refs/heads/main").returncode == 0
    tips, parent = [], site.base
    for i in range(5):
        line = b"# version %d\n" % i
        text = b'[submodule "s"]\n\tpath = s\n\turl = ./s\n' + line * (60 * 1024 // len(line))
        tree = _root_naming(site, b".gitmodules", b"100644", _object(site.work, "blob", text))
        parent = _git(site.work, "commit-tree", "-p", parent, "-m", f"v{i}", tree.decode()).decode()
        tips.append(parent)
    client = Client(site.url)
    before = client.refs("matrix/parts")
    refused = _push(site.work, url, f"{tips[-1]}:refs/heads/main")
    assert refused.returncode != 0, refused.stdout
    assert b"ingest_gitmodules_bytes_max" in refused.stderr, refused.stderr
    assert b"push the history in parts" in refused.stderr, refused.stderr
    assert client.refs("matrix/parts") == before
    for tip in (tips[2], tips[-1]):
        pushed = _push(site.work, url, f"{tip}:refs/heads/main")
        assert pushed.returncode == 0, pushed.stderr


# -- API commit warnings -----------------------------------------------------------------------


def _warnings_counted(site: Site, msg_id: str) -> float:
    """``enroute_engine_fsck_warnings_total{msg_id}`` on the compute's /metrics."""
    metrics = role_http(site.tmp / "dev")["compute"] + "/metrics"
    with urllib.request.urlopen(metrics, timeout=20) as reply:
        text = reply.read().decode()
    found = re.search(
        rf'^enroute_engine_fsck_warnings_total{{msg_id="{msg_id}"}} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def test_api_commit_warnings_are_answered_and_counted(
    site: Site, api_repo: tuple[str, str]
) -> None:
    """A harmless finding on an API commit's objects (a .gitmodules git's config reader stops
    in: gitmodulesParse) lets the commit in, is listed in its answer and counted as a push's;
    a clean commit answers an empty list."""
    repo, _ = api_repo
    head = _api(site.url, "GET", f"/repos/{repo}/-/refs")[1]["refs"][0]["oid"]
    before = _warnings_counted(site, "gitmodulesParse")
    text = b'[submodule "x"]\n\tpath = x\n[broken'
    change = {"path": ".gitmodules", "content_base64": base64.b64encode(text).decode()}
    status, made = _api_commit(site.url, repo, head, [change])
    assert status == 201, made
    blob = hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest()
    assert made["warnings"] == [{"msg_id": "gitmodulesParse", "count": 1, "example": blob}]
    assert _warnings_counted(site, "gitmodulesParse") == before + 1
    # a tree naming the same .gitmodules has it read again (fsck_finish), as on a push;
    # once no tree names it, the commit is clean
    status, clean = _api_commit(site.url, repo, made["oid"], [{"path": ".gitmodules"}])
    assert status == 201, clean
    assert clean["warnings"] == []
