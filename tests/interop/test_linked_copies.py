"""A compute trusts a linked local copy only while it is the stored file (seed 004,
"Linked local copies"), through a real `enroute dev` on a ``file://`` store.

The compute's copy of a pushed layer is a hard link to the store's file. With the
dev server stopped, that copy is replaced by another file of the same length with a
flipped byte in its first data chunk (the catalog still records it as linked). On
restart the compute makes the link again (or, failing that, compares inodes), so a
clone and ``git fsck`` succeed: the other file is never read.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from enroute_core.storage.layer import LayerReader
from enroute_core.storage.localcopy import LocalCopy
from enroute_testing.devserver import largest_stored_layer, running_dev
from enroute_testing.gitcli import run_git
from enroute_testing.s3budget import refs_of


@pytest.mark.interop
@pytest.mark.timeout(300)
def test_a_copy_recorded_as_linked_that_is_another_file_is_never_read(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    (src / "big.bin").write_bytes(random.Random(5).randbytes(1_500_000))  # a stored layer
    (src / "a.txt").write_text("a\n")
    run_git(["add", "."], cwd=src)
    run_git(["commit", "-q", "-m", "one"], cwd=src)
    root = tmp_path / "dev"
    root.mkdir()
    with running_dev(root) as dev:
        run_git(["push", "-q", f"{dev.url}/linked.git", "main"], cwd=src, timeout_s=120)
        first = tmp_path / "first"
        run_git(["clone", "-q", "--mirror", f"{dev.url}/linked.git", str(first)], cwd=tmp_path)
    stored = largest_stored_layer(root)
    inode = stored.stat().st_ino
    copies = [
        p
        for p in (root / "data" / "compute").rglob("*")
        if p.is_file() and p.stat().st_ino == inode and p != stored
    ]
    assert len(copies) == 1, copies  # the compute's linked copy
    copy = copies[0]
    size = stored.stat().st_size
    with LocalCopy.open_linked(str(stored), size) as c:
        offset = LayerReader.open(c).record(0).offset  # the first entry, in chunk 0
    other = bytearray(stored.read_bytes())
    other[offset + 8] ^= 0xFF
    os.unlink(copy)
    copy.write_bytes(bytes(other))  # same name, same length: another inode
    assert copy.stat().st_ino != inode

    with running_dev(root) as dev:
        clone = tmp_path / "clone"
        shutil.rmtree(clone, ignore_errors=True)
        run_git(["clone", "-q", "--mirror", f"{dev.url}/linked.git", str(clone)], cwd=tmp_path)
        run_git(["fsck", "--no-progress"], cwd=clone)
        assert refs_of(clone) == refs_of(first)
    assert copy.stat().st_ino == inode  # linked again on open
