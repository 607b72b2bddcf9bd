"""The history checker and the TCP proxy on their own (fast; no cluster)."""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enroute_testing.faultproxy import LinkMode, TcpProxy
from enroute_testing.gitcli import run_git
from enroute_testing.history import (
    PENDING,
    Recorder,
    RepoRefs,
    acknowledged_writes,
    check_records,
    rejected_but_applied,
)
from enroute_testing.linearizability import UNKNOWN, Verdict
from enroute_testing.workload import token_commits

A, B, C = "a" * 40, "b" * 40, "c" * 40
MAIN = "refs/heads/main"


def _seq(rec: Recorder, kind: str, op_input: tuple[object, ...], how: str, out: object) -> None:
    r = rec.invoke(0, kind, "r", op_input)
    rec.complete(r, how, out)


def test_sequential_history_is_linearizable() -> None:
    rec = Recorder()
    _seq(rec, "push", ("cas", MAIN, None, A), "ok", True)
    _seq(rec, "fetch", ("read",), "ok", ((MAIN, A),))
    _seq(rec, "push", ("cas", MAIN, None, B), "ok", False)
    _seq(rec, "api_commit", ("cas", MAIN, A, B), "ok", True)
    _seq(rec, "delete", ("delete",), "ok", None)
    _seq(rec, "ls_refs", ("read",), "ok", ())
    assert check_records(rec.records, {}).ok


def test_stale_read_after_acknowledged_write_is_caught() -> None:
    rec = Recorder()
    _seq(rec, "push", ("cas", MAIN, None, A), "ok", True)
    _seq(rec, "push", ("cas", MAIN, A, B), "ok", True)
    _seq(rec, "fetch", ("read",), "ok", ((MAIN, A),))
    result = check_records(rec.records, {})
    assert result.verdict is Verdict.ILLEGAL and result.key == "r"


def test_two_winners_of_one_cas_are_caught() -> None:
    rec = Recorder()
    _seq(rec, "push", ("cas", MAIN, None, A), "ok", True)
    first = rec.invoke(1, "push", "r", ("cas", MAIN, A, B))
    second = rec.invoke(2, "push", "r", ("cas", MAIN, A, C))
    rec.complete(first, "ok", True)
    rec.complete(second, "ok", True)
    assert not check_records(rec.records, {}).ok


def test_deleted_value_reappearing_is_caught() -> None:
    rec = Recorder()
    _seq(rec, "push", ("cas", MAIN, None, A), "ok", True)
    _seq(rec, "delete", ("delete",), "ok", None)
    _seq(rec, "clone", ("read",), "ok", ((MAIN, A),))
    assert not check_records(rec.records, {}).ok


def test_unknown_write_may_or_may_not_have_happened() -> None:
    for seen in ((), ((MAIN, A),)):
        rec = Recorder()
        lost = rec.invoke(0, "push", "r", ("cas", MAIN, None, A))
        rec.complete(lost, "info", None)
        _seq(rec, "fetch", ("read",), "ok", seen)
        assert check_records(rec.records, {}).ok, seen
    # but it cannot be undone once read
    rec = Recorder()
    lost = rec.invoke(0, "push", "r", ("cas", MAIN, None, A))
    rec.complete(lost, "info", None)
    _seq(rec, "fetch", ("read",), "ok", ((MAIN, A),))
    _seq(rec, "fetch", ("read",), "ok", ())
    assert not check_records(rec.records, {}).ok


def test_pending_api_commit_resolved_by_token() -> None:
    rec = Recorder()
    _seq(rec, "push", ("cas", MAIN, None, A), "ok", True)
    lost = rec.invoke(0, "api_commit", "r", ("cas", MAIN, A, PENDING), token="t1")
    rec.complete(lost, "info", None)
    _seq(rec, "fetch", ("read",), "ok", ((MAIN, B),))
    assert check_records(rec.records, {"t1": B}).ok
    assert not check_records(rec.records, {}).ok  # B came from nowhere


def test_failed_write_is_left_out() -> None:
    rec = Recorder()
    gone = rec.invoke(0, "push", "r", ("cas", MAIN, None, A))
    rec.complete(gone, "fail", None)
    _seq(rec, "fetch", ("read",), "ok", ())
    assert check_records(rec.records, {}).ok


def test_acknowledged_writes_skip_those_a_delete_may_follow() -> None:
    rec = Recorder()
    _seq(rec, "push", ("cas", MAIN, None, A), "ok", True)
    _seq(rec, "push", ("cas", "refs/heads/x", None, B), "ok", True)
    _seq(rec, "push", ("cas", "refs/heads/x", B, None), "ok", True)
    kept = acknowledged_writes(rec.records)
    assert [w.input[3] for w in kept] == [A]


def test_random_sequential_histories_pass_and_corrupted_reads_fail() -> None:
    seed = int(os.environ.get("ENROUTE_SEED", "7"))
    print(f"ENROUTE_SEED={seed}")
    rng = random.Random(seed)
    model = RepoRefs()
    for _ in range(30):
        rec = Recorder()
        state = model.init()
        reads = []
        for n in range(25):
            choice = rng.random()
            refs = dict(state)  # type: ignore[arg-type]
            if choice < 0.5:
                ref = rng.choice((MAIN, "refs/heads/b"))
                old = refs.get(ref) if rng.random() < 0.8 else "f" * 40
                op_input: tuple[object, ...] = ("cas", ref, old, f"{n:040x}")
                _, state = model.step(state, op_input, UNKNOWN)
                _seq(rec, "push", op_input, "ok", refs.get(ref) == old)
            elif choice < 0.9:
                _seq(rec, "fetch", ("read",), "ok", state)
                reads.append(len(rec.records) - 1)
            else:
                _seq(rec, "delete", ("delete",), "ok", None)
                state = ()
        assert check_records(rec.records, {}).ok
        if reads:
            bad = rec.records[rng.choice(reads)]
            bad.output = ((MAIN, "e" * 40),)
            assert not check_records(rec.records, {}).ok


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(server.getsockname()[1])
    stop.set()
    t.join(2)
    server.close()


def _roundtrip(port: int, payload: bytes, timeout_s: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(payload)
        return s.recv(4096)


def test_tcp_proxy_modes(echo: int) -> None:
    with TcpProxy("127.0.0.1", echo) as link:
        assert _roundtrip(link.port, b"hello") == b"hello"
        link.set(LinkMode.DELAY, delay_s=0.3)
        started = time.monotonic()
        assert _roundtrip(link.port, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.5  # held once each way
        link.set(LinkMode.DROP)
        with pytest.raises(TimeoutError):
            _roundtrip(link.port, b"lost", timeout_s=0.5)
        link.set(LinkMode.CUT)
        with pytest.raises((ConnectionError, OSError)):
            assert _roundtrip(link.port, b"cut", timeout_s=1.0) == b""
            raise ConnectionResetError
        link.heal()
        assert _roundtrip(link.port, b"again") == b"again"


def test_tcp_proxy_cut_resets_open_connections(echo: int) -> None:
    with TcpProxy("127.0.0.1", echo) as link:
        s = socket.create_connection(("127.0.0.1", link.port), timeout=2.0)
        with s:
            s.sendall(b"x")
            assert s.recv(10) == b"x"
            link.set(LinkMode.CUT)
            time.sleep(0.1)
            try:
                got = s.recv(10)
            except ConnectionResetError:
                got = b""
            assert got == b""


def test_tcp_proxy_drop_replies_delivers_requests(echo: int) -> None:
    with TcpProxy("127.0.0.1", echo) as link:
        link.set(LinkMode.DROP_REPLIES)
        with pytest.raises(TimeoutError):
            _roundtrip(link.port, b"asked", timeout_s=0.5)  # the echo happened, its reply vanished
        link.heal()
        assert _roundtrip(link.port, b"ok") == b"ok"


def test_rejected_but_applied_names_the_wrong_answers() -> None:
    rec = Recorder()
    _seq(rec, "push", ("cas", MAIN, None, A), "ok", False)  # told rejected...
    _seq(rec, "fetch", ("read",), "ok", ((MAIN, A),))  # ...but there it is
    _seq(rec, "push", ("cas", MAIN, None, B), "ok", False)  # rejected and never seen
    assert not check_records(rec.records, {}).ok
    assert [w.input[3] for w in rejected_but_applied(rec.records)] == [A]


def test_unknown_write_resolved_from_a_client_repository(tmp_path: Path) -> None:
    """Failure 7 of docs/reliability.md: an API commit of unknown outcome took effect, was
    read, then its branch was deleted. Its commit is only in the client that fetched it;
    resolving tokens there too keeps the read explainable."""
    home = tmp_path / "home"
    home.mkdir()
    mirror, client = tmp_path / "mirror", tmp_path / "client"
    for repo in (mirror, client):
        run_git(["init", "-q", "--bare", str(repo)], cwd=tmp_path)
    tree = run_git(["mktree"], cwd=client, input=b"").decode().strip()
    lost = run_git(["commit-tree", tree, "-m", "t7"], cwd=client).decode().strip()
    run_git(["update-ref", "refs/remotes/origin/main", lost], cwd=client)

    rec = Recorder()
    pending = rec.invoke(0, "api_commit", "r", ("cas", MAIN, None, PENDING), token="t7")
    rec.complete(pending, "info", None)
    _seq(rec, "fetch", ("read",), "ok", ((MAIN, lost),))
    _seq(rec, "push", ("cas", MAIN, lost, None), "ok", True)  # main deleted: not in the mirror

    from_mirror, _ = token_commits([mirror], home)
    resolve, token_of = token_commits([mirror, client], home)
    assert "t7" not in from_mirror
    assert resolve["t7"] == lost and token_of[lost] == "t7"
    assert not check_records(rec.records, from_mirror).ok  # the read names a value nobody wrote
    assert check_records(rec.records, resolve).ok
