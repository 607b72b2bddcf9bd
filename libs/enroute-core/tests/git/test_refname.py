"""Ref names: every rule of git-check-ref-format.txt, and agreement with the real CLI."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidRefName
from enroute_core.base.limits import Limits
from enroute_core.git.refname import (
    branch_name_problem,
    check_ref_format,
    is_valid_ref_name,
    ref_name_problem,
)

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


# (name, valid, valid with --allow-onelevel, valid with --refspec-pattern)
HAND: list[tuple[bytes, bool, bool, bool]] = [
    (b"refs/heads/main", True, True, True),
    (b"heads/main", True, True, True),
    (b"main", False, True, False),
    (b"HEAD", False, True, False),
    (b"", False, False, False),
    (b"/", False, False, False),
    (b"refs/heads/", False, False, False),
    (b"/refs/heads/main", False, False, False),
    (b"refs//heads", False, False, False),
    (b"refs/heads/.hidden", False, False, False),
    (b".refs/heads", False, False, False),
    (b"refs/heads/a.", False, False, False),
    (b"refs/heads/a./b", True, True, True),  # only the end of the whole name is checked
    (b"refs/heads/a..b", False, False, False),
    (b"refs/heads/a.b", True, True, True),
    (b"refs/heads/x.lock", False, False, False),
    (b"refs/x.lock/y", False, False, False),
    (b"refs/heads/x.lockx", True, True, True),
    (b"refs/heads/.lock", False, False, False),
    (b"refs/heads/lock", True, True, True),
    (b"refs/heads/a@{b", False, False, False),
    (b"refs/heads/a@b", True, True, True),
    (b"refs/heads/a{b", True, True, True),
    (b"refs/heads/@", True, True, True),
    (b"@", False, False, False),
    (b"@/x", True, True, True),
    (b"refs/heads/a b", False, False, False),
    (b"refs/heads/a~b", False, False, False),
    (b"refs/heads/a^b", False, False, False),
    (b"refs/heads/a:b", False, False, False),
    (b"refs/heads/a?b", False, False, False),
    (b"refs/heads/a[b", False, False, False),
    (b"refs/heads/a]b", True, True, True),
    (b"refs/heads/a\\b", False, False, False),
    (b"refs/heads/a\tb", False, False, False),
    (b"refs/heads/a\x01b", False, False, False),
    (b"refs/heads/a\x7fb", False, False, False),
    (b"refs/heads/a*", False, False, True),
    (b"refs/*/a*", False, False, False),
    (b"*", False, False, False),
    (b"refs/heads/\xc3\xa9t\xc3\xa9", True, True, True),
    (b"refs/heads/\xff\xfe", True, True, True),
    (b"refs/heads/a-b_c+d=e,f;g!h#i$j%k&l'm(n)o", True, True, True),
    (b"refs/heads/-dash", True, True, True),
    (b"a/b/c/d/e/f", True, True, True),
]


@pytest.mark.parametrize(("name", "plain", "onelevel", "pattern"), HAND)
def test_hand_written_names(name: bytes, plain: bool, onelevel: bool, pattern: bool) -> None:
    assert is_valid_ref_name(name) is plain
    assert is_valid_ref_name(name, allow_onelevel=True) is onelevel
    assert is_valid_ref_name(name, refspec_pattern=True) is pattern


def test_error_carries_code_and_reason() -> None:
    with pytest.raises(InvalidRefName) as info:
        check_ref_format(b"refs/heads/a..b")
    assert info.value.code == "invalid_ref_name"
    assert info.value.details["reason"] == "contains '..'"
    check_ref_format(b"refs/heads/ok")


def test_nul_is_refused() -> None:
    # git's C strings cannot carry NUL; a wire ref name with one must not pass.
    assert ref_name_problem(b"refs/heads/a\x00b") == "contains the control character 0x00"


def test_one_star_in_a_pattern_and_never_two() -> None:
    assert is_valid_ref_name(b"*", allow_onelevel=True, refspec_pattern=True)
    assert not is_valid_ref_name(b"refs/*/*", refspec_pattern=True)
    assert is_valid_ref_name(b"refs/heads/*", refspec_pattern=True)


def test_length_limit_is_a_ref_name_error() -> None:
    small = Limits(ref_name_bytes_max=16)
    assert is_valid_ref_name(b"refs/heads/abcde", limits=small)
    assert not is_valid_ref_name(b"refs/heads/abcdef", limits=small)
    with pytest.raises(InvalidRefName):
        check_ref_format(b"refs/heads/abcdef", limits=small)


# --- differential against `git check-ref-format` ---------------------------------

FLAG_SETS: list[tuple[str, ...]] = [
    (),
    ("--allow-onelevel",),
    ("--refspec-pattern",),
    ("--allow-onelevel", "--refspec-pattern"),
]

_BATCH_SCRIPT = r"""
while IFS= read -r -d '' name; do
  out=""
  for flags in "" "--allow-onelevel" "--refspec-pattern" "--allow-onelevel --refspec-pattern"; do
    git check-ref-format $flags "$name" >/dev/null 2>&1
    out="$out$? "
  done
  printf '%s\n' "$out"
done
"""


def _git_verdicts(names: Sequence[bytes], home: Path) -> list[list[bool]]:
    """One bash process loops over all names: git runs once per name and flag set."""
    import subprocess

    from enroute_testing.gitcli import git_env

    home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["bash", "-c", _BATCH_SCRIPT],
        input=b"".join(n + b"\0" for n in names),
        env=git_env(home),
        capture_output=True,
        timeout=120,
        check=True,
    )
    rows = done.stdout.decode().splitlines()
    assert len(rows) == len(names), done.stderr
    verdicts = []
    for row in rows:
        codes = [int(c) for c in row.split()]
        assert set(codes) <= {0, 1}, (row, done.stderr[-500:])
        verdicts.append([c == 0 for c in codes])
    return verdicts


def _ours(name: bytes) -> list[bool]:
    return [
        is_valid_ref_name(
            name,
            allow_onelevel="--allow-onelevel" in flags,
            refspec_pattern="--refspec-pattern" in flags,
        )
        for flags in FLAG_SETS
    ]


def _passable(name: bytes) -> bool:
    # argv cannot hold NUL, and git reads a leading '-' as an option.
    return b"\0" not in name and not name.startswith(b"-")


def _assert_agree(names: Sequence[bytes], home: Path) -> list[list[bool]]:
    names = sorted({n for n in names if _passable(n)})
    theirs = _git_verdicts(names, home)
    mismatches = [(n, t, _ours(n)) for n, t in zip(names, theirs, strict=True) if _ours(n) != t]
    assert mismatches == []
    return theirs


@pytest.mark.interop
def test_hand_written_names_agree_with_git(tmp_path: Path) -> None:
    theirs = _assert_agree([h[0] for h in HAND], tmp_path / "home")
    flat = [v for row in theirs for v in row]
    assert any(flat) and not all(flat)  # the oracle answered both ways


PIECES = [
    b"refs", b"heads", b"tags", b"a", b"b", b"/", b"/", b".", b"..", b"@", b"{", b"@{",
    b"*", b".lock", b"lock", b" ", b"~", b"^", b":", b"?", b"[", b"]", b"\\", b"\x01",
    b"\x1f", b"\x7f", b"\t", b"\xc3\xa9", b"\xff", b"-", b"_", b"!", b"#", b"=", b"x.",
]  # fmt: skip

piece_names = st.lists(st.sampled_from(PIECES), min_size=0, max_size=8).map(b"".join)
byte_names = st.binary(min_size=0, max_size=12).map(lambda b: b.replace(b"\0", b"x"))
ref_names = st.one_of(piece_names, piece_names, byte_names)


@pytest.mark.interop
@hypothesis_seed(SEED)
@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # a batch is the unit; mismatches are listed
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(ref_names, min_size=120, max_size=120))
def test_generated_names_agree_with_git(tmp_path: Path, names: list[bytes]) -> None:
    _assert_agree(names, tmp_path / "home")


@hypothesis_seed(SEED)
@given(ref_names, st.booleans(), st.booleans())
def test_valid_names_survive_reasonable_edits(name: bytes, onelevel: bool, pattern: bool) -> None:
    """A valid name stays valid under a prefix of ``refs/``; an invalid one never
    becomes valid by adding ``/x.lock`` (a property git's rules imply)."""
    ok = is_valid_ref_name(name, allow_onelevel=onelevel, refspec_pattern=pattern)
    if ok:
        assert is_valid_ref_name(b"refs/" + name, allow_onelevel=onelevel, refspec_pattern=pattern)
    assert not is_valid_ref_name(name + b"/x.lock", allow_onelevel=True, refspec_pattern=pattern)


# --- branch names: `git check-ref-format --branch` --------------------------------

BRANCH_NAMES = [
    b"main", b"feature/x", b"HEAD", b"-x", b"-", b"--", b"a-", b"x/-y", b"head", b"HEADS",
    b"HEAD/x", b"x/HEAD", b"@", b"a@b", b"@{u}", b"a..b", b".x", b"x.", b"x.lock", b"a b",
    b"a//b", b"/a", b"a/", b"", b"*", b"a\\b", b"\xc3\xa9t\xc3\xa9", b"refs/heads/x", b"\x01",
]  # fmt: skip


@pytest.mark.interop
def test_branch_names_agree_with_git_check_ref_format_branch(tmp_path: Path) -> None:
    """object-name.c ``strbuf_check_branch_ref``: ``-...`` and ``HEAD`` are refused on top
    of the ref-name rules for ``refs/heads/<name>``."""
    from enroute_testing.gitcli import git_branch_verdicts

    theirs = git_branch_verdicts(BRANCH_NAMES, tmp_path / "home")
    ours = [branch_name_problem(n) is None for n in BRANCH_NAMES]
    assert [n for n, t, o in zip(BRANCH_NAMES, theirs, ours, strict=True) if t != o] == []
    assert dict(zip(BRANCH_NAMES, theirs, strict=True))[b"HEAD"] is False
    assert dict(zip(BRANCH_NAMES, theirs, strict=True))[b"main"] is True
    assert is_valid_ref_name(b"refs/heads/HEAD")  # a ref name; only not a branch name
