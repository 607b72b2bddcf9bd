"""The repository state, its log commands and checkpoint codec.

Shared by the ledger, which applies committed log entries, and computes, which
apply the same commands to their views (DESIGN, "Inside the core library").
Rules: ``docs/state-machine.md``; byte layouts: ``docs/formats/state.md``.
"""

from enroute_core.state.apply import apply
from enroute_core.state.codec import (
    decode_change,
    decode_command,
    decode_ref_value,
    decode_state,
    encode_change,
    encode_command,
    encode_ref_value,
    encode_state,
)
from enroute_core.state.commands import (
    Activate,
    Command,
    Commit,
    Delete,
    NewLayer,
    PlacedLayer,
    RefUpdate,
    ReplaceLayers,
    added_layers,
    check_command,
)
from enroute_core.state.effects import (
    ApplyResult,
    Change,
    Created,
    Deleted,
    Effect,
    HeadChanged,
    LastPushChanged,
    LayersChanged,
    Outcome,
    OutcomeCode,
    PinsChanged,
    RefChanged,
    RefResult,
    RefStatus,
    UploadGenAdvanced,
)
from enroute_core.state.follow import apply_change
from enroute_core.state.model import (
    DEFAULT_UPLOAD_WINDOW,
    ID_SPACE,
    MISSING,
    LayerEntry,
    LayerKind,
    RefValue,
    RepoState,
    state_problem,
)

__all__ = [
    "DEFAULT_UPLOAD_WINDOW",
    "ID_SPACE",
    "MISSING",
    "Activate",
    "ApplyResult",
    "Change",
    "Command",
    "Commit",
    "Created",
    "Delete",
    "Deleted",
    "Effect",
    "HeadChanged",
    "LastPushChanged",
    "LayerEntry",
    "LayerKind",
    "LayersChanged",
    "NewLayer",
    "Outcome",
    "OutcomeCode",
    "PinsChanged",
    "PlacedLayer",
    "RefChanged",
    "RefResult",
    "RefStatus",
    "RefUpdate",
    "RefValue",
    "ReplaceLayers",
    "RepoState",
    "UploadGenAdvanced",
    "added_layers",
    "apply",
    "apply_change",
    "check_command",
    "decode_change",
    "decode_command",
    "decode_ref_value",
    "decode_state",
    "encode_change",
    "encode_command",
    "encode_ref_value",
    "encode_state",
    "state_problem",
]
