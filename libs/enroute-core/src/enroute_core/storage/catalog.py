"""The node catalog of local copies: what each copy is, kept across restarts.

Seed 004, "Files and tiers": every local copy is one file and a chunk bitmap,
recorded in the node catalog; opening a copy first finds its length, its
chunks, whether it is linked and whether this process wrote it. "Storage
service", Rule: the catalog is derivable data, so losing it (or a record)
only costs refetching; it is written to a temporary name and renamed, without
fsync.

"Whether this process wrote it" is a per-process token: a record written under
another token (a previous run) is of unknown state, and its chunks are checked
against their hashes before first use ("Files and tiers", third bullet).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass, replace

from enroute_core.base.errors import CorruptData

CATALOG_FILE = "catalog.json"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class CopyRecord:
    """One local copy. ``bitmap``: bit ``i % 8`` of byte ``i // 8`` is chunk ``i``."""

    name: str
    length: int
    bitmap: bytes
    linked: bool
    writer: str  # token of the process that recorded the chunks


class Catalog:
    """Records of local copies under ``data_dir``, persisted as one small JSON file."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self._dir = os.fspath(data_dir)
        os.makedirs(self._dir, exist_ok=True)
        self._path = os.path.join(self._dir, CATALOG_FILE)
        self._lock = threading.Lock()
        self.token = secrets.token_hex(8)
        self._records: dict[str, CopyRecord] = self._load()

    def _load(self) -> dict[str, CopyRecord]:
        try:
            with open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            if doc.get("version") != _VERSION:
                raise ValueError(f"catalog version {doc.get('version')!r}")
            out: dict[str, CopyRecord] = {}
            for name, r in doc["copies"].items():
                out[name] = CopyRecord(
                    name,
                    int(r["length"]),
                    bytes.fromhex(r["bitmap"]),
                    bool(r["linked"]),
                    r["writer"],
                )
            return out
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptData(f"node catalog {self._path}: {e}", section="catalog") from None

    def written_here(self, record: CopyRecord) -> bool:
        """True when this process recorded the chunks (they need no recheck)."""
        return record.writer == self.token

    def get(self, name: str) -> CopyRecord | None:
        with self._lock:
            return self._records.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def put(self, name: str, length: int, bitmap: bytes, linked: bool) -> CopyRecord:
        rec = CopyRecord(name, length, bitmap, linked, self.token)
        with self._lock:
            self._records[name] = rec
            self._save_locked()
        return rec

    def update_bitmap(self, name: str, bitmap: bytes) -> None:
        with self._lock:
            rec = self._records.get(name)
            if rec is None:
                return
            self._records[name] = replace(rec, bitmap=bitmap, writer=self.token)
            self._save_locked()

    def remove(self, name: str) -> None:
        with self._lock:
            if self._records.pop(name, None) is not None:
                self._save_locked()

    def _save_locked(self) -> None:
        doc = {
            "version": _VERSION,
            "copies": {
                n: {
                    "length": r.length,
                    "bitmap": r.bitmap.hex(),
                    "linked": r.linked,
                    "writer": r.writer,
                }
                for n, r in self._records.items()
            },
        }
        tmp = f"{self._path}.tmp-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, self._path)
