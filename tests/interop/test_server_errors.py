"""A server-side failure is answered with the error table's code and logged once, with
the request id (issue 18, "Errors and logs": no 500 without a log line).

A stored layer's data region is damaged in the ``file://`` store of a real
`enroute dev` (the compute's copy is a hard link to it: seed 004, "Linked local
copies"); a clone then reads a chunk that fails its SHA-256 (``corrupt_data``,
5xx in the table). The client must fail, and the compute's log must name the
failure once, with the id gitproto gave the request.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from enroute_core.storage.layer import LayerReader
from enroute_core.storage.localcopy import LocalCopy
from enroute_testing.devserver import largest_stored_layer, running_dev
from enroute_testing.gitcli import GitFailed, run_git

FAILED_LINE = re.compile(r"request ([0-9a-f]*) failed: corrupt_data")


@pytest.mark.interop
@pytest.mark.timeout(300)
def test_a_corrupt_chunk_fails_the_clone_and_is_logged_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    run_git(["init", "-q", "-b", "main"], cwd=src)
    (src / "big.bin").write_bytes(random.Random(18).randbytes(1_500_000))  # a stored layer
    (src / "a.txt").write_text("a\n")
    run_git(["add", "."], cwd=src)
    run_git(["commit", "-q", "-m", "one"], cwd=src)
    root = tmp_path / "dev"
    root.mkdir()
    with running_dev(root) as dev:
        run_git(["push", "-q", f"{dev.url}/broken.git", "main"], cwd=src, timeout_s=120)
    layer = largest_stored_layer(root)
    size = layer.stat().st_size
    with LocalCopy.open_linked(str(layer), size) as copy:
        reader = LayerReader.open(copy)
        offset = reader.record(0).offset  # the first entry: a commit, in chunk 0
        assert reader.data_end > 1024 * 1024  # chunk 0 is data only, not metadata
    with open(layer, "r+b") as f:  # in place: the compute's linked copy is this inode
        f.seek(offset + 8)
        byte = f.read(1)
        f.seek(offset + 8)
        f.write(bytes([byte[0] ^ 0xFF]))
    with running_dev(root) as dev, pytest.raises(GitFailed):
        run_git(["clone", "-q", f"{dev.url}/broken.git", str(tmp_path / "clone")],
                cwd=tmp_path, timeout_s=120)  # fmt: skip
    log = (root / "data" / "logs" / "compute.log").read_text(errors="replace")
    found = FAILED_LINE.findall(log)
    assert len(found) == 1, log[-3000:]
    assert found[0], "the log line names no request id"
