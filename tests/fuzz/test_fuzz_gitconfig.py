"""Fuzz target: git's config syntax (``enroute_core.git.gitconfig``) and the .gitmodules checks.

git ``config.c`` (``git_parse_source`` and the readers it calls); fsck.c
``fsck_blob``, ``fsck_gitmodules_fn``, ``check_submodule_url``. Inputs:
``.gitmodules`` texts in every form git reads (sections and subsections with
escapes, bare keys, continued lines, comments, CRLF, NUL, FF, a BOM), mutated
byte by byte and spliced, texts drawn from the grammar's own tokens, and raw
bytes. Properties:

1. reading never raises: ``parse_config`` (both readings), ``blob_readings``
   and ``fsck_gitmodules`` answer for any bytes, and ``check_special_blob``
   lets only ``InvalidObject`` escape;
2. the runs the parser skips with a regular expression (plain value bytes,
   quoted spans, comments) read exactly as the byte-by-byte port reads them;
3. what a callback would see holds no NUL, and names start with a lowercased
   section: ``[a-z0-9.-]*`` up to its first dot; a refusal names a problem
   ``fsck_gitmodules`` found.
"""

from __future__ import annotations

import re

import pytest
from fuzzkit import fuzz_bytes, fuzz_settings, typed_errors
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidObject
from enroute_core.base.ids import ObjectId
from enroute_core.git import gitconfig
from enroute_core.git.fsck import SpecialBlob, check_special_blob, fsck_gitmodules
from enroute_core.git.gitconfig import ConfigParse, blob_readings, parse_config

pytestmark = pytest.mark.fuzz

OID = ObjectId(b"\x01" * 20)
_SEEDS = [
    b'[submodule "x"]\n\tactive\n\turl = -u./payload\n\tupdate = !cmd',
    b'[submodule "lib"]\n\tpath = lib\n\turl = https://example.com/lib.git ; c\n',
    b'[SubModule "a\\"b"]\r\n\tpath = "a b" # c\r\n\turl = ../x\\\r\n.git\r\n',
    b'\xef\xbb\xbf[submodule.x]\n\tupdate = "!x"\n[include]\n\tpath = y\n',
    b'[submodule "x"]\n\turl = ./ok\xff\n\tpath = -x\n\tk = a\\tb\\n\\"\\\\\n',
    b'# c\n; c\n[core]\nk\n[submodule "x\0y"]\nurl = u\0-x\n[broken',
]
_TOKENS = [b"[", b"]", b'"', b"\\", b"\n", b"\r\n", b"\r", b" ", b"\t", b"=", b"#", b";",
           b"submodule", b"url", b"path", b"update", b".", b"-", b"!", b"x", b"\0", b"\xff",
           b"\xef\xbb\xbf", b"\\\n", b"..", b"/"]  # fmt: skip
TEXTS = fuzz_bytes(_SEEDS, max_mutations=4) | st.lists(st.sampled_from(_TOKENS), max_size=40).map(
    b"".join
)
_SECTION = re.compile(rb"[a-z0-9.-]*")


class _ByteByByte(gitconfig._Parser):
    """The port with no regular-expression shortcut: every byte through ``_next``."""

    def _skip(self, pattern: re.Pattern[bytes]) -> bytes:
        return b""


def _slow(data: bytes, signed_char: bool) -> ConfigParse:
    return _ByteByByte(data, signed_char).run()


@fuzz_settings(800)
@given(text=TEXTS)
def test_reading_never_raises_and_shortcuts_agree(text: bytes) -> None:
    for signed in (False, True):
        parsed = parse_config(text, signed_char=signed)
        assert parsed == _slow(text, signed)
        for entry in parsed.entries:
            assert b"\0" not in entry.name
            assert entry.value is None or b"\0" not in entry.value
            section = entry.name.split(b".", 1)[0]
            assert _SECTION.fullmatch(section), entry.name
    readings = blob_readings(text)
    assert readings[0] == parse_config(text)
    problems = fsck_gitmodules(text)
    tally(f"readings={len(readings)} ok={readings[0].ok} problems={len(problems)}")
    with typed_errors(InvalidObject) as caught:
        check_special_blob(SpecialBlob.GITMODULES, OID, 3, lambda: text, len(text))
    for exc in caught:  # a refusal names one of the problems found
        assert exc.details["msg_id"] in {p.msg.value for p in problems}


@fuzz_settings(300)
@given(body=st.binary(max_size=256))
def test_raw_bytes(body: bytes) -> None:
    for signed in (False, True):
        assert parse_config(body, signed_char=signed) == _slow(body, signed)
    with typed_errors(InvalidObject):
        check_special_blob(SpecialBlob.GITMODULES, OID, 3, lambda: body, len(body))
