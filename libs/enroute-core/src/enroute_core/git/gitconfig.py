"""Git's config-file syntax, read as git's ``config.c`` reads it (docs/formats/gitconfig.md).

Grammar (git ``config.c``: ``git_parse_source``, ``get_base_var``,
``get_extended_base_var``, ``get_value``, ``parse_value``, ``get_next_char``;
``Documentation/config.txt``, "Syntax")::

    file     = [BOM] line*                 BOM = EF BB BF (skipped when read as a file)
    line     = ws* (section | variable | comment | "") ws* [comment] EOL
    section  = "[" name "]"                name = [A-Za-z0-9.-]+, lowercased; may be empty
             | "[" name? ws+ '"' sub '"' "]"
    sub      = (any byte but '"', '\\' or EOL | "\\" any-byte-but-EOL)*   case kept
    variable = ALPHA keychar* [SP|HT]* ["=" value]    keychar = [A-Za-z0-9-], lowercased
    value    = (plain | '"' quoted '"' | escape | "\\" EOL)*   to EOL outside quotes
    escape   = "\\" ("\\" | '"' | "n" | "t" | "b")  anything else after "\\" is an error
    comment  = ("#" | ";") to EOL          (outside quotes, also after a value)
    EOL      = LF | CR LF | end of input   ws = SP | HT | CR | LF (git's isspace)

A variable with no ``=`` is a bare key: boolean true, its value ``None``. In
a value, whitespace outside quotes is kept only between other bytes, each
byte of it becoming one space; a quoted span keeps every byte as is. A key
may come before any section (its name then has no dot). ``include`` and
``includeIf`` sections are ordinary variables here: git follows them only for
files it opens itself, never for a blob (fsck.c ``fsck_blob`` calls
``git_config_from_mem`` with its own callback, no include handler).

Git's callbacks see names and values as C strings: everything from the first
NUL on is invisible to them, so :class:`ConfigEntry` holds them cut there.

Where git fails (``git config -f`` dies with "bad config line", fsck reports
``gitmodulesParse``): a line that starts with a byte that is not a letter,
``[``, ``#``, ``;`` or whitespace; a bad byte in a section name; a
subsection not closed on its line, or anything but ``]`` right after its
closing quote; a key byte that is not a keychar followed by anything but
whitespace, ``=`` or EOL; an unknown escape or an unclosed quote in a value;
a header that reaches the end of input. Variables before the failure are
still delivered (git calls the callback as it goes): :class:`ConfigParse`
keeps them and the line of the failure.

Two readings. A file is read through ``fgetc`` (bytes as 0-255); a blob is
read from memory through ``char``, which is signed on x86: the byte FF then
equals ``EOF`` and ends the input where it stands (git's parser carries on
reading past it in some states, with its end-of-input flag stuck), and the
BOM never matches (git compares -17 with 239). :func:`blob_readings` gives
both, so a checker can hold a blob to what either kind of client reads.

Pure: bytes in, entries out; nothing raised for any input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ConfigEntry", "ConfigParse", "blob_readings", "parse_config", "split_key"]

BOM = b"\xef\xbb\xbf"
_EOF = -1
_LF, _CR, _SP, _HT = 0x0A, 0x0D, 0x20, 0x09
_SPACE = frozenset(b" \t\r\n")  # git's sane_ctype isspace: no VT, no FF, nothing over 127
_ALPHA = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_KEYCHAR = _ALPHA | frozenset(b"0123456789-")
_ESCAPES = {ord("\\"): ord("\\"), ord('"'): ord('"'), ord("n"): _LF, ord("t"): _HT, ord("b"): 8}
# Runs the slow path would take byte by byte with no other effect: plain value bytes
# outside quotes, any byte but the specials inside them, comment bodies.
_PLAIN = {False: re.compile(rb'[^\n\r\\"#; \t]+'), True: re.compile(rb'[^\n\r\\"#; \t\xff]+')}
_QUOTED = {False: re.compile(rb'[^\n\r\\"]+'), True: re.compile(rb'[^\n\r\\"\xff]+')}
_COMMENT = {False: re.compile(rb"[^\n\r]+"), True: re.compile(rb"[^\n\r\xff]+")}
# Between lines every whitespace byte is skipped alike; but a CR eats the FF after it when
# FF reads as EOF (git's ungetc is not called for EOF), so that pair goes byte by byte.
_WHITESPACE = {False: re.compile(rb"[ \t\r\n]+"), True: re.compile(rb"(?:[ \t\n]|\r(?!\xff))+")}
_BLANKS = re.compile(rb"[ \t]+")
_KEYCHARS = re.compile(rb"[A-Za-z0-9-]+")


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One variable as git's callback sees it: ``section[.subsection].key``, value or None.

    The section and key are lowercased, the subsection kept as written; both
    name and value end before their first NUL.
    """

    name: bytes
    value: bytes | None
    line: int


@dataclass(frozen=True, slots=True)
class ConfigParse:
    """The variables read, in order, and the line git's parser failed on (None: it did not)."""

    entries: tuple[ConfigEntry, ...]
    error_line: int | None

    @property
    def ok(self) -> bool:
        return self.error_line is None


def parse_config(data: bytes, *, signed_char: bool = False) -> ConfigParse:
    """Read ``data`` as git does: as a file, or (``signed_char``) as a blob on x86."""
    return _Parser(data, signed_char).run()


def blob_readings(data: bytes) -> tuple[ConfigParse, ...]:
    """Every way a git client reads ``data``: as a checked-out file, and as a blob on x86.

    The two differ only when ``data`` holds the byte FF or starts with a BOM;
    otherwise one reading is returned.
    """
    as_file = parse_config(data)
    if b"\xff" in data:
        return as_file, parse_config(data, signed_char=True)
    if data.startswith(BOM):
        return as_file, ConfigParse((), 1)  # the BOM's first byte is no line start for git
    return (as_file,)


def split_key(name: bytes, section: bytes) -> tuple[bytes | None, bytes] | None:
    """``parse_config_key``: (subsection or None, key) of a variable in ``section``, or None.

    The key is after the last dot; a subsection is whatever lies between the
    section's dot and that one, dots included.
    """
    if not name.startswith(section + b"."):
        return None
    rest = name[len(section) :]
    dot = rest.rfind(b".")
    if dot == 0:
        return None, rest[1:]
    return rest[1:dot], rest[dot + 1 :]


class _Parser:
    """A port of config.c's recursive reader: one byte at a time, with its end-of-input flag."""

    __slots__ = ("_data", "_entries", "_eof", "_line", "_pos", "_signed")

    def __init__(self, data: bytes, signed_char: bool) -> None:
        self._data = data
        self._signed = signed_char
        self._pos = 0
        self._eof = False
        self._line = 1
        self._entries: list[ConfigEntry] = []

    def run(self) -> ConfigParse:
        ok = self._source()
        return ConfigParse(tuple(self._entries), None if ok else self._line)

    # -- get_next_char: CR LF reads as LF, end of input as LF with the flag set --

    def _raw(self) -> int:
        if self._pos >= len(self._data):
            return _EOF
        c = self._data[self._pos]
        self._pos += 1
        return _EOF if c == 0xFF and self._signed else c

    def _next(self) -> int:
        c = self._raw()
        if c == _CR:
            after = self._raw()
            if after == _LF:
                c = _LF
            elif after != _EOF:
                self._pos -= 1  # git's ungetc; an EOF (or FF as EOF) after CR is dropped
        if c == _LF:
            self._line += 1
        elif c == _EOF:
            self._eof = True
            c = _LF
        return c

    def _skip(self, pattern: re.Pattern[bytes]) -> bytes:
        """Consume a run ``pattern`` matches: bytes the byte-by-byte path would take one by one
        with no effect but the one the caller gives the run (lines counted, bytes kept)."""
        m = pattern.match(self._data, self._pos)
        if m is None:
            return b""
        self._pos = m.end()
        return m.group()

    # -- git_parse_source --

    def _source(self) -> bool:
        if not self._signed and self._data.startswith(BOM):
            self._pos = len(BOM)
        comment = False
        var = b""
        while True:
            if comment:
                self._skip(_COMMENT[self._signed])
            elif not self._eof:  # once set, the next LF ends the input: read it byte by byte
                self._line += self._skip(_WHITESPACE[self._signed]).count(b"\n")
            c = self._next()
            if c == _LF:
                if self._eof:
                    return True
                comment = False
                continue
            if comment or c in _SPACE:
                continue
            if c in (ord("#"), ord(";")):
                comment = True
                continue
            if c == ord("["):
                base = self._base_var()
                if base is None or not base:
                    return False
                var = base + b"."
                continue
            if c not in _ALPHA:
                return False
            if not self._value(bytearray(var + bytes([c]).lower())):
                return False

    def _base_var(self) -> bytes | None:
        name = bytearray()
        while True:
            c = self._next()
            if self._eof:
                return None
            if c == ord("]"):
                return bytes(name)
            if c in _SPACE:
                return self._extended_base_var(name, c)
            if c not in _KEYCHAR and c != ord("."):
                return None
            name += bytes([c]).lower()

    def _extended_base_var(self, name: bytearray, c: int) -> bytes | None:
        while True:
            if c == _LF:
                return None
            c = self._next()
            if c not in _SPACE:
                break
        if c != ord('"'):
            return None
        name.append(ord("."))
        while True:
            c = self._next()
            if c == _LF:
                return None
            if c == ord('"'):
                break
            if c == ord("\\"):
                c = self._next()
                if c == _LF:
                    return None
            name.append(c)
        if self._next() != ord("]"):
            return None
        return bytes(name)

    # -- get_value and parse_value --

    def _value(self, name: bytearray) -> bool:
        line = self._line
        if not self._eof:  # once set (an FF read as EOF) the loop below stops at once
            name += self._skip(_KEYCHARS).lower()
        while True:
            c = self._next()
            if self._eof or c not in _KEYCHAR:
                break
            name += bytes([c]).lower()
        while c in (_SP, _HT):
            c = self._next()
        value: bytes | None = None
        if c != _LF:
            if c != ord("="):
                return False
            value = self._parse_value()
            if value is None:
                return False
        self._entries.append(
            ConfigEntry(
                bytes(name).partition(b"\0")[0],
                None if value is None else value.partition(b"\0")[0],
                line,
            )
        )
        return True

    def _parse_value(self) -> bytes | None:
        out = bytearray()
        quote = comment = False
        space = 0
        while True:
            if comment:
                self._skip(_COMMENT[self._signed])
            elif quote:
                out += self._skip(_QUOTED[self._signed])
            c = self._next()
            if c == _LF:
                return None if quote else bytes(out)
            if comment:
                continue
            if not quote and c in _SPACE:
                run = 1 + len(self._skip(_BLANKS))
                if out:
                    space += run
                continue
            if not quote and c in (ord(";"), ord("#")):
                comment = True
                continue
            if space:
                out += b" " * space
                space = 0
            if c == ord("\\"):
                c = self._next()
                if c == _LF:
                    continue  # a continued line
                escaped = _ESCAPES.get(c)
                if escaped is None:
                    return None
                out.append(escaped)
                continue
            if c == ord('"'):
                quote = not quote
                continue
            out.append(c)
            if not quote:
                out += self._skip(_PLAIN[self._signed])
