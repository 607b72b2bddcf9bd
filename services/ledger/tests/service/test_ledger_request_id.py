"""Caller request ids on Propose (docs/rpc.md, Propose; docs/raft.md, "Applying each id once").

A caller that retries a write under the same id, on this member or another, must
hear the first apply's answer, not the refusal of a compare-and-swap the first
copy already did; a wrong-sized id is refused before the log.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    Commit,
    OutcomeCode,
    RefStatus,
    RefUpdate,
    decode_change,
    encode_command,
)
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, write_config  # noqa: E402
from test_ledger_service import create, expect_error  # noqa: E402

MAIN = b"refs/heads/main"
T = 10.0


def oid(n: int) -> ObjectId:
    return ObjectId(n.to_bytes(20, "big"))


def commit(old: ObjectId | None, new: ObjectId | None, stamp_us: int = 1_000_000) -> bytes:
    return encode_command(Commit(1, (RefUpdate(MAIN, old, new),), None, stamp_us, True))


def propose(p: LedgerProc, cmd: bytes, rid: bytes) -> ledger_pb2.ProposeResponse:
    req = ledger_pb2.ProposeRequest(repo="r/x", incarnation=1, command=cmd, request_id=rid)
    resp: ledger_pb2.ProposeResponse = p.ledger.Propose(req, timeout=T)
    return resp


def head(p: LedgerProc) -> tuple[int, int]:
    d = p.ledger.Describe(ledger_pb2.DescribeRequest(repo="r/x"), timeout=T)
    return d.state.incarnation, d.state.version


def test_a_copy_under_the_same_id_gets_the_first_answer_also_after_restart(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    cfg = write_config(tmp_path / "l.yaml", node_id=1, data=tmp_path / "d", store=tmp_path / "s")
    p = LedgerProc(cfg).start()
    procs.append(p)
    create(p, "r/x")
    rid = secrets.token_bytes(16)
    first = propose(p, commit(None, oid(1)), rid)
    assert decode_change(first.effects).outcome.code is OutcomeCode.OK
    # the replay of a push: same id, a command built again (other stamp); its CAS would fail
    again = propose(p, commit(None, oid(1), stamp_us=2_000_000), rid)
    assert (again.version, again.effects) == (first.version, first.effects)
    assert head(p)[1] == first.version  # nothing applied twice
    # another id is another write: the same stale CAS is refused as stale
    other = decode_change(propose(p, commit(None, oid(1)), secrets.token_bytes(16)).effects)
    assert [r.status for r in other.refs] == [RefStatus.STALE]
    expect_error(
        "invalid_argument",
        p.ledger.Propose,
        ledger_pb2.ProposeRequest(
            repo="r/x", incarnation=1, command=commit(oid(1), oid(2)), request_id=b"short"
        ),
    )
    assert head(p)[1] == first.version + 1  # the stale entry only

    assert p.stop() == 0
    p2 = LedgerProc(cfg).start()
    procs.append(p2)
    late = propose(p2, commit(None, oid(1), stamp_us=3_000_000), rid)
    change = decode_change(late.effects)
    # the outcome (and version) of the first apply; per-ref results may be gone
    assert late.version == first.version and change.outcome.code is OutcomeCode.OK
    assert all(r.status is RefStatus.OK for r in change.refs)
    assert head(p2)[1] == first.version + 1
