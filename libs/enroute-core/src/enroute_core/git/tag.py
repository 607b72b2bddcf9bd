"""Annotated tag objects, parsed and written back byte for byte.

Layout (git ``tag.c``, ``parse_tag_buffer``; signatures in
``Documentation/gitformat-signature.txt``, "Tag signatures")::

    tag      = "object " hex40 LF
               "type " ("commit" | "tree" | "blob" | "tag") LF
               "tag " name LF
               ["tagger " identity LF]   ; old tags have none
               header*                   ; e.g. gpgsig for the other hash algorithm
               [LF message]              ; a signature sits inside the message

The whole object is at least 64 bytes (git refuses shorter ones). The
preservation rule is the commit's (see :mod:`enroute_core.git.commit`): the
ordered headers and the message are kept as they came, so serialize gives
back the parsed bytes; a signature stays verbatim in the message as git
keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from enroute_core.base.errors import InvalidObject
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.commit import (
    Header,
    Identity,
    is_hex40,
    join_headers,
    oid_from_header,
    split_headers,
)
from enroute_core.git.object_type import ObjectType

TAG_BYTES_MIN = 64  # git: hexsz + 24
_TYPE_NAMES = {t.type_name: t for t in ObjectType}


@dataclass(frozen=True, slots=True)
class Tag:
    """An annotated tag as its ordered headers and message."""

    headers: tuple[Header, ...]
    message: bytes | None
    header_newline: bool = True

    kind: ClassVar[ObjectType] = ObjectType.TAG

    def __post_init__(self) -> None:
        assert self.header_newline or (self.message is None and self.headers), self

    @classmethod
    def parse(cls, body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Tag:
        del limits  # a tag has nothing to bound beyond its size
        headers, message, header_newline = split_headers(body)
        tag = cls(headers, message, header_newline)
        _check(tag, len(body))
        return tag

    @classmethod
    def create(
        cls,
        *,
        object: ObjectId,
        object_type: ObjectType,
        name: bytes,
        tagger: Identity | None,
        message: bytes,
        extra: Sequence[Header] = (),
    ) -> Tag:
        """A tag in the order ``git tag -a`` writes one."""
        headers = [
            Header(b"object", object.hex().encode()),
            Header(b"type", object_type.type_name),
            Header(b"tag", name),
        ]
        if tagger is not None:
            headers.append(Header(b"tagger", tagger.serialize()))
        headers += extra
        tag = cls(tuple(headers), message)
        _check(tag, len(tag.serialize()))
        return tag

    def serialize(self) -> bytes:
        return join_headers(self.headers, self.message, self.header_newline)

    @property
    def object(self) -> ObjectId:
        """The tagged object."""
        _check(self, None)
        return oid_from_header(self.headers[0].value)

    @property
    def object_type(self) -> ObjectType:
        """The type the tag claims for the tagged object."""
        _check(self, None)
        return _TYPE_NAMES[self.headers[1].value]

    @property
    def name(self) -> bytes:
        _check(self, None)
        return self.headers[2].first_line

    @property
    def tagger(self) -> Identity | None:
        """The ``tagger`` line right after the ``tag`` line, as git reads it, or None."""
        h = self._tagger_header()
        return None if h is None else Identity.parse(h.first_line)

    @property
    def extra_headers(self) -> tuple[Header, ...]:
        """Headers after object, type, tag and tagger, in order."""
        return self.headers[3 if self._tagger_header() is None else 4 :]

    def _tagger_header(self) -> Header | None:
        _check(self, None)
        hs = self.headers
        if len(hs) > 3 and not hs[2].has_continuation and hs[3].key == b"tagger" and hs[3].spaced:
            return hs[3]
        return None


def _check(tag: Tag, size: int | None) -> None:
    """git's ``parse_tag_buffer``, read off the headers.

    ``object``, ``type`` and ``tag`` lines come first, in that order, each
    ended by LF; the type is one of the four names.
    """
    if size is not None and size < TAG_BYTES_MIN:
        raise InvalidObject(f"tag is {size} bytes, git needs at least {TAG_BYTES_MIN}")
    hs = tag.headers
    if len(hs) < 3:
        raise InvalidObject("tag lacks its object, type or tag line")
    obj, typ, name = hs[0], hs[1], hs[2]
    if obj.key != b"object" or not obj.spaced or not is_hex40(obj.value):
        raise InvalidObject("tag has a bad object line")
    if typ.key != b"type" or not typ.spaced or typ.value not in _TYPE_NAMES:
        raise InvalidObject("tag has a bad type line", type=typ.value[:32].hex())
    if name.key != b"tag" or not name.spaced:
        raise InvalidObject("tag has a bad tag line")
    ended = name.has_continuation or len(hs) > 3 or tag.message is not None
    if not (ended or tag.header_newline):
        raise InvalidObject("tag line is not ended by a newline")
