"""The four Git object types, numbered as pack entries number them.

Kept apart from :mod:`enroute_core.git.objects` so that the object codecs
(``tag`` names the type of what it points at) can use it without an import
cycle; :mod:`~enroute_core.git.objects` re-exports it.

Numbers: Git ``Documentation/gitformat-pack.txt``, "Object types"
(1 commit, 2 tree, 3 blob, 4 tag; 6 and 7 are delta entries, not objects).
"""

from __future__ import annotations

import enum

from enroute_core.base.errors import InvalidObject


class ObjectType(enum.IntEnum):
    """An object type; the value is the pack type number, so it passes as an int."""

    COMMIT = 1
    TREE = 2
    BLOB = 3
    TAG = 4

    @property
    def type_name(self) -> bytes:
        """The name loose-object headers and tag ``type`` lines use (``b"commit"``)."""
        return _NAMES[self]

    @classmethod
    def from_name(cls, name: bytes) -> ObjectType:
        """The type called ``name``; anything else is an ``InvalidObject``."""
        found = _BY_NAME.get(name)
        if found is None:
            raise InvalidObject(f"unknown object type {name[:32]!r}")
        return found

    @classmethod
    def from_number(cls, number: int) -> ObjectType:
        """The type with pack number ``number``; 0, 5, 6, 7 and others are refused."""
        if number not in _NUMBERS:
            raise InvalidObject(f"object type number {number} is not an object type")
        return cls(number)


_NAMES: dict[ObjectType, bytes] = {
    ObjectType.COMMIT: b"commit",
    ObjectType.TREE: b"tree",
    ObjectType.BLOB: b"blob",
    ObjectType.TAG: b"tag",
}
_BY_NAME: dict[bytes, ObjectType] = {name: t for t, name in _NAMES.items()}
_NUMBERS = frozenset(int(t) for t in ObjectType)
