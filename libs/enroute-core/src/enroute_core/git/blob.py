"""Blob objects: the body is the content, with no structure to parse.

Here so that :func:`enroute_core.git.objects.parse_object` can return one
value type per object type (Git ``Documentation/gitformat-pack.txt``,
"Object types": a blob is its bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.object_type import ObjectType


@dataclass(frozen=True, slots=True)
class Blob:
    data: bytes

    kind: ClassVar[ObjectType] = ObjectType.BLOB

    @classmethod
    def parse(cls, body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Blob:
        del limits  # the caller bounded the body's size already
        return cls(bytes(body))

    def serialize(self) -> bytes:
        return self.data
