"""Deterministic test repositories, packs and object dumps made by real git.

``generate_repo`` writes one ``git fast-import`` stream (gitfast-import(1))
computed in memory from ``random.Random(spec.seed)`` and feeds it to git in a
single call. Everything that reaches an object (contents, paths, modes,
identities, dates, messages) comes from the seed and the spec, and nothing
iterates a hash-ordered container, so one spec gives the same object ids on
every machine. ``test_repogen.py`` pins a golden commit id: a change to the
generator that moves it changes every repository built from it.

History shape: a root commit on ``main`` adds the initial files; extra
branches fork from ``main``'s tip at seeded points and get their own commits;
``main`` merges branches back (now and then two at once, an octopus). A merge
takes each path the merged branch changed since its last merge ("theirs" for
touched paths), which keeps every path consistent without a merge algorithm.
Text files change by line inserts, deletes and replacements so that
``git pack-objects`` finds deltas; binary files are random bytes, partly
patched and partly replaced; the optional large file is word text changed in
a few lines at a time. File names always carry a ``.`` and directory names
never do, so a path is never a file on one side and a directory on another.

The helpers ``pack_objects``, ``all_objects`` and ``verify_pack`` wrap
``git pack-objects``, ``git cat-file --batch`` and ``git index-pack`` +
``git verify-pack -v`` (gitformat-pack(5)) for interop tests and benchmarks.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from enroute_testing.gitcli import GitFailed, run_git

__all__ = [
    "GeneratedRepo",
    "RepoSpec",
    "VerifyPackEntry",
    "all_objects",
    "fast_import_stream",
    "generate_repo",
    "list_refs",
    "pack_objects",
    "verify_pack",
]

BASE_TIME_S = 1_700_000_000
COMMIT_STEP_S = 60

_MODE_FILE = b"100644"
_MODE_EXEC = b"100755"
_MODE_LINK = b"120000"

# (name, email, UTC offset); one name is non-ASCII UTF-8 on purpose.
_IDENTITIES: tuple[tuple[bytes, bytes, bytes], ...] = (
    (b"Ada Lovelace", b"ada@example.com", b"+0000"),
    (b"Grace Hopper", b"grace@example.com", b"-0500"),
    (b"Zo\xc3\xab Durand", b"zoe@example.org", b"+0100"),
    (b"Ravi Kumar", b"ravi@example.net", b"+0530"),
)
_TAGGER = (b"Release Bot", b"release@example.com", b"+0000")

_TEXT_EXTS = (b"txt", b"md", b"py", b"c", b"rs")
_EMPTY_PATH = b".keep"
_LARGE_PATH = b"large.dat"
_LARGE_CHANGES = 4  # target number of large-file revisions after the first
_PACK_TYPES = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag", 6: b"ofs-delta", 7: b"ref-delta"}
_OBJECT_TYPES = frozenset((b"commit", b"tree", b"blob", b"tag"))
_LONG_TIMEOUT_S = 900.0
_PACK_OBJECTS_OPTIONS = frozenset(("--all", "--reflog", "--indexed-objects"))


@dataclass(frozen=True, slots=True)
class RepoSpec:
    """What to generate; every knob is deterministic given ``seed``."""

    seed: int = 0
    commits: int = 50  # all commits, merges included
    branches: int = 3  # extra branches besides main
    merge_every: int = 10  # a merge on main after every N main commits (0 = none)
    files: int = 40  # initial text files
    tree_depth: int = 4  # max directory depth
    rename_rate: float = 0.05  # fraction of commits that rename a path
    delete_rate: float = 0.03
    binary_files: int = 3  # random (incompressible) binary files
    large_file_bytes: int = 0  # if >0, one large file of this size that changes a few times
    annotated_tags: int = 3
    lightweight_tags: int = 1
    file_bytes: int = 2000  # typical text file size; scales all contents
    executable_rate: float = 0.05
    symlinks: int = 1

    def __post_init__(self) -> None:
        counts = {
            "commits": self.commits,
            "files": self.files,
            "file_bytes": self.file_bytes,
        }
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"RepoSpec.{name} must be >= 1, got {value}")
        non_negative = {
            "branches": self.branches,
            "merge_every": self.merge_every,
            "tree_depth": self.tree_depth,
            "binary_files": self.binary_files,
            "large_file_bytes": self.large_file_bytes,
            "annotated_tags": self.annotated_tags,
            "lightweight_tags": self.lightweight_tags,
            "symlinks": self.symlinks,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"RepoSpec.{name} must be >= 0, got {value}")
        rates = {
            "rename_rate": self.rename_rate,
            "delete_rate": self.delete_rate,
            "executable_rate": self.executable_rate,
        }
        for name, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"RepoSpec.{name} must be in [0, 1], got {rate}")


@dataclass(frozen=True)
class GeneratedRepo:
    path: Path  # a bare repository
    spec: RepoSpec
    refs: dict[bytes, bytes]  # ref name -> 40-hex oid, as `git for-each-ref` reports
    head: bytes  # b"refs/heads/main"


@dataclass(frozen=True, slots=True)
class VerifyPackEntry:
    """One object line of ``git verify-pack -v``.

    ``type`` is the resolved object type git prints; ``pack_type`` is the
    entry's own type from its pack header (gitformat-pack(5), "Object types"),
    so ``b"ofs-delta"`` / ``b"ref-delta"`` tell the two delta kinds apart.
    """

    oid: bytes  # 40-hex
    type: bytes
    size: int
    size_in_pack: int
    offset: int
    depth: int  # 0 if not a delta
    base_oid: bytes | None  # 40-hex, None if not a delta
    pack_type: bytes


# --- the stream builder ---------------------------------------------------------------------


@dataclass(slots=True)
class _Branch:
    ref: bytes
    state: dict[bytes, tuple[bytes, bytes]]  # path -> (mode, content)
    text: list[bytes]  # text paths in state, in a stable order (rename/delete candidates)
    tip: int = 0  # mark of the tip commit, 0 before the first commit
    commits: int = 0
    unmerged: int = 0  # commits since the last merge into main
    touched: dict[bytes, None] = field(default_factory=dict)  # paths changed since last merge


class _Credit:
    """Spreads ``rate * n`` events evenly over n steps (seeded phase)."""

    __slots__ = ("acc", "rate")

    def __init__(self, rate: float, phase: float) -> None:
        self.rate = rate
        self.acc = phase

    def due(self) -> bool:
        self.acc += self.rate
        if self.acc >= 1.0:
            self.acc -= 1.0
            return True
        return False


def _vocabulary(rng: random.Random, count: int = 1024) -> list[bytes]:
    consonants = b"bcdfghjklmnprstvwz"
    vowels = b"aeiou"
    words = []
    for _ in range(count):
        syllables = rng.randint(1, 4)
        words.append(
            bytes(
                byte
                for _ in range(syllables)
                for byte in (rng.choice(consonants), rng.choice(vowels))
            )
        )
    return words


def _relative(target: bytes, link: bytes) -> bytes:
    """The relative symlink text from ``link``'s directory to ``target`` (no cwd involved)."""
    to = target.split(b"/")
    here = link.split(b"/")[:-1]
    common = 0
    while common < min(len(to) - 1, len(here)) and to[common] == here[common]:
        common += 1
    return b"/".join([b".."] * (len(here) - common) + to[common:])


def _data(payload: bytes) -> bytes:
    return b"data %d\n%s\n" % (len(payload), payload)


class _StreamBuilder:
    def __init__(self, spec: RepoSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.vocab = _vocabulary(self.rng)
        self.out: list[bytes] = []
        self.mark = 0
        self.clock = 0  # commits and tags made so far; dates follow it
        self.dir_list: list[bytes] = [b""]
        self.dir_depth: dict[bytes, int] = {b"": 0}
        self.binaries: list[bytes] = []
        self.links: list[bytes] = []
        self.main = _Branch(b"refs/heads/main", {}, [])
        self.main_marks: list[int] = []
        self.since_merge = 0
        rng = self.rng
        self.rename_credit = _Credit(spec.rename_rate, rng.random())
        self.delete_credit = _Credit(spec.delete_rate, rng.random())
        self.large_credit = _Credit(min(1.0, _LARGE_CHANGES / spec.commits), rng.random())

    # -- contents --

    def _line(self) -> bytes:
        rng = self.rng
        words = rng.choices(self.vocab, k=rng.randint(2, 12))
        return b"    " * rng.randrange(3) + b" ".join(words) + b"\n"

    def _text(self, size: int) -> bytes:
        lines: list[bytes] = []
        total = 0
        while total < size:
            line = self._line()
            lines.append(line)
            total += len(line)
        return b"".join(lines)

    def _text_size(self) -> int:
        return max(1, int(self.spec.file_bytes * self.rng.uniform(0.2, 2.0)))

    def _edit_text(self, data: bytes) -> bytes:
        rng = self.rng
        lines = data.splitlines(keepends=True)
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            if op < 0.4 or not lines:
                lines.insert(rng.randrange(len(lines) + 1), self._line())
            elif op < 0.6 and len(lines) > 1:
                del lines[rng.randrange(len(lines))]
            else:
                lines[rng.randrange(len(lines))] = self._line()
        edited = b"".join(lines)
        return edited if edited != data else edited + self._line()

    def _large(self, size: int) -> bytes:
        rng = self.rng
        pool = [self._line() for _ in range(4096)]
        chunks: list[bytes] = []
        total = 0
        while total < size:
            batch = rng.choices(pool, k=max(1, (size - total) // 40 + 1))
            chunks.extend(batch)
            total += sum(len(line) for line in batch)
        return b"".join(chunks)[:size]

    def _edit_large(self, data: bytes) -> bytes:
        rng = self.rng
        for _ in range(3):
            at = rng.randrange(len(data))
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at)
            end = len(data) if end < 0 else end + 1
            data = data[:start] + self._line() + data[end:]
        return data

    def _edit_binary(self, data: bytes) -> bytes:
        rng = self.rng
        if rng.random() < 0.5 or len(data) < 64:
            return rng.randbytes(max(1, int(len(data) * rng.uniform(0.8, 1.25))))
        length = rng.randint(8, 64)
        at = rng.randrange(len(data) - length + 1)
        return data[:at] + rng.randbytes(length) + data[at + length :]

    # -- paths --

    def _pick_dir(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.3:
            parents = [d for d in self.dir_list if self.dir_depth[d] < self.spec.tree_depth]
            if parents:
                parent = rng.choice(parents)
                name = rng.choice(self.vocab)
                made = parent + b"/" + name if parent else name
                if made not in self.dir_depth:
                    self.dir_depth[made] = self.dir_depth[parent] + 1
                    self.dir_list.append(made)
                return made
        return rng.choice(self.dir_list)

    def _new_path(self, br: _Branch, ext: bytes) -> bytes:
        directory = self._pick_dir()
        prefix = directory + b"/" if directory else b""
        stem = self.rng.choice(self.vocab)
        path = prefix + stem + b"." + ext
        n = 1
        while path in br.state:
            n += 1
            path = prefix + stem + b"-%d." % n + ext
        return path

    def _link_target(self, br: _Branch, link: bytes) -> bytes:
        if not br.text:
            return b"missing.txt"
        return _relative(self.rng.choice(br.text), link)

    # -- stream pieces --

    def _set(self, br: _Branch, ops: list[bytes], path: bytes, mode: bytes, data: bytes) -> None:
        br.state[path] = (mode, data)
        br.touched[path] = None
        ops.append(b"M %s inline %s\n%s" % (mode, path, _data(data)))

    def _commit(
        self, br: _Branch, parents: Sequence[int], ops: list[bytes], subject: bytes
    ) -> None:
        rng = self.rng
        name, email, tz = _IDENTITIES[rng.randrange(len(_IDENTITIES))]
        when = BASE_TIME_S + self.clock * COMMIT_STEP_S
        self.clock += 1
        self.mark += 1
        message = subject + b"\n"
        if rng.random() < 0.5:
            message += b"\n" + self._text(rng.randint(20, 300))
        who = b"%s <%s> %d %s\n" % (name, email, when, tz)
        head = [b"commit %s\nmark :%d\n" % (br.ref, self.mark)]
        head.append(b"author " + who + b"committer " + who + _data(message))
        if parents:
            head.append(b"from :%d\n" % parents[0])
            head.extend(b"merge :%d\n" % p for p in parents[1:])
        self.out.extend(head)
        self.out.extend(ops)
        self.out.append(b"\n")
        br.tip = self.mark
        br.commits += 1
        if br is self.main:
            self.main_marks.append(self.mark)
        else:
            br.unmerged += 1

    # -- commits --

    def root(self) -> None:
        spec, rng, main = self.spec, self.rng, self.main
        ops: list[bytes] = []
        executable = max(1, round(spec.files * spec.executable_rate))
        exec_at = set(rng.sample(range(spec.files), min(spec.files, executable)))
        if spec.executable_rate == 0:
            exec_at = set()
        for i in range(spec.files):
            self._add_text(main, ops, i in exec_at)
        self._set(main, ops, _EMPTY_PATH, _MODE_FILE, b"")
        for _ in range(spec.binary_files):
            path = self._new_path(main, b"bin")
            self.binaries.append(path)
            size = max(1, int(spec.file_bytes * rng.uniform(0.5, 3.0)))
            self._set(main, ops, path, _MODE_FILE, rng.randbytes(size))
        if spec.large_file_bytes:
            self._set(main, ops, _LARGE_PATH, _MODE_FILE, self._large(spec.large_file_bytes))
        for _ in range(spec.symlinks):
            path = self._new_path(main, b"lnk")
            self.links.append(path)
            self._set(main, ops, path, _MODE_LINK, self._link_target(main, path))
        self._commit(main, (), ops, b"Initial import")

    def _add_text(self, br: _Branch, ops: list[bytes], executable: bool) -> bytes:
        if executable:
            path = self._new_path(br, b"sh")
            data = b"#!/bin/sh\n" + self._text(self._text_size())
            mode = _MODE_EXEC
        else:
            path = self._new_path(br, self.rng.choice(_TEXT_EXTS))
            data = self._text(self._text_size())
            mode = _MODE_FILE
        br.text.append(path)
        self._set(br, ops, path, mode, data)
        return path

    def _pick(self, paths: list[bytes], busy: set[bytes], br: _Branch) -> bytes | None:
        for _ in range(8):
            if not paths:
                return None
            path = self.rng.choice(paths)
            if path not in busy and path in br.state:
                return path
        return None

    def normal(self, br: _Branch) -> None:
        spec, rng = self.spec, self.rng
        ops: list[bytes] = []
        busy: set[bytes] = set()  # membership only: never write a path twice in one commit
        words: list[bytes] = []
        for _ in range(rng.randint(1, 3)):
            path = self._pick(br.text, busy, br)
            if path is not None:
                mode, data = br.state[path]
                self._set(br, ops, path, mode, self._edit_text(data))
                busy.add(path)
                words.append(b"edit " + path)
        if rng.random() < 0.15:
            path = self._add_text(br, ops, rng.random() < spec.executable_rate)
            busy.add(path)
            words.append(b"add " + path)
        if self.rename_credit.due():
            words.extend(self._rename(br, ops, busy))
        if self.delete_credit.due() and len(br.text) > 1:
            path = self._pick(br.text, busy, br)
            if path is not None:
                del br.state[path]
                br.text.remove(path)
                br.touched[path] = None
                busy.add(path)
                ops.append(b"D %s\n" % path)
                words.append(b"delete " + path)
        words.extend(self._other_changes(br, ops, busy))
        if not ops:
            words.append(b"add " + self._add_text(br, ops, False))
        subject = b"%s: " % br.ref.removeprefix(b"refs/heads/") + b", ".join(words[:3])
        self._commit(br, (br.tip,), ops, subject)

    def _rename(self, br: _Branch, ops: list[bytes], busy: set[bytes]) -> list[bytes]:
        path = self._pick(br.text, busy, br)
        if path is None or not br.state[path][1]:
            return []
        new = self._new_path(br, path.rsplit(b".", 1)[1])
        mode, data = br.state.pop(path)
        br.state[new] = (mode, data)
        br.text[br.text.index(path)] = new
        br.touched[path] = None
        br.touched[new] = None
        busy.update((path, new))
        ops.append(b"R %s %s\n" % (path, new))
        if len(data) >= 1024 and self.rng.random() < 0.5:
            # A small edit keeps the pair well above git's 50% similarity.
            self._set(br, ops, new, mode, self._edit_text(data))
        return [b"rename " + path]

    def _other_changes(self, br: _Branch, ops: list[bytes], busy: set[bytes]) -> list[bytes]:
        rng = self.rng
        words: list[bytes] = []
        if self.binaries and rng.random() < 0.1:
            path = self._pick(self.binaries, busy, br)
            if path is not None:
                self._set(br, ops, path, _MODE_FILE, self._edit_binary(br.state[path][1]))
                busy.add(path)
                words.append(b"update " + path)
        if _LARGE_PATH in br.state and self.large_credit.due():
            self._set(br, ops, _LARGE_PATH, _MODE_FILE, self._edit_large(br.state[_LARGE_PATH][1]))
            busy.add(_LARGE_PATH)
            words.append(b"update " + _LARGE_PATH)
        if self.links and rng.random() < 0.03:
            path = self._pick(self.links, busy, br)
            if path is not None:
                self._set(br, ops, path, _MODE_LINK, self._link_target(br, path))
                busy.add(path)
                words.append(b"retarget " + path)
        if rng.random() < 0.02:
            path = self._pick(br.text, busy, br)
            if path is not None:
                mode, data = br.state[path]
                flipped = _MODE_FILE if mode == _MODE_EXEC else _MODE_EXEC
                self._set(br, ops, path, flipped, data)
                busy.add(path)
                words.append(b"chmod " + path)
        return words

    def merge(self, sources: list[_Branch]) -> None:
        main = self.main
        final: dict[bytes, tuple[bytes, bytes] | None] = {}
        for src in sources:
            for path in src.touched:
                final[path] = src.state.get(path)
            src.touched.clear()
            src.unmerged = 0
        ops: list[bytes] = []
        for path, entry in final.items():
            if entry is None:
                if path in main.state:
                    del main.state[path]
                    main.text.remove(path)
                    ops.append(b"D %s\n" % path)
            elif main.state.get(path) != entry:
                if path not in main.state:
                    main.text.append(path)
                self._set(main, ops, path, entry[0], entry[1])
        names = b"' and '".join(s.ref.removeprefix(b"refs/heads/") for s in sources)
        subject = b"Merge branch%s '%s'" % (b"es" if len(sources) > 1 else b"", names)
        self._commit(main, [main.tip, *(s.tip for s in sources)], ops, subject)

    # -- the whole history --

    def build(self) -> bytes:
        spec, rng, main = self.spec, self.rng, self.main
        self.root()
        branches = [
            _Branch(b"refs/heads/feature/%02d-%s" % (k + 1, rng.choice(self.vocab)), {}, [])
            for k in range(spec.branches)
        ]
        forks = self._fork_points(len(branches))
        fork_mark: list[int] = [main.tip] * len(branches)
        active: list[_Branch] = []
        merges = octopi = 0
        for i in range(1, spec.commits):
            for k, at in enumerate(forks):
                if at == i:
                    br = branches[k]
                    br.state = dict(main.state)
                    br.text = list(main.text)
                    br.tip = fork_mark[k] = main.tip
                    active.append(br)
            ready = [b for b in active if b.unmerged]
            if spec.merge_every and ready and self.since_merge >= spec.merge_every - 1:
                # One merge in four is an octopus, as soon as two branches are ready.
                if len(ready) > 1 and merges // 4 >= octopi:
                    sources = rng.sample(ready, 2)
                    octopi += 1
                else:
                    sources = [rng.choice(ready)]
                self.merge(sources)
                merges += 1
                self.since_merge = 0
            elif active and rng.random() < 0.5:
                # Favour branches with few commits so every branch gets some.
                weights = [1.0 / (1 + b.commits) for b in active]
                self.normal(rng.choices(active, weights)[0])
            else:
                self.normal(main)
                self.since_merge += 1
        for k, br in enumerate(branches):
            if br.commits == 0:
                self.out.append(b"reset %s\nfrom :%d\n\n" % (br.ref, fork_mark[k]))
        self._tags()
        self.out.append(b"done\n")
        return b"".join(self.out)

    def _fork_points(self, count: int) -> list[int]:
        """Commit indexes where branches fork, one per stratum of the first two thirds."""
        if self.spec.commits < 2:
            return [self.spec.commits] * count  # never reached: the branches stay at the root
        span = max(1, 2 * (self.spec.commits - 1) // 3)
        points = []
        for k in range(count):
            lo = 1 + k * span // count
            hi = 1 + (k + 1) * span // count
            points.append(self.rng.randrange(lo, max(lo + 1, hi)))
        return points

    def _tags(self) -> None:
        spec, rng = self.spec, self.rng
        marks = self.main_marks
        count = spec.annotated_tags
        if count <= len(marks):
            picks = sorted(rng.sample(range(len(marks)), count))
        else:
            picks = sorted(rng.choices(range(len(marks)), k=count))
        name, email, tz = _TAGGER
        for j, at in enumerate(picks):
            tag = b"v%d.%d.0" % (1 + j // 10, j % 10)
            when = BASE_TIME_S + self.clock * COMMIT_STEP_S
            self.clock += 1
            message = b"Release %s\n\n%s" % (tag, self._text(rng.randint(20, 200)))
            self.out.append(
                b"tag %s\nfrom :%d\ntagger %s <%s> %d %s\n%s"
                % (tag, marks[at], name, email, when, tz, _data(message))
            )
        for j in range(spec.lightweight_tags):
            at = rng.randrange(len(marks))
            self.out.append(b"reset refs/tags/snapshot-%d\nfrom :%d\n\n" % (j + 1, marks[at]))


def fast_import_stream(spec: RepoSpec) -> bytes:
    """The whole ``git fast-import`` input for ``spec`` (raw dates, ends with ``done``)."""
    return _StreamBuilder(spec).build()


# --- git drivers ----------------------------------------------------------------------------


def _init_bare(path: Path) -> None:
    try:
        run_git(["init", "--quiet", "--bare", "-b", "main", "."], cwd=path)
    except GitFailed:  # git older than 2.28 has no -b
        run_git(["init", "--quiet", "--bare", "."], cwd=path)
        run_git(["symbolic-ref", "HEAD", "refs/heads/main"], cwd=path)


def list_refs(repo: Path) -> dict[bytes, bytes]:
    """Ref name -> 40-hex oid for every ref, as ``git for-each-ref`` reports it."""
    out = run_git(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=repo)
    refs: dict[bytes, bytes] = {}
    for line in out.splitlines():
        oid, name = line.split(b" ", 1)
        refs[name] = oid
    return dict(sorted(refs.items()))


def generate_repo(path: Path, spec: RepoSpec) -> GeneratedRepo:
    """Create a bare repository at ``path`` (absent or empty) holding ``spec``'s history."""
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty")
    stream = fast_import_stream(spec)
    _init_bare(path)
    run_git(
        ["fast-import", "--quiet", "--date-format=raw", "--done"],
        cwd=path,
        input=stream,
        timeout_s=_LONG_TIMEOUT_S,
    )
    return GeneratedRepo(path=path, spec=spec, refs=list_refs(path), head=b"refs/heads/main")


def pack_objects(
    repo: Path,
    *,
    thin: bool = False,
    ofs_delta: bool = True,
    revs: Sequence[str] = ("--all",),
    exclude: Sequence[str] = (),
    depth: int | None = None,
    window: int | None = None,
    threads: int = 1,
) -> bytes:
    """Return the pack ``git pack-objects --stdout --revs`` writes for ``revs`` minus ``exclude``.

    ``--all``, ``--reflog`` and ``--indexed-objects`` among ``revs`` go on the
    command line; stdin takes only revisions, ``^rev`` and ``--not``. One thread by
    default keeps delta choices, and so the pack bytes, reproducible.
    """
    args = ["pack-objects", "--stdout", "--revs", "-q", f"--threads={threads}"]
    if thin:
        args.append("--thin")
    if ofs_delta:
        args.append("--delta-base-offset")
    if depth is not None:
        args.append(f"--depth={depth}")
    if window is not None:
        args.append(f"--window={window}")
    args.extend(r for r in revs if r in _PACK_OBJECTS_OPTIONS)
    lines = [r for r in revs if r not in _PACK_OBJECTS_OPTIONS] + [f"^{r}" for r in exclude]
    stdin = "".join(f"{line}\n" for line in lines).encode()
    return run_git(args, cwd=repo, input=stdin, timeout_s=_LONG_TIMEOUT_S)


def all_objects(repo: Path) -> list[tuple[bytes, bytes, bytes]]:
    """(40-hex oid, type, body) for every object in ``repo``, in oid order.

    One ``git cat-file --batch-all-objects --batch`` call; its output is
    ``<oid> SP <type> SP <size> LF <body> LF`` per object, so bodies are cut
    by the announced size, never by searching for newlines.
    """
    out = run_git(
        ["cat-file", "--batch-all-objects", "--batch"], cwd=repo, timeout_s=_LONG_TIMEOUT_S
    )
    objects: list[tuple[bytes, bytes, bytes]] = []
    pos = 0
    while pos < len(out):
        eol = out.find(b"\n", pos)
        if eol < 0:
            raise ValueError(f"cat-file: truncated header at byte {pos}")
        header = out[pos:eol].split(b" ")
        if len(header) != 3 or header[1] not in _OBJECT_TYPES or not header[2].isdigit():
            raise ValueError(f"cat-file: bad header {out[pos:eol]!r}")
        size = int(header[2])
        start = eol + 1
        end = start + size
        if end >= len(out) or out[end : end + 1] != b"\n":
            raise ValueError(f"cat-file: object {header[0]!r} body truncated")
        objects.append((header[0], header[1], out[start:end]))
        pos = end + 1
    return objects


def verify_pack(
    pack: bytes, tmp: Path, *, fix_thin_from: Path | None = None
) -> list[VerifyPackEntry]:
    """Index ``pack`` with ``git index-pack`` and parse ``git verify-pack -v``, by offset.

    Work happens in a fresh bare repository under ``tmp``. A thin pack needs
    ``fix_thin_from``: a repository holding the missing bases, reached as an
    alternate, and ``index-pack --fix-thin`` appends them, so the entries
    then describe the completed pack. Any git failure raises ``GitFailed``.
    """
    work = Path(tempfile.mkdtemp(prefix="verify-pack-", dir=tmp))
    _init_bare(work)
    if fix_thin_from is None:
        pack_path = work / "check.pack"
        pack_path.write_bytes(pack)
        index = ["index-pack", "-o", str(work / "check.idx"), str(pack_path)]
        run_git(index, cwd=work, timeout_s=_LONG_TIMEOUT_S)
    else:
        alternates = work / "objects" / "info" / "alternates"
        alternates.write_text(f"{(fix_thin_from / 'objects').resolve()}\n")
        out = run_git(
            ["index-pack", "--stdin", "--fix-thin"], cwd=work, input=pack, timeout_s=_LONG_TIMEOUT_S
        )
        digest = out.split(b"\t")[-1].strip().decode("ascii")
        pack_path = work / "objects" / "pack" / f"pack-{digest}.pack"
    listing = run_git(
        ["verify-pack", "-v", str(pack_path.with_suffix(".idx"))],
        cwd=work,
        timeout_s=_LONG_TIMEOUT_S,
    )
    return _parse_verify_pack(listing, pack_path.read_bytes())


def _parse_verify_pack(listing: bytes, pack: bytes) -> list[VerifyPackEntry]:
    entries: list[VerifyPackEntry] = []
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) not in (5, 7) or parts[1] not in _OBJECT_TYPES:
            continue  # summary lines: "non delta: ...", "chain length = ...", "...: ok"
        offset = int(parts[4])
        delta = len(parts) == 7
        entries.append(
            VerifyPackEntry(
                oid=parts[0],
                type=parts[1],
                size=int(parts[2]),
                size_in_pack=int(parts[3]),
                offset=offset,
                depth=int(parts[5]) if delta else 0,
                base_oid=parts[6] if delta else None,
                pack_type=_PACK_TYPES.get((pack[offset] >> 4) & 7, b"invalid"),
            )
        )
    entries.sort(key=lambda e: e.offset)
    return entries
