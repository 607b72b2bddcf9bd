"""Object checks as ``git fsck`` makes them, named by git's message ids.

Git ``Documentation/fsck-msgids.adoc`` lists every check with its default
severity; ``fsck.c`` (``fsck_tree``, ``fsck_commit``, ``fsck_tag_standalone``,
``fsck_ident``, ``verify_headers``) says how each is found. A push is not
checked with git's severities but with two classes (:data:`FSCK_RULES`,
docs/security.md): what can attack a client or break Enroute's own reading
of the object is refused; malformed but harmless metadata that old tools
wrote (identity and date quirks, zero-padded modes) is accepted and reported
as a warning, as git's ``http-backend`` accepts it by default.

Pure: bytes in, problems out. :func:`fsck_object` lists the problems of one
object body; :func:`check_object` raises :class:`InvalidObject` for the first
one the :class:`FsckPolicy` refuses, its message shaped as git prints it
(``object <oid>: <msgId>: <text>``) so a client sees the id it can look up,
followed by the setting that would let it in; the others, when a
:class:`FsckWarnings` is given, are counted there.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from enroute_native.tree_fsck import clean as tree_clean

from enroute_core.base.errors import InvalidObject, LimitExceeded
from enroute_core.base.ids import OID_BYTES, ZERO_OID, ObjectId, oid_to_hex
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.gitconfig import ConfigEntry, blob_readings, split_key
from enroute_core.git.object_type import ObjectType
from enroute_core.git.refname import is_valid_ref_name
from enroute_core.git.tree import (
    MODE_SYMLINK,
    STANDARD_MODES,
    _hfs_code_points,
    is_dotgit_name,
    is_tree_mode,
)

__all__ = [
    "FSCK_RULES",
    "GIT_ATTR_FILE_BYTES_MAX",
    "FsckClass",
    "FsckMsg",
    "FsckPolicy",
    "FsckProblem",
    "FsckRule",
    "FsckWarning",
    "FsckWarnings",
    "Severity",
    "SpecialBlob",
    "TreeCheckMemo",
    "check_object",
    "check_special_blob",
    "check_tree",
    "fsck_commit",
    "fsck_gitattributes",
    "fsck_gitmodules",
    "fsck_ident",
    "fsck_object",
    "fsck_tag",
    "fsck_tree",
    "gitmodules_parse_bytes",
    "refusal",
    "render_policy_table",
    "special_blobs",
]


class Severity(enum.IntEnum):
    """fsck's message types, most severe first (``fsck.h``, ``enum fsck_msg_type``)."""

    FATAL = 0
    ERROR = 1
    WARN = 2
    INFO = 3
    IGNORE = 4


class FsckMsg(enum.Enum):
    """The checks made here; the value is git's message id (``fsck.<msg-id>``)."""

    # headers (verify_headers)
    NUL_IN_HEADER = "nulInHeader"
    UNTERMINATED_HEADER = "unterminatedHeader"
    # identities (fsck_ident)
    BAD_DATE = "badDate"
    BAD_DATE_OVERFLOW = "badDateOverflow"
    BAD_EMAIL = "badEmail"
    BAD_NAME = "badName"
    BAD_TIMEZONE = "badTimezone"
    MISSING_EMAIL = "missingEmail"
    MISSING_NAME_BEFORE_EMAIL = "missingNameBeforeEmail"
    MISSING_SPACE_BEFORE_DATE = "missingSpaceBeforeDate"
    MISSING_SPACE_BEFORE_EMAIL = "missingSpaceBeforeEmail"
    ZERO_PADDED_DATE = "zeroPaddedDate"
    # commits (fsck_commit)
    MISSING_TREE = "missingTree"
    BAD_TREE_SHA1 = "badTreeSha1"
    BAD_PARENT_SHA1 = "badParentSha1"
    MISSING_AUTHOR = "missingAuthor"
    MULTIPLE_AUTHORS = "multipleAuthors"
    MISSING_COMMITTER = "missingCommitter"
    NUL_IN_COMMIT = "nulInCommit"
    # tags (fsck_tag_standalone)
    MISSING_OBJECT = "missingObject"
    BAD_OBJECT_SHA1 = "badObjectSha1"
    MISSING_TYPE_ENTRY = "missingTypeEntry"
    MISSING_TYPE = "missingType"
    BAD_TYPE = "badType"
    MISSING_TAG_ENTRY = "missingTagEntry"
    MISSING_TAG = "missingTag"
    BAD_TAG_NAME = "badTagName"
    MISSING_TAGGER_ENTRY = "missingTaggerEntry"
    BAD_GPGSIG = "badGpgsig"
    BAD_HEADER_CONTINUATION = "badHeaderContinuation"
    # trees (fsck_tree)
    BAD_TREE = "badTree"
    NULL_SHA1 = "nullSha1"
    FULL_PATHNAME = "fullPathname"
    EMPTY_NAME = "emptyName"  # git's tree decoder refuses an empty name first: badTree
    HAS_DOT = "hasDot"
    HAS_DOTDOT = "hasDotdot"
    HAS_DOTGIT = "hasDotgit"
    LARGE_PATHNAME = "largePathname"
    ZERO_PADDED_FILEMODE = "zeroPaddedFilemode"
    BAD_FILEMODE = "badFilemode"
    DUPLICATE_ENTRIES = "duplicateEntries"
    TREE_NOT_SORTED = "treeNotSorted"
    GITMODULES_SYMLINK = "gitmodulesSymlink"
    # .gitmodules contents (fsck_gitmodules_fn)
    GITMODULES_BLOB = "gitmodulesBlob"
    GITMODULES_LARGE = "gitmodulesLarge"
    GITMODULES_PARSE = "gitmodulesParse"
    GITMODULES_NAME = "gitmodulesName"
    GITMODULES_URL = "gitmodulesUrl"
    GITMODULES_PATH = "gitmodulesPath"
    GITMODULES_UPDATE = "gitmodulesUpdate"
    # .gitattributes contents (fsck_blob)
    GITATTRIBUTES_BLOB = "gitattributesBlob"
    GITATTRIBUTES_LARGE = "gitattributesLarge"
    GITATTRIBUTES_LINE_LENGTH = "gitattributesLineLength"

    @property
    def rule(self) -> FsckRule:
        """Git's severity, Enroute's class and why (:data:`FSCK_RULES`)."""
        return FSCK_RULES[self.value]

    @property
    def default_severity(self) -> Severity:
        """Git's default severity (fsck-msgids.adoc)."""
        return FSCK_RULES[self.value].git


class FsckClass(enum.Enum):
    """How a push takes an object with this problem when no setting says otherwise.

    The question is whether the object can hurt a client that clones it, or
    break what Enroute relies on when it stores, walks and serves it. Git's
    own severities answer another one (what ``git fsck`` should flag), and
    ``index-pack --strict`` refuses every WARN: that refuses the identity and
    mode quirks old tools wrote into histories that cannot be rewritten.
    """

    HARMLESS = "harmless"
    """Accepted; the pusher is told (``remote: warning: <id>: ...``) and a metric counts it."""
    ERROR = "error"
    """Refused: the push fails and nothing changes."""


@dataclass(frozen=True, slots=True)
class FsckRule:
    """One git message id: git's default severity, Enroute's class, and why."""

    git: Severity
    cls: FsckClass
    reason: str
    fixed: bool = False
    """No ``receive.fsck`` setting lowers it: git marks it FATAL, or Enroute could not
    read, walk or serve such an object anyway (its parser refuses it too)."""


# The rule table, in groups that follow git's fsck.c: the object kind a check
# reads (headers, identities, commits, tags, trees, .gitmodules,
# .gitattributes), then the ids Enroute does not check. Each group is data;
# :func:`_rules` merges them in git's sorted order.
_F, _E, _W, _I, _N = (  # git's one-letter severities, as fsck.h lists them
    Severity.FATAL,
    Severity.ERROR,
    Severity.WARN,
    Severity.INFO,
    Severity.IGNORE,
)
_OK, _BAD = FsckClass.HARMLESS, FsckClass.ERROR
_IDENT = "an identity line old tools and converters wrote; "
_NEVER = (
    "a check of a local ref store (git fsck --references); refs never travel as files in a push"
)
_ATTRS = "git's attribute reader once overflowed on such files (CVE-2022-23521, CVE-2022-41903)"
_UNREAD = (
    "Enroute cannot read such an object, as git cannot (parse_commit_buffer, parse_tag_buffer)"
)
_MISSING = (
    "not checked as such: a tree naming an object neither the push nor the repository"
    " holds is refused as missing objects"
)


def _header_rules() -> dict[str, FsckRule]:
    """verify_headers: every commit and tag header line."""
    return {
        "nulInHeader": FsckRule(
            _F,
            _BAD,
            "a NUL in the header: readers that stop at it and readers that do not see "
            "different headers",
            True,
        ),
        "unterminatedHeader": FsckRule(
            _F,
            _BAD,
            "a header not ended by LF: git's parsers rely on it to stay in bounds (verify_headers)",
            True,
        ),
    }


def _ident_rules() -> dict[str, FsckRule]:
    """fsck_ident: author, committer and tagger lines; all harmless (old tools wrote them)."""
    return {
        "badDate": FsckRule(
            _E,
            _OK,
            _IDENT + "the date is not digits: read without a date (split_ident_line) and a commit "
            "time of 0, as git reads it",
        ),
        "badDateOverflow": FsckRule(
            _E,
            _OK,
            _IDENT + "the date overflows 64 bits: read saturated, as git's strtoumax reads it",
        ),
        "badEmail": FsckRule(
            _E,
            _OK,
            _IDENT
            + "'<' or '>' misplaced in the email: only shown, never acted on; the date after "
            "the last '>' is read as git reads it",
        ),
        "badName": FsckRule(_E, _OK, _IDENT + "'>' before the '<': the name is only shown"),
        "badTimezone": FsckRule(
            _E,
            _OK,
            _IDENT + "a zone such as --700 or +051800: the commit time is read without it, as git "
            "reads it",
        ),
        "missingEmail": FsckRule(
            _E,
            _OK,
            _IDENT + "no '<...>': shown as a name alone; the commit time is 0, as git reads it",
        ),
        "missingNameBeforeEmail": FsckRule(_E, _OK, _IDENT + "an empty name: shown empty"),
        "missingSpaceBeforeDate": FsckRule(
            _E, _OK, _IDENT + "no space before the date: read as git reads it"
        ),
        "missingSpaceBeforeEmail": FsckRule(
            _E, _OK, _IDENT + "no space before the '<': the name is read as git reads it"
        ),
        "zeroPaddedDate": FsckRule(
            _E, _OK, _IDENT + "a date with leading zeros: read as its number, as git reads it"
        ),
    }


def _commit_rules() -> dict[str, FsckRule]:
    """fsck_commit: the tree and parent lines must parse; the rest only reads oddly."""
    return {
        "missingTree": FsckRule(_E, _BAD, "a commit without a tree line: " + _UNREAD, True),
        "badTreeSha1": FsckRule(_E, _BAD, "the tree line is not 40 hex digits: " + _UNREAD, True),
        "badParentSha1": FsckRule(
            _E,
            _BAD,
            "a parent line is not 40 hex digits: the history cannot be walked; " + _UNREAD,
            True,
        ),
        "missingAuthor": FsckRule(
            _E,
            _OK,
            "a commit without an author line: nothing acts on it; the commit time is 0, as "
            "git's parse_commit_date reads it",
        ),
        "multipleAuthors": FsckRule(
            _E,
            _OK,
            "readers take the first author line; the others are kept byte for byte",
        ),
        "missingCommitter": FsckRule(
            _E,
            _OK,
            "a commit without a committer line: nothing acts on it; the commit time is 0, as "
            "git reads it",
        ),
        "nulInCommit": FsckRule(
            _W,
            _OK,
            "a NUL in a commit's message (old encodings): kept byte for byte; git shows the "
            "message up to it",
        ),
    }


def _tag_rules() -> dict[str, FsckRule]:
    """fsck_tag_standalone: object, type and tag lines must parse; the rest is kept as sent."""
    return {
        "missingObject": FsckRule(_E, _BAD, "a tag without an object line: " + _UNREAD, True),
        "badObjectSha1": FsckRule(
            _E, _BAD, "the tag's object line is not 40 hex digits: " + _UNREAD, True
        ),
        "missingTypeEntry": FsckRule(_E, _BAD, "a tag without a type line: " + _UNREAD, True),
        "missingType": FsckRule(_E, _BAD, "a tag without a type value: " + _UNREAD, True),
        "badType": FsckRule(
            _E,
            _BAD,
            "a tag type other than commit, tree, blob or tag: its target cannot be checked; "
            + _UNREAD,
            True,
        ),
        "missingTagEntry": FsckRule(_E, _BAD, "a tag without a tag line: " + _UNREAD, True),
        "missingTag": FsckRule(_E, _BAD, "a tag ending after its type line: " + _UNREAD, True),
        "badTagName": FsckRule(
            _I,
            _OK,
            "the tag line is a label: refs name tags, nothing reads this line as a ref",
        ),
        "missingTaggerEntry": FsckRule(_I, _OK, "a tag without a tagger: early tags have none"),
        "badGpgsig": FsckRule(
            _E,
            _OK,
            "a tag's gpgsig header without its LF: only signature verification reads it, and"
            " fails there; checked as git does, after the header check that refuses any"
            " header without its LF first (unterminatedHeader)",
        ),
        "badHeaderContinuation": FsckRule(
            _E,
            _OK,
            "a gpgsig continuation line without its LF: only signature verification reads it;"
            " checked as git does, after unterminatedHeader, which finds it first",
        ),
        "extraHeaderEntry": FsckRule(
            _N,
            _OK,
            "not checked here: headers after a tag's tagger are kept byte for byte and "
            "nothing acts on them",
        ),
    }


def _tree_shape_rules() -> dict[str, FsckRule]:
    """fsck_tree, the tree as a whole: it parses, its modes, its order."""
    return {
        "badTree": FsckRule(
            _E, _BAD, "the tree does not parse: it cannot be walked or served", True
        ),
        "nullSha1": FsckRule(
            _W,
            _BAD,
            "an entry naming the all-zero id, which no object has: clients fail on it",
        ),
        "zeroPaddedFilemode": FsckRule(
            _W,
            _OK,
            "modes such as 040000 (old tools): read as their number by git and Enroute, kept "
            "byte for byte",
        ),
        "badFilemode": FsckRule(
            _I,
            _OK,
            "modes early git wrote (100664 and other permission bits): read as git reads them"
            " (canon_mode), kept byte for byte; a mode that is not a file, symlink or directory"
            " (160644, 170000) is a gitlink, as in git: not walked, its object need not exist",
        ),
        "duplicateEntries": FsckRule(
            _E,
            _BAD,
            "one name twice in a tree: a checkout is ambiguous, readers disagree on which "
            "entry counts, and tree diffs look entries up by name",
        ),
        "treeNotSorted": FsckRule(
            _E,
            _BAD,
            "entries out of git's order: git's tree walks and merges assume it, and readers "
            "disagree on lookups",
        ),
    }


def _tree_name_rules() -> dict[str, FsckRule]:
    """fsck_tree, each entry's name: what a checkout would write where."""
    return {
        "fullPathname": FsckRule(
            _W,
            _BAD,
            "a name holding '/': a checkout could write outside the directory the tree stands for",
        ),
        "emptyName": FsckRule(
            _W,
            _BAD,
            "an entry with an empty name: git's tree decoder refuses it (badTree)",
            True,
        ),
        "hasDot": FsckRule(
            _W, _BAD, "an entry named '.': a checkout could write where the tree does not say"
        ),
        "hasDotdot": FsckRule(
            _W, _BAD, "an entry named '..': a checkout could write outside the working tree"
        ),
        "hasDotgit": FsckRule(
            _W,
            _BAD,
            "'.git' in any case, HFS+ or NTFS spelling: a checkout could write into the "
            "repository's .git (CVE-2014-9390, CVE-2019-1352)",
        ),
        "largePathname": FsckRule(
            _W,
            _BAD,
            "a name over tree_entry_name_bytes_max: no file system checks it out, and Enroute"
            " bounds every name",
        ),
        "gitmodulesSymlink": FsckRule(
            _E,
            _BAD,
            ".gitmodules as a symbolic link: a checkout could read or write through it "
            "(CVE-2018-11235)",
        ),
    }


def _gitmodules_rules() -> dict[str, FsckRule]:
    """fsck_gitmodules_fn: what a clone would do with the submodules a .gitmodules names."""
    return {
        "gitmodulesBlob": FsckRule(
            _E,
            _BAD,
            "a tree or commit named .gitmodules: submodule code reads it as a file "
            "(CVE-2018-11235)",
        ),
        "gitmodulesLarge": FsckRule(
            _E, _BAD, "a .gitmodules over gitmodules_bytes_max: it could not be checked"
        ),
        "gitmodulesMissing": FsckRule(_E, _BAD, _MISSING),
        "gitmodulesParse": FsckRule(
            _I,
            _OK,
            "a .gitmodules git's config reader stops in: every variable before the fault is "
            "checked as the others are, and git reads none after it",
        ),
        "gitmodulesName": FsckRule(
            _E,
            _BAD,
            "a submodule name with a '..' component: a clone could write outside .git/modules"
            " (CVE-2018-11235)",
        ),
        "gitmodulesUrl": FsckRule(
            _E,
            _BAD,
            "a submodule url that reads as an option or smuggles a newline or credentials "
            "(CVE-2018-17456, CVE-2020-5260)",
        ),
        "gitmodulesPath": FsckRule(
            _E,
            _BAD,
            "a submodule path that reads as a command-line option (CVE-2018-17456)",
        ),
        "gitmodulesUpdate": FsckRule(
            _E, _BAD, "update = !command: a clone could run it (CVE-2019-19604)"
        ),
    }


def _gitattributes_rules() -> dict[str, FsckRule]:
    """fsck_blob: the .gitattributes git's attribute reader would refuse."""
    return {
        "gitattributesBlob": FsckRule(
            _E,
            _BAD,
            "a tree or commit named .gitattributes: git's attribute reader reads it as a file",
        ),
        "gitattributesLarge": FsckRule(
            _E,
            _BAD,
            "a .gitattributes over gitattributes_bytes_max (git's ATTR_MAX_FILE_SIZE, 100 MiB): "
            "git refuses to read it; " + _ATTRS,
        ),
        "gitattributesLineLength": FsckRule(
            _E,
            _BAD,
            "a .gitattributes line of 2 KiB or more (git's ATTR_MAX_LINE_LENGTH): "
            "git refuses to read it; " + _ATTRS,
        ),
        "gitattributesMissing": FsckRule(_E, _BAD, _MISSING),
    }


def _unchecked_rules() -> dict[str, FsckRule]:
    """Ids git checks and Enroute does not: what stops such an object instead, or why none need."""
    since_232 = "not checked here: git since 2.32 does not follow a symbolic link when it reads "
    return {
        "gitattributesSymlink": FsckRule(_I, _OK, since_232 + ".gitattributes"),
        "gitignoreSymlink": FsckRule(_I, _OK, since_232 + ".gitignore"),
        "mailmapSymlink": FsckRule(_I, _OK, since_232 + ".mailmap"),
        "unknownType": FsckRule(
            _E,
            _BAD,
            "not checked as such: a pack cannot carry an unknown type, the indexer refuses "
            "its type code",
            True,
        ),
    }


def _ref_store_rules() -> dict[str, FsckRule]:
    """fsck_refs_*: checks of a local ref store, which a push never carries."""
    severities = {
        "badPackedRefEntry": _E,
        "badPackedRefHeader": _E,
        "badRefContent": _E,
        "badRefFiletype": _E,
        "badReferentName": _E,
        "badReftableFiletype": _E,
        "badReftableTableName": _W,
        "emptyPackedRefsFile": _I,
        "packedRefEntryNotTerminated": _E,
        "packedRefUnsorted": _E,
        "refMissingNewline": _I,
        "symlinkRef": _I,
        "symrefTargetIsNotARef": _I,
        "trailingRefContent": _I,
    }
    # Nothing here reaches a push, so the class just follows git's severity: an error refuses.
    rules = {
        msg_id: FsckRule(git, _BAD if git <= _E else _OK, _NEVER)
        for msg_id, git in severities.items()
    }
    rules["badRefName"] = FsckRule(
        _E,
        _BAD,
        _NEVER + "; pushed ref names are checked as receive-pack checks them (funny refname)",
    )
    return rules


def _rules() -> Mapping[str, FsckRule]:
    """Every group merged, each id once, sorted as git's fsck-msgids.adoc lists them."""
    table: dict[str, FsckRule] = {}
    for group in (
        _header_rules,
        _ident_rules,
        _commit_rules,
        _tag_rules,
        _tree_shape_rules,
        _tree_name_rules,
        _gitmodules_rules,
        _gitattributes_rules,
        _unchecked_rules,
        _ref_store_rules,
    ):
        rules = group()
        assert not rules.keys() & table.keys(), f"{group.__name__} repeats an id"
        table.update(rules)
    return MappingProxyType(dict(sorted(table.items())))


FSCK_RULES: Mapping[str, FsckRule] = _rules()
"""Every message id of git's fsck (``Documentation/fsck-msgids.adoc``, ``fsck.h``
``FOREACH_FSCK_MSG_ID``), sorted: git's severity, Enroute's class and why.
docs/security.md shows it (:func:`render_policy_table`). Ids not in
:class:`FsckMsg` are not checked here; their class says what a check would do."""


@dataclass(frozen=True, slots=True)
class FsckPolicy:
    """Which problems refuse an object, and which are only reported.

    By default each id takes its class (:data:`FSCK_RULES`): an error refuses,
    a harmless one is a warning. ``overrides`` maps a message id to a severity
    as ``receive.fsck.<msg-id> = error|warn|ignore`` sets it; as in git
    (``fsck_set_msg_type``), a severity set there stands. A ``fixed`` id
    (FATAL in git, or an object Enroute could not read) is never lowered.
    """

    overrides: Mapping[str, Severity] = field(default_factory=lambda: MappingProxyType({}))

    def severity(self, msg: FsckMsg) -> Severity:
        rule = FSCK_RULES[msg.value]
        found = self.overrides.get(msg.value)
        if found is not None and not (rule.fixed and found > Severity.ERROR):
            return found
        if rule.git is Severity.FATAL:
            return Severity.FATAL
        return Severity.ERROR if rule.cls is FsckClass.ERROR else Severity.WARN

    def refuses(self, msg: FsckMsg) -> bool:
        return self.severity(msg) <= Severity.ERROR


RECEIVE_POLICY = FsckPolicy()
"""What a push is checked with: each id's class, no overrides."""


@dataclass(frozen=True, slots=True)
class FsckProblem:
    msg: FsckMsg
    text: str

    def describe(self) -> str:
        """``<msgId>: <text>``, as git prints it after ``object <oid>:``."""
        return f"{self.msg.value}: {self.text}"


@dataclass(frozen=True, slots=True)
class FsckWarning:
    """One id a push drew warnings for: how many objects, and the first of them."""

    msg_id: str
    count: int
    example: ObjectId

    def describe(self) -> str:
        """``<id>: <count> object(s), e.g. <oid>``: one side-band line of the push."""
        return f"{self.msg_id}: {self.count} object(s), e.g. {oid_to_hex(self.example)}"


class FsckWarnings:
    """The warnings of one push, per id (:meth:`note` is called only for a problem found,
    so a clean object costs nothing here)."""

    __slots__ = ("_counts", "_first")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._first: dict[str, ObjectId] = {}

    def note(self, msg: FsckMsg, oid: ObjectId) -> None:
        msg_id = msg.value
        self._counts[msg_id] = self._counts.get(msg_id, 0) + 1
        self._first.setdefault(msg_id, oid)

    def summary(self) -> tuple[FsckWarning, ...]:
        """Each id once, sorted by id."""
        return tuple(
            FsckWarning(msg_id, count, self._first[msg_id])
            for msg_id, count in sorted(self._counts.items())
        )


def refusal(oid: ObjectId, problem: FsckProblem) -> InvalidObject:
    """The error of an object a policy refuses: git's ``object <oid>: <msgId>: <text>``, then
    what would let it in, so the pusher can look the id up and knows the setting to change."""
    hex_oid = oid_to_hex(oid)
    msg_id = problem.msg.value
    rule = FSCK_RULES[msg_id]
    if rule.git is Severity.FATAL:
        hint = "refused; fatal in git, no setting lowers it"
    elif rule.fixed:
        hint = "refused; Enroute cannot read such an object, no setting lowers it"
    else:
        hint = f"refused; receive.fsck.{msg_id}: warn lowers it"
    return InvalidObject(
        f"object {hex_oid}: {problem.describe()} ({hint})",
        oid=hex_oid,
        msg_id=msg_id,
        **({} if rule.fixed else {"setting": f"receive.fsck.{msg_id}"}),
    )


def render_policy_table() -> str:
    """The table docs/security.md shows between its ``fsck-policy`` markers."""
    checked = {m.value for m in FsckMsg}
    lines = [
        "| id | git | Enroute | checked | why |",
        "|---|---|---|---|---|",
    ]
    for msg_id, rule in FSCK_RULES.items():
        enroute = rule.cls.value + (" (fixed)" if rule.fixed else "")
        lines.append(
            f"| `{msg_id}` | {rule.git.name} | {enroute} "
            f"| {'yes' if msg_id in checked else 'no'} | {rule.reason} |"
        )
    return "\n".join(lines) + "\n"


# -- headers and identities -------------------------------------------------------------------


def _verify_headers(body: bytes) -> FsckProblem | None:
    """``verify_headers``: no NUL before the blank line; headers end with LF."""
    end = body.find(b"\n\n")
    head = body if end < 0 else body[:end]
    nul = head.find(b"\0")
    if nul >= 0:
        return FsckProblem(FsckMsg.NUL_IN_HEADER, f"unterminated header: NUL at offset {nul}")
    if end < 0 and not body.endswith(b"\n"):
        return FsckProblem(FsckMsg.UNTERMINATED_HEADER, "unterminated header")
    return None


_DIGITS = b"0123456789"
# date_overflows: a time_t that cannot hold it (git with a 64-bit signed time_t).
_DATE_MAX = 2**63 - 1


# An identity git writes (dates up to 18 digits cannot overflow); others take the long path.
# Its parts are public so that a reader of whole commits can match the same form
# (engine.ingest reads a clean commit's header in one expression).
USUAL_IDENT_NAME_EMAIL = rb"[^<>\n][^<>\n]* <[^<>\n]*> "
USUAL_IDENT_DATE = rb"0|[1-9][0-9]{0,17}"
USUAL_IDENT_ZONE = rb" [+-][0-9]{4}"
_USUAL_IDENT = re.compile(
    USUAL_IDENT_NAME_EMAIL + b"(?:" + USUAL_IDENT_DATE + b")" + USUAL_IDENT_ZONE
)


def fsck_ident(line: bytes) -> FsckProblem | None:
    """``fsck_ident``: ``name SP "<" email ">" SP date SP tz``, one line (no LF in ``line``)."""
    if _USUAL_IDENT.fullmatch(line) is not None:
        return None
    if line.startswith(b"<"):
        return FsckProblem(
            FsckMsg.MISSING_NAME_BEFORE_EMAIL, "invalid author/committer line - missing name"
        )
    p = _cspn(line, 0, b"<>")
    if p < len(line) and line[p] == 0x3E:  # '>'
        return FsckProblem(FsckMsg.BAD_NAME, "invalid author/committer line - bad name")
    if p >= len(line):
        return FsckProblem(FsckMsg.MISSING_EMAIL, "invalid author/committer line - missing email")
    if line[p - 1] != 0x20:
        return FsckProblem(
            FsckMsg.MISSING_SPACE_BEFORE_EMAIL,
            "invalid author/committer line - missing space before email",
        )
    p = _cspn(line, p + 1, b"<>")
    if p >= len(line) or line[p] != 0x3E:
        return FsckProblem(FsckMsg.BAD_EMAIL, "invalid author/committer line - bad email")
    p += 1
    if line[p : p + 1] != b" ":
        return FsckProblem(
            FsckMsg.MISSING_SPACE_BEFORE_DATE,
            "invalid author/committer line - missing space before date",
        )
    p += 1
    if line[p : p + 1] == b"0" and line[p + 1 : p + 2] != b" ":
        return FsckProblem(
            FsckMsg.ZERO_PADDED_DATE, "invalid author/committer line - zero-padded date"
        )
    end = p
    while end < len(line) and line[end] in _DIGITS:
        end += 1
    if end > p and (end - p > 20 or int(line[p:end]) > _DATE_MAX):
        text = "invalid author/committer line - date causes integer overflow"
        return FsckProblem(FsckMsg.BAD_DATE_OVERFLOW, text)
    if end == p or line[end : end + 1] != b" ":
        return FsckProblem(FsckMsg.BAD_DATE, "invalid author/committer line - bad date")
    tz = line[end + 1 :]
    if len(tz) != 5 or tz[0] not in b"+-" or tz[1:].translate(None, _DIGITS):
        return FsckProblem(FsckMsg.BAD_TIMEZONE, "invalid author/committer line - bad time zone")
    return None


def _cspn(data: bytes, pos: int, stops: bytes) -> int:
    """strcspn from ``pos``: the first index holding one of ``stops``, or ``len(data)``."""
    found = [i for i in (data.find(bytes([s]), pos) for s in stops) if i >= 0]
    return min(found) if found else len(data)


_HEX = b"0123456789abcdefABCDEF"


def _oid_line(body: bytes, pos: int) -> int | None:
    """``parse_oid_hex`` then ``*p == '\\n'``: the position after the LF, or None."""
    hex_ = body[pos : pos + 40]
    if len(hex_) != 40 or hex_.translate(None, _HEX) or body[pos + 40 : pos + 41] != b"\n":
        return None
    return pos + 41


def _line(body: bytes, pos: int) -> tuple[bytes, int]:
    """The line at ``pos`` without its LF, and where the next one starts."""
    nl = body.find(b"\n", pos)
    if nl < 0:
        return body[pos:], len(body)
    return body[pos:nl], nl + 1


# -- commits ----------------------------------------------------------------------------------


def fsck_commit(body: bytes) -> list[FsckProblem]:
    """``fsck_commit``: tree, parents, exactly one author, a committer, each ident valid.

    Every problem in git's order. Where git goes on after a problem it only
    warns about (author and committer lines, their count), so does this list,
    so that a harmless problem never hides a later one; where git stops
    whatever the severity (no tree line, no committer line) or cannot read on
    (a bad tree or parent line), the list ends.
    """
    header = _verify_headers(body)
    if header is not None:
        return [header]
    if not body.startswith(b"tree "):
        return [FsckProblem(FsckMsg.MISSING_TREE, "invalid format - expected 'tree' line")]
    pos = _oid_line(body, 5)
    if pos is None:
        return [FsckProblem(FsckMsg.BAD_TREE_SHA1, "invalid 'tree' line format - bad sha1")]
    while body.startswith(b"parent ", pos):
        after = _oid_line(body, pos + 7)
        if after is None:
            return [FsckProblem(FsckMsg.BAD_PARENT_SHA1, "invalid 'parent' line format - bad sha1")]
        pos = after
    found: list[FsckProblem] = []
    authors = 0
    while body.startswith(b"author ", pos):
        authors += 1
        line, pos = _line(body, pos + 7)
        problem = fsck_ident(line)
        if problem is not None:
            found.append(problem)
    if authors < 1:
        text = "invalid format - expected 'author' line"
        found.append(FsckProblem(FsckMsg.MISSING_AUTHOR, text))
    elif authors > 1:
        text = "invalid format - multiple 'author' lines"
        found.append(FsckProblem(FsckMsg.MULTIPLE_AUTHORS, text))
    if not body.startswith(b"committer ", pos):
        text = "invalid format - expected 'committer' line"
        found.append(FsckProblem(FsckMsg.MISSING_COMMITTER, text))
        return found
    line, pos = _line(body, pos + 10)
    problem = fsck_ident(line)
    if problem is not None:
        found.append(problem)
    if b"\0" in body:
        found.append(FsckProblem(FsckMsg.NUL_IN_COMMIT, "NUL byte in the commit object body"))
    return found


# -- tags -------------------------------------------------------------------------------------

_TYPE_NAMES = frozenset(t.type_name for t in ObjectType)


def fsck_tag(body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> list[FsckProblem]:
    """``fsck_tag_standalone``: object, type, tag lines, then an optional valid tagger."""
    header = _verify_headers(body)
    if header is not None:
        return [header]
    if not body.startswith(b"object "):
        return [FsckProblem(FsckMsg.MISSING_OBJECT, "invalid format - expected 'object' line")]
    pos = _oid_line(body, 7)
    if pos is None:
        return [FsckProblem(FsckMsg.BAD_OBJECT_SHA1, "invalid 'object' line format - bad sha1")]
    if not body.startswith(b"type ", pos):
        return [FsckProblem(FsckMsg.MISSING_TYPE_ENTRY, "invalid format - expected 'type' line")]
    nl = body.find(b"\n", pos + 5)
    if nl < 0:
        return [FsckProblem(FsckMsg.MISSING_TYPE, "invalid format - unexpected end after 'type'")]
    if body[pos + 5 : nl] not in _TYPE_NAMES:
        return [FsckProblem(FsckMsg.BAD_TYPE, "invalid 'type' value")]
    pos = nl + 1
    if not body.startswith(b"tag ", pos):
        return [FsckProblem(FsckMsg.MISSING_TAG_ENTRY, "invalid format - expected 'tag' line")]
    nl = body.find(b"\n", pos + 4)
    if nl < 0:
        return [FsckProblem(FsckMsg.MISSING_TAG, "invalid format - unexpected end after 'type'")]
    found: list[FsckProblem] = []
    if not is_valid_ref_name(b"refs/tags/" + body[pos + 4 : nl], limits=limits):
        found.append(FsckProblem(FsckMsg.BAD_TAG_NAME, "invalid 'tag' name"))
    pos = nl + 1
    if not body.startswith(b"tagger ", pos):
        found.append(
            FsckProblem(FsckMsg.MISSING_TAGGER_ENTRY, "invalid format - expected 'tagger' line")
        )
        return found
    line, pos = _line(body, pos + 7)
    problem = fsck_ident(line)
    if problem is not None:
        found.append(problem)
    problem = _signature_header(body, pos)
    if problem is not None:
        found.append(problem)
    return found


_SIGNATURE_HEADERS = (b"gpgsig ", b"gpgsig-sha256 ")


def _signature_header(body: bytes, pos: int) -> FsckProblem | None:
    """``fsck_tag_standalone`` after the tagger: a ``gpgsig`` (or ``gpgsig-sha256``) header and
    its continuation lines (a leading space) each end with LF (badGpgsig,
    badHeaderContinuation).

    :func:`_verify_headers` runs first and refuses a header without its LF
    (unterminatedHeader), as git's does: what is left to find here is kept as git keeps it,
    so that a check before it that lets more through still has this one behind it.
    """
    for prefix in _SIGNATURE_HEADERS:
        if body.startswith(prefix, pos):
            break
    else:
        return None
    nl = body.find(b"\n", pos + len(prefix))
    if nl < 0:
        text = "invalid format - unexpected end after 'gpgsig' or 'gpgsig-sha256' line"
        return FsckProblem(FsckMsg.BAD_GPGSIG, text)
    pos = nl + 1
    while body.startswith(b" ", pos):
        nl = body.find(b"\n", pos)
        if nl < 0:
            text = (
                "invalid format - unexpected end in 'gpgsig' or 'gpgsig-sha256' continuation line"
            )
            return FsckProblem(FsckMsg.BAD_HEADER_CONTINUATION, text)
        pos = nl + 1
    return None


# -- trees ------------------------------------------------------------------------------------

_KNOWN_MODES = frozenset([*(b"%o" % m for m in STANDARD_MODES), b"100664"])


def _hfs_is(name: bytes, needle: bytes) -> bool:
    """``is_hfs_dot_generic``: ``.<needle>`` once HFS+ drops its ignored code points."""
    chars = _hfs_code_points(name)
    if next(chars) != 0x2E:
        return False
    for want in needle:
        c = next(chars)
        if c > 127 or chr(c).lower() != chr(want):
            return False
    return next(chars) in (0, 0x2F)


def _spaces_and_periods_to_end(name: bytes, pos: int) -> bool:
    """``only_spaces_and_periods``: the rest is dots and spaces, up to the end or a ``:``."""
    for c in name[pos:]:
        if c == 0x3A:
            return True
        if c not in b". ":
            return False
    return True


def _ntfs_is(name: bytes, dotname: bytes, short_fallback: bytes) -> bool:
    """``is_ntfs_dot_generic``: ``.<dotname>`` with NTFS's tails, or an 8.3 short name."""
    n = len(dotname)
    lower = name.lower()
    if lower[:1] == b"." and lower[1 : 1 + n] == dotname:
        return _spaces_and_periods_to_end(name, 1 + n)
    if lower[:6] == dotname[:6] and name[6:7] == b"~" and name[7:8] in b"1234":
        return _spaces_and_periods_to_end(name, 8)
    if lower[:6] == short_fallback and name[6:7] == b"~" and name[7:8].isdigit():
        digits = 7
        while name[digits : digits + 1].isdigit():
            digits += 1
        return _spaces_and_periods_to_end(name, digits)
    return False


def is_dotgitmodules_name(name: bytes) -> bool:
    """A name some filesystem reads as ``.gitmodules`` (utf8.c, path.c)."""
    return _hfs_is(name, b"gitmodules") or _ntfs_is(name, b"gitmodules", b"gi7eba")


def is_dotgitattributes_name(name: bytes) -> bool:
    """A name some filesystem reads as ``.gitattributes`` (utf8.c ``is_hfs_dotgitattributes``,
    path.c ``is_ntfs_dotgitattributes``: short name ``GITATT~<1-4>`` or ``GI7D29~<n>``)."""
    return _hfs_is(name, b"gitattributes") or _ntfs_is(name, b"gitattributes", b"gi7d29")


def _maybe_dotgit(name: bytes) -> bool:
    """:func:`is_dotgit_name`, its decoding skipped for ASCII names that cannot match."""
    if name.isascii() and b"\\" not in name:
        low = name[:5].lower()
        if not (low.startswith(b".git") or low == b"git~1"):
            return False
    return is_dotgit_name(name)


def _maybe_dotgitmodules(name: bytes) -> bool:
    """:func:`is_dotgitmodules_name`, skipped for ASCII names that cannot match."""
    if name.isascii():
        low = name[:7].lower()
        if not (low.startswith((b".gitmod", b"gitmod~", b"gi7eba~"))):
            return False
    return is_dotgitmodules_name(name)


def _tree_entries(body: bytes, limits: Limits) -> Iterator[tuple[bytes, bytes, bytes]]:
    """(mode bytes, name, oid) of each entry; ``InvalidObject`` where ``decode_tree_entry``
    would fail (fsck's badTree)."""
    pos = 0
    end = len(body)
    count = 0
    entries_max = limits.tree_entries_max
    while pos < end:
        count += 1
        if count > entries_max:
            raise LimitExceeded("tree_entries_max", count, entries_max)
        space = body.find(b" ", pos)
        nul = body.find(b"\0", pos)
        if space < 0 or nul < 0 or nul < space or space == pos:
            raise InvalidObject("badTree: cannot be parsed as a tree", offset=pos)
        mode = body[pos:space]
        if mode.translate(None, b"01234567"):
            raise InvalidObject("badTree: cannot be parsed as a tree", offset=pos)
        oid_end = nul + 1 + OID_BYTES
        if oid_end > end or nul == space + 1:
            raise InvalidObject("badTree: cannot be parsed as a tree", offset=pos)
        yield mode, body[space + 1 : nul], body[nul + 1 : oid_end]
        pos = oid_end


# The usual tree: modes git writes, names without '/', checked in bulk (C-level regex,
# sort and set) instead of entry by entry; anything else takes the entry-by-entry path.
_USUAL_ENTRY = re.compile(rb"(40000|100644|100755|120000|160000) ([^\0/]+)\0.{20}", re.DOTALL)
# Names (joined by '/') that might be '.', '..' or a '.git' variant (NTFS short names,
# backslashes, HFS+ ignorable code points, which are non-ASCII).
_SUSPECT_NAMES = re.compile(rb"(?:^|/)(?:\.|[gG][iI][tT]~)|\\|[\x80-\xff]")
_ENTRY_FIXED_BYTES = 2 + OID_BYTES  # the space, the NUL and the object id


def _usual_tree(body: bytes, limits: Limits) -> list[FsckProblem] | None:
    """The problems of a usual tree, or None when the tree needs the entry-by-entry path."""
    found = _usual_tree_names(body, limits)
    return None if found is None else found[0]


def _usual_tree_names(body: bytes, limits: Limits) -> tuple[list[FsckProblem], bytes] | None:
    """:func:`_usual_tree` and the tree's names joined by '/', or None for the long path.

    ``findall`` matches entry after entry from offset 0 when the body is a run of
    usual entries; the byte count proves it is (a skipped byte would be missing).
    """
    entries: list[tuple[bytes, bytes]] = _USUAL_ENTRY.findall(body)
    if not entries:
        return ([], b"") if not body else None
    modes, names = zip(*entries, strict=True)
    joined = b"/".join(names)
    covered = sum(map(len, modes)) + len(joined) + 1 + (_ENTRY_FIXED_BYTES - 1) * len(entries)
    if covered != len(body):
        return None
    if len(entries) > limits.tree_entries_max:
        raise LimitExceeded("tree_entries_max", len(entries), limits.tree_entries_max)
    found: list[FsckProblem] = []
    if _may_be_suspect(joined) and _SUSPECT_NAMES.search(joined) is not None:
        found.extend(_dot_problems(joined))
    if len(set(names)) != len(names):
        found.insert(0, FsckProblem(FsckMsg.DUPLICATE_ENTRIES, "contains duplicate file entries"))
    else:
        keys = (
            [n + b"/" if m == b"40000" else n for m, n in entries]
            if b"40000" in modes
            else list(names)
        )
        if keys != sorted(keys):
            found.insert(0, FsckProblem(FsckMsg.TREE_NOT_SORTED, "not properly sorted"))
    if b"120000" in modes and any(m == b"120000" and _maybe_dotgitmodules(n) for m, n in entries):
        found.insert(0, FsckProblem(FsckMsg.GITMODULES_SYMLINK, ".gitmodules is a symbolic link"))
    if b"\0" + ZERO_OID in body:  # only a name's NUL can be followed by 20 zero bytes
        found.append(FsckProblem(FsckMsg.NULL_SHA1, "contains entries pointing to null sha1"))
    name_max = limits.tree_entry_name_bytes_max
    if len(body) > name_max and max(map(len, names)) > name_max:
        text = f"contains a name over {name_max} bytes"
        found.append(FsckProblem(FsckMsg.LARGE_PATHNAME, text))
    return found, joined


def _may_be_suspect(joined: bytes) -> bool:
    """Whether :data:`_SUSPECT_NAMES` can match: substring tests cost far less than its
    search, which has no literal to skip ahead to. Every match needs a name starting
    with '.', a '~', a backslash or a non-ASCII byte."""
    return (
        joined[:1] == b"."
        or b"/." in joined
        or b"~" in joined
        or b"\\" in joined
        or not joined.isascii()
    )


def _may_name_special(joined: bytes) -> bool:
    """Whether some name of ``joined`` (names joined by '/') can read as a
    :class:`SpecialBlob` name: every such ASCII spelling holds one of its
    :data:`_SPECIAL_STEMS` in some case."""
    if not joined.isascii():
        return True
    low = joined.lower()
    return any(stem in low for stem in _SPECIAL_STEMS)


def _dot_problems(joined: bytes) -> list[FsckProblem]:
    """hasDotgit, hasDotdot and hasDot among names joined by '/' (none holds a '/')."""
    dots: set[FsckMsg] = set()
    for match in _SUSPECT_NAMES.finditer(joined):
        start = joined.rfind(b"/", 0, match.start() + 1) + 1
        end = joined.find(b"/", match.end())
        name = joined[start : end if end >= 0 else len(joined)]
        if name in (b".", b".."):
            dots.add(FsckMsg.HAS_DOT if name == b"." else FsckMsg.HAS_DOTDOT)
        elif _maybe_dotgit(name):
            dots.add(FsckMsg.HAS_DOTGIT)
    texts = {
        FsckMsg.HAS_DOTGIT: "contains '.git'",
        FsckMsg.HAS_DOTDOT: "contains '..'",
        FsckMsg.HAS_DOT: "contains '.'",
    }
    return [FsckProblem(m, t) for m, t in texts.items() if m in dots]


def fsck_tree(body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> list[FsckProblem]:
    """``fsck_tree``: each entry's name and mode, then the order of neighbours.

    Duplicates are found anywhere (a set of names), so an unsorted tree cannot
    hide one from the neighbour scan.
    """
    usual = _usual_tree(body, limits)
    return usual if usual is not None else _tree_by_entry(body, limits)


def _tree_by_entry(body: bytes, limits: Limits) -> list[FsckProblem]:
    """:func:`fsck_tree` one entry at a time: any mode, any name (tests compare the paths)."""
    flags: dict[FsckMsg, str] = {}
    names: set[bytes] = set()
    prev_name = b""
    prev_tree = False
    name_max = limits.tree_entry_name_bytes_max
    try:
        for mode_bytes, name, oid in _tree_entries(body, limits):
            mode = int(mode_bytes, 8)
            is_tree = is_tree_mode(mode)
            if oid == ZERO_OID:
                flags.setdefault(FsckMsg.NULL_SHA1, "contains entries pointing to null sha1")
            if b"/" in name:
                flags.setdefault(FsckMsg.FULL_PATHNAME, "contains full pathnames")
            if name in (b".", b".."):
                msg = FsckMsg.HAS_DOT if name == b"." else FsckMsg.HAS_DOTDOT
                flags.setdefault(msg, f"contains '{name.decode()}'")
            elif _maybe_dotgit(name):
                flags.setdefault(FsckMsg.HAS_DOTGIT, "contains '.git'")
            if len(name) > name_max:
                flags.setdefault(FsckMsg.LARGE_PATHNAME, f"contains a name over {name_max} bytes")
            if mode_bytes.startswith(b"0"):
                flags.setdefault(FsckMsg.ZERO_PADDED_FILEMODE, "contains zero-padded file modes")
            elif mode_bytes not in _KNOWN_MODES:
                flags.setdefault(FsckMsg.BAD_FILEMODE, "contains bad file modes")
            if mode == MODE_SYMLINK and _maybe_dotgitmodules(name):
                flags.setdefault(FsckMsg.GITMODULES_SYMLINK, ".gitmodules is a symbolic link")
            if name in names:
                flags.setdefault(FsckMsg.DUPLICATE_ENTRIES, "contains duplicate file entries")
            elif names and not _ordered(prev_name, prev_tree, name, is_tree):
                flags.setdefault(FsckMsg.TREE_NOT_SORTED, "not properly sorted")
            names.add(name)
            prev_name, prev_tree = name, is_tree
    except InvalidObject:
        return [FsckProblem(FsckMsg.BAD_TREE, "cannot be parsed as a tree")]
    if FsckMsg.DUPLICATE_ENTRIES in flags:  # order is only judged among unique names
        flags.pop(FsckMsg.TREE_NOT_SORTED, None)
    # fsck_tree reports in this order, most severe first for a reader
    return [FsckProblem(m, flags[m]) for m in _TREE_REPORT_ORDER if m in flags]


_TREE_REPORT_ORDER = (
    FsckMsg.DUPLICATE_ENTRIES,
    FsckMsg.TREE_NOT_SORTED,
    FsckMsg.GITMODULES_SYMLINK,
    FsckMsg.HAS_DOTGIT,
    FsckMsg.HAS_DOTDOT,
    FsckMsg.HAS_DOT,
    FsckMsg.FULL_PATHNAME,
    FsckMsg.EMPTY_NAME,
    FsckMsg.NULL_SHA1,
    FsckMsg.LARGE_PATHNAME,
    FsckMsg.ZERO_PADDED_FILEMODE,
    FsckMsg.BAD_FILEMODE,
)


def _ordered(a: bytes, a_tree: bool, b: bytes, b_tree: bool) -> bool:
    """``verify_ordered``: ``a`` sorts before ``b``, a tree comparing as ``name/``."""
    return (a + b"/" if a_tree else a) < (b + b"/" if b_tree else b)


# -- one object -------------------------------------------------------------------------------


def fsck_object(
    type_num: int, body: bytes, *, limits: Limits = DEFAULT_LIMITS
) -> list[FsckProblem]:
    """Every problem fsck finds in one object of type ``type_num`` (blobs have none here)."""
    if type_num == ObjectType.TREE:
        return fsck_tree(body, limits=limits)
    if type_num == ObjectType.COMMIT:
        return fsck_commit(body)
    if type_num == ObjectType.TAG:
        return fsck_tag(body, limits=limits)
    return []


def check_object(
    oid: ObjectId,
    type_num: int,
    body: bytes,
    *,
    policy: FsckPolicy = RECEIVE_POLICY,
    limits: Limits = DEFAULT_LIMITS,
    warnings: FsckWarnings | None = None,
) -> None:
    """Raise :class:`InvalidObject` for the first problem ``policy`` refuses; count the
    problems it only warns about in ``warnings``."""
    if type_num == ObjectType.BLOB:
        return
    _refuse_first(oid, fsck_object(type_num, body, limits=limits), policy, warnings)


def _refuse_first(
    oid: ObjectId,
    problems: Sequence[FsckProblem],
    policy: FsckPolicy,
    warnings: FsckWarnings | None = None,
) -> None:
    """git's ``report``: a refused problem stops the object; a warned one is counted once
    per object and id (a commit may hold one id twice: author and committer)."""
    noted: set[FsckMsg] = set()
    for problem in problems:
        msg = problem.msg
        severity = policy.severity(msg)
        if severity <= Severity.ERROR:
            raise refusal(oid, problem)
        if warnings is not None and severity < Severity.IGNORE and msg not in noted:
            noted.add(msg)
            warnings.note(msg, oid)


class TreeCheckMemo:
    """What :func:`check_tree` found in usual trees, by their names and modes (one push).

    Most trees of a history differ from another version of the same directory
    only in object ids: their names and modes, which decide every check but
    ``nullSha1`` and which :func:`special_blobs` are collected, are the same. The
    key is the tree with the 20 bytes after each NUL cut out (its skeleton);
    a tree maps to a skeleton of a usual tree only when every NUL left in the
    skeleton had 20 bytes cut after it, and then it is that usual tree with
    other ids. Bounded in bytes: full, it starts again empty. One memo serves
    one :class:`Limits` (the checks depend on it).
    """

    __slots__ = ("_bytes", "_items", "_max")

    def __init__(self, max_bytes: int) -> None:
        self._items: dict[bytes, tuple[tuple[FsckProblem, ...], tuple[FsckProblem, ...], bool]]
        self._items = {}
        self._bytes = 0
        self._max = max_bytes

    def get(
        self, skeleton: bytes
    ) -> tuple[tuple[FsckProblem, ...], tuple[FsckProblem, ...], bool] | None:
        return self._items.get(skeleton)

    def put(
        self,
        skeleton: bytes,
        found: list[FsckProblem],
        may_name_special: bool,
    ) -> None:
        cost = len(skeleton) + _MEMO_ENTRY_BYTES
        if cost > self._max:
            return
        if self._bytes + cost > self._max:
            self._items.clear()
            self._bytes = 0
        # nullSha1 depends on the ids: kept out, and put back before largePathname on a hit
        before = tuple(p for p in found if p.msg not in _NOT_BEFORE_NULL)
        after = tuple(p for p in found if p.msg is FsckMsg.LARGE_PATHNAME)
        self._items[skeleton] = (before, after, may_name_special)
        self._bytes += cost


_MEMO_ENTRY_BYTES = 160  # the dict slot, the key's object header and the value tuples
_NOT_BEFORE_NULL = frozenset((FsckMsg.NULL_SHA1, FsckMsg.LARGE_PATHNAME))
_OID_AFTER_NUL = re.compile(rb"\0.{20}", re.DOTALL)
_NULL_SHA1_PROBLEM = FsckProblem(FsckMsg.NULL_SHA1, "contains entries pointing to null sha1")


def check_tree(
    oid: ObjectId,
    body: bytes,
    *,
    policy: FsckPolicy = RECEIVE_POLICY,
    limits: Limits = DEFAULT_LIMITS,
    memo: TreeCheckMemo | None = None,
    warnings: FsckWarnings | None = None,
) -> list[tuple[SpecialBlob, ObjectId]]:
    """:func:`check_object` for a tree, then its :func:`special_blobs`, from one parse.

    The indexer checks every tree of a push (fsck.c ``fsck_tree`` collects the
    ``.gitmodules`` and ``.gitattributes`` ids as it walks the entries); a usual
    tree's names are read once for both, or not at all when ``memo`` knows a
    tree with the same names and modes. Same results as the two calls.

    First, compiled code (``enroute_native.tree_fsck``, docs/native.md) tells a
    clean tree, one with plain names in git's order that holds no problem and
    names no :class:`SpecialBlob` (every spelling starts with '.git' in some case or
    holds '~' or a non-ASCII byte, which it never calls clean; nor '.' or '..'), without
    a Python object per entry; every other tree is judged here.
    """
    if tree_clean(body, limits.tree_entries_max, limits.tree_entry_name_bytes_max):
        return []
    skeleton = b""
    if memo is not None:
        skeleton = _OID_AFTER_NUL.sub(b"\0", body)
        if len(body) - len(skeleton) == OID_BYTES * skeleton.count(b"\0"):
            known = memo.get(skeleton)
            if known is not None:
                before, after, may_name_special = known
                if before or after or b"\0" + ZERO_OID in body:
                    null = (_NULL_SHA1_PROBLEM,) if b"\0" + ZERO_OID in body else ()
                    _refuse_first(oid, [*before, *null, *after], policy, warnings)
                return special_blobs(body, limits=limits) if may_name_special else []
        else:
            skeleton = b""  # a NUL without 20 bytes after it: not a usual tree
    usual = _usual_tree_names(body, limits)
    if usual is None:
        check_object(oid, ObjectType.TREE, body, policy=policy, limits=limits, warnings=warnings)
        return special_blobs(body, limits=limits)
    problems, joined = usual
    may_name_special = _may_name_special(joined)
    if memo is not None and skeleton:
        memo.put(skeleton, problems, may_name_special)
    _refuse_first(oid, problems, policy, warnings)
    return special_blobs(body, limits=limits) if may_name_special else []


# -- .gitmodules ------------------------------------------------------------------------------
#
# fsck.c collects the ids of blobs a tree names ``.gitmodules`` (any spelling a
# filesystem reads as it) and checks their contents once seen (``fsck_blob``,
# ``fsck_gitmodules_fn``): submodule names that climb out with ``..``
# (CVE-2018-11235), urls and paths that read as command-line options
# (CVE-2018-17456), ``update = !command``.


class SpecialBlob(enum.Enum):
    """A file name whose blob fsck reads (fsck.c ``gitmodules_found``, ``gitattributes_found``).

    Git's clients read these files from a checkout: what they hold is checked
    wherever the blob is stored, once a tree names it so in any spelling.
    """

    GITMODULES = ".gitmodules"
    GITATTRIBUTES = ".gitattributes"

    def names(self, name: bytes) -> bool:
        """Whether some filesystem reads ``name`` as this file (ASCII names that cannot
        match skip the decoding)."""
        if self is SpecialBlob.GITMODULES:
            return _maybe_dotgitmodules(name)
        if name.isascii() and not name[:7].lower().startswith(_ATTRIBUTES_PREFIXES):
            return False
        return is_dotgitattributes_name(name)


_ATTRIBUTES_PREFIXES = (b".gitatt", b"gitatt~", b"gi7d29~")
# Every ASCII spelling of a SpecialBlob name holds one of these in some case (NTFS short
# names included); an HFS+ spelling holds a non-ASCII ignorable code point.
_SPECIAL_STEMS = (b"gitmod", b"gi7eba", b"gitatt", b"gi7d29")


def special_blobs(
    body: bytes, *, limits: Limits = DEFAULT_LIMITS
) -> list[tuple[SpecialBlob, ObjectId]]:
    """What a tree names ``.gitmodules`` or ``.gitattributes`` other than as a symlink, and
    as which (fsck.c ``fsck_tree`` fills ``gitmodules_found`` and ``gitattributes_found``).

    Every ASCII spelling holds one of :data:`_SPECIAL_STEMS` in some case; an
    HFS+ spelling holds the UTF-8 of an ignorable code point (U+200C-200F,
    U+202A-202E, U+206A-206F: E2 80/E2 81; U+FEFF: EF BB BF).
    """
    low = body.lower()  # substring tests: far cheaper than a regular expression here
    if not any(stem in low for stem in _SPECIAL_STEMS) and not (
        b"\xe2\x80" in body or b"\xe2\x81" in body or b"\xef\xbb\xbf" in body
    ):
        return []
    found: list[tuple[SpecialBlob, ObjectId]] = []
    try:
        for mode_bytes, name, oid in _tree_entries(body, limits):
            if int(mode_bytes, 8) == MODE_SYMLINK:
                continue  # gitmodulesSymlink's job; gitattributesSymlink is INFO in git
            found.extend((kind, ObjectId(oid)) for kind in SpecialBlob if kind.names(name))
    except InvalidObject:
        return []  # fsck_tree reports badTree
    return found


def _submodule_name_ok(name: bytes) -> bool:
    """``check_submodule_name``: not empty, no ``..`` component (``/`` or ``\\`` separated)."""
    if not name:
        return False
    return all(part != b".." for part in re.split(rb"[/\\]", name))


def _url_decode(value: bytes) -> bytes:
    """url.c ``url_decode``: ``%XX`` to its byte, nothing else changed."""
    return re.sub(rb"%([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), value)


def _relative_dotdots(url: bytes) -> tuple[bool, int, bytes]:
    """Whether ``url`` is relative (``./``, ``../``, ``\\`` too), its leading ``../``
    count and what follows all leading ``./`` and ``../`` (fsck.c ``count_leading_dotdots``)."""
    relative = re.match(rb"\.\.?[/\\]", url) is not None
    climbs = 0
    while True:
        if re.match(rb"\.\.[/\\]", url):
            climbs += 1
            url = url[3:]
        elif re.match(rb"\.[/\\]", url):
            url = url[2:]
        else:
            return relative, climbs, url


_CURL_SCHEMES = (b"http", b"https", b"ftp", b"ftps")


def _curl_url(url: bytes) -> bytes | None:
    """fsck.c ``url_to_curl_url``: the url git-remote-curl would get, or None."""
    for scheme in _CURL_SCHEMES:
        if url.startswith(scheme + b"::"):
            return url[len(scheme) + 2 :]
        if url.startswith(scheme + b"://"):
            return url
    return None


def _credential_url_ok(url: bytes) -> bool:
    """credential.c ``credential_from_url_gently`` succeeds and gives a host.

    Older git ends the host at ``/``; git 2.39.5 at ``/``, ``?`` or ``#``
    (an earlier end can only empty the host): both are tried and either
    failing refuses. A component with a newline anywhere fails, as in git; a
    host that decodes to nothing before a NUL fails too (git leaves ``%00``
    undecoded, so it is stricter here).
    """
    scheme_end = url.find(b"://")
    if scheme_end <= 0 or b"\n" in url[:scheme_end]:
        return False
    rest = url[scheme_end + 3 :]
    for host_end in (rb"[/]", rb"[/?#]"):
        found = re.search(host_end, rest)
        slash = found.start() if found else len(rest)
        at = rest.find(b"@")
        host_start = at + 1 if 0 <= at < slash else 0
        user_info = _url_decode(rest[: max(host_start - 1, 0)])
        host = _url_decode(rest[host_start:slash])
        path = _url_decode(rest[slash:].lstrip(b"/"))
        if host[:1] in (b"", b"\0") or any(b"\n" in part for part in (user_info, host, path)):
            return False
    return True


def _submodule_url_ok(url: bytes) -> bool:
    """fsck.c ``check_submodule_url`` (git 2.39), and stricter: no url with a newline at all.

    Refused: an option-like url (CVE-2018-17456); a relative or ``git://``
    url that climbs out with ``../`` into ``:`` or ``/`` (CVE-2020-11008),
    or holds a newline once %-decoded; a url git-remote-curl would get
    (``http[s]::``, ``ftp[s]::``, ``http[s]://``, ``ftp[s]://``) that a
    credential cannot be read from or that has no host, or with a newline in
    a component. git lets a newline through in a url of any other scheme
    (``ssh://h/%0a``); any url with one is refused here.
    """
    if url.startswith(b"-") or b"\n" in _url_decode(url):
        return False
    relative, climbs, after = _relative_dotdots(url)
    if relative or url.startswith(b"git://"):
        return not (climbs > 0 and after[:1] in (b":", b"/"))
    curl = _curl_url(url)
    return curl is None or _credential_url_ok(curl)


def _gitmodules_problems(entries: tuple[ConfigEntry, ...]) -> Iterator[FsckProblem]:
    """``fsck_gitmodules_fn`` for each ``submodule.<name>.<key>`` variable (a repeated one once)."""
    seen: set[tuple[bytes, bytes | None]] = set()
    for entry in entries:
        if (entry.name, entry.value) in seen:
            continue
        seen.add((entry.name, entry.value))
        split = split_key(entry.name, b"submodule")
        if split is None:
            continue
        name, key = split
        if name is None:
            continue  # submodule.<key>: no name, nothing git reads as a submodule
        value = entry.value
        if not _submodule_name_ok(name):
            shown = name[:100].decode("utf-8", "replace")
            yield FsckProblem(FsckMsg.GITMODULES_NAME, f"disallowed submodule name: {shown}")
        if value is None:
            continue
        text = value[:100].decode("utf-8", "replace")
        if key == b"url" and not _submodule_url_ok(value):
            yield FsckProblem(FsckMsg.GITMODULES_URL, f"disallowed submodule url: {text}")
        if key == b"path" and value.startswith(b"-"):
            yield FsckProblem(FsckMsg.GITMODULES_PATH, f"disallowed submodule path: {text}")
        if key == b"update" and value.startswith(b"!"):
            text = f"disallowed submodule update setting: {text}"
            yield FsckProblem(FsckMsg.GITMODULES_UPDATE, text)


def fsck_gitmodules(body: bytes) -> list[FsckProblem]:
    """``fsck_blob`` for a .gitmodules blob: the first problem of each id, in order found.

    The blob is read as git's config parser reads it (:mod:`enroute_core.git.gitconfig`),
    both as a checked-out file and as a blob in memory (the readings differ
    on the byte FF and on a BOM); a problem either reading shows counts. As in
    git, the variables before a syntax error are checked, and the error adds
    ``gitmodulesParse``.
    """
    found: dict[FsckMsg, FsckProblem] = {}
    for reading in blob_readings(body):
        for problem in _gitmodules_problems(reading.entries):
            found.setdefault(problem.msg, problem)
        if not reading.ok:
            text = f"could not parse gitmodules blob (line {reading.error_line})"
            found.setdefault(FsckMsg.GITMODULES_PARSE, FsckProblem(FsckMsg.GITMODULES_PARSE, text))
    return list(found.values())


def fsck_gitattributes(body: bytes) -> list[FsckProblem]:
    """``fsck_blob`` for a .gitattributes blob: a line of ``ATTR_MAX_LINE_LENGTH`` (2048)
    bytes or more, which git's attribute reader refuses (attr.c, after CVE-2022-23521).

    As in git, the lines end at the first NUL (it reads the blob as a C string).
    """
    nul = body.find(b"\0")
    if _has_line_of(body, len(body) if nul < 0 else nul, _ATTR_LINE_BYTES_MAX):
        message = ".gitattributes has too long lines to parse"
        return [FsckProblem(FsckMsg.GITATTRIBUTES_LINE_LENGTH, message)]
    return []


_ATTR_LINE_BYTES_MAX = 2048  # attr.h ATTR_MAX_LINE_LENGTH: what git's clients read, not a limit
GIT_ATTR_FILE_BYTES_MAX = 100 * 1024 * 1024
"""attr.h ``ATTR_MAX_FILE_SIZE``: git's clients refuse to read a larger ``.gitattributes``,
so ``gitattributes_bytes_max`` may not be set above it (config.py)."""


def _has_line_of(body: bytes, end: int, length: int) -> bool:
    """Whether ``body[:end]`` holds a line (bytes between newlines) of ``length`` or more.

    Line by line, a blob of 100 MiB of newlines would cost 100 million steps
    (or list items). A line of ``length`` bytes covers a whole aligned block of
    ``length // 2``: only blocks without a newline (one C ``find`` each) are
    measured, from the newlines either side.
    """
    block = max(length // 2, 1)
    start = 0
    while start + block <= end:
        if body.find(b"\n", start, start + block) < 0:
            line_start = body.rfind(b"\n", 0, start) + 1
            line_end = body.find(b"\n", start + block, end)
            if (end if line_end < 0 else line_end) - line_start >= length:
                return True
        start += block
    return False


def gitmodules_parse_bytes(
    kind: SpecialBlob, type_num: int, size: int, so_far: int, limits: Limits = DEFAULT_LIMITS
) -> int:
    """The bytes :func:`check_special_blob` will parse for this object (a ``.gitmodules``
    blob within ``gitmodules_bytes_max``; 0 for anything else), checked against what one
    push may parse in all: ``so_far`` plus these over ``ingest_gitmodules_bytes_max``
    raises :class:`LimitExceeded`.

    git's config syntax costs up to ~2 s of CPU per MiB here (a file of bare keys), and
    deltas let a small pack name thousands of versions of the file.
    """
    if kind is not SpecialBlob.GITMODULES or type_num != ObjectType.BLOB:
        return 0
    if size > limits.gitmodules_bytes_max:
        return 0  # refused as gitmodulesLarge unread
    total, bytes_max = so_far + size, limits.ingest_gitmodules_bytes_max
    if total > bytes_max:
        raise LimitExceeded(
            "ingest_gitmodules_bytes_max",
            total,
            bytes_max,
            f"the .gitmodules blobs this push names hold over {bytes_max} bytes"
            f" (ingest_gitmodules_bytes_max), each to be checked: push the history in"
            f" parts, or raise limits.ingest_gitmodules_bytes_max",
        )
    return size


def check_special_blob(
    kind: SpecialBlob,
    oid: ObjectId,
    type_num: int,
    read: Callable[[], bytes],
    size: int,
    *,
    policy: FsckPolicy = RECEIVE_POLICY,
    limits: Limits = DEFAULT_LIMITS,
    warnings: FsckWarnings | None = None,
) -> None:
    """Raise :class:`InvalidObject` for a refused problem of an object a tree names ``kind``
    (fsck.c ``fsck_blobs`` and ``fsck_blob``).

    ``read`` gives the body; it is not called for a non-blob or a blob over
    ``gitmodules_bytes_max`` (git: ``core.bigFileThreshold``) or
    ``gitattributes_bytes_max`` (git: ``ATTR_MAX_FILE_SIZE``).
    """
    if kind is SpecialBlob.GITMODULES:
        not_blob, large, limit = FsckMsg.GITMODULES_BLOB, FsckMsg.GITMODULES_LARGE, "gitmodules"
        bytes_max = limits.gitmodules_bytes_max
    else:
        not_blob, large = FsckMsg.GITATTRIBUTES_BLOB, FsckMsg.GITATTRIBUTES_LARGE
        limit, bytes_max = "gitattributes", limits.gitattributes_bytes_max
    if type_num != ObjectType.BLOB:
        problems = [FsckProblem(not_blob, f"non-blob found at {kind.value}")]
    elif size > bytes_max:
        text = f"{kind.value} is {size} bytes, over {limit}_bytes_max {bytes_max}"
        problems = [FsckProblem(large, text)]
    elif kind is SpecialBlob.GITMODULES:
        problems = fsck_gitmodules(read())
    else:
        problems = fsck_gitattributes(read())
    _refuse_first(oid, problems, policy, warnings)
