"""Thin packs: REF_DELTA bases that the pack leaves out.

Git ``Documentation/gitformat-pack.txt`` ("Deltified representation") and
``git-pack-objects --thin``: a pack sent to a peer that already has some
objects may delta against them by object id without carrying them. The
receiver resolves such bases from its own store, as ``git index-pack
--fix-thin`` does. Here the store is a callback, so this module stays pure;
the bases it was asked for are reported so ingest can load and pin them
(seed 004, "Never waiting on the object store": ingest loads the bases of
the thin pack before it runs).
"""

from __future__ import annotations

from collections.abc import Callable

from enroute_core.base.errors import CorruptData, LimitExceeded, MissingObject
from enroute_core.base.ids import ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.objects import ObjectType, object_id

ExternalBaseFn = Callable[[ObjectId], tuple[int, bytes] | None]
"""Look up an object outside the pack: (type number 1..4, body), or None when absent."""

_OBJECT_TYPES = frozenset(int(t) for t in ObjectType)


class ExternalBases:
    """The caller's lookup, checked, with a record of every oid it was asked for."""

    __slots__ = ("_limits", "_lookup", "_used")

    def __init__(self, lookup: ExternalBaseFn | None, limits: Limits = DEFAULT_LIMITS) -> None:
        self._lookup = lookup
        self._limits = limits
        self._used: dict[ObjectId, None] = {}

    @property
    def used(self) -> tuple[ObjectId, ...]:
        """Oids resolved outside the pack, in the order first needed."""
        return tuple(self._used)

    def get(self, oid: ObjectId) -> tuple[int, bytes]:
        """(type, body) of a base the pack does not hold; ``MissingObject`` if nobody has it."""
        found = self.find(oid)
        if found is None:
            raise missing_base(oid)
        return found

    def find(self, oid: ObjectId) -> tuple[int, bytes] | None:
        """(type, body) from the caller's store, checked against ``oid``; None when absent."""
        found = self._lookup(oid) if self._lookup is not None else None
        if found is None:
            return None
        type_num, body = found
        assert type_num in _OBJECT_TYPES, type_num
        if len(body) > self._limits.object_bytes_max:
            raise LimitExceeded("object_bytes_max", len(body), self._limits.object_bytes_max)
        if oid not in self._used:
            actual = object_id(ObjectType(type_num), body)
            if actual != oid:
                raise CorruptData(
                    f"stored object {oid_to_hex(oid)} hashes to {oid_to_hex(actual)}",
                    section="thin_base",
                    oid=oid_to_hex(oid),
                )
            self._used[oid] = None
        return type_num, body


def missing_base(oid: ObjectId) -> MissingObject:
    return MissingObject(
        f"delta base {oid_to_hex(oid)} is neither in the pack nor in the repository",
        oid=oid_to_hex(oid),
    )
