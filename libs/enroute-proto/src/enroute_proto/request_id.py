"""Request ids of logical writes, carried from gitproto to compute to ledger (docs/rpc.md).

gitproto names each Git push request and API commit with :func:`new_request_id`
and sends it to the compute in the metadata key :data:`REQUEST_ID_KEY` (hex),
on every failover attempt alike. The compute derives the ledger's
``ProposeRequest.request_id`` from it (:func:`derive_request_id`), so a replay
on another compute proposes under the same id and the ledger answers it with the
first apply's outcome instead of refusing a compare-and-swap the first already did.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

__all__ = [
    "REQUEST_ID_BYTES",
    "REQUEST_ID_KEY",
    "derive_request_id",
    "find_request_id",
    "new_request_id",
    "request_id_metadata",
]

REQUEST_ID_KEY = "enroute-request-id"
"""Invocation metadata key (ASCII value: 32 lowercase hex digits)."""

REQUEST_ID_BYTES = 16
"""The ledger's request id width (docs/raft.md, "Applying each id once")."""


def new_request_id() -> bytes:
    """A fresh unguessable id: independent clients never collide (128 random bits)."""
    return secrets.token_bytes(REQUEST_ID_BYTES)


def request_id_metadata(request_id: bytes) -> tuple[tuple[str, str]]:
    """The invocation metadata that names a request to the compute."""
    if len(request_id) != REQUEST_ID_BYTES:
        raise ValueError(f"a request id is {REQUEST_ID_BYTES} bytes, not {len(request_id)}")
    return ((REQUEST_ID_KEY, request_id.hex()),)


def find_request_id(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes | None:
    """The request id of invocation metadata, or None when absent or malformed.

    A malformed value is ignored rather than refused: the write then runs under
    a fresh id, which only gives up deduplication across replays.
    """
    for key, value in metadata or ():
        if key != REQUEST_ID_KEY or not isinstance(value, str):
            continue
        if len(value) != 2 * REQUEST_ID_BYTES:
            return None
        try:
            return bytes.fromhex(value)
        except ValueError:
            return None
    return None


def derive_request_id(request_id: bytes, purpose: bytes) -> bytes:
    """The ledger id of the write ``purpose`` (e.g. ``b"push"``) done for ``request_id``.

    Keyed by purpose so a request that ever proposes more than one command
    gives each its own id; the same request and purpose always give the same id.
    """
    h = hashlib.blake2b(request_id, digest_size=REQUEST_ID_BYTES, person=purpose[:16])
    return h.digest()
