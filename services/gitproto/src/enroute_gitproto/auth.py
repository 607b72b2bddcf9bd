"""Who is calling and what they may do (DESIGN.md, "External interfaces", Auth).

Tokens have scopes ``read``, ``write`` and ``admin``, each entry optionally
limited to a repository-name glob. Only SHA-256 digests are stored, in a YAML
file that is reloaded when it changes. Git clients send the token as the
Basic password (any user name); the API sends ``Authorization: Bearer``.

Scopes: ``read`` serves fetches and API reads, ``write`` pushes (which may
create a repository), API commits and API creation, ``admin`` everything,
including deletion. ``auth.anonymous`` grants callers without credentials
``read`` or, in dev mode, ``write``, which there means every scope.

Matching a presented token (docs/access-control.md, "Comparing tokens"): its
SHA-256 is compared with EVERY stored digest by ``hmac.compare_digest``,
without stopping at a match, so the time taken depends on the number of
entries only. A dict keyed by digest would leak, through lookup timing, how
many leading characters of some stored digest a guess's digest shares; that
says nothing usable about a token (SHA-256 is preimage resistant), but the
scan costs microseconds for the few hundred entries a file holds, and it
leaves no timing question to argue about. Plain SHA-256 (no salt, no slow
hash) is enough because tokens are 256-bit random values, not passwords.

The file is re-read when its resolved path, inode, size or times change. A
Kubernetes Secret volume replaces its files by swapping the ``..data``
symlink to a new directory: ``os.stat`` follows the link, and the resolved
path changes on every swap, so a rotation is seen on the next request.
Every refusal is logged with the remote address, repository, scope and
reason, never with the credential.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import fnmatch
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from enroute_core.base.errors import InvalidArgument, PermissionDenied, Unauthenticated
from enroute_core.state.names import repo_name_problem
from enroute_gitproto.rpc.convert import rfc3339_us
from enroute_proto.logs import ANONYMOUS_USER, note

log = logging.getLogger(__name__)

SCOPES = ("read", "write", "admin")
REALM = 'Basic realm="enroute"'
_ANONYMOUS = {"none": frozenset(), "read": frozenset({"read"}), "write": frozenset(SCOPES)}
_ENTRY_KEYS = frozenset({"name", "sha256", "scopes", "repos"})
_GLOB_AS_LETTER = str.maketrans("*?[]!", "xxxxx")

REMOTE: contextvars.ContextVar[str] = contextvars.ContextVar("enroute_remote", default="-")
"""The client address of the request being served; the app sets it, refusal logs name it."""


@dataclass(frozen=True, slots=True)
class Token:
    name: str
    sha256: str
    scopes: frozenset[str]
    repos: str | None

    def allows(self, scope: str, repo: str | None) -> bool:
        if scope not in self.scopes and "admin" not in self.scopes:
            return False
        return repo is None or self.repos is None or fnmatch.fnmatchcase(repo, self.repos)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: a token's name, or anonymous (``name`` empty)."""

    name: str
    token: Token | None

    def sees(self, repo: str) -> bool:
        """Whether a listing shows ``repo`` to this caller."""
        return self.token is None or self.token.allows("read", repo)


def repos_glob_problem(glob: str) -> str | None:
    """Why ``glob`` cannot be a token's ``repos``, or None (docs/access-control.md).

    Read with each glob character (``*``, ``?``, ``[``, ``]``, ``!``) as a letter, the
    glob must be a valid repository name (state/names.py): so it has a repository
    segment and no empty one (``""``, ``"/"``, ``"*/"`` and ``"team//*"`` are refused),
    and holds nothing a name never holds. Such a glob could match no repository; it is
    a templating slip (``"{{team}}/*"`` with an empty ``team``), not a restriction.
    """
    return repo_name_problem(glob.translate(_GLOB_AS_LETTER))


def parse_tokens(text: str) -> dict[str, Token]:
    """Tokens by digest; InvalidArgument names the bad entry.

    Strict (issue 24): a key that is not known, an entry without scopes, and a
    ``repos`` that is present but empty, null or matches no repository name all
    refuse the whole file, so a slip never widens a token. An absent ``repos``
    is the only way to say "every repository".
    """
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidArgument(f"tokens file: not valid YAML: {error}") from None
    if data is None:
        return {}  # an empty file: no tokens (every one revoked)
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        raise InvalidArgument(
            "tokens file: expected a mapping with a 'tokens' list (`tokens: []` for none)"
        )
    unknown = sorted(str(key) for key in data if key != "tokens")
    if unknown:
        raise InvalidArgument(f"tokens file: unknown keys {unknown}; the file holds 'tokens' only")
    found: dict[str, Token] = {}
    for index, entry in enumerate(data["tokens"]):
        token = _parse_entry(index, entry)
        if token.sha256 in found:
            raise InvalidArgument(
                f"tokens file: entry {index}: the same sha256 as token {found[token.sha256].name!r}"
            )
        found[token.sha256] = token
    return found


def _parse_entry(index: int, entry: object) -> Token:
    where = f"tokens file: entry {index}"
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where} is not a mapping")
    unknown = sorted(str(key) for key in entry if key not in _ENTRY_KEYS)
    if unknown:
        raise InvalidArgument(
            f"{where}: unknown keys {unknown}; an entry holds name, "
            "sha256, scopes and repos (the token itself is never stored)"
        )
    name = entry.get("name", "")
    digest = str(entry.get("sha256", "")).lower()
    scopes = entry.get("scopes")
    if not isinstance(name, str):
        raise InvalidArgument(f"{where}: name must be a string")
    where = f"{where} ({name!r})" if name else where
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise InvalidArgument(f"{where}: sha256 must be 64 hex digits")
    if not isinstance(scopes, list) or not scopes or any(s not in SCOPES for s in scopes):
        raise InvalidArgument(
            f"{where}: scopes must be a non-empty list of {', '.join(SCOPES)} (got {scopes!r})"
        )
    repos = entry.get("repos")
    if "repos" in entry:
        if not isinstance(repos, str) or not repos:
            raise InvalidArgument(
                f"{where}: repos is {repos!r}; it must be a repository-name glob, or be left "
                "out to cover every repository"
            )
        problem = repos_glob_problem(repos)
        if problem is not None:
            raise InvalidArgument(
                f"{where}: repos {repos!r} matches no repository name: it {problem}"
            )
    return Token(name, digest, frozenset(scopes), repos)


def _reason(error: Exception) -> str:
    if isinstance(error, InvalidArgument):
        return error.message
    return f"tokens file: cannot be read: {type(error).__name__}: {error}"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


Stamp = tuple[str, int, int, int, int, int]


class TokenFile:
    """The tokens file, read again whenever its resolved path, inode, size or times change.

    A missing or invalid file at start-up is an error (a typo must not run
    with no tokens, or with wider ones); a file that disappears later revokes
    every token. A file that no longer parses keeps the tokens last read:
    the error is logged once per change and shown by :meth:`status` (``/status``).
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: Stamp | None = None
        self._tokens: tuple[Token, ...] = ()
        self.reloads_total = 0
        self.error: str | None = None
        """Why the file as it is now is not in force; None when it is."""
        self.loaded_at_us: int | None = None
        """Wall-clock time (µs) the tokens in force were read."""
        if path is not None:
            if self._read_stamp() is None:
                raise InvalidArgument(f"tokens file {path} does not exist", key="auth.tokens_file")
            try:
                self.entries()
            except (InvalidArgument, OSError, UnicodeDecodeError) as error:
                raise InvalidArgument(f"{path}: {_reason(error)}", key="auth.tokens_file") from None

    def _read_stamp(self) -> Stamp | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)  # follows the ..data symlink of a Secret volume
            real = os.path.realpath(self.path)
        except FileNotFoundError:
            return None
        return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def entries(self) -> tuple[Token, ...]:
        if self.path is None:
            return ()
        stamp = self._read_stamp()
        if stamp != self._stamp:
            if stamp is None:
                self._tokens = ()
                self.error = "the file is gone: every token is revoked"
                log.warning("tokens file %s is gone: every token is revoked", self.path)
            else:
                try:
                    with open(self.path, encoding="utf-8") as f:
                        text = f.read()
                    self._tokens = tuple(parse_tokens(text).values())
                    self.reloads_total += 1
                    self.error = None
                    self.loaded_at_us = time.time_ns() // 1000
                except (InvalidArgument, OSError, UnicodeDecodeError) as error:
                    if self._stamp is None:
                        raise
                    self.error = (
                        f"not reloaded, the last good file stays in force: {_reason(error)}"
                    )
                    log.error("tokens file %s %s", self.path, self.error)
            self._stamp = stamp
        return self._tokens

    def status(self) -> dict[str, object] | None:
        """``auth.tokens_file`` of ``/status``: whether the file on disk is the one in force."""
        if self.path is None:
            return None
        self.entries()
        return {
            "path": self.path,
            "ok": self.error is None,
            "error": self.error,
            "loaded_at": None if self.loaded_at_us is None else rfc3339_us(self.loaded_at_us),
            "tokens": len(self._tokens),
            "reloads_total": self.reloads_total,
        }

    def tokens(self) -> dict[str, Token]:
        """Entries by digest (listings and tests; matching uses :meth:`match`)."""
        return {token.sha256: token for token in self.entries()}

    def match(self, secret: str) -> Token | None:
        """The entry whose digest equals the secret's, compared in constant time per entry."""
        presented = token_digest(secret).encode("ascii")
        found: Token | None = None
        for token in self.entries():
            if hmac.compare_digest(presented, token.sha256.encode("ascii")):
                found = token  # no break: the scan takes the same time wherever it matches
        return found


def credential(authorization: str | None) -> str | None:
    """The token of a Basic (password) or Bearer ``Authorization`` header; None when absent."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return value.strip() or ""
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return ""
        return decoded.partition(":")[2]
    return ""


FailureHook = Callable[[str], None]


class Authorizer:
    def __init__(
        self, anonymous: str, tokens: TokenFile, on_failure: FailureHook | None = None
    ) -> None:
        self.anonymous_level = anonymous
        self.anonymous = _ANONYMOUS[anonymous]
        self.tokens = tokens
        self.on_failure = on_failure

    def status(self) -> dict[str, object]:
        """The ``auth`` section of ``/status``."""
        return {"anonymous": self.anonymous_level, "tokens_file": self.tokens.status()}

    def authorize(self, authorization: str | None, scope: str, repo: str | None) -> Principal:
        """The caller when ``scope`` on ``repo`` is allowed; Unauthenticated or PermissionDenied.

        Missing credentials that anonymous access does not cover are 401, so
        that Git asks for them; a known token without the scope is 403.
        """
        secret = credential(authorization)
        if secret is None:
            if scope in self.anonymous:
                note(user=ANONYMOUS_USER)
                return Principal("", None)
            self._refused("missing_credentials", scope, repo, "")
            raise Unauthenticated(f"authentication required for {scope} access")
        token = self.tokens.match(secret) if secret else None
        if token is None:
            self._refused("unknown_token" if secret else "malformed_credentials", scope, repo, "")
            raise Unauthenticated("unknown token")
        if not token.allows(scope, repo):
            if scope not in token.scopes and "admin" not in token.scopes:
                self._refused("scope_not_granted", scope, repo, token.name)
                target = f" on {repo!r}" if repo is not None else ""
                raise PermissionDenied(f"token {token.name!r} lacks the {scope} scope{target}")
            self._refused("repo_not_granted", scope, repo, token.name)
            raise PermissionDenied(
                f"token {token.name!r} does not cover repository {repo!r} (it covers "
                f"{token.repos!r})"
            )
        note(user=token.name)  # the name in log lines and audit lines, never the token
        return Principal(token.name, token)

    def _refused(self, reason: str, scope: str, repo: str | None, name: str) -> None:
        """Log a refusal: who, where, what, why; the credential itself never appears.

        A request without credentials is INFO, not WARNING: git always asks without
        them first when the URL holds none, and retries with them on the 401 (http.c,
        ``credential_fill`` after ``HTTP_NOAUTH``), so every authenticated push and
        clone begins with one. Credentials that fail are a WARNING.
        """
        level = logging.INFO if reason == "missing_credentials" else logging.WARNING
        log.log(
            level,
            "auth refused: remote=%s repo=%s scope=%s reason=%s token_name=%s",
            REMOTE.get(), repo if repo is not None else "-", scope, reason, name or "-",
        )  # fmt: skip
        if self.on_failure is not None:
            self.on_failure(reason)
