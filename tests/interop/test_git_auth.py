"""Access control end to end: the git CLI against `enroute dev` with auth on
(docs/access-control.md; DESIGN.md "External interfaces", Auth).

The server runs as an operator runs it, with `auth.anonymous: none` and a
tokens file laid out like a mounted Kubernetes Secret (`tokens.yaml ->
..data/tokens.yaml`, `..data -> ..<version>`), so rotation is the kubelet's
symlink swap and revocation is an edit of the file, both while it runs.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from enroute_gitproto.auth import token_digest
from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import git_env

pytestmark = [pytest.mark.interop, pytest.mark.slow]

GIT_TIMEOUT_S = 60.0
_names = itertools.count()

TOKENS = {
    "admin": ("tok-admin-0123456789abcdef", ["admin"], None),
    "reader": ("tok-reader-0123456789abcdef", ["read"], None),
    "team": ("tok-team-0123456789abcdef", ["read", "write"], "team/*"),
    "doomed": ("tok-doomed-0123456789abcdef", ["read", "write"], None),
}


def tokens_yaml(tokens: dict[str, tuple[str, list[str], str | None]]) -> str:
    entries = []
    for name, (secret, scopes, repos) in tokens.items():
        entry: dict[str, object] = {"name": name, "sha256": token_digest(secret), "scopes": scopes}
        if repos is not None:
            entry["repos"] = repos
        entries.append(entry)
    return yaml.safe_dump({"tokens": entries})


class SecretVolume:
    """A directory shaped like a mounted Secret; ``publish`` is the kubelet's atomic update."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = itertools.count(1)
        root.mkdir()

    @property
    def path(self) -> Path:
        return self.root / "tokens.yaml"

    def publish(self, text: str) -> None:
        version = self.root / f"..2026_12_03_{next(self.versions):02d}"
        version.mkdir()
        (version / "tokens.yaml").write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        os.symlink(version.name, self.root / "..data_tmp")
        os.rename(self.root / "..data_tmp", data)
        if not self.path.is_symlink():
            os.symlink("..data/tokens.yaml", self.path)
        if old is not None:
            (self.root / old / "tokens.yaml").unlink()
            (self.root / old).rmdir()


@dataclass
class Server:
    url: str
    secret: SecretVolume
    ops_url: str
    """gitproto's operator port (listen.ops): /status."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("enroute-auth")
    secret = SecretVolume(root / "secret")
    secret.publish(tokens_yaml(TOKENS))
    config = {"auth": {"anonymous": "none", "tokens_file": str(secret.path)}}
    with running_dev(root, config) as dev:
        yield Server(dev.url, secret, dev.ops_url)
        log_path = dev.log_path
    assert b"anonymous read AND WRITE" not in log_path.read_bytes()  # auth was on: no warning


# --- helpers -------------------------------------------------------------------------------


def git(args: list[str], cwd: Path, home: Path, extra_env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[bytes]:  # fmt: skip
    env = git_env(home)
    env.update(extra_env or {})
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=GIT_TIMEOUT_S, check=False)  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"git {args} failed: {done.stderr.decode(errors='replace')}")
    return done


def helper(token: str) -> list[str]:
    """A credential helper that answers any user name and ``token`` as the password."""
    return ["-c", f"credential.helper=!f(){{ echo username=x; echo password={token}; }}; f"]


def make_source(tmp: Path, home: Path) -> Path:
    src = tmp / f"src-{next(_names)}"
    git(["init", "-q", "-b", "main", str(src)], tmp, home)
    (src / "README").write_text("hello\n")
    git(["add", "README"], src, home)
    git(["commit", "-q", "-m", "first"], src, home)
    return src


def commit(repo: Path, home: Path, text: str) -> None:
    (repo / "README").write_text(text)
    git(["commit", "-q", "-am", text], repo, home)


def refs(url: str, tmp: Path, home: Path) -> bytes:
    return git([*helper(TOKENS["admin"][0]), "ls-remote", url], tmp, home).stdout


def seeded(server: Server, tmp: Path, home: Path, name: str) -> str:
    """A repository named ``name`` (made unique) with one commit, pushed by the admin token."""
    url = f"{server.url}/{name}-{next(_names)}-{time.monotonic_ns()}.git"
    src = make_source(tmp, home)
    git([*helper(TOKENS["admin"][0]), "push", "-q", url, "main"], src, home)
    return url


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    return made


# --- tests ---------------------------------------------------------------------------------


def test_anonymous_request_gets_401_with_basic_challenge(server: Server) -> None:
    request = urllib.request.Request(
        f"{server.url}/private/x.git/info/refs?service=git-upload-pack"
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 401
    assert caught.value.headers["WWW-Authenticate"] == 'Basic realm="enroute"'


def test_git_prompts_through_askpass_then_clones_and_pushes(
    server: Server, tmp_path: Path, home: Path
) -> None:
    url = seeded(server, tmp_path, home, "private/app")
    before = refs(url, tmp_path, home)
    record = tmp_path / "askpass.log"
    askpass = tmp_path / "askpass.sh"
    askpass.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{record}"\n'
        'case "$1" in Username*) echo someone ;; '
        f"*) echo {TOKENS['admin'][0]} ;; esac\n"
    )
    askpass.chmod(0o755)
    env = {"GIT_ASKPASS": str(askpass)}
    git(["clone", "-q", url, "clone"], tmp_path, home, env)
    prompts = record.read_text()
    assert "Username for 'http://" in prompts and "Password for 'http://someone@" in prompts
    assert TOKENS["admin"][0] not in prompts
    clone = tmp_path / "clone"
    commit(clone, home, "second")
    record.unlink()
    git(["push", "-q", "origin", "main"], clone, home, env)
    assert "Password for" in record.read_text()  # the push was challenged as well
    assert refs(url, tmp_path, home) != before


def test_no_prompt_and_no_askpass_fails_with_auth_error(
    server: Server, tmp_path: Path, home: Path
) -> None:
    url = seeded(server, tmp_path, home, "private/quiet")
    env = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": ""}
    done = git(["clone", "-q", url, "clone"], tmp_path, home, env, check=False)
    assert done.returncode != 0
    assert b"could not read Username" in done.stderr and b"terminal prompts disabled" in done.stderr
    src = make_source(tmp_path, home)
    before = refs(url, tmp_path, home)
    done = git(["push", "-q", "-f", url, "main"], src, home, env, check=False)
    assert done.returncode != 0 and b"could not read Username" in done.stderr
    assert refs(url, tmp_path, home) == before


def test_credential_helper_clones_and_pushes(server: Server, tmp_path: Path, home: Path) -> None:
    url = seeded(server, tmp_path, home, "private/helper")
    token = TOKENS["admin"][0]
    git([*helper(token), "clone", "-q", url, "clone"], tmp_path, home)
    clone = tmp_path / "clone"
    commit(clone, home, "via helper")
    git([*helper(token), "push", "-q", "origin", "main"], clone, home)
    head = git(["rev-parse", "HEAD"], clone, home).stdout.strip()
    assert head in refs(url, tmp_path, home)


def test_wrong_token_fails_with_authentication_failed(
    server: Server, tmp_path: Path, home: Path
) -> None:
    url = seeded(server, tmp_path, home, "private/wrong")
    done = git([*helper("tok-not-a-token"), "ls-remote", url], tmp_path, home, check=False)
    assert done.returncode != 0 and b"Authentication failed" in done.stderr


def test_read_token_clones_but_cannot_push(server: Server, tmp_path: Path, home: Path) -> None:
    url = seeded(server, tmp_path, home, "private/readonly")
    reader = TOKENS["reader"][0]
    git([*helper(reader), "clone", "-q", url, "clone"], tmp_path, home)
    clone = tmp_path / "clone"
    commit(clone, home, "not allowed")
    before = refs(url, tmp_path, home)
    done = git([*helper(reader), "push", "origin", "main"], clone, home, check=False)
    assert done.returncode != 0
    assert b"token 'reader' lacks the write scope" in done.stderr  # shown as remote: ...
    assert refs(url, tmp_path, home) == before


def test_glob_token_reaches_only_its_repositories(
    server: Server, tmp_path: Path, home: Path
) -> None:
    team = seeded(server, tmp_path, home, "team/app")
    other = seeded(server, tmp_path, home, "other/x")
    token = TOKENS["team"][0]
    git([*helper(token), "clone", "-q", team, "team-clone"], tmp_path, home)
    commit(tmp_path / "team-clone", home, "team change")
    git([*helper(token), "push", "-q", "origin", "main"], tmp_path / "team-clone", home)
    done = git([*helper(token), "clone", "-q", other, "other-clone"], tmp_path, home, check=False)
    assert done.returncode != 0 and b"does not cover repository 'other/x-" in done.stderr
    assert not (tmp_path / "other-clone" / "README").exists()


def test_revoked_and_rotated_tokens_without_restart(
    server: Server, tmp_path: Path, home: Path
) -> None:
    url = seeded(server, tmp_path, home, "private/rotate")
    doomed = TOKENS["doomed"][0]
    git([*helper(doomed), "ls-remote", url], tmp_path, home)
    # revocation: the entry is removed from the file the link points at, in place
    remaining = {k: v for k, v in TOKENS.items() if k != "doomed"}
    target = server.secret.path.resolve()
    target.write_text(tokens_yaml(remaining))
    done = git([*helper(doomed), "ls-remote", url], tmp_path, home, check=False)
    assert done.returncode != 0 and b"Authentication failed" in done.stderr
    # rotation: the kubelet swaps ..data to a new version holding a new token
    fresh = "tok-fresh-0123456789abcdef"
    server.secret.publish(tokens_yaml({**remaining, "fresh": (fresh, ["read"], None)}))
    git([*helper(fresh), "ls-remote", url], tmp_path, home)
    server.secret.publish(tokens_yaml(TOKENS))  # back as the module started
    done = git([*helper(fresh), "ls-remote", url], tmp_path, home, check=False)
    assert done.returncode != 0 and b"Authentication failed" in done.stderr
    git([*helper(doomed), "ls-remote", url], tmp_path, home)


def test_api_bearer_token(server: Server, tmp_path: Path, home: Path) -> None:
    url = seeded(server, tmp_path, home, "team/api")
    name = url.rsplit("/", 2)[-2] + "/" + url.rsplit("/", 1)[-1].removesuffix(".git")
    api = f"{server.url}/api/v1/repos/{name}"
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(api, timeout=10)
    assert caught.value.code == 401
    bearer = urllib.request.Request(api, headers={"Authorization": f"Bearer {TOKENS['team'][0]}"})
    with urllib.request.urlopen(bearer, timeout=10) as response:
        assert response.status == 200
    basic = base64.b64encode(f"x:{TOKENS['reader'][0]}".encode()).decode()
    deleting = urllib.request.Request(api, method="DELETE",
                                      headers={"Authorization": f"Basic {basic}"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(deleting, timeout=10)
    assert caught.value.code == 403


def test_failed_reload_keeps_the_last_good_file_and_shows_it_in_status(
    server: Server, tmp_path: Path, home: Path
) -> None:
    """Issue 24 item 5: a templating slip (``repos:`` left empty) in a rotated Secret is
    refused; the tokens in force stay as they were, the error is logged and in /status."""
    url = seeded(server, tmp_path, home, "other/slip")
    team = TOKENS["team"][0]
    refused = git([*helper(team), "ls-remote", url], tmp_path, home, check=False)
    assert refused.returncode != 0 and b"does not cover repository" in refused.stderr

    def tokens_status() -> dict[str, object]:
        with urllib.request.urlopen(f"{server.ops_url}/status", timeout=10) as response:
            found: dict[str, object] = json.loads(response.read())["auth"]["tokens_file"]
            return found

    before = tokens_status()
    assert before["ok"] is True and before["error"] is None
    slip = tokens_yaml(TOKENS).replace("repos: team/*", "repos:")
    assert "repos:\n" in slip and yaml.safe_load(slip)["tokens"][2]["repos"] is None
    server.secret.publish(slip)
    try:
        refused = git([*helper(team), "ls-remote", url], tmp_path, home, check=False)
        assert refused.returncode != 0 and b"does not cover repository" in refused.stderr
        failed = tokens_status()
        assert failed["ok"] is False and failed["loaded_at"] == before["loaded_at"]
        assert "repos is None" in str(failed["error"]), failed
        log = (server.secret.root.parent / "data" / "logs" / "gitproto.log").read_text()
        assert "the last good file stays in force" in log and "entry 2 ('team')" in log
    finally:
        server.secret.publish(tokens_yaml(TOKENS))
    assert tokens_status()["ok"] is True
    git([*helper(TOKENS["reader"][0]), "ls-remote", url], tmp_path, home)
