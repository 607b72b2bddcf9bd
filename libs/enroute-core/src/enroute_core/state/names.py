"""Repository names: validation, the URL form, and the object-store keys they make.

DESIGN, "Object store layout" and "External interfaces"; seed 001 ("Names
are at most 256 bytes, so every Enroute key is one").

Rules (each refusal raises :class:`InvalidName` with ``details.name`` and
``details.reason``):

1. 1 to 256 bytes of ASCII letters, digits, ``-``, ``_``, ``.`` and ``/``.
2. ``/`` separates segments; no segment is empty (so no leading, trailing or
   doubled ``/``), ``.``, ``..`` or ``-`` (``/-/`` introduces sub-resources
   in the REST paths).
3. The name does not end with ``.git``: the URL ``/<name>.git/...`` strips one
   ``.git`` suffix (:func:`repo_name_from_url`), so a name ending in ``.git``
   could not be told apart from its own URL form.

Storage-key encoding. A name becomes ONE key segment: every ``/`` is written
as ``~``, a character names never hold, so the mapping is a bijection. The
keys of ``team`` (``repos/team/...``) and of ``team/layers``
(``repos/team~layers/...``) therefore never nest: listing
``repos/team/layers/`` for the layer sweep sees only ``team``'s files. The
segment is at most 256 bytes, which S3 takes as it is (longest key: 325
bytes of the 1024 allowed). On a filesystem, the ``file://`` store's key
encoding (``docs/objectstore.md``) escapes upper case and other bytes and
splits any segment into chunks of at most 240 bytes, each a directory
name, so a 256-byte segment fits every filesystem's 255-byte name limit,
case-insensitive ones included.
"""

from __future__ import annotations

import re

from enroute_core.base.errors import InvalidName

REPO_NAME_BYTES_MAX = 256
GIT_SUFFIX = ".git"
STORAGE_SEPARATOR = "~"
_CHARS = re.compile(r"[A-Za-z0-9._/-]*")
_LAYER_FILE = re.compile(r"[0-9a-f]{16}-[0-9a-f]{32}\.layer")


def repo_name_problem(name: str) -> str | None:
    """Why ``name`` is not a repository name, or None (rules 1-3)."""
    if not name:
        return "is empty"
    if len(name) > REPO_NAME_BYTES_MAX:
        return f"is longer than {REPO_NAME_BYTES_MAX} bytes"
    if _CHARS.fullmatch(name) is None:
        bad = next(c for c in name if _CHARS.fullmatch(c) is None)
        return f"holds {bad!r}; only ASCII letters, digits, '-', '_', '.' and '/' are allowed"
    for segment in name.split("/"):
        if not segment:
            return "has an empty segment (a leading, trailing or doubled '/')"
        if segment in (".", ".."):
            return f"has a {segment!r} segment"
        if segment == "-":
            return "has a '-' segment (reserved for sub-resources)"
    if name.endswith(GIT_SUFFIX):
        return "ends with '.git'"
    return None


def check_repo_name(name: str) -> str:
    """Return ``name`` when it is valid, else raise :class:`InvalidName`."""
    problem = repo_name_problem(name)
    if problem is not None:
        shown = name[:300]
        raise InvalidName(
            f"invalid repository name {shown!r}: {problem}", name=shown, reason=problem
        )
    return name


def repo_name_from_url(path_name: str) -> str:
    """The name in a Git URL path (``team/app.git`` or ``team/app``): one ``.git`` suffix is
    stripped, then the rest must be a valid name."""
    name = path_name[: -len(GIT_SUFFIX)] if path_name.endswith(GIT_SUFFIX) else path_name
    return check_repo_name(name)


def storage_segment(name: str) -> str:
    """The single key segment that stands for ``name`` (``team/app`` -> ``team~app``)."""
    return check_repo_name(name).replace("/", STORAGE_SEPARATOR)


def repo_name_from_storage(segment: str) -> str:
    """Inverse of :func:`storage_segment`; raise :class:`InvalidName` for a segment that
    :func:`storage_segment` never makes."""
    if "/" in segment:
        raise InvalidName(
            f"storage segment {segment[:300]!r} holds '/'", name=segment[:300], reason="slash"
        )
    return check_repo_name(segment.replace(STORAGE_SEPARATOR, "/"))


def repo_prefix(name: str) -> str:
    return f"repos/{storage_segment(name)}/"


def state_key(name: str) -> str:
    """``repos/<repo>/state``: the state object (seed 001)."""
    return repo_prefix(name) + "state"


def layers_prefix(name: str) -> str:
    return repo_prefix(name) + "layers/"


def layer_key(name: str, file_name: str) -> str:
    """``repos/<repo>/layers/<gen:016x>-<root:32 hex>.layer`` (``LayerEntry.key``)."""
    if _LAYER_FILE.fullmatch(file_name) is None:
        raise InvalidName(f"not a layer file name: {file_name[:100]!r}", name=file_name[:100])
    return layers_prefix(name) + file_name


def maintainer_key(name: str) -> str:
    return repo_prefix(name) + "maintainer"


def sweep_key(name: str) -> str:
    return repo_prefix(name) + "sweep"


def trash_prefix(name: str) -> str:
    return f"trash/{storage_segment(name)}/"


def trash_key(name: str, incarnation: int) -> str:
    """``trash/<repo>/<E>``, E as 16 hex digits so markers list in incarnation order."""
    assert 1 <= incarnation < 1 << 64, incarnation
    return f"{trash_prefix(name)}{incarnation:016x}"
