"""Deterministic binary encoding of log commands, checkpoints, changes and ref values.

DESIGN, "Repository state" and "Freezing the ledger"; seed 001, "Ref update
times" (the state store keeps a ref's set time after its oid, 8 bytes).
``docs/formats/state.md`` has the same layout with examples.

Frame (all integers big-endian)::

    magic      4   "ENRC" (command) | "ENRS" (state checkpoint) | "ENRE" (change)
    format     1   1; nothing else is read
    kind       1   command: 1 activate, 2 commit, 3 replace_layers, 4 delete;
                   checkpoint: 1; change: 1
    reserved   2   zero
    body_len   8   bytes of body
    body       body_len
    crc32      4   zlib.crc32 of every byte before it

Command bodies::

    activate        flags u8 (1 create, 2 has head) | upload_window u32
                    | [head_len u16 | head]
    commit          incarnation u64 | stamp_us u64
                    | flags u8 (1 is_push, 2 atomic, 4 has layer)
                    | update_count u32 | update * | [new layer]
      update        flags u8 (1 has old, 2 has new) | name_len u16 | name
                    | [old oid 20] | [new oid 20]
      new layer     kind u8 (1 inline, 2 stored) | object_count u64 | upload_gen u64
                    | file_size u64 | meta_size u64 | root 32 | data_len u64 | data
    replace_layers  incarnation u64 | run_first_id u64 | run_count u32 | root 32 * run_count
                    | output_count u32 | (first_id u64 | id_count u64 | new layer) *
    delete          incarnation u64

Checkpoint body::

    flags u8 (1 deleted, 2 head_kept, 4 has last_push) | incarnation u64 | version u64
    | upload_gen u64 | upload_window u32 | next_id u64 | last_push_us u64 (0 when absent)
    | head_len u16 | head
    | ref_count u32 | (name_len u16 | name | oid 20 | set_time_us u64) *   names ascending
    | layer_count u32 | (kind u8 | first_id u64 | id_count u64 | object_count u64
                        | upload_gen u64 | file_size u64 | meta_size u64 | root 32 | pin u64) *

Change body (``encode_change``: outcome, per-ref results and effects of one
applied entry, what proposers and subscribers receive)::

    outcome u8 | message text32 | detail_count u16 | (key bytes16 | tag u8 | value) *
    | ref_count u32 | (name bytes16 | status u8 | current opt-value | reason text32) *
    | effect_count u32 | (tag u8 | body) *      tags and bodies: docs/formats/state.md

One value has one encoding: no optional padding, flags with unknown bits are
refused, refs are in strictly ascending byte order. Decoding checks the
length and the crc32 first, then every field; broken bytes raise
:class:`CorruptData` naming the section, a frame over the size limits
:class:`LimitExceeded`, and a well-formed command whose fields are out of
their domain :class:`InvalidArgument` (``check_command``). A decoded
checkpoint must satisfy every state invariant (``state_problem``), with one
exception that keeps a checkpoint's cost in its bytes: each ref is checked for
a name under ``refs/``, a non-zero oid and a time in range, in ascending
order, but its name is not run through git's ref-name rules again. Only
``encode_state`` writes checkpoints, of states ``apply`` made (which checked
every name it set), and the crc32 catches a changed byte.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Mapping
from types import MappingProxyType

from enroute_core.base.errors import CorruptData
from enroute_core.base.ids import OID_BYTES, ZERO_OID, LogIndex, ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.state.commands import (
    Activate,
    Command,
    Commit,
    Delete,
    NewLayer,
    PlacedLayer,
    RefUpdate,
    ReplaceLayers,
    check_command,
)
from enroute_core.state.effects import (
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
from enroute_core.state.model import (
    REFS_PREFIX,
    ROOT_BYTES,
    TIME_US_MAX,
    LayerEntry,
    LayerKind,
    RefValue,
    RepoState,
    layer_problem,
    oid_problem,
    state_problem,
    time_problem,
)
from enroute_core.state.refmap import RefMap

COMMAND_MAGIC = b"ENRC"
STATE_MAGIC = b"ENRS"
FORMAT_VERSION = 1
KIND_ACTIVATE, KIND_COMMIT, KIND_REPLACE_LAYERS, KIND_DELETE = 1, 2, 3, 4
KIND_CHECKPOINT = 1
REF_VALUE_BYTES = OID_BYTES + 8

_HEADER = struct.Struct(">4sBBHQ")
_CRC = struct.Struct(">I")
_U8, _U16, _U32, _U64 = (struct.Struct(f">{c}") for c in "BHIQ")
_LAYER_RECORD = struct.Struct(">BQQQQQQ32sQ")
_NEW_LAYER_HEAD = struct.Struct(">BQQQQ32sQ")
_REF_VALUE = struct.Struct(f">{OID_BYTES}sQ")

_ACT_CREATE, _ACT_HEAD = 1, 2
_COMMIT_PUSH, _COMMIT_ATOMIC, _COMMIT_LAYER = 1, 2, 4
_UPD_OLD, _UPD_NEW = 1, 2
_ST_DELETED, _ST_HEAD_KEPT, _ST_LAST_PUSH = 1, 2, 4


# -- writing ----------------------------------------------------------------------------------


class _Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def u8(self, v: int) -> None:
        self.buf += _U8.pack(v)

    def u16(self, v: int) -> None:
        self.buf += _U16.pack(v)

    def u32(self, v: int) -> None:
        self.buf += _U32.pack(v)

    def u64(self, v: int) -> None:
        self.buf += _U64.pack(v)

    def raw(self, b: bytes) -> None:
        self.buf += b

    def short_bytes(self, b: bytes) -> None:
        self.u16(len(b))
        self.buf += b


def _frame(magic: bytes, kind: int, body: bytes | bytearray) -> bytes:
    out = bytearray(_HEADER.pack(magic, FORMAT_VERSION, kind, 0, len(body)))
    out += body
    out += _CRC.pack(zlib.crc32(out))
    return bytes(out)


def _write_new_layer(w: _Writer, layer: NewLayer) -> None:
    w.raw(
        _NEW_LAYER_HEAD.pack(
            layer.kind,
            layer.object_count,
            layer.upload_gen,
            layer.file_size,
            layer.meta_size,
            layer.root,
            len(layer.data),
        )
    )
    w.raw(layer.data)


def _write_layer_entry(w: _Writer, e: LayerEntry) -> None:
    w.raw(
        _LAYER_RECORD.pack(
            e.kind, e.first_id, e.id_count, e.object_count, e.upload_gen,
            e.file_size, e.meta_size, e.root, e.pin,
        )
    )  # fmt: skip


def encode_command(cmd: Command, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The log entry payload of ``cmd``. Raises :class:`InvalidArgument` for a malformed
    command and :class:`LimitExceeded` past the bounds the decoder enforces."""
    check_command(cmd)
    w = _Writer()
    if isinstance(cmd, Activate):
        kind = KIND_ACTIVATE
        w.u8((_ACT_CREATE if cmd.create else 0) | (_ACT_HEAD if cmd.head is not None else 0))
        w.u32(cmd.upload_window)
        if cmd.head is not None:
            w.short_bytes(cmd.head)
    elif isinstance(cmd, Commit):
        kind = KIND_COMMIT
        check_limit("state_ref_updates_max", len(cmd.ref_updates), limits.state_ref_updates_max)
        w.u64(cmd.incarnation)
        w.u64(cmd.stamp_us)
        w.u8(
            (_COMMIT_PUSH if cmd.is_push else 0)
            | (_COMMIT_ATOMIC if cmd.atomic else 0)
            | (_COMMIT_LAYER if cmd.new_layer is not None else 0)
        )
        w.u32(len(cmd.ref_updates))
        for u in cmd.ref_updates:
            w.u8(
                (_UPD_OLD if u.old_oid is not None else 0)
                | (_UPD_NEW if u.new_oid is not None else 0)
            )
            w.short_bytes(u.name)
            for oid in (u.old_oid, u.new_oid):
                if oid is not None:
                    w.raw(oid)
        if cmd.new_layer is not None:
            _write_new_layer(w, cmd.new_layer)
    elif isinstance(cmd, ReplaceLayers):
        kind = KIND_REPLACE_LAYERS
        check_limit("state_layers_max", len(cmd.run_roots), limits.state_layers_max)
        check_limit("state_layers_max", len(cmd.outputs), limits.state_layers_max)
        w.u64(cmd.incarnation)
        w.u64(cmd.run_first_id)
        w.u32(len(cmd.run_roots))
        for root in cmd.run_roots:
            w.raw(root)
        w.u32(len(cmd.outputs))
        for out in cmd.outputs:
            w.u64(out.first_id)
            w.u64(out.id_count)
            _write_new_layer(w, out.layer)
    else:
        kind = KIND_DELETE
        w.u64(cmd.incarnation)
    data = _frame(COMMAND_MAGIC, kind, w.buf)
    check_limit("state_command_bytes_max", len(data), limits.state_command_bytes_max)
    return data


def encode_state(state: RepoState) -> bytes:
    """The checkpoint of ``state`` (what the state object carries). Its refs are not
    checked again here: ``apply`` made them (see the module docstring)."""
    problem = state_problem(state, refs=False)
    assert problem is None, problem
    w = _Writer()
    w.u8(
        (_ST_DELETED if state.deleted else 0)
        | (_ST_HEAD_KEPT if state.head_kept else 0)
        | (_ST_LAST_PUSH if state.last_push_us is not None else 0)
    )
    w.u64(state.incarnation)
    w.u64(state.version)
    w.u64(state.upload_gen)
    w.u32(state.upload_window)
    w.u64(state.next_id)
    w.u64(state.last_push_us or 0)
    w.short_bytes(state.head)
    refs = RefMap.of(state.refs)  # ascending already
    w.u32(len(refs))
    buf, pack = w.buf, _REF_VALUE.pack
    for name, value in refs.items():
        buf += _U16.pack(len(name))
        buf += name
        buf += pack(value.oid, value.set_time_us)
    w.u32(len(state.manifest))
    for entry in state.manifest:
        _write_layer_entry(w, entry)
    return _frame(STATE_MAGIC, KIND_CHECKPOINT, w.buf)


def encode_ref_value(value: RefValue) -> bytes:
    """The value of a ref in the state store: oid (20) then set time (u64, 8 bytes)."""
    assert oid_problem(value.oid) is None and time_problem(value.set_time_us) is None
    return _REF_VALUE.pack(value.oid, value.set_time_us)


# -- reading ----------------------------------------------------------------------------------


class _Reader:
    """Bounds-checked reads; running short raises ``CorruptData`` naming ``section``."""

    __slots__ = ("buf", "pos", "section")

    def __init__(self, buf: bytes, section: str) -> None:
        self.buf = buf
        self.pos = 0
        self.section = section

    def fail(self, what: str) -> CorruptData:
        return CorruptData(f"{self.section}: {what}", section=self.section, offset=self.pos)

    def take(self, n: int) -> bytes:
        if n > len(self.buf) - self.pos:
            raise self.fail(f"cut short (needs {n} bytes at offset {self.pos})")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "big")

    def short_bytes(self) -> bytes:
        return self.take(self.u16())

    def flags(self, allowed: int) -> int:
        value = self.u8()
        if value & ~allowed:
            raise self.fail(f"unknown flag bits 0x{value & ~allowed:02x}")
        return value

    def count(self, limit_name: str, maximum: int, record_bytes_min: int) -> int:
        n = self.u32()
        check_limit(limit_name, n, maximum)
        if n * record_bytes_min > len(self.buf) - self.pos:
            raise self.fail(f"count {n} does not fit the bytes left")
        return n

    def end(self) -> None:
        if self.pos != len(self.buf):
            self.section = "body"
            raise self.fail(f"{len(self.buf) - self.pos} bytes after the last field")


def _unframe(data: bytes, magic: bytes, limit_name: str, maximum: int) -> tuple[int, bytes]:
    check_limit(limit_name, len(data), maximum)
    if len(data) < _HEADER.size + _CRC.size:
        raise CorruptData(f"{len(data)} bytes cannot hold a frame", section="header")
    got_magic, fmt, kind, reserved, body_len = _HEADER.unpack_from(data)
    if got_magic != magic:
        raise CorruptData(f"bad magic {got_magic!r}, expected {magic!r}", section="header")
    if _HEADER.size + body_len + _CRC.size != len(data):
        raise CorruptData(
            f"body length {body_len} does not match the {len(data)} bytes given", section="length"
        )
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(memoryview(data)[: -_CRC.size]) != crc:
        raise CorruptData("crc32 mismatch", section="crc")
    if fmt != FORMAT_VERSION or reserved != 0:
        raise CorruptData(f"unsupported format {fmt} (reserved {reserved})", section="header")
    return kind, data[_HEADER.size : -_CRC.size]


def _layer_kind(r: _Reader, value: int) -> LayerKind:
    try:
        return LayerKind(value)
    except ValueError:
        raise r.fail(f"unknown layer kind {value}") from None


def _read_new_layer(r: _Reader) -> NewLayer:
    kind = _layer_kind(r, r.u8())
    object_count, upload_gen, file_size, meta_size = r.u64(), r.u64(), r.u64(), r.u64()
    root = r.take(ROOT_BYTES)
    data = r.take(r.u64())
    return NewLayer(kind, object_count, file_size, meta_size, root, upload_gen, data)


def _read_commit(r: _Reader, limits: Limits) -> Commit:
    incarnation, stamp = r.u64(), r.u64()
    flags = r.flags(_COMMIT_PUSH | _COMMIT_ATOMIC | _COMMIT_LAYER)
    n = r.count("state_ref_updates_max", limits.state_ref_updates_max, 3)
    updates = []
    r.section = "ref_update"
    for _ in range(n):
        uflags = r.flags(_UPD_OLD | _UPD_NEW)
        name = r.short_bytes()
        old = ObjectId(r.take(OID_BYTES)) if uflags & _UPD_OLD else None
        new = ObjectId(r.take(OID_BYTES)) if uflags & _UPD_NEW else None
        updates.append(RefUpdate(name, old, new))
    r.section = "layer"
    layer = _read_new_layer(r) if flags & _COMMIT_LAYER else None
    return Commit(
        incarnation=incarnation,
        ref_updates=tuple(updates),
        new_layer=layer,
        stamp_us=stamp,
        is_push=bool(flags & _COMMIT_PUSH),
        atomic=bool(flags & _COMMIT_ATOMIC),
    )


def _read_replace(r: _Reader, limits: Limits) -> ReplaceLayers:
    incarnation, run_first_id = r.u64(), r.u64()
    n = r.count("state_layers_max", limits.state_layers_max, ROOT_BYTES)
    roots = tuple(r.take(ROOT_BYTES) for _ in range(n))
    m = r.count("state_layers_max", limits.state_layers_max, 16 + _NEW_LAYER_HEAD.size)
    r.section = "layer"
    outputs = []
    for _ in range(m):
        first_id, id_count = r.u64(), r.u64()
        outputs.append(PlacedLayer(first_id, id_count, _read_new_layer(r)))
    return ReplaceLayers(incarnation, run_first_id, roots, tuple(outputs))


def decode_command(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Command:
    """Inverse of :func:`encode_command`; see the module docstring for the errors."""
    kind, body = _unframe(
        data, COMMAND_MAGIC, "state_command_bytes_max", limits.state_command_bytes_max
    )
    cmd: Command
    if kind == KIND_ACTIVATE:
        r = _Reader(body, "activate")
        flags = r.flags(_ACT_CREATE | _ACT_HEAD)
        window = r.u32()
        head = r.short_bytes() if flags & _ACT_HEAD else None
        cmd = Activate(create=bool(flags & _ACT_CREATE), head=head, upload_window=window)
    elif kind == KIND_COMMIT:
        r = _Reader(body, "commit")
        cmd = _read_commit(r, limits)
    elif kind == KIND_REPLACE_LAYERS:
        r = _Reader(body, "replace_layers")
        cmd = _read_replace(r, limits)
    elif kind == KIND_DELETE:
        r = _Reader(body, "delete")
        cmd = Delete(r.u64())
    else:
        raise CorruptData(f"unknown command kind {kind}", section="header")
    r.end()
    check_command(cmd)
    return cmd


def _read_refs(r: _Reader, limits: Limits) -> RefMap:
    """The refs, each checked on its own as it is read (see the module docstring)."""
    r.section = "refs"
    n = r.count("state_refs_max", limits.state_refs_max, 2 + _REF_VALUE.size)
    items: list[tuple[bytes, RefValue]] = []
    previous = b""
    buf, unpack_len, unpack_value = r.buf, _U16.unpack_from, _REF_VALUE.unpack_from
    for _ in range(n):  # _Reader's reads inlined: this loop is the bulk of a checkpoint
        pos = r.pos
        if len(buf) - pos < 2 + _REF_VALUE.size:
            raise r.fail(f"cut short (needs a ref at offset {pos})")
        (size,) = unpack_len(buf, pos)
        r.pos = pos + 2 + size + _REF_VALUE.size
        if r.pos > len(buf):
            r.pos = pos
            raise r.fail(f"cut short (needs a ref of {size} name bytes at offset {pos})")
        name = buf[pos + 2 : pos + 2 + size]
        if name <= previous and items:
            raise r.fail("ref names are not in strictly ascending order")
        oid, set_time = unpack_value(buf, pos + 2 + size)
        if not name.startswith(REFS_PREFIX) or oid == ZERO_OID or set_time > TIME_US_MAX:
            problem = (
                None if name.startswith(REFS_PREFIX) else "is not under refs/"
            ) or oid_problem(oid) or time_problem(set_time)  # fmt: skip
            raise CorruptData(
                f"checkpoint breaks an invariant: ref {name[:100]!r}: {problem}",
                section="invariants",
            )
        items.append((name, RefValue(ObjectId(oid), set_time)))
        previous = name
    return RefMap.from_ascending(items)


def _read_layer_entry(r: _Reader) -> LayerEntry:
    kind = _layer_kind(r, r.u8())
    first_id, id_count, object_count = r.u64(), r.u64(), r.u64()
    upload_gen, file_size, meta_size = r.u64(), r.u64(), r.u64()
    root = r.take(ROOT_BYTES)
    pin = LogIndex(r.u64())
    return LayerEntry(
        kind, first_id, id_count, object_count, upload_gen, file_size, meta_size, root, pin
    )


def _read_manifest(r: _Reader, limits: Limits) -> tuple[LayerEntry, ...]:
    r.section = "manifest"
    n = r.count("state_layers_max", limits.state_layers_max, _LAYER_RECORD.size)
    return tuple(_read_layer_entry(r) for _ in range(n))


def decode_state(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> RepoState:
    """Inverse of :func:`encode_state`; a state that breaks an invariant is corrupt."""
    kind, body = _unframe(
        data, STATE_MAGIC, "state_checkpoint_bytes_max", limits.state_checkpoint_bytes_max
    )
    if kind != KIND_CHECKPOINT:
        raise CorruptData(f"unknown state kind {kind}", section="header")
    r = _Reader(body, "state")
    flags = r.flags(_ST_DELETED | _ST_HEAD_KEPT | _ST_LAST_PUSH)
    incarnation, version, upload_gen = r.u64(), r.u64(), r.u64()
    window, next_id, last_push = r.u32(), r.u64(), r.u64()
    if not flags & _ST_LAST_PUSH and last_push != 0:
        raise r.fail("last_push is set without its flag")
    r.section = "head"
    head = r.short_bytes()
    refs = _read_refs(r, limits)
    manifest = _read_manifest(r, limits)
    r.end()
    state = RepoState(
        incarnation=incarnation,
        deleted=bool(flags & _ST_DELETED),
        version=version,
        head=head,
        head_kept=bool(flags & _ST_HEAD_KEPT),
        refs=refs,
        manifest=manifest,
        next_id=next_id,
        upload_gen=upload_gen,
        upload_window=window,
        last_push_us=last_push if flags & _ST_LAST_PUSH else None,
    )
    problem = state_problem(state, refs=False)
    if problem is not None:
        raise CorruptData(f"checkpoint breaks an invariant: {problem}", section="invariants")
    return state


def decode_ref_value(data: bytes) -> RefValue:
    """Inverse of :func:`encode_ref_value`."""
    if len(data) != REF_VALUE_BYTES:
        raise CorruptData(
            f"a ref value is {REF_VALUE_BYTES} bytes, not {len(data)}", section="ref_value"
        )
    oid, set_time = _REF_VALUE.unpack(data)
    value = RefValue(ObjectId(oid), set_time)
    problem = oid_problem(value.oid) or time_problem(value.set_time_us)
    if problem is not None:
        raise CorruptData(f"ref value: {problem}", section="ref_value")
    return value


# -- changes: what an applied entry answered and changed ----------------------------------------

CHANGE_MAGIC = b"ENRE"
KIND_CHANGE = 1

_OUTCOME_BYTES = {
    OutcomeCode.OK: 1,
    OutcomeCode.EXISTS: 2,
    OutcomeCode.ALREADY_DELETED: 3,
    OutcomeCode.NOT_FOUND: 4,
    OutcomeCode.INCARNATION_ENDED: 5,
    OutcomeCode.STALE_REF: 6,
    OutcomeCode.INVALID_REF_NAME: 7,
    OutcomeCode.INVALID_ARGUMENT: 8,
    OutcomeCode.LIMIT_EXCEEDED: 9,
    OutcomeCode.UPLOAD_WINDOW: 10,
    OutcomeCode.STALE_RUN: 11,
    OutcomeCode.CORRUPT_DATA: 12,
}
_BYTE_OUTCOMES = {v: k for k, v in _OUTCOME_BYTES.items()}
_STATUS_BYTES = {
    RefStatus.OK: 1,
    RefStatus.STALE: 2,
    RefStatus.INVALID_NAME: 3,
    RefStatus.ABORTED: 4,
}
_BYTE_STATUSES = {v: k for k, v in _STATUS_BYTES.items()}
_DETAIL_NONE, _DETAIL_FALSE, _DETAIL_TRUE, _DETAIL_INT, _DETAIL_STR = 0, 1, 2, 3, 4
(
    _FX_REF, _FX_HEAD, _FX_LAYERS, _FX_PINS, _FX_LAST_PUSH, _FX_UPLOAD_GEN, _FX_CREATED,
    _FX_DELETED,
) = range(1, 9)  # fmt: skip
_EFFECTS_EXTRA_MAX = 16  # effects beyond one per ref update


def _write_text(w: _Writer, text: str) -> None:
    raw = text.encode("utf-8")
    w.u32(len(raw))
    w.raw(raw)


def _write_optional_value(w: _Writer, value: RefValue | None) -> None:
    w.u8(0 if value is None else 1)
    if value is not None:
        w.raw(_REF_VALUE.pack(value.oid, value.set_time_us))


def _write_details(w: _Writer, details: Mapping[str, object]) -> None:
    w.u16(len(details))
    for key, value in details.items():
        w.short_bytes(key.encode("utf-8"))
        if value is None:
            w.u8(_DETAIL_NONE)
        elif isinstance(value, bool):
            w.u8(_DETAIL_TRUE if value else _DETAIL_FALSE)
        elif isinstance(value, int):
            w.u8(_DETAIL_INT)
            w.short_bytes(str(value).encode("ascii"))
        else:
            assert isinstance(value, str), f"detail {key!r} is a {type(value).__name__}"
            w.u8(_DETAIL_STR)
            _write_text(w, value)


def _write_effect(w: _Writer, effect: Effect) -> None:
    if isinstance(effect, RefChanged):
        w.u8(_FX_REF)
        w.short_bytes(effect.name)
        _write_optional_value(w, effect.old)
        _write_optional_value(w, effect.new)
    elif isinstance(effect, HeadChanged):
        w.u8(_FX_HEAD)
        w.short_bytes(effect.old)
        w.short_bytes(effect.new)
    elif isinstance(effect, LayersChanged):
        assert len(effect.added) == len(effect.added_data)
        w.u8(_FX_LAYERS)
        w.u32(len(effect.removed))
        for entry in effect.removed:
            _write_layer_entry(w, entry)
        w.u32(len(effect.added))
        for entry, data in zip(effect.added, effect.added_data, strict=True):
            _write_layer_entry(w, entry)
            w.u64(len(data))
            w.raw(data)
    elif isinstance(effect, PinsChanged):
        w.u8(_FX_PINS)
        for pins in (effect.added, effect.released):
            w.u32(len(pins))
            for pin in pins:
                w.u64(pin)
    elif isinstance(effect, LastPushChanged):
        w.u8(_FX_LAST_PUSH)
        w.u8(0 if effect.old_us is None else 1)
        w.u64(effect.old_us or 0)
        w.u64(effect.new_us)
    elif isinstance(effect, UploadGenAdvanced):
        w.u8(_FX_UPLOAD_GEN)
        w.u64(effect.upload_gen)
    elif isinstance(effect, Created):
        w.u8(_FX_CREATED)
        w.u64(effect.incarnation)
        w.u64(effect.version)
        w.u64(effect.upload_gen)
        w.u32(effect.upload_window)
        w.short_bytes(effect.head)
        w.u8(1 if effect.head_kept else 0)
    else:
        w.u8(_FX_DELETED)
        w.u64(effect.incarnation)
        w.u64(effect.last_upload_gen)


def encode_change(change: Change, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The answer to a proposer and a subscriber's change: outcome, per-ref results and
    effects of one applied entry (``docs/formats/state.md``, "Change")."""
    w = _Writer()
    w.u8(_OUTCOME_BYTES[change.outcome.code])
    _write_text(w, change.outcome.message)
    _write_details(w, change.outcome.details)
    w.u32(len(change.refs))
    for result in change.refs:
        w.short_bytes(result.name)
        w.u8(_STATUS_BYTES[result.status])
        _write_optional_value(w, result.current)
        _write_text(w, result.reason)
    w.u32(len(change.effects))
    for effect in change.effects:
        _write_effect(w, effect)
    data = _frame(CHANGE_MAGIC, KIND_CHANGE, w.buf)
    check_limit("state_change_bytes_max", len(data), limits.state_change_bytes_max)
    return data


def _read_text(r: _Reader) -> str:
    raw = r.take(r.u32())
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise r.fail("text is not UTF-8") from None


def _read_value(r: _Reader) -> RefValue:
    oid, set_time = _REF_VALUE.unpack(r.take(_REF_VALUE.size))
    value = RefValue(ObjectId(oid), set_time)
    problem = oid_problem(value.oid) or time_problem(value.set_time_us)
    if problem is not None:
        raise r.fail(problem)
    return value


def _read_optional_value(r: _Reader) -> RefValue | None:
    present = r.flags(1)
    return _read_value(r) if present else None


def _read_details(r: _Reader) -> dict[str, object]:
    details: dict[str, object] = {}
    for _ in range(r.u16()):
        try:
            key = r.short_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise r.fail("detail key is not UTF-8") from None
        if key in details:
            raise r.fail(f"detail {key!r} twice")
        tag = r.u8()
        if tag == _DETAIL_NONE:
            details[key] = None
        elif tag in (_DETAIL_FALSE, _DETAIL_TRUE):
            details[key] = tag == _DETAIL_TRUE
        elif tag == _DETAIL_INT:
            text = r.short_bytes()
            if re.fullmatch(rb"-?(0|[1-9][0-9]{0,39})", text) is None or text == b"-0":
                raise r.fail("detail integer is not canonical decimal")
            details[key] = int(text)
        elif tag == _DETAIL_STR:
            details[key] = _read_text(r)
        else:
            raise r.fail(f"unknown detail tag {tag}")
    return details


def _read_checked_entry(r: _Reader) -> LayerEntry:
    entry = _read_layer_entry(r)
    problem = layer_problem(entry)
    if problem is not None:
        raise r.fail(f"layer entry: {problem}")
    return entry


def _read_effect(r: _Reader, limits: Limits) -> Effect:
    tag = r.u8()
    if tag == _FX_REF:
        return RefChanged(r.short_bytes(), _read_optional_value(r), _read_optional_value(r))
    if tag == _FX_HEAD:
        return HeadChanged(r.short_bytes(), r.short_bytes())
    if tag == _FX_LAYERS:
        n = r.count("state_layers_max", limits.state_layers_max, _LAYER_RECORD.size)
        removed = tuple(_read_checked_entry(r) for _ in range(n))
        m = r.count("state_layers_max", limits.state_layers_max, _LAYER_RECORD.size + 8)
        added, data = [], []
        for _ in range(m):
            added.append(_read_checked_entry(r))
            data.append(r.take(r.u64()))
        return LayersChanged(removed, tuple(added), tuple(data))
    if tag == _FX_PINS:
        lists = []
        for _ in range(2):
            n = r.count("state_layers_max", limits.state_layers_max, 8)
            lists.append(tuple(LogIndex(r.u64()) for _ in range(n)))
        return PinsChanged(lists[0], lists[1])
    if tag == _FX_LAST_PUSH:
        present = r.flags(1)
        old, new = r.u64(), r.u64()
        if not present and old != 0:
            raise r.fail("old last push is set without its flag")
        return LastPushChanged(old if present else None, new)
    if tag == _FX_UPLOAD_GEN:
        return UploadGenAdvanced(r.u64())
    if tag == _FX_CREATED:
        incarnation, version, upload_gen, window = r.u64(), r.u64(), r.u64(), r.u32()
        head = r.short_bytes()
        return Created(incarnation, version, upload_gen, window, head, bool(r.flags(1)))
    if tag == _FX_DELETED:
        return Deleted(r.u64(), r.u64())
    raise r.fail(f"unknown effect {tag}")


def decode_change(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Change:
    """Inverse of :func:`encode_change`."""
    kind, body = _unframe(
        data, CHANGE_MAGIC, "state_change_bytes_max", limits.state_change_bytes_max
    )
    if kind != KIND_CHANGE:
        raise CorruptData(f"unknown change kind {kind}", section="header")
    r = _Reader(body, "outcome")
    code = _BYTE_OUTCOMES.get(r.u8())
    if code is None:
        raise r.fail("unknown outcome")
    outcome = Outcome(code, _read_text(r), MappingProxyType(_read_details(r)))
    r.section = "ref_results"
    results = []
    for _ in range(r.count("state_ref_updates_max", limits.state_ref_updates_max, 8)):
        name = r.short_bytes()
        status = _BYTE_STATUSES.get(r.u8())
        if status is None:
            raise r.fail("unknown ref status")
        results.append(RefResult(name, status, _read_optional_value(r), _read_text(r)))
    r.section = "effects"
    effects_max = limits.state_ref_updates_max + _EFFECTS_EXTRA_MAX
    n = r.count("state_ref_updates_max", effects_max, 1)
    effects = tuple(_read_effect(r, limits) for _ in range(n))
    r.end()
    return Change(outcome, tuple(results), effects)
