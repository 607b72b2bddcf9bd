"""The node catalog of local copies: what each copy is, kept across restarts.

Seed 004, "Files and tiers": every local copy is one file and a chunk bitmap,
recorded in the node catalog; opening a copy first finds its length, its
chunks, whether it is linked and whether this process wrote it. "Storage
service", Rule: the catalog is derivable data, so losing it (or a record)
only costs refetching; it is written without fsync.

"Whether this process wrote it" is a per-process token: a record written under
another token (a previous run) is of unknown state, and its chunks are checked
against their hashes before first use ("Files and tiers", third bullet).

On disk (docs/formats/catalog.md) the catalog is a base, ``catalog.json``, and a
journal, ``catalog.log``, of the records changed since: a change appends one line,
so a publish, an open or a chunk load costs the same whatever the number of copies
on the node (issue 19: rewriting the whole catalog at every change cost every push
time and bytes in proportion to every repository the node ever held a copy of).
The journal is folded into a new base once it holds more lines than the catalog
has records (and at start), so a change costs O(1) amortized and the files stay
within about twice the size of the records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from dataclasses import dataclass, replace

from enroute_core.base.errors import CorruptData

log = logging.getLogger(__name__)

CATALOG_FILE = "catalog.json"
JOURNAL_FILE = "catalog.log"
_VERSION = 1
JOURNAL_LINES_MIN = 1024
"""Journal lines always allowed before a fold, however few records there are: a
small catalog is not rewritten at every other change."""


@dataclass(frozen=True, slots=True)
class CopyRecord:
    """One local copy. ``bitmap``: bit ``i % 8`` of byte ``i // 8`` is chunk ``i``."""

    name: str
    length: int
    bitmap: bytes
    linked: bool
    writer: str  # token of the process that recorded the chunks


class Catalog:
    """Records of local copies under ``data_dir``: a JSON base and a journal of changes."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self._dir = os.fspath(data_dir)
        os.makedirs(self._dir, exist_ok=True)
        self._path = os.path.join(self._dir, CATALOG_FILE)
        self._journal_path = os.path.join(self._dir, JOURNAL_FILE)
        self._lock = threading.Lock()
        self.token = secrets.token_hex(8)
        self._records: dict[str, CopyRecord] = self._load()
        self._foreign: dict[str, set[str]] = {}
        """Names of the records another process wrote (a previous run), by directory
        (the repository part of a copy's name): a repository's leftovers are found
        without a walk of every record. Only shrinks: a record written here leaves it."""
        for name, rec in self._records.items():
            if not self.written_here(rec):
                self._foreign.setdefault(_dir_of(name), set()).add(name)
        self._journal_lines = 0
        self._journal: int | None = None
        if os.path.exists(self._journal_path):
            with self._lock:  # a journal an earlier run left: fold it now, torn tail and all
                self._fold_locked()

    # -- reading ----------------------------------------------------------------------------

    def _load(self) -> dict[str, CopyRecord]:
        out: dict[str, CopyRecord] = {}
        try:
            with open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = None
        if raw is not None:
            try:
                doc = json.loads(raw)
                if doc.get("version") != _VERSION:
                    raise ValueError(f"catalog version {doc.get('version')!r}")
                for name, r in doc["copies"].items():
                    out[name] = _record(name, r)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise CorruptData(f"node catalog {self._path}: {e}", section="catalog") from None
        try:
            with open(self._journal_path, "rb") as f:
                journal = f.read()
        except FileNotFoundError:
            return out
        replay(out, journal, self._journal_path)
        return out

    def written_here(self, record: CopyRecord) -> bool:
        """True when this process recorded the chunks (they need no recheck)."""
        return record.writer == self.token

    def get(self, name: str) -> CopyRecord | None:
        with self._lock:
            return self._records.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def foreign_in(self, directory: str) -> list[str]:
        """Names of the records under ``directory`` (one repository's copies) that
        another process wrote, sorted."""
        with self._lock:
            return sorted(self._foreign.get(directory, ()))

    # -- changing ---------------------------------------------------------------------------

    def put(self, name: str, length: int, bitmap: bytes, linked: bool) -> CopyRecord:
        rec = CopyRecord(name, length, bitmap, linked, self.token)
        with self._lock:
            self._set_locked(rec)
        return rec

    def update_bitmap(self, name: str, bitmap: bytes) -> None:
        with self._lock:
            rec = self._records.get(name)
            if rec is None:
                return
            self._set_locked(replace(rec, bitmap=bitmap, writer=self.token))

    def remove(self, name: str) -> None:
        with self._lock:
            if self._records.pop(name, None) is None:
                return
            self._not_foreign_locked(name)
            self._append_locked(encode_removal(name))

    def close(self) -> None:
        with self._lock:
            if self._journal is not None:
                os.close(self._journal)
                self._journal = None

    def _set_locked(self, rec: CopyRecord) -> None:
        self._records[rec.name] = rec
        if self.written_here(rec):
            self._not_foreign_locked(rec.name)
        else:
            self._foreign.setdefault(_dir_of(rec.name), set()).add(rec.name)
        self._append_locked(encode_record(rec))

    def _not_foreign_locked(self, name: str) -> None:
        if not self._foreign:
            return
        names = self._foreign.get(_dir_of(name))
        if names is not None:
            names.discard(name)
            if not names:
                del self._foreign[_dir_of(name)]

    def _append_locked(self, line: bytes) -> None:
        """One change, one line at the journal's end; a fold once it is long."""
        if self._journal_lines >= max(JOURNAL_LINES_MIN, len(self._records)):
            self._fold_locked()
        if self._journal is None:
            self._journal = os.open(
                self._journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
            )
        os.write(self._journal, line)
        self._journal_lines += 1

    def _fold_locked(self) -> None:
        """Write every record as a new base, then start an empty journal.

        The base is written to a temporary name and renamed over the old one before
        the journal goes: a stop in between leaves the new base and the old journal,
        whose lines, each a whole record or a removal, replayed over it give the same
        records again.
        """
        doc = {
            "version": _VERSION,
            "copies": {n: _fields(r) for n, r in self._records.items()},
        }
        tmp = f"{self._path}.tmp-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, self._path)
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._journal_path)
        self._journal_lines = 0


def encode_record(rec: CopyRecord) -> bytes:
    """The journal line that sets ``rec`` (docs/formats/catalog.md)."""
    doc = {"put": rec.name, **_fields(rec)}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def encode_removal(name: str) -> bytes:
    """The journal line that removes the record of ``name``."""
    return json.dumps({"remove": name}, separators=(",", ":")).encode() + b"\n"


def replay(records: dict[str, CopyRecord], journal: bytes, where: str = "journal") -> int:
    """Apply the journal's lines to ``records`` in order; answers the lines applied.

    A last line with no newline, or one that does not parse, is a write a stop cut
    short (the journal is not synced): it is left out. Any other line that does not
    parse is ``CorruptData``.
    """
    lines = journal.split(b"\n")
    torn = lines.pop()  # b"" when the journal ends with its newline
    applied = 0
    for i, line in enumerate(lines):
        try:
            _apply(records, json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if i == len(lines) - 1 and not torn:
                log.warning("%s: last line left out (a write cut short): %s", where, e)
                break
            raise CorruptData(
                f"node catalog journal {where}, line {i + 1}: {e}", section="catalog"
            ) from None
        applied += 1
    if torn:
        log.warning("%s: a last line with no end left out (a write cut short)", where)
    return applied


def _apply(records: dict[str, CopyRecord], doc: object) -> None:
    if not isinstance(doc, dict):
        raise TypeError("a journal line is an object")
    if "remove" in doc:
        name = doc["remove"]
        if not isinstance(name, str) or len(doc) != 1:
            raise ValueError("a removal names one copy")
        records.pop(name, None)
        return
    name = doc["put"]
    if not isinstance(name, str):
        raise TypeError("put names a copy")
    records[name] = _record(name, doc)


def _record(name: str, r: dict[str, object]) -> CopyRecord:
    length, bitmap, linked, writer = r["length"], r["bitmap"], r["linked"], r["writer"]
    if not isinstance(length, int) or not isinstance(bitmap, str):
        raise TypeError("length is an integer and bitmap a hex string")
    if not isinstance(linked, bool) or not isinstance(writer, str):
        raise TypeError("linked is a boolean and writer a string")
    return CopyRecord(name, length, bytes.fromhex(bitmap), linked, writer)


def _fields(r: CopyRecord) -> dict[str, object]:
    return {"length": r.length, "bitmap": r.bitmap.hex(), "linked": r.linked, "writer": r.writer}


def _dir_of(name: str) -> str:
    return name.rpartition("/")[0]
