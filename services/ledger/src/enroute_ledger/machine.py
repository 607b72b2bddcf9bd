"""The replicated machine of one group: what a committed entry does to its state.

Pure (no asyncio, no clock, no I/O): the driver (:mod:`enroute_ledger.runtime`)
hands it committed entries in log order and answers the proposers with what it
returns; the seeded simulation (tests/sim) runs the same code. docs/raft.md,
"The ledger runtime's loop", says what stays in the driver.

Log entries carry an envelope of the ledger's own:

- empty: the no-op a new leader appends; applies nothing;
- ``G`` + request id (16) + u32 length + checkpoint + optional activate
  command: the genesis of an incarnation. The group's Raft bootstrap snapshot
  is empty for every founder (duty 2), so the state an incarnation starts from
  (the deleted state of E - 1, MISSING, or a checkpoint being restored)
  travels in its first entry. A genesis applies once; later ones are no-ops;
- ``C`` + request id (16) + encoded command.

Ids make a duplicated forward or a re-proposal apply once (duty 9): a group
remembers the id, log index, version and outcome of every entry applied in
the last ``dedup_window_entries`` log indexes (:class:`Done`), and an entry
whose id is among them is skipped and answered with the first copy's result.
That window is replicated state: the group's snapshot payload carries it next
to the checkpoint (:func:`encode_snapshot`, docs/raft.md "Applying each id
once"), so it survives compaction, snapshot transfer and restarts.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from enroute_core.base.errors import CorruptData, EnrouteError
from enroute_core.state import (
    Activate,
    Change,
    LayerKind,
    Outcome,
    OutcomeCode,
    RepoState,
    added_layers,
    apply,
    decode_command,
    decode_state,
    encode_change,
    encode_command,
    encode_state,
)

log = logging.getLogger("enroute.ledger.runtime")

GENESIS = b"G"
COMMAND = b"C"
ID_BYTES = 16
HISTORY_MAX = 4096
"""Applied changes kept per group for subscribers; older followers get a snapshot."""
_STATE_MAGIC = b"ENRS"  # a bare checkpoint: the snapshot payload before the id window
_SNAPSHOT_MAGIC = b"ENLS"
_SNAPSHOT_FORMAT = 1
_SNAPSHOT_HEAD = struct.Struct(">4sB3sQ")  # magic, format, reserved, checkpoint length
_DONE_HEAD = struct.Struct(">16sQQB")  # request id, log index, version, outcome length
_U32 = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying one proposal gave on this node: the proposer's answer."""

    version: int
    change: bytes
    outcome: Outcome
    state: RepoState


@dataclass(frozen=True, slots=True)
class Done:
    """One applied request id: what answers a later copy of the same entry.

    ``logged`` (this process only, not encoded) says the entry's Change is in the
    group's history under ``version``, so a copy is answered with the original bytes.
    """

    rid: bytes
    index: int
    version: int
    outcome: OutcomeCode
    logged: bool = False


# -- the entry envelope ------------------------------------------------------------------


def genesis_entry(rid: bytes, base: RepoState, activate: Activate | None) -> bytes:
    cp = encode_state(base)
    cmd = b"" if activate is None else encode_command(activate)
    return GENESIS + rid + struct.pack(">I", len(cp)) + cp + cmd


def command_entry(rid: bytes, command: bytes) -> bytes:
    return COMMAND + rid + command


def entry_rid(data: bytes) -> bytes:
    """The request id of an entry's envelope (b"" for the leader's empty no-op)."""
    return data[1 : 1 + ID_BYTES]


def inline_layer_of(entry: bytes, root: bytes, index: int) -> bytes:
    """The file of the inline layer ``root`` that the command entry ``entry`` added.

    Raises CorruptData(section="ledger-entry") when the entry adds no such layer.
    """
    if entry[:1] == COMMAND:
        for layer in added_layers(decode_command(entry[1 + ID_BYTES :])):
            if layer.kind is LayerKind.INLINE and layer.root == root:
                return layer.data
    raise CorruptData(
        f"log entry {index} holds no inline layer {root.hex()[:16]}",
        section="ledger-entry",
        index=index,
    )


# -- the snapshot payload (ENLS) ---------------------------------------------------------


def encode_snapshot(state: RepoState, done: Iterable[Done]) -> bytes:
    """A group's snapshot payload: the checkpoint of ``state`` and the dedup window.

    Layout (docs/formats/ledger-snapshot.md, golden vectors there; why: docs/raft.md,
    "Applying each id once"): ``ENLS``, format u8 = 1, 3 zero
    bytes, checkpoint length u64, the checkpoint (docs/formats/state.md), record
    count u32, per record request id (16), log index u64, version u64, outcome code
    length u8 and its ASCII name, then crc32 of every byte before it. Records are in
    ascending log index order, so equal windows encode to equal bytes on every voter.
    """
    cp = encode_state(state)
    out = bytearray(_SNAPSHOT_HEAD.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_FORMAT, b"\0\0\0", len(cp)))
    out += cp
    records = list(done)
    out += _U32.pack(len(records))
    for d in records:
        code = d.outcome.value.encode()
        out += _DONE_HEAD.pack(d.rid, d.index, d.version, len(code))
        out += code
    out += _U32.pack(zlib.crc32(out))
    return bytes(out)


def _bad_snapshot(message: str, **details: object) -> CorruptData:
    return CorruptData(message, section="ledger-snapshot", **details)


def decode_snapshot(data: bytes) -> tuple[RepoState | None, tuple[Done, ...]]:
    """The state and dedup window a snapshot payload carries; (None, ()) for none.

    A bare checkpoint (written before the window existed) decodes with an empty
    window. Raises CorruptData (section ``ledger-snapshot`` or the checkpoint's).
    """
    if not data:
        return None, ()
    if data[:4] == _STATE_MAGIC:
        return decode_state(data), ()
    head = _SNAPSHOT_HEAD.size
    if len(data) < head + 2 * _U32.size:
        raise _bad_snapshot(f"{len(data)} bytes cannot hold a snapshot payload")
    magic, fmt, reserved, cp_len = _SNAPSHOT_HEAD.unpack_from(data)
    if magic != _SNAPSHOT_MAGIC:
        raise _bad_snapshot(f"bad magic {magic!r}")
    body, (crc,) = data[:-4], _U32.unpack_from(data, len(data) - 4)
    if zlib.crc32(body) != crc:
        raise _bad_snapshot("crc32 mismatch")
    if fmt != _SNAPSHOT_FORMAT or reserved != b"\0\0\0":
        raise _bad_snapshot(f"unknown format {fmt}")
    if cp_len > len(body) - head - _U32.size:
        raise _bad_snapshot("checkpoint length past the end", length=cp_len)
    state = decode_state(body[head : head + cp_len])
    return state, _decode_window(body, head + cp_len)


def _decode_window(body: bytes, pos: int) -> tuple[Done, ...]:
    """The dedup records of a snapshot payload from ``pos`` (its count) to the end."""
    (count,) = _U32.unpack_from(body, pos)
    pos += _U32.size
    if count > (len(body) - pos) // _DONE_HEAD.size:
        raise _bad_snapshot("record count past the end", count=count)
    out: list[Done] = []
    rids: set[bytes] = set()
    for _ in range(count):
        if pos + _DONE_HEAD.size > len(body):
            raise _bad_snapshot("record past the end")
        rid, index, version, n = _DONE_HEAD.unpack_from(body, pos)
        pos += _DONE_HEAD.size
        name = body[pos : pos + n]
        pos += n
        if len(name) != n:
            raise _bad_snapshot("outcome code past the end")
        try:
            outcome = OutcomeCode(name.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise _bad_snapshot(f"unknown outcome code {name[:32]!r}") from None
        if (out and index <= out[-1].index) or rid in rids:
            raise _bad_snapshot("records are not in ascending log order or repeat an id")
        rids.add(rid)
        out.append(Done(rid, index, version, outcome))
    if pos != len(body):
        raise _bad_snapshot(f"{len(body) - pos} bytes after the records")
    return tuple(out)


# -- the machine -------------------------------------------------------------------------


class MachineState(Protocol):
    """The replicated part of one group that the machine reads and writes.

    The driver's ``Group`` holds it (rebuilt from the log when a hibernated group
    wakes); the machine keeps no state of its own between calls.
    """

    born: bool
    applied: int
    state: RepoState
    done: dict[bytes, Done]
    done_order: list[Done]

    @property
    def history(self) -> list[tuple[int, bytes]]: ...

    @property
    def repo(self) -> str: ...


@dataclass(frozen=True, slots=True)
class EntryResult:
    """What one committed data entry did: the proposer of ``rid`` gets ``applied``.

    ``duplicate``: the id was in the window; nothing changed and ``applied`` is the
    first copy's answer.
    """

    rid: bytes
    applied: Applied
    duplicate: bool = False


class GroupMachine:
    """The rules every voter applies alike: envelope, dedup window, genesis, apply.

    One per runtime; the per-group data is the :class:`MachineState` passed in.
    """

    __slots__ = ("window",)

    def __init__(self, window: int) -> None:
        self.window = window
        """Log indexes an applied request id is remembered for; equal on every voter."""

    def apply(self, g: MachineState, data: bytes, index: int, snapshot_index: int) -> EntryResult:
        """Apply the committed data entry ``data`` at ``index`` (``g.applied`` is ``index``).

        ``snapshot_index``: the index of the group's latest snapshot, below which the
        window may forget records (:meth:`remember`). An entry of an unknown kind or
        that fails to decode applies as INVALID_ARGUMENT, alike on every voter.
        """
        kind, rid = data[:1], entry_rid(data)
        first = self.duplicate(g, rid, index)
        if first is not None:
            # a duplicated forward or a re-proposal: applied once, answered as the first was
            return EntryResult(rid, self.answer(g, first), duplicate=True)
        body = data[1 + ID_BYTES :]
        last = g.history[-1] if g.history else None
        result: Applied
        try:
            if kind == GENESIS:
                result = self._genesis(g, body, index)
            elif kind == COMMAND:
                result = self._command(g, body, index)
            else:
                raise CorruptData("unknown log entry kind", section="ledger-entry")
        except EnrouteError as err:
            log.error("entry %s of %s/%s not applied: %s", index, g.repo, g.state.incarnation, err)
            outcome = Outcome(OutcomeCode.INVALID_ARGUMENT, str(err))
            result = Applied(g.state.version, b"", outcome, g.state)
        if len(rid) == ID_BYTES:
            logged = bool(g.history) and g.history[-1] is not last
            done = Done(rid, index, result.version, result.outcome.code, logged)
            self.remember(g, done, snapshot_index)
        return EntryResult(rid, result)

    def _genesis(self, g: MachineState, body: bytes, index: int) -> Applied:
        if g.born:
            return Applied(g.state.version, b"", Outcome(OutcomeCode.EXISTS), g.state)
        if len(body) < 4:
            raise CorruptData("short genesis entry", section="ledger-entry")
        (n,) = struct.unpack(">I", body[:4])
        base = decode_state(body[4 : 4 + n])
        rest = body[4 + n :]
        g.born = True
        if not rest:
            g.state = base
            return Applied(base.version, b"", Outcome(OutcomeCode.OK), base)
        cmd = decode_command(rest)
        if not isinstance(cmd, Activate):
            raise CorruptData("genesis carries no activate", section="ledger-entry")
        res = apply(base, cmd, log_index=index)
        return self._publish(g, res.change, prev=base, new=res.state)

    def _command(self, g: MachineState, body: bytes, index: int) -> Applied:
        cmd = decode_command(body)
        res = apply(g.state, cmd, log_index=index)
        if res.change.outcome.code is OutcomeCode.CORRUPT_DATA:
            log.error("entry %s of %s/%s refused: %s", index, g.repo, g.state.incarnation,
                      res.change.outcome.message)  # fmt: skip
        return self._publish(g, res.change, prev=g.state, new=res.state)

    @staticmethod
    def _publish(g: MachineState, change: Change, *, prev: RepoState, new: RepoState) -> Applied:
        encoded = encode_change(change)
        g.state = new
        if new.version != prev.version or new.incarnation != prev.incarnation:
            g.history.append((new.version, encoded))
            if len(g.history) > HISTORY_MAX:
                del g.history[0]
        return Applied(new.version, encoded, change.outcome, new)

    # -- the request id window (docs/raft.md, "Applying each id once") ---------------------

    def duplicate(self, g: MachineState, rid: bytes, index: int) -> Done | None:
        """The apply of ``rid`` that makes an entry at ``index`` a copy, or None.

        Only the last ``window`` log indexes count, whatever this node happens to
        retain, so every voter decides alike.
        """
        d = g.done.get(rid)
        if d is None or index - d.index > self.window:
            return None
        return d

    def remember(self, g: MachineState, d: Done, snapshot_index: int) -> None:
        """Record an apply; forget those no snapshot at or after the last one can need.

        A snapshot at index i carries the records of (i - window, i], and the next
        snapshot is taken above the current one, so records stay down to the current
        snapshot's index minus the window: at most the in-memory log plus one window.
        """
        g.done[d.rid] = d
        order = g.done_order
        order.append(d)
        if len(order) <= self.window:
            return
        floor = min(snapshot_index, g.applied) - self.window
        cut = 0
        while cut < len(order) and order[cut].index <= floor:
            old = order[cut]
            if g.done.get(old.rid) is old:
                del g.done[old.rid]
            cut += 1
        del order[:cut]

    def window_at(self, g: MachineState, index: int) -> list[Done]:
        """The records a snapshot at ``index`` carries: applies in (index - window, index]."""
        low = index - self.window
        return [d for d in g.done_order if low < d.index <= index]

    @staticmethod
    def load_snapshot(g: MachineState, data: bytes) -> None:
        """Take the state and window of a snapshot payload (none: leave ``g`` as it is)."""
        state, done = decode_snapshot(data)
        if state is None:
            return
        g.state = state
        g.born = True
        g.done = {d.rid: d for d in done}
        g.done_order = list(done)

    @staticmethod
    def answer(g: MachineState, d: Done) -> Applied:
        """What the proposer of a copy of an applied entry hears: the first apply's result.

        The Change bytes come from the history while it holds them; after a restart
        or a snapshot install only the version and outcome code are known, and the
        answer is a Change with that outcome and no per-ref results.
        """
        change = b""
        if d.logged:
            for version, encoded in reversed(g.history):
                if version <= d.version:
                    change = encoded if version == d.version else b""
                    break
        if not change:
            change = encode_change(Change(Outcome(d.outcome, "applied before; details not kept")))
        return Applied(d.version, change, Outcome(d.outcome), g.state)
