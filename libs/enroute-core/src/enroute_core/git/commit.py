"""Commit objects, parsed and written back byte for byte.

Layout (git ``commit.c``, ``parse_commit_buffer``; the header grammar and the
``gpgsig``/``mergetag`` headers are in ``Documentation/gitformat-signature.txt``,
"Commit signatures" and "Mergetag signatures")::

    commit       = "tree " hex40 LF
                   ("parent " hex40 LF)*
                   header*              ; author, committer, encoding, gpgsig, mergetag, ...
                   [LF message]         ; the blank line and message may be absent
    header       = key [SP first-line] LF (SP continuation-line LF)*
    identity     = name "<" email ">" [SP timestamp SP ("+" | "-") digits]

Preservation rule: a commit is kept as its ordered headers (key, value with
continuation lines joined by LF) plus the message, so :meth:`Commit.serialize`
gives back exactly the bytes :meth:`Commit.parse` read, whatever their order,
spacing or unknown headers. Typed values (tree, parents, identities) are read
from the headers on demand. Parsing refuses only what git's own parser
refuses: a missing or bad ``tree`` line, and a bad ``parent`` line among the
parent lines right after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.object_type import ObjectType

_HEX_DIGITS = b"0123456789abcdefABCDEF"
# git's isspace (git-compat-util.h sane_ctype): no \v or \f.
_GIT_SPACE = b" \t\n\r"
_TIMESTAMP_MAX = 2**64 - 1
_DATE_RE = re.compile(rb"[ \t\n\r]*([0-9]+)[ \t\n\r]*([+-][0-9]+)")

# Keys the typed accessors own; every other header is an "extra" header
# (git's read_commit_extra_header_lines keeps the same split).
STANDARD_COMMIT_KEYS = frozenset({b"tree", b"parent", b"author", b"committer", b"encoding"})


def is_hex40(text: bytes) -> bool:
    """40 hex digits of either case: git's ``get_oid_hex`` accepts upper case."""
    return len(text) == 40 and not text.translate(None, _HEX_DIGITS)


def oid_from_header(text: bytes) -> ObjectId:
    assert is_hex40(text), text
    return ObjectId(bytes.fromhex(text.decode("ascii")))


@dataclass(frozen=True, slots=True)
class Header:
    """One header of a commit or tag: ``key SP value``, continuation lines joined by LF.

    ``spaced`` is False only for a line with no space at all (``b"key"``):
    git never writes one, but it parses, so it must round trip.
    """

    key: bytes
    value: bytes
    spaced: bool = True

    def __post_init__(self) -> None:
        assert self.key and b" " not in self.key and b"\n" not in self.key, self.key
        assert self.spaced or not self.value or self.value.startswith(b"\n"), self

    @property
    def first_line(self) -> bytes:
        """The value up to its first continuation line: what git's header lookups see."""
        nl = self.value.find(b"\n")
        return self.value if nl < 0 else self.value[:nl]

    @property
    def has_continuation(self) -> bool:
        return b"\n" in self.value

    def encode(self) -> bytes:
        """The header's lines without the final LF."""
        sep = b" " if self.spaced else b""
        return self.key + sep + self.value.replace(b"\n", b"\n ")

    def encoded_len(self) -> int:
        return len(self.key) + self.spaced + len(self.value) + self.value.count(b"\n")


def split_headers(body: bytes) -> tuple[tuple[Header, ...], bytes | None, bool]:
    """Split an object body into (headers, message, header_newline).

    ``message`` is None when there is no blank line; ``header_newline`` is
    False only when the body ends inside its last header line.
    """
    headers: list[Header] = []
    key = b""
    spaced = False
    parts: list[bytes] = []
    pos = 0
    end = len(body)
    message: bytes | None = None
    header_newline = True
    while pos < end:
        nl = body.find(b"\n", pos)
        if nl == pos:
            message = body[pos + 1 :]
            break
        line = body[pos:] if nl < 0 else body[pos:nl]
        if line[0] == 0x20:
            if not key:
                raise InvalidObject("object starts with a continuation line")
            parts.append(line[1:])
        else:
            if key:
                headers.append(Header(key, b"\n".join(parts), spaced))
            key, sep, value = line.partition(b" ")
            spaced = bool(sep)
            parts = [value]
        if nl < 0:
            header_newline = False
            break
        pos = nl + 1
    if key:
        headers.append(Header(key, b"\n".join(parts), spaced))
    return tuple(headers), message, header_newline


def join_headers(headers: Sequence[Header], message: bytes | None, header_newline: bool) -> bytes:
    """The inverse of :func:`split_headers`."""
    parts = [b"\n".join([h.encode() for h in headers])]
    if header_newline and headers:
        parts.append(b"\n")
    if message is not None:
        parts += (b"\n", message)
    return b"".join(parts)


def tail_len(
    headers: Sequence[Header], index: int, message: bytes | None, header_newline: bool
) -> int:
    """Bytes from the start of ``headers[index]`` to the end of the object."""
    n = sum(h.encoded_len() + 1 for h in headers[index:])
    if not header_newline:
        n -= 1
    if message is not None:
        n += 1 + len(message)
    return n


@dataclass(frozen=True, slots=True)
class Identity:
    """An author, committer or tagger: ``name <email> timestamp tz``.

    ``timestamp`` and ``tz`` are None for an identity without a usable date,
    as git's ``split_ident_line`` treats it ("person only"). ``tz`` is the
    offset as written (``b"+0200"``).
    """

    name: bytes
    email: bytes
    timestamp: int | None = None
    tz: bytes | None = None

    @classmethod
    def parse(cls, line: bytes) -> Identity:
        """Read an identity the way git's ``split_ident_line`` does.

        The name is everything before the first ``<`` with trailing spaces
        dropped; the email runs to the first ``>`` after it; the date follows
        the last ``>``. Only a missing ``<`` or ``>`` is refused.
        """
        lt = line.find(b"<")
        if lt < 0:
            raise InvalidObject("identity has no '<'", line=_show(line))
        gt = line.find(b">", lt + 1)
        if gt < 0:
            raise InvalidObject("identity has no '>'", line=_show(line))
        name = line[:lt].rstrip(_GIT_SPACE)
        email = line[lt + 1 : gt]
        date = _DATE_RE.match(line, line.rfind(b">") + 1)
        if date is None:
            return cls(name, email)
        digits = date.group(1).lstrip(b"0") or b"0"
        # git's strtoumax saturates; int() of thousands of digits would refuse.
        timestamp = _TIMESTAMP_MAX if len(digits) > 20 else min(int(digits), _TIMESTAMP_MAX)
        return cls(name, email, timestamp, date.group(2))

    def serialize(self) -> bytes:
        """The canonical line git writes; refuses what would not read back the same."""
        for part in (self.name, self.email):
            if b"<" in part or b">" in part or b"\n" in part:
                raise InvalidObject("identity name or email contains '<', '>' or a newline")
        if self.name != self.name.rstrip(_GIT_SPACE):
            raise InvalidObject("identity name ends with a space")
        out = self.name + b" <" + self.email + b">"
        if self.timestamp is None and self.tz is None:
            return out
        if self.timestamp is None or self.tz is None:
            raise InvalidObject("identity has a timestamp without a zone or a zone without one")
        if re.fullmatch(rb"[+-][0-9]+", self.tz) is None or self.timestamp < 0:
            raise InvalidObject("identity has a bad timestamp or zone")
        return out + b" %d " % self.timestamp + self.tz


def _show(raw: bytes) -> str:
    return raw[:80].decode("utf-8", "replace")


def first_header(headers: Iterable[Header], key: bytes) -> Header | None:
    for h in headers:
        if h.key == key and h.spaced:
            return h
    return None


@dataclass(frozen=True, slots=True)
class Commit:
    """A commit as its ordered headers and message; see the module docstring."""

    headers: tuple[Header, ...]
    message: bytes | None
    header_newline: bool = True

    kind: ClassVar[ObjectType] = ObjectType.COMMIT

    def __post_init__(self) -> None:
        assert self.header_newline or (self.message is None and self.headers), self

    @classmethod
    def parse(cls, body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Commit:
        headers, message, header_newline = split_headers(body)
        commit = cls(headers, message, header_newline)
        _tree_and_parents(commit, limits.commit_parents_max)
        return commit

    @classmethod
    def create(
        cls,
        *,
        tree: ObjectId,
        parents: Sequence[ObjectId] = (),
        author: Identity,
        committer: Identity,
        message: bytes,
        encoding: bytes | None = None,
        extra: Sequence[Header] = (),
    ) -> Commit:
        """A commit in the order git writes one (``commit.c``, ``commit_tree_extended``)."""
        headers = [Header(b"tree", tree.hex().encode())]
        headers += [Header(b"parent", p.hex().encode()) for p in parents]
        headers += [Header(b"author", author.serialize())]
        headers += [Header(b"committer", committer.serialize())]
        if encoding is not None:
            headers.append(Header(b"encoding", encoding))
        headers += extra
        return cls(tuple(headers), message)

    def serialize(self) -> bytes:
        return join_headers(self.headers, self.message, self.header_newline)

    @property
    def tree(self) -> ObjectId:
        return _tree_and_parents(self, None)[0]

    @property
    def parents(self) -> tuple[ObjectId, ...]:
        """The parents git sees: the ``parent`` lines right after the tree line."""
        return _tree_and_parents(self, None)[1]

    @property
    def author(self) -> Identity | None:
        """The first ``author`` header, or None; a line without ``<``/``>`` raises."""
        h = first_header(self.headers, b"author")
        return None if h is None else Identity.parse(h.first_line)

    @property
    def committer(self) -> Identity | None:
        h = first_header(self.headers, b"committer")
        return None if h is None else Identity.parse(h.first_line)

    @property
    def encoding(self) -> bytes | None:
        h = first_header(self.headers, b"encoding")
        return None if h is None else h.first_line

    @property
    def extra_headers(self) -> tuple[Header, ...]:
        """Headers other than tree, parent, author, committer and encoding, in order."""
        return tuple(h for h in self.headers if h.key not in STANDARD_COMMIT_KEYS)

    def header(self, key: bytes) -> bytes | None:
        """The whole value of the first header called ``key``."""
        h = first_header(self.headers, key)
        return None if h is None else h.value

    def without_headers(self, *keys: bytes) -> Commit:
        """This commit with every header named in ``keys`` dropped.

        ``without_headers(b"gpgsig", b"gpgsig-sha256")`` gives the payload a
        commit signature covers (gitformat-signature, "Commit signatures").
        """
        kept = tuple(h for h in self.headers if h.key not in keys)
        return Commit(kept, self.message, self.header_newline or not kept)


def _tree_and_parents(
    commit: Commit, parents_max: int | None
) -> tuple[ObjectId, tuple[ObjectId, ...]]:
    """git's ``parse_commit_buffer``, read off the headers.

    The tree line must be first and complete, with at least one byte after
    it. A ``parent`` line is looked at only while at least 48 bytes remain;
    it must then be ``parent <hex40> LF`` with a byte after it.
    """
    hs = commit.headers
    if not hs or hs[0].key != b"tree" or not hs[0].spaced:
        raise InvalidObject("commit does not start with a tree line")
    tree_hex = hs[0].first_line
    if not is_hex40(tree_hex):
        raise InvalidObject("commit has a bad tree line", tree=_show(tree_hex))
    if len(hs) == 1 and not hs[0].has_continuation and commit.message is None:
        raise InvalidObject("commit ends after its tree line")
    parents: list[ObjectId] = []
    for i in range(1, len(hs)):
        h = hs[i]
        if h.key != b"parent" or not h.spaced:
            break
        hex_ = h.first_line
        followed = h.has_continuation or i + 1 < len(hs) or commit.message is not None
        if not (followed and is_hex40(hex_)):
            if tail_len(hs, i, commit.message, commit.header_newline) <= 47:
                break
            raise InvalidObject("commit has a bad parent line", parent=_show(hex_))
        if parents_max is not None and len(parents) >= parents_max:
            raise LimitExceeded("commit_parents_max", len(parents) + 1, parents_max)
        parents.append(oid_from_header(hex_))
        if h.has_continuation:
            break
    return oid_from_header(tree_hex), tuple(parents)


_TREE_LINE_BYTES = 46  # "tree " + 40 hex digits + LF
_PARENT_LINE_BYTES = 48  # "parent " + 40 hex digits + LF
_UINTMAX = 2**64 - 1


def commit_date(body: bytes, parents: int) -> int:
    """The commit time git keeps for a commit (``commit.c``, ``parse_commit_date``).

    ``parents`` is how many parent lines :meth:`Commit.parse` read. Git reads
    the number after the last ``>`` of the committer line, which must follow
    the author line right after the parents; the zone is not looked at, so a
    commit with ``--700`` or no email still has its time, and one without
    those lines has 0. The number is ``strtoumax``'s: saturated, a ``-`` taken
    modulo 2**64 (:meth:`Identity.parse` reads identities as ``split_ident_line``
    does, which gives such lines no date at all).
    """
    pos = _TREE_LINE_BYTES + _PARENT_LINE_BYTES * parents
    end = len(body)
    if pos + 6 >= end or not body.startswith(b"author", pos):
        return 0
    nl = body.find(b"\n", pos)
    if nl < 0:
        return 0
    line = nl + 1
    if line + 9 >= end or not body.startswith(b"committer", line):
        return 0
    eol = body.find(b"\n", line)
    if eol < 0:
        return 0
    gt = body.rfind(b">", line, eol)
    if gt < 0:
        return 0
    date = gt + 1
    while date < eol and body[date] in _GIT_SPACE:
        date += 1
    number = _STRTOUMAX.match(body, date, eol)
    if number is None:
        return 0  # neither a digit nor '-' first: git returns 0 without parsing
    digits = number.group(2).lstrip(b"0") or b"0"
    if len(digits) > 20 or int(digits) > _UINTMAX:
        return _UINTMAX  # ERANGE, whatever the sign
    value = int(digits)
    return (-value) % (_UINTMAX + 1) if number.group(1) else value


_STRTOUMAX = re.compile(rb"(-?)([0-9]+)")
