"""The operator's `enroute` command as a process (issue 23, item 7): ``--version``, ``-h``,
``token list`` and ``token revoke`` against a running gitproto, and errors as JSON under
``--json``.

The binary is the console script the package installs, run with the service
environment; the server is a real `enroute dev` with auth on, reading the tokens
file the commands edit, so a revoked token is refused by the next request.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from enroute_gitproto.observe import VERSION
from enroute_testing.devserver import ENROUTE_BIN, running_dev
from enroute_testing.env import service_env
from enroute_testing.ports import free_port

pytestmark = [pytest.mark.interop]


def enroute(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENROUTE_BIN), *args], capture_output=True, text=True, timeout=60,
        env=service_env(), check=False,
    )  # fmt: skip


def status_of(url: str, token: str) -> int:
    request = urllib.request.Request(f"{url}/api/v1/repos")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_version_and_short_help() -> None:
    done = enroute("--version")
    assert (done.returncode, done.stdout) == (0, f"enroute {VERSION}\n")
    for argv in (["-h"], ["token", "-h"], ["repo", "get", "-h"]):
        done = enroute(*argv)
        assert done.returncode == 0 and "Usage: enroute" in done.stdout, (argv, done.stderr)


@pytest.mark.timeout(180)
def test_token_list_and_revoke_reach_a_running_gitproto(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    made = {}
    for name, scopes in (("ops", "admin"), ("ci-bot", "read,write")):
        done = enroute("token", "create", "--name", name, "--scopes", scopes,
                       "--file", str(tokens))  # fmt: skip
        assert done.returncode == 0, done.stderr
        made[name] = done.stdout.strip()
    listed = enroute("token", "list", "--file", str(tokens), "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"tokens": [
        {"name": "ci-bot", "scopes": ["read", "write"], "repos": None},
        {"name": "ops", "scopes": ["admin"], "repos": None},
    ]}  # fmt: skip
    table = enroute("token", "list", "--file", str(tokens)).stdout
    assert table.split("\n")[0].split() == ["NAME", "SCOPES", "REPOS"] and "ci-bot" in table
    for secret in made.values():  # a listing shows neither a token nor its digest
        assert secret not in listed.stdout + table
    assert "sha256" not in listed.stdout

    root = tmp_path / "dev"
    root.mkdir()
    config = {"auth": {"anonymous": "none", "tokens_file": str(tokens)}}
    with running_dev(root, config) as dev:
        assert status_of(dev.url, made["ci-bot"]) == 200
        done = enroute("token", "revoke", "--name", "ci-bot", "--file", str(tokens))
        assert (done.returncode, done.stdout) == (0, "revoked ci-bot\n"), done.stderr
        assert status_of(dev.url, made["ci-bot"]) == 401  # the file is re-read on change
        assert status_of(dev.url, made["ops"]) == 200
        again = enroute("token", "revoke", "--name", "ci-bot", "--file", str(tokens))
        assert again.returncode != 0 and "no token named 'ci-bot'" in again.stderr

        # errors under --json: the API's error body on stdout, the exit status says which
        missing = enroute("repo", "get", "team/none", "--json", "--url", dev.url,
                          "--token", made["ops"])  # fmt: skip
        assert missing.returncode == 1, missing.stderr
        assert json.loads(missing.stdout)["error"]["code"] == "not_found"
        refused = enroute("repo", "list", "--json", "--url", dev.url, "--token", made["ci-bot"])
        assert refused.returncode == 1
        assert json.loads(refused.stdout)["error"]["code"] == "unauthenticated"
    gone = enroute("repo", "list", "--json", "--url", f"http://127.0.0.1:{free_port()}")
    assert gone.returncode == 2
    error = json.loads(gone.stdout)["error"]
    assert error["code"] == "unavailable" and "cannot reach" in error["message"]
