"""Regenerate the golden vectors of the state codec (run by hand, then review the diff).

    .venv/bin/python libs/enroute-core/tests/state/testdata/make_state_vectors.py

Writes ``<name>.bin`` for every entry of :func:`vectors`: log commands of each
kind, checkpoints of a live and a deleted state built by applying commands,
the changes (outcome, per-ref results, effects) those entries produced, one
of them refused, and one state-store ref value. ``test_codec.py`` checks that encoding the same
values gives these bytes and that decoding the bytes gives the values back.
"""

from __future__ import annotations

from pathlib import Path

import blake3

from enroute_core.base.ids import ObjectId
from enroute_core.state import (
    MISSING,
    Activate,
    Change,
    Command,
    Commit,
    Delete,
    LayerKind,
    NewLayer,
    PlacedLayer,
    RefUpdate,
    RefValue,
    ReplaceLayers,
    RepoState,
    apply,
    encode_change,
    encode_command,
    encode_ref_value,
    encode_state,
)

HERE = Path(__file__).resolve().parent

A, B, C = (ObjectId(bytes([i]) * 20) for i in (0xA1, 0xB2, 0xC3))
T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds


def _root(i: int) -> bytes:
    return bytes([i]) * 32


INLINE_DATA = b"LAYER!"
INLINE_ROOT = blake3.blake3(INLINE_DATA).digest()  # rule inline.root


def commands() -> dict[str, Command]:
    return {
        "activate-create": Activate(create=True, head=b"refs/heads/main", upload_window=64),
        "activate-implicit": Activate(create=True, head=None, upload_window=64),
        "commit-push-inline": Commit(
            incarnation=1,
            ref_updates=(
                RefUpdate(b"refs/heads/main", None, A),
                RefUpdate(b"refs/tags/v1", None, B),
            ),
            new_layer=NewLayer(LayerKind.INLINE, 3, 6, 4, INLINE_ROOT, data=INLINE_DATA),
            stamp_us=T0,
            is_push=True,
            atomic=False,
        ),
        "commit-api-stored": Commit(
            incarnation=1,
            ref_updates=(
                RefUpdate(b"refs/heads/main", A, C),
                RefUpdate(b"refs/tags/v1", B, None),
                RefUpdate(b"refs/heads/next", None, B),
            ),
            new_layer=NewLayer(LayerKind.STORED, 2, 4096, 1024, _root(0x22), upload_gen=65),
            stamp_us=T0 + 1,
            is_push=False,
            atomic=True,
        ),
        "replace-layers": ReplaceLayers(
            incarnation=1,
            run_first_id=0,
            run_roots=(INLINE_ROOT, _root(0x22)),
            outputs=(
                PlacedLayer(0, 5, NewLayer(LayerKind.STORED, 4, 8192, 2048, _root(0x33), 66)),
            ),
        ),
        "delete": Delete(incarnation=1),
    }


def _history() -> tuple[dict[str, RepoState], dict[str, Change]]:
    cmds = commands()
    stale = Commit(1, (RefUpdate(b"refs/heads/main", B, A),), None, T0 + 2, True, True)
    steps: list[tuple[str, Command]] = [
        ("claim", cmds["activate-create"]),
        ("push", cmds["commit-push-inline"]),
        ("api", cmds["commit-api-stored"]),
        ("stale", stale),
        ("delete", cmds["delete"]),
    ]
    state = MISSING
    states, changes = {}, {}
    for index, (name, cmd) in enumerate(steps, start=1):
        result = apply(state, cmd, log_index=index)
        changes[f"change-{name}"] = result.change
        state = result.state
        if name == "stale":
            states["checkpoint-live"] = state
    states["checkpoint-deleted"] = state
    return states, changes


def states() -> dict[str, RepoState]:
    return _history()[0]


def changes() -> dict[str, Change]:
    return _history()[1]


def vectors() -> dict[str, bytes]:
    out = {name: encode_command(cmd) for name, cmd in commands().items()}
    out.update({name: encode_state(state) for name, state in states().items()})
    out.update({name: encode_change(change) for name, change in changes().items()})
    out["ref-value"] = encode_ref_value(RefValue(A, T0))
    return out


def main() -> None:
    for name, data in vectors().items():
        (HERE / f"{name}.bin").write_bytes(data)


if __name__ == "__main__":
    main()
