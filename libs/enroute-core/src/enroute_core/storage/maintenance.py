"""Maintenance records in the object store: the lease, the sweep record, trash reclamation.

DESIGN, "Object store layout"; seed 001, "Reclaiming layer files"; issue
"Layer maintenance". Byte layouts: ``docs/formats/maintenance.md``.

``repos/<repo>/maintainer`` (the lease, by compare-and-swap)::

    0   magic        4   "ENRM"
    4   format       u8  1
    5   reserved     3   zero
    8   term         u64 +1 whenever the holder changes (a fencing number)
    16  acquired_us  u64 when this holder's tenure began
    24  expires_us   u64 the holder may act only before this time
    32  holder_len   u16 1 .. 255
    34  holder       holder_len bytes, UTF-8: the compute's node id
    ..  crc32        u32 of every byte before it

``repos/<repo>/sweep`` (files seen unnamed, with times)::

    0   magic        4   "ENRW"
    4   format       u8  1
    5   reserved     3   zero
    8   updated_us   u64 when the record was written
    16  count        u32
    20  entries      count x (gen u64, root16 16 bytes, seen_us u64), strictly
                     ascending by (gen, root16): the file <gen:016x>-<root16 hex>.layer
    ..  crc32        u32 of every byte before it

Integers are big-endian, as in the state codec (``docs/formats/state.md``).
Both records carry over between incarnations (seed 001): a lease names a
compute, not an incarnation, and a sweep record only delays deletions.

No key is derived here and no repository state is read (storage sits beside
``enroute_core.state``, not above it): callers pass keys, the names the
manifest holds and the generation bound of the upload window. The clock is
passed in as ``now_us`` values.
"""

from __future__ import annotations

import itertools
import json
import re
import struct
import zlib
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass

from enroute_core.base.errors import CorruptData, InvalidArgument, NotFound, PreconditionFailed
from enroute_core.base.limits import DEFAULT_LIMITS, Limits, check_limit
from enroute_core.storage.objectstore.base import LIST_LIMIT_MAX, ObjectStore

LEASE_MAGIC = b"ENRM"
SWEEP_MAGIC = b"ENRW"
FORMAT = 1
HOLDER_BYTES_MAX = 255
U64_MAX = (1 << 64) - 1
S_LEASE = "lease"
S_SWEEP = "sweep record"
S_TRASH = "trash marker"

_HEAD = struct.Struct(">4sB3s")
_LEASE = struct.Struct(">QQQH")
_SWEEP = struct.Struct(">QI")
_ENTRY = struct.Struct(">Q16sQ")
_CRC = struct.Struct(">I")
_LAYER_FILE = re.compile(r"([0-9a-f]{16})-([0-9a-f]{32})\.layer")


def _frame(magic: bytes, body: bytes) -> bytes:
    data = _HEAD.pack(magic, FORMAT, bytes(3)) + body
    return data + _CRC.pack(zlib.crc32(data))


def _unframe(data: bytes, magic: bytes, section: str) -> bytes:
    """The body between header and crc, after every frame check (typed errors only)."""
    if len(data) < _HEAD.size + _CRC.size:
        raise CorruptData(f"{section} is too short", section=section, size=len(data))
    got, fmt, reserved = _HEAD.unpack_from(data)
    if got != magic:
        raise CorruptData(f"{section} has the wrong magic", section=section)
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(data[: -_CRC.size]) != crc:
        raise CorruptData(f"{section} fails its crc32", section=section)
    if fmt != FORMAT or reserved != bytes(3):
        raise CorruptData(f"{section} format {fmt} is not {FORMAT}", section=section)
    return data[_HEAD.size : -_CRC.size]


# -- the lease --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """Who maintains a repository until when (issue "Layer maintenance": leases)."""

    holder: str
    term: int
    acquired_us: int
    expires_us: int

    def __post_init__(self) -> None:
        raw = self.holder.encode("utf-8")
        if not 1 <= len(raw) <= HOLDER_BYTES_MAX:
            raise InvalidArgument(f"lease holder must be 1 to {HOLDER_BYTES_MAX} bytes")
        for name in ("term", "acquired_us", "expires_us"):
            if not 0 <= getattr(self, name) <= U64_MAX:
                raise InvalidArgument(f"lease {name} is not a u64", field=name)

    def expired(self, now_us: int) -> bool:
        return now_us >= self.expires_us

    def encode(self) -> bytes:
        raw = self.holder.encode("utf-8")
        body = _LEASE.pack(self.term, self.acquired_us, self.expires_us, len(raw)) + raw
        return _frame(LEASE_MAGIC, body)

    @classmethod
    def decode(cls, data: bytes) -> Lease:
        body = _unframe(data, LEASE_MAGIC, S_LEASE)
        if len(body) < _LEASE.size:
            raise CorruptData("lease is too short", section=S_LEASE)
        term, acquired, expires, length = _LEASE.unpack_from(body)
        raw = body[_LEASE.size :]
        if len(raw) != length or not 1 <= length <= HOLDER_BYTES_MAX:
            raise CorruptData("lease holder length disagrees with the record", section=S_LEASE)
        try:
            holder = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptData("lease holder is not UTF-8", section=S_LEASE) from None
        return cls(holder, term, acquired, expires)


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease this compute holds, with the ETag its next compare-and-swap needs."""

    lease: Lease
    etag: str

    def valid(self, now_us: int, margin_us: int = 0) -> bool:
        """Act only while this holds: ``margin_us`` covers clock skew between computes."""
        return now_us < self.lease.expires_us - margin_us


async def read_lease(store: ObjectStore, key: str) -> tuple[Lease, str] | None:
    try:
        data, etag = await store.get_with_etag(key)
    except NotFound:
        return None
    return Lease.decode(data), etag


async def acquire_lease(
    store: ObjectStore, key: str, holder: str, *, now_us: int, duration_us: int
) -> HeldLease | None:
    """Take the lease when it is free, expired or ours; None while another holds it.

    One compare-and-swap decides: of computes racing for a free or expired
    lease exactly one wins. A lease that is ours is renewed. The term goes up
    when the holder changes, so a holder that was taken over can tell.
    """
    if duration_us <= 0:
        raise InvalidArgument("a lease lasts a positive time", duration_us=duration_us)
    current = await read_lease(store, key)
    try:
        if current is None:
            lease = Lease(holder, 1, now_us, now_us + duration_us)
            return HeldLease(lease, await store.put(key, lease.encode(), if_none_match=True))
        old, etag = current
        if old.holder == holder:
            lease = Lease(holder, old.term, old.acquired_us, now_us + duration_us)
        elif old.expired(now_us):
            lease = Lease(holder, old.term + 1, now_us, now_us + duration_us)
        else:
            return None
        return HeldLease(lease, await store.put(key, lease.encode(), if_match=etag))
    except PreconditionFailed:
        return None


async def renew_lease(
    store: ObjectStore, key: str, held: HeldLease, *, now_us: int, duration_us: int
) -> HeldLease | None:
    """Extend a held lease; None when it was taken over (the CAS names our last write)."""
    if duration_us <= 0:
        raise InvalidArgument("a lease lasts a positive time", duration_us=duration_us)
    old = held.lease
    lease = Lease(old.holder, old.term, old.acquired_us, max(now_us + duration_us, old.expires_us))
    try:
        return HeldLease(lease, await store.put(key, lease.encode(), if_match=held.etag))
    except PreconditionFailed:
        return None


async def release_lease(store: ObjectStore, key: str, held: HeldLease, *, now_us: int) -> bool:
    """Let the lease expire now, so another compute need not wait; False if already lost."""
    old = held.lease
    lease = Lease(old.holder, old.term, old.acquired_us, min(now_us, old.expires_us))
    try:
        await store.put(key, lease.encode(), if_match=held.etag)
    except PreconditionFailed:
        return False
    return True


# -- layer file names -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class LayerFile:
    """A stored layer's file name: upload generation and the first 16 bytes of its root."""

    gen: int
    root16: bytes

    @property
    def name(self) -> str:
        return f"{self.gen:016x}-{self.root16.hex()}.layer"

    @classmethod
    def parse(cls, name: str) -> LayerFile | None:
        m = _LAYER_FILE.fullmatch(name)
        if m is None:
            return None
        return cls(int(m.group(1), 16), bytes.fromhex(m.group(2)))


async def list_layer_files(
    store: ObjectStore, prefix: str, *, limits: Limits = DEFAULT_LIMITS
) -> tuple[list[LayerFile], int]:
    """Every layer file under ``prefix`` (``repos/<repo>/layers/``), and how many other
    keys were there (nothing else belongs there; they are reported, never deleted)."""
    files: list[LayerFile] = []
    others = 0
    after: str | None = None
    while True:
        page = await store.list(prefix, start_after=after, limit=LIST_LIMIT_MAX)
        for item in page.items:
            found = LayerFile.parse(item.key[len(prefix) :])
            if found is None:
                others += 1
            else:
                files.append(found)
        check_limit("sweep_listed_keys_max", len(files) + others, limits.sweep_listed_keys_max)
        if page.next_start_after is None:
            return files, others
        after = page.next_start_after


# -- the sweep record -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepEntry:
    file: LayerFile
    seen_us: int


@dataclass(frozen=True, slots=True)
class SweepRecord:
    """Files seen unnamed and out of the upload window, and when first seen."""

    updated_us: int = 0
    entries: tuple[SweepEntry, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.updated_us <= U64_MAX:
            raise InvalidArgument("sweep record time is not a u64")
        for a, b in itertools.pairwise(self.entries):
            if not a.file < b.file:
                raise InvalidArgument("sweep record entries must ascend by file, once each")
        for e in self.entries:
            if not 0 <= e.file.gen <= U64_MAX or len(e.file.root16) != 16:
                raise InvalidArgument(f"sweep record names a bad file {e.file!r}")
            if not 0 <= e.seen_us <= U64_MAX:
                raise InvalidArgument("sweep record time is not a u64")

    def encode(self) -> bytes:
        body = _SWEEP.pack(self.updated_us, len(self.entries)) + b"".join(
            _ENTRY.pack(e.file.gen, e.file.root16, e.seen_us) for e in self.entries
        )
        return _frame(SWEEP_MAGIC, body)

    @classmethod
    def decode(cls, data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> SweepRecord:
        body = _unframe(data, SWEEP_MAGIC, S_SWEEP)
        if len(body) < _SWEEP.size:
            raise CorruptData("sweep record is too short", section=S_SWEEP)
        updated, count = _SWEEP.unpack_from(body)
        check_limit("sweep_record_entries_max", count, limits.sweep_record_entries_max)
        if len(body) != _SWEEP.size + count * _ENTRY.size:
            raise CorruptData("sweep record length disagrees with its count", section=S_SWEEP)
        entries = tuple(
            SweepEntry(LayerFile(gen, root), seen)
            for gen, root, seen in _ENTRY.iter_unpack(body[_SWEEP.size :])
        )
        try:
            return cls(updated, entries)
        except InvalidArgument as err:
            raise CorruptData(err.message, section=S_SWEEP) from None


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What one sweep does: delete ``delete``, then write ``record``."""

    record: SweepRecord
    delete: tuple[LayerFile, ...]
    kept_in_window: int


def plan_sweep(
    record: SweepRecord,
    listed: Iterable[LayerFile],
    named: Collection[str],
    *,
    sweepable_gen_max: int,
    now_us: int,
    retention_us: int,
) -> SweepPlan:
    """Issue "Layer maintenance", item 3; DESIGN "Repository state" (upload window).

    A listed file the manifest names stays, and so does one whose generation
    is above ``sweepable_gen_max`` (``upload_gen - W``: it may still be
    committed). Any other file can never be named again: it is recorded when
    first seen and deleted once ``retention_us`` has passed since, so readers
    of older snapshots can finish. Entries of files no longer listed drop out.
    """
    seen = {e.file: e.seen_us for e in record.entries}
    entries: list[SweepEntry] = []
    delete: list[LayerFile] = []
    in_window = 0
    for f in sorted(set(listed)):
        if f.name in named:
            continue
        if f.gen > sweepable_gen_max:
            in_window += 1
            continue
        first = seen.get(f, now_us)
        if now_us - first >= retention_us:
            delete.append(f)
        else:
            entries.append(SweepEntry(f, first))
    return SweepPlan(SweepRecord(now_us, tuple(entries)), tuple(delete), in_window)


@dataclass(frozen=True, slots=True)
class SweepReport:
    listed: int
    recorded: int
    deleted: tuple[str, ...]
    deleted_bytes: int
    kept_in_window: int
    other_keys: int


async def read_sweep_record(
    store: ObjectStore, key: str, *, limits: Limits = DEFAULT_LIMITS
) -> tuple[SweepRecord, str | None]:
    try:
        data, etag = await store.get_with_etag(key)
    except NotFound:
        return SweepRecord(), None
    return SweepRecord.decode(data, limits=limits), etag


async def sweep_layers(
    store: ObjectStore,
    *,
    layers_prefix: str,
    record_key: str,
    named: Collection[str],
    sweepable_gen_max: int,
    now_us: int,
    retention_us: int,
    limits: Limits = DEFAULT_LIMITS,
) -> SweepReport:
    """One layer sweep (:func:`plan_sweep`), run under the repository's lease.

    Files are deleted before the record drops them, so a crash between the two
    only leaves entries for files already gone, which the next sweep drops.
    The record is written by compare-and-swap: a sweep that raced another
    (``PreconditionFailed``) lost nothing but this round's new entries.
    """
    files, others = await list_layer_files(store, layers_prefix, limits=limits)
    record, etag = await read_sweep_record(store, record_key, limits=limits)
    plan = plan_sweep(
        record,
        files,
        named,
        sweepable_gen_max=sweepable_gen_max,
        now_us=now_us,
        retention_us=retention_us,
    )
    check_limit(
        "sweep_record_entries_max", len(plan.record.entries), limits.sweep_record_entries_max
    )
    freed = 0
    for f in plan.delete:
        info = await store.head(layers_prefix + f.name)
        freed += 0 if info is None else info.size
        await store.delete(layers_prefix + f.name)
    data = plan.record.encode()
    if etag is None:
        await store.put(record_key, data, if_none_match=True)
    else:
        await store.put(record_key, data, if_match=etag)
    return SweepReport(
        listed=len(files),
        recorded=len(plan.record.entries),
        deleted=tuple(f.name for f in plan.delete),
        deleted_bytes=freed,
        kept_in_window=plan.kept_in_window,
        other_keys=others,
    )


# -- trash markers (seed 001, "Deletion" step 2 and "Reclaiming layer files") ---------------


@dataclass(frozen=True, slots=True)
class TrashMarker:
    """``trash/<repo>/<E>``: the last upload generation of a deleted incarnation and the
    time of the deletion. The ledger writes it as sorted-key JSON."""

    incarnation: int
    last_upload_gen: int
    time_us: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "incarnation": self.incarnation,
                "last_upload_gen": self.last_upload_gen,
                "time_us": self.time_us,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> TrashMarker:
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CorruptData("trash marker is not JSON", section=S_TRASH) from None
        if not isinstance(raw, dict) or set(raw) != {"incarnation", "last_upload_gen", "time_us"}:
            raise CorruptData("trash marker has the wrong fields", section=S_TRASH)
        values = [raw["incarnation"], raw["last_upload_gen"], raw["time_us"]]
        if not all(type(v) is int and 0 <= v <= U64_MAX for v in values) or values[0] < 1:
            raise CorruptData("trash marker values are not u64 numbers", section=S_TRASH)
        return cls(*values)


@dataclass(frozen=True, slots=True)
class TrashReport:
    markers: int
    markers_removed: tuple[int, ...]
    waiting: tuple[int, ...]  # incarnations whose deletion the state object does not show yet
    deleted: tuple[str, ...]
    deleted_bytes: int


async def reclaim_trash(
    store: ObjectStore,
    *,
    trash_prefix: str,
    layers_prefix: str,
    ended: Callable[[int], Awaitable[bool]],
    now_us: int,
    retention_us: int,
    limits: Limits = DEFAULT_LIMITS,
) -> TrashReport:
    """Seed 001, "Reclaiming layer files", under the repository's maintenance lease.

    For each marker ``trash/<repo>/<E>``: once ``ended(E)`` (the state object
    shows E deleted or superseded) nothing names a file with a generation at
    most the marker's, and nothing ever will. After the retention, timed from
    the marker, those files are deleted; the marker goes once none is left.
    A live incarnation's files have higher generations (its window starts above
    the last generation of E plus W), so they are never touched.
    """
    markers: list[tuple[str, TrashMarker]] = []
    after: str | None = None
    while True:
        page = await store.list(trash_prefix, start_after=after, limit=LIST_LIMIT_MAX)
        for item in page.items:
            markers.append((item.key, TrashMarker.decode(await store.get(item.key))))
        if page.next_start_after is None:
            break
        after = page.next_start_after
    removed: list[int] = []
    waiting: list[int] = []
    deleted: list[str] = []
    freed = 0
    files: list[LayerFile] | None = None
    for key, marker in markers:
        if not await ended(marker.incarnation):
            waiting.append(marker.incarnation)
            continue
        if now_us - marker.time_us < retention_us:
            continue
        if files is None:
            files, _ = await list_layer_files(store, layers_prefix, limits=limits)
        for f in [f for f in files if f.gen <= marker.last_upload_gen]:
            info = await store.head(layers_prefix + f.name)
            freed += 0 if info is None else info.size
            await store.delete(layers_prefix + f.name)
            deleted.append(f.name)
        # List again: an upload of E that raced the deletion keeps the marker a round more.
        files, _ = await list_layer_files(store, layers_prefix, limits=limits)
        if any(f.gen <= marker.last_upload_gen for f in files):
            continue
        await store.delete(key)
        removed.append(marker.incarnation)
    return TrashReport(len(markers), tuple(removed), tuple(waiting), tuple(deleted), freed)
