"""Hostile transport input against real processes: `enroute dev` with small transport
limits, driven by the git CLI and by raw sockets (docs/access-control.md, "Hostile
transport input", T1-T8). Each test asserts what the client sees, that the
repository's refs are unchanged, and that the node serves a clone afterwards."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import random
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import git_env

pytestmark = [pytest.mark.interop, pytest.mark.slow]

GIT_TIMEOUT_S = 60.0
IDLE_S = 1.0
TOTAL_S = 6.0
LIMITS = {
    "git_body_max": "256KiB",
    "gzip_ratio_max": 20,
    "gzip_slack": "64KiB",
    "negotiation_pkt_lines_max": 2000,
    "requests_max": 4,
    "repo_requests_max": 2,
    "retry_after": "3s",
    "request_timeout": f"{TOTAL_S}s",
    "body_idle_timeout": f"{IDLE_S}s",
}
RESOURCE_LIMITS = {"protocol_push_commands_max": 3}  # the `limits:` section reaches the compute
HELD_BYTES = 100_000  # promised by held requests: under git_body_max, never all sent
_names = itertools.count()


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """HOST:PORT of an `enroute dev` (anonymous write) with the LIMITS above."""
    config = {"transport": LIMITS, "limits": RESOURCE_LIMITS}
    with running_dev(tmp_path_factory.mktemp("enroute-limits"), config) as dev:
        yield dev.address


# --- helpers -------------------------------------------------------------------------------


def git(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(["git", *args], cwd=cwd, env=git_env(cwd), capture_output=True,
                          timeout=GIT_TIMEOUT_S, check=False)  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"git {args} failed: {done.stderr.decode(errors='replace')}")
    return done


def seeded(address: str, tmp: Path) -> tuple[str, str, Path]:
    """A repository with one commit: (its name, its URL, the source work tree)."""
    name = f"lim-{next(_names)}-{time.monotonic_ns()}"
    src = tmp / f"src-{name}"
    git(["init", "-q", "-b", "main", str(src)], tmp)
    (src / "README").write_text("hello\n")
    git(["add", "README"], src)
    git(["commit", "-q", "-m", "first"], src)
    url = f"http://{address}/{name}.git"
    git(["push", "-q", url, "main"], src)
    return name, url, src


def refs(url: str, tmp: Path) -> bytes:
    return git(["ls-remote", url], tmp).stdout


def still_serves(url: str, tmp: Path, before: bytes) -> None:
    # a held request's slot is freed when the server sees its connection close, at the
    # latest when the request timeout (TOTAL_S) ends it: until then a 503 is the limit
    # doing its job, not a failure to serve
    deadline = time.monotonic() + TOTAL_S + 10.0
    while True:
        done = git(["ls-remote", url], tmp, check=False)
        busy = (
            b"transport.requests_max" in done.stderr
            or b"transport.repo_requests_max" in done.stderr
        )
        if done.returncode == 0 or not busy or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout == before  # the repository is unchanged
    target = tmp / f"clone-{next(_names)}"
    git(["clone", "-q", url, str(target)], tmp)
    assert (target / "README").read_text() == "hello\n"


def raw_post(address: str, target: str, length: int, first: bytes = b"",
             headers: str = "") -> socket.socket:  # fmt: skip
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"POST {target} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {length}\r\n"
        f"{headers}\r\n".encode()
        + first
    )
    return sock


def read_response(sock: socket.socket, data: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    # a chunked body (an ERR answer has no Content-Length) may come after the head's packet
    while headers.get("transfer-encoding", "").lower() == "chunked" and b"0\r\n\r\n" not in body:
        chunk = sock.recv(65536)
        assert chunk, body
        body += chunk
    return int(lines[0].split(" ", 2)[1]), headers, body


def post(address: str, target: str, body: bytes, headers: str = "") -> tuple[int, bytes]:
    sock = raw_post(address, target, len(body), body, headers)
    try:
        status, _, answer = read_response(sock)
    finally:
        sock.close()
    return status, answer


class Holder:
    """Requests kept open by sending one body byte at a time, under the idle timeout."""

    def __init__(self, address: str, targets: list[str]) -> None:
        self.started = time.monotonic()
        self.socks = [raw_post(address, t, HELD_BYTES, b"fff0") for t in targets]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _trickle(self) -> None:
        while not self.stop.wait(IDLE_S / 4):
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.sendall(b"a")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for sock in self.socks:
            sock.close()


def refused_while_held(
    address: str, targets: list[str], refused: str, client: list[str], cwd: Path
) -> tuple[int, bytes, subprocess.CompletedProcess[bytes]]:
    """Hold ``targets``, probe ``refused`` until it answers 503, then run git ``client``.

    The held requests end at the request timeout (TOTAL_S): a git that only got its
    request in after that (a loaded machine can take seconds to start git) proves
    nothing, and the round is tried again (at most 3). A git that succeeded while the
    requests were still held fails the test."""
    for _ in range(3):
        holder = Holder(address, targets)
        try:
            status, body = wait_until_refused(address, refused)
            done = git(client, cwd, check=False)
            held_s = time.monotonic() - holder.started
        finally:
            holder.close()
        if status != 503 or done.returncode != 0 or held_s < TOTAL_S * 0.9:
            break
        print(f"inconclusive: git ran {held_s:.1f} s after the slots were taken")
    return status, body, done


def wait_until_refused(address: str, target: str) -> tuple[int, bytes]:
    """Probe until the held requests have their slots (each probe answers at once)."""
    status, answer = 0, b""
    for _ in range(50):
        sock = raw_post(address, target, 4, b"0000")
        try:
            status, headers, answer = read_response(sock)
        finally:
            sock.close()
        if status == 503:
            assert headers["retry-after"] == "3"
            return status, answer
        time.sleep(0.1)
    return status, answer


# --- T1: body size -------------------------------------------------------------------------


def test_t1_content_length_over_limit_is_413_before_the_body(address: str, tmp_path: Path) -> None:
    name, url, _ = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    sock = raw_post(address, f"/{name}.git/git-receive-pack", 10**12)  # nothing of it sent
    status, _, body = read_response(sock)
    sock.close()
    assert status == 413 and b"transport.git_body_max" in body
    still_serves(url, tmp_path, before)


def test_t1_git_push_over_body_limit_is_refused(address: str, tmp_path: Path) -> None:
    _, url, src = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    # incompressible and over git's http.postBuffer (1 MiB): sent chunked, no Content-Length,
    # so the bound is met while the body streams
    (src / "big.bin").write_bytes(random.Random(8).randbytes(1536 * 1024))
    git(["add", "big.bin"], src)
    git(["commit", "-q", "-m", "big"], src)
    done = git(["push", url, "main"], src, check=False)
    assert done.returncode != 0
    # usually the reason on band 3 ("remote: body_bytes_max is ..."); when the server's
    # close beats curl to the response, the reset makes it "curl 55 Send failure"
    assert b"remote: body_bytes_max" in done.stderr or b"error: RPC failed" in done.stderr, (
        done.stderr
    )
    still_serves(url, tmp_path, before)


# --- T2: deflate bomb ----------------------------------------------------------------------


def test_t2_gzip_bomb_is_413(address: str, tmp_path: Path) -> None:
    name, url, _ = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    bomb = gzip.compress(b"0000" * (16 * 1024 * 1024), 9)  # ~64 KiB inflating to 64 MiB
    status, body = post(address, f"/{name}.git/git-upload-pack", bomb,
                        "Content-Encoding: gzip\r\n")  # fmt: skip
    assert status == 200 and b"ERR " in body and b"transport.gzip_ratio_max" in body
    still_serves(url, tmp_path, before)


# --- T3: pkt-lines in negotiation ----------------------------------------------------------


def test_t3_too_many_pkt_lines_is_413(address: str, tmp_path: Path) -> None:
    name, url, _ = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    # a valid negotiation but for its length (gitprotocol-pack, "Packfile Negotiation"):
    # haves without a want are refused by the compute as soon as it reads the first, an
    # answer that raced the limit's own (the body streams to the compute while counted)
    want = b"0032want " + before.split(b"\t", 1)[0] + b"\n0000"
    have = b"0032have " + b"1" * 40 + b"\n"
    status, body = post(address, f"/{name}.git/git-upload-pack",
                        want + have * 3000 + b"0009done\n")  # fmt: skip
    assert status == 200 and b"ERR " in body and b"transport.negotiation_pkt_lines_max" in body
    still_serves(url, tmp_path, before)


# --- T4, T5: concurrency -------------------------------------------------------------------


def test_t4_node_concurrency_is_503_and_git_says_so(address: str, tmp_path: Path) -> None:
    names = [seeded(address, tmp_path) for _ in range(5)]
    before = refs(names[4][1], tmp_path)
    held = [f"/{n}.git/git-upload-pack" for n, _, _ in names[:4]]
    status, body, done = refused_while_held(address, held, f"/{names[4][0]}.git/git-upload-pack",
                                            ["ls-remote", names[4][1]], tmp_path)  # fmt: skip
    assert status == 503 and b"transport.requests_max" in body
    assert done.returncode != 0 and b"503" in done.stderr
    still_serves(names[4][1], tmp_path, before)


def test_t5_repository_concurrency_is_503(address: str, tmp_path: Path) -> None:
    name, url, _ = seeded(address, tmp_path)
    _, other_url, _ = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    holder = Holder(address, [f"/{name}.git/git-upload-pack"] * 2)
    try:
        status, body = wait_until_refused(address, f"/{name}.git/git-upload-pack")
        assert status == 503 and b"transport.repo_requests_max" in body
        done = git(["clone", "-q", url, str(tmp_path / "refused")], tmp_path, check=False)
        assert done.returncode != 0 and b"503" in done.stderr
        git(["clone", "-q", other_url, str(tmp_path / "other")], tmp_path)  # others are served
    finally:
        holder.close()
    still_serves(url, tmp_path, before)


def test_limits_section_reaches_the_compute(address: str, tmp_path: Path) -> None:
    """A push of more commands than `limits.protocol_push_commands_max` is refused whole."""
    _, url, src = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    for i in range(4):
        git(["branch", f"b{i}"], src)
    done = git(["push", url, "b0", "b1", "b2", "b3"], src, check=False)
    assert done.returncode != 0
    # LimitExceeded (default bound: 100,000), on band 3 of the push's answer
    assert b"remote: protocol_push_commands_max is 4" in done.stderr, done.stderr
    git(["push", "-q", url, "b0", "b1", "b2"], src)  # within the limit: taken
    after = refs(url, tmp_path)
    assert after != before and b"refs/heads/b3" not in after


# --- T6, T7: slow bodies and the total time ------------------------------------------------


def test_t6_slow_loris_body_is_cut(address: str, tmp_path: Path) -> None:
    name, url, _ = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    started = time.monotonic()
    sock = raw_post(address, f"/{name}.git/git-receive-pack", 100_000, b"00a0")
    status, _, body = read_response(sock)
    sock.close()
    assert status == 504 and b"transport.body_idle_timeout" in body
    assert IDLE_S * 0.9 < time.monotonic() - started < TOTAL_S
    still_serves(url, tmp_path, before)


def test_t7_request_timeout_cuts_a_trickling_body(address: str, tmp_path: Path) -> None:
    name, url, _ = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    started = time.monotonic()
    sock = raw_post(address, f"/{name}.git/git-receive-pack", HELD_BYTES, b"fff0")
    sock.settimeout(IDLE_S / 4)
    data = b""
    for _ in range(int(4 * TOTAL_S / IDLE_S) + 40):  # a byte per quarter idle timeout
        try:
            data = sock.recv(65536)
            break
        except TimeoutError:
            sock.sendall(b"a")
    sock.settimeout(30)
    status, _, body = read_response(sock, data)
    sock.close()
    assert status == 504 and b"transport.request_timeout" in body
    assert TOTAL_S * 0.9 < time.monotonic() - started < TOTAL_S + 10
    still_serves(url, tmp_path, before)


# --- T8: API body --------------------------------------------------------------------------


def test_t8_api_body_over_limit_is_413(address: str, tmp_path: Path) -> None:
    name, url, _ = seeded(address, tmp_path)
    before = refs(url, tmp_path)
    sock = raw_post(address, f"/api/v1/repos/{name}/-/commits", 10**10,
                    headers="Content-Type: application/json\r\n")  # fmt: skip
    status, _, body = read_response(sock)
    sock.close()
    assert status == 413 and b'"limit_exceeded"' in body and b"transport.api_body_max" in body
    still_serves(url, tmp_path, before)
