"""git's config syntax (``enroute_core.git.gitconfig``) and the .gitmodules checks built on it.

Golden cases: what git's ``config.c`` reads (``git_parse_source``, ``get_base_var``,
``get_extended_base_var``, ``get_value``, ``parse_value``, ``get_next_char``), each
also checked against ``git config -f <file> -z --list`` (a file reading) when git is
at hand; urls against fsck.c ``check_submodule_url`` and git's own ``git fsck``
(t7416-submodule-dash-url.sh has the cases git keeps out). Issue 20's hostile
``.gitmodules`` with a bare key is here.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidObject
from enroute_core.base.ids import ObjectId
from enroute_core.git.fsck import (
    FsckPolicy,
    Severity,
    SpecialBlob,
    check_special_blob,
    fsck_gitmodules,
)
from enroute_core.git.gitconfig import (
    ConfigEntry,
    blob_readings,
    parse_config,
    split_key,
)

OID = ObjectId(b"\x01" * 20)
HOSTILE = b'[submodule "x"]\n\tactive\n\turl = -u./payload\n\tupdate = !cmd'

Entries = list[tuple[bytes, bytes | None]]

# (text, the variables git's callback sees, whether git parses the whole text)
GOLDEN: list[tuple[bytes, Entries, bool]] = [
    (HOSTILE, [(b"submodule.x.active", None), (b"submodule.x.url", b"-u./payload"),
               (b"submodule.x.update", b"!cmd")], True),
    # parse_value: unquoted whitespace runs become one space each byte, kept only inside
    (b'[a]\n\tk = " a  b " c \n', [(b"a.k", b" a  b  c")], True),
    (b"[a]\nk = a\t \tb\t\n", [(b"a.k", b"a   b")], True),
    (b"[a]\nk = a\\\n b\n", [(b"a.k", b"a b")], True),  # a continued line
    (b"[a]\r\nk = a\\\r\n-b\r\n", [(b"a.k", b"a-b")], True),  # CR LF reads as LF
    (b"[a]\nk = a\rb\n", [(b"a.k", b"a b")], True),  # a lone CR is whitespace
    (b'[a]\nk = x\\t\\n\\b\\\\\\"y\n', [(b"a.k", b'x\t\n\b\\"y')], True),
    (b"[a]\nk = x ; c\nj = y # c\n", [(b"a.k", b"x"), (b"a.j", b"y")], True),
    (b'[a]\nk = "x;y#z"\n', [(b"a.k", b"x;y#z")], True),
    (b'[a]\nk = "" -u\n', [(b"a.k", b"-u")], True),  # nothing kept yet: the space goes
    (b"[a]\nk =\nj=\n", [(b"a.k", b""), (b"a.j", b"")], True),
    (b"[a]\nk = x\0y\n", [(b"a.k", b"x")], True),  # callbacks see C strings
    # get_value: bare keys, keys case-folded, junk after a key
    (b"[a]\n\tbare\n\tBare2\t \n\tlast", [(b"a.bare", None), (b"a.bare2", None),
                                         (b"a.last", None)], True),
    (b"[a]\nk x\n", [], False),
    (b"[a]\nk = v\nbare ; a comment\n", [(b"a.k", b"v")], False),  # only = or EOL after a key
    (b"[a]\n1k = v\n", [], False),
    (b"[a]\n-k = v\n", [], False),
    (b"[a]\nk\x0b= v\n", [], False),  # git's isspace has no VT
    (b"k = v\n[a]\n", [(b"k", b"v")], True),  # a key before any section
    (b"[a]k=v\n", [(b"a.k", b"v")], True),  # a header and a key on one line
    # headers: [section], [section.sub] (lowercased), [section "sub"] (kept, escapes)
    (b"[Sub.Module.X]\nk=v\n", [(b"sub.module.x.k", b"v")], True),
    (b'[SubModule "A\\"b\\\\c\\d"]\nK=v\n', [(b'submodule.A"b\\cd.k', b"v")], True),
    (b'[submodule\t "x"]\nk=v\n', [(b"submodule.x.k", b"v")], True),
    (b'[ "x"]\nk=v\n', [(b".x.k", b"v")], True),
    (b'[submodule "x\0y"]\nurl=-u\n', [(b"submodule.x", b"-u")], True),
    (b'[submodule "x" ]\nk=v\n', [], False),
    (b'[submodule "x]\nk=v\n', [], False),
    (b'[submodule\n"x"]\nk=v\n', [], False),
    (b"[]\nk=v\n", [], False),
    (b"[a b]\n", [], False),
    (b"[a_b]\n", [], False),
    (b"[a", [], False),
    # values that fail: unknown escape, unclosed quote; the variables before still count
    (b"[a]\nk = -u\nj = \\x\n", [(b"a.k", b"-u")], False),
    (b'[a]\nk = -u\nj = "x\n', [(b"a.k", b"-u")], False),
    (b"[a]\nk = -u\n[broken", [(b"a.k", b"-u")], False),
    # include sections are variables: a blob's includes are never followed
    (b"[include]\n\tpath = /etc/passwd\n[includeIf \"gitdir:/\"]\n\tpath = x\n",
     [(b"include.path", b"/etc/passwd"), (b"includeif.gitdir:/.path", b"x")], True),
    # a BOM is skipped in a file; comments and blank lines anywhere
    (b"\xef\xbb\xbf[a]\nk=v\n", [(b"a.k", b"v")], True),
    (b"\xef\xbb[a]\n", [], False),
    (b"# c\n; c\n\n  \t\n[a] # c\n", [], True),
    (b"", [], True),
]  # fmt: skip


def _pairs(entries: tuple[ConfigEntry, ...]) -> Entries:
    return [(e.name, e.value) for e in entries]


@pytest.mark.parametrize(("text", "entries", "ok"), GOLDEN)
def test_golden(text: bytes, entries: Entries, ok: bool) -> None:
    parsed = parse_config(text)
    assert _pairs(parsed.entries) == entries
    assert parsed.ok == ok


@pytest.mark.interop
@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git CLI")
def test_golden_as_git_config_reads_a_file(tmp_path: Path) -> None:
    """``git config -f <file> --list -z``: one entry per variable, ``name LF value NUL``
    (``name NUL`` for a bare key), and exit 128 ("bad config line") on a syntax error."""
    for i, (text, entries, ok) in enumerate(GOLDEN):
        path = tmp_path / f"c{i}"
        path.write_bytes(text)
        done = subprocess.run(
            ["git", "config", "-f", str(path), "--list", "-z"],
            capture_output=True,
            check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"},
        )
        assert (done.returncode == 0) == ok, (text, done.stderr)
        if ok:
            got = [
                tuple(item.split(b"\n", 1)) if b"\n" in item else (item, None)
                for item in done.stdout.split(b"\0")[:-1]
            ]
            assert got == entries, text


def test_every_cut_and_flip_of_every_golden_reads_without_raising() -> None:
    """The parser has no error to raise: any bytes give entries and a verdict."""
    for text, _, _ in GOLDEN:
        for cut in range(len(text) + 1):
            blob_readings(text[:cut])
        for i in range(len(text)):
            for flip in (0x01, 0x20, 0x80, 0xFF):
                blob_readings(text[:i] + bytes([text[i] ^ flip]) + text[i + 1 :])


def test_two_readings_of_a_blob() -> None:
    """FF is EOF for git_config_from_mem on a signed-char platform, and the BOM is not
    matched there (config.c compares the signed byte with 0377): what either reading
    finds counts."""
    text = b'[submodule "x"]\n\turl = ./ok\xff\n\tpath = -x\n'
    as_file, as_blob = blob_readings(text)
    assert _pairs(as_file.entries)[-1] == (b"submodule.x.path", b"-x")
    assert _pairs(as_blob.entries) == [(b"submodule.x.url", b"./ok")] and as_blob.ok
    assert [p.msg.value for p in fsck_gitmodules(text)] == ["gitmodulesPath"]
    bom = b'\xef\xbb\xbf[submodule "x"]\n\turl = -x\n'
    assert [p.msg.value for p in fsck_gitmodules(bom)] == ["gitmodulesUrl", "gitmodulesParse"]
    assert len(blob_readings(b"[a]\n")) == 1


def test_split_key_is_parse_config_key() -> None:
    assert split_key(b"submodule.a.b.url", b"submodule") == (b"a.b", b"url")
    assert split_key(b"submodule..url", b"submodule") == (b"", b"url")
    assert split_key(b"submodule.url", b"submodule") == (None, b"url")
    assert split_key(b"submodulex.a.url", b"submodule") is None
    assert split_key(b"core.a.url", b"submodule") is None


# -- fsck_gitmodules on the grammar ------------------------------------------------------------


def _ids(text: bytes) -> list[str]:
    return [p.msg.value for p in fsck_gitmodules(text)]


def test_issue_20_hostile_gitmodules_with_a_bare_key_is_refused() -> None:
    """A bare key no longer switches every check off (issue 20); git fsck reports the same."""
    assert _ids(HOSTILE) == ["gitmodulesUrl", "gitmodulesUpdate"]
    with pytest.raises(InvalidObject, match="gitmodulesUrl"):
        check_special_blob(SpecialBlob.GITMODULES, OID, 3, lambda: HOSTILE, len(HOSTILE))


def test_variables_before_a_syntax_error_are_checked() -> None:
    """fsck.c ``fsck_blob``: the callback runs for each variable git read before failing."""
    text = b'[submodule "x"]\n\turl = -u\n[broken'
    assert _ids(text) == ["gitmodulesUrl", "gitmodulesParse"]
    lenient = FsckPolicy(overrides={"gitmodulesParse": Severity.INFO})
    with pytest.raises(InvalidObject, match="gitmodulesUrl"):
        check_special_blob(SpecialBlob.GITMODULES, OID, 3, lambda: text, len(text), policy=lenient)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b'[submodule "x"]\n\turl = \\\n-u\n', ["gitmodulesUrl"]),
        (b'[submodule "x"]\r\n\tpath = "-x"\r\n', ["gitmodulesPath"]),
        (b"[submodule.x]\n\tupdate = !x\n", ["gitmodulesUpdate"]),
        (b"[submodule..]\n\tpath = x\n", []),  # submodule...path: the name is "."
        (b"[submodule...]\n\tpath = x\n", ["gitmodulesName"]),  # submodule....path: ".."
        (b'[submodule ""]\n\tpath = x\n', ["gitmodulesName"]),
        (b'[submodule "a\\\\..\\\\b"]\n\tx\n', ["gitmodulesName"]),
        (b"[submodule]\n\turl = -x\n", []),  # no name: nothing git reads as a submodule
        (b"url = -x\n", []),
        (b'[include]\n\tpath = -x\n[submodule "x"]\n\tpath = ok\n', []),
        (b'[submodule "x"]\n\turl = "-u" \n\tupdate = none\n', ["gitmodulesUrl"]),
        (b'[submodule "x"]\n\tURL = ./ok\n\tPath = x\n\tUPDATE = rebase\n', []),
        (b'[submodule "x"]\n\turl = u\0-foo\n', []),  # git sees "u"
        (b'[submodule "x"]\n\turl = -u\0foo\n', ["gitmodulesUrl"]),
    ],
)
def test_gitmodules_through_the_grammar(text: bytes, expected: list[str]) -> None:
    assert _ids(text) == expected


# -- check_submodule_url -----------------------------------------------------------------------

# (url, git 2.39 refuses it, Enroute refuses it): Enroute may refuse more, never less.
URLS: list[tuple[bytes, bool, bool]] = [
    (b"-u./payload", True, True),
    (b"--upload-pack=x", True, True),
    (b"./ok", False, False),
    (b"../sibling.git", False, False),
    (b"https://example.com/x.git", False, False),
    (b"git@example.com:x.git", False, False),
    (b"ssh://example.com/x", False, False),
    # relative or git:// with a newline once %-decoded (t7416)
    (b"./%0ahost=two.example.com/foo.git", True, True),
    (b"git://h/%0a", True, True),
    # relative urls that climb into the scheme or the host (CVE-2020-11008, t7416)
    (b"../../:localhost", True, True),
    (b"../..//example.com", True, True),
    (b"..\\..\\:x", True, True),
    (b"./../:x", True, True),
    (b"../../x", False, False),
    # urls git-remote-curl would get: a credential must parse and have a host
    (b"http::://one.example.com/foo.git", True, True),
    (b"http::https:///one.example.com/foo.git", True, True),
    (b"https:///x", True, True),
    (b"https://@/x", True, True),
    (b"https://one.example.com%0ahost=two.example.com/foo.git", True, True),
    (b"https://u%0a@h/x", True, True),
    (b"http::https://h/x", False, False),
    # git 2.39.5 ends the host at ? and # too (earlier ones at / alone); both readings count
    (b"https://?x", True, True),
    (b"https://#x", True, True),
    # git's url_decode leaves %00 as it is; Enroute decodes it, and the host is then empty
    (b"https://%00/x", False, True),
    (b"https://h/%0a", True, True),
    # a newline in a url of any other scheme: git lets these through, Enroute does not
    (b"data://acjbkd%0akajfdickajkd", False, True),
    (b"ssh://h/%0a", False, True),
]


def _url_text(url: bytes) -> bytes:
    return b'[submodule "x"]\n\turl = ' + url.replace(b"\\", b"\\\\") + b"\n"


@pytest.mark.parametrize(("url", "git_refuses", "refused"), URLS)
def test_submodule_urls(url: bytes, git_refuses: bool, refused: bool) -> None:
    assert git_refuses <= refused
    text = _url_text(url)
    assert ("gitmodulesUrl" in _ids(text)) == refused


@pytest.mark.interop
@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git CLI")
def test_submodule_urls_as_git_fsck_judges_them(tmp_path: Path) -> None:
    """The ``git_refuses`` column of :data:`URLS`, from git itself (one fsck, every url)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str, data: bytes = b"") -> bytes:
        done = subprocess.run(
            ["git", *args], cwd=tmp_path / "r", input=data, capture_output=True, env=env,
            check=False,
        )  # fmt: skip
        return done.stdout + done.stderr

    subprocess.run(["git", "init", "-q", "--bare", "r"], cwd=tmp_path, env=env, check=True)
    oids = {}
    for url, _, _ in URLS:
        text = _url_text(url)
        oid = git("hash-object", "-w", "--stdin", data=text).strip().decode()
        assert oid == hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest()
        git("mktree", data=f"100644 blob {oid}\t.gitmodules\n".encode())
        oids[url] = oid
    report = git("fsck", "--no-dangling").decode()
    for url, git_refuses, _ in URLS:
        said = f"{oids[url]}: gitmodulesUrl" in report
        assert said == git_refuses, url
