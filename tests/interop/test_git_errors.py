"""Every refusal reaches git as git shows it (issue 23, item 4; docs/protocol.md, "Errors").

The real git CLI against `enroute dev`; each test checks the exact lines git prints:

- a fetch refused in its first response gets one ``ERR`` packet in a 200 answer, which
  fetch-pack shows as ``fatal: remote error: <reason>`` (v2 and v0; pkt-line.c
  ``PACKET_READ_DIE_ON_ERR_PACKET``); an HTTP error status would show as
  ``RPC failed; HTTP 400`` with the reason never printed (remote-curl.c ``post_rpc``);
- a push refused is a report: ``unpack <reason>`` and ``ng <ref> <reason>``, which
  send-pack shows as ``error: remote unpack failed: <reason>`` and
  `` ! [remote rejected] <src> -> <dst> (<reason>)`` (send-pack.c
  ``receive_unpack_status``, transport.c ``print_ref_status``);
- on ``info/refs`` git reads the HTTP status (remote-curl.c ``discover_refs``): 404 is
  ``repository '<url>/' not found``, 401 asks for credentials and then is
  ``Authentication failed for '<url>/'``, 403 is ``The requested URL returned error: 403``.

And the log: git's first request carries no credentials when the URL has none (http.c
retries with them after the 401), so an authenticated push logs no WARNING for it.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from enroute_gitproto.auth import token_digest
from enroute_testing.devserver import running_dev
from enroute_testing.gitcli import git_env

pytestmark = [pytest.mark.interop]

GIT_TIMEOUT_S = 60.0
PACK_BYTES_MAX = 200_000
WANTS_MAX = 2
ADMIN = "tok-admin-0123456789abcdef"
READER = "tok-reader-0123456789abcdef"
_names = itertools.count()


@dataclass
class Dev:
    url: str
    root: Path


def run(
    args: list[str], cwd: Path, home: Path, ok: bool = True
) -> subprocess.CompletedProcess[bytes]:
    env = git_env(home)
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": ""})
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=GIT_TIMEOUT_S, check=False)  # fmt: skip
    assert (done.returncode == 0) == ok, (args, done.returncode, done.stderr)
    return done


def lines(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    return done.stderr.decode(errors="replace").splitlines()


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    root = tmp_path_factory.mktemp("enroute-errors")
    config = {"limits": {"ingest_pack_bytes_max": PACK_BYTES_MAX, "protocol_wants_max": WANTS_MAX}}
    with running_dev(root, config) as dev:
        yield Dev(dev.url, root)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    root = tmp_path_factory.mktemp("enroute-errors-auth")
    tokens = [
        {"name": "admin", "sha256": token_digest(ADMIN), "scopes": ["admin"]},
        {"name": "reader", "sha256": token_digest(READER), "scopes": ["read"]},
    ]
    (root / "tokens.yaml").write_text(yaml.safe_dump({"tokens": tokens}))
    config = {"auth": {"anonymous": "none", "tokens_file": str(root / "tokens.yaml")}}
    with running_dev(root, config) as dev:
        yield Dev(dev.url, root)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    return made


def source(tmp: Path, home: Path, commits: int = 3) -> Path:
    src = tmp / f"src-{next(_names)}"
    run(["init", "-q", "-b", "main", str(src)], tmp, home)
    for i in range(commits):
        (src / "f.txt").write_text(f"version {i}\n")
        run(["add", "f.txt"], src, home)
        run(["commit", "-q", "-m", f"c{i}"], src, home)
    return src


def helper(token: str) -> list[str]:
    return ["-c", f"credential.helper=!f(){{ echo username=x; echo password={token}; }}; f"]


# -- fetch: ERR in the first response --------------------------------------------------------


@pytest.mark.parametrize("version", ["2", "0"])
def test_unsupported_filter(limited: Dev, tmp_path: Path, home: Path, version: str) -> None:
    url = f"{limited.url}/errors/filter-{version}.git"
    run(["push", "-q", url, "main"], source(tmp_path, home), home)
    done = run(["-c", f"protocol.version={version}", "clone", "-q",
                "--filter=object:type=blob", url, "c"], tmp_path, home, ok=False)  # fmt: skip
    assert lines(done)[0] == "fatal: remote error: filter 'object:type=blob' is not supported"


@pytest.mark.parametrize("version", ["2", "0"])
def test_too_many_wants(limited: Dev, tmp_path: Path, home: Path, version: str) -> None:
    """Three commits by id, one ref: over ``max(protocol_wants_max, refs)`` = 2."""
    src = source(tmp_path, home)
    url = f"{limited.url}/errors/wants-{version}.git"
    run(["push", "-q", url, "main"], src, home)
    oids = run(["rev-list", "main"], src, home).stdout.decode().split()
    dest = tmp_path / "dest"
    run(["init", "-q", str(dest)], tmp_path, home)
    done = run(["-c", f"protocol.version={version}", "fetch", "-q", url, *oids], dest, home,
               ok=False)  # fmt: skip
    assert lines(done)[0] == (
        f"fatal: remote error: upload-pack: more than {WANTS_MAX} distinct wants in one request "
        "(the limit is protocol_wants_max, or the repository's ref count when that is larger)"
    ), lines(done)


def test_missing_repository(limited: Dev, tmp_path: Path, home: Path) -> None:
    url = f"{limited.url}/errors/missing.git"
    done = run(["clone", "-q", url, "c"], tmp_path, home, ok=False)
    assert f"fatal: repository '{url}/' not found" in lines(done), lines(done)


# -- push: the report -------------------------------------------------------------------------


def test_push_over_the_pack_limit(limited: Dev, tmp_path: Path, home: Path) -> None:
    src = source(tmp_path, home, commits=1)
    (src / "big.bin").write_bytes(bytes(range(256)) * 1000 + b"".join(
        i.to_bytes(4, "big") for i in range(100_000)))  # fmt: skip
    run(["add", "big.bin"], src, home)
    run(["commit", "-q", "-m", "big"], src, home)
    url = f"{limited.url}/errors/big.git"
    done = run(["push", url, "main"], src, home, ok=False)
    assert lines(done) == [
        "error: remote unpack failed: the pack is over the limit of "
        f"{PACK_BYTES_MAX} bytes (limits.ingest_pack_bytes_max)",
        f"To {url}",
        " ! [remote rejected] main -> main (unpacker error)",
        f"error: failed to push some refs to '{url}'",
    ]
    assert "Everything up-to-date" not in done.stderr.decode()


def test_refused_ref_update(limited: Dev, tmp_path: Path, home: Path) -> None:
    """receive-pack refuses a one-level name outside a delete (receive-pack.c ``update``)."""
    url = f"{limited.url}/errors/funny.git"
    done = run(["push", url, "main:refs/foo"], source(tmp_path, home), home, ok=False)
    assert lines(done) == [
        f"To {url}",
        " ! [remote rejected] main -> refs/foo (funny refname)",
        f"error: failed to push some refs to '{url}'",
    ]


# -- auth: HTTP statuses git reads ------------------------------------------------------------


def test_unknown_token(guarded: Dev, tmp_path: Path, home: Path) -> None:
    url = f"{guarded.url}/errors/auth.git"
    done = run([*helper("tok-wrong-0123456789abcdef"), "clone", "-q", url, "c"], tmp_path, home,
               ok=False)  # fmt: skip
    assert f"fatal: Authentication failed for '{url}/'" in lines(done), lines(done)


def test_read_token_cannot_push(guarded: Dev, tmp_path: Path, home: Path) -> None:
    url = f"{guarded.url}/errors/readonly.git"
    done = run([*helper(READER), "push", "-q", url, "main"], source(tmp_path, home), home,
               ok=False)  # fmt: skip
    assert f"fatal: unable to access '{url}/': The requested URL returned error: 403" in lines(
        done
    ), lines(done)


def test_an_authenticated_push_logs_no_warning(guarded: Dev, tmp_path: Path, home: Path) -> None:
    """git's first, unauthenticated request is answered 401 and logged at INFO at most."""
    url = f"{guarded.url}/errors/logged-{next(_names)}.git"
    run([*helper(ADMIN), "push", "-q", url, "main"], source(tmp_path, home), home)
    run([*helper(ADMIN), "ls-remote", url], tmp_path, home)
    logged = "".join(p.read_text(errors="replace") for p in guarded.root.rglob("*.log"))
    assert logged, "no log under the server's data directory"
    repo = url.removeprefix(guarded.url + "/").removesuffix(".git")
    probes = [
        line for line in logged.splitlines() if "missing_credentials" in line and repo in line
    ]
    assert probes, "the 401 to git's first request is not logged at all"
    assert not [line for line in probes if "WARNING" in line.upper()], probes
