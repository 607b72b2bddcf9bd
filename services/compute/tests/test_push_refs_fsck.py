"""Push commands refused one by one, and the receive fsck policy, through :class:`Pusher`.

receive-pack.c (``update``, ``execute_commands_atomic``): a ref name git will
not touch is ``ng <ref> funny refname`` for that command alone, or every
command fails with ``atomic``; docs/security.md. The policy pushes are checked
with comes from ``receive.fsck`` (enroute_core.config) through the host.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Sequence

import pytest

from enroute_compute.host import RepositoryHost
from enroute_compute.http import OpsServer
from enroute_compute.main import SystemClock
from enroute_compute.push import Pusher
from enroute_core.base.errors import NotFound
from enroute_core.config import load_config
from enroute_core.git.fsck import RECEIVE_POLICY, FsckPolicy
from enroute_core.git.object_type import ObjectType
from enroute_core.git.packwrite import write_pack
from enroute_core.git.pktline import FLUSH_PKT, pkt_line
from enroute_testing.local_ledger import LocalLedger

ZERO = b"0" * 40
IDENT = b"A U Thor <a@example.com> 1700000000 +0000"
BLOB = b"hello\n"


def _oid(type_num: int, body: bytes) -> bytes:
    name = ObjectType(type_num).type_name
    return hashlib.sha1(name + b" %d\0" % len(body) + body).hexdigest().encode()


def _commit_over(mode: bytes) -> tuple[bytes, bytes]:
    """(pack, commit hex) of a commit over a one-entry tree of ``mode``."""
    tree = mode + b" a\0" + bytes.fromhex(_oid(3, BLOB).decode())
    commit = b"tree " + _oid(2, tree) + b"\nauthor " + IDENT + b"\ncommitter " + IDENT + b"\n\nm\n"
    return write_pack([(3, BLOB), (2, tree), (1, commit)]), _oid(1, commit)


def _body(commands: Sequence[tuple[bytes, bytes]], pack: bytes, caps: bytes) -> bytes:
    lines = []
    for i, (new, ref) in enumerate(commands):
        line = ZERO + b" " + new + b" " + ref + (b"\0" + caps if i == 0 else b"")
        lines.append(pkt_line(line + b"\n"))
    return b"".join(lines) + FLUSH_PKT + pack


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _push(
    commands: Sequence[tuple[bytes, bytes]],
    pack: bytes,
    *,
    caps: bytes = b"report-status",
    fsck: FsckPolicy = RECEIVE_POLICY,
) -> tuple[list[bytes], dict[bytes, bytes] | None]:
    """Report lines, and the repository's refs after (None: it was not created)."""

    async def run() -> tuple[list[bytes], dict[bytes, bytes] | None]:
        host = RepositoryHost(LocalLedger(), None, SystemClock(), fsck=fsck)
        try:
            body = _body(commands, pack, caps)
            out = b"".join([p async for p in Pusher(host).receive_pack("r", _once(body))])
            try:
                snap = await host.read("r")
            except NotFound:
                refs = None
            else:
                refs = {k: v.oid.hex().encode() for k, v in snap.state.refs.items()}
        finally:
            await host.close()
        lines, pos = [], 0
        while pos < len(out):
            size = int(out[pos : pos + 4], 16)
            if size >= 4:
                lines.append(out[pos + 4 : pos + size].rstrip(b"\n"))
            pos += max(size, 4)
        return lines, refs

    return asyncio.run(run())


def test_mixed_push_lands_the_good_ref_and_refuses_the_funny_one() -> None:
    pack, tip = _commit_over(b"100644")
    lines, refs = _push([(tip, b"refs/heads/ok"), (tip, b"refs/heads/a..b")], pack)
    assert lines == [b"unpack ok", b"ok refs/heads/ok", b"ng refs/heads/a..b funny refname"]
    assert refs == {b"refs/heads/ok": tip}


def test_atomic_mixed_push_moves_nothing() -> None:
    pack, tip = _commit_over(b"100644")
    commands = [(tip, b"refs/heads/ok"), (tip, b"HEAD/x")]
    lines, refs = _push(commands, pack, caps=b"report-status atomic")
    assert lines == [
        b"unpack ok",
        b"ng refs/heads/ok atomic push failure",
        b"ng HEAD/x funny refname",
    ]
    assert refs is None  # not even created implicitly


def test_push_of_funny_refs_only_creates_nothing() -> None:
    pack, tip = _commit_over(b"100644")
    lines, refs = _push([(tip, b"refs/foo"), (tip, b"refs/heads/x\x01")], pack)
    assert lines == [
        b"unpack ok",
        b"ng refs/foo funny refname",
        b"ng refs/heads/x\x01 funny refname",
    ]
    assert refs is None


def test_receive_fsck_setting_reaches_the_push() -> None:
    """zeroPaddedFilemode is harmless by default (docs/security.md): the push lands, and
    with side-band the pusher is told; ``receive.fsck`` raising it to error refuses it,
    the error naming the id and the setting that lowers it."""
    pack, tip = _commit_over(b"0100644")
    tree_hex = _oid(2, b"0100644 a\0" + bytes.fromhex(_oid(3, BLOB).decode()))
    lines, refs = _push([(tip, b"refs/heads/main")], pack)
    assert lines == [b"unpack ok", b"ok refs/heads/main"]
    assert refs == {b"refs/heads/main": tip}
    caps = b"report-status side-band-64k quiet"  # quiet: no progress, warnings all the same
    lines, _ = _push([(tip, b"refs/heads/main")], pack, caps=caps)
    assert lines[0] == b"\x02warning: zeroPaddedFilemode: 1 object(s), e.g. " + tree_hex
    assert lines[1].startswith(b"\x01") and b"ok refs/heads/main" in lines[1]
    config = load_config("receive:\n  fsck:\n    zeroPaddedFilemode: error\n", {})
    lines, refs = _push([(tip, b"refs/heads/main")], pack, fsck=config.receive.fsck_policy())
    assert lines[0] == (
        b"unpack object " + tree_hex + b": zeroPaddedFilemode: contains zero-padded file modes"
        b" (refused; receive.fsck.zeroPaddedFilemode: warn lowers it)"
    )
    assert lines[1:] == [b"ng refs/heads/main unpacker error"]
    assert not refs


def test_warnings_are_counted_for_metrics_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """One push with a harmless problem: enroute_engine_fsck_warnings_total{msg_id} counts
    its objects, and one log line tells the operator (docs/observability.md)."""
    pack, tip = _commit_over(b"0100644")

    async def run() -> bytes:
        host = RepositoryHost(LocalLedger(), None, SystemClock())
        try:
            body = _body([(tip, b"refs/heads/main")], pack, b"report-status")
            async for _ in Pusher(host).receive_pack("r", _once(body)):
                pass
            return OpsServer(host, "c1", lambda: True).metrics_text()
        finally:
            await host.close()

    with caplog.at_level(logging.WARNING, logger="enroute_compute.push"):
        text = asyncio.run(run()).decode()
    assert 'enroute_engine_fsck_warnings_total{msg_id="zeroPaddedFilemode"} 1.0\n' in text
    logged = [r.getMessage() for r in caplog.records if "harmless fsck" in r.getMessage()]
    assert len(logged) == 1 and "push to r:" in logged[0] and "zeroPaddedFilemode: 1" in logged[0]


def test_duplicate_objects_are_refused() -> None:
    _, tip = _commit_over(b"100644")
    tree = b"100644 a\0" + bytes.fromhex(_oid(3, BLOB).decode())
    commit = b"tree " + _oid(2, tree) + b"\nauthor " + IDENT + b"\ncommitter " + IDENT + b"\n\nm\n"
    dup = write_pack([(3, BLOB), (3, BLOB), (2, tree), (1, commit)])
    lines, refs = _push([(tip, b"refs/heads/main")], dup)
    assert lines == [
        b"unpack the same object " + _oid(3, BLOB) + b" appears twice in the pack",
        b"ng refs/heads/main unpacker error",
    ]
    assert not refs
