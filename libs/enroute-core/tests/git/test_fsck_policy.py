"""The receive policy's two classes (git/fsck.py ``FSCK_RULES``, docs/security.md).

Git's ids and default severities are git's ``Documentation/fsck-msgids.adoc``
(git/git 3c0b34cf, with ``fsck.h`` ``FOREACH_FSCK_MSG_ID``); a commit's time is
checked against git's own ``parse_commit_date`` through ``git rev-list --timestamp``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidArgument, InvalidObject
from enroute_core.base.ids import ObjectId
from enroute_core.config import load_config
from enroute_core.git.commit import Commit, commit_date
from enroute_core.git.fsck import (
    FSCK_RULES,
    RECEIVE_POLICY,
    FsckClass,
    FsckMsg,
    FsckPolicy,
    FsckWarnings,
    Severity,
    check_object,
    check_tree,
    fsck_commit,
    render_policy_table,
)

F, E, W, I, N = "FATAL", "ERROR", "WARN", "INFO", "IGNORE"  # noqa: E741 - git's letters
# Documentation/fsck-msgids.adoc: every id and its "(SEVERITY)".
GIT_MSG_IDS = {
    "badDate": E, "badDateOverflow": E, "badEmail": E, "badFilemode": I, "badGpgsig": E,
    "badHeaderContinuation": E, "badName": E, "badObjectSha1": E, "badPackedRefEntry": E,
    "badPackedRefHeader": E, "badParentSha1": E, "badRefContent": E, "badRefFiletype": E,
    "badRefName": E, "badReferentName": E, "badReftableFiletype": E,
    "badReftableTableName": W, "badTagName": I, "badTimezone": E, "badTree": E,
    "badTreeSha1": E, "badType": E, "duplicateEntries": E, "emptyName": W,
    "emptyPackedRefsFile": I, "extraHeaderEntry": N, "fullPathname": W,
    "gitattributesBlob": E, "gitattributesLarge": E, "gitattributesLineLength": E,
    "gitattributesMissing": E, "gitattributesSymlink": I, "gitignoreSymlink": I,
    "gitmodulesBlob": E, "gitmodulesLarge": E, "gitmodulesMissing": E, "gitmodulesName": E,
    "gitmodulesParse": I, "gitmodulesPath": E, "gitmodulesSymlink": E, "gitmodulesUpdate": E,
    "gitmodulesUrl": E, "hasDot": W, "hasDotdot": W, "hasDotgit": W, "largePathname": W,
    "mailmapSymlink": I, "missingAuthor": E, "missingCommitter": E, "missingEmail": E,
    "missingNameBeforeEmail": E, "missingObject": E, "missingSpaceBeforeDate": E,
    "missingSpaceBeforeEmail": E, "missingTag": E, "missingTagEntry": E,
    "missingTaggerEntry": I, "missingTree": E, "missingType": E, "missingTypeEntry": E,
    "multipleAuthors": E, "nulInCommit": W, "nulInHeader": F, "nullSha1": W,
    "packedRefEntryNotTerminated": E, "packedRefUnsorted": E, "refMissingNewline": I,
    "symlinkRef": I, "symrefTargetIsNotARef": I, "trailingRefContent": I,
    "treeNotSorted": E, "unknownType": E, "unterminatedHeader": F, "zeroPaddedDate": E,
    "zeroPaddedFilemode": W,
}  # fmt: skip

# The issue's two lists: what old histories hold, and what attacks clients or Enroute.
HARMLESS = {
    "badDate", "badDateOverflow", "badEmail", "badName", "badTimezone", "missingEmail",
    "missingNameBeforeEmail", "missingSpaceBeforeDate", "missingSpaceBeforeEmail",
    "zeroPaddedDate", "zeroPaddedFilemode", "badFilemode", "badTagName", "missingTaggerEntry",
    "extraHeaderEntry", "nulInCommit", "multipleAuthors",
}  # fmt: skip
ERRORS = {
    "hasDot", "hasDotdot", "hasDotgit", "gitmodulesSymlink", "gitmodulesBlob", "gitmodulesName",
    "gitmodulesUrl", "gitmodulesPath", "gitmodulesUpdate", "gitmodulesLarge", "nullSha1",
    "duplicateEntries", "treeNotSorted", "badType", "missingTree", "badTreeSha1",
    "badParentSha1", "badTree", "missingObject", "badObjectSha1", "missingTypeEntry",
    "missingType", "missingTagEntry", "missingTag", "fullPathname", "emptyName",
    "nulInHeader", "unterminatedHeader",
}  # fmt: skip

SECURITY_MD = Path(__file__).resolve().parents[4] / "docs" / "security.md"
OID = ObjectId(bytes(19) + b"\x07")
TREE_HEX = b"4b825dc642cb6eb9a060e54bf8d69288fbee4904"
IDENT = b"A U Thor <a@example.com> 1700000000 +0100"


def commit_body(author: bytes = IDENT, committer: bytes | None = IDENT, head: bytes = b"") -> bytes:
    lines = b"tree " + TREE_HEX + b"\n" + head + b"author " + author + b"\n"
    if committer is not None:
        lines += b"committer " + committer + b"\n"
    return lines + b"\nmessage\n"


# -- the table --------------------------------------------------------------------------------


def test_table_holds_every_git_id_with_git_severity() -> None:
    assert set(FSCK_RULES) == set(GIT_MSG_IDS)
    assert list(FSCK_RULES) == sorted(FSCK_RULES)
    for msg_id, rule in FSCK_RULES.items():
        assert rule.git.name == GIT_MSG_IDS[msg_id], msg_id
        assert rule.reason and "\n" not in rule.reason and "|" not in rule.reason, msg_id
    assert {m.value for m in FsckMsg} <= set(FSCK_RULES)


def test_classes_follow_the_issue() -> None:
    classes = {k: r.cls for k, r in FSCK_RULES.items()}
    assert {k for k in HARMLESS if classes[k] is not FsckClass.HARMLESS} == set()
    assert {k for k in ERRORS if classes[k] is not FsckClass.ERROR} == set()
    # every git FATAL is fixed, and fixed ids are errors
    for msg_id, rule in FSCK_RULES.items():
        assert rule.git is not Severity.FATAL or rule.fixed, msg_id
        assert not rule.fixed or rule.cls is FsckClass.ERROR, msg_id


def test_security_doc_shows_the_table() -> None:
    text = SECURITY_MD.read_text()
    block = re.compile(r"(<!-- fsck-policy:begin[^\n]*-->\n)(.*?)(<!-- fsck-policy:end -->)", re.S)
    found = block.search(text)
    assert found is not None, "docs/security.md lacks its fsck-policy markers"
    if os.environ.get("REWRITE") == "1" and found.group(2) != render_policy_table():
        SECURITY_MD.write_text(
            text[: found.end(1)] + render_policy_table() + text[found.start(3) :]
        )
        return
    assert found.group(2) == render_policy_table(), (
        "docs/security.md's fsck table is stale: REWRITE=1 pytest " + __file__
    )


# -- the policy -------------------------------------------------------------------------------


def test_receive_policy_is_the_classes() -> None:
    for msg in FsckMsg:
        assert RECEIVE_POLICY.refuses(msg) is (msg.rule.cls is FsckClass.ERROR), msg
        if msg.rule.cls is FsckClass.HARMLESS:
            assert RECEIVE_POLICY.severity(msg) is Severity.WARN


def test_overrides_work_both_ways_but_never_lower_a_fixed_id() -> None:
    raised = FsckPolicy(overrides={"badTimezone": Severity.ERROR})
    assert raised.refuses(FsckMsg.BAD_TIMEZONE) and not raised.refuses(FsckMsg.BAD_DATE)
    lowered = FsckPolicy(overrides={"hasDotgit": Severity.WARN, "nullSha1": Severity.IGNORE})
    assert not lowered.refuses(FsckMsg.HAS_DOTGIT) and not lowered.refuses(FsckMsg.NULL_SHA1)
    assert lowered.refuses(FsckMsg.HAS_DOT)  # the others keep their class
    fixed = FsckPolicy(overrides={"nulInHeader": Severity.IGNORE, "badTree": Severity.WARN})
    assert fixed.refuses(FsckMsg.NUL_IN_HEADER) and fixed.refuses(FsckMsg.BAD_TREE)


def test_configuration_overrides_and_refuses_what_cannot_work() -> None:
    text = "receive:\n  fsck:\n    BADTIMEZONE: error\n    hasdotgit: warn\n"
    policy = load_config(text, {}).receive.fsck_policy()
    assert policy.refuses(FsckMsg.BAD_TIMEZONE) and not policy.refuses(FsckMsg.HAS_DOTGIT)
    refused = {
        "noSuchId: warn": "is not a git fsck message id",
        "gitattributesMissing: error": "gitattributesMissing is a git fsck message id Enroute "
        "does not check",
        "nulInHeader: warn": "nulInHeader is fatal in git and cannot be lowered",
        "missingTree: ignore": "missingTree is an object Enroute cannot read",
        "badTimezone: info": "must be error, warn or ignore",
    }
    for line, message in refused.items():
        with pytest.raises(InvalidArgument, match=message):
            load_config(f"receive:\n  fsck:\n    {line}\n", {})
    load_config("receive:\n  fsck:\n    missingTree: error\n", {})  # raising is fine


def test_gitattributes_bytes_max_stays_within_what_git_reads() -> None:
    """attr.h ATTR_MAX_FILE_SIZE: a larger bound would let in what every client refuses."""
    limits = load_config("limits:\n  gitattributes_bytes_max: 100MiB\n", {}).resource_limits()
    assert limits.gitattributes_bytes_max == 100 * 1024 * 1024
    with pytest.raises(InvalidArgument, match=r"over git's 104857600 \(100MiB, ATTR_MAX_FILE_SIZE"):
        load_config("limits:\n  gitattributes_bytes_max: 104857601\n", {})


def test_refusal_names_the_id_and_the_setting() -> None:
    with pytest.raises(InvalidObject) as info:
        check_object(OID, 2, b"100644 .git\0" + bytes(19) + b"\x01")
    assert info.value.message.endswith(
        "hasDotgit: contains '.git' (refused; receive.fsck.hasDotgit: warn lowers it)"
    )
    assert info.value.details == {
        "oid": OID.hex(),
        "msg_id": "hasDotgit",
        "setting": "receive.fsck.hasDotgit",
    }
    with pytest.raises(InvalidObject, match=r"missingTree: .* no setting lowers it\)$"):
        check_object(OID, 1, b"author x\n")
    with pytest.raises(InvalidObject, match=r"nulInHeader: .*\(refused; fatal in git"):
        check_object(OID, 1, b"tree \0\n\n")


# -- warnings ---------------------------------------------------------------------------------


def test_warnings_count_objects_per_id_and_keep_the_first() -> None:
    warnings = FsckWarnings()
    both = commit_body(b"A <a@x> 1 --700", b"C <c@x> 2 +051800")  # badTimezone twice: one object
    first, second = ObjectId(b"\x01" * 20), ObjectId(b"\x02" * 20)
    check_object(first, 1, both, warnings=warnings)
    check_object(second, 1, commit_body(b"A <a@x> 01 +0000"), warnings=warnings)
    check_object(second, 1, commit_body(committer=b"C 5 +0000"), warnings=warnings)
    check_object(OID, 1, commit_body(), warnings=warnings)  # clean: nothing
    summary = [(w.msg_id, w.count, w.example) for w in warnings.summary()]
    assert summary == [
        ("badTimezone", 1, first),
        ("missingEmail", 1, second),
        ("zeroPaddedDate", 1, second),
    ]
    assert warnings.summary()[0].describe() == f"badTimezone: 1 object(s), e.g. {first.hex()}"
    ignored = FsckPolicy(overrides={"badTimezone": Severity.IGNORE})
    quiet = FsckWarnings()
    check_object(first, 1, both, policy=ignored, warnings=quiet)
    assert quiet.summary() == ()


def test_tree_warnings_through_check_tree() -> None:
    blob = bytes(19) + b"\x01"
    padded = b"100644 a\0" + blob + b"040000 d\0" + blob + b"100600 e\0" + blob
    warnings = FsckWarnings()
    assert check_tree(OID, padded, warnings=warnings) == []
    assert [w.msg_id for w in warnings.summary()] == ["badFilemode", "zeroPaddedFilemode"]


def test_a_harmless_problem_hides_no_later_one() -> None:
    """fsck.c ``fsck_commit`` goes on after a problem ``report`` only warns about."""
    body = commit_body(b"A <a@x> 1 --700", committer=None)
    assert [p.msg.value for p in fsck_commit(body)] == ["badTimezone", "missingCommitter"]
    raised = FsckPolicy(overrides={"missingCommitter": Severity.ERROR})
    with pytest.raises(InvalidObject, match="missingCommitter"):
        check_object(OID, 1, body, policy=raised)
    two = commit_body(b"A <a@x> 1 +0000\nauthor B 2 +0000")
    assert [p.msg.value for p in fsck_commit(two)] == ["missingEmail", "multipleAuthors"]
    nul = commit_body(b"A <a@x> 1 --700").replace(b"message", b"mess\0age")
    assert [p.msg.value for p in fsck_commit(nul)] == ["badTimezone", "nulInCommit"]


# -- a commit's time, as git reads it -----------------------------------------------------------

DATE_CASES = [
    (b"A <a@x> 1 +0000", b"C <c@x> 1300000000 --700"),
    (b"A <a@x> 1 +0000", b"C <c@x> 1300000000 +051800"),
    (b"A <a@x> 1 +0000", b"C <c@x>1300000001 +0000"),
    (b"A <a@x> 1 +0000", b"C <c@x> 01300000002 +0000"),
    (b"A <a@x> 1 +0000", b"C 1300000003 +0000"),
    (b"A <a@x> 1 +0000", b"C <c<x> 1300000004 +0000"),
    (b"A <a@x> 1 +0000", b"C <c@x> xyz +0000"),
    (b"A <a@x> 1 +0000", b"C <c@x> 99999999999999999999999 +0000"),
    (b"A <a@x> 1 +0000", b"C <c@x>   \t 1300000005"),
    (b"A <a@x> 1 +0000", None),
]


def test_commit_date_is_git_parse_commit_date(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str, data: bytes | None = None) -> bytes:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], env=env, input=data, capture_output=True,
            check=True,
        ).stdout  # fmt: skip

    git("init", "-q")
    tree = git("hash-object", "-w", "-t", "tree", "--stdin", data=b"").strip()
    parent = b""
    for author, committer in DATE_CASES:
        body = commit_body(author, committer).replace(TREE_HEX, tree)
        if parent:
            body = body.replace(b"\nauthor", b"\nparent " + parent + b"\nauthor", 1)
        oid = git("hash-object", "-w", "-t", "commit", "--literally", "--stdin", data=body)
        oid = oid.strip()
        line = git("rev-list", "--timestamp", "--no-walk", oid.decode())
        want = int(line.split()[0])
        parsed = Commit.parse(body)
        assert commit_date(body, len(parsed.parents)) == want, (committer, want)
        parent = oid
