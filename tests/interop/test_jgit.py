"""JGit, unmodified, against a running `enroute dev` over smart HTTP.

JGit is one of the clients that must work as shipped (DESIGN.md "Git protocol").
A small driver, ``jgit/JGitClient.java``, calls JGit's porcelain API
(``org.eclipse.jgit.api.Git``) the way an application would; it is compiled once
per session against the JGit jars in the local Maven repository
(``enroute_testing.jgit.find_jgit_classpath``). The cases mirror
``test_clients.py``:

1. JGit clones (protocol v2 and v0) a generated repository pushed by the git CLI
   and gets exactly its refs and objects; `git fsck --strict` accepts the clone.
   A `--depth 1` clone gets the tips alone, with a matching `shallow` file.
2. JGit's ls-remote sees what `git ls-remote` sees: HEAD, peeled tags.
3. JGit pushes a fast-forward and a new branch (report-status), an atomic pair,
   a delete, and a first push that creates a repository; a fresh git clone of
   the result passes `git fsck --strict`.
4. JGit's non-fast-forward push and its push over a stale view are rejected and
   move nothing; with force the update lands (gitprotocol-pack "Pushing Data To
   a Server": the server takes any old-oid that still matches).
5. JGit fetches new commits, a new branch, a followed tag and a forced update.
6. The jar lookup itself, on a fabricated Maven repository.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from enroute_testing.gitcli import git_env, run_git
from enroute_testing.jgit import find_jgit_classpath, java_feature_version, locate_jgit
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo

pytestmark = pytest.mark.interop

SOURCE = Path(__file__).resolve().parent / "jgit" / "JGitClient.java"
SPEC = RepoSpec(
    seed=29,
    commits=30,
    branches=2,
    merge_every=5,
    files=15,
    binary_files=1,
    annotated_tags=2,
    lightweight_tags=1,
    file_bytes=800,
)
# Quick-starting JVMs: these runs are short, C1 and a serial GC start fastest.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto")
JGIT_TIMEOUT_S = 120.0
ZERO_OID = "0" * 40
# Reasons a server gives in `ng <ref> <reason>` for an old-oid that no longer matches.
SERVER_REFUSALS = frozenset(("stale ref", "fetch first", "non-fast-forward"))
_names = itertools.count()


# --- the driver -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Section:
    """One command's output: its name and its tab-separated rows."""

    command: str
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class JGitRun:
    returncode: int
    sections: tuple[Section, ...]
    stderr: str


class JGit:
    """The driver and how to start it; javac runs in the background until the first use."""

    def __init__(self, java: str, classpath: str, home: Path, compiling: subprocess.Popen[bytes]):
        self.java = java
        self.classpath = classpath
        self.home = home
        self._compiling: subprocess.Popen[bytes] | None = compiling

    def wait_compiled(self) -> None:
        if self._compiling is None:
            return
        compiling, self._compiling = self._compiling, None
        _, stderr = compiling.communicate(timeout=JGIT_TIMEOUT_S)
        assert compiling.returncode == 0, f"javac failed:\n{stderr.decode('utf-8', 'replace')}"

    def stop(self) -> None:
        if self._compiling is not None and self._compiling.poll() is None:
            self._compiling.kill()
            self._compiling.wait()

    def run(self, args: Sequence[str], *, cwd: Path, ok: Sequence[int] = (0,)) -> JGitRun:
        """Run the driver (commands chained with `--then`); fail unless it exits in `ok`."""
        self.wait_compiled()
        env = git_env(self.home)  # GIT_CONFIG_NOSYSTEM=1 and HOME hold for JGit too
        argv = [
            self.java,
            *JVM_OPTIONS,
            f"-Duser.home={self.home}",
            "-cp",
            self.classpath,
            "JGitClient",
            *args,
        ]
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, timeout=JGIT_TIMEOUT_S, check=False
        )
        stdout = done.stdout.decode("utf-8", "replace")
        stderr = done.stderr.decode("utf-8", "replace")
        assert done.returncode in ok, f"JGit {args} exited {done.returncode}:\n{stdout}{stderr}"
        sections: list[Section] = []
        rows: list[tuple[str, ...]] = []
        name = ""
        for line in stdout.splitlines():
            fields = tuple(line.split("\t"))
            if fields[0] == "command":
                if name:
                    sections.append(Section(name, tuple(rows)))
                name, rows = fields[1], []
            else:
                rows.append(fields)
        if name:
            sections.append(Section(name, tuple(rows)))
        return JGitRun(done.returncode, tuple(sections), stderr)


@pytest.fixture(scope="session")
def jgit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JGit]:
    """JGitClient compiled once per session (overlapping server start); skips naming what
    is missing."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        missing = " and ".join(n for n, p in (("java", java), ("javac", javac)) if p is None)
        pytest.skip(f"JGit interop needs a JDK: {missing} not on PATH")
    feature = java_feature_version(java)
    if feature is None:
        pytest.skip(f"JGit interop: {java} -version did not run")
    found = locate_jgit(java_feature=feature)
    if found.classpath is None:
        pytest.skip("JGit interop: no usable JGit in ~/.m2: " + "; ".join(found.problems))
    classpath = ":".join(str(jar) for jar in found.classpath)
    root = tmp_path_factory.mktemp("jgit-client")
    classes = root / "classes"
    compiling = subprocess.Popen(
        [
            javac,
            "-J-XX:TieredStopAtLevel=1",
            "-J-XX:+UseSerialGC",
            "-encoding",
            "UTF-8",
            "-cp",
            classpath,
            "-d",
            str(classes),
            str(SOURCE),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # One home for every run: JGit measures the file system's timestamp resolution
    # once and keeps it under $XDG_CONFIG_HOME/jgit, so later JVMs skip that.
    home = root / "home"
    home.mkdir()
    driver = JGit(java, f"{classes}:{classpath}", home, compiling)
    try:
        yield driver
    finally:
        driver.stop()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("jgit-src") / "src.git", SPEC)


@pytest.fixture
def seeded(enroute_url: str, source: GeneratedRepo) -> str:
    """URL of a fresh repository on the server holding all of `source`'s refs."""
    url = f"{enroute_url}/jgit-{next(_names)}-{time.monotonic_ns()}.git"
    run_git(
        ["push", "--quiet", url, "refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"],
        cwd=source.path,
        timeout_s=60,
    )
    return url


# --- helpers --------------------------------------------------------------------------------


def git_ls_remote(url: str, cwd: Path) -> dict[str, str]:
    """Every advertised line, `^{}` peeled tags and HEAD included: name -> 40-hex oid."""
    out = run_git(["ls-remote", url], cwd=cwd, timeout_s=30).decode()
    return {name: oid for oid, name in (line.split("\t", 1) for line in out.splitlines())}


def branches_and_tags(advertised: dict[str, str]) -> dict[str, str]:
    return {n: o for n, o in advertised.items() if n != "HEAD" and not n.endswith("^{}")}


def heads_and_tags(refs: dict[str, str]) -> dict[str, str]:
    """Branches and tags; a clone's remote-tracking branches count as the branches they track."""
    out: dict[str, str] = {}
    for name, oid in refs.items():
        if name.startswith("refs/remotes/origin/") and name != "refs/remotes/origin/HEAD":
            out["refs/heads/" + name.removeprefix("refs/remotes/origin/")] = oid
        elif name.startswith(("refs/heads/", "refs/tags/")):
            out.setdefault(name, oid)
    return out


def source_refs(source: GeneratedRepo) -> dict[str, str]:
    return {name.decode(): oid.decode() for name, oid in source.refs.items()}


def object_ids(repo: Path) -> set[bytes]:
    listing = run_git(["cat-file", "--batch-all-objects", "--batch-check=%(objectname)"], cwd=repo)
    return set(listing.split())


def fsck(repo: Path) -> None:
    run_git(["fsck", "--strict", "--no-dangling"], cwd=repo, timeout_s=60)


def clone_and_fsck(url: str, tmp: Path) -> Path:
    """A bare git clone of `url` that `git fsck --strict` accepts."""
    target = tmp / f"verify-{next(_names)}.git"
    run_git(["clone", "--quiet", "--bare", url, str(target)], cwd=tmp, timeout_s=60)
    fsck(target)
    return target


def rev(repo: Path, name: str) -> str:
    return run_git(["rev-parse", name], cwd=repo).decode().strip()


def git_commit(work: Path, path: str, content: bytes) -> str:
    """Commit one file change with the git CLI; returns the new 40-hex HEAD."""
    (work / path).write_bytes(content)
    run_git(["add", path], cwd=work)
    run_git(["commit", "--quiet", "-m", f"change {path}"], cwd=work)
    return rev(work, "HEAD")


def cloned_refs(section: Section) -> dict[str, str]:
    assert section.command == "clone", section
    return {row[2]: row[1] for row in section.rows if row[0] == "ref"}


def push_statuses(section: Section) -> dict[str, tuple[str, str]]:
    """Remote ref name -> (JGit's RemoteRefUpdate.Status, new oid)."""
    assert section.command == "push", section
    return {row[2]: (row[1], row[3]) for row in section.rows if row[0] == "push"}


def fetch_updates(section: Section) -> dict[str, tuple[str, str, str]]:
    """Local tracking ref -> (RefUpdate.Result, old oid, new oid)."""
    assert section.command == "fetch", section
    return {row[4]: (row[1], row[2], row[3]) for row in section.rows if row[0] == "update"}


# --- clone and ls-remote --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadOnlyRun:
    """One JVM's clones and ls-remotes of one seeded repository, checked by three tests."""

    url: str
    root: Path
    sections: dict[str, Section]  # label -> its command's output


_READ_ONLY_RUNS = ("clone-v2", "clone-v0", "shallow-v2", "shallow-v0", "ls-v2", "ls-v0")


@pytest.fixture(scope="module")
def read_only(
    jgit: JGit, enroute_url: str, source: GeneratedRepo, tmp_path_factory: pytest.TempPathFactory
) -> ReadOnlyRun:
    """Reads share one repository and one JVM: each JVM start costs a second or more."""
    url = f"{enroute_url}/jgit-read-{time.monotonic_ns()}.git"
    run_git(
        ["push", "--quiet", url, "refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"],
        cwd=source.path,
        timeout_s=60,
    )
    root = tmp_path_factory.mktemp("jgit-read")
    args: list[str] = []
    for label in _READ_ONLY_RUNS:
        kind, protocol = label.split("-v")
        if args:
            args.append("--then")
        args += ["--protocol", protocol]
        if kind == "ls":
            args += ["ls-remote", url]
        else:
            args += ["clone", url, str(root / label), "--bare"]
            args += ["--depth", "1"] if kind == "shallow" else []
    run = jgit.run(args, cwd=root)
    assert len(run.sections) == len(_READ_ONLY_RUNS), run
    return ReadOnlyRun(url, root, dict(zip(_READ_ONLY_RUNS, run.sections, strict=True)))


@pytest.mark.parametrize("protocol", ["2", "0"])
def test_jgit_clone(read_only: ReadOnlyRun, source: GeneratedRepo, protocol: str) -> None:
    label = f"clone-v{protocol}"
    clone = read_only.root / label
    want = heads_and_tags(source_refs(source))
    assert heads_and_tags(cloned_refs(read_only.sections[label])) == want
    assert object_ids(clone) == object_ids(source.path)
    fsck(clone)
    # What JGit wrote to disk is what it printed, and HEAD follows the server's.
    listed = run_git(["for-each-ref", "--format=%(refname) %(objectname)"], cwd=clone)
    on_disk = dict(line.split(" ", 1) for line in listed.decode().splitlines())
    assert heads_and_tags(on_disk) == want
    assert run_git(["symbolic-ref", "HEAD"], cwd=clone).strip() == source.head


@pytest.mark.parametrize("protocol", ["2", "0"])
def test_jgit_shallow_clone(read_only: ReadOnlyRun, source: GeneratedRepo, protocol: str) -> None:
    """`--depth 1` (gitprotocol-v2 "fetch" shallow/deepen; v0 "shallow" lines)."""
    label = f"shallow-v{protocol}"
    clone = read_only.root / label
    tips = set(run_git(["rev-list", "--no-walk", "--all"], cwd=source.path).split())
    roots = set(run_git(["rev-list", "--max-parents=0", "--all"], cwd=source.path).split())
    want = heads_and_tags(source_refs(source))
    assert heads_and_tags(cloned_refs(read_only.sections[label])) == want
    assert set(run_git(["rev-list", "--all"], cwd=clone).split()) == tips
    assert set((clone / "shallow").read_bytes().split()) == tips - roots
    fsck(clone)


@pytest.mark.parametrize("protocol", ["2", "0"])
def test_jgit_ls_remote_matches_git(read_only: ReadOnlyRun, protocol: str) -> None:
    section = read_only.sections[f"ls-v{protocol}"]
    assert section.command == "ls-remote"
    want = git_ls_remote(read_only.url, read_only.root)
    assert any(name.endswith("^{}") for name in want), want  # annotated tags are peeled
    got = {row[1]: row[0] for row in section.rows if row[0] != "symref"}
    assert got == want
    symrefs = {row[2]: row[1] for row in section.rows if row[0] == "symref"}
    assert symrefs.get("HEAD") == "refs/heads/main", section.rows


# --- push -----------------------------------------------------------------------------------


def test_jgit_push_fast_forward_new_branch_atomic_and_delete(
    jgit: JGit, seeded: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    before = git_ls_remote(seeded, tmp_path)
    doomed = next(n for n in sorted(before) if n.startswith("refs/heads/feature/"))
    run = jgit.run(
        [
            "clone", seeded, str(work),
            "--then", "commit", str(work), "jgit/one.txt", "written by JGit\n", "jgit one",
            "--then", "push", str(work), "refs/heads/main:refs/heads/main",
            "refs/heads/main:refs/heads/from-jgit",
            "--then", "commit", str(work), "jgit/two.txt", "again\n", "jgit two",
            "--then", "push", str(work), "--atomic", "refs/heads/main:refs/heads/main",
            "refs/heads/main:refs/heads/from-jgit-atomic",
            "--then", "push", str(work), f":{doomed}",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    _, one, first, two, atomic, delete = run.sections
    one_oid, two_oid = one.rows[0][0], two.rows[0][0]
    assert push_statuses(first) == {
        "refs/heads/main": ("OK", one_oid),
        "refs/heads/from-jgit": ("OK", one_oid),
    }, run.stderr
    assert push_statuses(atomic) == {
        "refs/heads/main": ("OK", two_oid),
        "refs/heads/from-jgit-atomic": ("OK", two_oid),
    }, run.stderr
    assert push_statuses(delete) == {doomed: ("OK", ZERO_OID)}, run.stderr

    after = git_ls_remote(seeded, tmp_path)
    assert after["refs/heads/main"] == two_oid
    assert after["refs/heads/from-jgit"] == one_oid
    assert after["refs/heads/from-jgit-atomic"] == two_oid
    assert doomed not in after
    untouched = set(before) - {"HEAD", "refs/heads/main", doomed}
    assert {n: after[n] for n in untouched} == {n: before[n] for n in untouched}
    verify = clone_and_fsck(seeded, tmp_path)
    assert rev(verify, "refs/heads/main^") == one_oid
    assert run_git(["cat-file", "-p", f"{two_oid}:jgit/one.txt"], cwd=verify) == (
        b"written by JGit\n"
    )


def test_jgit_push_creates_repository(jgit: JGit, enroute_url: str, tmp_path: Path) -> None:
    """A first push to a new name: the advertisement is the empty-repository form."""
    url = f"{enroute_url}/jgit-new-{next(_names)}-{time.monotonic_ns()}.git"
    work = tmp_path / "new"
    run = jgit.run(
        [
            "init", str(work), url,
            "--then", "commit", str(work), "README.md", "first\n", "first",
            "--then", "push", str(work), "refs/heads/main:refs/heads/main",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    _, made, pushed = run.sections
    oid = made.rows[0][0]
    assert push_statuses(pushed) == {"refs/heads/main": ("OK", oid)}, run.stderr
    assert branches_and_tags(git_ls_remote(url, tmp_path)) == {"refs/heads/main": oid}
    verify = clone_and_fsck(url, tmp_path)
    assert run_git(["cat-file", "-p", f"{oid}:README.md"], cwd=verify) == b"first\n"


class RacingProxy:
    """An HTTP relay to the server that runs `before_update` once, just before it relays the
    first receive-pack POST: another client's push then lands between the advertisement the
    pusher saw and its update, so only the server can notice the stale old-oid."""

    _HOP_BY_HOP = frozenset(("host", "connection", "content-length", "transfer-encoding"))

    def __init__(self, upstream: str, before_update: Callable[[], object]) -> None:
        self.upstream = upstream.rstrip("/")
        self.before_update = before_update
        self.raced = False
        self.errors: list[BaseException] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> RacingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _relay(self) -> None:
                body = self._body()
                receive = self.command == "POST" and self.path.endswith("/git-receive-pack")
                if receive and not proxy.raced:
                    proxy.raced = True
                    try:
                        proxy.before_update()
                    except BaseException as exc:  # reported by the test
                        proxy.errors.append(exc)
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in proxy._HOP_BY_HOP
                }
                request = urllib.request.Request(
                    proxy.upstream + self.path, data=body, method=self.command, headers=headers
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        status, reply, data = response.status, response.headers, response.read()
                except urllib.error.HTTPError as exc:
                    status, reply, data = exc.code, exc.headers, exc.read()
                self.send_response(status)
                for key, value in reply.items():
                    if key.lower() not in proxy._HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._relay()

            def do_POST(self) -> None:
                self._relay()

        return Relay


def test_jgit_non_fast_forward_rejected(
    jgit: JGit, enroute_url: str, seeded: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    cloned = jgit.run(
        ["clone", seeded, str(work), "--then", "commit", str(work), "mine.txt", "mine\n", "mine"],
        cwd=tmp_path,
    )
    mine = cloned.sections[1].rows[0][0]
    tip = rev(work, "refs/remotes/origin/main")
    old = rev(work, "refs/remotes/origin/main~3")
    other = tmp_path / "other"
    run_git(["clone", "--quiet", seeded, str(other)], cwd=tmp_path, timeout_s=60)
    theirs = git_commit(other, "theirs.txt", b"theirs\n")

    # The server's check: their push lands after JGit read main=tip, before JGit's update.
    def their_push() -> None:
        run_git(["push", "--quiet", "origin", "main"], cwd=other, timeout_s=60)

    with RacingProxy(enroute_url, their_push) as proxy:
        via_proxy = proxy.url + seeded.removeprefix(enroute_url)
        raced = jgit.run(
            ["push", str(work), "--remote", via_proxy, "refs/heads/main:refs/heads/main"],
            cwd=tmp_path,
            ok=(2,),
        )
    assert proxy.raced and not proxy.errors, proxy.errors
    assert push_statuses(raced.sections[0]) == {
        "refs/heads/main": ("REJECTED_OTHER_REASON", mine)
    }, raced.sections
    (row,) = raced.sections[0].rows
    assert row[4] in SERVER_REFUSALS, f"JGit shows the server's `ng` reason: {row}"
    before = git_ls_remote(seeded, tmp_path)
    assert before["refs/heads/main"] == theirs

    # JGit's own checks, now that it has seen their commit advertised but lacks it.
    run = jgit.run(
        [
            "push", str(work), f"{old}:refs/heads/main",
            "--then", "push", str(work), "refs/heads/main:refs/heads/main",
        ],
        cwd=tmp_path,
        ok=(2,),
    )  # fmt: skip
    rewind, stale = run.sections
    assert push_statuses(rewind) == {"refs/heads/main": ("REJECTED_NONFASTFORWARD", old)}
    assert push_statuses(stale) == {"refs/heads/main": ("REJECTED_NONFASTFORWARD", mine)}
    assert git_ls_remote(seeded, tmp_path) == before
    assert rev(work, "refs/remotes/origin/main") == tip  # JGit never fetched their commit

    # Forced, the same update lands: the server refuses only an old-oid that is stale.
    forced = jgit.run(
        ["push", str(work), "--force", "refs/heads/main:refs/heads/main"], cwd=tmp_path
    )
    assert push_statuses(forced.sections[0]) == {"refs/heads/main": ("OK", mine)}
    assert git_ls_remote(seeded, tmp_path)["refs/heads/main"] == mine
    verify = clone_and_fsck(seeded, tmp_path)
    assert rev(verify, "refs/heads/main") == mine


# --- fetch ----------------------------------------------------------------------------------


def test_jgit_fetches_new_commits(jgit: JGit, seeded: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    jgit.run(["--protocol", "2", "clone", seeded, str(work)], cwd=tmp_path)
    other = tmp_path / "other"
    run_git(["clone", "--quiet", seeded, str(other)], cwd=tmp_path, timeout_s=60)
    old_main = rev(other, "HEAD")
    first = git_commit(other, "fetch-one.txt", b"one\n")
    second = git_commit(other, "fetch-two.txt", b"two\n")
    run_git(["tag", "-a", "-m", "release", "v-fetch", second], cwd=other)
    run_git(["checkout", "--quiet", "-b", "topic", first], cwd=other)
    topic = git_commit(other, "topic.txt", b"topic\n")
    run_git(
        ["push", "--quiet", "origin", "main", "topic", "refs/tags/v-fetch"],
        cwd=other,
        timeout_s=60,
    )
    tag = rev(other, "refs/tags/v-fetch")

    fetched = jgit.run(["--protocol", "2", "fetch", str(work)], cwd=tmp_path)
    updates = fetch_updates(fetched.sections[0])
    assert updates["refs/remotes/origin/main"] == ("FAST_FORWARD", old_main, second)
    assert updates["refs/remotes/origin/topic"] == ("NEW", ZERO_OID, topic)
    assert updates["refs/tags/v-fetch"] == ("NEW", ZERO_OID, tag)  # followed: it names main
    assert rev(work, "refs/remotes/origin/main") == second
    assert rev(work, "refs/tags/v-fetch") == tag
    fsck(work)

    # Over v0 now: main moves on and topic is rewound (a forced update for the tracking ref).
    run_git(["checkout", "--quiet", "main"], cwd=other)
    third = git_commit(other, "fetch-three.txt", b"three\n")
    run_git(["push", "--quiet", "origin", "main", f"+{old_main}:refs/heads/topic"], cwd=other)
    fetched = jgit.run(["--protocol", "0", "fetch", str(work)], cwd=tmp_path)
    updates = fetch_updates(fetched.sections[0])
    assert updates["refs/remotes/origin/main"] == ("FAST_FORWARD", second, third)
    assert updates["refs/remotes/origin/topic"] == ("FORCED", topic, old_main)
    assert rev(work, "refs/remotes/origin/main") == third
    fsck(work)
    assert object_ids(work) >= object_ids(other)


# --- the jar lookup (no server, no JVM) -----------------------------------------------------

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <parent>
    <groupId>org.eclipse.jgit</groupId>
    <artifactId>org.eclipse.jgit-parent</artifactId>
    <version>{version}</version>
  </parent>
  <artifactId>org.eclipse.jgit</artifactId>
  <dependencies>
    <dependency><groupId>com.googlecode.javaewah</groupId><artifactId>JavaEWAH</artifactId>
    </dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId></dependency>
    <dependency><groupId>junit</groupId><artifactId>junit</artifactId><scope>test</scope>
    </dependency>
    <dependency><groupId>org.example</groupId><artifactId>extra</artifactId>
      <optional>true</optional></dependency>
  </dependencies>
</project>
"""
_PARENT_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <properties><slf4j-version>{slf4j}</slf4j-version></properties>
  <dependencyManagement><dependencies>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>${{slf4j-version}}</version></dependency>
    <dependency><groupId>com.googlecode.javaewah</groupId><artifactId>JavaEWAH</artifactId>
      <version>1.2.3</version></dependency>
  </dependencies></dependencyManagement>
</project>
"""


def _jar(m2: Path, group: str, artifact: str, version: str, java: int | None = None) -> Path:
    path = m2.joinpath(*group.split("."), artifact, version, f"{artifact}-{version}.jar")
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = "Manifest-Version: 1.0\n"
    if java is not None:
        manifest += f"Bundle-RequiredExecutionEnvironment: JavaSE-{java}\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("META-INF/MANIFEST.MF", manifest)
    return path


def _jgit(m2: Path, version: str, java: int, slf4j: str) -> Path:
    jar = _jar(m2, "org.eclipse.jgit", "org.eclipse.jgit", version, java)
    jar.with_suffix(".pom").write_text(_POM.format(version=version))
    parent = m2 / "org/eclipse/jgit/org.eclipse.jgit-parent" / version
    parent.mkdir(parents=True)
    (parent / f"org.eclipse.jgit-parent-{version}.pom").write_text(_PARENT_POM.format(slf4j=slf4j))
    return jar


def test_lookup_takes_newest_jgit_with_pinned_dependencies(tmp_path: Path) -> None:
    m2 = tmp_path / "m2"
    old = _jgit(m2, "6.10.1.202505221210-r", 11, "1.7.36")
    new = _jgit(m2, "7.4.0.202509020913-r", 17, "1.7.36")
    ewah = _jar(m2, "com.googlecode.javaewah", "JavaEWAH", "1.2.3")
    _jar(m2, "com.googlecode.javaewah", "JavaEWAH", "1.3.0")  # newer, but not what JGit pins
    pinned = _jar(m2, "org.slf4j", "slf4j-api", "1.7.36")
    _jar(m2, "org.slf4j", "slf4j-api", "2.0.18")
    nop = _jar(m2, "org.slf4j", "slf4j-nop", "1.7.36")
    _jar(m2, "org.slf4j", "slf4j-nop", "2.0.17")  # another slf4j major: not mixed in
    assert find_jgit_classpath(m2, java_feature=17) == [new, ewah, pinned, nop]
    assert find_jgit_classpath(m2, java_feature=21) == [new, ewah, pinned, nop]
    found = locate_jgit(m2, java_feature=11)
    assert found.version == "6.10.1.202505221210-r"
    assert found.classpath == (old, ewah, pinned, nop)
    assert found.problems == ("org.eclipse.jgit 7.4.0.202509020913-r: needs Java 17 > 11",)
    assert find_jgit_classpath(m2, java_feature=8) is None


def test_lookup_falls_back_to_newest_local_dependency(tmp_path: Path) -> None:
    m2 = tmp_path / "m2"
    jgit = _jgit(m2, "7.4.0.202509020913-r", 17, "2.0.16")  # the pinned slf4j is absent
    ewah = _jar(m2, "com.googlecode.javaewah", "JavaEWAH", "1.2.3")
    _jar(m2, "org.slf4j", "slf4j-api", "2.0.7")
    newest = _jar(m2, "org.slf4j", "slf4j-api", "2.0.17")
    assert find_jgit_classpath(m2) == [jgit, ewah, newest]


def test_lookup_names_what_is_missing(tmp_path: Path) -> None:
    m2 = tmp_path / "m2"
    empty = locate_jgit(m2)
    assert empty.classpath is None
    assert "no org.eclipse.jgit:org.eclipse.jgit jar" in empty.problems[0]
    _jgit(m2, "7.4.0.202509020913-r", 17, "1.7.36")
    _jar(m2, "org.slf4j", "slf4j-api", "1.7.36")
    found = locate_jgit(m2)
    assert found.classpath is None and found.version is None
    assert "missing com.googlecode.javaewah:JavaEWAH:1.2.3" in found.problems[0], found.problems
    assert find_jgit_classpath(m2) is None
