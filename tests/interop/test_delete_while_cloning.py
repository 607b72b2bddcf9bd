"""Delete and at once re-create a name while a clone of the old incarnation streams.

Issue acceptance, seed 001 "Deletion" and "Commands prepared against a deleted
incarnation": "the clone either completes with the old contents or fails cleanly,
and a later clone sees only the new incarnation; no object of E is ever served from
E + 1." The real git client clones through a loopback proxy that throttles what it
reads, so the pack of E is still streaming when the delete lands; the delete, the
create and the push of E + 1 go to the server directly.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from enroute_testing.gitcli import GitFailed, default_home, git_env, run_git
from enroute_testing.waiting import wait_until

pytestmark = pytest.mark.interop

BLOB_BYTES = 1024 * 1024
BLOBS = 6
RATE_BYTES_PER_S = 1_000_000
STREAMING_BYTES = 256 * 1024
CLONE_TIMEOUT_S = 90.0


class ThrottledProxy:
    """Forwards loopback TCP to ``target``; answers reach the client at a bounded rate."""

    def __init__(self, target: str, rate_bytes_per_s: int) -> None:
        self.target_host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.rate = rate_bytes_per_s
        self.downstream_bytes = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict[str, Any] = {}

        async def start() -> None:
            box["server"] = await asyncio.start_server(self._accept, "127.0.0.1", 0)
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.server: asyncio.Server = box["server"]
        self.port = self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, slow: bool) -> None:
            try:
                while data := await src.read(16 * 1024):
                    dst.write(data)
                    await dst.drain()
                    if slow:
                        self.downstream_bytes += len(data)
                        await asyncio.sleep(len(data) / self.rate)
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def api(url: str, method: str, path: str, body: object = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/api/v1{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def make_repo(path: Path, seed: int, files: dict[str, bytes]) -> str:
    """A one-commit repository at ``path``; its commit id."""
    path.mkdir()
    run_git(["init", "--quiet", "--initial-branch", "main"], cwd=path)
    for name, data in files.items():
        (path / name).write_bytes(data)
    run_git(["add", "--all"], cwd=path)
    run_git(["commit", "--quiet", "--message", f"seed {seed}"], cwd=path)
    return run_git(["rev-parse", "HEAD"], cwd=path).decode().strip()


def objects(repo: Path) -> set[str]:
    listed = run_git(["rev-list", "--objects", "--all"], cwd=repo).decode()
    return {line.split()[0] for line in listed.splitlines() if line}


def test_delete_and_recreate_while_a_clone_of_the_old_incarnation_streams(
    enroute_url: str, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    name = f"lifecycle/streaming-{time.monotonic_ns()}"
    url = f"{enroute_url}/{name}.git"
    api(enroute_url, "POST", "/repos", {"name": name})
    old_files = {f"blob{i}.bin": rng.randbytes(BLOB_BYTES) for i in range(BLOBS)}
    old_tip = make_repo(tmp_path / "old", seed, old_files)
    run_git(["push", "--quiet", url, "main"], cwd=tmp_path / "old")
    old_objects = objects(tmp_path / "old")
    new_tip = make_repo(tmp_path / "new", seed + 1, {"only-new.txt": b"the new incarnation\n"})
    new_objects = objects(tmp_path / "new")
    assert not old_objects & new_objects

    proxy = ThrottledProxy(enroute_url.removeprefix("http://"), RATE_BYTES_PER_S)
    clone_dir = tmp_path / "clone-old"
    try:
        clone = subprocess.Popen(
            ["git", "clone", "--quiet", f"http://127.0.0.1:{proxy.port}/{name}.git", clone_dir],
            cwd=tmp_path,
            env=git_env(default_home()),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        def streaming() -> bool:
            assert clone.poll() is None, clone.communicate()
            return proxy.downstream_bytes >= STREAMING_BYTES

        wait_until(streaming, 30, "the clone streams", poll_s=0.01)
        api(enroute_url, "DELETE", f"/repos/{name}")
        assert clone.poll() is None, "the clone ended before the delete landed: proves nothing"
        created = api(enroute_url, "POST", "/repos", {"name": name})
        run_git(["push", "--quiet", url, "main"], cwd=tmp_path / "new")
        streamed_at_push = proxy.downstream_bytes
        _, stderr = clone.communicate(timeout=CLONE_TIMEOUT_S)
    finally:
        if clone.poll() is None:
            clone.kill()
            clone.wait()
        proxy.close()

    print(f"clone exit {clone.returncode}; streamed {proxy.downstream_bytes} bytes, "
          f"{streamed_at_push} when E + 1 was pushed; stderr: {stderr[-500:]!r}")  # fmt: skip
    if clone.returncode == 0:
        # Completed: exactly the old contents, nothing of E + 1.
        assert run_git(["rev-parse", "HEAD"], cwd=clone_dir).decode().strip() == old_tip
        run_git(["fsck", "--strict", "--no-progress"], cwd=clone_dir)
        for file, data in old_files.items():
            assert (clone_dir / file).read_bytes() == data
        assert objects(clone_dir) == old_objects
    else:
        # Failed cleanly: an error, no half-made repository left behind.
        assert stderr.strip(), "the clone failed without saying why"
        assert not (clone_dir / ".git").exists()

    # A later clone sees only the new incarnation.
    later = tmp_path / "clone-new"
    run_git(["clone", "--quiet", url, str(later)], cwd=tmp_path)
    assert created["incarnation"] >= 2
    assert run_git(["rev-parse", "HEAD"], cwd=later).decode().strip() == new_tip
    assert objects(later) == new_objects
    assert sorted(p.name for p in later.iterdir() if p.name != ".git") == ["only-new.txt"]

    # No object of E is served from E + 1, even when asked for by id; the same request
    # for an object of E + 1 is served (so the refusals below are about E).
    blob_of_e = run_git(["rev-parse", "HEAD:blob0.bin"], cwd=tmp_path / "old").decode().strip()
    for version in ("2", "0"):
        empty = tmp_path / f"empty-v{version}"
        run_git(["init", "--quiet", "--bare", str(empty)], cwd=tmp_path)
        fetch = ["-c", f"protocol.version={version}", "fetch", "--quiet", url]
        run_git([*fetch, new_tip], cwd=empty)
        assert run_git(["cat-file", "-t", new_tip], cwd=empty) == b"commit\n"
        for oid in (old_tip, blob_of_e):
            with pytest.raises(GitFailed) as refused:
                run_git([*fetch, oid], cwd=empty)
            print(f"v{version} want {oid[:12]}: {refused.value}")
            missing = subprocess.run(
                ["git", "cat-file", "-e", oid], cwd=empty, env=git_env(default_home()),
                capture_output=True, check=False,
            )  # fmt: skip
            assert missing.returncode != 0, f"{oid} of E reached a repository of E + 1"
