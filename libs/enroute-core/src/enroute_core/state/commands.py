"""The log commands of the repository state (DESIGN, "Repository state": log commands).

``activate(create, head)``, ``commit(incarnation, ref updates, optional new
layer, stamp, is_push)``, ``replace_layers(run, outputs)`` and
``delete(incarnation)``. Every compute command names the incarnation its
snapshot came from (seed 001, "Commands prepared against a deleted
incarnation").

:func:`command_problem` checks what a command says on its own (field domains,
duplicate refs); what depends on the state (compare-and-swap, the upload
window, the manifest, ref-name rules) is decided by ``apply`` and reported as
an outcome. The encoder refuses a command with a problem, and the decoder
refuses bytes that decode to one.
"""

from __future__ import annotations

from dataclasses import dataclass

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import ObjectId
from enroute_core.state.model import (
    DEFAULT_UPLOAD_WINDOW,
    ID_SPACE,
    ROOT_BYTES,
    U32_MAX,
    U64_MAX,
    LayerKind,
    oid_problem,
    time_problem,
)

NAME_BYTES_MAX = 0xFFFF
"""Ref names and HEAD are length-prefixed with a u16 in every encoding."""


@dataclass(frozen=True, slots=True)
class RefUpdate:
    """Compare-and-swap of one ref: ``old_oid`` None means "must not exist",
    ``new_oid`` None deletes it. Both None succeeds when the ref is absent and
    changes nothing (git: deleting a non-existent ref)."""

    name: bytes
    old_oid: ObjectId | None
    new_oid: ObjectId | None


@dataclass(frozen=True, slots=True)
class NewLayer:
    """A layer a command adds. ``data`` is the whole file of an inline layer (the log entry
    holds the bytes); a stored layer has none and names the ``upload_gen`` it was
    uploaded with."""

    kind: LayerKind
    object_count: int
    file_size: int
    meta_size: int
    root: bytes
    upload_gen: int = 0
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class PlacedLayer:
    """An output of ``replace_layers``: a merged layer with the id range it keeps."""

    first_id: int
    id_count: int
    layer: NewLayer


@dataclass(frozen=True, slots=True)
class Activate:
    """Seed 001, "Creation". ``head`` None is an implicit create (a push): HEAD starts at
    ``refs/heads/main`` and is repaired; a head (CreateRepository) is kept.
    ``upload_window`` is the proposer's ``layers.upload_window``; it is fixed in the
    state so that every replica computes the same window."""

    create: bool
    head: bytes | None = None
    upload_window: int = DEFAULT_UPLOAD_WINDOW


@dataclass(frozen=True, slots=True)
class Commit:
    """Ref updates plus an optional pushed layer.

    ``stamp_us`` is the proposing compute's clock: every ref the commit sets gets
    it as its set time, and a push (``is_push``) that moves a ref records it as
    the last push (seed 001, "Last push", "Ref update times"). ``atomic``
    commits apply all ref updates or none; otherwise each ref succeeds or fails
    on its own (git's non-atomic push).
    """

    incarnation: int
    ref_updates: tuple[RefUpdate, ...]
    new_layer: NewLayer | None
    stamp_us: int
    is_push: bool
    atomic: bool = True


@dataclass(frozen=True, slots=True)
class ReplaceLayers:
    """Flush or compaction (seed 004, "Stable object numbering": Assignment).

    The run is the consecutive manifest layers starting at ``run_first_id`` whose
    roots are ``run_roots``, in order; naming the roots makes a run that changed
    under the merge fail instead of replacing layers the merge never read.
    """

    incarnation: int
    run_first_id: int
    run_roots: tuple[bytes, ...]
    outputs: tuple[PlacedLayer, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    """Seed 001, "Deletion": the tombstone of incarnation ``incarnation``."""

    incarnation: int


Command = Activate | Commit | ReplaceLayers | Delete


def added_layers(cmd: Command | None) -> tuple[NewLayer, ...]:
    """The layers ``cmd`` adds to the manifest: a commit's new layer, a replacement's
    outputs (an inline one carries its file, which the entry pins)."""
    if isinstance(cmd, Commit) and cmd.new_layer is not None:
        return (cmd.new_layer,)
    if isinstance(cmd, ReplaceLayers):
        return tuple(out.layer for out in cmd.outputs)
    return ()


def new_layer_problem(layer: NewLayer) -> str | None:
    if not isinstance(layer.kind, LayerKind):
        return "unknown layer kind"
    if not 1 <= layer.object_count <= ID_SPACE:
        return f"object_count {layer.object_count} is not within 1 .. 2**32"
    if not 0 < layer.file_size <= U64_MAX or not 0 <= layer.meta_size <= layer.file_size:
        return "file_size must be positive and meta_size at most file_size"
    if len(layer.root) != ROOT_BYTES:
        return f"root is {len(layer.root)} bytes, not {ROOT_BYTES}"
    if layer.kind is LayerKind.INLINE:
        if layer.upload_gen != 0:
            return "an inline layer has no upload generation"
        if len(layer.data) != layer.file_size:
            return "an inline layer carries exactly file_size bytes"
    else:
        if layer.data:
            return "a stored layer carries no bytes"
        if not 0 <= layer.upload_gen <= U64_MAX:
            return "upload_gen is out of range"
    return None


def _incarnation_problem(incarnation: int) -> str | None:
    if not 1 <= incarnation <= U64_MAX:
        return f"incarnation {incarnation} is not within 1 .. 2**64-1"
    return None


def _commit_problem(cmd: Commit) -> str | None:
    problem = _incarnation_problem(cmd.incarnation) or time_problem(cmd.stamp_us)
    if problem is not None:
        return problem
    seen: set[bytes] = set()
    for update in cmd.ref_updates:
        if len(update.name) > NAME_BYTES_MAX:
            return "a ref name is longer than 65535 bytes"
        if update.name in seen:
            return f"ref {update.name[:100]!r} is updated twice"
        seen.add(update.name)
        for oid in (update.old_oid, update.new_oid):
            if oid is not None and (problem := oid_problem(oid)) is not None:
                return f"ref {update.name[:100]!r}: {problem}"
    if cmd.new_layer is not None:
        return new_layer_problem(cmd.new_layer)
    return None


def _replace_problem(cmd: ReplaceLayers) -> str | None:
    problem = _incarnation_problem(cmd.incarnation)
    if problem is not None:
        return problem
    if not cmd.run_roots:
        return "the run is empty"
    if not 0 <= cmd.run_first_id < ID_SPACE:
        return "run_first_id is outside the id space"
    if any(len(root) != ROOT_BYTES for root in cmd.run_roots):
        return f"a run root is not {ROOT_BYTES} bytes"
    for out in cmd.outputs:
        if not 0 <= out.first_id < ID_SPACE or not 1 <= out.id_count <= ID_SPACE - out.first_id:
            return f"output range {out.first_id}+{out.id_count} is empty or past the id space"
        problem = new_layer_problem(out.layer)
        if problem is None and out.layer.object_count > out.id_count:
            problem = "an output holds more objects than ids"
        if problem is not None:
            return f"output at id {out.first_id}: {problem}"
    return None


def command_problem(cmd: Command) -> str | None:
    """Why ``cmd`` is malformed on its own, or None (see the module docstring)."""
    if isinstance(cmd, Activate):
        if not 1 <= cmd.upload_window <= U32_MAX:
            return f"upload_window {cmd.upload_window} is not within 1 .. 2**32-1"
        if cmd.head is not None and len(cmd.head) > NAME_BYTES_MAX:
            return "head is longer than 65535 bytes"
        return None
    if isinstance(cmd, Commit):
        return _commit_problem(cmd)
    if isinstance(cmd, ReplaceLayers):
        return _replace_problem(cmd)
    if isinstance(cmd, Delete):
        return _incarnation_problem(cmd.incarnation)
    return f"not a state command: {type(cmd).__name__}"


def check_command(cmd: Command) -> None:
    """Raise :class:`InvalidArgument` (``details.reason``) when ``cmd`` has a problem."""
    problem = command_problem(cmd)
    if problem is not None:
        raise InvalidArgument(
            f"invalid {type(cmd).__name__} command: {problem}",
            command=type(cmd).__name__,
            reason=problem,
        )
