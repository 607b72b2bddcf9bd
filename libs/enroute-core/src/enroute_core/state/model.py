"""The replicated state of one repository incarnation.

DESIGN, "Repository state (replicated through the log)"; seed 001
("Lifecycle": incarnations, deletion, re-creation); seed 004 ("Stable object
numbering": the manifest's id ranges and the 32-bit id space).

A :class:`RepoState` is a value: :func:`enroute_core.state.apply.apply` never
changes one, it returns the next. ``RepoState()`` is the state of a name that
was never created (incarnation 0). :func:`state_problem` names every invariant
that ``apply`` keeps; the checkpoint decoder refuses bytes that break one.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from enroute_core.base.ids import OID_BYTES, ZERO_OID, LogIndex, ObjectId
from enroute_core.git.refname import ref_name_problem
from enroute_core.state.refmap import RefMap

ID_SPACE = 1 << 32
"""Seed 004, "Id space": a 32-bit id per repository; ids are ``0 .. ID_SPACE - 1``."""
ROOT_BYTES = 32
"""BLAKE3 of the layer file (DESIGN, "Repository state")."""
DEFAULT_UPLOAD_WINDOW = 64
"""DESIGN: config ``layers.upload_window``."""
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
TIME_US_MAX = (1 << 63) - 1
"""Times are microseconds since the Unix epoch, kept below 2**63 so they fit a signed int64."""
BRANCH_PREFIX = b"refs/heads/"
REFS_PREFIX = b"refs/"


class LayerKind(enum.IntEnum):
    """Where a layer's bytes live: in the log entry that added it, or in the object store."""

    INLINE = 1
    STORED = 2


@dataclass(frozen=True, slots=True)
class RefValue:
    """A ref's object id and the time it was last set (seed 001, "Ref update times")."""

    oid: ObjectId
    set_time_us: int


@dataclass(frozen=True, slots=True)
class LayerEntry:
    """One manifest entry (DESIGN, "Repository state": manifest).

    ``upload_gen`` is meaningful for stored layers only (0 for inline ones);
    ``pin`` is the log index that holds an inline layer's bytes (0 for stored).
    """

    kind: LayerKind
    first_id: int
    id_count: int
    object_count: int
    upload_gen: int
    file_size: int
    meta_size: int
    root: bytes
    pin: LogIndex

    @property
    def end_id(self) -> int:
        """One past the last id of the range (holes included)."""
        return self.first_id + self.id_count

    @property
    def key(self) -> str | None:
        """The stored file's name under ``repos/<repo>/layers/`` (DESIGN, "Object store layout").

        ``<gen:016x>-<root:32 hex>.layer``: derived from ``upload_gen`` and the
        first 16 bytes of ``root`` rather than stored, so it cannot disagree
        with them. None for an inline layer.
        """
        if self.kind is not LayerKind.STORED:
            return None
        return f"{self.upload_gen:016x}-{self.root[:16].hex()}.layer"


def advancement(incarnation: int, deleted: bool, version: int) -> tuple[int, bool, int]:
    """Seed 001, "Listing": "the newest incarnation, deleted over live, then the newest
    version" wins; compare these keys with ``max``. One home for the rule: the ledger's
    states and the compute's merge of the voters' listing pages both order by it."""
    return (incarnation, deleted, version)


@dataclass(frozen=True, slots=True)
class RepoState:
    """The state of one repository incarnation; see the module docstring.

    ``upload_window`` is the window W fixed when the incarnation was claimed
    (carried by the activate command), so every replica and every sweep uses
    the same W whatever its local config says.

    ``refs`` is a :class:`~enroute_core.state.refmap.RefMap` in every state ``apply``,
    ``apply_change`` and ``decode_state`` make (any mapping is taken, and made one on
    the next change).
    """

    incarnation: int = 0
    deleted: bool = False
    version: int = 0
    head: bytes = b""
    head_kept: bool = False
    refs: Mapping[bytes, RefValue] = field(default_factory=RefMap)
    manifest: tuple[LayerEntry, ...] = ()
    next_id: int = 0
    upload_gen: int = 0
    upload_window: int = 0
    last_push_us: int | None = None

    # -- lifecycle (seed 001) ---------------------------------------------------------------

    @property
    def exists(self) -> bool:
        """False only for a name that was never created."""
        return self.incarnation > 0

    @property
    def live(self) -> bool:
        return self.incarnation > 0 and not self.deleted

    def is_superseded_by(self, other: RepoState) -> bool:
        """Seed 001: "A node that hosts E drops it when it hosts E + 1 (as a superseded
        incarnation)". ``other`` is usually the state object."""
        return other.incarnation > self.incarnation

    def is_ended_by(self, other: RepoState) -> bool:
        """Seed 001: a node drops E "once the object store says that E is deleted or
        superseded", and never joins an ended incarnation again."""
        return self.is_superseded_by(other) or (
            other.incarnation == self.incarnation and other.deleted
        )

    def advancement(self) -> tuple[int, bool, int]:
        """Seed 001, "Listing": see :func:`advancement`."""
        return advancement(self.incarnation, self.deleted, self.version)

    # -- upload window (DESIGN, "Repository state": upload_gen) ---------------------------

    def accepts_upload_gen(self, gen: int) -> bool:
        """``state.upload_gen - W < gen <= state.upload_gen``."""
        return self.upload_gen - self.upload_window < gen <= self.upload_gen

    @property
    def sweepable_gen_max(self) -> int:
        """Files unnamed by the manifest with ``gen <=`` this can never be committed."""
        return self.upload_gen - self.upload_window

    # -- manifest (seed 004, "Stable object numbering") ------------------------------------

    def pins(self) -> tuple[LogIndex, ...]:
        """Log indexes that inline layers hold back from truncation, in manifest order."""
        return tuple(e.pin for e in self.manifest if e.kind is LayerKind.INLINE)

    def layer_of_id(self, object_id: int) -> LayerEntry | None:
        """Seed 004: "Finding the layer of an id is a binary search over the ranges"."""
        i = bisect.bisect_right(self.manifest, object_id, key=lambda e: e.first_id) - 1
        if i < 0:
            return None
        entry = self.manifest[i]
        return entry if object_id < entry.end_id else None

    def layer_index(self, first_id: int) -> int | None:
        """Position of the layer whose range starts at ``first_id``."""
        i = bisect.bisect_left(self.manifest, first_id, key=lambda e: e.first_id)
        if i < len(self.manifest) and self.manifest[i].first_id == first_id:
            return i
        return None


MISSING = RepoState()
"""The state of a name that was never created."""


# -- invariants --------------------------------------------------------------------------------


def oid_problem(oid: bytes) -> str | None:
    if len(oid) != OID_BYTES:
        return f"object id is {len(oid)} bytes, not {OID_BYTES}"
    if oid == ZERO_OID:
        return "object id is the zero id (absence is None)"
    return None


def time_problem(time_us: int) -> str | None:
    if not 0 <= time_us <= TIME_US_MAX:
        return f"time {time_us} is outside 0 .. 2**63-1 microseconds"
    return None


def branch_problem(head: bytes) -> str | None:
    """Why ``head`` cannot be a symbolic HEAD target (a full branch ref), or None."""
    if not head.startswith(BRANCH_PREFIX) or len(head) == len(BRANCH_PREFIX):
        return "HEAD must name a branch under refs/heads/"
    return ref_name_problem(head)


def updatable_ref_problem(name: bytes) -> str | None:
    """Why a commit may not set ``name`` (git's check-ref-format, and only under refs/)."""
    if not name.startswith(REFS_PREFIX):
        return "is not under refs/"
    return ref_name_problem(name)


def layer_problem(entry: LayerEntry) -> str | None:
    """Why one manifest entry is malformed on its own, or None."""
    if not isinstance(entry.kind, LayerKind):
        return "unknown layer kind"
    if not 0 <= entry.first_id < ID_SPACE:
        return f"first_id {entry.first_id} is outside the id space"
    if not 1 <= entry.id_count <= ID_SPACE - entry.first_id:
        return f"id range {entry.first_id}+{entry.id_count} is empty or past the id space"
    if not 1 <= entry.object_count <= entry.id_count:
        return f"object_count {entry.object_count} is not within 1 .. id_count"
    if not 0 < entry.file_size <= U64_MAX or not 0 <= entry.meta_size <= entry.file_size:
        return "file_size must be positive and meta_size at most file_size"
    if len(entry.root) != ROOT_BYTES:
        return f"root is {len(entry.root)} bytes, not {ROOT_BYTES}"
    if entry.kind is LayerKind.INLINE:
        if entry.upload_gen != 0 or not 1 <= entry.pin <= U64_MAX:
            return "an inline layer has upload_gen 0 and a pin of at least 1"
    elif entry.pin != 0 or not 0 <= entry.upload_gen <= U64_MAX:
        return "a stored layer has pin 0 and a u64 upload_gen"
    return None


def ref_problem(name: bytes, value: RefValue) -> str | None:
    """Why one ref of a state is malformed, or None."""
    return updatable_ref_problem(name) or oid_problem(value.oid) or time_problem(value.set_time_us)


def state_problem(state: RepoState, *, refs: bool = True) -> str | None:
    """The first broken invariant of ``state``, or None. Every state ``apply`` returns is
    free of problems; checked in the property tests, and (``refs=False``: all but the
    refs, whose check is the one cost that grows with the repository) when a checkpoint
    is encoded or decoded (``docs/formats/state.md``, "Checkpoint")."""
    for field_name, number, top in (
        ("incarnation", state.incarnation, U64_MAX),
        ("version", state.version, U64_MAX),
        ("upload_gen", state.upload_gen, U64_MAX),
        ("upload_window", state.upload_window, U32_MAX),
        ("next_id", state.next_id, ID_SPACE),
    ):
        if not 0 <= number <= top:
            return f"{field_name} {number} is out of range"
    if not state.live:
        canonical = RepoState(
            incarnation=state.incarnation,
            deleted=state.deleted,
            version=state.version,
            upload_gen=state.upload_gen,
            upload_window=state.upload_window,
        )
        if state != canonical:
            return "a missing or deleted state holds nothing but its counters"
        if not state.exists and (state.deleted or state != MISSING):
            return "a missing state (incarnation 0) is all zero"
        return None
    if state.upload_window < 1 or state.version < 1:
        return "a live state has a window of at least 1 and a version of at least 1"
    problem = branch_problem(state.head)
    if problem is not None:
        return f"head {state.head!r}: {problem}"
    if state.last_push_us is not None and time_problem(state.last_push_us):
        return "last_push is out of range"
    for name, value in state.refs.items() if refs else ():
        problem = ref_problem(name, value)
        if problem is not None:
            return f"ref {name[:100]!r}: {problem}"
    end = 0
    for entry in state.manifest:
        problem = layer_problem(entry)
        if problem is None and entry.first_id < end:
            problem = "ranges are not ascending and disjoint"
        if problem is None and entry.end_id > state.next_id:
            problem = f"range ends past next_id {state.next_id}"
        if problem is None and entry.upload_gen > state.upload_gen:
            problem = "stored layer generation is above the state's upload_gen"
        if problem is not None:
            return f"layer at id {entry.first_id}: {problem}"
        end = entry.end_id
    return None
