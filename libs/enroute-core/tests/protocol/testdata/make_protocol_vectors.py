"""Regenerate the wire-protocol golden vectors from real git (run by hand, review the diff).

    .venv/bin/python libs/enroute-core/tests/protocol/testdata/make_protocol_vectors.py

Builds a small repository with fixed identities and dates (``main`` with two
commits, ``feature``, an annotated tag ``v1`` and a lightweight tag ``light``),
then records:

- ``<service>-<v0|v2>.adv``: ``git <service> --advertise-refs --stateless-rpc``
  (what ``git http-backend`` sends after its ``# service=`` preamble); also for
  an empty repository (``empty-*.adv``);
- ``*.req``: request bodies written by real clients, captured with a
  ``tee`` in front of the server (``--upload-pack``/``--receive-pack``);
- ``*.resp``: git's own response to a captured request, for comparison.

The capture repository's refs are written to ``refs.txt`` (``<hex> <name>``,
one a line, peeled tags as ``<name>^{}``) so tests can rebuild the same state.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from enroute_core.git.pktline import DELIM_PKT, FLUSH_PKT, pkt_text
from enroute_testing.gitcli import git_env

HERE = Path(__file__).resolve().parent


def _git(args: list[str], cwd: Path, home: Path, *, stdin: bytes = b"", proto: str = "") -> bytes:
    env = git_env(home)
    if proto:
        env["GIT_PROTOCOL"] = proto
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, input=stdin, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {args} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout


def _make_repo(root: Path, home: Path) -> Path:
    work = root / "work"
    work.mkdir()
    _git(["init", "-q", "-b", "main", "."], work, home)
    (work / "a.txt").write_bytes(b"one\n")
    _git(["add", "a.txt"], work, home)
    _git(["commit", "-q", "-m", "first"], work, home)
    _git(["tag", "-a", "-m", "release one", "v1"], work, home)
    _git(["tag", "light"], work, home)
    _git(["branch", "feature"], work, home)
    (work / "a.txt").write_bytes(b"two\n")
    _git(["commit", "-q", "-am", "second"], work, home)
    bare = root / "repo.git"
    _git(["clone", "-q", "--bare", str(work), str(bare)], root, home)
    _git(["config", "receive.advertisePushOptions", "true"], bare, home)
    _git(["config", "uploadpack.allowFilter", "true"], bare, home)
    return bare


def _write(name: str, data: bytes) -> None:
    (HERE / name).write_bytes(data)


def _read(name: str) -> bytes:
    return (HERE / name).read_bytes()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        home = root / "home"
        home.mkdir()
        bare = _make_repo(root, home)
        refs = _git(["show-ref", "--head", "-d"], bare, home)
        _write("refs.txt", refs)
        for service in ("upload-pack", "receive-pack"):
            adv = _git([service, "--advertise-refs", "--stateless-rpc", "."], bare, home)
            _write(f"{service}-v0.adv", adv)
        adv2 = _git(
            ["upload-pack", "--advertise-refs", "--stateless-rpc", "."],
            bare,
            home,
            proto="version=2",
        )
        _write("upload-pack-v2.adv", adv2)
        empty = root / "empty.git"
        _git(["init", "-q", "--bare", "-b", "main", str(empty)], root, home)
        for service in ("upload-pack", "receive-pack"):
            adv = _git([service, "--advertise-refs", "--stateless-rpc", "."], empty, home)
            _write(f"empty-{service}-v0.adv", adv)

        # git's stateless answers to requests we build by hand in the tests.
        lsrefs = b"".join(
            [
                pkt_text(b"command=ls-refs"),
                pkt_text(b"agent=git/2.39.5"),
                pkt_text(b"object-format=sha1"),
                DELIM_PKT,
                pkt_text(b"peel"),
                pkt_text(b"symrefs"),
                pkt_text(b"unborn"),
                pkt_text(b"ref-prefix HEAD"),
                pkt_text(b"ref-prefix refs/heads/"),
                pkt_text(b"ref-prefix refs/tags/"),
                FLUSH_PKT,
            ]
        )
        _write("ls-refs.req", lsrefs)
        _write(
            "ls-refs.resp",
            _git(
                ["upload-pack", "--stateless-rpc", "."], bare, home, stdin=lsrefs, proto="version=2"
            ),
        )

        # Client requests, captured on their way into the server.
        cap = root / "cap"
        cap.mkdir()
        clone_v2 = root / "clone-v2"
        _git(
            [
                "-c",
                "protocol.version=2",
                "clone",
                "-q",
                "--no-local",
                "--depth=1",
                "--filter=blob:none",
                "--upload-pack",
                f"tee {cap}/clone-v2.req | git-upload-pack",
                str(bare),
                str(clone_v2),
            ],
            root,
            home,
        )
        _write("clone-v2.req", (cap / "clone-v2.req").read_bytes())
        clone_v0 = root / "clone-v0"
        _git(
            [
                "-c",
                "protocol.version=0",
                "clone",
                "-q",
                "--no-local",
                "--upload-pack",
                f"tee {cap}/clone-v0.req | git-upload-pack",
                str(bare),
                str(clone_v0),
            ],
            root,
            home,
        )
        _write("clone-v0.req", (cap / "clone-v0.req").read_bytes())
        for version in ("0", "2"):
            old = root / f"old{version}"
            _git(["clone", "-q", "--no-local", str(bare), str(old)], root, home)
        before_push = root / "before-push.git"
        shutil.copytree(bare, before_push)
        # A push: a new commit on main, a new branch, and a delete of feature.
        (clone_v0 / "b.txt").write_bytes(b"three\n")
        _git(["add", "b.txt"], clone_v0, home)
        _git(["commit", "-q", "-m", "third"], clone_v0, home)
        _git(
            [
                "push",
                "-q",
                "--atomic",
                "--push-option=ci.skip",
                "--receive-pack",
                f"tee {cap}/push.req | git-receive-pack",
                "origin",
                "main",
                "main:refs/heads/topic",
                ":refs/heads/feature",
            ],
            clone_v0,
            home,
        )
        push = (cap / "push.req").read_bytes()
        _write("push.req", push)
        _write(
            "push.resp",
            _git(["receive-pack", "--stateless-rpc", "."], before_push, home, stdin=push),
        )
        # Fetches with haves from a clone that predates the push.
        for version in ("0", "2"):
            _git(
                [
                    "-c",
                    f"protocol.version={version}",
                    "fetch",
                    "-q",
                    "--upload-pack",
                    f"tee {cap}/fetch-v{version}.req | git-upload-pack",
                    "origin",
                ],
                root / f"old{version}",
                home,
            )
            _write(f"fetch-v{version}.req", (cap / f"fetch-v{version}.req").read_bytes())
        # git's stateless answers to the captured fetches, after the push.
        _write(
            "fetch-v0.resp",
            _git(["upload-pack", "--stateless-rpc", "."], bare, home, stdin=_read("fetch-v0.req")),
        )
        for name in ("fetch-v2", "clone-v2"):
            body = _read(f"{name}.req")
            fetch = body[body.index(b"0011command=fetch") :]
            _write(
                f"{name}.resp",
                _git(
                    ["upload-pack", "--stateless-rpc", "."],
                    bare if name == "fetch-v2" else before_push,
                    home,
                    stdin=fetch,
                    proto="version=2",
                ),
            )


if __name__ == "__main__":
    main()
