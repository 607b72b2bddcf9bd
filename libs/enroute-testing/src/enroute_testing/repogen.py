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

Profiles (``PROFILES``, ``profile``) shape a spec like a large real project:
hundreds of thousands of objects, a directory of thousands of entries, a few
files edited so often that ``git repack --depth=50`` makes chains of depth 50,
blobs of tens of MiB, octopus merges, about a thousand tags, annotated tags on
a blob and on a tree, and (``quirks``) a legacy prefix of objects that old
converters wrote and that ``git fsck`` flags (badTimezone, zeroPaddedDate,
missingSpaceBeforeDate, missingEmail, badEmail, zeroPaddedFilemode). fast-import
refuses to write such objects, so they are computed here and written with
``git hash-object --literally`` before the stream starts; the stream's first
commit names the legacy tip by id. The stream goes to fast-import in pieces, so
a history of several hundred MiB is never held whole in memory.
``cached_repo`` keeps a generated repository under a directory keyed by the
spec, so benchmarks generate a profile once.

The helpers ``pack_objects``, ``all_objects`` and ``verify_pack`` wrap
``git pack-objects``, ``git cat-file --batch`` and ``git index-pack`` +
``git verify-pack -v`` (gitformat-pack(5)) for interop tests and benchmarks.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from enroute_testing.gitcli import GitFailed, default_home, git_env, run_git

__all__ = [
    "PROFILES",
    "QUIRK_IDS",
    "GeneratedRepo",
    "RepoSpec",
    "VerifyPackEntry",
    "all_objects",
    "cached_repo",
    "fast_import_stream",
    "generate_repo",
    "list_refs",
    "pack_objects",
    "profile",
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
_GENERATE_TIMEOUT_S = 7200.0  # a large profile: fast-import plus a full repack on 2 cores
_PACK_OBJECTS_OPTIONS = frozenset(("--all", "--reflog", "--indexed-objects"))
_FLUSH_BYTES = 8 << 20  # stream pieces handed to fast-import

MiB = 1 << 20
_WIDE_DIR = b"i18n"  # vocabulary words never hold a digit, so no generated path lands here
_WIDE_EXT = b"po"  # and no text file has this extension
_HOT_EXT = b"list"
_BIG_DIR = b"assets"
_BIG_KINDS = (b"random", b"text", b"nibbles")  # incompressible, text, 4 bits per byte
_BIG_CHANGES = 1  # each big blob is patched this many times

# The legacy prefix (``RepoSpec.quirks``): one commit per quirk, oldest first, each with
# the author line old tools wrote. git fsck reports the id in the comment (fsck.c,
# fsck_ident and fsck_tree); receive-pack accepts them unless receive.fsckObjects is on.
_LEGACY_TIME_S = 1_113_690_036  # April 2005
_LEGACY_WHO = b"Pat Legacy <pat@example.com> %d +0000"
_LEGACY_AUTHORS: tuple[tuple[str, bytes], ...] = (
    ("badTimezone", b"Pat Legacy <pat@example.com> %d --700"),
    ("badTimezone", b"Pat Legacy <pat@example.com> %d +051800"),
    ("zeroPaddedDate", b"Pat Legacy <pat@example.com> 000%d +0000"),
    ("missingSpaceBeforeDate", b"Pat Legacy <pat@example.com>%d +0000"),
    ("missingEmail", b"Pat Legacy %d +0000"),
    ("badEmail", b"Pat Legacy <pat<at>example.com> %d +0000"),
)
# Every git fsck message id the legacy prefix makes git report.
QUIRK_IDS = frozenset([quirk for quirk, _ in _LEGACY_AUTHORS] + ["zeroPaddedFilemode"])


@dataclass(frozen=True, slots=True)
class RepoSpec:
    """What to generate; every knob is deterministic given ``seed``."""

    seed: int = 0
    commits: int = 50  # all commits, merges included
    branches: int = 3  # extra branches besides main
    merge_every: int = 10  # a merge on main after every N main commits (0 = none)
    files: int = 40  # initial text files
    tree_depth: int = 4  # max directory depth
    new_dir_rate: float = 0.3  # chance that a new file opens a new directory
    rename_rate: float = 0.05  # fraction of commits that rename a path
    delete_rate: float = 0.03
    binary_files: int = 3  # random (incompressible) binary files
    large_file_bytes: int = 0  # if >0, one large file of this size that changes a few times
    annotated_tags: int = 3
    lightweight_tags: int = 1
    file_bytes: int = 2000  # typical text file size; scales all contents
    executable_rate: float = 0.05
    symlinks: int = 1
    edits_max: int = 3  # most text files one ordinary commit edits (at least one)
    # Shapes of large real projects (``PROFILES``); the defaults leave them out.
    wide_files: int = 0  # files of one flat directory: a tree of this many entries
    wide_edit_rate: float = 0.0  # fraction of commits that edit one file of that directory
    hot_files: int = 0  # change logs edited far more often than the rest: deep delta chains
    hot_edit_rate: float = 0.0  # fraction of main's commits that log a line in one hot file
    big_blob_bytes: tuple[int, ...] = ()  # big files, kinds in turn from _BIG_KINDS
    octopus_width: int = 2  # most branches one octopus merge takes (2 + main: 3 parents)
    blob_tags: int = 0  # annotated tags on a blob no tree names (a maintainer's public key)
    tree_tags: int = 0  # annotated tags on a tree no commit names
    quirks: bool = False  # a legacy prefix of objects git fsck flags (QUIRK_IDS)
    repack_depth: int = 0  # if >0, `git repack -adf --depth=N` after the import

    def __post_init__(self) -> None:
        counts = {
            "commits": self.commits,
            "edits_max": self.edits_max,
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
            "wide_files": self.wide_files,
            "hot_files": self.hot_files,
            "blob_tags": self.blob_tags,
            "tree_tags": self.tree_tags,
            "repack_depth": self.repack_depth,
        }
        if any(size < 1 for size in self.big_blob_bytes):
            raise ValueError(f"RepoSpec.big_blob_bytes must be >= 1, got {self.big_blob_bytes}")
        if self.octopus_width < 2:
            raise ValueError(f"RepoSpec.octopus_width must be >= 2, got {self.octopus_width}")
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"RepoSpec.{name} must be >= 0, got {value}")
        rates = {
            "rename_rate": self.rename_rate,
            "delete_rate": self.delete_rate,
            "executable_rate": self.executable_rate,
            "new_dir_rate": self.new_dir_rate,
            "wide_edit_rate": self.wide_edit_rate,
            "hot_edit_rate": self.hot_edit_rate,
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


def _object_id(kind: bytes, body: bytes) -> bytes:
    """The 40-hex id git gives ``body`` as an object of ``kind`` (gitformat-loose(5))."""
    return hashlib.sha1(b"%s %d\0" % (kind, len(body)) + body).hexdigest().encode()


def _tree(entries: Sequence[tuple[bytes, bytes, bytes]]) -> bytes:
    """A tree body from (mode, name, 40-hex id) entries already in git's order.

    The mode is written as given, so ``b"040000"`` makes a zero-padded entry."""
    return b"".join(
        b"%s %s\0%s" % (mode, name, bytes.fromhex(oid.decode())) for mode, name, oid in entries
    )


_NIBBLES = bytes(0x30 | (b & 0x0F) for b in range(256))


@dataclass(frozen=True, slots=True)
class _Loose:
    """An object written with ``git hash-object`` before the stream (fast-import cannot)."""

    kind: bytes
    body: bytes
    literally: bool  # malformed on purpose: ``--literally`` skips hash-object's own checks

    @property
    def oid(self) -> bytes:
        return _object_id(self.kind, self.body)


def _prelude(spec: RepoSpec) -> tuple[list[_Loose], bytes | None, list[bytes]]:
    """Objects written before the stream: the legacy prefix (``spec.quirks``) and the trees
    of ``spec.tree_tags``. Returns them in write order, the legacy tip commit (or None) and
    the tagged trees' ids. Their own seeded generator leaves the stream's untouched."""
    rng = random.Random(f"{spec.seed}-prelude")
    objects: list[_Loose] = []

    def add(kind: bytes, body: bytes, literally: bool = False) -> bytes:
        objects.append(_Loose(kind, body, literally))
        return objects[-1].oid

    tip: bytes | None = None
    if spec.quirks:
        history = add(b"blob", b"Changes before the import were kept in CVS.\n")
        docs = add(b"tree", _tree([(_MODE_FILE, b"HISTORY", history)]))
        notes = add(b"blob", b"Imported from CVS by an old converter.\n")
        # "040000": the zero-padded mode old git wrote for a directory (zeroPaddedFilemode).
        legacy = add(
            b"tree", _tree([(_MODE_FILE, b"NOTES", notes), (b"040000", b"docs", docs)]), True
        )
        for n, (quirk, author) in enumerate(_LEGACY_AUTHORS):
            when = _LEGACY_TIME_S + n * 86_400
            readme = add(b"blob", b"Legacy import, revision %d\n" % (n + 1))
            root = add(
                b"tree", _tree([(_MODE_FILE, b"README", readme), (b"40000", b"legacy", legacy)])
            )
            parent = b"parent %s\n" % tip if tip else b""
            body = b"tree %s\n%sauthor %s\ncommitter %s\n\nLegacy revision %d (%s)\n" % (
                root,
                parent,
                author % when,
                _LEGACY_WHO % when,
                n + 1,
                quirk.encode(),
            )
            tip = add(b"commit", body, True)
    trees = []
    for j in range(spec.tree_tags):
        readme = add(b"blob", b"Source tree snapshot %d, kept for reference.\n" % (j + 1))
        key = add(b"blob", b"".join(rng.randbytes(48).hex().encode() + b"\n" for _ in range(20)))
        trees.append(
            add(b"tree", _tree([(_MODE_FILE, b"README", readme), (_MODE_FILE, b"key.asc", key)]))
        )
    return objects, tip, trees


class _StreamBuilder:
    def __init__(self, spec: RepoSpec, sink: Callable[[bytes], object] | None = None) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.vocab = _vocabulary(self.rng)
        self.out: list[bytes] = []
        self.sink = sink  # None: keep the whole stream in ``out``
        self.pending = 0  # content bytes in ``out`` since the last flush
        self.prelude, self.legacy_tip, self.tagged_trees = _prelude(spec)
        self.wide: list[bytes] = []
        self.hot: list[bytes] = []
        self.big: list[bytes] = []  # big blob paths; the kind is _BIG_KINDS[index % 3]
        self.big_turn = 0
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
        # Only a spec that asks for a shape draws from the generator for it, so the
        # streams of specs without these shapes stay as they were.
        self.wide_credit = _Credit(spec.wide_edit_rate, rng.random()) if spec.wide_files else None
        self.hot_credit = _Credit(spec.hot_edit_rate, rng.random()) if spec.hot_files else None
        changes = min(1.0, _BIG_CHANGES * len(spec.big_blob_bytes) / spec.commits)
        self.big_credit = _Credit(changes, rng.random()) if spec.big_blob_bytes else None

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

    def _big_blob(self, kind: bytes, size: int) -> bytes:
        if kind == b"text":
            return self._large(size)
        data = self.rng.randbytes(size)
        return data.translate(_NIBBLES) if kind == b"nibbles" else data

    def _edit_big(self, kind: bytes, data: bytes) -> bytes:
        """A few patches, so the new version deltas well against the old one."""
        if kind == b"text":
            return self._edit_large(data)
        for _ in range(3):
            patch = self._big_blob(kind, min(len(data), 4096))
            at = self.rng.randrange(len(data) - len(patch) + 1)
            data = data[:at] + patch + data[at + len(patch) :]
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
        if rng.random() < self.spec.new_dir_rate:
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
        self.pending += len(data)

    def _flush(self) -> None:
        if self.sink is not None and self.out:
            self.sink(b"".join(self.out))
            self.out.clear()
            self.pending = 0

    def _commit(
        self, br: _Branch, parents: Sequence[int | bytes], ops: list[bytes], subject: bytes
    ) -> None:
        """Emit a commit; a parent is a mark, or (the legacy tip) a 40-hex id."""
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
            ref = [p if isinstance(p, bytes) else b":%d" % p for p in parents]
            head.append(b"from %s\n" % ref[0])
            head.extend(b"merge %s\n" % p for p in ref[1:])
        self.out.extend(head)
        self.out.extend(ops)
        self.out.append(b"\n")
        if self.pending >= _FLUSH_BYTES:
            self._flush()
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
        self._shaped_root(ops)
        parents = (self.legacy_tip,) if self.legacy_tip else ()
        self._commit(main, parents, ops, b"Initial import")

    def _shaped_root(self, ops: list[bytes]) -> None:
        """The root commit's part of the large-project shapes (none for a plain spec)."""
        spec, rng, main = self.spec, self.rng, self.main
        size = max(1, spec.file_bytes // 4)
        for i in range(spec.wide_files):
            path = b"%s/%s-%04d.%s" % (_WIDE_DIR, rng.choice(self.vocab), i, _WIDE_EXT)
            self.wide.append(path)
            self._set(main, ops, path, _MODE_FILE, self._text(size))
        for i in range(spec.hot_files):
            path = b"NEWS-%d.%s" % (i + 1, _HOT_EXT)
            self.hot.append(path)
            self._set(main, ops, path, _MODE_FILE, self._text(spec.file_bytes * 6))
        for i, size in enumerate(spec.big_blob_bytes):
            kind = _BIG_KINDS[i % len(_BIG_KINDS)]
            path = b"%s/%s-%d.bin" % (_BIG_DIR, kind, i + 1)
            self.big.append(path)
            self._set(main, ops, path, _MODE_FILE, self._big_blob(kind, size))

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
        for _ in range(rng.randint(1, spec.edits_max)):
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
        words.extend(self._shaped_changes(br, ops, busy))
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

    def _shaped_changes(self, br: _Branch, ops: list[bytes], busy: set[bytes]) -> list[bytes]:
        """Edits of the wide directory, the hot files (on main only) and the big blobs.

        A hot file is a change log: each edit puts a line on top, as NEWS files grow,
        and rewrites one older line. Sorted by size (pack-objects' order), its versions
        are then in history order; each is nearest to the next (the rewritten lines add
        up), so the deltas form one line and ``--depth=50`` chains fill up. Random edits
        of small files stop short of 50: the delta size cap shrinks with depth, and a
        file that only grows at the top deltas every version against the newest."""
        words: list[bytes] = []
        if self.wide_credit is not None and self.wide_credit.due():
            path = self._pick(self.wide, busy, br)
            if path is not None:
                self._set(br, ops, path, _MODE_FILE, self._edit_text(br.state[path][1]))
                busy.add(path)
                words.append(b"edit " + path)
        if self.hot_credit is not None and br is self.main and self.hot_credit.due():
            path = self.hot[self.rng.randrange(len(self.hot))]
            lines = br.state[path][1].splitlines(keepends=True)
            lines[self.rng.randrange(len(lines))] = self._line()
            self._set(br, ops, path, _MODE_FILE, b"".join([b"* " + self._line(), *lines]))
            busy.add(path)
            words.append(b"log " + path)
        if self.big_credit is not None and self.big_credit.due():
            index = self.big_turn % len(self.big)
            self.big_turn += 1
            path = self.big[index]
            data = self._edit_big(_BIG_KINDS[index % len(_BIG_KINDS)], br.state[path][1])
            self._set(br, ops, path, _MODE_FILE, data)
            busy.add(path)
            words.append(b"update " + path)
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
        """The whole stream, or (with a sink) b"" after handing it to the sink in pieces."""
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
                    width = min(len(ready), spec.octopus_width)
                    sources = rng.sample(ready, rng.randint(2, width) if width > 2 else 2)
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
        self._object_tags()
        self.out.append(b"done\n")
        if self.sink is None:
            return b"".join(self.out)
        self._flush()
        return b""

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

    def _object_tags(self) -> None:
        """Annotated tags on a blob no tree names (git.git's junio-gpg-pub is one) and on
        the prelude's trees (linux's v2.6.11-tree is one)."""
        name, email, tz = _TAGGER
        targets = []
        for j in range(self.spec.blob_tags):
            self.mark += 1
            armor = b"".join(self.rng.randbytes(48).hex().encode() + b"\n" for _ in range(30))
            key = b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n%s-----END PGP PUBLIC KEY BLOCK-----\n"
            self.out.append(b"blob\nmark :%d\n%s" % (self.mark, _data(key % armor)))
            targets.append((b"maintainer-pubkey-%d" % (j + 1), b":%d" % self.mark))
        targets += [(b"snapshot-tree-%d" % (j + 1), t) for j, t in enumerate(self.tagged_trees)]
        for tag, target in targets:
            when = BASE_TIME_S + self.clock * COMMIT_STEP_S
            self.clock += 1
            message = b"%s\n" % tag
            self.out.append(
                b"tag %s\nfrom %s\ntagger %s <%s> %d %s\n%s"
                % (tag, target, name, email, when, tz, _data(message))
            )


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
    """Create a bare repository at ``path`` (absent or empty) holding ``spec``'s history.

    The prelude objects go in first, one ``git hash-object`` each (their ids are checked
    against the ones the stream names); the stream then goes to one ``git fast-import``
    in pieces; with ``spec.repack_depth`` one ``git repack -adf`` follows."""
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty")
    _init_bare(path)
    argv = ["git", "fast-import", "--quiet", "--date-format=raw", "--done"]
    argv.append(f"--active-branches={max(5, spec.branches + 1)}")  # no tree reloads
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv,
            cwd=path,
            env=git_env(default_home()),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        assert proc.stdin is not None
        try:
            builder = _StreamBuilder(spec, proc.stdin.write)
            _write_prelude(path, builder.prelude)
            builder.build()
            proc.stdin.close()
        except BrokenPipeError:
            pass  # fast-import died: its status and stderr say why, below
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        status = proc.wait(timeout=_GENERATE_TIMEOUT_S)
        if status != 0:
            err.seek(0)
            raise GitFailed(argv, status, err.read()[-64 * 1024 :])
    if spec.repack_depth:
        # No bitmap: the repository plays a client's, whose pushes count objects by walking.
        repack = ["-c", "repack.writeBitmaps=false", "repack", "-a", "-d", "-f", "-q"]
        repack += [f"--depth={spec.repack_depth}", "--window=10"]
        run_git(repack, cwd=path, timeout_s=_GENERATE_TIMEOUT_S)
    return GeneratedRepo(path=path, spec=spec, refs=list_refs(path), head=b"refs/heads/main")


def _write_prelude(repo: Path, objects: Sequence[_Loose]) -> None:
    for obj in objects:
        args = ["hash-object", "-w", "-t", obj.kind.decode(), "--stdin"]
        if obj.literally:
            args.append("--literally")
        written = run_git(args, cwd=repo, input=obj.body).strip()
        if written != obj.oid:
            raise AssertionError(f"prelude object {obj.oid!r} was written as {written!r}")


# --- profiles -------------------------------------------------------------------------------

# The shape of a large real project's history (the C project: about 410,000
# objects, 1,000 tags, a 307 MiB pack) and a scaled-down copy CI affords in seconds.
PROFILES: dict[str, RepoSpec] = {
    "large": RepoSpec(
        commits=80_000,
        branches=40,
        merge_every=8,
        files=5_000,
        tree_depth=1,
        new_dir_rate=0.05,
        rename_rate=0.02,
        delete_rate=0.01,
        binary_files=20,
        annotated_tags=600,
        lightweight_tags=400,
        file_bytes=2_400,
        executable_rate=0.03,
        symlinks=10,
        edits_max=2,
        wide_files=3_200,
        wide_edit_rate=0.02,
        hot_files=4,
        hot_edit_rate=0.1,
        big_blob_bytes=(64 * MiB, 96 * MiB, 64 * MiB),
        octopus_width=6,
        blob_tags=2,
        tree_tags=2,
        quirks=True,
        repack_depth=50,
    ),
    "large-ci": RepoSpec(
        commits=1_200,
        branches=6,
        merge_every=6,
        files=200,
        rename_rate=0.05,
        delete_rate=0.02,
        binary_files=3,
        annotated_tags=12,
        lightweight_tags=8,
        file_bytes=1_500,
        wide_files=3_000,
        wide_edit_rate=0.02,
        hot_files=1,
        hot_edit_rate=0.25,
        big_blob_bytes=(1 * MiB, 2 * MiB, 1 * MiB),
        octopus_width=4,
        blob_tags=1,
        tree_tags=1,
        quirks=True,
        repack_depth=50,
    ),
}


def profile(name: str, *, seed: int = 0, quirks: bool | None = None) -> RepoSpec:
    """``PROFILES[name]`` with ``seed`` and, unless None, ``quirks`` replaced."""
    spec = replace(PROFILES[name], seed=seed)
    return spec if quirks is None else replace(spec, quirks=quirks)


_CACHE_FORMAT = 1  # bump when the generator's output for a spec changes
_CACHE_READY = "generated.json"


def cached_repo(spec: RepoSpec, cache: Path, label: str = "repo") -> tuple[GeneratedRepo, float]:
    """The repository of ``spec`` under ``cache``, generated on the first call only.

    The directory is named by ``label``, the seed, quirks and a digest of the whole
    spec, so another spec never reuses it; it appears (renamed into place) only once
    complete. Returns the repository and the seconds its generation took then."""
    digest = hashlib.sha256(f"{_CACHE_FORMAT} {spec!r}".encode()).hexdigest()[:12]
    quirks = "quirks" if spec.quirks else "plain"
    final = cache / f"{label}-seed{spec.seed}-{quirks}-{digest}"
    ready = final / _CACHE_READY
    if not ready.exists():
        cache.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=cache))
        try:
            start = time.perf_counter()
            generate_repo(work / "repo.git", spec)
            took = time.perf_counter() - start
            (work / _CACHE_READY).write_text(json.dumps({"spec": repr(spec), "seconds": took}))
            os.rename(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    seconds = float(json.loads(ready.read_text())["seconds"])
    path = final / "repo.git"
    return GeneratedRepo(path, spec, list_refs(path), b"refs/heads/main"), seconds


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
