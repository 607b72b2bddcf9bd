"""Git objects as a whole: the type, the header, the id, and one parse entry point.

Layout (Git ``Documentation/user-manual.txt``, "Object storage format";
``object-file.c``, ``parse_loose_header``)::

    object  = type SP size NUL body
    type    = "commit" | "tree" | "blob" | "tag"
    size    = decimal length of body, no leading zero ("0" alone is fine)
    id      = SHA-1 of the whole object, header included

Pack entries carry the same type and size in binary form and hash the same
way, so :class:`ObjectHasher` serves both. Git hashes with SHA-1DC, which
gives plain SHA-1 for every object that is not a collision attack.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.blob import Blob
from enroute_core.git.commit import Commit
from enroute_core.git.object_type import ObjectType
from enroute_core.git.tag import Tag
from enroute_core.git.tree import Tree

__all__ = [
    "GitObject",
    "ObjectHasher",
    "ObjectHeader",
    "ObjectType",
    "object_header",
    "object_id",
    "object_id_of",
    "parse_object",
    "parse_object_header",
]

GitObject = Blob | Tree | Commit | Tag


@dataclass(frozen=True, slots=True)
class ObjectHeader:
    """A parsed ``type SP size NUL``; the body starts at ``length``."""

    type: ObjectType
    size: int
    length: int


def object_header(object_type: ObjectType, size: int) -> bytes:
    assert size >= 0, size
    return object_type.type_name + b" %d\0" % size


def parse_object_header(
    data: bytes | memoryview, *, limits: Limits = DEFAULT_LIMITS
) -> ObjectHeader:
    """Read the header at the start of ``data`` (which may go on into the body).

    Refuses what git's ``parse_loose_header`` refuses, and unknown types; a
    header with no NUL in ``object_header_bytes_max`` bytes, or a size over
    ``object_bytes_max``, is a :class:`LimitExceeded`.
    """
    bound = limits.object_header_bytes_max
    window = bytes(data[:bound])
    nul = window.find(b"\0")
    if nul < 0:
        if len(data) >= bound:
            raise LimitExceeded("object_header_bytes_max", len(window) + 1, bound)
        raise InvalidObject("object header is truncated")
    type_name, space, digits = window[:nul].partition(b" ")
    if not space:
        raise InvalidObject("object header has no space")
    object_type = ObjectType.from_name(type_name)
    if not digits.isdigit() or (digits[0] == 0x30 and len(digits) > 1):
        raise InvalidObject("object header size is not a canonical decimal")
    size = int(digits)
    if size > limits.object_bytes_max:
        raise LimitExceeded("object_bytes_max", size, limits.object_bytes_max)
    return ObjectHeader(object_type, size, nul + 1)


def object_id(object_type: ObjectType, body: bytes | memoryview) -> ObjectId:
    h = hashlib.sha1(object_header(object_type, len(body)), usedforsecurity=False)
    h.update(body)
    return ObjectId(h.digest())


def object_id_of(obj: GitObject) -> ObjectId:
    return object_id(obj.kind, obj.serialize())


class ObjectHasher:
    """The id of an object whose body arrives in pieces (large blobs, inflating packs).

    The size is fixed up front as in the header; feeding more or fewer bytes
    than that is an :class:`InvalidObject`, since it means the size lied.
    """

    __slots__ = ("_hash", "_remaining", "object_type", "size")

    def __init__(self, object_type: ObjectType, size: int) -> None:
        self.object_type = object_type
        self.size = size
        self._remaining = size
        self._hash = hashlib.sha1(object_header(object_type, size), usedforsecurity=False)

    def update(self, data: bytes | memoryview) -> None:
        if len(data) > self._remaining:
            raise InvalidObject(f"object is longer than its size of {self.size} bytes")
        self._remaining -= len(data)
        self._hash.update(data)

    def digest(self) -> ObjectId:
        if self._remaining:
            raise InvalidObject(f"object is {self._remaining} bytes short of its size")
        return ObjectId(self._hash.digest())


def parse_object(
    object_type: ObjectType, body: bytes, *, limits: Limits = DEFAULT_LIMITS
) -> GitObject:
    """Parse ``body`` as ``object_type``; only :class:`InvalidObject` or
    :class:`LimitExceeded` escapes, and ``serialize()`` gives ``body`` back.
    """
    if len(body) > limits.object_bytes_max:
        raise LimitExceeded("object_bytes_max", len(body), limits.object_bytes_max)
    object_type = ObjectType.from_number(object_type)
    if object_type is ObjectType.COMMIT:
        return Commit.parse(body, limits=limits)
    if object_type is ObjectType.TREE:
        return Tree.parse(body, limits=limits)
    if object_type is ObjectType.BLOB:
        return Blob.parse(body, limits=limits)
    return Tag.parse(body, limits=limits)
