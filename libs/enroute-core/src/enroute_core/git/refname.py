"""Ref-name validation, exactly as ``git check-ref-format`` decides.

The rules (Git ``Documentation/git-check-ref-format.txt``; ``refs.c``,
``check_refname_component`` and ``check_or_sanitize_refname``), for a name
split at ``/`` into components:

1. No component is empty: the name does not begin or end with ``/`` and has
   no ``//`` (git only tolerates those with ``--normalize``, which we never
   apply). The empty name is refused.
2. No component begins with ``.``, and none ends with ``.lock``.
3. At least two components, unless ``allow_onelevel`` (``--allow-onelevel``).
4. No ``..`` anywhere.
5. No ASCII control character (below 0x20, or 0x7f DEL), space, ``~``,
   ``^`` or ``:`` anywhere; NUL counts as a control character here (git's
   C strings cannot hold one).
6. No ``?``, ``[`` or ``\\`` anywhere; no ``*`` either, except that with
   ``refspec_pattern`` (``--refspec-pattern``) a single ``*`` may appear.
7. The name does not end with ``.`` (a component before the last may: git
   checks only the end of the whole name).
8. No ``@{`` anywhere, and the name is not the single character ``@``.

Bytes 0x80 and above are ordinary characters. On top of git's rules a name
longer than ``ref_name_bytes_max`` is refused, as an :class:`InvalidRefName`
rather than a ``LimitExceeded``: a push refuses that one ref (``ng``), not
the whole push.

A *branch* name, as ``git branch`` and ``git check-ref-format --branch`` take
it (git 2.39 ``object-name.c``, ``strbuf_check_branch_ref``), is refused on
two more counts: it may not begin with ``-`` (it would read as an option)
and may not be ``HEAD`` (``refs/heads/HEAD`` makes ``HEAD`` ambiguous). The
rest is the rule above applied to ``refs/heads/<name>``. The API takes
branch names this way (:func:`branch_name_problem`); receive-pack does not
(git's ``update`` in ``receive-pack.c`` checks only the ref-name rules), so a
push of ``refs/heads/HEAD`` lands there as it does in git.
"""

from __future__ import annotations

import re

from enroute_core.base.errors import InvalidRefName
from enroute_core.base.limits import DEFAULT_LIMITS, Limits

_FORBIDDEN = re.compile(rb"[\x00-\x20\x7f~^:?\[\\]|\.\.|@\{")
_LOCK_SUFFIX = b".lock"


def ref_name_problem(
    name: bytes,
    *,
    allow_onelevel: bool = False,
    refspec_pattern: bool = False,
    limits: Limits = DEFAULT_LIMITS,
) -> str | None:
    """Why ``name`` is not a valid ref name, or None when it is."""
    if len(name) > limits.ref_name_bytes_max:
        return f"is longer than {limits.ref_name_bytes_max} bytes"
    if name == b"@":
        return "is the single character '@'"
    bad = _FORBIDDEN.search(name)
    if bad is not None:
        found = bad.group()
        if found in (b"..", b"@{"):
            return f"contains {found.decode()!r}"
        if found[0] < 0x20 or found[0] == 0x7F:
            return f"contains the control character 0x{found[0]:02x}"
        return f"contains the forbidden character {found.decode()!r}"
    stars = name.count(b"*")
    if stars > (1 if refspec_pattern else 0):
        return "contains '*'" if not refspec_pattern else "contains more than one '*'"
    components = name.split(b"/")
    for component in components:
        if not component:
            return "has an empty component (a leading, trailing or doubled '/')"
        if component[0] == 0x2E:
            return "has a component that begins with '.'"
        if component.endswith(_LOCK_SUFFIX):
            return "has a component that ends with '.lock'"
    if name.endswith(b"."):
        return "ends with '.'"
    if len(components) < 2 and not allow_onelevel:
        return "has only one component"
    return None


def branch_name_problem(name: bytes, *, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """Why the short branch name ``name`` is refused by ``git check-ref-format --branch``.

    Outside a repository, where git does not expand ``@{-N}`` (an API name is
    never expanded either).
    """
    if name.startswith(b"-"):
        return "begins with '-'"
    if name == b"HEAD":
        return "is 'HEAD', which git refuses as a branch name"
    return ref_name_problem(b"refs/heads/" + name, limits=limits)


def check_ref_format(
    name: bytes,
    *,
    allow_onelevel: bool = False,
    refspec_pattern: bool = False,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    """Raise :class:`InvalidRefName` with the reason unless ``name`` is a valid ref name."""
    problem = ref_name_problem(
        name, allow_onelevel=allow_onelevel, refspec_pattern=refspec_pattern, limits=limits
    )
    if problem is not None:
        shown = name[:200].decode("utf-8", "replace")
        raise InvalidRefName(f"invalid ref name {shown!r}: {problem}", name=shown, reason=problem)


def is_valid_ref_name(
    name: bytes,
    *,
    allow_onelevel: bool = False,
    refspec_pattern: bool = False,
    limits: Limits = DEFAULT_LIMITS,
) -> bool:
    return (
        ref_name_problem(
            name, allow_onelevel=allow_onelevel, refspec_pattern=refspec_pattern, limits=limits
        )
        is None
    )
