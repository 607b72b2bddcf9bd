"""A real ledger process refuses an inline layer whose bytes do not hash to its root.

Seed 004, "Storage service", Read: an inline layer is read "after it checks them
against the root"; rule ``inline.root`` of the state machine (docs/state-machine.md)
applies it on the way into the log. The refusal is ``corrupt_data``, nothing of the
command is applied (the ref stays, no layer joins the manifest), and the ledger logs
it once; a commit of the right bytes then applies.
"""

from __future__ import annotations

import sys
from pathlib import Path

import blake3

from enroute_core.state import (
    Commit,
    LayerKind,
    NewLayer,
    OutcomeCode,
    RefUpdate,
    decode_change,
    encode_command,
)
from enroute_testing.waiting import wait_until

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from conftest import LedgerProc, write_config  # noqa: E402
from test_ledger_service import MAIN, create, oid, propose  # noqa: E402


def _commit(data: bytes, root: bytes) -> bytes:
    layer = NewLayer(LayerKind.INLINE, 1, len(data), 10, root, data=data)
    return encode_command(Commit(1, (RefUpdate(MAIN, None, oid(1)),), layer, 1_000_000, True))


def test_inline_bytes_that_miss_their_root_are_refused_and_logged(
    tmp_path: Path, procs: list[LedgerProc]
) -> None:
    cfg = write_config(tmp_path / "l.yaml", node_id=1, data=tmp_path / "d", store=tmp_path / "s")
    p = LedgerProc(cfg).start()
    procs.append(p)
    assert create(p, "inline/root").state.incarnation == 1
    data = bytes(range(256)) * 4
    root = blake3.blake3(data).digest()
    flipped = bytes([data[0] ^ 1]) + data[1:]

    refused = propose(p, "inline/root", 1, _commit(flipped, root))
    change = decode_change(refused.effects)
    assert change.outcome.code is OutcomeCode.CORRUPT_DATA, change.outcome
    assert change.outcome.code.error_code == "corrupt_data"
    assert not change.effects  # no ref moved, no layer joined the manifest
    wait_until(
        lambda: any("refused: inline layer" in line for line in p.stderr),
        10,
        "the refusal in the log",
        explain=lambda: "".join(p.stderr)[-3000:],
    )
    assert sum("refused: inline layer" in line for line in p.stderr) == 1

    applied = propose(p, "inline/root", 1, _commit(data, root))
    change = decode_change(applied.effects)
    assert change.outcome.code is OutcomeCode.OK
    assert {type(e).__name__ for e in change.effects} >= {"RefChanged", "LayersChanged"}
