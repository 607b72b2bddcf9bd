"""Who is calling and what they may do (DESIGN.md, "External interfaces", Auth).

Tokens have scopes ``read``, ``write`` and ``admin``, each entry optionally
limited to a repository-name glob. Only SHA-256 digests are stored, in a YAML
file that is reloaded when it changes. Git clients send the token as the
Basic password (any user name); the API sends ``Authorization: Bearer``.

Scopes: ``read`` serves fetches and API reads, ``write`` pushes (which may
create a repository), API commits and API creation, ``admin`` everything,
including deletion. ``auth.anonymous`` grants callers without credentials
``read`` or, in dev mode, ``write``, which there means every scope.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Any

import yaml

from enroute_core.base.errors import InvalidArgument, PermissionDenied, Unauthenticated

log = logging.getLogger(__name__)

SCOPES = ("read", "write", "admin")
REALM = 'Basic realm="enroute"'
_ANONYMOUS = {"none": frozenset(), "read": frozenset({"read"}), "write": frozenset(SCOPES)}


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


def parse_tokens(text: str) -> dict[str, Token]:
    """Tokens by digest; InvalidArgument names the bad entry."""
    data: Any = yaml.safe_load(text) or {}
    if not isinstance(data, dict) or not isinstance(data.get("tokens", []), list):
        raise InvalidArgument("tokens file: expected a mapping with a 'tokens' list")
    found: dict[str, Token] = {}
    for index, entry in enumerate(data.get("tokens") or []):
        if not isinstance(entry, dict):
            raise InvalidArgument(f"tokens file: entry {index} is not a mapping")
        digest = str(entry.get("sha256", "")).lower()
        scopes = entry.get("scopes") or []
        repos = entry.get("repos")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise InvalidArgument(f"tokens file: entry {index}: sha256 must be 64 hex digits")
        if not isinstance(scopes, list) or any(s not in SCOPES for s in scopes):
            raise InvalidArgument(f"tokens file: entry {index}: scopes must be among {SCOPES}")
        if repos is not None and not isinstance(repos, str):
            raise InvalidArgument(f"tokens file: entry {index}: repos must be a glob string")
        found[digest] = Token(str(entry.get("name", "")), digest, frozenset(scopes), repos)
    return found


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenFile:
    """The tokens file, read again whenever its size, mtime or inode change."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._tokens: dict[str, Token] = {}
        if path is not None:
            self.tokens()  # a broken file is an error at startup

    def _read_stamp(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def tokens(self) -> dict[str, Token]:
        if self.path is None:
            return {}
        stamp = self._read_stamp()
        if stamp != self._stamp:
            if stamp is None:
                self._tokens = {}
            else:
                with open(self.path, encoding="utf-8") as f:
                    text = f.read()
                try:
                    self._tokens = parse_tokens(text)
                except (InvalidArgument, yaml.YAMLError) as error:
                    if self._stamp is None:
                        raise
                    log.warning("tokens file %s not reloaded: %s", self.path, error)
            self._stamp = stamp
        return self._tokens


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


class Authorizer:
    def __init__(self, anonymous: str, tokens: TokenFile) -> None:
        self.anonymous = _ANONYMOUS[anonymous]
        self.tokens = tokens

    def authorize(self, authorization: str | None, scope: str, repo: str | None) -> Principal:
        """The caller when ``scope`` on ``repo`` is allowed; Unauthenticated or PermissionDenied.

        Missing credentials that anonymous access does not cover are 401, so
        that Git asks for them; a known token without the scope is 403.
        """
        secret = credential(authorization)
        if secret is None:
            if scope in self.anonymous:
                return Principal("", None)
            raise Unauthenticated(f"authentication required for {scope} access")
        token = self.tokens.tokens().get(token_digest(secret)) if secret else None
        if token is None:
            raise Unauthenticated("unknown token")
        if not token.allows(scope, repo):
            target = f" on {repo!r}" if repo is not None else ""
            raise PermissionDenied(f"token {token.name!r} lacks the {scope} scope{target}")
        return Principal(token.name, token)
