"""Large pushes through a real `enroute dev`: memory stays within the seed's budgets.

Issue "Push and clone", acceptance: "A push of a repository of 100,000 objects
and one of a 200 MiB pack both succeed in dev mode with the server's peak RSS
within the budgets." Seed 004, "Pages and memory": "a 128 MiB cache per
concurrent ingest"; docs/ingest.md derives the compute's budget from it:

    peak RSS of the compute <= idle RSS + 128 MiB (ingest cache)
                               + 1 KiB per pushed object (index words, layer table)
                               + 2 x the largest object (one inflated, one entry copy)
                               + 64 MiB (interpreter, gRPC buffers, views, slack)

The pack is spooled to scratch and the layer built in scratch, so nothing in
the budget grows with the pack's bytes. Each push is checked by a fresh bare
clone: ``git fsck --strict`` and the refs equal to the source's.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import run_git

pytestmark = [pytest.mark.interop, pytest.mark.slow]

MiB = 1024 * 1024
INGEST_CACHE_BYTES = 128 * MiB  # seed 004, "Pages and memory"
PER_OBJECT_BYTES = 1024
SLACK_BYTES = 64 * MiB
PUSH_TIMEOUT_S = 240.0


@dataclass
class Dev:
    url: str
    pid: int
    root: Path

    def child_pid(self, role: str) -> int:
        """The pid of the `python -m enroute_<role>` child of the dev process."""
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if f"enroute_{role}".encode() in cmdline:
                    return int(pid)
        raise AssertionError(f"no enroute_{role} child of {self.pid}")


def status_bytes(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field (VmHWM: peak RSS; VmRSS: now) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{field} not in /proc/{pid}/status")


@pytest.fixture
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    """A fresh `enroute dev` per test, so the compute's VmHWM is that test's push."""
    root = tmp_path_factory.mktemp("push-memory")
    with running_dev(root) as server:
        yield Dev(server.url, server.pid, root)


# -- repositories made fast with git fast-import --------------------------------------------


def _fast_import(path: Path, stream: bytes, *config: str) -> Path:
    path.mkdir(parents=True)
    run_git(["init", "-q", "--bare", str(path)], cwd=path.parent)
    args = [arg for c in config for arg in ("-c", c)]
    run_git([*args, "fast-import", "--quiet", "--done"], cwd=path, input=stream, timeout_s=300)
    return path


def many_objects_repo(path: Path, commits: int, files: int, seed: int = 1) -> Path:
    """``commits`` commits each adding a directory of ``files`` small similar text files.

    Each commit brings files + 3 trees (root, group, its directory) + itself, so
    1,000 commits of 96 files are 100,000 objects; the files share words, so git
    finds deltas among them.
    """
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(3, 8))) for _ in range(512)]
    out = []
    for c in range(commits):
        msg = b"commit %d\n" % c
        out.append(
            b"commit refs/heads/main\ncommitter T <t@example.com> %d +0000\ndata %d\n%s"
            % (1_700_000_000 + c, len(msg), msg)
        )
        for f in range(files):
            line = b" ".join(rng.choice(words) for _ in range(12))
            body = b"file %d/%d\n%s\n" % (c, f, line)
            out.append(
                b"M 100644 inline g%03d/d%05d/f%03d.txt\ndata %d\n%s\n"
                % (c // 32, c, f, len(body), body)
            )
    out.append(b"done\n")
    return _fast_import(path, b"".join(out))


def big_pack_repo(path: Path, big: int, big_bytes: int, small: int, small_bytes: int) -> Path:
    """One commit of random (incompressible) files: ``big`` large ones and ``small`` small ones.

    Stored with zlib level 0 and no delta search (big files), so git packs it
    fast and reuses the entries as they are when it pushes.
    """
    out = [b"commit refs/heads/main\ncommitter T <t@example.com> 1700000000 +0000\ndata 4\nbig\n"]
    for i in range(big):
        data = os.urandom(big_bytes)
        out.append(b"M 100644 inline big/b%d.bin\ndata %d\n%s\n" % (i, len(data), data))
    for i in range(small):
        data = os.urandom(small_bytes)
        out.append(
            b"M 100644 inline small/s%03d/f%d.bin\ndata %d\n%s\n" % (i // 100, i, len(data), data)
        )
    out.append(b"done\n")
    return _fast_import(
        path, b"".join(out), "core.bigFileThreshold=1m", "core.compression=0", "pack.compression=0"
    )


# -- helpers ---------------------------------------------------------------------------------


def _refs(repo: Path) -> bytes:
    return run_git(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=repo)


def _push(dev: Dev, source: Path, name: str) -> int:
    """Push every branch; return the compute's peak RSS (before any clone adds its own)."""
    url = f"{dev.url}/{name}.git"
    run_git(
        ["-c", "core.bigFileThreshold=1m", "push", "-q", url, "refs/heads/*:refs/heads/*"],
        cwd=source,
        timeout_s=PUSH_TIMEOUT_S,
    )
    return status_bytes(dev.child_pid("compute"), "VmHWM")


def _check_clone(dev: Dev, source: Path, name: str, work: Path) -> None:
    url = f"{dev.url}/{name}.git"
    clone = work / f"{name}-clone.git"
    run_git(["clone", "-q", "--bare", url, str(clone)], cwd=work, timeout_s=PUSH_TIMEOUT_S)
    run_git(["fsck", "--strict", "--no-dangling"], cwd=clone, timeout_s=PUSH_TIMEOUT_S)
    assert _refs(clone) == _refs(source)


def _budget(idle_rss: int, objects: int, largest_object: int) -> int:
    return (
        idle_rss
        + INGEST_CACHE_BYTES
        + PER_OBJECT_BYTES * objects
        + 2 * largest_object
        + (SLACK_BYTES)
    )


def _object_count(repo: Path) -> int:
    counts = run_git(["count-objects", "-v"], cwd=repo).decode()
    return int(re.search(r"in-pack: (\d+)", counts).group(1))  # type: ignore[union-attr]


# -- the tests -------------------------------------------------------------------------------


@pytest.fixture
def idle_rss(dev: Dev) -> int:
    """The compute's resident size before any push (what the budget adds to)."""
    return status_bytes(dev.child_pid("compute"), "VmRSS")


def test_push_of_100k_objects_stays_in_budget(dev: Dev, idle_rss: int, tmp_path: Path) -> None:
    source = many_objects_repo(tmp_path / "many.git", commits=1000, files=96)
    objects = _object_count(source)
    assert objects == 100_000
    peak = _push(dev, source, "many")
    budget = _budget(idle_rss, objects, largest_object=1 * MiB)
    print(f"100k objects: idle {idle_rss / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB")
    assert peak <= budget, f"compute peak RSS {peak / MiB:.0f} MiB > budget {budget / MiB:.0f}"
    _check_clone(dev, source, "many", tmp_path)


def test_push_of_a_200_mib_pack_stays_in_budget(dev: Dev, idle_rss: int, tmp_path: Path) -> None:
    # Objects stay under 4 MiB, the default gRPC message bound the fetch relays through.
    big_bytes = 3 * MiB + MiB // 2
    source = big_pack_repo(tmp_path / "big.git", 48, big_bytes, 2000, 16 * 1024)
    pack_bytes = sum(p.stat().st_size for p in (source / "objects" / "pack").glob("*.pack"))
    assert pack_bytes >= 190 * MiB
    peak = _push(dev, source, "big")
    budget = _budget(idle_rss, _object_count(source), largest_object=big_bytes)
    print(f"{pack_bytes / MiB:.0f} MiB pack: idle {idle_rss / MiB:.0f} MiB, peak {peak / MiB:.0f}")
    assert peak <= budget, f"compute peak RSS {peak / MiB:.0f} MiB > budget {budget / MiB:.0f}"
    _check_clone(dev, source, "big", tmp_path)
