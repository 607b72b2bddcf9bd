"""`enroute dev` supervision with tiny stand-in children, and `enroute token create`."""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from enroute_gitproto.auth import token_digest
from enroute_gitproto.cli import app
from enroute_testing.env import service_env

FAKE_CHILD = """
import signal, sys, time, yaml
role, path = sys.argv[1], sys.argv[2]
config = yaml.safe_load(open(path))
sys.stderr.write(repr(config) + "\\n")
if role == "broken":
    sys.exit(3)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
print(f"enroute {role} ready: grpc=127.0.0.1:1{len(role)} http=127.0.0.1:2{len(role)}", flush=True)
while not stop:
    time.sleep(0.05)
"""


def _dev(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    argv = [sys.executable, "-m", "enroute_gitproto.cli", "dev", "--data", str(tmp_path / "d"),
            "--listen", "127.0.0.1:0", "--start-timeout", "20",
            "--child-cmd", f"ledger={{python}} {script} ledger {{config}}",
            "--child-cmd", f"compute={{python}} {script} compute {{config}}", *extra]  # fmt: skip
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=service_env()
    )


def test_dev_starts_roles_in_order_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = _dev(tmp_path)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.fullmatch(r"enroute ready: http://(127\.0\.0\.1:\d+)\n", line)
    assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
    host, port = match.group(1).split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/readyz")
    assert conn.getresponse().status == 200
    conn.close()
    compute = yaml.safe_load((tmp_path / "d" / "config" / "compute.yaml").read_text())
    assert compute["ledger"]["members"] == ["127.0.0.1:16"]
    gitproto = yaml.safe_load((tmp_path / "d" / "config" / "gitproto.yaml").read_text())
    assert gitproto["compute"]["members"] == ["127.0.0.1:17"]
    assert gitproto["auth"]["anonymous"] == "write"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_dev_supervisor_does_not_keep_the_command_lines_imports(tmp_path: Path) -> None:
    """The process left supervising is enroute_gitproto.dev (same pid, exec'd): none of
    the native libraries of gRPC or pydantic (the config models) are mapped
    in it, which were about 40 MiB of its resident set (docs/services.md)."""
    proc = _dev(tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("enroute ready: ")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"enroute_gitproto.dev" in cmdline, cmdline
        # its arguments (the user's config among them) are in a 0600 file, not argv
        args_file = tmp_path / "d" / "config" / "dev-args.json"
        assert cmdline[-2] == str(args_file).encode(), cmdline
        assert args_file.stat().st_mode & 0o777 == 0o600
        for native in ("cygrpc", "_pydantic_core"):
            assert native not in maps, native
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_dev_shows_log_of_a_child_that_fails(tmp_path: Path) -> None:
    script = tmp_path / "fake_child.py"
    proc = _dev(tmp_path, "--child-cmd", f"compute={{python}} {script} broken {{config}}")
    start = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "compute was not ready" in err and "dev-compute-1" in err
    assert time.monotonic() - start < 20


def test_token_create(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    runner = CliRunner()
    result = runner.invoke(app, ["token", "create", "--name", "ci", "--scopes", "read,write",
                                 "--repos", "team/*", "--file", str(tokens)])  # fmt: skip
    assert result.exit_code == 0, result.output
    token = result.output.strip()
    entry: dict[str, Any] = yaml.safe_load(tokens.read_text())["tokens"][0]
    assert entry == {"name": "ci", "sha256": token_digest(token), "scopes": ["read", "write"],
                     "repos": "team/*"}  # fmt: skip
    assert token not in tokens.read_text()
    again = runner.invoke(app, ["token", "create", "--name", "ci", "--scopes", "read",
                                "--file", str(tokens)])  # fmt: skip
    assert again.exit_code != 0
    bad = runner.invoke(app, ["token", "create", "--name", "x", "--scopes", "root",
                              "--file", str(tokens)])  # fmt: skip
    assert bad.exit_code != 0
    before = tokens.read_text()
    for glob in ("", "/*", "team//*"):  # "$TEAM/*" with TEAM unset must not cover everything
        slip = runner.invoke(app, ["token", "create", "--name", "y", "--scopes", "read",
                                   "--repos", glob, "--file", str(tokens)])  # fmt: skip
        assert slip.exit_code != 0 and "matches no repository name" in slip.output, slip.output
    assert tokens.read_text() == before
